/**
 * `npm run origin`: one regional GPU origin in front of the simulated engine or a real
 * OpenAI-compatible engine, configured by flags and environment (see origin/cli.ts).
 * See docs/configuration.md, "The origin".
 */
import { hostname } from "node:os";
import { parseOriginCli } from "./cli.ts";
import type { OriginCliConfig } from "./cli.ts";
import type { Engine } from "./engine.ts";
import type { OpenAIEngineOptions } from "./openai-engine.ts";
import { startOrigin } from "./server.ts";
import type { RunningOrigin } from "./server.ts";
import type { SimEngineOptions } from "./sim/options.ts";

/** Loads only the chosen engine, so a configuration error is reported before any engine code runs. */
async function createEngine(config: OriginCliConfig): Promise<Engine> {
  if (config.engine === "openai") {
    const { createOpenAIEngine } = await import("./openai-engine.ts");
    const options: OpenAIEngineOptions = { url: config.engineUrl ?? "" };
    if (config.apiKey !== undefined) options.apiKey = config.apiKey;
    if (config.kvEvents !== undefined) options.kvEvents = { endpoint: config.kvEvents };
    if (config.models !== undefined) options.models = config.models;
    if (config.maxNumSeqs !== undefined) options.maxNumSeqs = config.maxNumSeqs;
    if (config.schedulingPolicy === "priority") options.priority = true;
    return createOpenAIEngine(options);
  }
  const sim: SimEngineOptions = {};
  if (config.models !== undefined) sim.models = config.models;
  if (config.kvBlocks !== undefined) sim.kvBlocks = config.kvBlocks;
  if (config.blockSize !== undefined) sim.blockSize = config.blockSize;
  if (config.maxNumSeqs !== undefined) sim.maxNumSeqs = config.maxNumSeqs;
  if (config.maxBatchedTokens !== undefined) sim.maxNumBatchedTokens = config.maxBatchedTokens;
  if (config.timeScale !== undefined) sim.timeScale = config.timeScale;
  if (config.seed !== undefined) sim.seed = config.seed;
  if (config.deterministic === true) sim.deterministic = true;
  const { createSimEngine } = await import("./sim/engine.ts");
  return createSimEngine(sim);
}

async function main(): Promise<void> {
  const result = parseOriginCli(process.argv.slice(2), process.env);
  switch (result.kind) {
    case "help":
      console.log(result.text);
      return;
    case "error":
      console.error(`warmgate origin: ${result.message} (see npm run origin -- --help)`);
      process.exit(2);
      return;
    case "config":
      break;
    default:
      return result satisfies never;
  }
  const config = result.config;
  const engine = await createEngine(config);
  if (config.engine === "openai") {
    const health = await engine.health();
    // Start anyway: the engine may still be loading weights; /health reports it meanwhile.
    if (!health.ok)
      console.error(`warmgate origin: warning: ${health.detail ?? "engine not ready"}`);
  }
  let origin: RunningOrigin;
  try {
    origin = await startOrigin({
      engine,
      originId: config.originId ?? hostname(),
      ...(config.region !== undefined && { region: config.region }),
      ...(config.adminToken !== undefined && { adminToken: config.adminToken }),
      ...(config.accessToken !== undefined && { accessToken: config.accessToken }),
      ...(config.loadIntervalMs !== undefined && { loadIntervalMs: config.loadIntervalMs }),
      ...(config.backgroundReserve !== undefined && {
        backgroundReserveShare: config.backgroundReserve,
      }),
      ...(config.seed !== undefined && { faultSeed: config.seed }),
      ...(config.maxConnections !== undefined && { maxConnections: config.maxConnections }),
      ...(config.headersTimeoutMs !== undefined && { headersTimeoutMs: config.headersTimeoutMs }),
      ...(config.requestTimeoutMs !== undefined && { requestTimeoutMs: config.requestTimeoutMs }),
      ...(config.keepAliveTimeoutMs !== undefined && {
        keepAliveTimeoutMs: config.keepAliveTimeoutMs,
      }),
      faults: config.faults,
      port: config.port,
      host: config.host,
    });
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    console.error(`warmgate origin: cannot listen on ${config.host}:${config.port}: ${message}`);
    await engine.close();
    process.exit(1);
  }
  console.log(`warmgate origin ${engine.kind} listening on ${origin.url}`);

  let stopping = false;
  const stop = (signal: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    origin.close().then(
      () => process.exit(0),
      (error: unknown) => {
        console.error(`warmgate origin: error while stopping on ${signal}: ${String(error)}`);
        process.exit(1);
      },
    );
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
}

await main();

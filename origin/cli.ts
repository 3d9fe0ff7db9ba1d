/**
 * Command-line and environment configuration of `npm run origin`: a pure parser, so
 * every bad input is caught (and tested) before anything starts listening.
 * See docs/configuration.md, "The origin".
 */
import { parseArgs } from "node:util";
import { exposureProblem } from "./access.ts";
import { connectionLimitsProblem } from "./connection-limits.ts";
import { FAULT_STATUSES } from "./faults.ts";
import type { FaultConfig } from "./faults.ts";

/** A model and its context window, as `--models id:len` gives it. */
export interface CliModel {
  id: string;
  max_model_len: number;
  /** An embedding model (sim). */
  kind?: "embed";
}

/** Everything `origin/main.ts` needs to start an origin. */
export interface OriginCliConfig {
  engine: "sim" | "openai";
  engineUrl?: string;
  port: number;
  host: string;
  originId?: string;
  region?: string;
  models?: CliModel[];
  kvBlocks?: number;
  blockSize?: number;
  maxNumSeqs?: number;
  maxBatchedTokens?: number;
  timeScale?: number;
  seed?: number;
  /** Same bytes for the same request without a seed, and a fixed `created` (sim). */
  deterministic?: boolean;
  apiKey?: string;
  /** vLLM's KV-cache event publisher (openai). */
  kvEvents?: string;
  /** The engine runs vLLM's `--scheduling-policy priority`: send each item's priority. */
  schedulingPolicy?: "fcfs" | "priority";
  /** Share of the engine's slots background items leave to interactive ones. */
  backgroundReserve?: number;
  adminToken?: string;
  accessToken?: string;
  loadIntervalMs?: number;
  maxConnections?: number;
  headersTimeoutMs?: number;
  requestTimeoutMs?: number;
  keepAliveTimeoutMs?: number;
  faults: Partial<FaultConfig>;
}

/** Result of {@link parseOriginCli}: a config, the help text, or a one-line error. */
export type CliResult =
  | { kind: "config"; config: OriginCliConfig }
  | { kind: "help"; text: string }
  | { kind: "error"; message: string };

/** Usage text printed by `--help` and hinted at on errors. */
export const USAGE = `usage: npm run origin -- [options]

  --engine sim|openai         engine behind the origin (default sim)
  --engine-url URL            OpenAI-compatible engine URL (required for openai), e.g. http://127.0.0.1:8000
  --api-key KEY               bearer key the engine expects (openai)
  --kv-events ENDPOINT        vLLM's KV-cache event publisher, e.g. tcp://127.0.0.1:5557 (openai)
  --scheduling-policy P       fcfs (default) or priority: the engine runs vLLM's
                              --scheduling-policy priority; send each item's priority (openai)
  --background-reserve X      share of the engine's slots background items (Batch API
                              lines) leave to interactive ones (default 0.1)
  --port N                    port to listen on (default 0: a free port)
  --host H                    address to bind (default 127.0.0.1)
  --origin-id ID              identity in load reports and metrics (default: host name)
  --region R                  region label
  --models id:len,id:len      models and context windows (sim; openai: override discovery);
                              id:len:embed is an embedding model (sim)
  --kv-blocks N               simulated KV cache blocks
  --block-size N              simulated tokens per KV block
  --max-num-seqs N            simulated concurrent sequences
  --max-batched-tokens N      simulated per-step token budget
  --time-scale X              simulated time: 1 realistic, 0 no delay
  --seed N                    seed of the simulated engine and of fault injection
  --deterministic             same answer and id for the same request even without a
                              seed, and a fixed created time (sim; for tests)
  --admin-token T             bearer token for /admin/* (default: the access token)
  --access-token T            bearer token the edge must send on /v1/* (required when
                              --host is not a loopback address)
  --load-interval-ms N        milliseconds between batch load reports (default 250)
  --max-connections N         most connections served at once; more get 503 (default 1024)
  --headers-timeout-ms N      time a client has to send its request headers (default 10000)
  --request-timeout-ms N      time a client has to send its whole request, body included
                              (default 60000; at least --headers-timeout-ms); answers stream
                              for as long as they take
  --keep-alive-timeout-ms N   time an idle keep-alive connection stays open (default 65000)
  --fault-error-rate X        fraction of items answered with an error status
  --fault-statuses 429,503    statuses injected errors use (from 429, 500, 503)
  --fault-latency-ms N        milliseconds added before each item
  --fault-hang-rate X         fraction of items that never answer
  --fault-drop-after N        cut streams after N SSE events
  --fault-drop-rate X         fraction of items cut when --fault-drop-after is set (default 1)
  -h, --help                  this text

Every option can also be set in the environment: WARMGATE_ORIGIN_<OPTION>, e.g.
WARMGATE_ORIGIN_PORT=8100, WARMGATE_ORIGIN_ENGINE_URL=…; the origin id is WARMGATE_ORIGIN_ID.`;

const STRING_OPTIONS = [
  "engine",
  "engine-url",
  "api-key",
  "kv-events",
  "scheduling-policy",
  "background-reserve",
  "port",
  "host",
  "origin-id",
  "region",
  "models",
  "kv-blocks",
  "block-size",
  "max-num-seqs",
  "max-batched-tokens",
  "time-scale",
  "seed",
  "admin-token",
  "access-token",
  "load-interval-ms",
  "max-connections",
  "headers-timeout-ms",
  "request-timeout-ms",
  "keep-alive-timeout-ms",
  "fault-error-rate",
  "fault-statuses",
  "fault-latency-ms",
  "fault-hang-rate",
  "fault-drop-after",
  "fault-drop-rate",
] as const;

type OptionName = (typeof STRING_OPTIONS)[number];

/** Environment variable that sets an option. */
export function envName(option: OptionName): string {
  if (option === "origin-id") return "WARMGATE_ORIGIN_ID";
  return `WARMGATE_ORIGIN_${option.toUpperCase().replaceAll("-", "_")}`;
}

class CliError extends Error {}

function integer(name: string, raw: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (!/^\d+$/.test(raw.trim()))
    throw new CliError(`--${name} must be a whole number, got "${raw}"`);
  const value = Number(raw);
  if (value < min || value > max) {
    throw new CliError(`--${name} must be between ${min} and ${max}, got ${value}`);
  }
  return value;
}

function decimal(name: string, raw: string, min: number, max = Number.POSITIVE_INFINITY): number {
  const value = raw.trim() === "" ? Number.NaN : Number(raw);
  if (!Number.isFinite(value)) throw new CliError(`--${name} must be a number, got "${raw}"`);
  if (value < min || value > max) {
    throw new CliError(`--${name} must be between ${min} and ${max}, got ${value}`);
  }
  return value;
}

function parseModels(raw: string): CliModel[] {
  return raw.split(",").map((entry) => {
    // `id:len`, or `id:len:embed` for an embedding model (sim).
    const embed = entry.endsWith(":embed");
    const spec = embed ? entry.slice(0, -":embed".length) : entry;
    const at = spec.lastIndexOf(":");
    const id = spec.slice(0, at).trim();
    if (at <= 0 || id === "") {
      throw new CliError(
        `--models entries look like id:max_model_len or id:max_model_len:embed, got "${entry}"`,
      );
    }
    const model: CliModel = { id, max_model_len: integer("models", spec.slice(at + 1), 1) };
    if (embed) model.kind = "embed";
    return model;
  });
}

function parseStatuses(raw: string): number[] {
  return raw.split(",").map((entry) => {
    const status = Number(entry.trim());
    if (!(FAULT_STATUSES as readonly number[]).includes(status)) {
      throw new CliError(`--fault-statuses takes ${FAULT_STATUSES.join(", ")}, got "${entry}"`);
    }
    return status;
  });
}

function parseUrl(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new CliError(`--engine-url is not a URL: "${raw}"`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new CliError(`--engine-url must be http or https, got "${raw}"`);
  }
  // Item paths start with /v1/…; a URL given as …/v1 would double it.
  return url.href.replace(/\/+$/, "").replace(/\/v1$/, "");
}

/** The connection limits (origin/connection-limits.ts). */
function listenLimits(config: OriginCliConfig, values: Partial<Record<OptionName, string>>): void {
  const ms = (name: OptionName) => {
    const raw = values[name];
    return raw === undefined ? undefined : integer(name, raw, 1, 3_600_000);
  };
  const maxConnections = values["max-connections"];
  if (maxConnections !== undefined) {
    config.maxConnections = integer("max-connections", maxConnections, 1);
  }
  const headers = ms("headers-timeout-ms");
  const request = ms("request-timeout-ms");
  const keepAlive = ms("keep-alive-timeout-ms");
  if (headers !== undefined) config.headersTimeoutMs = headers;
  if (request !== undefined) config.requestTimeoutMs = request;
  if (keepAlive !== undefined) config.keepAliveTimeoutMs = keepAlive;
  const problem = connectionLimitsProblem(config);
  if (problem !== null) {
    throw new CliError(`--request-timeout-ms and --headers-timeout-ms: ${problem}`);
  }
}

function build(values: Partial<Record<OptionName, string>>): OriginCliConfig {
  const engine = values.engine ?? "sim";
  if (engine !== "sim" && engine !== "openai") {
    throw new CliError(`--engine must be sim or openai, got "${engine}"`);
  }
  const config: OriginCliConfig = {
    engine,
    port: values.port === undefined ? 0 : integer("port", values.port, 0, 65535),
    host: values.host ?? "127.0.0.1",
    faults: {},
  };
  if (values["engine-url"] !== undefined) config.engineUrl = parseUrl(values["engine-url"]);
  if (engine === "openai" && config.engineUrl === undefined) {
    throw new CliError("--engine openai needs --engine-url (e.g. http://127.0.0.1:8000)");
  }
  if (values["origin-id"] !== undefined) config.originId = values["origin-id"];
  if (values.region !== undefined) config.region = values.region;
  if (values["api-key"] !== undefined) config.apiKey = values["api-key"];
  if (values["kv-events"] !== undefined) {
    if (!/^(tcp|ipc):\/\/\S+$/.test(values["kv-events"])) {
      throw new CliError(
        `--kv-events must be a ZMQ endpoint (tcp://host:port), got "${values["kv-events"]}"`,
      );
    }
    config.kvEvents = values["kv-events"];
  }
  const policy = values["scheduling-policy"];
  if (policy !== undefined) {
    if (policy !== "fcfs" && policy !== "priority") {
      throw new CliError(`--scheduling-policy must be fcfs or priority, got "${policy}"`);
    }
    config.schedulingPolicy = policy;
  }
  if (values["background-reserve"] !== undefined) {
    config.backgroundReserve = decimal("background-reserve", values["background-reserve"], 0, 1);
  }
  if (values["admin-token"] !== undefined) config.adminToken = values["admin-token"];
  if (values["access-token"] !== undefined) config.accessToken = values["access-token"];
  const exposed = exposureProblem(config.host, config.accessToken);
  if (exposed !== null) throw new CliError(exposed);
  if (values.models !== undefined) config.models = parseModels(values.models);
  if (values["kv-blocks"] !== undefined)
    config.kvBlocks = integer("kv-blocks", values["kv-blocks"], 1);
  if (values["block-size"] !== undefined) {
    config.blockSize = integer("block-size", values["block-size"], 1);
  }
  if (values["max-num-seqs"] !== undefined) {
    config.maxNumSeqs = integer("max-num-seqs", values["max-num-seqs"], 1);
  }
  if (values["max-batched-tokens"] !== undefined) {
    config.maxBatchedTokens = integer("max-batched-tokens", values["max-batched-tokens"], 1);
  }
  if (values["time-scale"] !== undefined) {
    config.timeScale = decimal("time-scale", values["time-scale"], 0);
  }
  if (values.seed !== undefined) config.seed = integer("seed", values.seed, 0, 0xffffffff);
  if (values["load-interval-ms"] !== undefined) {
    config.loadIntervalMs = integer("load-interval-ms", values["load-interval-ms"], 1);
  }
  listenLimits(config, values);
  const f = config.faults;
  if (values["fault-error-rate"] !== undefined) {
    f.errorRate = decimal("fault-error-rate", values["fault-error-rate"], 0, 1);
  }
  if (values["fault-statuses"] !== undefined) {
    f.errorStatuses = parseStatuses(values["fault-statuses"]);
  }
  if (values["fault-latency-ms"] !== undefined) {
    f.latencyMs = integer("fault-latency-ms", values["fault-latency-ms"], 0, 600_000);
  }
  if (values["fault-hang-rate"] !== undefined) {
    f.hangRate = decimal("fault-hang-rate", values["fault-hang-rate"], 0, 1);
  }
  if (values["fault-drop-after"] !== undefined) {
    f.dropAfterTokens = integer("fault-drop-after", values["fault-drop-after"], 0);
  }
  if (values["fault-drop-rate"] !== undefined) {
    f.dropRate = decimal("fault-drop-rate", values["fault-drop-rate"], 0, 1);
  }
  return config;
}

/** Parses argv (without node and script) over the environment; flags win over env. */
export function parseOriginCli(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>> = {},
): CliResult {
  let parsed: ReturnType<typeof parseFlags>;
  try {
    parsed = parseFlags(argv);
  } catch (error) {
    const message = error instanceof Error ? error.message.split("\n")[0] : String(error);
    return { kind: "error", message: message ?? "invalid arguments" };
  }
  if (parsed.help === true) return { kind: "help", text: USAGE };
  const deterministicEnv = env["WARMGATE_ORIGIN_DETERMINISTIC"];
  const deterministic =
    parsed.deterministic === true ||
    (deterministicEnv !== undefined && /^(1|true|yes)$/i.test(deterministicEnv));
  const values: Partial<Record<OptionName, string>> = {};
  for (const option of STRING_OPTIONS) {
    const value = parsed[option] ?? env[envName(option)];
    if (value !== undefined) values[option] = value;
  }
  try {
    const config = build(values);
    if (deterministic) config.deterministic = true;
    return { kind: "config", config };
  } catch (error) {
    if (error instanceof CliError) return { kind: "error", message: error.message };
    throw error;
  }
}

function parseFlags(
  argv: readonly string[],
): Partial<Record<OptionName, string>> & { help?: boolean; deterministic?: boolean } {
  const options: Record<string, { type: "string" } | { type: "boolean"; short?: string }> = {
    help: { type: "boolean", short: "h" },
    deterministic: { type: "boolean" },
  };
  for (const name of STRING_OPTIONS) options[name] = { type: "string" };
  const { values } = parseArgs({ args: [...argv], options, strict: true, allowPositionals: false });
  return values;
}

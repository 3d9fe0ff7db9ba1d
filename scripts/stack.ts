/**
 * The local warmgate stack: simulated GPU origins for two regions and the edge under
 * `wrangler dev` (or under workerd without wrangler's dev proxy, for the benchmarks),
 * wired together on free ports. Used by `npm start`, the benchmarks and the end-to-end
 * tests.
 * See README.md, "Quick start".
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import {
  type EdgeOptions,
  type EdgeRuntime,
  type RunningEdge,
  ROOT,
  crashDetached,
  startEdge,
} from "./edge.ts";
import { startOrigin, type RunningOrigin } from "../origin/server.ts";
import { createSimEngine } from "../origin/sim/engine.ts";
import { type DevSecrets, loadDevSecrets, saveDevSecrets } from "./dev-secrets.ts";
import type { SimEngineOptions } from "../origin/sim/options.ts";

/** One region of the local stack. */
export interface StackRegion {
  id: string;
  /** Continents (as in `request.cf.continent`) this region is nearest for. */
  continents: string[];
  /** Number of simulated origins in the region. */
  origins: number;
}

/** Options for {@link startStack}. */
export interface StackOptions {
  /** Edge port; 0 or absent takes a free one. */
  edgePort?: number;
  /** Regions and their origins (default: `eu` and `us`, two origins each). */
  regions?: StackRegion[];
  /** Options for every simulated engine (all origins share them, so bytes match). */
  sim?: SimEngineOptions;
  /** Every origin's `--background-reserve`: share of its slots batch lines leave (default 0.1). */
  backgroundReserve?: number;
  /** Extra fields merged into the edge's `limits` configuration. */
  limits?: Record<string, number>;
  /** More sections of the edge's configuration (`breakers`, `batching`). */
  settings?: Record<string, unknown>;
  /** Where `wrangler dev` keeps Durable Object state; absent means a throwaway folder. */
  persistTo?: string;
  /** Forward wrangler's output to this process's stderr. */
  verbose?: boolean;
  /** Run `wrangler dev`'s local trace collector (default off, as deployed). */
  localObservability?: boolean;
  /** Extra variables for the edge (e.g. fixed secrets for tests). */
  edgeVars?: Record<string, string>;
  /** Edge worker config file (default: the project's wrangler.toml). */
  wranglerConfig?: string;
  /**
   * Access token every origin requires on `/v1/*`; the edge gets it as `ORIGIN_TOKEN`
   * (default: a fresh random one, as {@link RunningStack.originAccessToken} tells).
   */
  originAccessToken?: string;
  /** Admin token of every origin's `/admin/*` (default: a fresh random one). */
  originAdminToken?: string;
  /** Run each origin as its own `node origin/main.ts` process (benchmarks), not in this one. */
  originProcesses?: boolean;
  /** Every origin's `--max-connections` (default the origin's, 1024). */
  maxConnections?: number;
  /** How the edge runs (default `wrangler-dev`); see {@link EdgeRuntime}. */
  runtime?: EdgeRuntime;
  /** Serve the edge's V8 inspector on this port (workerd runtime only). */
  inspectorPort?: number;
  /** Calls start-up off: whatever started is stopped, and start-up fails. */
  signal?: AbortSignal;
}

/** An origin of the running stack. */
export interface StackOrigin {
  region: string;
  origin: Pick<RunningOrigin, "url" | "originId" | "close">;
}

/** An origin running in a child process, as `npm run origin` starts it. */
export interface SpawnedOrigin {
  url: string;
  originId: string;
  child: ChildProcess;
  close(): Promise<void>;
}

/** Starts `node origin/main.ts` with the given flags (port 0) and waits for its URL. */
export async function spawnOrigin(args: string[]): Promise<SpawnedOrigin> {
  const child = spawn(process.execPath, [join(ROOT, "origin", "main.ts"), "--port", "0", ...args], {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  const url = await new Promise<string>((resolveUrl, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      const match = /listening on (http:\/\/\S+)/.exec(output);
      if (match?.[1]) resolveUrl(match[1]);
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.once("exit", (code) => reject(new Error(`origin exited (${code}): ${output}`)));
  });
  const idIndex = args.indexOf("--origin-id");
  return {
    url,
    originId: idIndex >= 0 ? (args[idIndex + 1] ?? url) : url,
    child,
    async close() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await exited;
    },
  };
}

/** CLI flags for `origin/main.ts` equivalent to simulated-engine options. */
export function simFlags(sim: SimEngineOptions = {}): string[] {
  const flags: string[] = ["--engine", "sim"];
  if (sim.timeScale !== undefined) flags.push("--time-scale", String(sim.timeScale));
  if (sim.seed !== undefined) flags.push("--seed", String(sim.seed));
  if (sim.deterministic === true) flags.push("--deterministic");
  if (sim.kvBlocks !== undefined) flags.push("--kv-blocks", String(sim.kvBlocks));
  if (sim.maxNumSeqs !== undefined) flags.push("--max-num-seqs", String(sim.maxNumSeqs));
  if (sim.maxNumBatchedTokens !== undefined) {
    flags.push("--max-batched-tokens", String(sim.maxNumBatchedTokens));
  }
  if (sim.models)
    flags.push(
      "--models",
      sim.models
        .map((m) => `${m.id}:${m.max_model_len}${m.kind === "embed" ? ":embed" : ""}`)
        .join(","),
    );
  return flags;
}

/** A running stack; `stop()` ends every part of it. */
export interface RunningStack {
  edgeUrl: string;
  origins: StackOrigin[];
  /** The configuration the edge runs with, as JSON text. */
  config: string;
  adminToken: string;
  /** The edge's `TOKEN_SIGNING_SECRET` (API key checks and browser tokens). */
  signingSecret: string;
  /** The edge's `ALERT_SIGNING_SECRET` (signs soft-budget alerts). */
  alertSigningSecret: string;
  /** A development API key accepted by the edge. */
  apiKey: string;
  /** The bearer token the origins require on `/v1/*` (the edge's `ORIGIN_TOKEN`). */
  originAccessToken: string;
  /** The bearer token of the origins' `/admin/*` (fault injection). */
  originAdminToken: string;
  /** The edge's child process (`wrangler dev` or `scripts/workerd.ts`). */
  edge: ChildProcess;
  /**
   * Ends the edge (at once with `crash`, as a process death would) and starts it again on
   * the same port with the same state, while the origins keep running.
   */
  restartEdge(options?: { crash?: boolean }): Promise<void>;
  stop(): Promise<void>;
}

/** Default regions of the local stack. */
export const DEFAULT_REGIONS: StackRegion[] = [
  { id: "eu", continents: ["EU", "AF"], origins: 2 },
  { id: "us", continents: ["NA", "SA", "AS", "OC", "AN"], origins: 2 },
];

async function fetchModels(url: string): Promise<{ id: string; max_model_len: number }[]> {
  const res = await fetch(`${url}/v1/models`);
  const body = (await res.json()) as { data: { id: string; max_model_len: number }[] };
  return body.data.map((m) => ({ id: m.id, max_model_len: m.max_model_len }));
}

/** Prices of the simulated models (USD per 1M tokens), so local runs are billed like real ones. */
export const SIM_PRICING: Record<
  string,
  { input_per_mtok: number; cached_input_per_mtok: number; output_per_mtok: number }
> = {
  "warmgate-sim-8b": { input_per_mtok: 0.1, cached_input_per_mtok: 0.025, output_per_mtok: 0.4 },
  "warmgate-sim-70b": { input_per_mtok: 0.6, cached_input_per_mtok: 0.15, output_per_mtok: 2.4 },
  "warmgate-sim-embed": { input_per_mtok: 0.02, cached_input_per_mtok: 0.02, output_per_mtok: 0 },
};

/** Aliases of the local stack: ordered model lists, the next serving when one has no origin. */
export const SIM_ALIASES: Record<string, string[]> = {
  fast: ["warmgate-sim-8b", "warmgate-sim-70b"],
  cheap: ["warmgate-sim-8b"],
  best: ["warmgate-sim-70b", "warmgate-sim-8b"],
};

/** Builds the edge's `WARMGATE_CONFIG` for a set of running origins. */
export function stackConfig(
  origins: StackOrigin[],
  regions: StackRegion[],
  models: { id: string; max_model_len: number }[],
  limits: Record<string, number> = {},
  settings: Record<string, unknown> = {},
): string {
  const served = new Set(models.map((m) => m.id));
  const aliases = Object.fromEntries(
    Object.entries(SIM_ALIASES)
      .map(([alias, list]) => [alias, list.filter((id) => served.has(id))] as const)
      .filter(([, list]) => list.length > 0),
  );
  return JSON.stringify({
    models: models.map((m) => {
      const pricing = SIM_PRICING[m.id];
      return {
        id: m.id,
        max_model_len: m.max_model_len,
        owned_by: "warmgate",
        ...(pricing === undefined ? {} : { pricing }),
      };
    }),
    aliases,
    regions: regions.map((r) => ({
      id: r.id,
      continents: r.continents,
      origins: origins
        .filter((o) => o.region === r.id)
        .map((o) => ({ id: o.origin.originId, url: o.origin.url })),
    })),
    default_region: regions[0]?.id,
    limits,
    ...settings,
  });
}

/** Limits of the development key: generous, so local load tests measure the gateway. */
export const DEV_KEY_LIMITS = { rpm: 1_000_000, tpm: 10_000_000_000, concurrency: 4_096 };

/** Creates an API key through the admin API and returns its secret. */
export async function createKey(
  edgeUrl: string,
  adminToken: string,
  body: Record<string, unknown>,
): Promise<string> {
  const res = await fetch(`${edgeUrl}/admin/keys`, {
    method: "POST",
    headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const json = (await res.json()) as { key?: string; error?: { message: string } };
  if (res.status !== 201 || !json.key) {
    throw new Error(`creating a key failed: ${res.status} ${json.error?.message ?? ""}`);
  }
  return json.key;
}

/** Reuses the saved development key while the edge still accepts it, else creates one. */
async function ensureDevKey(edgeUrl: string, secrets: DevSecrets): Promise<string> {
  if (secrets.apiKey) {
    const res = await fetch(`${edgeUrl}/v1/models`, {
      headers: { authorization: `Bearer ${secrets.apiKey}` },
    });
    await res.body?.cancel();
    if (res.ok) return secrets.apiKey;
  }
  // Local runs and benchmarks pick regions with `x-warmgate-region`.
  return createKey(edgeUrl, secrets.adminToken, {
    name: "development",
    limits: DEV_KEY_LIMITS,
    allow_region_override: true,
  });
}

/** Starts simulated origins for every region and the edge wired to them. */
export async function startStack(options: StackOptions = {}): Promise<RunningStack> {
  const regions = options.regions ?? DEFAULT_REGIONS;
  const origins: StackOrigin[] = [];
  const accessToken =
    options.originAccessToken ?? `wgorigin_${randomBytes(18).toString("base64url")}`;
  const adminToken = options.originAdminToken ?? `wgops_${randomBytes(18).toString("base64url")}`;
  const stopOrigins = async () => {
    await Promise.all(origins.map((o) => o.origin.close()));
  };
  let models: { id: string; max_model_len: number }[] = [];
  try {
    for (const region of regions) {
      for (let i = 1; i <= region.origins; i++) {
        const originId = `${region.id}-${i}`;
        if (options.originProcesses) {
          const origin = await spawnOrigin([
            ...simFlags(options.sim),
            ...(options.backgroundReserve !== undefined
              ? ["--background-reserve", String(options.backgroundReserve)]
              : []),
            "--origin-id",
            originId,
            "--region",
            region.id,
            "--access-token",
            accessToken,
            "--admin-token",
            adminToken,
            ...(options.maxConnections !== undefined
              ? ["--max-connections", String(options.maxConnections)]
              : []),
          ]);
          origins.push({ region: region.id, origin });
          if (models.length === 0) models = await fetchModels(origin.url);
          continue;
        }
        const engine = createSimEngine(options.sim);
        models = engine.models().map((m) => ({ id: m.id, max_model_len: m.max_model_len }));
        const origin = await startOrigin({
          engine,
          originId,
          region: region.id,
          port: 0,
          host: "127.0.0.1",
          accessToken,
          adminToken,
          ...(options.backgroundReserve !== undefined && {
            backgroundReserveShare: options.backgroundReserve,
          }),
          ...(options.maxConnections !== undefined && { maxConnections: options.maxConnections }),
        });
        origins.push({ region: region.id, origin });
      }
    }
  } catch (error) {
    await stopOrigins();
    throw error;
  }
  const config = stackConfig(origins, regions, models, options.limits, options.settings);
  const secrets = await loadDevSecrets(options.persistTo);
  const runtime = options.runtime ?? "wrangler-dev";
  const edgeOptions: EdgeOptions = {
    config: options.wranglerConfig ?? join(ROOT, "wrangler.toml"),
    ...(options.edgePort ? { port: options.edgePort } : {}),
    vars: {
      WARMGATE_CONFIG: config,
      ADMIN_TOKEN: secrets.adminToken,
      TOKEN_SIGNING_SECRET: secrets.signingSecret,
      ALERT_SIGNING_SECRET: secrets.alertSigningSecret,
      ORIGIN_TOKEN: accessToken,
      ...options.edgeVars,
    },
    ...(options.persistTo ? { persistTo: options.persistTo } : {}),
    ...(options.verbose ? { verbose: true } : {}),
    ...(options.localObservability ? { localObservability: true } : {}),
    ...(options.inspectorPort ? { inspectorPort: options.inspectorPort } : {}),
    ...(options.signal ? { signal: options.signal } : {}),
  };
  let edge: RunningEdge;
  try {
    edge = await startEdge(runtime, edgeOptions);
  } catch (error) {
    await stopOrigins();
    throw error;
  }
  let apiKey: string;
  try {
    apiKey = await ensureDevKey(edge.url, secrets);
    await saveDevSecrets(options.persistTo, { ...secrets, apiKey });
  } catch (error) {
    await Promise.all([edge.stop(), stopOrigins()]);
    throw error;
  }
  let stopped: Promise<void> | undefined;
  return {
    edgeUrl: edge.url,
    origins,
    config,
    adminToken: secrets.adminToken,
    signingSecret: secrets.signingSecret,
    alertSigningSecret: secrets.alertSigningSecret,
    apiKey,
    originAccessToken: accessToken,
    originAdminToken: adminToken,
    get edge() {
      return edge.child;
    },
    async restartEdge(restart = {}) {
      if (restart.crash === true) await crashDetached(edge.child);
      await edge.stop();
      edge = await startEdge(runtime, { ...edgeOptions, port: Number(new URL(edge.url).port) });
    },
    stop() {
      stopped ??= Promise.all([edge.stop(), stopOrigins()]).then(() => undefined);
      return stopped;
    },
  };
}

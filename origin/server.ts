/**
 * The regional GPU origin: the OpenAI-compatible API and the batch endpoint in front
 * of one engine, with load reports, Prometheus metrics, GPU readings and faults.
 * See origin/PROTOCOL.md.
 */
import { type RequestListener, type Server, type ServerOptions, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { createAdaptorServer } from "@hono/node-server";
import { Hono } from "hono";
import type { Context } from "hono";
import {
  type ConnectionLimits,
  DEFAULT_MAX_CONNECTIONS,
  capConnections,
  connectionLimitsProblem,
  timeoutServerOptions,
} from "./connection-limits.ts";
import { adminTokenOf, bearerMatches, exposureProblem, metricsTokensOf } from "./access.ts";
import type { Engine } from "./engine.ts";
import { createFaultController, FaultConfigPatchSchema, withFaults } from "./faults.ts";
import type { FaultConfig, FaultController } from "./faults.ts";
import { createGpuMonitor } from "./gpu.ts";
import type { GpuMonitor } from "./gpu.ts";
import { createOriginCounters, renderOriginMetrics } from "./metrics.ts";
import type { OriginCounters } from "./metrics.ts";
import { MAX_BATCH_ITEMS } from "../contracts/protocol/framing.ts";
import { type ItemRun, ItemRunner } from "./items.ts";
import { openAIErrorBody } from "../contracts/errors.ts";
import { batchRoutes } from "./batch-routes.ts";
import { plainRoutes } from "./plain-routes.ts";
import { OriginError, readJson, zodMessage } from "./http.ts";
import type { KvEventCursor, LoadReport } from "../contracts/protocol/schema.ts";

/** Configuration of an origin. */
export interface OriginOptions {
  engine: Engine;
  /** Identity reported in load reports, `/health` and `/metrics`. */
  originId: string;
  region?: string;
  /** Faults to start with (none by default). */
  faults?: Partial<FaultConfig>;
  /** Seed of the fault PRNG, so injected faults repeat run to run. */
  faultSeed?: number;
  /** Milliseconds between LOAD frames while a batch runs (default 250). */
  loadIntervalMs?: number;
  /** Bearer token that `/admin/*` requires; the access token when unset (open only on loopback). */
  adminToken?: string;
  /**
   * Bearer token the edge must present on `/v1/*` (completions and batches); open when
   * unset, which suits loopback only: an origin reachable from the internet needs one.
   */
  accessToken?: string;
  /** Most items accepted in one batch (default 1024, at most {@link MAX_BATCH_ITEMS}). */
  maxBatchItems?: number;
  /** GPU readings source (default: `nvidia-smi`). */
  gpu?: GpuMonitor;
  /** Share of the engine's slots background items leave to interactive ones (default 0.1). */
  backgroundReserveShare?: number;
}

/** Where an origin listens, and the limits its HTTP server keeps. */
export interface OriginListenOptions extends ConnectionLimits {
  /** Port to listen on (0, the default, picks a free one). */
  port?: number;
  /** Address to bind (default 127.0.0.1). */
  host?: string;
}

/** An origin listening on a port. */
export interface RunningOrigin {
  url: string;
  port: number;
  originId: string;
  faults: FaultController;
  /** Aborts every running item, closes every connection, then closes the engine. */
  close(): Promise<void>;
}

/** Default milliseconds between LOAD frames. */
export const DEFAULT_LOAD_INTERVAL_MS = 250;
/** Default most items in one batch. */
export const DEFAULT_MAX_BATCH_ITEMS = 1024;

/** The pieces {@link startOrigin} needs beyond the Hono app. */
interface Origin {
  app: Hono;
  faults: FaultController;
  engine: Engine;
  counters: OriginCounters;
  /** Aborts every running item with reason `shutdown`. */
  abortAll(): void;
}

function buildOrigin(options: OriginOptions): Origin {
  const faults = createFaultController({ initial: options.faults, seed: options.faultSeed });
  const engine = withFaults(options.engine, faults);
  const gpu = options.gpu ?? createGpuMonitor();
  const counters: OriginCounters = createOriginCounters();
  const items = new ItemRunner(engine, counters, {
    ...(options.backgroundReserveShare !== undefined && {
      reserveShare: options.backgroundReserveShare,
    }),
  });
  const loadIntervalMs = options.loadIntervalMs ?? DEFAULT_LOAD_INTERVAL_MS;
  const maxBatchItems = Math.min(options.maxBatchItems ?? DEFAULT_MAX_BATCH_ITEMS, MAX_BATCH_ITEMS);
  const startedAt = Date.now();
  const batches = new Map<string, Map<string, ItemRun>>();

  function loadReport(cursor?: KvEventCursor): LoadReport {
    const report: LoadReport = {
      origin: options.originId,
      t: Date.now(),
      ...engine.load(),
      background_running: items.background.running,
      background_queued: items.background.queued,
      background_cap: items.background.cap,
    };
    if (cursor !== undefined && items.kvLog !== null) report.kv_events = items.kvLog.since(cursor);
    return report;
  }

  const app = new Hono();

  app.onError((err, c) => {
    if (err instanceof OriginError) {
      return c.json(err.toBody(), err.status);
    }
    // A bug, unless the client went away mid-request (nobody is left to answer): say so in
    // the log, and nothing of it to the client.
    if (!c.req.raw.signal.aborted)
      console.error(`origin: ${c.req.method} ${c.req.path} failed`, err);
    return c.json(
      openAIErrorBody("The origin failed to handle the request.", "server_error", "internal_error"),
      500,
    );
  });
  // `/v1/models` stays open like `/health`: it reveals no prompts and monitoring discovers
  // models with it.
  app.use("/v1/*", async (c, next) => {
    if (options.accessToken === undefined || c.req.path === "/v1/models") return next();
    if (!bearerMatches(c.req.header("authorization"), options.accessToken)) {
      throw new OriginError(
        401,
        "This origin requires its access token as a bearer token.",
        "invalid_access_token",
      );
    }
    return next();
  });
  app.notFound((c) =>
    c.json(
      openAIErrorBody(
        `Unknown route: ${c.req.method} ${c.req.path}`,
        "invalid_request_error",
        "not_found",
      ),
      404,
    ),
  );

  plainRoutes(app, { items, counters, originId: options.originId });

  app.get("/v1/models", (c) => {
    const created = Math.floor(startedAt / 1000);
    return c.json({
      object: "list",
      data: engine.models().map((m) => ({
        id: m.id,
        object: "model",
        created,
        owned_by: m.owned_by,
        root: m.id,
        parent: null,
        max_model_len: m.max_model_len,
      })),
    });
  });

  app.get("/health", async (c) => {
    const [health, gpuSnapshot] = await Promise.all([
      engine
        .health()
        .catch(() => ({ ok: false, engine: engine.kind, detail: "health check failed" })),
      gpu.snapshot(),
    ]);
    return c.json(
      {
        status: health.ok ? "ok" : "degraded",
        origin: options.originId,
        region: options.region ?? null,
        engine: health,
        gpu: gpuSnapshot.available
          ? { available: true, gpus: gpuSnapshot.gpus }
          : { available: false, reason: gpuSnapshot.reason },
        in_flight: counters.inFlight,
        uptime_s: Math.round((Date.now() - startedAt) / 1000),
      },
      health.ok ? 200 : 503,
    );
  });

  // Metrics tell load, traffic and faults: whoever may call `/v1/*` may read them, and so
  // may operators with the admin token.
  const metricsTokens = metricsTokensOf(options);
  app.get("/metrics", async (c) => {
    const authorization = c.req.header("authorization");
    if (metricsTokens !== null && !metricsTokens.some((t) => bearerMatches(authorization, t))) {
      throw new OriginError(
        401,
        "This origin's metrics require its access token or admin token as a bearer token.",
        "invalid_access_token",
      );
    }
    const origin = renderOriginMetrics({
      originId: options.originId,
      region: options.region,
      counters,
      faults: faults.counts(),
      gpu: await gpu.snapshot(),
      background: {
        queued: items.background.queued,
        running: items.background.running,
        preemptions: items.background.preemptions,
        okRuns: items.background.okRuns,
        rerunTokens: items.background.rerunTokens,
      },
    });
    const engineText = engine.metrics().trimEnd();
    const text = `${engineText === "" ? "" : `${engineText}\n`}${origin}\n`;
    return c.body(text, 200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" });
  });

  // Without tokens the origin only listens on loopback (see `startOrigin`).
  const adminToken = adminTokenOf(options);
  function requireAdmin(c: Context): void {
    if (adminToken === null) return;
    if (!bearerMatches(c.req.header("authorization"), adminToken)) {
      throw new OriginError(401, "A valid admin bearer token is required.", "invalid_admin_token");
    }
  }

  app.get("/admin/faults", (c) => {
    requireAdmin(c);
    return c.json(faults.get());
  });
  app.put("/admin/faults", async (c) => {
    requireAdmin(c);
    const parsed = FaultConfigPatchSchema.safeParse(await readJson(c));
    if (!parsed.success) {
      const { message, param } = zodMessage(parsed.error);
      throw new OriginError(400, message, "invalid_fault_config", param);
    }
    return c.json(faults.set(parsed.data));
  });
  app.delete("/admin/faults", (c) => {
    requireAdmin(c);
    return c.json(faults.reset());
  });

  batchRoutes(app, {
    items,
    batches,
    counters,
    originId: options.originId,
    loadIntervalMs,
    maxBatchItems,
    loadReport,
  });

  return {
    app,
    faults,
    engine,
    counters,
    abortAll() {
      items.abortAll();
    },
  };
}

/** Builds the origin's Hono app (no listening socket); for tests and custom servers. */
export function createOriginApp(options: OriginOptions): Hono {
  return buildOrigin(options).app;
}

/** Starts an origin on `port` (0, the default, picks a free one) and `host` (127.0.0.1). */
export async function startOrigin(
  options: OriginOptions & OriginListenOptions,
): Promise<RunningOrigin> {
  const host = options.host ?? "127.0.0.1";
  const problem = exposureProblem(host, options.accessToken) ?? connectionLimitsProblem(options);
  if (problem !== null) throw new Error(problem);
  const origin = buildOrigin(options);
  // Past the cap a new connection is answered busy: the edge tries another origin meanwhile
  // and counts no failure, and the connections already open keep their file descriptors.
  const cappedServer = ((serverOptions: ServerOptions, listener: RequestListener) => {
    const created = createServer(serverOptions);
    const limit = options.maxConnections ?? DEFAULT_MAX_CONNECTIONS;
    const capped = capConnections(created, limit, origin.counters.connectionsRefused);
    return created.on("request", capped(listener));
  }) as typeof createServer;
  const server = createAdaptorServer({
    fetch: origin.app.fetch,
    hostname: host,
    // Keep-alive matters: the edge reuses one connection for batch after batch.
    serverOptions: { keepAlive: true, noDelay: true, ...timeoutServerOptions(options) },
    createServer: cappedServer,
  }) as Server;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const urlHost = host.includes(":") ? `[${host}]` : host === "0.0.0.0" ? "127.0.0.1" : host;
  let closing: Promise<void> | null = null;
  return {
    url: `http://${urlHost}:${port}`,
    port,
    originId: options.originId,
    faults: origin.faults,
    close() {
      closing ??= (async () => {
        origin.abortAll();
        const closed = new Promise<void>((resolve) => server.close(() => resolve()));
        // Streaming responses would hold server.close() open; end those connections now.
        server.closeAllConnections();
        await closed;
        await origin.engine.close();
      })();
      return closing;
    },
  };
}

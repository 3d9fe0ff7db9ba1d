/**
 * Running a Worker locally: under `wrangler dev`, as users run it, or under workerd with
 * the same bindings and no dev proxy (`scripts/workerd.ts`), as a deployed Worker is
 * reached; stopping it, or killing it as a crash would. Used by the local stack and the
 * benchmarks' pass-through Workers.
 * See README.md, "Quick start".
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** Repository root. */
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");

/**
 * How a Worker runs locally. `wrangler-dev`: `wrangler dev`, as users run it, which puts
 * its dev proxy (a second workerd that relays every request through one Durable Object,
 * to hold requests while the Worker reloads) in front of the Worker's workerd. `workerd`:
 * the same workerd and Miniflare with the same bindings, without that proxy, as a
 * deployed Worker is reached (`scripts/workerd.ts`).
 */
export type EdgeRuntime = "wrangler-dev" | "workerd";

/** Parses a `--runtime` flag. */
export function parseRuntime(value: string): EdgeRuntime {
  if (value === "wrangler-dev" || value === "workerd") return value;
  throw new Error(`--runtime must be wrangler-dev or workerd, not ${value}`);
}

/** A local Worker's variables: origins on loopback are expected here (`WARMGATE_ENV`). */
function localVars(vars: Record<string, string>): Record<string, string> {
  return { WARMGATE_ENV: "local", ...vars };
}

/** Thrown when a port asked for is taken: a message for one line, no wrangler output. */
export class PortInUseError extends Error {}

/** Throws {@link PortInUseError} unless `port` on loopback can be listened on now. */
export async function assertPortFree(port: number): Promise<void> {
  await new Promise<void>((resolveFree, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", (error: NodeJS.ErrnoException) => {
      reject(
        error.code === "EADDRINUSE" || error.code === "EACCES"
          ? new PortInUseError(
              `port ${port} on 127.0.0.1 is ${error.code === "EACCES" ? "not permitted" : "already in use"}; choose another with --port, or leave it out for a free one`,
            )
          : error,
      );
    });
    server.listen(port, "127.0.0.1", () => server.close(() => resolveFree()));
  });
}

/** Finds a free TCP port on loopback (bind to port 0, read it, release it). */
export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}

function dotenvLine(name: string, value: string): string {
  // Single quotes keep JSON intact in dotenv files.
  return `${name}='${value.replaceAll("'", "\\'")}'`;
}

/**
 * Thrown when the edge answers its health check with its configuration's error (`500
 * config_error`): no wait fixes it, and its message names the field.
 */
export class EdgeConfigError extends Error {}

/** Thrown when start-up is called off (`EdgeOptions.signal`): what started is stopped. */
export class StartAbortedError extends Error {}

async function waitForHealth(
  url: string,
  child: ChildProcess,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const state: { exitCode: number | null } = { exitCode: null };
  child.once("exit", (code) => {
    state.exitCode = code ?? -1;
  });
  while (Date.now() < deadline) {
    if (signal?.aborted === true) throw new StartAbortedError("start-up was stopped");
    if (state.exitCode !== null) {
      throw new Error(`the edge exited with code ${state.exitCode} before it was ready`);
    }
    let problem: string | null = null;
    try {
      const res = await fetch(`${url}/health`);
      if (res.ok) {
        await res.body?.cancel();
        return;
      }
      problem = await configProblem(res);
    } catch {
      // Not listening yet.
    }
    if (problem !== null) throw new EdgeConfigError(problem);
    await sleep(150);
  }
  throw new Error(`edge at ${url} not ready within ${timeoutMs} ms`);
}

/** The message of a `config_error` answer, or null for any other. */
async function configProblem(res: Response): Promise<string | null> {
  const body = (await res.json().catch(() => null)) as {
    error?: { code?: unknown; message?: unknown };
  } | null;
  const error = body?.error;
  return error?.code === "config_error" && typeof error.message === "string" ? error.message : null;
}

/** The error start-up fails with: the runtime's output only where it may tell more. */
function startFailure(error: unknown, output: string): Error {
  if (error instanceof EdgeConfigError || error instanceof StartAbortedError) return error;
  return new Error(`${(error as Error).message}\n--- output ---\n${output}`, { cause: error });
}

/**
 * Ends a detached child with SIGTERM, sent to it alone or to its whole process group, and
 * with SIGKILL to the group if it has not exited 5 s later.
 */
async function stopDetached(child: ChildProcess, to: "process" | "group"): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  try {
    if (to === "group") process.kill(-(child.pid ?? 0), "SIGTERM");
    else child.kill("SIGTERM");
  } catch {
    child.kill("SIGTERM");
  }
  const timer = setTimeout(() => {
    try {
      process.kill(-(child.pid ?? 0), "SIGKILL");
    } catch {
      // Already gone.
    }
  }, 5000);
  await exited;
  clearTimeout(timer);
}

/** The environment `wrangler dev` runs in: offline, quiet, and measuring what production runs. */
export function wranglerDevEnv(
  options: Pick<EdgeOptions, "localObservability">,
): Record<string, string | undefined> {
  return {
    ...process.env,
    WRANGLER_SEND_METRICS: "false",
    // Offline: use miniflare's placeholder `request.cf` instead of fetching one.
    CLOUDFLARE_CF_FETCH_ENABLED: "false",
    // wrangler's local trace collector costs every request and Durable Object call as much
    // CPU again, which no deployed Worker pays: off unless asked for.
    X_LOCAL_OBSERVABILITY: options.localObservability === true ? "true" : "false",
    CI: "true",
    NO_COLOR: "1",
  };
}

/** Starts at most this many times when a port found free was taken before wrangler bound it. */
const PORT_RACE_TRIES = 3;

/**
 * Starts a Worker under `wrangler dev` on a free port and waits until `/health` answers.
 * A free port is only known free until someone binds it: when another process took one of
 * the ports found for this edge first, it starts again on new ones.
 */
export async function startWranglerDev(options: EdgeOptions): Promise<RunningEdge> {
  for (let tries = 1; ; tries++) {
    try {
      return await startWranglerDevOnce(options);
    } catch (error) {
      const raced = (error as Error).message.includes("Address already in use");
      if (!raced || tries >= PORT_RACE_TRIES) throw error;
    }
  }
}

async function startWranglerDevOnce(options: EdgeOptions): Promise<RunningEdge> {
  // wrangler waits for a busy port instead of failing: find out before it starts.
  if (options.port) await assertPortFree(options.port);
  const port = options.port || (await freePort());
  const inspectorPort = await freePort();
  const scratch = await mkdtemp(join(tmpdir(), "warmgate-edge-"));
  const envFile = join(scratch, "edge.env");
  await writeFile(
    envFile,
    Object.entries(localVars(options.vars))
      .map(([k, v]) => dotenvLine(k, v))
      .join("\n") + "\n",
    { mode: 0o600 },
  );
  const persistTo = options.persistTo ?? join(scratch, "state");
  const wrangler = join(ROOT, "node_modules", "wrangler", "bin", "wrangler.js");
  const child = spawn(
    process.execPath,
    [
      wrangler,
      "dev",
      "--config",
      options.config,
      "--ip",
      "127.0.0.1",
      "--port",
      String(port),
      "--inspector-port",
      String(inspectorPort),
      "--env-file",
      envFile,
      "--persist-to",
      persistTo,
      "--show-interactive-dev-session=false",
      "--log-level",
      options.verbose ? "info" : "warn",
    ],
    {
      cwd: ROOT,
      env: wranglerDevEnv(options),
      stdio: ["ignore", options.verbose ? "inherit" : "pipe", options.verbose ? "inherit" : "pipe"],
      detached: true,
    },
  );
  let output = "";
  const keep = (chunk: Buffer) => {
    output = (output + chunk.toString()).slice(-8000);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    // wrangler runs workerd as a child: signal the whole process group.
    await stopDetached(child, "group");
    await rm(scratch, { recursive: true, force: true });
  };
  try {
    await waitForHealth(url, child, 90_000, options.signal);
  } catch (error) {
    await stop();
    throw startFailure(error, output);
  }
  return { url, child, stop };
}

/** Options for {@link startWranglerDev}, {@link startWorkerd} and {@link startEdge}. */
export interface EdgeOptions {
  config: string;
  port?: number;
  vars: Record<string, string>;
  persistTo?: string;
  verbose?: boolean;
  /** Run `wrangler dev`'s local trace collector (wrangler-dev runtime only; default off). */
  localObservability?: boolean;
  /** workerd writes its async activity trace to this file (workerd runtime only). */
  asyncTrace?: string;
  /** Reach the Worker through Miniflare's entry Worker (workerd runtime only; `--entry-worker`). */
  entryWorker?: boolean;
  /** Serve the V8 inspector on this port (workerd runtime only), for CPU profiles. */
  inspectorPort?: number;
  /** Calls start-up off: the Worker is stopped and start-up fails with StartAbortedError. */
  signal?: AbortSignal;
}

/** A Worker running locally. */
export interface RunningEdge {
  url: string;
  child: ChildProcess;
  stop(): Promise<void>;
}

/** Kills a detached child's whole process group at once (SIGKILL), as a crash would. */
export async function crashDetached(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  try {
    process.kill(-(child.pid ?? 0), "SIGKILL");
  } catch {
    child.kill("SIGKILL");
  }
  await exited;
}

/**
 * Starts a Worker under workerd without wrangler's dev proxy (`scripts/workerd.ts`) on a
 * free port and waits until `/health` answers.
 */
export async function startWorkerd(options: EdgeOptions): Promise<RunningEdge> {
  const scratch = await mkdtemp(join(tmpdir(), "warmgate-edge-"));
  const varsFile = join(scratch, "vars.json");
  await writeFile(varsFile, JSON.stringify(localVars(options.vars)), { mode: 0o600 });
  const child = spawn(
    process.execPath,
    [
      join(ROOT, "scripts", "workerd.ts"),
      "--config",
      options.config,
      "--vars-file",
      varsFile,
      "--port",
      String(options.port ?? 0),
      ...(options.persistTo ? ["--persist-to", options.persistTo] : []),
      ...(options.asyncTrace ? ["--async-trace", options.asyncTrace] : []),
      ...(options.entryWorker ? ["--entry-worker"] : []),
      ...(options.inspectorPort ? ["--inspector-port", String(options.inspectorPort)] : []),
      ...(options.verbose ? ["--verbose"] : []),
    ],
    {
      cwd: ROOT,
      env: { ...process.env, WRANGLER_SEND_METRICS: "false", NO_COLOR: "1" },
      stdio: ["ignore", "pipe", options.verbose ? "inherit" : "pipe"],
      detached: true,
    },
  );
  let output = "";
  const stop = async () => {
    // Miniflare stops its workerd when its process gets SIGTERM.
    await stopDetached(child, "process");
    await rm(scratch, { recursive: true, force: true });
  };
  try {
    const url = await new Promise<string>((resolveUrl, reject) => {
      const onData = (chunk: Buffer) => {
        output = (output + chunk.toString()).slice(-8000);
        const match = /listening on (http:\/\/\S+)/.exec(output);
        if (match?.[1]) resolveUrl(match[1]);
      };
      child.stdout?.on("data", onData);
      child.stderr?.on("data", onData);
      child.once("exit", (code) =>
        reject(new Error(`workerd exited (${code}) before it was ready`)),
      );
    });
    await waitForHealth(url, child, 90_000, options.signal);
    return { url, child, stop };
  } catch (error) {
    await stop();
    throw startFailure(error, output);
  }
}

/** Starts a Worker under `runtime` (see {@link EdgeRuntime}). */
export function startEdge(runtime: EdgeRuntime, options: EdgeOptions): Promise<RunningEdge> {
  return runtime === "workerd" ? startWorkerd(options) : startWranglerDev(options);
}

/**
 * The Portkey AI Gateway as a benchmark's anchor (docs/benchmarks.md, "Edge overhead"):
 * `@portkey-ai/gateway` installed outside the project's dependencies, into a cache folder
 * of its own, with `@hono/node-server` pinned where newer versions break its streaming, and
 * started on a free port under this Node. Its `postinstall` (`patch-package`) is skipped.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { mkdir, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { freePort } from "../scripts/edge.ts";

/** The Portkey release measured, and the `@hono/node-server` it streams correctly with. */
export const PORTKEY_VERSION = "1.15.2";
const NODE_SERVER_VERSION = "1.14.1";

const CACHE = join(tmpdir(), "warmgate-bench-anchors", `portkey-${PORTKEY_VERSION}`);
const START = join(CACHE, "node_modules", "@portkey-ai", "gateway", "build", "start-server.js");

/** A running Portkey gateway: where it listens, its process, and how to stop it. */
export interface RunningPortkey {
  url: string;
  child: ChildProcess;
  stop(): Promise<void>;
}

/** Installs Portkey into the cache folder unless it is there; throws when npm fails. */
async function install(): Promise<void> {
  if (
    await stat(START).then(
      () => true,
      () => false,
    )
  )
    return;
  await mkdir(CACHE, { recursive: true });
  await writeFile(
    join(CACHE, "package.json"),
    JSON.stringify({
      name: "warmgate-bench-portkey",
      private: true,
      dependencies: { "@portkey-ai/gateway": PORTKEY_VERSION },
      overrides: { "@hono/node-server": NODE_SERVER_VERSION },
    }),
  );
  // `npm run` names its own npm; otherwise the one on PATH.
  const npm = process.env.npm_execpath;
  const [command, args] = npm === undefined ? ["npm", [] as string[]] : [process.execPath, [npm]];
  await promisify(execFile)(
    command,
    [...args, "install", "--ignore-scripts", "--no-audit", "--no-fund", "--omit=dev"],
    { cwd: CACHE, timeout: 180_000 },
  );
}

/**
 * Installs (once) and starts Portkey on a free port, waiting until it answers; throws
 * when it cannot be installed or does not start.
 */
export async function startPortkey(): Promise<RunningPortkey> {
  await install();
  const port = await freePort();
  const child = spawn(process.execPath, [START, `--port=${port}`], {
    cwd: CACHE,
    stdio: ["ignore", "ignore", "pipe"],
  });
  let output = "";
  child.stderr?.on("data", (chunk: Buffer) => {
    output = (output + chunk.toString()).slice(-4000);
  });
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once("exit", r));
    child.kill("SIGTERM");
    await exited;
  };
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) break;
    try {
      const res = await fetch(url);
      await res.body?.cancel();
      return { url, child, stop };
    } catch {
      await sleep(150);
    }
  }
  await stop();
  throw new Error(`Portkey did not start on port ${port}: ${output}`);
}

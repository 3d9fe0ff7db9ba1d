// `npm start` as a user runs it, in its own state folder, for the e2e tests that need the
// whole local stack (test/e2e/local-stack.test.ts, readme-commands.test.ts).
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROOT } from "../../scripts/edge.ts";

const dirs: string[] = [];
const children: ChildProcess[] = [];

/**
 * Stops what {@link npmStart} started (npm's whole process group: npm, its shell and
 * `npm start`, which stops the stack on SIGTERM; then SIGKILL for what is left) and
 * removes the state folders; for `afterEach`.
 */
export async function cleanUpStarts(): Promise<void> {
  for (const child of children.splice(0)) {
    const pid = child.pid;
    if (pid === undefined || !signal(pid, "SIGTERM")) continue;
    await until("npm start to stop", () => !signal(pid, 0)).catch(() => signal(pid, "SIGKILL"));
  }
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
}

/** Sends `name` to the process group `pid` leads; false when the group is gone. */
function signal(pid: number, name: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pid, name);
    return true;
  } catch {
    return false;
  }
}

/** A fresh state folder, removed by {@link cleanUpStarts}. */
export async function stateDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "warmgate-start-"));
  dirs.push(dir);
  return dir;
}

/** Runs `npm start -- …args` in the project; its output so far through `out` and `err`. */
export function npmStart(args: string[]): {
  child: ChildProcess;
  out: () => string;
  err: () => string;
} {
  const child = spawn("npm", ["start", "--", ...args], {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  children.push(child);
  let out = "";
  let err = "";
  child.stdout?.on("data", (c: Buffer) => (out += c.toString()));
  child.stderr?.on("data", (c: Buffer) => (err += c.toString()));
  return { child, out: () => out, err: () => err };
}

/** Waits (up to two minutes) until `check` holds. */
export async function until(what: string, check: () => boolean | Promise<boolean>): Promise<void> {
  for (let i = 0; i < 600; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out waiting for ${what}`);
}

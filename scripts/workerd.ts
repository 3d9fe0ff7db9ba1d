/**
 * Serves a Worker under workerd as `wrangler dev` runs it (same Miniflare, workerd and
 * bindings) but without wrangler's dev proxy or Miniflare's entry Worker, as deployed
 * Workers are reached (docs/benchmarks.md). Bundles as `wrangler deploy --dry-run` would,
 * prints `listening on http://127.0.0.1:PORT`, and stops (removing its state) on SIGTERM.
 *
 *   node scripts/workerd.ts --config wrangler.toml [--vars-file F] [--port 0]
 *     [--persist-to DIR] [--inspector-port P] [--async-trace FILE] [--entry-worker]
 *     [--verbose]
 */
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { rmSync } from "node:fs";
import { chmod, mkdtemp, readdir, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import {
  Log,
  LogLevel,
  Miniflare,
  convertV4MiniflareOptions,
  type V4WorkerOptions,
} from "miniflare";
import { unstable_getMiniflareWorkerOptions } from "wrangler";
import { onParentExit } from "./parent-watch.ts";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");

const { values: args } = parseArgs({
  options: {
    config: { type: "string" },
    "vars-file": { type: "string" },
    port: { type: "string", default: "0" },
    "persist-to": { type: "string" },
    "inspector-port": { type: "string" },
    "async-trace": { type: "string" },
    "entry-worker": { type: "boolean", default: false },
    verbose: { type: "boolean", default: false },
  },
  strict: true,
});
if (args.config === undefined) {
  console.error("usage: node scripts/workerd.ts --config wrangler.toml [--vars-file vars.json]");
  process.exit(2);
}
const config = resolve(args.config);
const vars = args["vars-file"]
  ? (JSON.parse(await readFile(args["vars-file"], "utf8")) as Record<string, string>)
  : {};

const scratch = await mkdtemp(join(tmpdir(), "warmgate-workerd-"));
// Miniflare stops workerd and exits on SIGTERM and SIGINT by itself; the scratch folder
// (bundle and state) goes with the process, however it ends.
process.on("exit", () => rmSync(scratch, { recursive: true, force: true }));
process.on("SIGTERM", () => process.exit(0));
process.on("SIGINT", () => process.exit(0));
// Started by a benchmark or test that was killed outright: go with it.
onParentExit(() => process.exit(0));
try {
  if (args["async-trace"] !== undefined) await traceTo(resolve(args["async-trace"]));
  const mf = await serve();
  const url = args["entry-worker"] ? await mf.ready : await mf.unsafeGetDirectURL("worker");
  console.log(`listening on ${url.origin}`);
} catch (error) {
  console.error(error instanceof Error ? error.message : error);
  process.exit(1);
}

/**
 * Has Miniflare start workerd with `--async-trace FILE`: it has no option for it, but runs
 * the binary `MINIFLARE_WORKERD_PATH` names, here a wrapper that adds the flag.
 */
async function traceTo(file: string): Promise<void> {
  // The binary Miniflare would run: one named already, or the `workerd` package's.
  const workerd =
    process.env.MINIFLARE_WORKERD_PATH ??
    (createRequire(import.meta.url)("workerd") as { default: string }).default;
  const wrapper = join(scratch, "workerd-traced");
  await writeFile(
    wrapper,
    `#!/bin/sh\ncommand="$1"\nshift\nexec ${shellQuote(workerd)} "$command" --async-trace ${shellQuote(file)} "$@"\n`,
  );
  await chmod(wrapper, 0o700);
  process.env.MINIFLARE_WORKERD_PATH = wrapper;
}

function shellQuote(value: string): string {
  return `'${value.replaceAll("'", "'\\''")}'`;
}

/** Bundles the Worker into the scratch folder and starts it. */
async function serve(): Promise<Miniflare> {
  const outdir = join(scratch, "bundle");
  const bundled = spawnSync(
    process.execPath,
    [
      join(ROOT, "node_modules", "wrangler", "bin", "wrangler.js"),
      "deploy",
      "--dry-run",
      "--outdir",
      outdir,
      "--config",
      config,
    ],
    {
      cwd: dirname(config),
      env: { ...process.env, WRANGLER_SEND_METRICS: "false", CI: "true", NO_COLOR: "1" },
      encoding: "utf8",
    },
  );
  if (bundled.status !== 0) {
    throw new Error(`bundling ${config} failed:\n${bundled.stdout}\n${bundled.stderr}`);
  }
  // The bundle's entry module: named after the Worker's `main` (index.js, worker.js…).
  const entry = (await readdir(outdir)).find((name) => name.endsWith(".js"));
  if (entry === undefined) throw new Error(`bundling ${config} wrote no JavaScript`);

  const { workerOptions } = unstable_getMiniflareWorkerOptions(config);
  // The bundle replaces the source options (root, module rules); empty binding groups are
  // left out, since the conversion below refuses options it cannot carry over.
  const { rootPath: _root, modulesRules: _rules, ...rest } = workerOptions;
  const bindingOptions = Object.fromEntries(
    Object.entries(rest).filter(
      ([, value]) =>
        value !== undefined &&
        !(Array.isArray(value) && value.length === 0) &&
        !(typeof value === "object" && value !== null && Object.keys(value).length === 0),
    ),
  ) as Partial<V4WorkerOptions>;
  const worker = {
    ...bindingOptions,
    name: "worker",
    modules: true,
    scriptPath: join(outdir, entry),
    modulesRoot: outdir,
    bindings: { ...bindingOptions.bindings, ...vars },
    // The listening socket: straight to the Worker, past Miniflare's entry Worker.
    ...(args["entry-worker"]
      ? {}
      : { unsafeDirectSockets: [{ host: "127.0.0.1", port: Number(args.port) }] }),
  } as V4WorkerOptions;
  // Miniflare 5 takes its own option shape; wrangler's options convert the way `wrangler
  // dev` converts them.
  return new Miniflare(
    convertV4MiniflareOptions({
      workers: [worker],
      host: "127.0.0.1",
      // Miniflare's own entry socket: unused but for `--entry-worker`.
      port: args["entry-worker"] ? Number(args.port) : 0,
      // Offline: Miniflare fetches no `request.cf` data (the entry socket would give its
      // placeholder; the Worker's own socket gives none).
      cf: false,
      resourcePersistencePath: args["persist-to"] ?? join(scratch, "state"),
      ...(args["inspector-port"] ? { inspectorPort: Number(args["inspector-port"]) } : {}),
      log: new Log(args.verbose ? LogLevel.INFO : LogLevel.WARN),
    }),
  );
}

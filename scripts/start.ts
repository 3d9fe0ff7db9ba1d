/**
 * `npm start`: the whole warmgate stack on this machine — simulated GPU origins for two
 * regions and the edge under `wrangler dev` — then `export` lines to use it, also written
 * to an env file for other terminals. Stops every part on SIGINT or SIGTERM, or when the
 * process that started it is gone.
 * See README.md, "Quick start".
 */
import { rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { watchEdge } from "./edge-watch.ts";
import { onParentExit } from "./parent-watch.ts";
import { readSettingsFile } from "./settings-file.ts";
import { ROOT } from "./edge.ts";
import { DEFAULT_REGIONS, startStack } from "./stack.ts";
import { exportLines, sourceCommand, startVars } from "./start-env.ts";

const USAGE =
  "usage: npm start -- [--port N] [--time-scale X] [--origins-per-region N] [--config FILE] [--state DIR] [--exports-file FILE] [--verbose]";

function fail(message: string): never {
  console.error(`warmgate: ${message}\n${USAGE}`);
  process.exit(2);
}

function parseNumber(name: string, raw: string | undefined, min: number, max: number) {
  if (raw === undefined) return undefined;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < min || value > max) {
    fail(`--${name} must be a number from ${min} to ${max}, got "${raw}"`);
  }
  return value;
}

let args;
try {
  args = parseArgs({
    options: {
      port: { type: "string" },
      "time-scale": { type: "string" },
      "origins-per-region": { type: "string" },
      config: { type: "string" },
      state: { type: "string" },
      "exports-file": { type: "string" },
      verbose: { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
    strict: true,
    allowPositionals: false,
  }).values;
} catch (error) {
  fail((error as Error).message);
}
if (args.help) {
  console.log(USAGE);
  process.exit(0);
}
const port = parseNumber("port", args.port, 1, 65535);
if (port !== undefined && !Number.isInteger(port)) fail(`--port must be an integer`);
const timeScale = parseNumber("time-scale", args["time-scale"], 0, 100) ?? 1;
const perRegion = parseNumber("origins-per-region", args["origins-per-region"], 1, 16) ?? 2;

const settings =
  args.config === undefined
    ? {}
    : await readSettingsFile(args.config).catch((error: Error) => fail(error.message));

const state = args.state ?? join(ROOT, ".wrangler", "state");
const envFile = args["exports-file"] ?? join(state, "warmgate.env");

// A signal stops the stack; during start-up it calls start-up off, which stops what started.
let stopping = false;
const starting = new AbortController();
let stopStack: () => Promise<void> = async () => {};
async function shutdown(why: string, code = 0) {
  if (stopping) return;
  stopping = true;
  console.error(`warmgate: ${why}, stopping…`);
  starting.abort();
  await stopStack();
  await rm(envFile, { force: true });
  process.exit(code);
}
process.on("SIGINT", () => void shutdown("SIGINT"));
process.on("SIGTERM", () => void shutdown("SIGTERM"));
process.on("SIGHUP", () => void shutdown("SIGHUP"));
// `npm start` runs this under a shell that does not pass signals on: when npm is stopped,
// the shell goes and this process is left, so it watches for that.
onParentExit(() => void shutdown("the process that started warmgate exited"));

console.error("warmgate: starting simulated origins and the edge (wrangler dev)…");
const startup = startStack({
  ...(port ? { edgePort: port } : {}),
  sim: { timeScale },
  regions: DEFAULT_REGIONS.map((region) => ({ ...region, origins: perRegion })),
  settings,
  persistTo: state,
  // What a user measures locally is what production runs: wrangler's local trace collector,
  // which doubles the edge's CPU, only with --verbose.
  verbose: args.verbose,
  localObservability: args.verbose,
  signal: starting.signal,
});
stopStack = () =>
  startup.then(
    (stack) => stack.stop(),
    () => undefined,
  );
const stack = await startup.catch((error: unknown) => {
  // Called off by a signal: shutdown exits once what started has stopped.
  if (!stopping) {
    console.error(`warmgate: could not start: ${(error as Error).message}`);
    process.exit(1);
  }
  return new Promise<never>(() => {});
});

const lines = exportLines(startVars(stack));
await writeFile(envFile, lines.join("\n") + "\n", { mode: 0o600 });
for (const line of lines) console.log(line);
console.error(
  "warmgate: ready. Regions: " +
    stack.origins.map((o) => `${o.region}:${o.origin.originId}@${o.origin.url}`).join(" ") +
    ".\nwarmgate: in another terminal: " +
    sourceCommand(envFile) +
    ` && curl -sN $WARMGATE_URL/v1/chat/completions -H "authorization: Bearer $WARMGATE_KEY" ` +
    `-H "content-type: application/json" ` +
    `-d '{"model":"warmgate-sim-8b","stream":true,"messages":[{"role":"user","content":"Hello!"}]}'` +
    "\nwarmgate: Ctrl-C stops everything.",
);

let restarting = false;
function watchExit() {
  stack.edge.once("exit", (code) => {
    if (!restarting) void shutdown(`wrangler dev exited (${code ?? "signal"})`, 1);
  });
}
watchExit();
// An edge that stops answering (its runtime died and came back deaf) is started again on
// the same port and state.
const stopWatch = watchEdge(stack.edgeUrl, async () => {
  if (stopping) return;
  console.error("warmgate: the edge stopped answering its health checks; starting it again…");
  restarting = true;
  try {
    await stack.restartEdge();
    console.error("warmgate: the edge is back.");
  } catch (error) {
    void shutdown(`the edge could not be started again: ${(error as Error).message}`, 1);
    return;
  } finally {
    restarting = false;
  }
  watchExit();
});
stopStack = () => {
  stopWatch();
  return stack.stop();
};

/**
 * `npm start`: the whole warmgate stack on this machine — simulated GPU origins for two
 * regions and the edge under `wrangler dev` — then shell-sourceable lines to use it.
 * See README.md, "Quick start".
 */
import { join } from "node:path";
import { parseArgs } from "node:util";
import { ROOT } from "./edge.ts";
import { DEFAULT_REGIONS, startStack } from "./stack.ts";

const USAGE =
  "usage: npm start -- [--port N] [--time-scale X] [--origins-per-region N] [--state DIR] [--verbose]";

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
      state: { type: "string" },
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

console.error("warmgate: starting simulated origins and the edge (wrangler dev)…");
const stack = await startStack({
  ...(port ? { edgePort: port } : {}),
  sim: { timeScale },
  regions: DEFAULT_REGIONS.map((region) => ({ ...region, origins: perRegion })),
  persistTo: args.state ?? join(ROOT, ".wrangler", "state"),
  verbose: args.verbose,
}).catch((error: unknown) => {
  console.error(`warmgate: could not start: ${(error as Error).message}`);
  process.exit(1);
});

const origins = stack.origins.map((o) => o.origin.url).join(",");
console.log(`WARMGATE_URL=${stack.edgeUrl}`);
console.log(`WARMGATE_ORIGINS=${origins}`);
console.log(`WARMGATE_ADMIN_TOKEN=${stack.adminToken}`);
console.log(`WARMGATE_KEY=${stack.apiKey}`);
console.log(`WARMGATE_ORIGIN_ADMIN_TOKEN=${stack.originAdminToken}`);
console.log(
  `curl -sN ${stack.edgeUrl}/v1/chat/completions -H "authorization: Bearer ${stack.apiKey}" ` +
    `-H "content-type: application/json" ` +
    `-d '{"model":"warmgate-sim-8b","stream":true,"messages":[{"role":"user","content":"Hello!"}]}'`,
);
console.error(
  "warmgate: ready. Regions: " +
    stack.origins.map((o) => `${o.region}:${o.origin.originId}@${o.origin.url}`).join(" ") +
    ". Ctrl-C stops everything.",
);

let stopping = false;
async function shutdown(signal: string) {
  if (stopping) return;
  stopping = true;
  console.error(`warmgate: ${signal}, stopping…`);
  await stack.stop();
  process.exit(0);
}
process.on("SIGINT", () => void shutdown("SIGINT"));
process.on("SIGTERM", () => void shutdown("SIGTERM"));
stack.edge.once("exit", (code) => {
  if (stopping) return;
  console.error(`warmgate: wrangler dev exited (${code ?? "signal"}), stopping origins`);
  void stack.stop().then(() => process.exit(1));
});

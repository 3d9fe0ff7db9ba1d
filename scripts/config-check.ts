/**
 * `npm run config:check -- FILE [--local]`: checks a `WARMGATE_CONFIG` document (a JSON
 * file, `-` for stdin, or a wrangler.toml's `[vars]`) with the Worker's schema and
 * messages, and, unless `--local`, the start-up checks of a deployed Worker (no origin it
 * cannot reach). Exits 0 with a summary (and a warning for an origin on plain HTTP at a
 * public address) when the Worker would start, 1 with every problem.
 * See docs/deploy.md.
 */
import { readFile } from "node:fs/promises";
import { parseArgs } from "node:util";
import { loadConfig } from "../contracts/config/gateway.ts";
import { deploymentProblems, deploymentWarnings } from "../functions/deployment.ts";

const USAGE = "usage: npm run config:check -- FILE|- [--local]";

let parsed;
try {
  parsed = parseArgs({
    options: { local: { type: "boolean", default: false }, help: { type: "boolean" } },
    allowPositionals: true,
  });
} catch (error) {
  console.error(`config:check: ${(error as Error).message}\n${USAGE}`);
  process.exit(2);
}
const file = parsed.positionals[0];
if (parsed.values.help === true || file === undefined || parsed.positionals.length > 1) {
  console.error(USAGE);
  process.exit(parsed.values.help === true ? 0 : 2);
}

let text: string;
try {
  text =
    file === "-"
      ? await new Response(process.stdin as unknown as ReadableStream).text()
      : await readFile(file, "utf8");
} catch (error) {
  console.error(`config:check: cannot read ${file}: ${(error as Error).message}`);
  process.exit(2);
}

// A wrangler.toml keeps the document as a one-line literal string in [vars].
if (file.endsWith(".toml")) {
  const literal = /^\s*WARMGATE_CONFIG\s*=\s*'(.*)'\s*$/m.exec(text)?.[1];
  if (literal === undefined) {
    // Kept as a secret (`wrangler secret put WARMGATE_CONFIG`): check that file instead.
    console.log(`config:check: ${file} sets no WARMGATE_CONFIG in [vars]; nothing to check`);
    process.exit(0);
  }
  text = literal;
}

// Secrets are not part of the document: only its own problems count here.
const problems = deploymentProblems({
  WARMGATE_CONFIG: text,
  ...(parsed.values.local ? { WARMGATE_ENV: "local" } : {}),
  ADMIN_TOKEN: "set",
  TOKEN_SIGNING_SECRET: "set",
});
if (problems.length > 0) {
  for (const problem of problems) console.error(`config:check: ${file}: ${problem}`);
  process.exit(1);
}
for (const warning of deploymentWarnings({ WARMGATE_CONFIG: text })) {
  console.error(`config:check: ${file}: warning: ${warning}`);
}
const config = loadConfig(text);
const origins = config.regions.reduce((sum, region) => sum + region.origins.length, 0);
console.log(
  `config:check: ${file}: ok — ${config.models.length} models, ${config.regions.length} regions, ${origins} origins` +
    (parsed.values.local ? " (local: loopback origins allowed)" : ""),
);

/**
 * `npm test`'s run of both projects (docs/edge.md, "Running the checks"): their files split
 * into lanes that run side by side, each a vitest process of its own, one file at a time,
 * with its own simulated origins (the workers project's global setup), so that no two files
 * share an origin's injected faults or counts; then one report of all lanes. `TEST_LANES`
 * sets how many (default: the CPUs, at most 4).
 */
import { spawn } from "node:child_process";
import { createWriteStream, mkdirSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { availableParallelism } from "node:os";
import { dirname, join } from "node:path";

const REPORTS = ".vitest-reports";
// Not among the reports: the merge reads every file there.
const LOGS = "test-results";
const lanes = Number(process.env["TEST_LANES"] ?? Math.min(4, availableParallelism()));
if (!Number.isInteger(lanes) || lanes < 1) {
  console.error(
    `TEST_LANES is a whole number of lanes, 1 or more, not ${process.env["TEST_LANES"]}`,
  );
  process.exit(2);
}
const env = { ...process.env, WRANGLER_SEND_METRICS: "false" };
// The project's own vitest, run by this Node, whether or not npm put it on the PATH.
const VITEST = join(
  dirname(createRequire(import.meta.url).resolve("vitest/package.json")),
  "vitest.mjs",
);

function vitest(args: string[], log: string | null): Promise<number> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [VITEST, ...args], {
      env,
      stdio: ["ignore", log === null ? "inherit" : "pipe", log === null ? "inherit" : "pipe"],
    });
    if (log !== null) {
      const out = createWriteStream(log);
      child.stdout?.pipe(out);
      child.stderr?.pipe(out);
    }
    child.on("error", (error) => {
      console.error(`vitest did not start: ${error.message}`);
      resolve(1);
    });
    child.on("close", (code) => resolve(code ?? 1));
  });
}

rmSync(REPORTS, { recursive: true, force: true });
mkdirSync(LOGS, { recursive: true });
const began = Date.now();
console.log(
  `tests: ${lanes === 1 ? "one lane" : `${lanes} lanes side by side`} (logs: ${LOGS}/lane-N.log)`,
);
const codes = await Promise.all(
  Array.from({ length: lanes }, async (_, i) => {
    const shard = `${i + 1}/${lanes}`;
    const code = await vitest(
      ["run", `--shard=${shard}`, "--reporter=blob", "--maxWorkers=1"],
      `${LOGS}/lane-${i + 1}.log`,
    );
    const seconds = ((Date.now() - began) / 1000).toFixed(0);
    console.log(`lane ${shard} ended after ${seconds} s with exit code ${code}`);
    return code;
  }),
);
const merged = await vitest(["run", "--merge-reports"], null);
const failed = codes.findIndex((code) => code !== 0);
if (failed >= 0 && merged === 0) {
  console.error(`lane ${failed + 1} failed outside its tests: see ${LOGS}/lane-${failed + 1}.log`);
}
process.exit(merged !== 0 || failed >= 0 ? 1 : 0);

/**
 * `npm run bench:prefix` (docs/benchmarks.md, "Prefix blocks"): what cutting a prompt into
 * chain-hashed prefix blocks costs the edge, for chat prompts of 1k to 32k stand-in tokens
 * (rendering included). Prints a table and writes bench/results/prefix.json; the goal is
 * under 0.5 ms p99 for a 32k-token prompt.
 */
import { BYTES_PER_TOKEN, promptBlocks } from "../contracts/prefix-blocks.ts";
import { benchCommand, fmt, markdownTable, summarize, writeResult } from "./lib.ts";

const SIZES = [1_024, 4_096, 16_384, 32_768];
const RUNS = 2_000;
const words = "the quick brown fox jumps over a lazy dog while billing questions wait ".split(" ");

// As the edge holds a request: parsed from its JSON body (flat strings, not built up).
function prompt(tokens: number, seed: number) {
  const parts: string[] = [];
  for (let i = 0, n = 0; n < tokens * BYTES_PER_TOKEN; i++) {
    const word = words[(i * 7 + seed) % words.length] ?? "";
    parts.push(word);
    n += word.length + 1;
  }
  const body = {
    messages: [
      { role: "system", content: parts.join(" ") },
      { role: "user", content: `Question ${seed}?` },
    ],
  };
  return JSON.parse(JSON.stringify(body)) as typeof body;
}

const rows = SIZES.map((tokens) => {
  const requests = Array.from({ length: 16 }, (_, i) => prompt(tokens, i));
  // Warm the JIT.
  for (const request of requests) promptBlocks("m", request);
  const times: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    const request = requests[i % requests.length] ?? prompt(tokens, 0);
    const started = performance.now();
    promptBlocks("warmgate-sim-8b", request);
    times.push(performance.now() - started);
  }
  return { tokens, ...summarize(times) };
});

const p99At32k = rows.find((r) => r.tokens === 32_768)?.p99 ?? Number.NaN;
const targets = [
  {
    target: "32k-token prompt: blocks p99",
    measured: `${fmt(p99At32k, 3)} ms`,
    goal: "< 0.5 ms",
    met: p99At32k < 0.5,
  },
];
const command = benchCommand("bench:prefix");
console.log(`\n## Prefix blocks (\`${command}\`)\n`);
console.log(
  markdownTable(
    ["prompt tokens", "p50 ms", "p99 ms"],
    rows.map((r) => [String(r.tokens), fmt(r.p50, 3), fmt(r.p99, 3)]),
  ),
);
console.log(
  `\n${markdownTable(
    ["target", "measured", "goal", "met"],
    targets.map((t) => [t.target, t.measured, t.goal, t.met ? "yes" : "NO"]),
  )}`,
);
console.log(`\nwrote ${await writeResult("prefix", { command, runs: RUNS, rows, targets })}`);

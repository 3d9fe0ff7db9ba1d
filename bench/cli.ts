/**
 * `npm run bench -- --url URL --key KEY --model M [options]`: measures any
 * OpenAI-compatible endpoint, warmgate or not, with chat completions from N concurrent
 * clients: TTFT at the first content token, inter-token latency, total latency
 * (p50/p95/p99), tokens/s, errors by status and code. Two `--url`s are measured in one
 * run, each with its own N clients at the same time, with each figure's ratio. See
 * docs/benchmarks.md.
 */
import { readFile, writeFile } from "node:fs/promises";
import { parseArgs } from "node:util";
import { percentile, provenance } from "./lib.ts";
import { type RequestSpec, type Sample, measure } from "./cli-measure.ts";
import { loadEndpoints } from "./cli-run.ts";

const USAGE = `usage: npm run bench -- --url URL --key KEY --model M [--url URL2 --key KEY2]
    [--concurrency N] [--requests N | --duration S] [--prompt-file F] [--max-tokens N]
    [--stream] [--json] [--out FILE]

  --url URL        an OpenAI-compatible base URL (its /v1/chat/completions is called);
                   give two to compare them, each with its own clients at once
  --key KEY        bearer key for each --url (one key serves both)
  --model M        model name (one for both, or one per --url)
  --concurrency N  clients sending at once, per endpoint (default 8)
  --requests N     requests per endpoint (default 200)
  --duration S     stop after S seconds instead
  --prompt-file F  one prompt per line, used in turn (default: built-in prompts)
  --max-tokens N   max_tokens of each request (default 64)
  --stream         stream answers (TTFT and inter-token latency need it)
  --json           print the results as JSON instead of a table
  --out FILE       also write the JSON to FILE`;

const DEFAULT_PROMPTS = [
  "Explain what a KV cache is in two sentences.",
  "Write a haiku about load balancers.",
  "List three uses of a circuit breaker in distributed systems.",
  "Summarise the benefits of micro-batching for GPU inference.",
];

function fail(message: string): never {
  console.error(`bench: ${message}\n${USAGE}`);
  process.exit(2);
}

function count(name: string, raw: string | undefined, fallback: number): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 1)
    fail(`--${name} must be a positive integer, got "${raw}"`);
  return value;
}

/** The figures of one endpoint. */
export interface EndpointResult {
  url: string;
  model: string;
  requests: number;
  ok: number;
  errors: Record<string, number>;
  seconds: number;
  rps: number;
  tokensPerSecond: number;
  ttftMs: Percentiles;
  itlMs: Percentiles;
  totalMs: Percentiles;
}

type Percentiles = { p50: number | null; p95: number | null; p99: number | null };

function percentiles(values: number[]): Percentiles {
  if (values.length === 0) return { p50: null, p95: null, p99: null };
  const sorted = [...values].sort((a, b) => a - b);
  return { p50: percentile(sorted, 50), p95: percentile(sorted, 95), p99: percentile(sorted, 99) };
}

function resultOf(url: string, model: string, samples: Sample[], seconds: number): EndpointResult {
  const ok = samples.filter((s) => s.ok);
  const errors: Record<string, number> = {};
  for (const s of samples) {
    if (!s.ok)
      errors[`${s.status} ${s.code ?? ""}`.trim()] =
        (errors[`${s.status} ${s.code ?? ""}`.trim()] ?? 0) + 1;
  }
  const tokens = ok.reduce((sum, s) => sum + s.outputTokens, 0);
  return {
    url,
    model,
    requests: samples.length,
    ok: ok.length,
    errors,
    seconds,
    rps: samples.length / seconds,
    tokensPerSecond: tokens / seconds,
    ttftMs: percentiles(ok.flatMap((s) => (s.ttftMs === null ? [] : [s.ttftMs]))),
    itlMs: percentiles(ok.flatMap((s) => s.itlMs)),
    totalMs: percentiles(ok.map((s) => s.totalMs)),
  };
}

function progress(done: number, total: number | null, started: number, errors: number): void {
  const seconds = (performance.now() - started) / 1000;
  const share = total === null ? null : done / total;
  const width = 30;
  const bar =
    share === null ? "" : `[${"#".repeat(Math.round(share * width)).padEnd(width, ".")}] `;
  const line = `${bar}${done}${total === null ? "" : `/${total}`}  ${(done / Math.max(seconds, 0.001)).toFixed(1)} req/s  errors ${errors}  ${seconds.toFixed(0)} s`;
  if (process.stderr.isTTY) process.stderr.write(`\r${line}`);
  else if (done % Math.max(1, Math.round((total ?? 100) / 10)) === 0)
    process.stderr.write(`${line}\n`);
}

function fmt(value: number | null, digits = 1): string {
  return value === null || !Number.isFinite(value) ? "–" : value.toFixed(digits);
}

function table(results: EndpointResult[]): string {
  const rows: [string, (r: EndpointResult) => number | null, number][] = [
    ["requests ok", (r) => r.ok, 0],
    ["requests/s", (r) => r.rps, 2],
    ["output tokens/s", (r) => r.tokensPerSecond, 1],
    ["TTFT p50 ms", (r) => r.ttftMs.p50, 1],
    ["TTFT p95 ms", (r) => r.ttftMs.p95, 1],
    ["TTFT p99 ms", (r) => r.ttftMs.p99, 1],
    ["ITL p50 ms", (r) => r.itlMs.p50, 2],
    ["ITL p95 ms", (r) => r.itlMs.p95, 2],
    ["ITL p99 ms", (r) => r.itlMs.p99, 2],
    ["total p50 ms", (r) => r.totalMs.p50, 1],
    ["total p95 ms", (r) => r.totalMs.p95, 1],
    ["total p99 ms", (r) => r.totalMs.p99, 1],
  ];
  const header = ["figure", ...results.map((r, i) => `${String.fromCharCode(65 + i)}: ${r.url}`)];
  if (results.length === 2) header.push("B / A");
  const lines = rows.map(([name, pick, digits]) => {
    const values = results.map(pick);
    const cells = [name, ...values.map((v) => fmt(v, digits))];
    if (results.length === 2) {
      const [a, b] = values;
      cells.push(
        a === null || b === null || a === undefined || b === undefined || a === 0
          ? "–"
          : `${(b / a).toFixed(2)}×`,
      );
    }
    return cells;
  });
  const errors = results.map(
    (r) =>
      Object.entries(r.errors)
        .map(([k, n]) => `${k}: ${n}`)
        .join(", ") || "none",
  );
  lines.push(["errors", ...errors, ...(results.length === 2 ? [""] : [])]);
  const all = [header, ...lines];
  const widths = header.map((_, i) => Math.max(...all.map((row) => (row[i] ?? "").length)));
  const render = (row: string[]) =>
    `| ${row.map((c, i) => c.padEnd(widths[i] ?? 0)).join(" | ")} |`;
  return [
    render(header),
    `|${widths.map((w) => "-".repeat(w + 2)).join("|")}|`,
    ...lines.map(render),
  ].join("\n");
}

async function main(): Promise<void> {
  let values;
  try {
    values = parseArgs({
      options: {
        url: { type: "string", multiple: true },
        key: { type: "string", multiple: true },
        model: { type: "string", multiple: true },
        concurrency: { type: "string" },
        requests: { type: "string" },
        duration: { type: "string" },
        "prompt-file": { type: "string" },
        "max-tokens": { type: "string" },
        stream: { type: "boolean", default: false },
        json: { type: "boolean", default: false },
        out: { type: "string" },
        help: { type: "boolean", default: false },
      },
      strict: true,
    }).values;
  } catch (error) {
    fail((error as Error).message);
  }
  if (values.help) {
    console.log(USAGE);
    return;
  }
  const urls = values.url ?? [];
  const keys = values.key ?? [];
  const models = values.model ?? [];
  if (urls.length < 1 || urls.length > 2) fail("give one --url, or two to compare");
  if (keys.length !== 1 && keys.length !== urls.length) fail("give one --key, or one per --url");
  if (models.length !== 1 && models.length !== urls.length)
    fail("give one --model, or one per --url");
  for (const url of urls)
    if (!/^https?:\/\//.test(url)) fail(`--url must be http(s), got "${url}"`);
  const concurrency = count("concurrency", values.concurrency, 8);
  const duration = values.duration === undefined ? null : count("duration", values.duration, 1);
  const perEndpoint = duration === null ? count("requests", values.requests, 200) : null;
  const maxTokens = count("max-tokens", values["max-tokens"], 64);
  const prompts =
    values["prompt-file"] === undefined
      ? DEFAULT_PROMPTS
      : (await readFile(values["prompt-file"], "utf8")).split("\n").filter((l) => l.trim() !== "");
  if (prompts.length === 0) fail("--prompt-file has no prompts");

  const specs: RequestSpec[] = urls.map((url, i) => ({
    url,
    key: keys[i] ?? keys[0] ?? "",
    model: models[i] ?? models[0] ?? "",
    prompt: "",
    maxTokens,
    stream: values.stream,
  }));
  // Taken before the run: a results file written meanwhile (this run's own) dirties the tree.
  const origin = provenance();
  const total = perEndpoint === null ? null : perEndpoint * specs.length;
  const started = performance.now();
  let done = 0;
  let errors = 0;
  // Each endpoint its own clients, all at once: both see the same moments, and a slower
  // one never takes clients from the other.
  const runs = await loadEndpoints({
    endpoints: specs.length,
    concurrency,
    requests: perEndpoint,
    deadline: duration === null ? Infinity : started + duration * 1000,
    send: (endpoint, i) => {
      const spec = specs[endpoint];
      if (spec === undefined) throw new Error(`no endpoint ${endpoint}`);
      // Every endpoint gets the prompts in the same order.
      return measure({ ...spec, prompt: prompts[i % prompts.length] ?? "" });
    },
    onSample: (_, sample) => {
      done++;
      if (!sample.ok) errors++;
      progress(done, total, started, errors);
    },
  });
  if (process.stderr.isTTY) process.stderr.write("\n");
  const results = specs.map((spec, i) =>
    resultOf(spec.url, spec.model, runs.samples[i] ?? [], runs.seconds[i] ?? 0),
  );
  const report = {
    // The command as run, its keys masked.
    command: `npm run bench -- ${process.argv
      .slice(2)
      .map((a, i, all) => (all[i - 1] === "--key" ? "…" : a.startsWith("--key=") ? "--key=…" : a))
      .join(" ")}`,
    concurrency,
    stream: values.stream,
    maxTokens,
    results,
    ...(results.length === 2
      ? {
          note: `Ratios are B / A; each endpoint had its own ${concurrency} clients, at the same time.`,
        }
      : {}),
  };
  // A file records the checkout it was measured from (the endpoints may run other code).
  const stamped = { provenance: origin, ...report };
  if (values.out !== undefined)
    await writeFile(values.out, JSON.stringify(stamped, null, 2) + "\n");
  if (values.json) console.log(JSON.stringify(stamped, null, 2));
  else console.log(table(results));
}

await main();

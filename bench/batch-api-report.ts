/**
 * The parts of `npm run bench:batch-api` (docs/benchmarks.md, "Batch API"): the batch file,
 * the interactive streams, the origins' load sampled from their own metrics, the table's
 * windows and the targets (the chart: bench/batch-api-chart.ts).
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { BatchAudit } from "./batch-api-checks.ts";
import { metricSum } from "./batch-api-checks.ts";
import type { OriginAccess } from "./chaos-lookup.ts";
import { fmt, summarize } from "./lib.ts";
import { cpuTimeMs } from "./processes.ts";
import { backgroundCap } from "../origin/background.ts";
import { OUTCOME_RETENTION_MS } from "../origin/outcome-log.ts";

const MODEL = "warmgate-sim-8b";
/** Distinct system prompts of the batch's lines: lines sharing one share a prefix. */
const PREFIXES = 16;
/** How often each origin's load is read. */
const SAMPLE_MS = 250;

/** The batch's JSONL (lines of the prefixes interleaved) and its custom ids in order. */
export function batchFile(lines: number, maxTokens: number) {
  const customIds: string[] = [];
  const out: string[] = [];
  for (let i = 0; i < lines; i++) {
    const customId = `line-${String(i).padStart(6, "0")}`;
    customIds.push(customId);
    const topic = i % PREFIXES;
    out.push(
      JSON.stringify({
        custom_id: customId,
        method: "POST",
        url: "/v1/chat/completions",
        body: {
          model: MODEL,
          messages: [
            {
              role: "system",
              content: `You label support tickets of product line ${topic}. `.repeat(12),
            },
            { role: "user", content: `Ticket ${i}: the export stopped working after an update.` },
          ],
          max_tokens: maxTokens,
          ignore_eos: true,
        },
      }),
    );
  }
  return { jsonl: out.join("\n"), customIds };
}

/** One interactive stream: when it started (s of the run), its TTFT, its request id. */
export interface StreamRecord {
  start: number;
  ttftMs: number;
  requestId: string | null;
  /** The origin's own TTFT of the stream (from its outcome record), when it was found. */
  originTtftMs?: number;
  /** The origin that ran it. */
  origin?: string;
  /** How long it waited at the origin for the engine to admit it. */
  originQueuedMs?: number;
}

/** What a run of interactive streams did. */
export interface Interactive {
  samples: StreamRecord[];
  errors: { at: number; message: string; requestId: string | null }[];
}

/** `streams` clients streaming chat one request after another, against the edge of `edgeUrl()`. */
export function interactiveClient(
  edgeUrl: () => string,
  key: string,
  region: string,
  maxTokens: number,
) {
  let n = 0;
  const once = async (
    at: () => number,
    seen: { requestId: string | null },
  ): Promise<StreamRecord> => {
    const started = performance.now();
    const start = at();
    const res = await fetch(`${edgeUrl()}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${key}`,
        "content-type": "application/json",
        "x-warmgate-region": region,
      },
      body: JSON.stringify({
        model: MODEL,
        messages: [
          { role: "system", content: "You are a concise assistant for the support desk." },
          { role: "user", content: `Question ${n++}: how do I reset my password?` },
        ],
        max_tokens: maxTokens,
        ignore_eos: true,
        stream: true,
      }),
    });
    const requestId = res.headers.get("x-request-id");
    seen.requestId = requestId;
    if (res.status !== 200 || res.body === null) {
      throw new Error(`status ${res.status}: ${(await res.text()).slice(0, 200)}`);
    }
    let ttftMs = Number.NaN;
    let ended = false;
    const decoder = new TextDecoder();
    const reader = res.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const text = decoder.decode(value, { stream: true });
      if (Number.isNaN(ttftMs) && /"content":"[^"]/.test(text))
        ttftMs = performance.now() - started;
      if (text.includes("[DONE]")) ended = true;
    }
    if (!ended) throw new Error("stream cut before [DONE]");
    return { start, ttftMs, requestId };
  };
  return {
    /** Runs `streams` clients for `ms` or until `signal` aborts. */
    async run(streams: number, ms: number, at: () => number, signal?: AbortSignal) {
      const out: Interactive = { samples: [], errors: [] };
      const until = performance.now() + ms;
      const going = () => performance.now() < until && signal?.aborted !== true;
      const loop = async () => {
        while (going()) {
          const seen = { requestId: null as string | null };
          try {
            out.samples.push(await once(at, seen));
          } catch (error) {
            const { requestId } = seen;
            out.errors.push({ at: at(), message: (error as Error).message, requestId });
            await sleep(100);
          }
        }
      };
      await Promise.all(Array.from({ length: streams }, loop));
      return out;
    },
  };
}

/** The edge's workerd CPU time (ms, cumulative for its pid) at one moment. */
export interface CpuSample {
  at: number;
  pid: number;
  cpuMs: number;
}

/** Share of one core the edge's workerd used over the intervals whose ends are `inside` (s of the run). */
export function edgeCpuShare(
  samples: readonly CpuSample[],
  inside: (t: number) => boolean,
): number {
  let cpu = 0;
  let time = 0;
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1];
    const b = samples[i];
    if (a === undefined || b === undefined) continue;
    if (a.pid !== b.pid || !inside(a.at) || !inside(b.at)) continue;
    cpu += b.cpuMs - a.cpuMs;
    time += (b.at - a.at) * 1000;
  }
  return time === 0 ? Number.NaN : cpu / time;
}

/** One origin's load at one moment, from its `/metrics`. */
export interface LoadSample {
  at: number;
  origin: string;
  running: number;
  waiting: number;
}

/** Reads every origin's running and waiting sequences every {@link SAMPLE_MS} until stopped. */
export function sampleOrigins(
  origins: readonly OriginAccess[],
  at: () => number,
  edgePid: () => Promise<number | null>,
) {
  const samples: LoadSample[] = [];
  const cpu: CpuSample[] = [];
  const run = { stopped: false };
  let round = 0;
  const loop = async () => {
    while (!run.stopped) {
      if (round++ % 4 === 0) {
        const pid = await edgePid();
        const cpuMs = await cpuTimeMs(pid);
        if (pid !== null && cpuMs !== null) cpu.push({ at: at(), pid, cpuMs });
      }
      await Promise.all(
        origins.map(async (origin) => {
          try {
            const res = await fetch(`${origin.url}/metrics`, {
              headers: { authorization: `Bearer ${origin.token}` },
            });
            const text = await res.text();
            samples.push({
              at: at(),
              origin: origin.id,
              running: metricSum(text, "vllm:num_requests_running"),
              waiting: metricSum(text, "vllm:num_requests_waiting"),
            });
          } catch {
            // An origin that does not answer is not sampled.
          }
        }),
      );
      await sleep(SAMPLE_MS);
    }
  };
  const done = loop();
  return {
    samples,
    cpu,
    stop: () => {
      run.stopped = true;
      return done;
    },
  };
}

/** The run as the report reads it. */
export interface BatchApiRun {
  alone: Interactive;
  withBatch: Interactive;
  load: LoadSample[];
  cpu: CpuSample[];
  audit: BatchAudit;
  phases: Record<string, number>;
  /** The origins' background lanes over the batch (`originBackground`, differences). */
  background: { okRuns: number; replayed: number; preemptions: number; rerunTokens: number };
}

/** Most completion tokens preempted lines may have generated, of all the batch generated. */
export const RERUN_TOKENS_GOAL = 0.05;

/** The table's rows and the figures the targets compare, per window. */
export function windowRows(
  run: BatchApiRun,
  options: { slots: number; reserveShare: number; excludeFrom: number; excludeTo: number },
) {
  const { phases } = run;
  const fillable = backgroundCap(options.slots, options.reserveShare);
  const outside = (t: number) => t < options.excludeFrom || t > options.excludeTo;
  const window = (interactive: Interactive, ranges: [number, number][], skipRestart: boolean) => {
    const inside = (t: number) =>
      ranges.some(([from, to]) => t >= from && t <= to) && (!skipRestart || outside(t));
    const samples = interactive.samples.filter((s) => inside(s.start));
    const ttft = summarize(samples.map((s) => s.ttftMs));
    const originTtft = summarize(samples.flatMap((s) => s.originTtftMs ?? []));
    const load = run.load.filter((s) => inside(s.at));
    const mean = (f: (s: LoadSample) => number) =>
      load.length === 0 ? 0 : load.reduce((sum, s) => sum + f(s), 0) / load.length;
    return {
      streams: ttft.n,
      errors: interactive.errors.filter((e) => inside(e.at)).length,
      ttftP50: ttft.p50,
      ttftP99: ttft.p99,
      originTtftP99: originTtft.p99,
      edgeCpu: edgeCpuShare(run.cpu, inside),
      slotsBusy: mean((s) => Math.min(1, s.running / options.slots)),
      fillableBusy: mean((s) => Math.min(1, s.running / fillable)),
    };
  };
  const from = phases["batchFrom"] ?? 0;
  const to = phases["batchTo"] ?? 0;
  const summary = {
    alone: window(
      run.alone,
      [
        [phases["aloneFrom"] ?? 0, phases["aloneTo"] ?? 0],
        [phases["againFrom"] ?? 0, phases["againTo"] ?? 0],
      ],
      false,
    ),
    withBatch: window(run.withBatch, [[from, to]], true),
    restart: window(run.withBatch, [[options.excludeFrom, options.excludeTo]], false),
  };
  const row = (name: string, w: typeof summary.alone) => [
    name,
    String(w.streams),
    String(w.errors),
    fmt(w.ttftP50, 1),
    fmt(w.ttftP99, 1),
    fmt(w.originTtftP99, 1),
    `${fmt(w.edgeCpu * 100, 0)}%`,
    `${fmt(w.slotsBusy * 100, 1)}%`,
    `${fmt(w.fillableBusy * 100, 1)}%`,
  ];
  return {
    summary,
    rows: [
      row("interactive alone (before and after)", summary.alone),
      row("with the batch (restart excluded)", summary.withBatch),
      row("edge restart (kill − 2 s to back + 5 s)", summary.restart),
    ],
  };
}

/** One target: what was measured against its goal. */
export interface BatchApiTarget {
  target: string;
  value: number;
  measured: string;
  goal: string;
  met: boolean;
}

/** The benchmark's targets. */
export function batchApiTargets(
  run: BatchApiRun,
  windows: ReturnType<typeof windowRows>,
): BatchApiTarget[] {
  const { alone, withBatch } = windows.summary;
  const a = run.audit;
  const ratio = withBatch.ttftP99 / alone.ttftP99;
  const billedOnce =
    a.ledgerRows === a.lines && a.ledgerDistinct === a.lines && a.usageRequests === a.lines;
  const lost = a.missing + (a.notEndedOnOrigins ?? a.lines);
  const { okRuns, rerunTokens, preemptions } = run.background;
  const generated = a.outputCompletionTokens + rerunTokens;
  const rerunShare = generated === 0 ? 0 : rerunTokens / generated;
  return [
    {
      target: "interactive TTFT p99 with the batch / alone",
      value: ratio,
      measured: `${fmt(ratio, 3)} (${fmt(withBatch.ttftP99, 1)} / ${fmt(alone.ttftP99, 1)} ms)`,
      goal: "<= 1.10",
      met: ratio <= 1.1,
    },
    {
      target: "origins busy while the batch has work (batch-fillable slots)",
      value: withBatch.fillableBusy,
      measured: `${fmt(withBatch.fillableBusy * 100, 1)}%`,
      goal: ">= 95%",
      met: withBatch.fillableBusy >= 0.95,
    },
    {
      target: "lines answered once (distinct custom ids in the output, all 200)",
      value: a.distinctCustomIds,
      measured: `${a.distinctCustomIds} of ${a.lines} (${a.outputRecords} records, ${a.not200} not 200, ${a.errorRecords} errors)`,
      goal: `${a.lines}`,
      met:
        a.status === "completed" &&
        a.distinctCustomIds === a.lines &&
        a.outputRecords === a.lines &&
        a.not200 === 0 &&
        a.errorRecords === 0,
    },
    {
      target: "output ordered by custom_id",
      value: a.orderedByCustomId ? 1 : 0,
      measured: a.orderedByCustomId ? "yes" : "no",
      goal: "yes",
      met: a.orderedByCustomId,
    },
    {
      target: "lines billed once (ledger rows, distinct, usage requests)",
      value: a.ledgerRows,
      measured: `${a.ledgerRows}, ${a.ledgerDistinct}, ${a.usageRequests}; tokens ${a.ledgerCompletionTokens} billed / ${a.outputCompletionTokens} answered`,
      goal: `${a.lines} each, tokens equal`,
      met: billedOnce && a.ledgerCompletionTokens === a.outputCompletionTokens,
    },
    {
      target: "lines lost across the edge restart",
      value: lost,
      measured: `${a.missing} missing from the output, ${a.notEndedOnOrigins ?? "?"} not ended ok on an origin${a.pastOriginMemory ? ` (${a.pastOriginMemory} more past the origins' memory of ${OUTCOME_RETENTION_MS / 60_000} minutes: not checkable there)` : ""}`,
      goal: "0",
      met: lost === 0,
    },
    {
      target: "lines run to the end twice on the origins",
      value: okRuns - a.lines,
      measured: `${okRuns} ok runs for ${a.lines} lines`,
      goal: "0",
      met: okRuns === a.lines,
    },
    {
      target: "rerun tokens: generated by preempted lines, of all the batch generated",
      value: rerunShare,
      measured:
        `${(rerunShare * 100).toFixed(2)}% (${rerunTokens} of ${generated} tokens; ` +
        `${preemptions} preemptions)`,
      goal: `<= ${RERUN_TOKENS_GOAL * 100}%`,
      met: rerunShare <= RERUN_TOKENS_GOAL,
    },
  ];
}

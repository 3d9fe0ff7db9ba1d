/**
 * A model of `npm run bench:routing` in simulated time (docs/benchmarks.md, "Routing"): the
 * same workloads, arrivals and policies, the router fed load reports and block events as
 * the Batcher is, on engines modelled in-process (chunked prefill, a prefix cache of edge
 * blocks with LRU eviction, the simulated engine's step costs). Runs a cell in well under a
 * second, for tuning placement and for tests; the bench's processes give the figures.
 */
import { promptBlocks } from "../contracts/prefix-blocks.ts";
import { RoutingSchema, type RoutingSection } from "../contracts/config/routing.ts";
import {
  type PlacementReason,
  rendezvousOrder,
} from "../durable-objects/batcher/routing/placement.ts";
import { type RouteRequest, Router, coldKey } from "../durable-objects/batcher/routing/router.ts";
import { DEFAULT_SIM_TIMING } from "../origin/sim/timing.ts";
import { percentile } from "./lib.ts";
import { MODEL, type Message, type Workload, fraction, text } from "./routing-workloads.ts";
import type { PolicyName } from "./routing-cell.ts";

/** What one modelled cell runs. */
export interface ModelOptions {
  workload: Workload;
  policy: PolicyName;
  origins: number;
  /** Sessions started per second. */
  rate: number;
  routing?: RoutingSection;
  /** Each engine's KV cache, in 16-token blocks (the bench's: 8,192). */
  kvBlocks?: number;
}

/** What a modelled cell measured; times in engine ms. */
export interface ModelResult {
  hitRate: number;
  /** The hit rate of an unbounded cache every request reaches, in the same blocks. */
  ceiling: number;
  ttftP50: number;
  ttftP90: number;
  /** Most requests, and most completion tokens, one origin served over the mean. */
  imbalance: number;
  decodeImbalance: number;
  /** The busiest origin's share of the streams in flight, the mean over request starts. */
  busiestShare: number;
  /** The same share were the streams split as evenly as they go. */
  evenShare: number;
  /** The busiest origin's share of all streams in flight at request starts, summed. */
  streamShare: number;
  perOrigin: number[];
  /** Each origin's engine time spent in steps, ms: its load as the engine sees it. */
  busyMs: number[];
  /** The router's placements by reason (warmgate only). */
  placements: Record<PlacementReason, number> | null;
}

const BLOCK = 16;
const MAX_NUM_SEQS = 64;
const BUDGET = 2_048;
const REPORT_MS = 100;
const T = DEFAULT_SIM_TIMING;

interface Seq {
  id: string;
  blocks: number[];
  /** Blocks of the prompt and answer, as the next turn renders them. */
  answerBlocks: number[];
  prompt: number;
  /** Prompt tokens not in the cache when it arrived: its prefill still to come while it waits. */
  uncached: number;
  computed: number;
  maxTokens: number;
  generated: number;
  arrived: number;
  done: (cached: number) => void;
  cached: number;
}

/** One engine: a waiting queue, running sequences and an LRU cache of block hashes. */
class Engine {
  readonly waiting: Seq[] = [];
  running: Seq[] = [];
  readonly cache = new Map<number, true>();
  stepMs = 0;
  busyMs = 0;
  busyUntil = -1;
  queries = 0;
  stored: number[] = [];
  removed: number[] = [];

  readonly capacity: number;

  constructor(capacity: number) {
    this.capacity = capacity;
  }

  /** Prompt tokens still to prefill, as the simulated engine reports them. */
  get backlog(): number {
    let tokens = 0;
    for (const s of this.waiting) tokens += s.uncached;
    for (const s of this.running) tokens += Math.max(0, s.prompt - s.computed);
    return tokens;
  }

  /** Leading blocks of `blocks` it holds, the last one left out (an engine computes it). */
  hit(blocks: readonly number[]): number {
    let hit = 0;
    while (hit < blocks.length - 1 && this.cache.has(blocks[hit] ?? -1)) hit++;
    return hit;
  }

  #store(blocks: readonly number[]): void {
    for (const b of blocks) {
      if (!this.cache.delete(b)) this.stored.push(b);
      this.cache.set(b, true);
    }
    while (this.cache.size > this.capacity) {
      const oldest = this.cache.keys().next().value as number;
      this.cache.delete(oldest);
      this.removed.push(oldest);
    }
  }

  /** Plans one step at `now`; returns its end, or null with nothing to do. */
  step(now: number, firstToken: (s: Seq, at: number) => void): number | null {
    let budget = BUDGET;
    const planned = new Map<Seq, number>();
    for (const s of this.running) {
      if (budget <= 0) break;
      const n = s.computed < s.prompt ? Math.min(s.prompt - s.computed, budget) : 1;
      planned.set(s, n);
      budget -= n;
    }
    while (budget > 0 && this.running.length < MAX_NUM_SEQS && this.waiting.length > 0) {
      const s = this.waiting.shift() as Seq;
      const hit = this.hit(s.blocks);
      this.#store(s.blocks.slice(0, hit));
      this.queries += s.prompt;
      s.cached = hit * BLOCK;
      s.computed = s.cached;
      this.running.push(s);
      const n = Math.min(s.prompt - s.computed, budget);
      planned.set(s, n);
      budget -= n;
    }
    if (planned.size === 0) return null;
    let prefill = 0;
    let decodes = 0;
    let context = 0;
    for (const [s, n] of planned) {
      if (s.computed >= s.prompt) decodes++;
      else prefill += n;
      context += s.computed + s.generated + n;
    }
    const ms = T.stepBaseMs + T.prefillMsPerToken * prefill + T.decodeMsPerSeq * decodes;
    const end = now + ms + (T.kvReadMsPerKTokens * context) / 1000;
    this.busyMs += end - now;
    this.stepMs += 0.2 * (end - now - this.stepMs);
    for (const [s, n] of planned) {
      if (s.computed < s.prompt) {
        s.computed += n;
        this.#store(s.blocks.slice(0, Math.floor(s.computed / BLOCK)));
        if (s.computed >= s.prompt) {
          s.generated = 1;
          firstToken(s, end);
        }
      } else s.generated++;
    }
    const finished = this.running.filter((s) => s.generated >= s.maxTokens);
    this.running = this.running.filter((s) => s.generated < s.maxTokens);
    for (const s of finished) {
      this.#store(s.answerBlocks);
      s.done(s.cached);
    }
    return end;
  }
}

/** One origin of a modelled cell: its engine, what it carries and its last report. */
interface Origin {
  id: string;
  engine: Engine;
  inFlight: number;
  served: number;
  generated: number;
  report: { backlog: number; stepMs: number; at: number };
}

/** Runs one cell in simulated time. */
export function runModel(options: ModelOptions): ModelResult {
  const origins: Origin[] = Array.from({ length: options.origins }, (_, i) => ({
    id: `o${i}`,
    engine: new Engine(options.kvBlocks ?? 8_192),
    inFlight: 0,
    served: 0,
    generated: 0,
    report: { backlog: 0, stepMs: 0, at: 0 },
  }));
  const ids = origins.map((o) => o.id);
  const { settings } = RoutingSchema.parse(options.routing ?? {});
  const router = new Router(ids, settings);
  const busiest: { most: number; total: number }[] = [];
  const ttfts: number[] = [];
  const seen = new Set<number>();
  let ceilingCached = 0;
  let promptTokens = 0;
  let cachedTokens = 0;
  let turn = 0;
  let seq = 0;
  let now = 0;
  // Pending work, in time order (ties in the order they were added).
  const agenda: { at: number; run: () => void }[] = [];
  const at = (time: number, run: () => void) => {
    let lo = 0;
    let hi = agenda.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((agenda[mid]?.at ?? 0) <= time) lo = mid + 1;
      else hi = mid;
    }
    agenda.splice(lo, 0, { at: time, run });
  };

  // A load report with the block events since the last, as an origin's LOAD frames bring.
  const report = (o: Origin, index: number) => {
    const e = o.engine;
    o.report = { backlog: e.backlog, stepMs: e.stepMs, at: now };
    router.report(o.id, { kvTotalTokens: e.capacity * BLOCK, prefixQueries: e.queries, at: now });
    const events = { log: `l${index}`, seq: now + 1, cleared: false };
    router.events(o.id, { ...events, stored: e.stored, removed: e.removed });
    e.stored = [];
    e.removed = [];
  };
  const candidates = () =>
    origins.map((o) => ({
      id: o.id,
      load: o.inFlight,
      maxNumSeqs: MAX_NUM_SEQS,
      stepMs: o.report.stepMs,
      prefillTokensPerMs: 1 / T.prefillMsPerToken,
      backlogTokens: router.backlogTokens(o.id, { tokens: o.report.backlog, at: o.report.at }),
      kvRoomTokens: null,
    }));
  const nth = (i: number): Origin => {
    const o = origins[i % origins.length];
    if (o === undefined) throw new Error(`no origin ${i}`);
    return o;
  };
  const choose = (request: RouteRequest): Origin => {
    switch (options.policy) {
      case "round-robin":
        return nth(turn++);
      case "least-loaded": {
        const start = turn++;
        let best = nth(start);
        for (let k = 0; k < origins.length; k++) {
          if (nth(start + k).inFlight < best.inFlight) best = nth(start + k);
        }
        return best;
      }
      case "prefix-hash":
        return nth(rendezvousOrder(origins, coldKey({ ...request, session: null }))[0] ?? 0);
      default:
        return nth(ids.indexOf(router.place(request, candidates(), now).origin));
    }
  };
  const wake = (o: Origin) => {
    const e = o.engine;
    if (e.busyUntil > now) return;
    const end = e.step(now, (s, when) => {
      ttfts.push(when - s.arrived);
      router.started(s.id);
    });
    if (end === null) return;
    e.busyUntil = end;
    at(end, () => wake(o));
  };

  const send = (
    messages: Message[],
    maxTokens: number,
    user: string | null,
    resolve: (history: Message[]) => void,
  ) => {
    const id = `r${seq++}`;
    const blocks = promptBlocks(MODEL, { messages });
    const answer = text(maxTokens, seq);
    const next = [...messages, { role: "assistant", content: answer }];
    const answerBlocks = promptBlocks(MODEL, { messages: next });
    const request = {
      id,
      blocks,
      promptTokens: blocks.length * BLOCK,
      session: user,
      pinned: null,
    };
    // The ceiling: leading blocks seen before, in a prompt or an answer.
    let hits = true;
    for (const [k, b] of blocks.entries()) {
      if (hits && k < blocks.length - 1 && seen.has(b)) ceilingCached += BLOCK;
      else hits = false;
    }
    for (const b of answerBlocks) seen.add(b);
    const o = choose(request);
    o.inFlight += 1;
    o.served += 1;
    const loads = origins.map((x) => x.inFlight);
    busiest.push({ most: Math.max(...loads), total: loads.reduce((a, b) => a + b, 0) });
    const prompt = Math.max(BLOCK, blocks.length * BLOCK);
    o.engine.waiting.push({
      id,
      blocks,
      answerBlocks,
      prompt,
      uncached: prompt - o.engine.hit(blocks) * BLOCK,
      computed: 0,
      maxTokens,
      generated: 0,
      arrived: now,
      cached: 0,
      done: (cached) => {
        o.inFlight -= 1;
        o.generated += maxTokens;
        promptTokens += prompt;
        cachedTokens += cached;
        router.ended(id, { prompt_tokens: prompt, cached_tokens: cached });
        // The client's next turn leaves a moment after the answer.
        at(now + 1, () => resolve(next));
      },
    });
    wake(o);
  };

  // Poisson arrivals as the bench's (the same fixed sequence).
  let arrival = 0;
  for (const [k, session] of options.workload.sessions.entries()) {
    arrival += (-Math.log(1 - fraction(k)) / options.rate) * 1000;
    const next = (t: number, history: Message[]) => {
      if (t < session.turns)
        send(session.turn(t, history), session.maxTokens, session.user, (h) => next(t + 1, h));
    };
    at(arrival, () => next(0, []));
  }
  for (let t = REPORT_MS; ; t += REPORT_MS) {
    // Run everything due before the next report.
    for (;;) {
      const next = agenda[0];
      if (next === undefined || next.at > t) break;
      agenda.shift();
      now = next.at;
      next.run();
    }
    now = t;
    for (const [index, o] of origins.entries()) report(o, index);
    if (agenda.length === 0 && origins.every((o) => o.inFlight === 0)) break;
    if (t > 3_600_000) throw new Error("the model did not finish within an hour of engine time");
  }
  const sorted = [...ttfts].sort((a, b) => a - b);
  const served = origins.map((o) => o.served);
  const generated = origins.map((o) => o.generated);
  return {
    hitRate: cachedTokens / promptTokens,
    ceiling: ceilingCached / promptTokens,
    ttftP50: percentile(sorted, 50),
    ttftP90: percentile(sorted, 90),
    imbalance: Math.max(...served) / mean(served),
    decodeImbalance: Math.max(...generated) / mean(generated),
    busiestShare: mean(busiest.map((b) => b.most / b.total)),
    evenShare: mean(busiest.map((b) => Math.ceil(b.total / origins.length) / b.total)),
    streamShare: busiest.reduce((n, b) => n + b.most, 0) / busiest.reduce((n, b) => n + b.total, 0),
    perOrigin: served,
    busyMs: origins.map((o) => o.engine.busyMs),
    placements: options.policy === "warmgate" ? router.view().placements : null,
  };
}

function mean(xs: readonly number[]): number {
  return xs.reduce((a, b) => a + b, 0) / xs.length;
}

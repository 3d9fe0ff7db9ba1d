/**
 * The phases of `npm run bench:burst` (docs/benchmarks.md, "Burst"): bursts of concurrent
 * streams, each followed by single requests, on healthy origins or with one frozen; poison
 * requests among ordinary traffic; and a restart of the edge while a breaker cools down.
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { BreakerView } from "../contracts/breaker.ts";
import type { RunningStack, SpawnedOrigin } from "../scripts/stack.ts";
import {
  type Openings,
  type Transition,
  awaitClosed,
  forceBreaker,
  openingsOf,
  readBreakers,
  watchBreakers,
} from "./burst-breakers.ts";
import { type Outcome, chatBody, poisonBody, sendChat } from "./burst-client.ts";
import { setOriginFaults } from "./lib.ts";

/** What every phase needs: the stack, the key and the run's settings. */
export interface BurstContext {
  stack: RunningStack;
  key: string;
  /** Seconds of single requests after each burst. */
  seriesSeconds: number;
  requestTimeoutMs: number;
  /** Longest wait for every breaker to close before a phase begins. */
  closeWaitMs: number;
  /** Longest freeze of an origin in a burst (it thaws earlier when the burst ends). */
  freezeMaxMs: number;
  log: (line: string) => void;
}

/** Half the requests go to each region, as two regions' callers would send them. */
const regionOf = (i: number) => (i % 2 === 0 ? "eu" : "us");
/** Pause between the single requests of a series. */
const SINGLE_GAP_MS = 100;
/** Depth of a poison request's JSON schema. */
export const POISON_DEPTH = 100_000;

let sequence = 0;

/** Sends one ordinary streamed request, to the next region in turn (or to `headers`'). */
export function send(ctx: BurstContext, headers?: Record<string, string>): Promise<Outcome> {
  const i = sequence++;
  return sendChat({
    edgeUrl: ctx.stack.edgeUrl,
    key: ctx.key,
    body: chatBody(i),
    headers: headers ?? { "x-warmgate-region": regionOf(i) },
    timeoutMs: ctx.requestTimeoutMs,
  });
}

/** Single requests one after another: `count` of them, or for `seconds`. */
export async function singles(ctx: BurstContext, limit: { count?: number; seconds?: number }) {
  const out: Outcome[] = [];
  const until = Date.now() + (limit.seconds ?? Number.POSITIVE_INFINITY) * 1_000;
  while (out.length < (limit.count ?? Number.POSITIVE_INFINITY) && Date.now() < until) {
    out.push(await send(ctx));
    await sleep(SINGLE_GAP_MS);
  }
  return out;
}

/** The breakers over one phase: readings before and after, changes seen between, openings. */
export interface BreakerRecord {
  before: BreakerView[] | null;
  after: BreakerView[] | null;
  transitions: Transition[];
  openings: Openings;
  /** Breakers still not closed when the phase was to begin (then forced closed). */
  notClosedAtStart: string[];
  polls: number;
  failedPolls: number;
}

// Waits for every breaker to close (forcing those that did not), then runs `body` while
// the breakers are polled.
async function watched<T>(
  ctx: BurstContext,
  body: () => Promise<T>,
): Promise<{ result: T; breakers: BreakerRecord }> {
  const { edgeUrl, adminToken } = ctx.stack;
  const notClosedAtStart = await awaitClosed(edgeUrl, adminToken, ctx.closeWaitMs);
  for (const origin of notClosedAtStart) {
    if (origin.startsWith("(")) continue;
    ctx.log(`burst: ${origin}'s breaker was not closed after ${ctx.closeWaitMs} ms; forcing it`);
    await forceBreaker(edgeUrl, adminToken, origin, "closed");
  }
  const before = await readBreakers(edgeUrl, adminToken);
  const watch = watchBreakers(edgeUrl, adminToken);
  if (before !== null) watch.seed(before);
  let result: T;
  let polled: Awaited<ReturnType<typeof watch.stop>>;
  try {
    result = await body();
  } finally {
    polled = await watch.stop();
  }
  const after = await readBreakers(edgeUrl, adminToken);
  const { transitions, polls, failedPolls } = polled;
  return {
    result,
    breakers: {
      before,
      after,
      transitions,
      openings: openingsOf(before, after, transitions),
      notClosedAtStart,
      polls,
      failedPolls,
    },
  };
}

/** One burst and the single requests after it. */
export interface BurstRun {
  /** Healthy origins, one of them frozen, or healthy origins at their connection cap. */
  phase: "healthy" | "frozen" | "capped";
  size: number;
  burst: Outcome[];
  burstSeconds: number;
  /** The frozen origin, and for how long it was frozen (ms). */
  frozen: { origin: string; ms: number } | null;
  after: Outcome[];
  breakers: BreakerRecord;
}

/** Sends `size` streams at once, with `freeze` stopped (SIGSTOP) while they run, then singles. */
export async function burst(
  ctx: BurstContext,
  size: number,
  freeze: SpawnedOrigin | null,
  capped = false,
): Promise<BurstRun> {
  ctx.log(`burst: ${size} streams${freeze ? `, ${freeze.originId} frozen` : ""}`);
  const { result, breakers } = await watched(ctx, async () => {
    let thawedAt: number | null = null;
    const frozenAt = Date.now();
    const thaw = () => {
      if (freeze === null || thawedAt !== null) return;
      freeze.child.kill("SIGCONT");
      thawedAt = Date.now();
    };
    freeze?.child.kill("SIGSTOP");
    const timer = setTimeout(thaw, ctx.freezeMaxMs);
    const started = performance.now();
    let outcomes: Outcome[];
    try {
      outcomes = await Promise.all(Array.from({ length: size }, () => send(ctx)));
    } finally {
      clearTimeout(timer);
      thaw();
    }
    const burstSeconds = (performance.now() - started) / 1_000;
    const after = await singles(ctx, { seconds: ctx.seriesSeconds });
    const frozen =
      freeze === null ? null : { origin: freeze.originId, ms: (thawedAt ?? frozenAt) - frozenAt };
    return { outcomes, burstSeconds, after, frozen };
  });
  return {
    phase: freeze !== null ? "frozen" : capped ? "capped" : "healthy",
    size,
    burst: result.outcomes,
    burstSeconds: result.burstSeconds,
    frozen: result.frozen,
    after: result.after,
    breakers,
  };
}

/** Poison requests among ordinary traffic. */
export interface PoisonRun {
  poison: Outcome[];
  ordinary: Outcome[];
  breakers: BreakerRecord;
}

/** `count` poison requests spread over `seconds` of ordinary traffic from `clients`. */
export async function poison(
  ctx: BurstContext,
  options: { count: number; seconds: number; clients: number },
): Promise<PoisonRun> {
  ctx.log(`burst: ${options.count} poison requests among ${options.clients} clients' traffic`);
  const body = poisonBody(POISON_DEPTH);
  const { result, breakers } = await watched(ctx, async () => {
    const ordinary: Outcome[] = [];
    const until = Date.now() + options.seconds * 1_000;
    const client = async () => {
      while (Date.now() < until) ordinary.push(await send(ctx));
    };
    const poisoner = async () => {
      const out: Outcome[] = [];
      const gapMs = (options.seconds * 1_000) / (options.count + 1);
      for (let i = 0; i < options.count; i++) {
        await sleep(gapMs);
        const headers = { "x-warmgate-region": regionOf(i) };
        const edge = { edgeUrl: ctx.stack.edgeUrl, key: ctx.key, timeoutMs: ctx.requestTimeoutMs };
        out.push(await sendChat({ ...edge, body, headers }));
      }
      return out;
    };
    const [poisoned] = await Promise.all([
      poisoner(),
      ...Array.from({ length: options.clients }, client),
    ]);
    return { poison: poisoned, ordinary };
  });
  return { ...result, breakers };
}

/** How an origin's breaker came back after a restart of the edge during its cooldown. */
export interface RestartRun {
  origin: string;
  /** Requests it took to trip the breaker (origin answering 500s). */
  tripRequests: number;
  /** The breaker as seen open: `since` and `retry_at` (epoch ms), cooldown = their gap. */
  openedAt: number | null;
  retryAt: number | null;
  cooldownMs: number | null;
  /** When the edge was killed and when it answered again (epoch ms). */
  restartBegan: number | null;
  restartEnded: number | null;
  /** States seen after the restart, with when (ms after the opening). */
  states: { atMs: number; state: string }[];
  /** Single requests after the restart: when (ms after the opening), who served them, how. */
  requests: { atMs: number; origin: string | null; kind: string }[];
  /** Opening to the sending of the first request that origin served whole; null if none. */
  fullServiceMs: number | null;
  note: string | null;
}

/**
 * Trips `origin`'s breaker (the origin answers 500s), heals the origin, restarts the edge
 * (killed, then started on its persisted state) while the breaker cools down, and sends
 * single requests pinned to the origin until it serves one whole or `deadlineMs` passes.
 */
export async function restart(
  ctx: BurstContext,
  target: SpawnedOrigin,
  deadlineMs: number,
): Promise<RestartRun> {
  const { stack } = ctx;
  const origin = target.originId;
  const run: RestartRun = {
    origin,
    tripRequests: 0,
    openedAt: null,
    retryAt: null,
    cooldownMs: null,
    restartBegan: null,
    restartEnded: null,
    states: [],
    requests: [],
    fullServiceMs: null,
    note: null,
  };
  await awaitClosed(stack.edgeUrl, stack.adminToken, ctx.closeWaitMs);
  // Forced closed, its earlier openings are forgotten: the cooldown is the configured one.
  await forceBreaker(stack.edgeUrl, stack.adminToken, origin, "closed");
  const pinned = { "x-warmgate-region": "eu", "x-warmgate-origin": origin };
  const faults = (body: unknown) => setOriginFaults(target.url, stack.originAdminToken, body);
  ctx.log(`burst: tripping ${origin}'s breaker`);
  await faults({ errorRate: 1, errorStatuses: [500] });
  let open: BreakerView | undefined;
  const tripUntil = Date.now() + 30_000;
  try {
    while (open === undefined && Date.now() < tripUntil) {
      // A round at once: a failed origin is quarantined, and later requests step around it.
      await Promise.all(Array.from({ length: 8 }, () => send(ctx, pinned)));
      run.tripRequests += 8;
      const views = await readBreakers(stack.edgeUrl, stack.adminToken);
      open = views?.find((v) => v.origin === origin && v.state === "open");
    }
  } finally {
    await faults(null);
  }
  if (open === undefined) {
    run.note = `the breaker did not open after ${run.tripRequests} requests answered 500`;
    return run;
  }
  const openedAt = open.since;
  run.openedAt = openedAt;
  run.retryAt = open.retry_at;
  run.cooldownMs = open.retry_at === null ? null : open.retry_at - open.since;
  ctx.log(`burst: ${origin} open (cooldown ${run.cooldownMs} ms); restarting the edge`);
  run.restartBegan = Date.now();
  await stack.restartEdge({ crash: true });
  run.restartEnded = Date.now();
  if (run.retryAt !== null && run.restartEnded >= run.retryAt) {
    run.note = "the edge came back after the cooldown had ended: not a restart mid-cooldown";
  }
  const deadline = openedAt + deadlineMs;
  const polling = { on: true };
  const poller = (async () => {
    while (polling.on && Date.now() < deadline) {
      const views = await readBreakers(stack.edgeUrl, stack.adminToken);
      const state = views?.find((v) => v.origin === origin)?.state ?? "(no answer)";
      if (run.states.at(-1)?.state !== state) {
        run.states.push({ atMs: Date.now() - openedAt, state });
      }
      await sleep(100);
    }
  })();
  // Single requests one after another: the first that this origin serves whole, from when
  // it was sent, is when full service came back.
  while (Date.now() < deadline) {
    const outcome = await send(ctx, pinned);
    const atMs = outcome.sentAt - openedAt;
    run.requests.push({ atMs, origin: outcome.origin, kind: outcome.kind });
    if (outcome.kind === "whole" && outcome.origin === origin) {
      run.fullServiceMs = atMs;
      break;
    }
    await sleep(20);
  }
  polling.on = false;
  await poller;
  return run;
}

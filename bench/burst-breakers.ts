/**
 * The breakers as `npm run bench:burst` watches them (docs/benchmarks.md, "Burst"):
 * `GET /admin/breakers` read before and after a phase and polled during it, and the
 * openings counted from both.
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { BreakerView } from "../contracts/breaker.ts";

/** A change of one breaker's state seen by polling, epoch ms. */
export interface Transition {
  at: number;
  origin: string;
  from: string;
  to: string;
}

/** Reads every breaker; null when the edge did not answer. */
export async function readBreakers(
  edgeUrl: string,
  adminToken: string,
): Promise<BreakerView[] | null> {
  try {
    const res = await fetch(`${edgeUrl}/admin/breakers`, {
      headers: { authorization: `Bearer ${adminToken}` },
      signal: AbortSignal.timeout(10_000),
    });
    if (res.status !== 200) {
      await res.arrayBuffer();
      return null;
    }
    return ((await res.json()) as { data: BreakerView[] }).data;
  } catch {
    return null;
  }
}

/** Polls the breakers every `intervalMs` until stopped, noting each change of state. */
export function watchBreakers(edgeUrl: string, adminToken: string, intervalMs = 250) {
  const transitions: Transition[] = [];
  const last = new Map<string, string>();
  let polls = 0;
  let failedPolls = 0;
  const run = { on: true };
  const note = (views: readonly BreakerView[], at: number) => {
    for (const view of views) {
      const from = last.get(view.origin);
      if (from !== undefined && from !== view.state) {
        transitions.push({ at, origin: view.origin, from, to: view.state });
      }
      last.set(view.origin, view.state);
    }
  };
  const loop = (async () => {
    while (run.on) {
      const views = await readBreakers(edgeUrl, adminToken);
      polls += 1;
      if (views === null) failedPolls += 1;
      else note(views, Date.now());
      await sleep(intervalMs);
    }
  })();
  return {
    /** Seeds the last-seen states (a phase's "before" reading). */
    seed: (views: readonly BreakerView[]) => note(views, Date.now()),
    async stop(): Promise<{ transitions: Transition[]; polls: number; failedPolls: number }> {
      run.on = false;
      await loop;
      return { transitions, polls, failedPolls };
    },
  };
}

/** Per origin, how often its breaker opened over a phase, and which opened at all. */
export interface Openings {
  /** `opened_count` after minus before, per origin. */
  countDelta: Record<string, number>;
  /** Changes to `open` seen while polling, per origin. */
  seenOpening: Record<string, number>;
  /** Origins that opened by either measure. */
  opened: string[];
  /** The larger of the two measures, summed over origins. */
  total: number;
}

/** Openings between two readings, with the transitions polled in between. */
export function openingsOf(
  before: readonly BreakerView[] | null,
  after: readonly BreakerView[] | null,
  transitions: readonly Transition[],
): Openings {
  const countDelta: Record<string, number> = {};
  const seenOpening: Record<string, number> = {};
  const origins = new Set([...(before ?? []), ...(after ?? [])].map((v) => v.origin));
  for (const origin of origins) {
    const was = before?.find((v) => v.origin === origin);
    const now = after?.find((v) => v.origin === origin);
    // A breaker left open (or forgotten, which resets the count) still opened once.
    const delta = (now?.opened_count ?? 0) - (was?.opened_count ?? 0);
    countDelta[origin] = Math.max(delta, was?.state === "closed" && now?.state === "open" ? 1 : 0);
    seenOpening[origin] = transitions.filter((t) => t.origin === origin && t.to === "open").length;
  }
  const opened = [...origins].filter((o) => (countDelta[o] ?? 0) > 0 || (seenOpening[o] ?? 0) > 0);
  const total = [...origins].reduce(
    (n, o) => n + Math.max(countDelta[o] ?? 0, seenOpening[o] ?? 0),
    0,
  );
  return { countDelta, seenOpening, opened, total };
}

/**
 * Waits until every breaker is closed (at most `timeoutMs`); answers the ones still not
 * closed then, which a phase records before it forces them closed.
 */
export async function awaitClosed(
  edgeUrl: string,
  adminToken: string,
  timeoutMs: number,
): Promise<string[]> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const views = await readBreakers(edgeUrl, adminToken);
    const shut = (views ?? []).filter((v) => v.state !== "closed").map((v) => v.origin);
    if (views !== null && shut.length === 0) return [];
    if (Date.now() >= deadline) return views === null ? ["(the edge did not answer)"] : shut;
    await sleep(250);
  }
}

/** Forces a breaker open or closed through the admin API. */
export async function forceBreaker(
  edgeUrl: string,
  adminToken: string,
  origin: string,
  state: "open" | "closed",
): Promise<void> {
  const res = await fetch(`${edgeUrl}/admin/breakers/${origin}`, {
    method: "POST",
    headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
    body: JSON.stringify({ state }),
  });
  await res.arrayBuffer();
  if (res.status !== 200) throw new Error(`forcing ${origin} ${state}: ${res.status}`);
}

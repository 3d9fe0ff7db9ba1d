/**
 * Canary rollouts at the edge (docs/failover.md, "Canaries"): each request of a model with
 * a canary goes to the canary pool or to the baseline, by the canary's current weight; how
 * each arm's attempts went is sent to the model's `Canaries` object in bulk, whose answer
 * brings the canary's state back (a rollback reaches every isolate within a second).
 */
import {
  type ArmReport,
  type CanaryArm,
  type CanaryView,
  canaryName,
} from "../../contracts/canary.ts";
import type { CanarySpec } from "../../contracts/config/canaries.ts";
import { sleep } from "../../contracts/sleep.ts";
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import type { Canaries } from "../../durable-objects/canaries/index.ts";
import type { RequestAttempt } from "../../durable-objects/key-account/types.ts";
import type { RegionOrigin } from "../delivery/origin-pool.ts";
import type { SettledRequest } from "../accounts/settlement.ts";

const REFRESH_MS = 1_000;
const FLUSH_MS = 250;
// A scheduled flush waits out an exchange under way this many times at most.
const FLUSH_TRIES = 8;
const MAX_TTFT_SAMPLES = 500;

/** How one request takes part in its model's canary. */
export interface CanaryPlan {
  spec: CanarySpec;
  arm: CanaryArm;
  pool: ReadonlySet<string>;
}

interface Copy {
  view: CanaryView | null;
  syncedAt: number;
  pending: Record<CanaryArm, ArmReport>;
  sending: boolean;
  /** A flush of what is pending is scheduled (the last outcomes of a quiet spell). */
  flushing: boolean;
}

/**
 * One isolate's copies of its models' canaries: each canary's last known state and the
 * outcomes not sent yet, exchanged with the model's `Canaries` object in bulk.
 */
export class CanaryCopies {
  readonly #namespace: DurableObjectNamespace<Canaries>;
  readonly #copies = new Map<string, Copy>();

  constructor(namespace: DurableObjectNamespace<Canaries>) {
    this.#namespace = namespace;
  }

  /** This request's arm of its model's canary, or null when the model has none. */
  plan(config: ResolvedConfig, model: string, random = Math.random()): CanaryPlan | null {
    const spec = config.canaries.get(model);
    if (spec === undefined) return null;
    const weight = this.#copyOf(spec).view?.weight ?? spec.weight;
    return {
      spec,
      arm: random < weight ? "canary" : "baseline",
      pool: new Set(spec.origins),
    };
  }

  /** Counts how the request's attempts went in their arms; the work to wait for, if any. */
  record(
    plan: CanaryPlan,
    settled: SettledRequest,
    attempts: readonly RequestAttempt[],
    now: number,
  ): Promise<void> | null {
    const copy = this.#copyOf(plan.spec);
    for (const attempt of attempts) {
      // A refusal for overload says nothing of a build's health (busy is not sick).
      if (attempt.origin === null || attempt.result === "busy") continue;
      const arm = copy.pending[plan.pool.has(attempt.origin) ? "canary" : "baseline"];
      arm.requests += 1;
      const good =
        attempt.result === "served" && settled.outcome !== "error" && settled.status < 500;
      if (!good) arm.errors += 1;
      const ttftMs = settled.ttftMs ?? null;
      if (good && ttftMs !== null && arm.ttftMs.length < MAX_TTFT_SAMPLES) arm.ttftMs.push(ttftMs);
    }
    return this.sync(plan.spec, now) ?? this.#flushLater(plan.spec);
  }

  // Sends what is pending once it is due even if no request comes to send it; null when a
  // flush is already scheduled.
  #flushLater(spec: CanarySpec): Promise<void> | null {
    const copy = this.#copyOf(spec);
    if (copy.flushing) return null;
    copy.flushing = true;
    const flush = async () => {
      for (let tries = 0; tries < FLUSH_TRIES && hasPending(copy); tries++) {
        const due = Math.max(0, copy.syncedAt + FLUSH_MS - Date.now());
        await sleep(due);
        await this.sync(spec, Date.now());
      }
    };
    return flush().finally(() => {
      copy.flushing = false;
    });
  }

  /** Sends what is pending and takes the canary's state back, when due. */
  sync(spec: CanarySpec, now: number): Promise<void> | null {
    const copy = this.#copyOf(spec);
    const age = now - copy.syncedAt;
    if (copy.sending || !(age >= REFRESH_MS || (hasPending(copy) && age >= FLUSH_MS))) return null;
    const reports = copy.pending;
    copy.pending = emptyReports();
    copy.syncedAt = now;
    copy.sending = true;
    return this.#namespace
      .getByName(canaryName(spec))
      .report(spec, reports, copy.view?.since ?? null)
      .then((view) => {
        copy.view = view;
      })
      .catch(() => {
        // The outcomes of one exchange are lost; the comparison goes on without them.
      })
      .finally(() => {
        copy.sending = false;
      });
  }

  #copyOf(spec: CanarySpec): Copy {
    const name = canaryName(spec);
    let copy = this.#copies.get(name);
    if (copy === undefined) {
      copy = {
        view: null,
        syncedAt: Number.NEGATIVE_INFINITY,
        pending: emptyReports(),
        sending: false,
        flushing: false,
      };
      this.#copies.set(name, copy);
    }
    return copy;
  }
}

/**
 * The candidates for the arm: the canary's pool first, the baseline after it to fail over
 * to, except pool origins refused busy (`busy`): an origin at its connection cap tells
 * nothing of its build, so the arm waits out its `retry-after` on the baseline rather than
 * spend a retry on each request; the baseline alone (the pool only when nothing else serves
 * the model).
 */
export function armCandidates(
  plan: CanaryPlan,
  candidates: readonly RegionOrigin[],
  busy: (originId: string) => boolean,
) {
  const inPool = (c: RegionOrigin) => plan.pool.has(c.origin.id);
  if (plan.arm === "baseline") {
    const rest = candidates.filter((c) => !inPool(c));
    return rest.length > 0 ? rest : candidates.filter(inPool);
  }
  const ready = (c: RegionOrigin) => inPool(c) && !busy(c.origin.id);
  return [...candidates.filter(ready), ...candidates.filter((c) => !ready(c))];
}

/** Origins a Batcher must not pick for the arm: the pool for the baseline. */
export function armAvoids(plan: CanaryPlan): string[] {
  return plan.arm === "baseline" ? [...plan.pool] : [];
}

/**
 * Origins the first attempt must not go to: for the canary arm, the other side of the
 * pool's region, so that its Batcher picks what `armCandidates` put first: the pool, or
 * the baseline while the pool is refused busy (later attempts may fail over).
 */
export function armFirstAvoids(plan: CanaryPlan, candidates: readonly RegionOrigin[]): string[] {
  const first = candidates[0];
  if (plan.arm !== "canary" || first === undefined) return [];
  const inPool = plan.pool.has(first.origin.id);
  return first.region.origins.map((o) => o.id).filter((id) => plan.pool.has(id) !== inPool);
}

function hasPending(copy: Copy): boolean {
  return copy.pending.canary.requests + copy.pending.baseline.requests > 0;
}

function emptyReports(): Record<CanaryArm, ArmReport> {
  return {
    canary: { requests: 0, errors: 0, ttftMs: [] },
    baseline: { requests: 0, errors: 0, ttftMs: [] },
  };
}

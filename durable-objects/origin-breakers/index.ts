/**
 * OriginBreakers: the circuit breakers of one region's origins (docs/failover.md,
 * "Breakers"), one object per region so that every edge isolate and every Batcher shard
 * sees the same state. Reporters send outcomes in bulk and get every breaker of the region
 * back; an origin that just failed is checked for being reachable at all (a dead one opens
 * at once); the alarm half-opens breakers whose cooldown ended and probes their origins
 * until they close or open again. The region (origins, settings) and every state change are kept
 * in SQLite, so a restarted object picks its probes up again with no traffic at all.
 */
import { logWarn } from "../../contracts/log.ts";
import { sleep } from "../../contracts/sleep.ts";
import { DurableObject } from "cloudflare:workers";
import type { BreakerRegion } from "../../contracts/breaker.ts";
import { type BreakerSettings, DEFAULT_BREAKER_SETTINGS } from "../../contracts/config/breakers.ts";
import { applyMigrations } from "../migrations.ts";
import {
  type Breaker,
  failedLast,
  failing,
  force,
  newBreaker,
  probed,
  record,
  ejectionRoom,
  tick,
  unreachable,
  viewOf,
} from "./breaker.ts";
import { listening } from "./listening.ts";
import { probeOrigin, reachable } from "./probe.ts";
import {
  type BreakerView,
  type OutcomeReport,
  PROBE_INTERVAL_MS,
  PROBE_TIMEOUT_MS,
  type ProbeTarget,
  REACH_CHECK_GAP_MS,
} from "./types.ts";

const MIGRATIONS: readonly string[] = [
  `CREATE TABLE breakers (
     origin TEXT PRIMARY KEY, state TEXT NOT NULL, since INTEGER NOT NULL,
     opened_count INTEGER NOT NULL, retry_at INTEGER, forced INTEGER NOT NULL);`,
  `CREATE TABLE region (one INTEGER PRIMARY KEY CHECK (one = 1), body TEXT NOT NULL);`,
  // Failures in a row outlive the object: one a minute from a frozen origin still add up.
  `ALTER TABLE breakers ADD COLUMN consecutive INTEGER NOT NULL DEFAULT 0;`,
];

type BreakerRow = {
  origin: string;
  state: string;
  since: number;
  opened_count: number;
  retry_at: number | null;
  forced: number;
  consecutive: number;
};

/** The breakers of one region's origins. */
export class OriginBreakers extends DurableObject<Env> {
  readonly #breakers = new Map<string, Breaker>();
  readonly #targets = new Map<string, ProbeTarget>();
  #settings: BreakerSettings = { ...DEFAULT_BREAKER_SETTINGS };
  #rows = new Map<string, BreakerRow>();
  #regionText = "";
  readonly #reachCheckedAt = new Map<string, number>();
  readonly #reachDeferred = new Set<string>();

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    void ctx.blockConcurrencyWhile(async () => {
      applyMigrations(ctx.storage, MIGRATIONS);
      await this.#restore(Date.now());
    });
  }

  /** Takes in outcomes of the region's origins; answers every breaker of the region. */
  report(region: BreakerRegion, reports: readonly OutcomeReport[]): BreakerView[] {
    const now = Date.now();
    this.#know(region, now);
    for (const report of reports) {
      const before = this.#breakers.get(report.origin);
      if (before === undefined) continue;
      const room = ejectionRoom([...this.#breakers.values()], this.#settings);
      const after = record(before, report, now, this.#settings, room);
      this.#put(before, after, now);
      if (failedLast(after, report)) this.#checkReach(after.origin, now);
    }
    return this.#views(now);
  }

  /** Every breaker of the region. */
  views(region: BreakerRegion): BreakerView[] {
    const now = Date.now();
    this.#know(region, now);
    return this.#views(now);
  }

  /** An operator forces a breaker open or closed; null for an origin the region lacks. */
  force(region: BreakerRegion, origin: string, state: "open" | "closed"): BreakerView | null {
    const now = Date.now();
    this.#know(region, now);
    const before = this.#breakers.get(origin);
    if (before === undefined) return null;
    const after = force(before, state, now);
    this.#put(before, after, now);
    return viewOf(after, now, this.#settings);
  }

  /** Half-opens breakers whose cooldown ended and probes their origins. */
  override async alarm(): Promise<void> {
    this.#tickAll(Date.now());
    const halfOpen = [...this.#breakers.values()].filter((b) => b.state === "half_open");
    await Promise.all(
      halfOpen.map(async (b) => {
        const target = this.#targets.get(b.origin);
        // Without its URL (no reporter has named it since a restart) it waits for one.
        if (target === undefined) return;
        const ok = await probeOrigin(target, this.env, PROBE_TIMEOUT_MS);
        const current = this.#breakers.get(b.origin);
        if (current !== undefined) {
          this.#put(current, probed(current, ok, Date.now(), this.#settings), Date.now());
        }
      }),
    );
    await this.#arm(Date.now());
  }

  // A closed origin just failed: when nothing is there where it should be, its breaker opens
  // now, not after the failures its reporters' quarantines let through one at a time. One
  // check a second per origin; a failure within that second has one check run after it.
  #checkReach(origin: string, now: number): void {
    const wait = (this.#reachCheckedAt.get(origin) ?? -Infinity) + REACH_CHECK_GAP_MS - now;
    if (wait > 0) {
      if (this.#reachDeferred.has(origin)) return;
      this.#reachDeferred.add(origin);
      const later = sleep(wait).then(() => {
        this.#reachDeferred.delete(origin);
        const b = this.#breakers.get(origin);
        if (b !== undefined && failing(b)) this.#checkReach(origin, Date.now());
      });
      this.ctx.waitUntil(later);
      return;
    }
    const target = this.#targets.get(origin);
    if (target === undefined) return;
    this.#reachCheckedAt.set(origin, now);
    const check = reachable(target, PROBE_TIMEOUT_MS, listening)
      .then((ok) => {
        const current = this.#breakers.get(origin);
        if (ok || current === undefined) return;
        const room = ejectionRoom([...this.#breakers.values()], this.#settings);
        this.#put(current, unreachable(current, Date.now(), this.#settings, room), Date.now());
      })
      .catch((error: unknown) => logWarn("reach check failed", { origin, error: String(error) }));
    this.ctx.waitUntil(check);
  }

  // A fresh instance: the region and breakers as they were kept, the alarm set again.
  async #restore(now: number): Promise<void> {
    const sql = this.ctx.storage.sql;
    this.#rows = new Map(
      sql
        .exec<BreakerRow>(
          "SELECT origin, state, since, opened_count, retry_at, forced, consecutive FROM breakers",
        )
        .toArray()
        .map((row) => [row.origin, row]),
    );
    const kept = sql.exec<{ body: string }>("SELECT body FROM region").toArray()[0];
    if (kept !== undefined) this.#know(JSON.parse(kept.body) as BreakerRegion, now);
    await this.#arm(now);
  }

  // The region's origins as the reporter names them (new ones join, from SQLite when they
  // have a row) and its latest settings; open breakers whose cooldown ended half-open now.
  #know(region: BreakerRegion, now: number): void {
    this.#settings = region.settings;
    for (const origin of region.origins) {
      const known = this.#targets.get(origin.id);
      this.#targets.set(origin.id, {
        id: origin.id,
        url: origin.url,
        ...((origin.credentials ?? known?.credentials) !== undefined && {
          credentials: origin.credentials ?? known?.credentials,
        }),
        ...((origin.probeModel ?? known?.probeModel) !== undefined && {
          probeModel: origin.probeModel ?? known?.probeModel,
        }),
      });
      if (this.#breakers.has(origin.id)) continue;
      const row = this.#rows.get(origin.id);
      const fresh = newBreaker(region.id, origin.id, now);
      this.#breakers.set(
        origin.id,
        row === undefined
          ? fresh
          : {
              ...fresh,
              state: row.state === "open" || row.state === "half_open" ? row.state : "closed",
              since: row.since,
              openedCount: row.opened_count,
              retryAt: row.retry_at,
              forced: row.forced === 1,
              consecutive: row.consecutive,
            },
      );
    }
    const text = JSON.stringify({
      id: region.id,
      origins: [...this.#targets.values()],
      settings: this.#settings,
    });
    if (text !== this.#regionText) {
      this.#regionText = text;
      this.ctx.storage.sql.exec(
        "INSERT INTO region (one, body) VALUES (1, ?) ON CONFLICT (one) DO UPDATE SET body = excluded.body",
        text,
      );
    }
    this.#tickAll(now);
  }

  #tickAll(now: number): void {
    for (const b of this.#breakers.values()) this.#put(b, tick(b, now, this.#settings), now);
  }

  #views(now: number): BreakerView[] {
    return [...this.#breakers.values()].map((b) => viewOf(b, now, this.#settings));
  }

  // Keeps a breaker's new state; writes it, and re-arms the alarm, when it changed.
  #put(before: Breaker, after: Breaker, now: number): void {
    this.#breakers.set(after.origin, after);
    const changed =
      before.state !== after.state ||
      before.forced !== after.forced ||
      before.retryAt !== after.retryAt ||
      before.openedCount !== after.openedCount;
    if (!changed && before.consecutive === after.consecutive) return;
    if (before.state !== after.state) {
      logWarn("breaker changed state", {
        region: after.region,
        origin: after.origin,
        from: before.state,
        to: after.state,
      });
    }
    this.ctx.storage.sql.exec(
      `INSERT INTO breakers (origin, state, since, opened_count, retry_at, forced, consecutive)
       VALUES (?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (origin) DO UPDATE SET state = excluded.state, since = excluded.since,
         opened_count = excluded.opened_count, retry_at = excluded.retry_at,
         forced = excluded.forced, consecutive = excluded.consecutive`,
      after.origin,
      after.state,
      after.since,
      after.openedCount,
      after.retryAt,
      after.forced ? 1 : 0,
      after.consecutive,
    );
    if (changed) this.ctx.waitUntil(this.#arm(now));
  }

  // The alarm runs at the earliest cooldown's end, or soon while a breaker is half-open.
  async #arm(now: number): Promise<void> {
    let at: number | null = null;
    for (const b of this.#breakers.values()) {
      if (b.forced) continue;
      const due =
        b.state === "half_open"
          ? now + PROBE_INTERVAL_MS
          : b.state === "open" && b.retryAt !== null
            ? b.retryAt
            : null;
      if (due !== null && (at === null || due < at)) at = due;
    }
    if (at === null) await this.ctx.storage.deleteAlarm();
    else await this.ctx.storage.setAlarm(at);
  }
}

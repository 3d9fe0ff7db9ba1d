/**
 * Canaries: one model's canary rollout (docs/failover.md, "Canaries"), shared by every
 * edge isolate. Reporters send both arms' outcomes in bulk with the canary's configured
 * spec and get the canary's view back; a canary worse than its baseline is rolled back
 * here, once for everyone. Its state is written at once (it changes rarely); the arms'
 * recent outcomes live in memory.
 */
import { logWarn } from "../../contracts/log.ts";
import { DurableObject } from "cloudflare:workers";
import { applyMigrations } from "../migrations.ts";
import { type Canary, act, newCanary, record, viewOf } from "./canary.ts";
import type { ArmReport, CanaryAction, CanaryArm, CanarySpec, CanaryView } from "./types.ts";

const MIGRATIONS: readonly string[] = [
  `CREATE TABLE canary (
     model TEXT PRIMARY KEY, state TEXT NOT NULL, since INTEGER NOT NULL, reason TEXT);`,
];

type CanaryRow = { model: string; state: string; since: number; reason: string | null };

export class Canaries extends DurableObject<Env> {
  #canary: Canary | null = null;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    void ctx.blockConcurrencyWhile(async () => {
      applyMigrations(ctx.storage, MIGRATIONS);
    });
  }

  /**
   * Takes in both arms' outcomes, recorded while the reporter knew the state of `since`
   * (null: none); answers the canary as it now stands.
   */
  report(
    spec: CanarySpec,
    reports: Partial<Record<CanaryArm, ArmReport>>,
    since: number | null = null,
  ): CanaryView {
    const now = Date.now();
    this.#put(record(this.#load(spec, now), reports, spec, now, since));
    return viewOf(this.#load(spec, now), spec);
  }

  view(spec: CanarySpec): CanaryView {
    return viewOf(this.#load(spec, Date.now()), spec);
  }

  /** An operator promotes, pauses, resumes or rolls back the canary. */
  act(spec: CanarySpec, action: CanaryAction): CanaryView {
    const now = Date.now();
    this.#put(act(this.#load(spec, now), action, now));
    return viewOf(this.#load(spec, now), spec);
  }

  #load(spec: CanarySpec, now: number): Canary {
    if (this.#canary !== null) return this.#canary;
    const row = this.ctx.storage.sql
      .exec<CanaryRow>("SELECT model, state, since, reason FROM canary WHERE model = ?", spec.model)
      .toArray()[0];
    const fresh = newCanary(spec.model, now);
    const states = ["running", "paused", "promoted", "rolled_back"] as const;
    this.#canary =
      row === undefined
        ? fresh
        : {
            ...fresh,
            state: states.find((s) => s === row.state) ?? "running",
            since: row.since,
            reason: row.reason,
          };
    return this.#canary;
  }

  #put(next: Canary): void {
    const before = this.#canary;
    this.#canary = next;
    if (before?.state === next.state && before.since === next.since) return;
    if (before?.state !== next.state) {
      logWarn("canary changed state", {
        model: next.model,
        from: before?.state,
        to: next.state,
        reason: next.reason,
      });
    }
    this.ctx.storage.sql.exec(
      `INSERT INTO canary (model, state, since, reason) VALUES (?, ?, ?, ?)
       ON CONFLICT (model) DO UPDATE SET state = excluded.state, since = excluded.since,
         reason = excluded.reason`,
      next.model,
      next.state,
      next.since,
      next.reason,
    );
  }
}

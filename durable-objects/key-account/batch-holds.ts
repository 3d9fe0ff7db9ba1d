/**
 * Budget holds of Batch API batches (docs/key-account.md, "Batch holds"; docs/batch-api.md):
 * a batch's worst case is reserved against the key's budgets and, through the key's lease,
 * its team's when it is created; each charge of finished lines bills them and gives back
 * their part of the hold exactly once (charges are numbered; a repeated number changes
 * nothing), and the rest is given back when the batch ends. Each line billed becomes a
 * settled ledger row of its own; its cost counts in the team's spend as a request's does.
 */
import { type TokenUsage, utcDay } from "../../contracts/pricing.ts";
import { hourOf } from "../../contracts/budget-periods.ts";
import { budgetRefusal } from "./budgets.ts";
import { KEY_SCOPE, type LedgerEntry, rowTags } from "./schema.ts";
import type { AccountStore } from "./store.ts";
import type { AdmissionRefusal } from "./types.ts";
import type { TeamAllowance } from "../team-account/types.ts";
import type { TeamLink } from "./team/link.ts";
import { moneyShort, usableModels } from "./team/pool.ts";
import { keyRefusal, modelAllowed } from "./admission.ts";
import type { RequestSample } from "./metrics.ts";
import type { BatchStop } from "./batch-types.ts";

/**
 * What `holdBatch` answers: held (or held already), or refused for a budget (the key's or
 * its team's), a key no longer active, a model the key (or its team) may not use, or a team
 * whose allowance other keys hold now.
 */
export type BatchHoldResult =
  | { ok: true }
  | {
      ok: false;
      refusal: Omit<Extract<AdmissionRefusal, { code: "insufficient_quota" }>, "rateLimit">;
    }
  | { ok: false; refusal: { code: "invalid_api_key" } }
  | { ok: false; refusal: { code: "key_blocked" } }
  | { ok: false; refusal: { code: "team_busy" } }
  | { ok: false; refusal: { code: "model_not_allowed"; model: string } };

/** A batch's hold: its worst case, for lines of one model. */
export interface BatchHoldInput {
  batchId: string;
  model: string;
  picos: bigint;
}

/** What `chargeBatch` answers: whether the charge was applied now, and whether to stop. */
export interface BatchChargeResult {
  applied: boolean;
  /** Set while the key may not run the batch's lines: the batch starts no more. */
  stop: BatchStop | null;
}

/**
 * Whether the key may run lines of `model` at `now`, or why not: the one rule of a batch's
 * hold and of each of its charges (so a batch stops within a charge of a revoke or block).
 */
export function batchStop(store: AccountStore, model: string, now: number): BatchStop | null {
  const record = store.key.record;
  if (record === null) return "key_revoked";
  const refusal = keyRefusal(record, null, now);
  if (refusal?.code === "key_blocked") return "key_blocked";
  if (refusal?.code === "invalid_api_key") {
    return refusal.reason === "expired" ? "key_expired" : "key_revoked";
  }
  const allowed = usableModels(record.models, store.team.pool, null);
  return modelAllowed(allowed, model) ? null : "model_not_allowed";
}

/** Lines of one batch that finished, billed together under charge number `seq`. */
export interface BatchCharge {
  batchId: string;
  /** Increases by one per charge of the batch; a charge already applied is ignored. */
  seq: number;
  model: string;
  /** The region whose origins ran its lines. */
  region: string;
  /** Lines billed: their cost, the part of the hold they give back, their usage. */
  lines: BatchChargeLine[];
}

/** One finished line of a charge; it becomes a ledger row (tagged `batch:{batch id}`). */
export interface BatchChargeLine {
  /** Its request id: the line's item id, `{batch id}-{line}`. */
  requestId: string;
  ok: boolean;
  /** The status its origin answered and that origin; null when it never ran. */
  httpStatus: number | null;
  origin: string | null;
  /** When its last attempt was sent (null: never) and when it ended, unix ms. */
  startedAt: number | null;
  endedAt: number | null;
  costPicos: bigint;
  releasePicos: bigint;
  usage: TokenUsage | null;
}

/** The ledger row of a batch line billed `now` (at the batch price its charge carries). */
function lineRow(
  charge: BatchCharge,
  line: BatchChargeLine,
  key: { tags: readonly string[]; teamId: string | null },
  now: number,
): LedgerEntry {
  const closedAt = line.endedAt ?? now;
  const createdAt = line.startedAt ?? closedAt;
  const usage = line.usage;
  return {
    requestId: line.requestId,
    state: "settled",
    model: charge.model,
    day: utcDay(now),
    hour: hourOf(now),
    subject: null,
    subjectTpm: null,
    endUser: null,
    reservedTokens: 0,
    reservedPicos: line.releasePicos,
    candidates: [],
    createdAt,
    expiresAt: closedAt,
    closedAt,
    outcome: line.ok ? "ok" : "error",
    promptTokens: usage?.promptTokens ?? null,
    cachedTokens: usage?.cachedTokens ?? null,
    completionTokens: usage?.completionTokens ?? null,
    costPicos: line.costPicos,
    tags: rowTags(key.tags, [batchTag(charge.batchId)]),
    teamId: key.teamId,
    attempts:
      line.origin === null
        ? []
        : [{ region: charge.region, origin: line.origin, result: "served" }],
    httpStatus: line.httpStatus,
    durationMs: line.startedAt === null ? null : closedAt - createdAt,
    ttftMs: null,
    cacheHit: false,
  };
}

/** The tag of a batch's lines in the ledger, by which the spend log filters them. */
export function batchTag(batchId: string): string {
  return `batch:${batchId}`;
}

type HoldRow = { hour: number; reserved_picos: string; applied_seq: number };

function holdOf(sql: SqlStorage, batchId: string): HoldRow | undefined {
  return sql
    .exec<HoldRow>(
      "SELECT hour, reserved_picos, applied_seq FROM batch_holds WHERE batch_id = ?",
      batchId,
    )
    .toArray()[0];
}

// How often one hold asks the team before it is refused: other requests of the key may
// take what a call brought before the hold is decided again.
const TEAM_TRIES = 16;

/**
 * Reserves `picos` for a batch against the key's budgets and its team's, unless one lacks
 * the room; idempotent per batch. A member key's lease of its team's allowance must hold the
 * batch's money as it holds a request's: what it lacks is asked of the team first.
 */
export async function holdBatch(
  store: AccountStore,
  team: TeamLink,
  sql: SqlStorage,
  input: BatchHoldInput,
): Promise<BatchHoldResult> {
  // The team's models are known before the model is judged.
  await team.learnTerms();
  for (let tries = 0; tries < TEAM_TRIES; tries++) {
    const held = decideHold(store, sql, input, Date.now());
    if (!("need" in held)) return held;
    const refusal = await team.obtain(held.need, store.team.typical);
    if (refusal?.code === "insufficient_quota") {
      const { rateLimit: _rateLimit, ...quota } = refusal;
      return { ok: false, refusal: quota };
    }
  }
  // Still short after as many calls: the team's allowance is in other keys' hands.
  return { ok: false, refusal: { code: "team_busy" } };
}

// Decides a hold and applies it in one synchronous turn, or answers what the team must add.
function decideHold(
  store: AccountStore,
  sql: SqlStorage,
  input: BatchHoldInput,
  now: number,
): BatchHoldResult | { need: TeamAllowance } {
  if (holdOf(sql, input.batchId) !== undefined) return { ok: true };
  const stop = batchStop(store, input.model, now);
  if (stop === "model_not_allowed") {
    return { ok: false, refusal: { code: stop, model: input.model } };
  }
  if (stop === "key_blocked") return { ok: false, refusal: { code: stop } };
  if (stop !== null) return { ok: false, refusal: { code: "invalid_api_key" } };
  const record = store.key.record;
  if (record === null) return { ok: false, refusal: { code: "invalid_api_key" } };
  const hour = hourOf(now);
  const lines = store.spend.lines(record.budgets, now, KEY_SCOPE);
  const refusal = budgetRefusal(lines, input.picos, now);
  if (refusal !== null) return { ok: false, refusal: { ...refusal, scope: "key" } };
  const pool = store.team.pool;
  if (pool !== null) {
    const use = {
      reservedPicos: store.spend.lifetime().reservedPicos,
      inFlight: store.scopeUsage(KEY_SCOPE, null).inFlight,
    };
    const picos = moneyShort(pool, input.picos, use);
    if (picos > 0n) return { need: { requests: 0, tokens: 0, picos, slots: 0 } };
  }
  store.spend.add(hour, { settledPicos: 0n, reservedPicos: input.picos });
  sql.exec(
    "INSERT INTO batch_holds (batch_id, day, hour, reserved_picos, applied_seq, created_at) VALUES (?, ?, ?, ?, 0, ?)",
    input.batchId,
    utcDay(now),
    hour,
    input.picos.toString(),
    now,
  );
  store.flush();
  return { ok: true };
}

/**
 * Bills finished lines once and gives back their part of the hold (each line that ran counts
 * in the key's metrics as a request does), and tells the batch whether to go on.
 */
export function chargeBatch(
  store: AccountStore,
  sql: SqlStorage,
  charge: BatchCharge,
  now: number,
): BatchChargeResult {
  const stop = batchStop(store, charge.model, now);
  const hold = holdOf(sql, charge.batchId);
  if (hold === undefined || charge.seq <= hold.applied_seq) return { applied: false, stop };
  const reserved = BigInt(hold.reserved_picos);
  let release = 0n;
  let cost = 0n;
  const tokens: TokenUsage = { promptTokens: 0, cachedTokens: 0, completionTokens: 0 };
  const key = { tags: store.key.record?.tags ?? [], teamId: store.key.record?.teamId ?? null };
  for (const line of charge.lines) {
    store.ledger.add(lineRow(charge, line, key, now));
    const sample = lineSample(charge, line, now);
    if (sample !== null) store.metrics.add(sample);
    release += line.releasePicos;
    cost += line.costPicos;
    tokens.promptTokens += line.usage?.promptTokens ?? 0;
    tokens.cachedTokens += line.usage?.cachedTokens ?? 0;
    tokens.completionTokens += line.usage?.completionTokens ?? 0;
  }
  release = release < reserved ? release : reserved;
  const today = utcDay(now);
  store.spend.add(hold.hour, { settledPicos: 0n, reservedPicos: -release });
  store.spend.add(hourOf(now), { settledPicos: cost, reservedPicos: 0n });
  // Reported to the key's team with its next call, as a request's cost is.
  store.team.settled(cost, 0);
  store.spend.addUsage(today, {
    model: charge.model,
    requests: charge.lines.length,
    tokens,
    costPicos: cost,
  });
  sql.exec(
    "UPDATE batch_holds SET reserved_picos = ?, applied_seq = ? WHERE batch_id = ?",
    (reserved - release).toString(),
    charge.seq,
    charge.batchId,
  );
  store.flush();
  return { applied: true, stop };
}

/**
 * A line as the key's metrics count a request (its time from send to end); null for a line
 * that never ran, which costs nothing and is not counted.
 */
function lineSample(charge: BatchCharge, line: BatchChargeLine, now: number): RequestSample | null {
  if (line.httpStatus === null) return null;
  const usage = line.usage;
  return {
    requestId: line.requestId,
    model: charge.model,
    region: charge.region,
    status: line.httpStatus,
    outcome: line.ok ? "ok" : "error",
    durationMs:
      line.startedAt === null || line.endedAt === null ? null : line.endedAt - line.startedAt,
    ttftMs: null,
    attempts: 1,
    costPicos: line.costPicos,
    tokens:
      usage === null
        ? null
        : {
            prompt: usage.promptTokens,
            cached: usage.cachedTokens,
            completion: usage.completionTokens,
          },
    at: now,
  };
}

/** Gives back what is left of a batch's hold (it ended); idempotent. */
export function releaseBatch(store: AccountStore, sql: SqlStorage, batchId: string): void {
  const hold = holdOf(sql, batchId);
  if (hold === undefined || hold.reserved_picos === "0") return;
  store.spend.add(hold.hour, { settledPicos: 0n, reservedPicos: -BigInt(hold.reserved_picos) });
  sql.exec("UPDATE batch_holds SET reserved_picos = '0' WHERE batch_id = ?", batchId);
  store.flush();
}

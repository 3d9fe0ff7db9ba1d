/**
 * Keys for the KeyAccount suites (docs/key-account.md): a fresh key and its account per
 * test, priced admissions under budgets, and reads of the account's tables.
 */
import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { expect } from "vitest";
import type { KeyAccount } from "../../durable-objects/key-account/index.ts";
import type { AdmitInput, Limits } from "../../durable-objects/key-account/types.ts";
import type { Budgets } from "../../durable-objects/key-account/budget-types.ts";
import { mintApiKey, newKeyId } from "../../functions/accounts/keys.ts";

/** Limits no test meets unless it lowers one. */
export const LIMITS: Limits = { rpm: 100_000, tpm: 100_000_000, concurrency: 10 };

/** A new key with its account (tier "high"), and `admit` for one of its requests. */
export async function newKey(limits: Partial<Limits> = {}, now = Date.now()) {
  const id = newKeyId();
  const { key, secretHash } = await mintApiKey(env, id);
  const stub = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
  const record = await stub.create({
    id,
    name: "test",
    secretHash,
    limits: { ...LIMITS, ...limits },
    allowedOrigins: ["https://app.example"],
    models: null,
    tier: "high",
    expiresAt: null,
    now,
  });
  expect(record?.id).toBe(id);
  const admit = (requestId: string, extra: Partial<AdmitInput> = {}) =>
    stub.admit({
      requestId,
      credential: { kind: "key", secretHash },
      model: "m",
      promptTokens: 10,
      maxTokens: 90,
      ...extra,
    });
  return { id, key, secretHash, stub, admit };
}

/**
 * The account's open ledger rows. It writes behind (ACCOUNT_WRITE_DELAY_MS): helpers that
 * read its tables flush first, so they see what it decided.
 */
export async function openReservations(stub: DurableObjectStub<KeyAccount>): Promise<number> {
  return runInDurableObject(stub, (instance: KeyAccount, state) => {
    instance.flush();
    return state.storage.sql
      .exec<{ n: number }>("SELECT COUNT(*) AS n FROM ledger WHERE state = 'open'")
      .one().n;
  });
}

/**
 * A request's ledger row once settled, polled (settling runs after the response); answers
 * the row's last state and outcome. A client that goes away releases its request before its
 * origin's END says what was generated: the release alone may reach the account first,
 * which expires the row until the settlement with the usage follows and settles it. Polls
 * every 10 ms, at most `polls` times.
 */
export async function settledLedgerRow(
  keyId: string,
  requestId: string,
  polls = 300,
): Promise<{ state: string; outcome: string | null } | undefined> {
  const stub = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(keyId));
  let row: { state: string; outcome: string | null } | undefined;
  for (let i = 0; i < polls && row?.state !== "settled"; i++) {
    if (i > 0) await new Promise((resolve) => setTimeout(resolve, 10));
    row = await runInDurableObject(stub, (instance: KeyAccount, state) => {
      instance.flush();
      return state.storage.sql
        .exec<{ state: string; outcome: string | null }>(
          "SELECT state, outcome FROM ledger WHERE request_id = ?",
          requestId,
        )
        .toArray()[0];
    });
  }
  return row;
}

/** A ledger row as committed: its request and state. */
export type CommittedRow = { request_id: string; state: string };

/** The ledger as committed, without flushing. */
export function committedLedger(state: DurableObjectState): CommittedRow[] {
  return state.storage.sql
    .exec<CommittedRow>("SELECT request_id, state FROM ledger ORDER BY request_id")
    .toArray();
}

/** Whole micro-dollars in pico-dollars, the unit of every amount. */
export const micros = (n: number) => BigInt(n) * 1_000_000n;

/** $0.15 / $0.075 / $0.60 per 1M input, cached input and output tokens. */
export const PRICE = {
  inputMicrosPerMtok: 150_000,
  cachedInputMicrosPerMtok: 75_000,
  outputMicrosPerMtok: 600_000,
};
/** $1 / $0.50 / $4 per 1M tokens. */
export const PRICIER = {
  inputMicrosPerMtok: 1_000_000,
  cachedInputMicrosPerMtok: 500_000,
  outputMicrosPerMtok: 4_000_000,
};

/** A new key under `budgets`, and `admitPriced` for a request of at most 750 µ$. */
export async function budgetedKey(budgets: Partial<Budgets>, limits: Partial<Limits> = {}) {
  const key = await newKey({ concurrency: 1_000, ...limits });
  await key.stub.update({ budgets, now: Date.now() });
  // 774 estimated prompt tokens (1000 reserved) and 1000 max tokens: at most 150 + 600 µ$.
  const admitPriced = (requestId: string, extra: Partial<AdmitInput> = {}) =>
    key.admit(requestId, { promptTokens: 774, maxTokens: 1_000, price: PRICE, ...extra });
  return { ...key, admitPriced };
}

/** Budgets of one period each, in whole micro-dollars (`soft`: its soft limit). */
export function periods(...list: [period: string, limitMicros: number, soft?: number][]) {
  return {
    periods: list.map(([period, limitMicros, soft]) => ({
      period,
      limitMicros,
      softMicros: soft ?? null,
    })),
  };
}

/**
 * Settled and reserved pico-dollars (a flush first) of the lifetime (`all`) or of one of the
 * key's UTC hours (`h:<hour since the epoch>`); undefined: no row.
 */
export async function spend(stub: DurableObjectStub<KeyAccount>, period: string) {
  const row = await runInDurableObject(stub, (instance: KeyAccount, state) => {
    instance.flush();
    const sql = state.storage.sql;
    const columns = `settled_micros AS sm, settled_picos AS sp, reserved_micros AS rm,
      reserved_picos AS rp`;
    type Row = { sm: number; sp: number; rm: number; rp: number };
    return period === "all"
      ? sql.exec<Row>(`SELECT ${columns} FROM spend WHERE period = 'all'`).toArray()[0]
      : sql
          .exec<Row>(
            `SELECT ${columns} FROM spend_hours WHERE scope = 'key' AND hour = ?`,
            Number(period.slice(2)),
          )
          .toArray()[0];
  });
  // Whole micro-dollars and the pico-dollars below them (docs/key-account.md, "Storage").
  return row === undefined
    ? undefined
    : { settled: micros(row.sm) + BigInt(row.sp), reserved: micros(row.rm) + BigInt(row.rp) };
}

/** An admission request of the key, but for its id. */
export function keyRequest(secretHash: string) {
  return {
    credential: { kind: "key" as const, secretHash },
    model: "m",
    promptTokens: 10,
    maxTokens: 90,
  };
}

/** An admit refused before anything is written: its answer only reports where commits stand. */
export function refusedRequest(secretHash: string, requestId: string): AdmitInput {
  return {
    ...keyRequest(secretHash),
    requestId,
    credential: { kind: "key", secretHash: "0".repeat(64) },
  };
}

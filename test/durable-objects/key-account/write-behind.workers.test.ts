import { evictDurableObject, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it, vi } from "vitest";
import type { CommitStamp } from "../../../contracts/commit-stamp.ts";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import { REFUSAL_HOLD_MS } from "../../../durable-objects/key-account/store/metrics.ts";
import {
  ACCOUNT_WRITE_DELAY_MS,
  type AdmitResult,
} from "../../../durable-objects/key-account/types.ts";
import {
  newKey,
  openReservations,
  committedLedger,
  micros,
  PRICE,
  budgetedKey,
  spend,
  keyRequest,
  refusedRequest,
  type CommittedRow,
} from "../../support/key-accounts.workers.ts";

describe("KeyAccount writes behind", () => {
  it("writes an admission's row before answering it, and nothing for a refusal yet", async () => {
    const { stub, secretHash } = await newKey({ concurrency: 1 });
    // Both calls in one turn of the object, well within the write delay.
    await runInDurableObject(stub, async (instance: KeyAccount, state) => {
      expect((await instance.admit({ ...keyRequest(secretHash), requestId: "r1" })).ok).toBe(true);
      expect(committedLedger(state)).toEqual([{ request_id: "r1", state: "open" }]);
      const refused = await instance.admit({ ...keyRequest(secretHash), requestId: "r2" });
      expect(refused).toMatchObject({ code: "rate_limit_exceeded", limit: "concurrency" });
      // Its count waits for its hold (it may yet be admitted), then is written behind.
      expect(refused.commit.pending).toBe(refused.commit.committed);
      expect(committedLedger(state)).toEqual([{ request_id: "r1", state: "open" }]);
    });
  });

  it("commits the admit's writes by itself once the write delay has passed", async () => {
    const { stub, admit } = await newKey({ tpm: 1_000 });
    expect((await admit("r1")).ok).toBe(true);
    // No flush: the write-behind timer commits the row and the bucket.
    await vi.waitFor(
      async () => {
        const committed = await runInDurableObject(stub, (_instance: KeyAccount, state) => ({
          ledger: committedLedger(state),
          tokens: state.storage.sql
            .exec<{ level: number }>(
              "SELECT level FROM buckets WHERE scope = 'key' AND kind = 'tokens'",
            )
            .toArray(),
        }));
        expect(committed.ledger).toEqual([{ request_id: "r1", state: "open" }]);
        expect(committed.tokens.map((row) => Math.floor(row.level))).toEqual([900]);
      },
      { timeout: 20 * ACCOUNT_WRITE_DELAY_MS, interval: ACCOUNT_WRITE_DELAY_MS / 5 },
    );
  });

  it("writes an admission at once and its settlement as an update of the same row", async () => {
    const { stub, secretHash } = await newKey();
    const writes = await runInDurableObject(stub, async (instance: KeyAccount, state) => {
      const sql = state.storage.sql;
      // Every row the ledger receives, inserted or updated, in order.
      sql.exec("CREATE TABLE ledger_writes (request_id TEXT NOT NULL, state TEXT NOT NULL)");
      sql.exec(`CREATE TRIGGER ledger_inserted AFTER INSERT ON ledger
        BEGIN INSERT INTO ledger_writes VALUES (NEW.request_id, NEW.state); END`);
      sql.exec(`CREATE TRIGGER ledger_updated AFTER UPDATE ON ledger
        BEGIN INSERT INTO ledger_writes VALUES (NEW.request_id, NEW.state); END`);
      expect((await instance.admit({ ...keyRequest(secretHash), requestId: "r1" })).ok).toBe(true);
      const usage = { prompt_tokens: 10, completion_tokens: 5 };
      expect(await instance.settle({ requestId: "r1", outcome: "ok", usage })).toMatchObject({
        settled: true,
      });
      return sql.exec<CommittedRow>("SELECT request_id, state FROM ledger_writes").toArray();
    });
    expect(writes).toEqual([
      { request_id: "r1", state: "open" },
      { request_id: "r1", state: "settled" },
    ]);
  });

  it("never moves the alarm, a write, while steady traffic admits and settles", async () => {
    const { stub, secretHash } = await newKey();
    const t = Date.now();
    const calls = await runInDurableObject(stub, async (instance: KeyAccount, state) => {
      // The first admission sets the alarm to the end of its lease.
      await instance.admit({ ...keyRequest(secretHash), requestId: "r0", now: t });
      let setAlarm = 0;
      const storage = state.storage;
      const original = storage.setAlarm.bind(storage);
      storage.setAlarm = (...args: Parameters<DurableObjectStorage["setAlarm"]>) => {
        setAlarm++;
        return original(...args);
      };
      try {
        for (let i = 1; i <= 20; i++) {
          const settle = [{ requestId: `r${i - 1}`, outcome: "ok" as const }];
          const result = await instance.admit({
            ...keyRequest(secretHash),
            requestId: `r${i}`,
            now: t + i * 1_000,
            settle,
          });
          expect(result.ok).toBe(true);
        }
      } finally {
        storage.setAlarm = original;
      }
      return setAlarm;
    });
    expect(calls).toBe(0);
  });

  it("keeps an admission through a crash right after it was answered, and bills it once", async () => {
    const { id, stub, secretHash } = await budgetedKey({ creditMicros: 10_000 });
    // Answered, then the object crashes at once: the answer left once the admission was durable.
    const admission: AdmitResult = await stub.admit({
      ...keyRequest(secretHash),
      requestId: "lost",
      promptTokens: 774,
      maxTokens: 1_000,
      price: PRICE,
    });
    await expect(
      runInDurableObject(stub, (_instance: KeyAccount, state) => {
        state.abort("crash inside the write window");
      }),
    ).rejects.toThrow("crash inside the write window");
    expect(admission).toMatchObject({ ok: true, reservedPicos: micros(750) });
    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(await again.record({ requestId: "lost" })).toMatchObject({
      ok: true,
      record: { state: "open", reservedPicos: micros(750) },
    });

    // The edge's settlement carries what it holds of the admission.
    const usage = { prompt_tokens: 1_000, cached_tokens: 400, completion_tokens: 500 };
    const settlement = {
      requestId: "lost",
      outcome: "ok" as const,
      usage,
      admitted: { models: [{ model: "m", price: PRICE }], reservedPicos: micros(750) },
    };
    // It settles the open row it kept: the tokens it reserved come back.
    expect(await again.settle(settlement)).toMatchObject({
      settled: true,
      reservedTokens: 1_774,
      usedTokens: 1_500,
      costPicos: micros(420),
    });
    expect(await again.settle(settlement)).toMatchObject({
      settled: false,
      reason: "already_settled",
    });
    expect(await again.record({ requestId: "lost" })).toMatchObject({
      record: { state: "settled", model: "m", reservedPicos: micros(750), costPicos: micros(420) },
    });
    const day = new Date().toISOString().slice(0, 10);
    expect(await again.usage({ from: day, to: day })).toMatchObject({
      rows: [
        { model: "m", requests: 1, promptTokens: 1_000, cachedTokens: 400, costPicos: micros(420) },
      ],
    });
    expect(await spend(again, "all")).toEqual({ settled: micros(420), reserved: 0n });

    // Still once after an eviction: the settled row is read back from SQLite.
    await evictDurableObject(again);
    const third = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(await third.settle(settlement)).toMatchObject({ reason: "already_settled" });
    expect(await spend(third, "all")).toEqual({ settled: micros(420), reserved: 0n });
  });

  it("settles a forgotten request that reports no usage at no cost", async () => {
    const { stub } = await budgetedKey({});
    const admitted = { models: [{ model: "m", price: PRICE }], reservedPicos: micros(750) };
    expect(await stub.settle({ requestId: "lost", outcome: "error", admitted })).toMatchObject({
      settled: true,
      costPicos: 0n,
    });
    expect(await stub.record({ requestId: "lost" })).toMatchObject({
      record: { state: "settled", outcome: "error", costPicos: 0n },
    });
  });

  it("does not record a settlement of a request the edge does not say it admitted", async () => {
    const { stub } = await budgetedKey({});
    const usage = { prompt_tokens: 10, completion_tokens: 10 };
    expect(await stub.settle({ requestId: "never", outcome: "ok", usage })).toMatchObject({
      settled: false,
      reason: "unknown_request",
    });
    expect(await stub.record({ requestId: "never" })).toEqual({ ok: true, record: null });
  });

  it("keeps reservations, settlements, spend and usage across eviction after a flush", async () => {
    const { id, stub, admitPriced, secretHash } = await budgetedKey({}, { concurrency: 2 });
    expect((await admitPriced("a")).ok).toBe(true);
    expect((await admitPriced("b")).ok).toBe(true);
    const usage = { prompt_tokens: 1_000, cached_tokens: 400, completion_tokens: 500 };
    // Settled by the admit that carries it: in memory only until the write-behind commits.
    const carried = await admitPriced("c", {
      settle: [{ requestId: "a", outcome: "ok", usage }],
    });
    expect(carried.ok).toBe(true);
    await runInDurableObject(stub, (instance: KeyAccount) => instance.flush());
    await evictDurableObject(stub);

    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    expect(await again.record({ requestId: "a" })).toMatchObject({
      record: { state: "settled", costPicos: micros(420) },
    });
    expect(await openReservations(again)).toBe(2);
    expect(await spend(again, "all")).toEqual({ settled: micros(420), reserved: micros(1_500) });
    const day = new Date().toISOString().slice(0, 10);
    expect(await again.usage({ from: day, to: day })).toMatchObject({
      rows: [{ model: "m", requests: 1, costPicos: micros(420) }],
    });
    // Both reservations still hold the two slots.
    expect(
      await again.admit({
        requestId: "d",
        credential: { kind: "key", secretHash },
        model: "m",
        promptTokens: 1,
        maxTokens: 1,
      }),
    ).toMatchObject({ limit: "concurrency" });
  });
});

describe("KeyAccount commit numbers", () => {
  it("answers an admission committed, and counts a refusal's write once its hold and the write delay passed", async () => {
    const { stub, secretHash } = await newKey();
    const first = await stub.admit({ ...keyRequest(secretHash), requestId: "r1" });
    expect(first.ok).toBe(true);
    expect(first.commit.pending).toBe(first.commit.committed);
    await runInDurableObject(stub, (_instance: KeyAccount, state) => {
      expect(committedLedger(state)).toEqual([{ request_id: "r1", state: "open" }]);
    });
    // A refusal is counted in the key's metrics once its hold passed, a write behind.
    const refused = await stub.admit(refusedRequest(secretHash, "refused"));
    expect(refused.commit.pending).toBe(refused.commit.committed);
    // The write-behind timer commits it; a later answer of the same incarnation says so.
    await vi.waitFor(
      async () => {
        const later = await stub.admit(refusedRequest(secretHash, "probe"));
        expect(later.commit.incarnation).toBe(refused.commit.incarnation);
        expect(later.commit.committed).toBeGreaterThan(refused.commit.committed);
      },
      {
        timeout: 2 * REFUSAL_HOLD_MS,
        interval: ACCOUNT_WRITE_DELAY_MS / 5,
      },
    );
  });

  it("answers a standalone settlement committed", async () => {
    const { stub, admit } = await newKey();
    const admitted = await admit("r1");
    const { results, commit } = await stub.settleMany([{ requestId: "r1", outcome: "ok" }]);
    expect(results).toMatchObject([{ settled: true }]);
    expect(commit.incarnation).toBe(admitted.commit.incarnation);
    expect(commit.pending).toBe(commit.committed);
    expect(commit.committed).toBeGreaterThanOrEqual(admitted.commit.pending);
  });

  it("reports another incarnation after a crash, and applies once a settlement sent again", async () => {
    const { id, stub, secretHash } = await newKey({ concurrency: 2 });
    expect((await stub.admit({ ...keyRequest(secretHash), requestId: "a" })).ok).toBe(true);
    await runInDurableObject(stub, (instance: KeyAccount) => instance.flush());
    // The settlement of `a` rides on a refused admit, written behind; the account crashes
    // before committing it.
    const usage = { prompt_tokens: 10, completion_tokens: 5 };
    const stamps: CommitStamp[] = [];
    await expect(
      runInDurableObject(stub, async (instance: KeyAccount, state) => {
        const carried = await instance.admit({
          ...refusedRequest(secretHash, "b"),
          settle: [{ requestId: "a", outcome: "ok", usage }],
        });
        stamps.push(carried.commit);
        state.abort("crash inside the write window");
      }),
    ).rejects.toThrow("crash inside the write window");
    const [before] = stamps;
    expect(before?.pending).toBe((before?.committed ?? 0) + 1);

    const again = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
    const after = await again.admit(refusedRequest(secretHash, "probe"));
    expect(after.commit.incarnation).not.toBe(before?.incarnation);
    expect(after.commit.committed).toBe(0);
    // `a` is open again; sent again, it is settled, and a third time changes nothing.
    expect(await again.record({ requestId: "a" })).toMatchObject({ record: { state: "open" } });
    const settlement = { requestId: "a", outcome: "ok" as const, usage };
    expect(await again.settle(settlement)).toMatchObject({ settled: true, usedTokens: 15 });
    expect(await again.settle(settlement)).toMatchObject({ reason: "already_settled" });
    const day = new Date().toISOString().slice(0, 10);
    expect(await again.usage({ from: day, to: day })).toMatchObject({
      rows: [{ model: "m", requests: 1, promptTokens: 10, completionTokens: 5 }],
    });
  });
});

import { runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import type { TeamAccount } from "../../../durable-objects/team-account/index.ts";
import type { AdmitResult } from "../../../durable-objects/key-account/types.ts";
import type { Budgets } from "../../../durable-objects/key-account/budget-types.ts";
import { HOUR_MS, hourOf } from "../../../contracts/budget-periods.ts";
import { micros } from "../../support/key-accounts.workers.ts";
import { TEAM_IDLE_MS } from "../../../durable-objects/key-account/team/link.ts";
import { newTeam, teamKey } from "../../support/team-accounts.workers.ts";

// Lease calls the team has answered for a key: each call carries the next sequence number.
async function teamCalls(stub: DurableObjectStub<TeamAccount>, keyId: string): Promise<number> {
  return runInDurableObject(stub, (_: TeamAccount, state) => {
    const row = state.storage.sql
      .exec<{ seq: number }>("SELECT seq FROM members WHERE key_id = ?", keyId)
      .toArray()[0];
    return row?.seq ?? 0;
  });
}

const admitted = (results: AdmitResult[]) => results.filter((result) => result.ok).length;

describe("teams", () => {
  it("admits no more than the team's concurrency across two keys of 30 concurrent requests", async () => {
    const team = await newTeam({ concurrency: 5 });
    const a = await teamKey(team.id);
    const b = await teamKey(team.id);
    const results = await Promise.all(
      Array.from({ length: 30 }, (_, i) => (i % 2 === 0 ? a : b).admit(`req_conc_${i}`)),
    );
    expect(admitted(results)).toBe(5);
    for (const refused of results.filter((result) => !result.ok)) {
      expect(refused).toMatchObject({
        code: "rate_limit_exceeded",
        scope: "team",
        teamId: team.id,
        limit: "concurrency",
        limitValue: 5,
      });
    }
    expect((await team.stub.view())?.slotsHeld).toBeLessThanOrEqual(5);
  });

  // 10 prompt and 90 completion tokens at PRICE: at most 55.5 µ$ each, so 3 fit in 200 µ$.
  it.each<[string, Partial<Budgets>]>([
    ["credit", { creditMicros: 200 }],
    ["1h", { periods: [{ period: "1h", limitMicros: 200, softMicros: null }] }],
  ])(
    "never lets two keys of 30 concurrent requests reserve or spend past the team's %s budget",
    async (name, budgets) => {
      const team = await newTeam({}, budgets);
      const a = await teamKey(team.id);
      const b = await teamKey(team.id);
      const results = await Promise.all(
        Array.from({ length: 30 }, (_, i) => (i % 2 === 0 ? a : b).admit(`req_budget_${i}`)),
      );
      expect(admitted(results)).toBe(3);
      const refused = results.find((result) => !result.ok);
      expect(refused).toMatchObject({
        code: "insufficient_quota",
        scope: "team",
        teamId: team.id,
        budget: name,
      });
      const settle = (key: typeof a, i: number) =>
        key.stub.settle({
          requestId: `req_budget_${i}`,
          outcome: "ok",
          usage: { prompt_tokens: 10, completion_tokens: 90 },
        });
      await Promise.all(
        results.flatMap((result, i) => (result.ok ? [settle(i % 2 === 0 ? a : b, i)] : [])),
      );
      const view = await team.stub.view();
      const line = view?.budgets.find((budget) => budget.budget === name);
      expect(line).toBeDefined();
      expect((line?.spentPicos ?? 0n) + (line?.reservedPicos ?? 0n)).toBeLessThanOrEqual(
        micros(200),
      );
    },
  );

  it("shows each budget's window, its members' spend and its reset", async () => {
    const team = await newTeam(
      {},
      { periods: [{ period: "1h", limitMicros: 1_000_000, softMicros: 500_000 }] },
    );
    const key = await teamKey(team.id);
    const now = Date.now();
    expect((await key.admit("req_spend")).ok).toBe(true);
    await key.stub.settle({
      requestId: "req_spend",
      outcome: "ok",
      usage: { prompt_tokens: 10, completion_tokens: 90 },
    });
    // The key reports what it settled with its next call to the team.
    await key.stub.update({ teamId: null, now: Date.now() });
    const hour = hourOf(now);
    expect((await team.stub.view(now))?.budgets).toEqual([
      {
        budget: "1h",
        limitPicos: micros(1_000_000),
        softPicos: micros(500_000),
        spentPicos: expect.any(BigInt) as bigint,
        reservedPicos: 0n,
        startsAt: hour * HOUR_MS,
        resetsAt: (hour + 1) * HOUR_MS,
      },
    ]);
    const [line] = (await team.stub.view(now))?.budgets ?? [];
    expect(line?.spentPicos).toBeGreaterThan(0n);
  });

  it("admits a request its key's lease of the team holds without calling the team", async () => {
    const team = await newTeam({});
    const key = await teamKey(team.id);
    expect((await key.admit("req_first")).ok).toBe(true);
    await key.stub.settle({ requestId: "req_first", outcome: "error", originBegan: false });
    const calls = await teamCalls(team.stub, key.id);
    expect(calls).toBe(1);
    // Its lease holds 4 requests: the second leaves half of them, so no top-up starts either.
    expect((await key.admit("req_second")).ok).toBe(true);
    expect(await teamCalls(team.stub, key.id)).toBe(calls);
  });

  it("quotes in a team budget's refusal the request's worst case, not what its key lacked", async () => {
    const team = await newTeam({}, { creditMicros: 200 });
    const key = await teamKey(team.id);
    const first = await key.admit("req_quote_0");
    expect(first.ok).toBe(true);
    const worstCase = first.ok ? first.reservedPicos : 0n;
    for (let i = 1; i < 3; i++) expect((await key.admit(`req_quote_${i}`)).ok).toBe(true);
    expect(await key.admit("req_quote_3")).toMatchObject({
      ok: false,
      code: "insufficient_quota",
      scope: "team",
      requestedPicos: worstCase,
    });
  });

  it("refuses a model the key allows but its team does not", async () => {
    const team = await newTeam({}, {}, ["m"]);
    const key = await teamKey(team.id);
    expect((await key.admit("req_team_model", "m")).ok).toBe(true);
    expect(await key.admit("req_other_model", "other")).toMatchObject({
      ok: false,
      code: "model_not_allowed",
    });
  });

  it("gives back all a key holds when it leaves its team", async () => {
    const team = await newTeam({ concurrency: 3 });
    const key = await teamKey(team.id);
    expect((await key.admit("req_leaving")).ok).toBe(true);
    expect((await team.stub.view())?.slotsHeld).toBeGreaterThan(0);
    await key.stub.update({ teamId: null, now: Date.now() });
    expect((await team.stub.view())?.slotsHeld).toBe(0);
  });

  it("takes back what a key was granted and never used once it has been idle", async () => {
    const team = await newTeam(
      { concurrency: 4 },
      { periods: [{ period: "1d", limitMicros: 1_000, softMicros: null }] },
    );
    const used = await teamKey(team.id);
    const unused = await teamKey(team.id);
    // A key's first check asks its team for its models, and takes slots and requests with it.
    expect((await unused.check()).ok).toBe(true);
    expect((await used.admit("req_idle_used")).ok).toBe(true);
    await used.stub.settle({
      requestId: "req_idle_used",
      outcome: "ok",
      usage: { prompt_tokens: 10, completion_tokens: 90 },
    });
    const busy = await team.stub.view();
    expect(busy?.slotsHeld).toBeGreaterThan(2);
    expect(busy?.budgets[0]?.reservedPicos).toBeGreaterThan(0n);
    await sleep(TEAM_IDLE_MS + 300);
    // Their alarms may have run already; one not yet due stays for later.
    await runDurableObjectAlarm(unused.stub);
    await runDurableObjectAlarm(used.stub);
    const idle = await team.stub.view();
    expect(idle?.slotsHeld).toBe(0);
    expect(idle?.budgets[0]?.reservedPicos).toBe(0n);
    expect(idle?.budgets[0]?.spentPicos).toBeGreaterThan(0n);
  });

  it("holds a Batch API batch against its key's team budget and counts its cost in the team's spend", async () => {
    const team = await newTeam(
      {},
      { periods: [{ period: "1h", limitMicros: 1_000, softMicros: null }] },
    );
    const key = await teamKey(team.id);
    expect(
      await key.stub.holdBatch({ batchId: "batch_big", model: "m", picos: micros(1_500) }),
    ).toMatchObject({
      ok: false,
      refusal: { code: "insufficient_quota", scope: "team", teamId: team.id },
    });
    expect(
      await key.stub.holdBatch({ batchId: "batch_ok", model: "m", picos: micros(600) }),
    ).toEqual({
      ok: true,
    });
    const now = Date.now();
    const charged = await key.stub.chargeBatch({
      batchId: "batch_ok",
      seq: 1,
      model: "m",
      region: "r",
      lines: [
        {
          requestId: "batch_ok-0",
          ok: true,
          httpStatus: 200,
          origin: "o-1",
          startedAt: now - 10,
          endedAt: now,
          costPicos: micros(400),
          releasePicos: micros(600),
          usage: { promptTokens: 10, cachedTokens: 0, completionTokens: 90 },
        },
      ],
    });
    expect(charged).toEqual({ applied: true, stop: null });
    const [line] = (await team.stub.view())?.budgets ?? [];
    expect(line?.spentPicos).toBe(micros(400));
    // 400 µ$ spent: 700 more would take the team past its 1,000 µ$.
    expect(
      await key.stub.holdBatch({ batchId: "batch_late", model: "m", picos: micros(700) }),
    ).toMatchObject({
      ok: false,
      refusal: { code: "insufficient_quota", scope: "team", budget: "1h" },
    });
  });
});

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

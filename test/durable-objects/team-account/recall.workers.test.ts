import { describe, expect, it } from "vitest";
import { micros } from "../../support/key-accounts.workers.ts";
import { newTeam, teamKey } from "../../support/team-accounts.workers.ts";

// Each request settles 10 prompt and 10 completion tokens: 7.5 µ$.
const SETTLED = 7_500_000n;

type Member = Awaited<ReturnType<typeof teamKey>>;

async function settleSmall(key: Member, requestId: string): Promise<void> {
  await key.stub.settle({
    requestId,
    outcome: "ok",
    usage: { prompt_tokens: 10, completion_tokens: 10 },
  });
}

describe("a team's allowance that one key holds unused", () => {
  it("admits every request of two keys taking turns that the team's unspent budget holds", async () => {
    const team = await newTeam({}, { creditMicros: 300 });
    const keys = [await teamKey(team.id), await teamKey(team.id)];
    let spent = 0n;
    let worst: bigint | null = null;
    let i = 0;
    // One request at a time: whatever a key holds unused, the other's request fits the credit.
    for (; worst === null || spent + worst <= micros(300); i++) {
      const key = keys[i % 2] as Member;
      const result = await key.admit(`req_turns_${i}`);
      expect(result, `request ${i} with ${spent} p$ spent`).toMatchObject({ ok: true });
      worst ??= result.ok ? result.reservedPicos : 0n;
      await settleSmall(key, `req_turns_${i}`);
      spent += SETTLED;
    }
    expect(i).toBeGreaterThan(20);
    // The credit cannot hold another worst case: only more credit helps, and the refusal says so.
    expect(await (keys[i % 2] as Member).admit(`req_turns_${i}`)).toMatchObject({
      ok: false,
      code: "insufficient_quota",
      scope: "team",
      retryAfterMs: null,
    });
    const [line] = (await team.stub.view())?.budgets ?? [];
    expect((line?.spentPicos ?? 0n) + (line?.reservedPicos ?? 0n)).toBeLessThanOrEqual(micros(300));
  });

  it("tells a key alone in its spent team to wait for the window's end, not for requests in flight", async () => {
    const team = await newTeam(
      {},
      { periods: [{ period: "30d", limitMicros: 100, softMicros: null }] },
    );
    const key = await teamKey(team.id);
    expect((await key.admit("req_alone_0")).ok).toBe(true);
    await key.stub.settle({
      requestId: "req_alone_0",
      outcome: "ok",
      usage: { prompt_tokens: 10, completion_tokens: 80 },
    });
    // 49.5 µ$ spent and nothing in flight: 55.5 more does not fit 100 until the window ends.
    const refused = await key.admit("req_alone_1");
    expect(refused).toMatchObject({ ok: false, code: "insufficient_quota", scope: "team" });
    expect(
      refused.ok ? 0 : (refused as { retryAfterMs: number | null }).retryAfterMs,
    ).toBeGreaterThan(60_000);
  });

  it("admits a key's request for a slot that another key of the team holds unused", async () => {
    const team = await newTeam({ concurrency: 4 });
    const busy = await teamKey(team.id);
    const other = await teamKey(team.id);
    for (let i = 0; i < 4; i++) expect((await busy.admit(`req_slots_${i}`)).ok).toBe(true);
    for (let i = 0; i < 4; i++) await settleSmall(busy, `req_slots_${i}`);
    // `busy` has nothing in flight but holds the slots it was granted.
    expect((await team.stub.view())?.slotsHeld).toBe(4);
    expect(await other.admit("req_slots_other")).toMatchObject({ ok: true });
  });

  it("admits every one of two keys' concurrent requests that the team's concurrency holds", async () => {
    const team = await newTeam({ concurrency: 10 });
    const keys = [await teamKey(team.id), await teamKey(team.id)];
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) => (keys[i % 2] as Member).admit(`req_both_${i}`)),
    );
    expect(results.filter((result) => !result.ok)).toEqual([]);
    expect(await (keys[0] as Member).admit("req_both_over")).toMatchObject({
      ok: false,
      code: "rate_limit_exceeded",
      scope: "team",
      limit: "concurrency",
      limitValue: 10,
    });
  });

  it("admits every one of two keys' concurrent requests that the team's budget holds", async () => {
    const probe = await teamKey((await newTeam({})).id);
    const first = await probe.admit("req_probe");
    const worst = first.ok ? first.reservedPicos : 0n;
    // Room for exactly 12 worst cases.
    const team = await newTeam({}, { creditMicros: Number((worst * 12n) / 1_000_000n) + 1 });
    const keys = [await teamKey(team.id), await teamKey(team.id)];
    const results = await Promise.all(
      Array.from({ length: 12 }, (_, i) => (keys[i % 2] as Member).admit(`req_money_${i}`)),
    );
    expect(results.filter((result) => !result.ok)).toEqual([]);
    expect(await (keys[1] as Member).admit("req_money_over")).toMatchObject({
      ok: false,
      code: "insufficient_quota",
      scope: "team",
    });
  });
});

import { describe, expect, it } from "vitest";
import { NONE, decideGrant, heldInTheWay } from "../../../durable-objects/team-account/grants.ts";
import { budgetLines } from "../../../durable-objects/key-account/budgets.ts";
import type { TeamGrantInput } from "../../../durable-objects/team-account/grants.ts";

const NOW = Date.UTC(2026, 5, 1, 12);
const LIMITS = { rpm: 1_000, tpm: 100_000, concurrency: 10 };
const NOTHING_SPENT = { settledPicos: 0n, reservedPicos: 0n };

function input(extra: Partial<TeamGrantInput>): TeamGrantInput {
  return {
    limits: LIMITS,
    buckets: {
      requests: { level: LIMITS.rpm, updatedAt: NOW },
      tokens: { level: LIMITS.tpm, updatedAt: NOW },
    },
    lines: [],
    slotsHeld: 0,
    need: null,
    want: NONE,
    now: NOW,
    ...extra,
  };
}

describe("decideGrant", () => {
  it("grants what is needed and a share of the headroom towards what is wanted", () => {
    const { granted, refusal, buckets } = decideGrant(
      input({
        need: { requests: 1, tokens: 100, picos: 0n, slots: 1 },
        want: { requests: 50, tokens: 5_000, picos: 0n, slots: 20 },
      }),
    );
    expect(refusal).toBeNull();
    // Slots: 1 needed + half of the 9 left (4); requests and tokens well within a quarter.
    expect(granted).toEqual({ requests: 50, tokens: 5_000, picos: 0n, slots: 5 });
    expect(buckets.requests.level).toBe(950);
  });

  it("refuses a slot when member keys hold every one, naming the team's concurrency", () => {
    const { granted, refusal } = decideGrant(
      input({ slotsHeld: 10, need: { requests: 0, tokens: 0, picos: 0n, slots: 1 } }),
    );
    expect(granted).toEqual(NONE);
    expect(refusal).toMatchObject({
      code: "rate_limit_exceeded",
      scope: "team",
      limit: "concurrency",
      limitValue: 10,
    });
  });

  it("refuses money past a budget by the key's own budget rule, reserved holdings included", () => {
    const { refusal } = decideGrant(
      input({
        // A 1d budget of 10 µ$ whose day holds 4 µ$ settled and 5 µ$ reserved.
        lines: budgetLines(
          { periods: [{ period: "1d", limitMicros: 10, softMicros: null }], creditMicros: null },
          NOW,
          () => ({ settledPicos: 4_000_000n, reservedPicos: 5_000_000n }),
          () => NOTHING_SPENT,
        ),
        need: { requests: 0, tokens: 0, picos: 2_000_000n, slots: 0 },
      }),
    );
    expect(refusal).toMatchObject({
      code: "insufficient_quota",
      scope: "team",
      budget: "1d",
      limitPicos: 10_000_000n,
    });
  });
});

const dayOf = (settledMicros: bigint, reservedMicros: bigint) =>
  budgetLines(
    { periods: [{ period: "1d", limitMicros: 10, softMicros: null }], creditMicros: null },
    NOW,
    () => ({
      settledPicos: settledMicros * 1_000_000n,
      reservedPicos: reservedMicros * 1_000_000n,
    }),
    () => NOTHING_SPENT,
  );
const refusalFor = (lines: TeamGrantInput["lines"], need: TeamGrantInput["need"], slotsHeld = 0) =>
  decideGrant(input({ lines, need, slotsHeld })).refusal;
const money = (micros: bigint) => ({
  requests: 0,
  tokens: 0,
  picos: micros * 1_000_000n,
  slots: 0,
});

describe("heldInTheWay", () => {
  it("names money when what keys hold keeps a need out that the settled spend leaves room for", () => {
    expect(heldInTheWay(refusalFor(dayOf(4n, 5n), money(2n)))).toBe("picos");
  });

  it("names nothing when the settled spend alone leaves no room: only the window's end helps", () => {
    expect(heldInTheWay(refusalFor(dayOf(9n, 0n), money(2n)))).toBeNull();
    expect(heldInTheWay(refusalFor(dayOf(9n, 1n), money(2n)))).toBeNull();
  });

  it("names slots when keys hold every slot, and nothing for a grant", () => {
    const slot = { requests: 0, tokens: 0, picos: 0n, slots: 1 };
    expect(heldInTheWay(refusalFor([], slot, 10))).toBe("slots");
    expect(heldInTheWay(refusalFor([], slot, 0))).toBeNull();
  });
});

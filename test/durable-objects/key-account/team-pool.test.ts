import { describe, expect, it } from "vitest";
import {
  allowedModels,
  emptyPool,
  excess,
  shortfall,
  termsKnown,
  usableModels,
} from "../../../durable-objects/key-account/team/pool.ts";

const pool = { ...emptyPool("team_x"), requests: 3, tokens: 300, picos: 1_000n, slots: 2 };

describe("a key's lease of its team's allowance", () => {
  it("holds a request that fits every dimension, without asking the team", () => {
    expect(
      shortfall(pool, { tokens: 100, picos: 500n }, { reservedPicos: 0n, inFlight: 1 }),
    ).toBeNull();
  });

  it("asks for exactly what a request lacks: a slot, tokens, money when the team has a budget", () => {
    const budgeted = { ...pool, budgeted: true };
    expect(
      shortfall(budgeted, { tokens: 350, picos: 600n }, { reservedPicos: 500n, inFlight: 2 }),
    ).toEqual({ requests: 0, tokens: 50, picos: 100n, slots: 1 });
    // Without a team budget money is not the team's to check.
    expect(
      shortfall(pool, { tokens: 100, picos: 10_000n }, { reservedPicos: 0n, inFlight: 0 }),
    ).toBeNull();
  });

  it("gives back what it holds beyond what it keeps, never the slots and money in use", () => {
    const budgeted = { ...pool, budgeted: true };
    expect(
      excess(
        budgeted,
        { reservedPicos: 400n, inFlight: 1 },
        { requests: 1, tokens: 0, picos: 0n, slots: 0 },
      ),
    ).toEqual({ requests: 2, tokens: 300, picos: 600n, slots: 1 });
  });

  it("allows the models both the key and its team allow", () => {
    expect(allowedModels(["a", "b"], ["b", "c"])).toEqual(["b"]);
    expect(allowedModels(null, ["c"])).toEqual(["c"]);
    expect(allowedModels(["a"], null)).toEqual(["a"]);
    expect(allowedModels(null, null)).toBeNull();
  });

  it("lets a caller use the models its key, its team (once known) and its token all allow", () => {
    const team = { ...pool, models: ["a", "b"] };
    expect(usableModels(["a", "c"], team, null)).toEqual(["a"]);
    expect(usableModels(null, team, ["b", "c"])).toEqual(["b"]);
    expect(usableModels(null, null, null)).toBeNull();
  });

  it("knows its team's terms once one call was answered", () => {
    const pending = { seq: 1, settledPicos: 0n, giveBack: pool, need: null, want: pool };
    expect(termsKnown(emptyPool("team_x"))).toBe(false);
    expect(termsKnown({ ...pool, seq: 1, pending })).toBe(false);
    expect(termsKnown({ ...pool, seq: 1, pending: null })).toBe(true);
    expect(termsKnown({ ...pool, seq: 2, pending: { ...pending, seq: 2 } })).toBe(true);
  });
});

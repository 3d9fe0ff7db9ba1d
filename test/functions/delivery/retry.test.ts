import { describe, expect, it } from "vitest";
import { LimitsSchema } from "../../../contracts/config/limits.ts";
import { ApiError, originFailure } from "../../../contracts/errors.ts";
import { RetryBudget } from "../../../functions/delivery/retry-budget.ts";
import {
  attemptsAllowed,
  crossesRegion,
  fallsBack,
  nextAttempt,
  nextCandidates,
} from "../../../functions/delivery/retry.ts";
import type { RegionOrigin } from "../../../functions/delivery/origin-pool.ts";

const limits = LimitsSchema.parse({ retry_budget: 2, retry_ratio: 0, retry_floor: 1 });
const live = { signal: undefined, deadline: 1_000, now: 0, limits, budget: undefined };

const at = (region: string, origin: string) =>
  ({ region: { id: region }, origin: { id: origin } }) as unknown as RegionOrigin;
const names = (list: RegionOrigin[] | null) => list?.map((c) => c.origin.id) ?? null;
/** A ranking that puts us-2 (failed meanwhile) last. */
const sickLast = (rest: RegionOrigin[]) => [
  ...rest.filter((c) => c.origin.id !== "us-2"),
  ...rest.filter((c) => c.origin.id === "us-2"),
];

describe("the retry levels", () => {
  it("lets an alias's next model try only after a failure no origin of its model answered", () => {
    expect(fallsBack(originFailure("unavailable"))).toBe(true);
    expect(fallsBack(originFailure("timeout"))).toBe(true);
    expect(fallsBack(originFailure("bad_answer"))).toBe(true);
    expect(fallsBack(new ApiError(400, "bad", { type: "invalid_request_error" }))).toBe(false);
    expect(fallsBack(new Error("bug"))).toBe(false);
  });

  it("tries at most retry_budget + 1 candidates", () => {
    expect(attemptsAllowed(5, limits)).toBe(3);
    expect(attemptsAllowed(2, limits)).toBe(2);
  });

  it("always makes the first attempt, and no other once the client left or time ran out", () => {
    const gone = AbortSignal.abort();
    expect(nextAttempt(0, { ...live, signal: gone, now: 2_000 })).toBe("go");
    expect(nextAttempt(1, { ...live, signal: gone })).toBe("client_gone");
    expect(nextAttempt(1, { ...live, now: 1_000 })).toBe("timeout");
    expect(nextAttempt(1, live)).toBe("go");
  });

  it("spends the isolate's retry budget on each retry", () => {
    const budget = new RetryBudget();
    budget.request(0);
    expect(nextAttempt(1, { ...live, budget })).toBe("go");
    expect(nextAttempt(1, { ...live, budget })).toBe("budget_spent");
  });

  it("spends none on a retry into a region the request has not tried: that is failover", () => {
    const budget = new RetryBudget();
    expect(nextAttempt(1, { ...live, budget, crossRegion: true })).toBe("go");
    expect(nextAttempt(1, { ...live, budget, crossRegion: true })).toBe("go");
    expect(nextAttempt(1, { ...live, budget, crossRegion: true, now: 1_000 })).toBe("timeout");
  });

  it("re-ranks the candidates left before each retry, and with the budget spent keeps only untried regions", () => {
    const order = [at("us", "us-1"), at("us", "us-2"), at("eu", "eu-1"), at("eu", "eu-2")];
    expect(names(nextCandidates(order, 1, sickLast, false))).toEqual([
      "us-1",
      "eu-1",
      "eu-2",
      "us-2",
    ]);
    expect(names(nextCandidates(order, 1, (rest) => rest, true))).toEqual(["us-1", "eu-1", "eu-2"]);
    expect(nextCandidates(order.slice(0, 2), 1, (rest) => rest, true)).toBeNull();
    expect(crossesRegion(order, 2)).toBe(true);
    expect(crossesRegion(order, 1)).toBe(false);
    expect(crossesRegion(order, 0)).toBe(false);
  });
});

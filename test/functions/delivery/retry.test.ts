import { describe, expect, it } from "vitest";
import { LimitsSchema } from "../../../contracts/config/limits.ts";
import { ApiError, originFailure } from "../../../contracts/errors.ts";
import { RetryBudget } from "../../../functions/delivery/retry-budget.ts";
import { attemptsAllowed, fallsBack, nextAttempt } from "../../../functions/delivery/retry.ts";

const limits = LimitsSchema.parse({ retry_budget: 2, retry_ratio: 0, retry_floor: 1 });
const live = { signal: undefined, deadline: 1_000, now: 0, limits, budget: undefined };

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
});

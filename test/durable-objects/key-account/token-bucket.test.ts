import { describe, expect, it } from "vitest";
import {
  BUCKET_WINDOW_MS,
  adjust,
  fullBucket,
  refill,
  snapshot,
  take,
} from "../../../durable-objects/key-account/token-bucket.ts";

describe("token bucket", () => {
  it("starts full and takes units until empty", () => {
    let state = fullBucket(3, 0);
    for (let i = 0; i < 3; i++) {
      const result = take(state, 3, 1, 0);
      expect(result.decision.ok).toBe(true);
      state = result.state;
    }
    const refused = take(state, 3, 1, 0);
    expect(refused.decision).toEqual({ ok: false, retryAfterMs: 20_000, tooLarge: false });
  });

  it("refills linearly over one minute and never above capacity", () => {
    const empty = { level: 0, updatedAt: 0 };
    expect(refill(empty, 60, 30_000).level).toBe(30);
    expect(refill(empty, 60, BUCKET_WINDOW_MS).level).toBe(60);
    expect(refill(empty, 60, 10 * BUCKET_WINDOW_MS).level).toBe(60);
  });

  it("ignores a clock that steps backwards", () => {
    const state = { level: 5, updatedAt: 10_000 };
    expect(refill(state, 60, 5_000)).toEqual({ level: 5, updatedAt: 10_000 });
  });

  it("says when enough units will be back", () => {
    const state = { level: 100, updatedAt: 0 };
    const result = take(state, 1_000, 400, 0);
    // 300 missing at 1000/min is 18 s.
    expect(result.decision).toEqual({ ok: false, retryAfterMs: 18_000, tooLarge: false });
  });

  it("marks a request larger than the bucket as too large", () => {
    const result = take(fullBucket(100, 0), 100, 101, 0);
    expect(result.decision).toEqual({ ok: false, retryAfterMs: 0, tooLarge: true });
  });

  it("refunds up to capacity and charges into debt", () => {
    const state = { level: 90, updatedAt: 0 };
    expect(adjust(state, 100, 50, 0).level).toBe(100);
    const debt = adjust({ level: 10, updatedAt: 0 }, 100, -30, 0);
    expect(debt.level).toBe(-20);
    // From -20, reaching 1 unit takes 21/100 of a minute.
    expect(take(debt, 100, 1, 0).decision).toEqual({
      ok: false,
      retryAfterMs: 12_600,
      tooLarge: false,
    });
  });

  it("reports whole remaining units and the time to full", () => {
    expect(snapshot({ level: 7.9, updatedAt: 0 }, 10, 0)).toEqual({
      limit: 10,
      remaining: 7,
      resetMs: 12_600,
    });
    expect(snapshot({ level: -5, updatedAt: 0 }, 10, 0).remaining).toBe(0);
    expect(snapshot(fullBucket(10, 0), 10, 0).resetMs).toBe(0);
  });
});

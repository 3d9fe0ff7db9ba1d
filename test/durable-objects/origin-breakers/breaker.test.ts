import { describe, expect, it } from "vitest";
import {
  type BreakerSettings,
  DEFAULT_BREAKER_SETTINGS,
} from "../../../contracts/config/breakers.ts";
import {
  type Breaker,
  cooldownMs,
  failedLast,
  force,
  newBreaker,
  probed,
  record,
  tick,
  unreachable,
  viewOf,
} from "../../../durable-objects/origin-breakers/breaker.ts";

const S: BreakerSettings = { ...DEFAULT_BREAKER_SETTINGS };

function outcomes(b: Breaker, results: readonly boolean[], now: number): Breaker {
  let next = b;
  for (const ok of results) {
    next = record(
      next,
      { origin: b.origin, requests: 1, failures: ok ? 0 : 1, trailing: ok ? 0 : 1 },
      now,
      S,
    );
  }
  return next;
}

describe("a closed breaker", () => {
  it("opens on consecutive failures, and a success in between resets the count", () => {
    const b = newBreaker("eu", "eu-1", 0);
    const four = outcomes(b, [false, false, false, false], 10);
    expect(four.state).toBe("closed");
    const reset = outcomes(four, [true, false, false, false, false], 20);
    expect(reset.state).toBe("closed");
    const open = outcomes(reset, [false], 30);
    expect(open).toMatchObject({
      state: "open",
      since: 30,
      openedCount: 1,
      retryAt: 30 + S.cooldownMs,
    });
  });

  it("counts a bulk report's trailing failures, not its whole", () => {
    const b = newBreaker("eu", "eu-1", 0);
    const mixed = record(b, { origin: "eu-1", requests: 10, failures: 6, trailing: 2 }, 0, S);
    expect(mixed).toMatchObject({ state: "closed", consecutive: 2 });
    const more = record(mixed, { origin: "eu-1", requests: 3, failures: 3, trailing: 3 }, 1, S);
    expect(more.state).toBe("open");
  });

  it("opens on a failure ratio over the window once it has enough requests", () => {
    const b = newBreaker("eu", "eu-1", 0);
    // Alternating: never 5 in a row, but half fail.
    const results = Array.from({ length: 19 }, (_, i) => i % 2 === 0);
    const short = outcomes(b, results, 0);
    expect(short.state).toBe("closed");
    expect(outcomes(short, [false], 0).state).toBe("open");
  });

  it("forgets failures that left the window", () => {
    const b = newBreaker("eu", "eu-1", 0);
    const early = outcomes(
      b,
      Array.from({ length: 18 }, (_, i) => i % 2 === 0),
      0,
    );
    const late = outcomes(early, [false, true], S.windowMs + 1);
    expect(late.state).toBe("closed");
    expect(viewOf(late, S.windowMs + 1, S)).toMatchObject({ requests: 2, failures: 1 });
  });
});

describe("an open breaker", () => {
  const opened = outcomes(newBreaker("eu", "eu-1", 0), [false, false, false, false, false], 0);

  it("half-opens when its cooldown has passed, not before", () => {
    expect(tick(opened, S.cooldownMs - 1, S).state).toBe("open");
    expect(tick(opened, S.cooldownMs, S)).toMatchObject({
      state: "half_open",
      since: S.cooldownMs,
    });
  });

  it("closes after enough probes in a row, and opens for the first cooldown on a failed one", () => {
    const half = tick(opened, S.cooldownMs, S);
    const one = probed(half, true, S.cooldownMs + 1, S);
    expect(one.state).toBe("half_open");
    expect(probed(one, true, S.cooldownMs + 2, S).state).toBe("closed");
    const again = probed(one, false, S.cooldownMs + 2, S);
    expect(again).toMatchObject({ state: "open", openedCount: 1 });
    expect(again.retryAt).toBe(S.cooldownMs + 2 + S.cooldownMs);
  });

  it("finds an origin that was down a long time within one cooldown of its return", () => {
    // Opened five times by live traffic: its cooldown has grown to 16× the first.
    let b = opened;
    for (let n = 2; n <= 5; n++) b = { ...b, openedCount: n, retryAt: cooldownMs(n, S) };
    let now = b.retryAt ?? 0;
    // Down for ten minutes: every probe fails, each an unchanged cooldown after the last.
    while (now < 600_000) {
      b = probed(tick(b, now, S), false, now, S);
      expect(b.retryAt).toBe(now + S.cooldownMs);
      now = b.retryAt ?? now;
    }
    // Back at 600 s: half-open at the next cooldown's end, closed by its probes.
    b = tick(b, now, S);
    for (let i = 0; i < S.probes; i++) b = probed(b, true, now + i, S);
    expect(b.state).toBe("closed");
    expect(now - 600_000).toBeLessThanOrEqual(S.cooldownMs);
    // Live traffic tripping it again doubles from its five openings, not from its probes.
    expect(cooldownMs(b.openedCount + 1, S)).toBe(cooldownMs(6, S));
  });

  it("grows its cooldown with each opening, up to the cap", () => {
    expect([1, 2, 3].map((n) => cooldownMs(n, S))).toEqual([5_000, 10_000, 20_000]);
    expect(cooldownMs(30, S)).toBe(S.maxCooldownMs);
  });

  it("ignores outcomes reported while open", () => {
    expect(outcomes(opened, [true, true], 1).state).toBe("open");
  });
});

const fail = (origin: string) => ({ origin, requests: 1, failures: 1, trailing: 1 });

describe("a reach check", () => {
  it("is asked for when a closed breaker's latest outcome is a failure, not after a success", () => {
    const b = newBreaker("eu", "eu-1", 0);
    expect(failedLast(record(b, fail("eu-1"), 1, S), fail("eu-1"))).toBe(true);
    const mixed = { origin: "eu-1", requests: 3, failures: 1, trailing: 0 };
    expect(failedLast(record(b, mixed, 1, S), mixed)).toBe(false);
    const open = outcomes(b, [false, false, false, false, false], 1);
    expect(failedLast(open, fail("eu-1"))).toBe(false);
    const reopened = record(force(open, "closed", 2), fail("eu-1"), 3, S);
    expect(failedLast(reopened, fail("eu-1"))).toBe(true);
    expect(failedLast({ ...b, forced: true }, fail("eu-1"))).toBe(false);
  });

  it("opens a breaker whose origin failed and cannot be reached, as a trip", () => {
    const failed = outcomes(newBreaker("eu", "eu-1", 0), [false], 1);
    const after = unreachable(failed, 2, S);
    expect(after).toMatchObject({ state: "open", openedCount: 1, retryAt: 2 + S.cooldownMs });
    const again = unreachable({ ...failed, openedCount: 2 }, 2, S);
    expect(again.retryAt).toBe(2 + cooldownMs(3, S));
  });

  it("leaves it closed once a success came in since, or with no room in its region", () => {
    const failed = outcomes(newBreaker("eu", "eu-1", 0), [false], 1);
    expect(unreachable(outcomes(failed, [true], 2), 3, S).state).toBe("closed");
    expect(unreachable(failed, 3, S, false).state).toBe("closed");
    expect(unreachable(force(failed, "open", 2), 3, S)).toMatchObject({ forced: true });
  });
});

describe("an operator", () => {
  it("forces a breaker open until told otherwise, and closed with a fresh count", () => {
    const forced = force(newBreaker("eu", "eu-1", 0), "open", 5);
    expect(viewOf(forced, 5, S)).toMatchObject({ state: "open", forced: true, retry_at: null });
    expect(tick(forced, 1e12, S).state).toBe("open");
    const closed = force(forced, "closed", 10);
    expect(closed).toMatchObject({ state: "closed", forced: false, openedCount: 0 });
    expect(outcomes(closed, [false, false, false, false, false], 11).state).toBe("open");
  });
});

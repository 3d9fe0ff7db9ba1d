import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { onTimeClock, onTimeTimeout } from "../../contracts/on-time.ts";
import { silenceWatchdog } from "../../contracts/upstream.ts";

beforeEach(() => {
  vi.useFakeTimers({ now: 0 });
});
afterEach(() => {
  vi.useRealTimers();
});

/** The thread stalls for `ms`: the clock moves while no timer runs. */
function stall(ms: number): void {
  vi.setSystemTime(Date.now() + ms);
}

describe("an on-time timer", () => {
  it("fires after its time when the thread keeps time", () => {
    const fire = vi.fn<() => void>();
    onTimeTimeout(2_000, fire);
    vi.advanceTimersByTime(1_999);
    expect(fire).not.toHaveBeenCalled();
    vi.advanceTimersByTime(250);
    expect(fire).toHaveBeenCalledTimes(1);
  });

  it("does not count a stall of the thread as time waited", () => {
    const fire = vi.fn<() => void>();
    onTimeTimeout(2_000, fire);
    vi.advanceTimersByTime(500);
    // Ten seconds with no timer run (a burst held the thread), then the timers run late.
    stall(10_000);
    vi.advanceTimersByTime(250);
    expect(fire).not.toHaveBeenCalled();
    // The rest of its time, on time, still fires it.
    vi.advanceTimersByTime(1_500);
    expect(fire).toHaveBeenCalledTimes(1);
  });

  it("starts again on reset and never fires once stopped", () => {
    const fire = vi.fn<() => void>();
    const timer = onTimeTimeout(1_000, fire);
    vi.advanceTimersByTime(900);
    timer.reset();
    vi.advanceTimersByTime(900);
    expect(fire).not.toHaveBeenCalled();
    timer.stop();
    vi.advanceTimersByTime(5_000);
    expect(fire).not.toHaveBeenCalled();
  });

  it("never fires for an infinite time", () => {
    const fire = vi.fn<() => void>();
    onTimeTimeout(Number.POSITIVE_INFINITY, fire);
    vi.advanceTimersByTime(1e9);
    expect(fire).not.toHaveBeenCalled();
  });
});

describe("an on-time clock", () => {
  it("fires each of its timers after its own time, on one interval", () => {
    const clock = onTimeClock(1_000);
    const first = vi.fn<() => void>();
    const second = vi.fn<() => void>();
    clock.timeout(1_000, first);
    vi.advanceTimersByTime(500);
    clock.timeout(2_000, second);
    expect(vi.getTimerCount()).toBe(1);
    vi.advanceTimersByTime(625);
    expect(first).toHaveBeenCalledTimes(1);
    expect(second).not.toHaveBeenCalled();
    vi.advanceTimersByTime(1_374);
    expect(second).not.toHaveBeenCalled();
    vi.advanceTimersByTime(1);
    expect(second).toHaveBeenCalledTimes(1);
  });

  it("does not count a stall against a timer started or reset during it", () => {
    const clock = onTimeClock(1_000);
    const fire = vi.fn<() => void>();
    clock.timeout(5_000, () => {});
    vi.advanceTimersByTime(100);
    stall(10_000);
    const timer = clock.timeout(1_000, fire);
    vi.advanceTimersByTime(900);
    timer.reset();
    vi.advanceTimersByTime(900);
    expect(fire).not.toHaveBeenCalled();
    vi.advanceTimersByTime(250);
    expect(fire).toHaveBeenCalledTimes(1);
  });

  it("runs its interval only while a timer runs, and stops every timer at once", () => {
    const clock = onTimeClock(1_000);
    const fire = vi.fn<() => void>();
    const timer = clock.timeout(1_000, fire);
    timer.stop();
    expect(vi.getTimerCount()).toBe(0);
    clock.timeout(1_000, fire);
    clock.timeout(3_000, fire);
    expect(vi.getTimerCount()).toBe(1);
    clock.stop();
    expect(vi.getTimerCount()).toBe(0);
    vi.advanceTimersByTime(10_000);
    expect(fire).not.toHaveBeenCalled();
  });

  it("stops its interval once its last timer fired", () => {
    const clock = onTimeClock(1_000);
    const fire = vi.fn<() => void>();
    clock.timeout(1_000, fire);
    vi.advanceTimersByTime(1_125);
    expect(fire).toHaveBeenCalledTimes(1);
    expect(vi.getTimerCount()).toBe(0);
  });
});

describe("the silence watchdog", () => {
  it("blames an origin silent while the thread kept time, not one our stall hid", () => {
    const silent = vi.fn<() => void>();
    const dog = silenceWatchdog(2_000, silent);
    stall(9_800);
    vi.advanceTimersByTime(250);
    // The reader gets its turn and finds the origin's frames waiting.
    dog.beat();
    vi.advanceTimersByTime(1_900);
    expect(silent).not.toHaveBeenCalled();
    vi.advanceTimersByTime(500);
    expect(silent).toHaveBeenCalledTimes(1);
  });
});

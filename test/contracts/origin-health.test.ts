import { describe, expect, it } from "vitest";
import {
  OriginHealth,
  PANIC_INTERVAL_MS,
  judgeHead,
  reportsBusy,
  reportsIdle,
  retryAfterMs,
  watchIdleEngine,
} from "../../contracts/origin-health.ts";
import type { LoadReport } from "../../contracts/protocol/schema.ts";

function load(over: Partial<LoadReport>): LoadReport {
  return {
    origin: "eu-1",
    t: 0,
    running: 0,
    waiting: 0,
    kv_usage: 0,
    kv_free_blocks: 100,
    kv_total_blocks: 100,
    block_size: 16,
    prefix_queries: 0,
    prefix_hits: 0,
    max_num_seqs: 8,
    ...over,
  };
}

describe("what a HEAD says of its origin", () => {
  it("is busy for a 429, and for a 503 only when it says when to come back", () => {
    expect(judgeHead(429, {})).toBe("busy");
    expect(judgeHead(503, { "Retry-After": "2" })).toBe("busy");
    expect(judgeHead(503, {})).toBe("error");
    expect(judgeHead(500, {})).toBe("error");
    expect(judgeHead(400, {})).toBe("ok");
    expect(judgeHead(200, {})).toBe("ok");
  });

  it("reads retry-after-ms before retry-after, 1 s when neither, at most a minute", () => {
    expect(retryAfterMs({ "retry-after-ms": "250", "retry-after": "9" })).toBe(250);
    expect(retryAfterMs({ "retry-after": "3" })).toBe(3_000);
    expect(retryAfterMs({})).toBe(1_000);
    expect(retryAfterMs({ "retry-after": "86400" })).toBe(60_000);
  });
});

describe("a late first byte", () => {
  it("is overload while the origin's report shows a queue or every slot running", () => {
    expect(reportsBusy(load({ waiting: 3 }))).toBe(true);
    expect(reportsBusy(load({ running: 8 }))).toBe(true);
    expect(reportsBusy(load({ running: 2 }))).toBe(false);
    expect(reportsBusy(null)).toBe(false);
  });
});

// An idle-engine watch that notes what it says.
function watched(slowMs: number, firstByteTimeoutMs: number) {
  const seen: string[] = [];
  const watch = watchIdleEngine(
    slowMs,
    firstByteTimeoutMs,
    () => seen.push("slow"),
    () => seen.push("gave up"),
  );
  return { watch, seen };
}

describe("an answer read whole whose HEAD is late", () => {
  it("counts only the time the origin's reports show no interactive work", () => {
    expect(reportsIdle(load({}))).toBe(true);
    expect(reportsIdle(load({ running: 3, background_running: 3 }))).toBe(true);
    expect(reportsIdle(load({ running: 1 }))).toBe(false);
    expect(reportsIdle(load({ waiting: 1 }))).toBe(false);
  });

  it("is slow and given up after slowMs of idle reports, by the reports' clock", () => {
    // A first-byte timeout far beyond: an engine idle that long is not making the answer.
    const { watch, seen } = watched(200, 30_000);
    watch.report(load({ t: 0 }));
    watch.report(load({ t: 150 }));
    expect(seen).toEqual([]);
    // Work on the engine (a long answer being generated) starts the count again.
    watch.report(load({ t: 300, running: 1 }));
    watch.report(load({ t: 400 }));
    watch.report(load({ t: 550 }));
    expect(seen).toEqual([]);
    watch.report(load({ t: 600 }));
    expect(seen).toEqual(["slow", "gave up"]);
    watch.report(load({ t: 2_000 }));
    expect(seen).toEqual(["slow", "gave up"]);
  });

  it("is given up at a first-byte timeout shorter than slowMs, not judged slow", () => {
    const { watch, seen } = watched(2_000, 400);
    watch.report(load({ t: 0 }));
    watch.report(load({ t: 350 }));
    expect(seen).toEqual([]);
    watch.report(load({ t: 400 }));
    expect(seen).toEqual(["gave up"]);
    watch.report(load({ t: 2_500 }));
    expect(seen).toEqual(["gave up"]);
  });

  it("says nothing once stopped (its HEAD came)", () => {
    const { watch, seen } = watched(10, 20);
    watch.report(load({ t: 0 }));
    watch.stop();
    watch.report(load({ t: 100 }));
    expect(seen).toEqual([]);
  });
});

describe("the ranking", () => {
  it("puts busy and failed origins last and leaves out those behind an open breaker", () => {
    const open = new Set(["c"]);
    const health = new OriginHealth(2_000, { blocked: (id) => open.has(id) });
    health.busy("a", 0, { "retry-after": "1" });
    expect(health.rank(["a", "b", "c"], (id) => id, 500)).toEqual(["b", "a"]);
    expect(health.rank(["a", "b", "c"], (id) => id, 1_000)).toEqual(["a", "b"]);
  });

  it("tells an origin refused busy from one that failed, until its retry-after ends", () => {
    const health = new OriginHealth(2_000);
    health.busy("a", 0, { "retry-after-ms": "300" });
    health.failed("b", 0);
    expect([health.busyAt("a", 299), health.busyAt("a", 300), health.busyAt("b", 0)]).toEqual([
      true,
      false,
      false,
    ]);
    health.busy("b", 0, { "retry-after": "1" });
    health.answered("b");
    expect(health.busyAt("b", 10)).toBe(false);
  });
});

describe("the panic trickle", () => {
  it("lets one request through per interval, in turn, and never to an origin forced open", () => {
    const forced = new Set(["b"]);
    const health = new OriginHealth(2_000, {
      blocked: () => true,
      forced: (id) => forced.has(id),
    });
    const ids = ["a", "b", "c"];
    expect(health.panic(ids, (id) => id, 0)).toBe("a");
    expect(health.panic(ids, (id) => id, PANIC_INTERVAL_MS - 1)).toBeNull();
    expect(health.panic(ids, (id) => id, PANIC_INTERVAL_MS)).toBe("c");
    forced.add("a");
    forced.add("c");
    expect(health.panic(ids, (id) => id, 10 * PANIC_INTERVAL_MS)).toBeNull();
  });
});

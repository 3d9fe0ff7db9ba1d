import { describe, expect, it } from "vitest";
import { OutcomeLog } from "../../origin/outcome-log.ts";

const usage = { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8, cached_tokens: 0 };

describe("OutcomeLog", () => {
  it("tells a running item, then its end, for the request and its retries", () => {
    const log = new OutcomeLog();
    log.started("req_a", 0);
    expect(log.lookup(["req_a"], 1)).toEqual([{ id: "req_a", state: "running" }]);
    log.ended("req_a", "error", null, 2);
    log.started("req_a.1", 3);
    log.ended("req_a.1", "ok", usage, 4);
    expect(log.lookup(["req_a", "req_b"], 5)).toEqual([
      { id: "req_a", state: "ended", outcome: "error", usage: null },
      { id: "req_a.1", state: "ended", outcome: "ok", usage },
    ]);
    expect(log.size).toBe(2);
  });

  it("forgets items past their retention, but not an item whose end is recent", () => {
    const log = new OutcomeLog({ retentionMs: 100 });
    log.started("req_old", 0);
    log.ended("req_old", "ok", usage, 10);
    log.started("req_long", 50);
    log.ended("req_long", "ok", usage, 140);
    expect(log.lookup(["req_old", "req_long"], 130).map((r) => r.id)).toEqual(["req_long"]);
    expect(log.lookup(["req_long"], 239)).toHaveLength(1);
    expect(log.lookup(["req_long"], 241)).toHaveLength(0);
    expect(log.size).toBe(0);
  });

  it("keeps at most its bound, the oldest going first", () => {
    const log = new OutcomeLog({ maxEntries: 1_000 });
    for (let i = 0; i < 5_000; i++) {
      log.started(`req_${i}`, i);
      log.ended(`req_${i}`, "ok", usage, i);
    }
    expect(log.size).toBe(1_000);
    expect(log.lookup(["req_3999"], 5_000)).toHaveLength(0);
    expect(log.lookup(["req_4000", "req_4999"], 5_000)).toHaveLength(2);
  });

  it("tells every remembered request whose id starts with a prefix, each once", () => {
    const log = new OutcomeLog();
    const lease = "req_00112233445566778899";
    log.started(`${lease}00000000000000000007`, 0);
    log.ended(`${lease}00000000000000000007`, "ok", usage, 1);
    log.started(`${lease}00010000000000000009.1`, 2);
    log.ended("req_ffffffffffffffffffff0000000000000007", "ok", usage, 3);
    const found = log.lookup([`${lease}00000000000000000007`], 4, [lease, lease.slice(0, 20)]);
    expect(found.map((record) => record.id).sort()).toEqual([
      `${lease}00000000000000000007`,
      `${lease}00010000000000000009.1`,
    ]);
    expect(log.lookup([], 4, ["req_0123456789abcdef"])).toEqual([]);
  });
});

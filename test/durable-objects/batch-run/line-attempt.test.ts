import { describe, expect, it } from "vitest";
import {
  COLD_KEY_BLOCKS,
  prefixKey,
  promptBlocks,
  shardOfKey,
} from "../../../contracts/prefix-blocks.ts";
import { lineAttempt } from "../../../durable-objects/batch-run/line-attempt.ts";
import type { BatchState } from "../../../durable-objects/batch-run/lifecycle.ts";
import type { BatchRunPlan, LineToRun } from "../../../durable-objects/batch-run/types.ts";

const MODEL = "warmgate-sim-8b";
const body = {
  model: "alias",
  messages: [
    { role: "system", content: "A shared instruction, long enough to fill blocks. ".repeat(8) },
  ],
};
const blocks = promptBlocks(MODEL, body);
const prefix = prefixKey(promptBlocks(MODEL, body, COLD_KEY_BLOCKS));
const state = { endpoint: "/v1/chat/completions", expiresAt: 1 } as BatchState;
const line: LineToRun = {
  idx: 5,
  customId: "c5",
  prefix,
  offset: 0,
  bytes: 1,
  promptTokens: 100,
  maxTokens: 8,
};

function plan(routing: boolean): BatchRunPlan {
  return {
    setup: { routing: routing ? {} : null },
    batchers: ["s0", "s1", "s2", "s3"],
    lane: 4,
    linesInFlight: 8,
    firstByteTimeoutMs: 1,
    itemTimeoutMs: 1,
    model: MODEL,
  } as unknown as BatchRunPlan;
}

describe("a batch line's attempt", () => {
  it("carries its prefix blocks to the shard its prefix keys, where routing is on", () => {
    const { batcher, attempt } = lineAttempt(plan(true), state, line, "batch_x-5", body);
    expect(prefix).not.toBeNull();
    expect(batcher).toBe(`s${shardOfKey(prefix ?? 0, 4)}`);
    expect(attempt.route).toEqual({ blocks, session: null, pinned: null });
    expect(JSON.parse(attempt.body)).toMatchObject({ model: MODEL });
    expect(attempt).toMatchObject({
      id: "batch_x-5",
      lane: 4,
      headers: { "x-request-id": "batch_x-5" },
    });
  });

  it("goes by line number and without a route where routing is off", () => {
    const { batcher, attempt } = lineAttempt(plan(false), state, line, "batch_x-5", body);
    expect(batcher).toBe("s1");
    expect(attempt.route).toBeUndefined();
  });

  it("avoids every origin but the one that kept its answer, where one did", () => {
    const kept = lineAttempt(plan(true), state, line, "batch_x-5", body, ["a", "c"]);
    expect(kept.attempt.avoidOrigins).toEqual(["a", "c"]);
    expect(lineAttempt(plan(true), state, line, "batch_x-5", body).attempt.avoidOrigins).toEqual(
      [],
    );
  });
});

import { describe, expect, it } from "vitest";
import { callEnvelope } from "../../../../durable-objects/batcher/upstream/call.ts";
import type { BatcherAttempt } from "../../../../durable-objects/batcher/types.ts";

function attempt(id: string, lane: number): BatcherAttempt {
  return {
    id,
    path: "/v1/chat/completions",
    body: "{}",
    headers: {},
    lane,
    promptTokens: 1,
    maxTokens: 1,
    deadline: 0,
    firstByteTimeoutMs: 1000,
    itemTimeoutMs: 1000,
    avoidOrigins: [],
  };
}

describe("a call's batch request", () => {
  it("marks the batch lane's lines background, below every interactive priority", () => {
    const callers = [attempt("chat", 0), attempt("line", 3)].map((input) => ({ input }));
    const envelope = callEnvelope({ id: "call-1", callers } as never, { count: 4, batch: 3 }, null);
    expect(
      envelope.items.map(({ id, priority, background }) => ({ id, priority, background })),
    ).toEqual([
      { id: "chat", priority: 3, background: undefined },
      { id: "line", priority: 0, background: true },
    ]);
  });

  it("marks nothing background where the plan has no batch lane", () => {
    const callers = [attempt("chat", 1)].map((input) => ({ input }));
    const envelope = callEnvelope(
      { id: "call-2", callers } as never,
      { count: 2, batch: undefined },
      null,
    );
    expect(envelope.items[0]?.background).toBeUndefined();
  });
});

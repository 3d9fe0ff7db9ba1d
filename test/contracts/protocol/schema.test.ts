import { describe, expect, it } from "vitest";
import {
  BatchRequestSchema,
  CancelRequestSchema,
  ItemHeadSchema,
  ItemRecordSchema,
  LoadReportSchema,
  MAX_ID_CHARS,
  MAX_OUTCOME_IDS,
  MAX_OUTCOME_PREFIXES,
  MIN_OUTCOME_PREFIX_CHARS,
  OutcomesRequestSchema,
  OutcomesResponseSchema,
  attemptId,
  attemptOf,
  requestIdOf,
} from "../../../contracts/protocol/schema.ts";

const envelope = {
  v: 1,
  batch_id: "b-7f3a",
  items: [
    {
      id: "req-1",
      path: "/v1/chat/completions",
      headers: { "x-request-id": "req-1" },
      body: '{"model":"m","messages":[]}',
      timeout_ms: 60000,
      priority: 0,
    },
  ],
};

const load = {
  origin: "eu-gpu-1",
  t: 1767225600123,
  running: 12,
  waiting: 3,
  kv_usage: 0.64,
  kv_free_blocks: 2950,
  kv_total_blocks: 8192,
  block_size: 16,
  prefix_queries: 918272,
  prefix_hits: 613004,
  max_num_seqs: 256,
};

describe("the batch envelope", () => {
  it("accepts the envelope of PROTOCOL.md, with a block-event cursor", () => {
    const withCursor = { ...envelope, kv_events_after: { log: "", seq: 0 } };
    expect(BatchRequestSchema.parse(withCursor)).toEqual(withCursor);
  });

  it("refuses another version, no items, an unserved path and over-long ids", () => {
    const item = envelope.items[0];
    const bad = [
      { ...envelope, v: 2 },
      { ...envelope, items: [] },
      { ...envelope, items: [{ ...item, path: "/v1/images/generations" }] },
      { ...envelope, items: [{ ...item, id: "x".repeat(MAX_ID_CHARS + 1) }] },
      { ...envelope, batch_id: "" },
      { ...envelope, items: [{ ...item, timeout_ms: 0 }] },
      { ...envelope, kv_events_after: { log: "x".repeat(65), seq: 0 } },
    ];
    for (const request of bad) expect(BatchRequestSchema.safeParse(request).success).toBe(false);
  });

  it("ignores fields it does not know (PROTOCOL.md, Versioning)", () => {
    expect(BatchRequestSchema.parse({ ...envelope, later: true })).toEqual(envelope);
  });
});

const ids = (n: number) => Array.from({ length: n }, (_, i) => `req_${i}`);

describe("cancel and outcome requests", () => {
  it("takes a batch, ids or both, never neither", () => {
    expect(CancelRequestSchema.safeParse({ batch_id: "b" }).success).toBe(true);
    expect(CancelRequestSchema.safeParse({ ids: ["r"] }).success).toBe(true);
    expect(CancelRequestSchema.safeParse({}).success).toBe(false);
  });

  it("takes at most MAX_OUTCOME_IDS request ids", () => {
    expect(OutcomesRequestSchema.safeParse({ ids: ids(MAX_OUTCOME_IDS) }).success).toBe(true);
    expect(OutcomesRequestSchema.safeParse({ ids: ids(MAX_OUTCOME_IDS + 1) }).success).toBe(false);
  });

  it("takes request-id prefixes of at least MIN_OUTCOME_PREFIX_CHARS, at most MAX_OUTCOME_PREFIXES", () => {
    const prefix = "req_".padEnd(MIN_OUTCOME_PREFIX_CHARS, "0");
    const many = (n: number) => Array.from({ length: n }, () => prefix);
    expect(OutcomesRequestSchema.safeParse({ ids: [], prefixes: [prefix] }).success).toBe(true);
    expect(OutcomesRequestSchema.safeParse({ ids: [], prefixes: ["req_0"] }).success).toBe(false);
    const most = { ids: [], prefixes: many(MAX_OUTCOME_PREFIXES) };
    expect(OutcomesRequestSchema.safeParse(most).success).toBe(true);
    const over = { ids: [], prefixes: many(MAX_OUTCOME_PREFIXES + 1) };
    expect(OutcomesRequestSchema.safeParse(over).success).toBe(false);
  });

  it("reads an outcomes answer's running and ended items, and nothing else", () => {
    const usage = { prompt_tokens: 26, completion_tokens: 9, total_tokens: 35, cached_tokens: 0 };
    const items = [
      { id: "req_1", state: "ended", outcome: "ok", usage },
      { id: "req_2.1", state: "running" },
    ];
    expect(OutcomesResponseSchema.parse({ items })).toEqual({ items });
    expect(ItemRecordSchema.safeParse({ id: "req_3", state: "ended" }).success).toBe(false);
    expect(ItemRecordSchema.safeParse({ id: "req_3", state: "lost" }).success).toBe(false);
  });

  it("names an attempt's request by the id before its first dot", () => {
    expect(requestIdOf("req_1.2")).toBe("req_1");
    expect(requestIdOf("req_1")).toBe("req_1");
  });

  it("numbers a request's attempts in its item ids, and reads the number back", () => {
    expect(attemptId("req_1", 0)).toBe("req_1");
    expect(attemptId("req_1", 2)).toBe("req_1.2");
    for (const n of [0, 1, 2, 17]) {
      expect(attemptOf(attemptId("req_1", n))).toBe(n);
      expect(requestIdOf(attemptId("req_1", n))).toBe("req_1");
    }
    expect(attemptOf("req_1.x")).toBe(0);
  });
});

describe("frame payloads", () => {
  it("reads a HEAD whose headers are strings, and no other", () => {
    const head = { id: "r", status: 200, headers: { "content-type": "text/event-stream" } };
    expect(ItemHeadSchema.parse(head)).toEqual(head);
    expect(ItemHeadSchema.safeParse({ ...head, headers: { "retry-after": 1 } }).success).toBe(
      false,
    );
  });

  it("reads a LOAD without its optional fields, and refuses one missing a count", () => {
    expect(LoadReportSchema.parse(load)).toEqual(load);
    const { running: _running, ...partial } = load;
    expect(LoadReportSchema.safeParse(partial).success).toBe(false);
  });

  it("reads a LOAD's block events", () => {
    const kv_events = { log: "5f0c", seq: 4182, stored: [3141592653], removed: [], cleared: false };
    expect(LoadReportSchema.parse({ ...load, step_ms: 18.5, kv_events })).toMatchObject({
      step_ms: 18.5,
      kv_events,
    });
  });
});

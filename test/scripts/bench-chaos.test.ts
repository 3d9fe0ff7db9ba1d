import { describe, expect, it } from "vitest";
import type { ItemRecord } from "../../contracts/protocol/schema.ts";
import { type ChaosOutcome, newOutcome } from "../../bench/chaos-client.ts";
import {
  type ChaosLosses,
  type KeyChecks,
  type LedgerEntry,
  type RequestFacts,
  billVerdict,
  billsByOutcome,
  chaosLosses,
  errorsByCode,
  outcomeOf,
} from "../../bench/chaos-ledger.ts";

// $1 per million prompt tokens and $2 per million completion tokens: a token costs 1 or 2
// million pico-dollars.
const PRICE = {
  inputMicrosPerMtok: 1_000_000,
  cachedInputMicrosPerMtok: 0,
  outputMicrosPerMtok: 2_000_000,
};
const cost = (prompt: number, completion: number) =>
  BigInt(prompt) * 1_000_000n + BigInt(completion) * 2_000_000n;
const usage = (prompt: number, completion: number) => ({
  prompt_tokens: prompt,
  completion_tokens: completion,
  total_tokens: prompt + completion,
  cached_tokens: 0,
});
const ended = (
  id: string,
  outcome: "ok" | "error" | "cancelled" | "timeout",
  tokens: [number, number] | null,
): ItemRecord => ({
  id,
  state: "ended",
  outcome,
  usage: tokens === null ? null : usage(...tokens),
});

function seen(extra: Partial<ChaosOutcome> = {}): ChaosOutcome {
  return {
    ...newOutcome("stream", "chaos-1", 1_000),
    status: 200,
    requestId: "req_1",
    complete: true,
    usage: { prompt_tokens: 10, completion_tokens: 20, cached_tokens: 0 },
    endedAt: 2_000,
    ...extra,
  };
}

function entry(costPicos: bigint, extra: Partial<LedgerEntry> = {}): LedgerEntry {
  return {
    status: "settled",
    outcome: "ok",
    model: "m",
    origins: ["eu-1"],
    completionTokens: 20,
    costPicos,
    ...extra,
  };
}

// A complete answer billed exactly, which each case below spoils in one way.
function facts(extra: Partial<RequestFacts> = {}): RequestFacts {
  const record = entry(cost(10, 20));
  return {
    seen: seen(),
    early: record,
    record,
    userRows: null,
    items: [ended("req_1", "ok", [10, 20])],
    originForgot: false,
    crashExposed: false,
    inCrashLeaseWindow: false,
    price: PRICE,
    ...extra,
  };
}

const cut = seen({ complete: false, usage: null, errorEvent: true, eventCode: "origin_error" });
const cancelled = seen({ kind: "cancel", complete: false, usage: null, clientAborted: true });
const refused = seen({ status: 429, requestId: "req_1", complete: false, usage: null });
const failed = seen({ status: 503, code: "no_healthy_origin", complete: false, usage: null });
const noChecks: KeyChecks = {
  slotsRefusedBeforeLeases: 0,
  slotsRefusedAfterLeases: 0,
  rollups: [],
};

describe("the chaos bench's outcomes", () => {
  it("calls each way a request ends by its name", () => {
    expect(outcomeOf(seen())).toBe("complete");
    expect(outcomeOf(cut)).toBe("cut");
    expect(outcomeOf(cancelled)).toBe("cancelled");
    expect(outcomeOf(refused)).toBe("refused");
    expect(outcomeOf(failed)).toBe("failed");
    expect(outcomeOf(seen({ status: null, complete: false, connectionFailed: true }))).toBe(
      "failed",
    );
  });
});

describe("the chaos bench's bill verdicts", () => {
  it("bills a cut stream from what its origin generated, not from what the client saw", () => {
    const items = [ended("req_1", "error", [10, 6])];
    expect(billVerdict(facts({ seen: cut, items, record: entry(cost(10, 6)) }))).toBe("exact");
    expect(billVerdict(facts({ seen: cut, items, record: entry(0n) }))).toBe("unbilled");
    expect(billVerdict(facts({ seen: cut, items, record: entry(cost(10, 3)) }))).toBe("under");
  });

  it("takes the finished attempt of a retried request, else the one that generated most", () => {
    const retried = [ended("req_1", "error", [10, 4]), ended("req_1.1", "ok", [10, 20])];
    expect(billVerdict(facts({ items: retried }))).toBe("exact");
    const neither = [ended("req_1", "error", [10, 9]), ended("req_1.1", "cancelled", [10, 4])];
    const record = entry(cost(10, 9));
    expect(billVerdict(facts({ seen: cancelled, items: neither, record }))).toBe("exact");
    const last = entry(cost(10, 4));
    expect(billVerdict(facts({ seen: cancelled, items: neither, record: last }))).toBe("under");
  });

  it("expects the failed attempt that computed more of its prompt, when two generated alike", () => {
    const cachedSome = ended("req_1.2", "error", [40, 51]);
    const alike = [
      ended("req_1", "error", null),
      { ...cachedSome, usage: { ...usage(40, 51), cached_tokens: 16 } },
      ended("req_1.1", "error", [40, 51]),
    ];
    // Cached prompt tokens cost nothing at PRICE: the attempt with 16 cached bills 16 tokens less.
    const record = entry(cost(40, 51));
    expect(billVerdict(facts({ seen: failed, items: alike, record }))).toBe("exact");
    const cheaper = entry(cost(24, 51));
    expect(billVerdict(facts({ seen: failed, items: alike, record: cheaper }))).toBe("under");
  });

  it("calls a bill twice what was generated double, and a bill for nothing over", () => {
    expect(billVerdict(facts({ record: entry(2n * cost(10, 20)) }))).toBe("double");
    expect(billVerdict(facts({ record: entry(cost(10, 21)) }))).toBe("over");
    const nothing = [ended("req_1", "error", null)];
    expect(billVerdict(facts({ seen: failed, items: nothing, record: entry(1n) }))).toBe("over");
  });

  it("counts a request generated for and refused, or never recorded, as unbilled", () => {
    const items = [ended("req_1", "ok", [10, 20])];
    expect(billVerdict(facts({ seen: refused, items, record: null }))).toBe("unbilled");
  });

  it("leaves unchecked what no origin can tell, and checks an id-less request for doubles only", () => {
    expect(billVerdict(facts({ seen: cut, items: [], originForgot: true }))).toBe("unchecked");
    const noId = { record: undefined, early: undefined, items: null };
    const once = { requests: 1, costPicos: 5n };
    expect(billVerdict(facts({ ...noId, userRows: once }))).toBe("unchecked");
    expect(billVerdict(facts({ ...noId, userRows: { ...once, requests: 2 } }))).toBe("double");
  });
});

describe("the chaos bench's loss columns", () => {
  // One request for each fault, and every key-wide check spoiled once.
  const faulty: [keyof ChaosLosses, RequestFacts][] = [
    [
      "unbilled",
      facts({ seen: cut, items: [ended("req_1", "error", [10, 6])], record: entry(0n) }),
    ],
    ["billed_under", facts({ record: entry(cost(10, 19)) })],
    ["billed_over", facts({ record: entry(cost(10, 21)) })],
    ["billed_double", facts({ record: entry(2n * cost(10, 20)) })],
    ["reservations_open_before_leases", facts({ early: entry(0n, { status: "open" }) })],
    ["reservations_open_after_leases", facts({ record: entry(cost(10, 20), { status: "open" }) })],
    ["expired_without_a_crash", facts({ early: entry(0n, { status: "expired" }) })],
    [
      "refused_for_concurrency_below_limit",
      facts({ seen: { ...refused, concurrencyRefusal: true }, items: [], record: null }),
    ],
    ["cancels_run_to_the_end", facts({ seen: cancelled, items: [ended("req_1", "ok", [10, 20])] })],
    [
      "usage_told_differs",
      facts({ items: [ended("req_1", "ok", [10, 25])], record: entry(cost(10, 25)) }),
    ],
    ["silently_truncated_200s", facts({ seen: seen({ silentlyTruncated: true }) })],
    [
      "cut_recorded_ok",
      facts({ seen: cut, items: [ended("req_1", "error", [10, 6])], record: entry(cost(10, 6)) }),
    ],
    [
      "5xx_undocumented",
      facts({ seen: { ...failed, code: "internal_error" }, items: [], record: null }),
    ],
    [
      "non_openai_error_bodies",
      facts({ seen: { ...failed, badErrorBody: true }, items: [], record: null }),
    ],
  ];
  const spoiled: KeyChecks = {
    slotsRefusedBeforeLeases: 3,
    slotsRefusedAfterLeases: 1,
    rollups: [
      { rollup: { requests: 5, costPicos: 10n }, rows: { requests: 4, costPicos: 10n } },
      { rollup: { requests: 4, costPicos: 2_000_000n }, rows: { requests: 5, costPicos: 0n } },
    ],
  };

  it("are all 0 for requests billed exactly with nothing left behind", () => {
    const { losses } = chaosLosses(
      [facts(), facts({ seen: failed, items: [], record: null })],
      noChecks,
    );
    expect(Object.values(losses).every((n) => n === 0)).toBe(true);
  });

  it.each(faulty)("counts %s when a request shows it", (loss, request) => {
    const { losses, examples } = chaosLosses([facts(), request], noChecks);
    expect(losses[loss]).toBe(1);
    expect(examples[loss]?.[0]).toBe(request);
  });

  it("can show every loss column above zero", () => {
    const { losses } = chaosLosses(
      faulty.map(([, request]) => request),
      spoiled,
    );
    const zero = Object.entries(losses).filter(([, n]) => n <= 0);
    expect(zero).toEqual([]);
    expect(losses.rollup_requests_over_rows).toBe(1);
    expect(losses.rollup_requests_under_rows).toBe(1);
    expect(losses.rollup_cost_off_rows_usd).toBe(2e-6);
  });

  it("does not count an expired row of a request the edge's crash cut, nor its slot refusal", () => {
    const crashed = facts({
      seen: { ...refused, concurrencyRefusal: true },
      early: entry(0n, { status: "expired" }),
      record: null,
      items: [],
      crashExposed: true,
      inCrashLeaseWindow: true,
    });
    const { losses } = chaosLosses([crashed], noChecks);
    expect(losses.expired_without_a_crash).toBe(0);
    expect(losses.refused_for_concurrency_below_limit).toBe(0);
  });
});

describe("the chaos bench's bills table", () => {
  it("puts every request under how it ended, with the tokens billed to nobody", () => {
    const rows = billsByOutcome([
      facts(),
      facts({ seen: cut, items: [ended("req_1", "error", [10, 6])], record: entry(0n) }),
      facts({ seen: failed, items: [ended("req_1", "ok", [10, 30])], record: entry(cost(10, 30)) }),
    ]);
    const byName = Object.fromEntries(rows.map((r) => [r.outcome, r]));
    expect(byName["complete"]).toMatchObject({ sent: 1, exact: 1, generatedTokens: 20 });
    expect(byName["cut"]).toMatchObject({ sent: 1, unbilled: 1, unbilledTokens: 6 });
    expect(byName["failed"]).toMatchObject({ sent: 1, exact: 1, generatedTokens: 30 });
    expect(byName["refused"]).toMatchObject({ sent: 0 });
  });

  it("counts 5xx answers and error events by code, the documented ones always shown", () => {
    const { answers, events } = errorsByCode([failed, cut, { ...failed, code: "server_error" }]);
    expect(answers).toEqual({
      origin_error: 0,
      no_healthy_origin: 1,
      origin_timeout: 0,
      server_error: 1,
    });
    expect(events).toMatchObject({ origin_error: 1, no_healthy_origin: 0 });
  });
});

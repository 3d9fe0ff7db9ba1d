import { describe, expect, it } from "vitest";
import { inject } from "vitest";
import { chatBody, edgeRequest, metricValue } from "../../support/edge-requests.ts";
import { adminRequest, sendWith } from "../../support/test-origins.workers.ts";

// The shared configuration with a small body limit, so that a 413 is cheap to provoke.
const CONFIG = JSON.stringify({
  ...(JSON.parse(inject("warmgateConfig")) as Record<string, unknown>),
  limits: { max_body_bytes: 4096, first_byte_timeout_ms: 3000, retry_budget: 2 },
});

const FORGED_KEY = "wg_forgedkeyid000_thisisnotarealsecretatallxxxxxxxxx";

async function answersText(): Promise<string> {
  const res = await sendWith(CONFIG, adminRequest("/metrics"));
  expect(res.status).toBe(200);
  return res.text();
}

function answered(text: string, statusClass: string, code: string): number {
  return metricValue(
    text,
    "warmgate_responses_total",
    `route="v1",status_class="${statusClass}",code="${code}"`,
  );
}

async function codeOf(res: Response): Promise<string> {
  const body = await res.json<{ error: { code: string | null } }>();
  return body.error.code ?? "none";
}

/** Sends the refusals an operator sees from outside; answers each one's status and code. */
async function refusals(): Promise<{ status: number; code: string }[]> {
  const requests = [
    ...Array.from({ length: 3 }, () =>
      edgeRequest("/v1/chat/completions", {
        body: chatBody(),
        headers: { authorization: `Bearer ${FORGED_KEY}` },
      }),
    ),
    edgeRequest("/v1/chat/completions", { text: "{not json" }),
    edgeRequest("/v1/chat/completions", { body: chatBody({ model: "no-such-model" }) }),
    edgeRequest("/v1/chat/completions", { body: chatBody({ max_tokens: 100_000 }) }),
    edgeRequest("/v1/chat/completions", {
      body: chatBody({ messages: [{ role: "user", content: "x".repeat(8192) }] }),
    }),
  ];
  const seen: { status: number; code: string }[] = [];
  for (const request of requests) {
    const res = await sendWith(CONFIG, request);
    seen.push({ status: res.status, code: await codeOf(res) });
  }
  return seen;
}

interface StatsView {
  totals: { requests: number; errors: number };
  recent_errors: { code: string | null; status: number; path: string | null }[];
}

async function stats(): Promise<StatsView> {
  const res = await sendWith(CONFIG, adminRequest("/admin/stats"));
  expect(res.status).toBe(200);
  return res.json<StatsView>();
}

function order(a: string | null, b: string | null): number {
  return String(a).localeCompare(String(b));
}

describe("every answer counted", () => {
  it("counts refusals made before any key's account, by status class and code", async () => {
    const before = await answersText();
    const seen = await refusals();
    expect(seen.map((s) => s.status)).toEqual([401, 401, 401, 400, 404, 400, 413]);
    const after = await answersText();
    const sent = new Map<string, number>();
    for (const { status, code } of seen) {
      const slot = `${Math.floor(status / 100)}xx ${code}`;
      sent.set(slot, (sent.get(slot) ?? 0) + 1);
    }
    for (const [slot, count] of sent) {
      const [statusClass = "", code = ""] = slot.split(" ");
      expect(answered(after, statusClass, code) - answered(before, statusClass, code)).toBe(count);
    }
    expect(answered(after, "4xx", "invalid_api_key")).toBeGreaterThanOrEqual(3);
  });

  it("puts them in the dashboard's error tile and recent errors, with their codes", async () => {
    const before = await stats();
    const seen = await refusals();
    const after = await stats();
    expect(after.totals.errors - before.totals.errors).toBe(seen.length);
    expect(after.totals.requests - before.totals.requests).toBe(seen.length);
    const codes = after.recent_errors.slice(0, seen.length).map((e) => e.code);
    const sent = seen.map((s) => (s.code === "none" ? null : s.code));
    expect(codes.sort(order)).toEqual(sent.sort(order));
    expect(after.recent_errors[0]?.path).toBe("POST /v1/chat/completions");
  });

  it("counts an origin's own error answer under the origin's code", async () => {
    const before = await answersText();
    const res = await sendWith(
      CONFIG,
      edgeRequest("/v1/completions", {
        body: { model: "warmgate-sim-8b", prompt: "", max_tokens: 4 },
      }),
    );
    expect(res.status).toBe(400);
    const code = await codeOf(res);
    expect(code).toBe("invalid_value");
    const after = await answersText();
    expect(answered(after, "4xx", code) - answered(before, "4xx", code)).toBe(1);
  });

  it("counts answers served too, and admin answers apart", async () => {
    const before = await answersText();
    const res = await sendWith(CONFIG, edgeRequest("/v1/chat/completions", { body: chatBody() }));
    expect(res.status).toBe(200);
    const after = await answersText();
    expect(answered(after, "2xx", "none") - answered(before, "2xx", "none")).toBe(1);
    expect(
      metricValue(
        after,
        "warmgate_responses_total",
        `route="admin",status_class="2xx",code="none"`,
      ),
    ).toBeGreaterThanOrEqual(1);
  });
});

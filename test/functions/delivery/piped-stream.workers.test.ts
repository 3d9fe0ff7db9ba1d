import { afterEach, describe, expect, it } from "vitest";
import type { OutcomesResponse } from "../../../contracts/protocol/schema.ts";
import { PIPED_MIN_TOKENS } from "../../../contracts/delivery.ts";
import { metricValue, usdPicos } from "../../support/edge-requests.ts";
import { createKey } from "../../support/admin-keys.workers.ts";
import {
  METER,
  METER_SLOW,
  SMALL,
  type RequestRecord,
  type Usage,
  chat,
  costOf,
  get,
  pricedConfig,
  send,
} from "../../support/metering.workers.ts";

// A stream sent straight to an origin that may run past PIPED_MIN_TOKENS is piped raw: the
// runtime hands the origin's bytes to the client, and the item's END is its origin's
// outcome record (docs/edge.md, "Delivery"). Batching off, so every request goes straight.
const config = pricedConfig({ batching: false });

afterEach(async () => {
  await fetch(`${METER}/admin/faults`, { method: "DELETE" }).then((r) => r.arrayBuffer());
});

const rawBatches = async (url: string) =>
  metricValue(await (await fetch(`${url}/metrics`)).text(), "warmgate_origin_raw_batches_total");
const outcomeLookups = async (url: string) =>
  metricValue(
    await (await fetch(`${url}/metrics`)).text(),
    "warmgate_origin_outcome_lookups_total",
  );

async function originRecord(url: string, id: string) {
  const response = await fetch(`${url}/v1/batch/outcomes`, {
    method: "POST",
    body: JSON.stringify({ ids: [id] }),
  });
  return (await response.json<OutcomesResponse>()).items.find((item) => item.id === id);
}

async function recordOf(key: string, requestId: string): Promise<RequestRecord> {
  const { body } = await send(config, get(key, `/v1/usage/requests/${requestId}`), (r) => r.json());
  return body as RequestRecord;
}

const usageIn = (text: string) =>
  text
    .split("\n\n")
    .map((event) => event.replace(/^data: /, ""))
    .filter((data) => data.startsWith("{"))
    .map((data) => JSON.parse(data) as { usage?: Usage | null })
    .find((chunk) => chunk.usage)?.usage;

describe("a stream straight to an origin that may run long", () => {
  it("is piped raw and billed from its origin's record, what the stream reported", async () => {
    const { key } = await createKey({ name: "piped" });
    const before = await rawBatches(METER);
    const body = { stream: true, stream_options: { include_usage: true }, max_tokens: 64 };
    const { response, body: text } = await send(config, chat(key, body), (r) => r.text());
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toContain("text/event-stream");
    expect(await rawBatches(METER)).toBe(before + 1);
    expect(text).toContain("data: [DONE]");
    const usage = usageIn(text as string);
    expect(usage?.completion_tokens).toBe(64);
    const requestId = response.headers.get("x-request-id") ?? "";
    const record = await recordOf(key, requestId);
    expect(record).toMatchObject({ status: "settled", outcome: "ok", completion_tokens: 64 });
    expect(usdPicos(record.cost_usd)).toBe(costOf(usage as Usage, SMALL));
  });

  it("bills each of several streams ending together from its own record, each asked once at most", async () => {
    const { key } = await createKey({ name: "piped-together" });
    const before = await outcomeLookups(METER);
    const body = { stream: true, stream_options: { include_usage: true } };
    const answers = await Promise.all(
      [16, 24, 40, 64].map((tokens) =>
        send(config, chat(key, { ...body, max_tokens: tokens }), (r) => r.text()),
      ),
    );
    for (const [i, tokens] of [16, 24, 40, 64].entries()) {
      const { response, body: text } = answers[i]!;
      const usage = usageIn(text as string);
      expect(usage?.completion_tokens).toBe(tokens);
      const record = await recordOf(key, response.headers.get("x-request-id") ?? "");
      expect(record).toMatchObject({ status: "settled", outcome: "ok", completion_tokens: tokens });
      expect(usdPicos(record.cost_usd)).toBe(costOf(usage as Usage, SMALL));
    }
    // Asked together when they end within the gathering wait of each other, never twice.
    const lookups = (await outcomeLookups(METER)) - before;
    expect(lookups).toBeGreaterThanOrEqual(1);
    expect(lookups).toBeLessThanOrEqual(4);
  });

  it(`stays framed when it can end before ${PIPED_MIN_TOKENS} tokens`, async () => {
    const { key } = await createKey({ name: "framed" });
    const before = await rawBatches(METER);
    const body = { stream: true, max_tokens: PIPED_MIN_TOKENS - 1 };
    const { response } = await send(config, chat(key, body), (r) => r.text());
    expect(response.status).toBe(200);
    expect(await rawBatches(METER)).toBe(before);
  });

  it("ends with the origin_error event when its origin cuts it, billed for what it generated", async () => {
    const { key } = await createKey({ name: "piped-cut" });
    await fetch(`${METER}/admin/faults`, {
      method: "PUT",
      body: JSON.stringify({ dropAfterTokens: 5, dropRate: 1 }),
    }).then((r) => r.arrayBuffer());
    const { response, body: text } = await send(
      config,
      chat(key, { stream: true, max_tokens: 64 }),
      (r) => r.text(),
    );
    expect(response.status).toBe(200);
    // Its events as the origin sent them, then the error event, and no [DONE].
    const events = (text as string).split("\n\n").filter((event) => event !== "");
    expect(events.length).toBeGreaterThan(1);
    expect(JSON.parse(events.at(-1)?.replace(/^data: /, "") ?? "")).toMatchObject({
      error: { type: "server_error", code: "origin_error" },
    });
    expect(text).not.toContain("[DONE]");
    const requestId = response.headers.get("x-request-id") ?? "";
    const generated = await originRecord(METER, requestId);
    expect(generated).toMatchObject({ state: "ended", outcome: "error" });
    const billed = await recordOf(key, requestId);
    expect(billed).toMatchObject({ status: "settled", outcome: "error" });
    expect(billed.completion_tokens).toBe(
      generated?.state === "ended" ? generated.usage?.completion_tokens : -1,
    );
  });

  it("is cut at the request's timeout with the timeout event, billed for what it generated", async () => {
    const { key } = await createKey({ name: "piped-timeout" });
    const short = JSON.stringify({
      ...JSON.parse(config),
      limits: { first_byte_timeout_ms: 3_000, request_timeout_ms: 400, retry_budget: 1 },
    });
    const before = await rawBatches(METER_SLOW);
    const { response, body: text } = await send(
      short,
      chat(key, { stream: true, max_tokens: 4_000 }, "metering-slow"),
      (r) => r.text(),
    );
    expect(response.status).toBe(200);
    expect(await rawBatches(METER_SLOW)).toBe(before + 1);
    const last =
      (text as string)
        .trim()
        .split("\n\n")
        .at(-1)
        ?.replace(/^data: /, "") ?? "";
    expect(JSON.parse(last)).toMatchObject({ error: { code: "origin_timeout" } });
    const requestId = response.headers.get("x-request-id") ?? "";
    const { body } = await send(short, get(key, `/v1/usage/requests/${requestId}`), (r) =>
      r.json(),
    );
    const billed = body as RequestRecord;
    expect(billed).toMatchObject({ status: "settled", outcome: "timeout" });
    expect(billed.completion_tokens).toBeGreaterThan(0);
    expect(billed.completion_tokens).toBeLessThan(4_000);
  });
});

import { describe, expect, it, vi } from "vitest";
import { REFUSAL_HOLD_MS } from "../../../durable-objects/key-account/store/metrics.ts";
import parsePrometheus from "parse-prometheus-text-format";
import { createKey } from "../../support/admin-keys.workers.ts";
import { chatBody, edgeRequest } from "../../support/edge-requests.ts";
import { adminRequest, originUrl, sendWith } from "../../support/test-origins.workers.ts";

// One file, one storage: the keys made here are the only ones the scrape reads.
const PRICE = { input_per_mtok: 0.1, cached_input_per_mtok: 0.025, output_per_mtok: 0.4 };
const CONFIG = JSON.stringify({
  models: [{ id: "warmgate-sim-8b", max_model_len: 32768, pricing: PRICE }],
  regions: [{ id: "metering", origins: [{ id: "meter-1", url: originUrl("meter-1") }] }],
  default_region: "metering",
  batching: { idle_bypass_ms: 0 },
});

interface Family {
  name: string;
  type: string;
  metrics: {
    labels?: Record<string, string>;
    value?: string;
    buckets?: Record<string, string>;
    count?: string;
    sum?: string;
  }[];
}

async function scrape(): Promise<{ families: Map<string, Family>; text: string }> {
  const res = await sendWith(CONFIG, adminRequest("/metrics"));
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toContain("text/plain; version=0.0.4");
  const text = await res.text();
  const families = parsePrometheus(text) as Family[];
  return { families: new Map(families.map((f) => [f.name, f])), text };
}

/**
 * A histogram's observations, summed over its series' `_count` lines matching `labels`
 * (the parser flattens labelled histograms into one, so their series are read here).
 */
function observations(text: string, name: string, labels: Record<string, string> = {}): number {
  return text
    .split("\n")
    .filter((line) => line.startsWith(`${name}_count`))
    .filter((line) => Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`)))
    .reduce((sum, line) => sum + Number(line.split(" ").at(-1)), 0);
}

function total(family: Family | undefined, where: Record<string, string> = {}): number {
  return (family?.metrics ?? [])
    .filter((m) => Object.entries(where).every(([k, v]) => m.labels?.[k] === v))
    .reduce((sum, m) => sum + Number(m.value ?? m.count ?? 0), 0);
}

describe("GET /metrics", () => {
  it("is the admin's only", async () => {
    const res = await sendWith(CONFIG, new Request("https://edge.test/metrics"));
    expect(res.status).toBe(401);
  });

  it("counts every request sent, by status class, with latency, TTFT, spend and batches", async () => {
    const { key } = await createKey({ name: "scraped", limits: { rpm: 9 } });
    const auth = { authorization: `Bearer ${key}` };
    const sent = { ok: 0, streamed: 0, refused: 0 };
    for (let i = 0; i < 4; i++) {
      const res = await sendWith(
        CONFIG,
        edgeRequest("/v1/chat/completions", { body: chatBody(), headers: auth }),
      );
      expect(res.status).toBe(200);
      sent.ok++;
    }
    for (let i = 0; i < 3; i++) {
      const body = chatBody({ stream: true });
      const res = await sendWith(
        CONFIG,
        edgeRequest("/v1/chat/completions", { body, headers: auth }),
      );
      expect(res.status).toBe(200);
      sent.ok++;
      sent.streamed++;
    }
    const responses = await sendWith(
      CONFIG,
      edgeRequest("/v1/responses", {
        body: { model: "warmgate-sim-8b", input: "Hi", max_output_tokens: 4 },
        headers: auth,
      }),
    );
    expect(responses.status).toBe(200);
    sent.ok++;
    // The key allows 9 a minute: the next two are refused by its account.
    for (let i = 0; i < 3; i++) {
      const res = await sendWith(
        CONFIG,
        edgeRequest("/v1/chat/completions", { body: chatBody(), headers: auth }),
      );
      if (res.status === 429) sent.refused++;
      else sent.ok++;
    }
    expect(sent.refused).toBeGreaterThan(0);

    // A refusal is counted once its request is no longer asked about (docs/metrics.md).
    const { families, text } = await vi.waitFor(
      async () => {
        const scraped = await scrape();
        const counted = total(scraped.families.get("warmgate_requests_total"));
        expect(counted).toBe(sent.ok + sent.refused);
        return scraped;
      },
      { timeout: 2 * REFUSAL_HOLD_MS, interval: 250 },
    );
    const requests = families.get("warmgate_requests_total");
    expect(requests?.type).toBe("COUNTER");
    expect(total(requests)).toBe(sent.ok + sent.refused);
    expect(
      total(requests, {
        status_class: "2xx",
        region: "metering",
        model: "warmgate-sim-8b",
        tier: "standard",
      }),
    ).toBe(sent.ok);
    expect(total(requests, { status_class: "4xx", region: "none" })).toBe(sent.refused);
    const duration = families.get("warmgate_request_duration_seconds");
    expect(duration?.type).toBe("HISTOGRAM");
    expect(observations(text, "warmgate_request_duration_seconds", { region: "metering" })).toBe(
      sent.ok,
    );
    expect(families.get("warmgate_time_to_first_token_seconds")?.type).toBe("HISTOGRAM");
    expect(observations(text, "warmgate_time_to_first_token_seconds")).toBe(sent.streamed);
    expect(total(families.get("warmgate_spend_usd_total"))).toBeGreaterThan(0);
    expect(total(families.get("warmgate_tokens_total"), { kind: "completion" })).toBeGreaterThan(0);
    expect(total(families.get("warmgate_key_requests_total"), { name: "scraped" })).toBe(
      sent.ok + sent.refused,
    );
    expect(total(families.get("warmgate_upstream_attempts_total"))).toBe(sent.ok);
    expect(observations(text, "warmgate_batch_size")).toBeGreaterThan(0);
    expect(observations(text, "warmgate_queue_wait_seconds")).toBe(sent.ok);
    expect(families.get("warmgate_breaker_state")?.metrics.length).toBeGreaterThan(0);
    expect(
      total(families.get("warmgate_origin_running"), { origin: "meter-1" }),
    ).toBeGreaterThanOrEqual(0);
  });

  it("gives the dashboard its view as JSON", async () => {
    const res = await sendWith(CONFIG, adminRequest("/admin/stats"));
    expect(res.status).toBe(200);
    const view = await res.json<{
      totals: { requests: number };
      regions: { id: string; origins: { id: string; breaker: string }[] }[];
      latency: { count: number };
      top_keys: { name: string }[];
      recent_errors: { status: number }[];
    }>();
    expect(view.regions).toEqual([
      { id: "metering", origins: [expect.objectContaining({ id: "meter-1", breaker: "closed" })] },
    ]);
    expect(view.totals.requests).toBeGreaterThan(0);
    expect(view.top_keys[0]?.name).toBe("scraped");
    expect(view.recent_errors.some((e) => e.status === 429)).toBe(true);
  });
});

describe("Workers Analytics Engine events", () => {
  it("writes one event per settled request when the binding is configured, with no key or prompt", async () => {
    const { id, key } = await createKey({ name: "analytics" });
    const points: AnalyticsEngineDataPoint[] = [];
    const dataset = {
      writeDataPoint: (point?: AnalyticsEngineDataPoint) => point && points.push(point),
    };
    const prompt = "A prompt that must never reach the analytics dataset.";
    const body = chatBody({ messages: [{ role: "user", content: prompt }] });
    const res = await sendWith(
      CONFIG,
      edgeRequest("/v1/chat/completions", { body, headers: { authorization: `Bearer ${key}` } }),
      { ANALYTICS: dataset as unknown as string },
    );
    expect(res.status).toBe(200);
    expect(points).toHaveLength(1);
    expect(points[0]).toMatchObject({
      indexes: [id],
      blobs: ["warmgate-sim-8b", "metering", "2xx", "standard", "ok", "meter-1"],
    });
    expect(points[0]?.doubles?.[0]).toBeGreaterThanOrEqual(0);
    const text = JSON.stringify(points);
    expect(text).not.toContain(key);
    expect(text).not.toContain(prompt);
  });
});

describe("the dashboard's page", () => {
  it("is served at / with its scripts, under a policy that allows only its own", async () => {
    const page = await sendWith(CONFIG, new Request("https://edge.test/"));
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toContain("text/html");
    expect(page.headers.get("content-security-policy")).toContain("script-src 'self'");
    const html = await page.text();
    expect(html).toContain('<script type="module" src="/app.js"></script>');
    const modules = [
      ...(await (await sendWith(CONFIG, new Request("https://edge.test/app.js"))).text()).matchAll(
        /from "\.(\/[a-z-]+\.js)"/g,
      ),
    ].map((m) => m[1] ?? "");
    expect(modules).toContain("/keys.js");
    for (const path of [
      "/app.js",
      ...modules,
      "/style.css",
      "/vendor/uPlot.iife.min.js",
      "/vendor/uPlot.min.css",
    ]) {
      const res = await sendWith(CONFIG, new Request(`https://edge.test${path}`));
      expect([path, res.status]).toEqual([path, 200]);
      expect((await res.text()).length).toBeGreaterThan(100);
    }
  });
});

/**
 * The metering origins (meter-1, meter-slow-1) behind a priced config, and requests that
 * wait for their settlement, for the billing tests (docs/key-account.md).
 */
import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { inject } from "vitest";
import { costPicos } from "../../contracts/pricing.ts";
import app from "../../functions/index.ts";
import { ModelPricingSchema } from "../../contracts/config/models.ts";
import { chatBody, edgeRequest } from "./edge-requests.ts";

function originUrl(id: string): string {
  const origin = inject("testOrigins").find((o) => o.id === id);
  if (origin === undefined) throw new Error(`${id} is not running`);
  return origin.url;
}
export const METER = originUrl("meter-1");
export const METER_SLOW = originUrl("meter-slow-1");

export const SMALL = { input_per_mtok: 0.1, cached_input_per_mtok: 0.025, output_per_mtok: 0.4 };
export const LARGE = { input_per_mtok: 0.6, cached_input_per_mtok: 0.15, output_per_mtok: 2.4 };

/**
 * A config over the metering origins with prices and aliases; `batching` as given
 * (`"always"`: every request goes through the batcher, no idle bypass).
 */
export function pricedConfig(
  options: { batching?: boolean | "always"; deadLarge?: boolean } = {},
): string {
  return JSON.stringify({
    models: [
      { id: "warmgate-sim-8b", max_model_len: 32768, pricing: SMALL },
      { id: "warmgate-sim-70b", max_model_len: 8192, pricing: LARGE },
    ],
    aliases: {
      fast: ["warmgate-sim-8b", "warmgate-sim-70b"],
      best: ["warmgate-sim-70b", "warmgate-sim-8b"],
    },
    regions: [
      {
        id: "metering",
        origins: options.deadLarge
          ? [
              // The large model's only origin is gone; the small one's is fine.
              { id: "meter-gone", url: "http://127.0.0.1:9", models: ["warmgate-sim-70b"] },
              { id: "meter-1", url: METER, models: ["warmgate-sim-8b"] },
            ]
          : [{ id: "meter-1", url: METER }],
      },
      {
        id: "metering-slow",
        origins: [
          {
            id: "meter-slow-1",
            url: METER_SLOW,
            ...(options.deadLarge ? { models: ["warmgate-sim-8b"] } : {}),
          },
        ],
      },
    ],
    default_region: "metering",
    limits: { first_byte_timeout_ms: 3_000, request_timeout_ms: 60_000, retry_budget: 1 },
    batching:
      options.batching === "always" ? { idle_bypass_ms: 0 } : { enabled: options.batching ?? true },
  });
}

/** Runs one request against the edge with `config` and waits for its settlement. */
export async function send(
  config: string,
  request: Request,
  read: (response: Response) => Promise<unknown> = (r) => r.arrayBuffer(),
): Promise<{ response: Response; body: unknown }> {
  const ctx = createExecutionContext();
  const response = await app.fetch(request, { ...env, WARMGATE_CONFIG: config }, ctx);
  const body = await read(response);
  await waitOnExecutionContext(ctx);
  return { response, body };
}

export function chat(
  key: string,
  body: Record<string, unknown> = {},
  region = "metering",
): Request {
  return edgeRequest("/v1/chat/completions", {
    body: chatBody(body),
    headers: { authorization: `Bearer ${key}` },
    region,
  });
}

export function get(key: string, path: string): Request {
  return edgeRequest(path, { headers: { authorization: `Bearer ${key}` } });
}

export type Usage = {
  prompt_tokens: number;
  completion_tokens: number;
  prompt_tokens_details?: { cached_tokens?: number };
};

export function costOf(usage: Usage, pricing: typeof SMALL): bigint {
  return costPicos(
    {
      promptTokens: usage.prompt_tokens,
      cachedTokens: usage.prompt_tokens_details?.cached_tokens ?? 0,
      completionTokens: usage.completion_tokens,
    },
    ModelPricingSchema.parse(pricing),
  );
}

export type RequestRecord = {
  id: string;
  model: string;
  status: string;
  outcome: string | null;
  prompt_tokens: number | null;
  cached_tokens: number | null;
  completion_tokens: number | null;
  cost_usd: number;
};

import { abortAllDurableObjects } from "cloudflare:test";
import { afterEach, describe, expect, it } from "vitest";
import { INDEX_SAVE_MS } from "../../../durable-objects/batcher/routing/index-store.ts";
import { createKey } from "../../support/admin-keys.workers.ts";
import { type ErrorBody, edgeRequest } from "../../support/edge-requests.ts";
import {
  adminRequest,
  originUrl,
  sendWith,
  setFaults,
} from "../../support/test-origins.workers.ts";

// route-1, route-2 and route-3 are this file's alone; each test names them afresh, so each
// has Batchers (and indexes) of its own, while the engines' caches carry on.

const MODEL = "warmgate-sim-8b";
const PHYSICAL = ["route-1", "route-2", "route-3"];

function configOf(tag: string, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({
    models: [{ id: MODEL, max_model_len: 32768 }],
    regions: [
      {
        id: `routing-${tag}`,
        origins: PHYSICAL.map((id) => ({ id: `${id}@${tag}`, url: originUrl(id) })),
      },
    ],
    default_region: `routing-${tag}`,
    limits: { first_byte_timeout_ms: 5_000, retry_budget: 2 },
    breakers: { enabled: false },
    ...extra,
  });
}

const system = (tag: string, n: number) =>
  `You are agent ${n} of team ${tag}. Answer in the house style, briefly. `.repeat(40);

function ask(tag: string, n: number, question: string, headers: Record<string, string> = {}) {
  return edgeRequest("/v1/chat/completions", {
    headers,
    body: {
      model: MODEL,
      max_tokens: 3,
      messages: [
        { role: "system", content: system(tag, n) },
        { role: "user", content: question },
      ],
    },
  });
}

interface Answer {
  usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens?: number } };
}

/**
 * Three rounds of questions to `groups` groups of one long prompt each: every group must
 * keep to one origin; the prompt and cached tokens of the warm rounds are summed.
 */
async function rounds(
  groups: number,
  send: (
    group: number,
    question: string,
  ) => Promise<{ res: Response; prompt: number; cached: number }>,
): Promise<{ homes: Map<number, string>; prompt: number; cached: number }> {
  const homes = new Map<number, string>();
  let prompt = 0;
  let cached = 0;
  for (const question of ["Hello?", "What is due?", "Refund please."]) {
    for (let n = 0; n < groups; n++) {
      const answer = await send(n, question);
      expect(answer.res.status).toBe(200);
      const origin = answer.res.headers.get("x-warmgate-origin") ?? "";
      expect(homes.get(n) ?? origin).toBe(origin);
      homes.set(n, origin);
      if (question !== "Hello?") {
        prompt += answer.prompt;
        cached += answer.cached;
      }
    }
  }
  return { homes, prompt, cached };
}

afterEach(async () => {
  for (const id of PHYSICAL) await setFaults(id, null);
});

describe("KV-cache-aware routing", () => {
  it("keeps Responses API requests with the same instructions on their warm origin", async () => {
    const tag = crypto.randomUUID().slice(0, 6);
    const config = configOf(tag);
    const { prompt, cached } = await rounds(6, async (n, question) => {
      const body = {
        model: MODEL,
        max_output_tokens: 3,
        instructions: system(tag, n),
        input: question,
      };
      const res = await sendWith(config, edgeRequest("/v1/responses", { body }));
      const { usage } = await res.json<{
        usage: { input_tokens: number; input_tokens_details: { cached_tokens: number } };
      }>();
      return { res, prompt: usage.input_tokens, cached: usage.input_tokens_details.cached_tokens };
    });
    expect(cached / prompt).toBeGreaterThan(0.9);
  });

  it("sends prompts that share a long system prompt to the origin that prefilled it", async () => {
    const tag = crypto.randomUUID().slice(0, 6);
    const config = configOf(tag);
    const { homes, prompt, cached } = await rounds(9, async (n, question) => {
      const res = await sendWith(config, ask(tag, n, question));
      const { usage } = await res.json<Answer>();
      return {
        res,
        prompt: usage.prompt_tokens,
        cached: usage.prompt_tokens_details?.cached_tokens ?? 0,
      };
    });
    // Cold prompts spread over the origins; warm ones were almost all served from cache.
    expect(new Set(homes.values()).size).toBeGreaterThan(1);
    expect(cached / prompt).toBeGreaterThan(0.9);

    const view = await sendWith(config, adminRequest(`/admin/batchers/routing-${tag}/${MODEL}`));
    expect(view.status).toBe(200);
    const { routing } = await view.json<{
      routing: {
        placements: Record<string, number>;
        hit_rate: { predicted: number; reported: number };
        origins: Record<string, { blocks: number }>;
      };
    }>();
    expect(routing.placements.cache_hit).toBe(18);
    expect(routing.placements.cold).toBe(9);
    expect(routing.hit_rate.reported).toBeGreaterThan(0.5);
    expect(routing.hit_rate.predicted).toBeGreaterThan(0.5);
    const held = Object.values(routing.origins).map((origin) => origin.blocks);
    expect(held.filter((blocks) => blocks > 0).length).toBeGreaterThan(1);
  });

  it("keeps a session on one origin while its history grows", async () => {
    const tag = crypto.randomUUID().slice(0, 6);
    const config = configOf(tag);
    const messages: { role: string; content: string }[] = [
      { role: "system", content: system(tag, 1) },
    ];
    const served = new Set<string>();
    for (let turn = 0; turn < 4; turn++) {
      messages.push({ role: "user", content: `Question ${turn}: what next?` });
      const res = await sendWith(
        config,
        edgeRequest("/v1/chat/completions", {
          body: { model: MODEL, max_tokens: 3, messages, user: "alice" },
        }),
      );
      expect(res.status).toBe(200);
      served.add(res.headers.get("x-warmgate-origin") ?? "");
      const answer = await res.json<{ choices: { message: { content: string } }[] }>();
      messages.push({ role: "assistant", content: answer.choices[0]?.message.content ?? "" });
    }
    expect(served.size).toBe(1);
  });

  it("sends no traffic to a warm origin that just failed", async () => {
    const tag = crypto.randomUUID().slice(0, 6);
    const config = configOf(tag);
    const first = await sendWith(config, ask(tag, 0, "Hello?"));
    const home = first.headers.get("x-warmgate-origin") ?? "";
    await setFaults(home.split("@")[0] ?? "", { errorRate: 1, errorStatuses: [500] });
    const retried = await sendWith(config, ask(tag, 0, "Again?"));
    expect(retried.status).toBe(200);
    expect(retried.headers.get("x-warmgate-attempts")).toBe("2");
    // Quarantined now: the next request of that prefix goes elsewhere at once.
    const next = await sendWith(config, ask(tag, 0, "Once more?"));
    expect(next.status).toBe(200);
    expect(next.headers.get("x-warmgate-origin")).not.toBe(home);
    expect(next.headers.get("x-warmgate-attempts")).toBe("1");
  });

  it("honours x-warmgate-origin only for a key that may choose its region", async () => {
    const tag = crypto.randomUUID().slice(0, 6);
    const config = configOf(tag);
    const origin = `route-3@${tag}`;
    const allowed = await createKey({ name: "may-pin" });
    for (let i = 0; i < 3; i++) {
      const res = await sendWith(
        config,
        ask(tag, i, "Q", { authorization: `Bearer ${allowed.key}`, "x-warmgate-origin": origin }),
      );
      expect(res.status).toBe(200);
      expect(res.headers.get("x-warmgate-origin")).toBe(origin);
    }
    const refusedKey = await createKey({ name: "may-not-pin", allow_region_override: false });
    const refused = await sendWith(
      config,
      ask(tag, 0, "Q", { authorization: `Bearer ${refusedKey.key}`, "x-warmgate-origin": origin }),
    );
    expect(refused.status).toBe(403);
    expect((await refused.json<ErrorBody>()).error).toMatchObject({
      type: "permission_error",
      code: "origin_override_not_allowed",
      param: "x-warmgate-origin",
    });
    const unknown = await sendWith(
      config,
      ask(tag, 0, "Q", { authorization: `Bearer ${allowed.key}`, "x-warmgate-origin": "nowhere" }),
    );
    expect(unknown.status).toBe(400);
    expect((await unknown.json<ErrorBody>()).error.code).toBe("invalid_origin");
  });

  it("keeps a pinned request on its origin, batched or not, and refuses it while that one is out", async () => {
    for (const batching of [{ enabled: false }, { enabled: true }]) {
      const tag = crypto.randomUUID().slice(0, 6);
      const config = configOf(tag, { batching, breakers: { enabled: true } });
      const pinned = `route-2@${tag}`;
      const { key } = await createKey({ name: "pin-strict" });
      const headers = { authorization: `Bearer ${key}`, "x-warmgate-origin": pinned };
      for (let i = 0; i < 3; i++) {
        const res = await sendWith(config, ask(tag, i, "Q", headers));
        expect(res.status).toBe(200);
        expect(res.headers.get("x-warmgate-origin")).toBe(pinned);
      }
      const forced = await sendWith(
        config,
        adminRequest(`/admin/breakers/${pinned}`, { state: "open" }),
      );
      expect(forced.status).toBe(200);
      const refused = await sendWith(config, ask(tag, 0, "Q", headers));
      expect(refused.status).toBe(503);
      expect(Number(refused.headers.get("retry-after-ms"))).toBeGreaterThan(0);
      expect((await refused.json<ErrorBody>()).error.code).toBe("no_healthy_origin");
      // Unpinned, the region's other origins serve.
      const unpinned = await sendWith(config, ask(tag, 0, "Q", { authorization: `Bearer ${key}` }));
      expect(unpinned.status).toBe(200);
      expect(unpinned.headers.get("x-warmgate-origin")).not.toBe(pinned);
    }
  });

  it("sends x-warmgate-origin to its own region, and refuses it beside another region", async () => {
    const tag = crypto.randomUUID().slice(0, 6);
    const config = JSON.stringify({
      ...JSON.parse(configOf(tag)),
      regions: [
        { id: `near-${tag}`, origins: [{ id: `route-1@${tag}`, url: originUrl("route-1") }] },
        { id: `far-${tag}`, origins: [{ id: `route-2@${tag}`, url: originUrl("route-2") }] },
      ],
      default_region: `near-${tag}`,
    });
    const allowed = await createKey({ name: "may-pin-far" });
    const auth = { authorization: `Bearer ${allowed.key}` };
    const far = await sendWith(
      config,
      ask(tag, 0, "Q", { ...auth, "x-warmgate-origin": `route-2@${tag}` }),
    );
    expect(far.status).toBe(200);
    expect(far.headers.get("x-warmgate-region")).toBe(`far-${tag}`);
    expect(far.headers.get("x-warmgate-origin")).toBe(`route-2@${tag}`);
    const both = await sendWith(
      config,
      ask(tag, 0, "Q", {
        ...auth,
        "x-warmgate-origin": `route-2@${tag}`,
        "x-warmgate-region": `near-${tag}`,
      }),
    );
    expect(both.status).toBe(400);
    expect((await both.json<ErrorBody>()).error).toMatchObject({
      code: "invalid_origin",
      param: "x-warmgate-origin",
    });
  });

  it("sends a prefix to one Batcher shard, whose index is its authority", async () => {
    const tag = crypto.randomUUID().slice(0, 6);
    const config = configOf(tag, { batching: { shards: 4 } });
    for (let n = 0; n < 4; n++) {
      for (const question of ["A?", "B?", "C?"]) {
        expect((await sendWith(config, ask(tag, n, question))).status).toBe(200);
      }
    }
    const view = await sendWith(config, adminRequest(`/admin/batchers/routing-${tag}/${MODEL}`));
    const { shards, routing } = await view.json<{
      shards: { routing: { placements: Record<string, number> } | null }[];
      routing: { placements: Record<string, number> };
    }>();
    expect(shards).toHaveLength(4);
    // Each prefix's three requests met in one shard: one cold placement and two hits (a
    // shard that got no request has no router yet).
    for (const shard of shards) {
      const { cold = 0, cache_hit: hits = 0 } = shard.routing?.placements ?? {};
      expect(hits).toBe(cold * 2);
    }
    expect(routing.placements).toMatchObject({ cold: 4, cache_hit: 8 });
  });

  it("places like least-loaded where routing is off", async () => {
    const tag = crypto.randomUUID().slice(0, 6);
    const config = configOf(tag, { routing: { enabled: false } });
    const res = await sendWith(config, ask(tag, 0, "Hello?"));
    expect(res.status).toBe(200);
    const view = await sendWith(config, adminRequest(`/admin/batchers/routing-${tag}/${MODEL}`));
    expect((await view.json<{ routing: unknown }>()).routing).toBeNull();
  });
});

describe("the stored index", () => {
  it("brings an evicted Batcher back warm", async () => {
    const tag = crypto.randomUUID().slice(0, 6);
    const config = configOf(tag);
    const first = await sendWith(config, ask(tag, 0, "Hello?"));
    const home = first.headers.get("x-warmgate-origin");
    // The index is stored behind, within INDEX_SAVE_MS.
    await new Promise((resolve) => setTimeout(resolve, INDEX_SAVE_MS + 300));
    await abortAllDurableObjects();
    const again = await sendWith(config, ask(tag, 0, "After the restart?"));
    expect(again.headers.get("x-warmgate-origin")).toBe(home);
    const view = await sendWith(config, adminRequest(`/admin/batchers/routing-${tag}/${MODEL}`));
    const { routing } = await view.json<{ routing: { placements: Record<string, number> } }>();
    // A new incarnation (its counters start again) that knew the prefix.
    expect(routing.placements).toMatchObject({ cache_hit: 1, cold: 0 });
  });
});

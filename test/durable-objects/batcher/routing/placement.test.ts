import { describe, expect, it } from "vitest";
import { blockHashes } from "../../../../contracts/prefix-blocks.ts";
import {
  type RouteCandidate,
  rendezvousOrder,
} from "../../../../durable-objects/batcher/routing/placement.ts";
import {
  type RouteRequest,
  Router,
  coldKey,
} from "../../../../durable-objects/batcher/routing/router.ts";
import { RoutingSchema } from "../../../../contracts/config/routing.ts";

// Placement by one cost (docs/routing.md, "Placement"): where a new prefix goes, and when a
// session's own history keeps it on its origin.
const ROUTER_DEFAULTS = RoutingSchema.parse({}).settings;
const ORIGINS = ["o1", "o2", "o3", "o4"];
const history = (turns: number) =>
  `${"System prompt of one conversation. ".repeat(300)}${Array.from({ length: turns }, (_, t) =>
    `Question ${t}? Answer ${t}. `.repeat(20),
  ).join("")}`;

function request(id: string, text: string, session: string | null = null): RouteRequest {
  const blocks = blockHashes("m", text);
  return { id, blocks, promptTokens: blocks.length * 16, session, pinned: null };
}

function idle(id: string, extra: Partial<RouteCandidate> = {}): RouteCandidate {
  return {
    id,
    load: 0,
    maxNumSeqs: 64,
    stepMs: 10,
    prefillTokensPerMs: 16,
    backlogTokens: 0,
    kvRoomTokens: null,
    ...extra,
  };
}

describe("placement cost", () => {
  it("places a new prefix where it holds up fewer sequences when the queues are equal", () => {
    const req = request("x", `${history(0)}Q`);
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const order = rendezvousOrder(
      ORIGINS.map((id) => ({ id })),
      coldKey(req),
    ).map((i) => ORIGINS[i]);
    // Its hashed origin runs one sequence more than the others, within the load bound: a
    // prefill there would hold up one more.
    const candidates = ORIGINS.map((id) => idle(id, { load: id === order[0] ? 3 : 2 }));
    expect(router.preview(req, candidates)).toMatchObject({ origin: order[1], reason: "cold" });
    // Equal loads: the hashed origin, the same on every router.
    const even = ORIGINS.map((id) => idle(id, { load: 2 }));
    expect(router.preview(req, even).origin).toBe(order[0]);
  });

  it("keeps a session whose history no other request shares on its crowded origin when a move would delay its first token", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const first = router.place(
      request("t1", history(1), "user-1"),
      ORIGINS.map((id) => idle(id)),
    );
    router.ended("t1", { prompt_tokens: 3_000, cached_tokens: 0 });
    // Its origin runs 16 sequences, the others none: 4,096 tokens of load against a
    // 3,000-token history to redo elsewhere.
    const crowded = ORIGINS.map((id) => idle(id, { load: id === first.origin ? 16 : 0 }));
    expect(router.preview(request("t2", history(2), "user-1"), crowded)).toMatchObject({
      origin: first.origin,
      reason: "cache_hit",
    });
    // The same history while another request in flight shares it: a copy serves both, so the
    // load moves it.
    router.place({ ...request("t2b", history(2)), pinned: first.origin }, crowded);
    expect(router.preview(request("t3", `${history(2)}more`, "user-1"), crowded).origin).not.toBe(
      first.origin,
    );
  });
});

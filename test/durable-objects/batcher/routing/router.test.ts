import { describe, expect, it } from "vitest";
import { blockHashes } from "../../../../contracts/prefix-blocks.ts";
import {
  type RouteCandidate,
  choosePlacement,
  rendezvousOrder,
} from "../../../../durable-objects/batcher/routing/placement.ts";
import { PrefixIndex } from "../../../../durable-objects/batcher/routing/prefix-index.ts";
import {
  type RouteRequest,
  Router,
  coldKey,
} from "../../../../durable-objects/batcher/routing/router.ts";
import { RoutingSchema } from "../../../../contracts/config/routing.ts";

const ROUTER_DEFAULTS = RoutingSchema.parse({}).settings;

const ORIGINS = ["o1", "o2", "o3", "o4"];
const system = (n: number) => `System prompt number ${n}. `.repeat(400);

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

describe("prefix index", () => {
  it("finds each origin's longest run of leading blocks in one pass", () => {
    const index = new PrefixIndex(["a", "b", "c"], 1000);
    index.store(0, [1, 2, 3, 4]);
    index.store(1, [1, 2]);
    expect(index.match([1, 2, 3, 9])).toEqual([3, 2, 0]);
    expect(index.match([7])).toEqual([0, 0, 0]);
  });

  it("evicts a prefix's tail before its head, least recently used first", () => {
    const index = new PrefixIndex(["a"], 4);
    index.store(0, [1, 2, 3]);
    index.store(0, [10, 11]);
    // Five blocks for four places: the tail of the older prefix goes.
    expect(index.match([1, 2, 3])).toEqual([2]);
    expect(index.match([10, 11])).toEqual([2]);
  });

  it("comes back whole from a snapshot", () => {
    const index = new PrefixIndex(["a", "b"], 100);
    index.store(0, [1, 2, 3]);
    index.store(1, [5, 6]);
    const copy = new PrefixIndex(["b", "a"], 100);
    copy.restore(JSON.parse(JSON.stringify(index.snapshot())));
    expect(copy.match([1, 2, 3])).toEqual([0, 3]);
    expect(copy.match([5, 6])).toEqual([2, 0]);
  });
});

describe("placement", () => {
  it("sends a prompt to the origin that holds its prefix", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const candidates = ORIGINS.map((id) => idle(id));
    const first = router.place(request("a", `${system(1)}Q1`), candidates);
    const second = router.place(request("b", `${system(1)}Another question`), candidates);
    expect(second.origin).toBe(first.origin);
    expect(second.reason).toBe("cache_hit");
    expect(second.matchedBlocks).toBeGreaterThan(90);
  });

  it("places cold prefixes the same way on two routers that share nothing", () => {
    const a = new Router(ORIGINS, ROUTER_DEFAULTS);
    const b = new Router(ORIGINS, ROUTER_DEFAULTS);
    const candidates = ORIGINS.map((id) => idle(id));
    const used = new Set<string>();
    for (let n = 0; n < 40; n++) {
      const req = request(`r${n}`, `${system(n)}Q`);
      const onA = a.preview(req, candidates);
      expect(b.preview(req, candidates)).toEqual(onA);
      expect(onA.reason).toBe("cold");
      used.add(onA.origin);
    }
    expect(used.size).toBe(4);
  });

  it("moves a cold prefix off its hashed origin when that one is over the load bound", () => {
    const req = request("x", `${system(3)}Q`);
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const home = router.preview(
      req,
      ORIGINS.map((id) => idle(id)),
    ).origin;
    const busy = ORIGINS.map((id) => idle(id, id === home ? { load: 40 } : { load: 2 }));
    const moved = router.preview(req, busy);
    // The next origin in the key's rendezvous order, the same on every router.
    const order = rendezvousOrder(busy, coldKey(req)).map((i) => busy[i]?.id);
    expect(moved.origin).toBe(order[1]);
    expect(moved.origin).not.toBe(home);
    expect(moved.reason).toBe("cold");
  });

  it("spreads a hot prefix once its warm origin is much slower than another", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const hot = system(7);
    const home = router.place(
      request("h0", `${hot}q0`),
      ORIGINS.map((id) => idle(id)),
    ).origin;
    // The warm origin has 40,000 prefill tokens ahead: 2.5 s against 0.2 s elsewhere.
    const candidates = ORIGINS.map((id) =>
      idle(id, id === home ? { backlogTokens: 40_000, load: 30 } : {}),
    );
    const next = router.place(request("h1", `${hot}q1`), candidates);
    expect(next.origin).not.toBe(home);
    expect(next.reason).toBe("spread");
    // Now two origins hold it; the next request takes the unloaded warm one.
    const third = router.place(request("h2", `${hot}q2`), candidates);
    expect(third.origin).toBe(next.origin);
    expect(third.reason).toBe("cache_hit");
  });

  it("keeps a prefix on its slow warm origin while that one carries no more than the others", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const hot = system(13);
    const home = router.place(
      request("w0", `${hot}q0`),
      ORIGINS.map((id) => idle(id)),
    ).origin;
    // Every origin runs as many sequences; the warm one has 40,000 prefill tokens queued.
    const candidates = ORIGINS.map((id) =>
      idle(id, id === home ? { backlogTokens: 40_000, load: 6 } : { load: 6 }),
    );
    expect(router.preview(request("w1", `${hot}q1`), candidates)).toMatchObject({
      origin: home,
      reason: "cache_hit",
    });
  });

  it("keeps a session on its origin for a new prefix, and honours a pinned origin", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const candidates = ORIGINS.map((id) => idle(id));
    const first = router.place(request("s1", `${system(1)}Q`, "alice"), candidates);
    const other = router.place(request("s2", `${system(99)}Q`, "alice"), candidates);
    expect(other.origin).toBe(first.origin);
    const pinned = router.place({ ...request("p", `${system(1)}Q`), pinned: "o3" }, candidates);
    expect(pinned).toMatchObject({ origin: "o3", reason: "pinned" });
  });

  it("counts an uncached prompt as the prefill ahead of the next request on that origin", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const req = request("a", `${system(1)}Q`);
    const placed = router.place(
      req,
      ORIGINS.map((id) => idle(id)),
    );
    expect(router.backlogTokens(placed.origin)).toBe(req.promptTokens);
    router.started("a");
    expect(router.backlogTokens(placed.origin)).toBe(0);
  });

  it("never places on an origin whose KV room cannot take the uncached prompt when another can", () => {
    const candidates = [idle("o1", { kvRoomTokens: 10 }), idle("o2")];
    const blocks = blockHashes("m", system(2));
    const choice = choosePlacement(
      candidates,
      { blocks, promptTokens: 1000, coldKey: 1, matched: [0, 0], sessionOrigin: null },
      ROUTER_DEFAULTS,
    );
    expect(choice.origin).toBe("o2");
  });
});

/** A system prompt of about 1,500 tokens, as agents share one. */
const agentSystem = `Agent system prompt. `.repeat(286);

/** An agent's conversation after `turns` steps over the shared system prompt. */
function agent(a: number, turns: number): string {
  let text = agentSystem;
  for (let t = 0; t < turns; t++) text += `Agent ${a} step ${t}: ${"tool output ".repeat(60)}`;
  return text;
}

describe("balance rule", () => {
  it("spreads agents on one system prompt once its origin is crowded", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const load = new Map(ORIGINS.map((id) => [id, 0]));
    const candidates = () => ORIGINS.map((id) => idle(id, { load: load.get(id) ?? 0 }));
    // Twenty agents start one after another and keep running: each first turn shares only
    // the system prompt with the others.
    for (let a = 0; a < 20; a++) {
      const placed = router.place(request(`a${a}`, agent(a, 1)), candidates());
      load.set(placed.origin, (load.get(placed.origin) ?? 0) + 1);
    }
    // The first origin takes agents until it carries the system prompt's prefill in
    // sequences more than the others; then each copy takes them while it is the lightest.
    const loads = [...load.values()].sort((x, y) => y - x);
    expect(loads[0]).toBeLessThanOrEqual(8);
    expect(loads[2]).toBeGreaterThanOrEqual(3);
  });

  it("moves a new agent off a crowded origin and keeps one with a history there", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const idleAll = ORIGINS.map((id) => idle(id));
    // The system prompt is on every origin; one agent's history is on one of them.
    for (const id of ORIGINS)
      router.place({ ...request(`s-${id}`, agentSystem), pinned: id }, idleAll);
    const home = router.place(request("t1", agent(1, 6)), idleAll).origin;
    const crowded = ORIGINS.map((id) => idle(id, { load: id === home ? 6 : 2 }));
    // Its own history (about 1,100 tokens) is worth more than four sequences of imbalance.
    expect(router.preview(request("t2", agent(1, 7)), crowded)).toMatchObject({
      origin: home,
      reason: "cache_hit",
    });
    // A new agent holds nothing but the system prompt there: it goes where the load is low.
    const fresh = router.preview(request("n1", agent(2, 1)), crowded);
    expect(fresh.origin).not.toBe(home);
    expect(fresh.reason).toBe("cache_hit");
  });

  it("copies a hot prefix once its origin carries its prefill in sequences more than another", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const hot = system(7);
    const home = router.place(
      request("h0", `${hot}q0`),
      ORIGINS.map((id) => idle(id)),
    ).origin;
    // Balanced: it stays.
    const even = ORIGINS.map((id) => idle(id, { load: 10 }));
    expect(router.preview(request("h1", `${hot}q1`), even).origin).toBe(home);
    // Its origin runs 8 sequences more than the others: less than a 2,400-token prefill.
    const busier = ORIGINS.map((id) => idle(id, { load: id === home ? 18 : 10 }));
    expect(router.preview(request("h2", `${hot}q2`), busier).origin).toBe(home);
    // Three times the others' sequences: a copy is cheaper.
    const piled = ORIGINS.map((id) => idle(id, { load: id === home ? 30 : 10 }));
    const next = router.place(request("h3", `${hot}q3`), piled);
    expect(next.origin).not.toBe(home);
    expect(next.reason).toBe("spread");
  });

  it("copies a hot prefix whose traffic exceeds one origin's share, keeping loads within the bound", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const hot = system(11);
    const load = new Map(ORIGINS.map((id) => [id, 0]));
    // Each origin runs 8 sequences at once.
    const candidates = () =>
      ORIGINS.map((id) => idle(id, { load: load.get(id) ?? 0, maxNumSeqs: 8 }));
    // Sixteen requests of one prefix, all still in flight: twice one origin's capacity.
    for (let k = 0; k < 16; k++) {
      const placed = router.place(request(`hot${k}`, `${hot}q${k}`), candidates());
      load.set(placed.origin, (load.get(placed.origin) ?? 0) + 1);
    }
    const loads = [...load.values()];
    expect(loads.filter((n) => n > 0).length).toBeGreaterThanOrEqual(2);
    expect(Math.max(...loads)).toBeLessThanOrEqual(1.3 * (16 / ORIGINS.length));
    // Its traffic gone (every request ended), the next one stays on a warm origin.
    for (let k = 0; k < 16; k++) router.ended(`hot${k}`, null);
    const quiet = router.preview(
      request("q", `${hot}again`),
      ORIGINS.map((id) => idle(id)),
    );
    expect(quiet.reason).toBe("cache_hit");
  });

  it("copies a shared prompt to an origin left out of its copies while the others carry it", () => {
    const eight = Array.from({ length: 8 }, (_, i) => `o${i + 1}`);
    const router = new Router(eight, ROUTER_DEFAULTS);
    const idleAll = eight.map((id) => idle(id));
    const [out, ...holders] = eight;
    // Seven origins hold the system prompt and run four of its agents each (in flight, each
    // pinned there); the eighth holds nothing and runs none.
    let k = 0;
    for (const id of holders)
      for (let a = 0; a < 4; a++)
        router.place({ ...request(`r${k}`, agent(k++, 1)), pinned: id }, idleAll);
    const loads = (lightest: number) =>
      eight.map((id) => idle(id, { load: id === out ? lightest : 4 }));
    // Each holder carries 4 of the prompt's 29 streams, 8/7 of the mean and within the load
    // bound; the eighth, idle, gets a copy.
    expect(router.preview(request("n1", agent(99, 1)), loads(0))).toMatchObject({
      origin: out,
      reason: "spread",
    });
    // Carrying more than half the mean of its own, it is not left out: the prompt stays.
    expect(router.preview(request("n2", agent(98, 1)), loads(2)).origin).not.toBe(out);
    // Nor is one that runs no stream but has new prompts queued to prefill (here 1,024
    // tokens: four sequences at `move_tokens_per_seq` 256).
    const queued = eight.map((id) => idle(id, id === out ? { backlogTokens: 1_024 } : { load: 4 }));
    expect(router.preview(request("n3", agent(97, 1)), queued).origin).not.toBe(out);
  });

  it("keeps a prefix of a few requests in flight on one origin", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const hot = system(12);
    const load = new Map(ORIGINS.map((id) => [id, 0]));
    const candidates = () => ORIGINS.map((id) => idle(id, { load: load.get(id) ?? 0 }));
    for (let k = 0; k < 2; k++) {
      const placed = router.place(request(`few${k}`, `${hot}q${k}`), candidates());
      load.set(placed.origin, (load.get(placed.origin) ?? 0) + 1);
    }
    expect([...load.values()].filter((n) => n > 0)).toHaveLength(1);
  });

  it("gathers a spread prefix back on its first origin when its traffic falls", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const hot = system(8);
    const idleAll = ORIGINS.map((id) => idle(id));
    const home = router.place(request("g0", `${hot}q`), idleAll).origin;
    // A burst copied it to every origin.
    for (const id of ORIGINS)
      router.place({ ...request(`c-${id}`, `${hot}c`), pinned: id }, idleAll);
    // Quiet again: every request goes to the same origin, its first one.
    for (let k = 0; k < 5; k++) {
      expect(router.place(request(`g${k + 1}`, `${hot}q${k}`), idleAll)).toMatchObject({
        origin: home,
        reason: "cache_hit",
      });
    }
  });

  it("sends what a warm match adds to an origin whose cache has room, not one that would evict", () => {
    const blocks = blockHashes("m", system(9));
    const candidates = [idle("o1"), idle("o2")];
    const input = { blocks, promptTokens: blocks.length * 16, coldKey: 1, sessionOrigin: null };
    const half = Math.floor(blocks.length / 4);
    for (const free of [
      [0, 100_000],
      [100_000, 0],
    ]) {
      // Both hold its first quarter (a system prompt); the full one would evict the rest.
      const choice = choosePlacement(
        candidates,
        { ...input, matched: [half, half], freeTokens: free },
        ROUTER_DEFAULTS,
      );
      expect(choice.origin).toBe(free[0] === 0 ? "o2" : "o1");
    }
    // Where neither has room, the warmer one keeps it.
    const choice = choosePlacement(
      candidates,
      { ...input, matched: [half, half + 8], freeTokens: [0, 0] },
      ROUTER_DEFAULTS,
    );
    expect(choice).toMatchObject({ origin: "o2", reason: "cache_hit" });
  });
});

describe("corrections", () => {
  it("forgets an origin's blocks when its engine restarted", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const candidates = ORIGINS.map((id) => idle(id));
    const home = router.place(request("a", `${system(1)}Q`), candidates).origin;
    router.report(home, { kvTotalTokens: 131_072, prefixQueries: 5000, at: 2 });
    // A report written earlier that arrived late (another call) is no restart.
    router.report(home, { kvTotalTokens: 131_072, prefixQueries: 4000, at: 1 });
    expect(router.view().origins[home]?.blocks).toBeGreaterThan(0);
    // Nor is one written in the same millisecond before it: clocks count in whole ms.
    router.report(home, { kvTotalTokens: 131_072, prefixQueries: 4900, at: 2 });
    expect(router.view().origins[home]?.blocks).toBeGreaterThan(0);
    router.report(home, { kvTotalTokens: 131_072, prefixQueries: 10, at: 3 });
    expect(router.view().origins[home]?.blocks).toBe(0);
  });

  it("shrinks an origin's assumed cache when it reports fewer cached tokens than predicted", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const candidates = ORIGINS.map((id) => idle(id));
    const home = router.place(request("a", `${system(1)}Q`), candidates).origin;
    router.report(home, { kvTotalTokens: 131_072, prefixQueries: 0, at: 1 });
    const before = router.view().origins[home]?.capacity_blocks ?? 0;
    // While "a" still prefills, a second request's missed hit only says it came early.
    router.place(request("early", `${system(1)}E`), candidates);
    router.ended("early", { prompt_tokens: 1600, cached_tokens: 0 });
    expect(router.view().origins[home]?.capacity_blocks).toBe(before);
    router.started("a");
    router.ended("a", { prompt_tokens: 1600, cached_tokens: 0 });
    router.place(request("b", `${system(1)}R`), candidates);
    router.ended("b", { prompt_tokens: 1600, cached_tokens: 0 });
    expect(router.view().origins[home]?.capacity_blocks).toBeLessThan(before);
    expect(router.view().hit_rate).toMatchObject({ reported: 0, requests: 3 });
    // Predicted: "a" cold, the two others warm.
    expect(router.view().hit_rate.predicted).toBeCloseTo(2 / 3, 1);
  });

  it("applies the engine's block events", () => {
    const router = new Router(ORIGINS, ROUTER_DEFAULTS);
    const candidates = ORIGINS.map((id) => idle(id));
    const req = request("a", `${system(1)}Q`);
    const home = router.place(req, candidates).origin;
    router.ended("a", { prompt_tokens: 1600, cached_tokens: 0 });
    const log = { log: "l1", cleared: false };
    router.events(home, { ...log, seq: 1, stored: [], removed: req.blocks.slice(0, 1) });
    expect(router.preview(request("b", `${system(1)}Q`), candidates).matchedBlocks).toBe(0);
    // The whole state of a log followed already adds to what is known.
    router.events(home, {
      ...log,
      seq: 2,
      cleared: true,
      stored: req.blocks.slice(0, 1),
      removed: [],
    });
    expect(router.view().origins[home]?.blocks).toBe(req.blocks.length);
    // A new log (the origin restarted) replaces it, keeping what is still prefilling there.
    const pending = request("c", `${system(2)}Q`);
    router.place({ ...pending, pinned: home }, candidates);
    const fresh = {
      log: "l2",
      seq: 1,
      cleared: true,
      stored: req.blocks.slice(0, 10),
      removed: [],
    };
    router.events(home, fresh);
    expect(router.view().origins[home]?.blocks).toBe(10 + pending.blocks.length);
    // A second call's LOAD brings the same events again: applied once.
    router.events(home, { ...fresh, cleared: false, stored: [], removed: req.blocks.slice(0, 10) });
    expect(router.view().origins[home]?.blocks).toBe(10 + pending.blocks.length);
  });
});

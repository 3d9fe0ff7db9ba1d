import { describe, expect, it } from "vitest";
import { OutcomeAsks } from "../../../functions/delivery/outcome-asks.ts";
import type {
  FoundItem,
  OutcomeLookup,
  OutcomeLookupResult,
  OutcomeQuery,
  OutcomeSource,
} from "../../../contracts/outcomes.ts";

const EU: OutcomeSource = { id: "eu-1", url: "http://eu-1.test" };
const US: OutcomeSource = { id: "us-1", url: "http://us-1.test" };

const ended = (id: string, origin: string, completion: number): FoundItem => ({
  id,
  origin,
  state: "ended",
  outcome: "ok",
  usage: {
    prompt_tokens: 10,
    completion_tokens: completion,
    total_tokens: 10 + completion,
    cached_tokens: 0,
  },
});

/** A fake origin set: each lookup recorded; each origin remembers one item per request id. */
function origins(
  answer: (source: OutcomeSource, query: OutcomeQuery) => Promise<boolean> = async () => true,
) {
  const calls: { source: string; ids: readonly string[]; prefixes?: readonly string[] }[] = [];
  const send: OutcomeLookup = async (sources, query) => {
    const result: OutcomeLookupResult = { items: [], complete: true, silent: new Set() };
    for (const source of sources) {
      calls.push({
        source: source.id,
        ids: query.ids,
        ...(query.prefixes && { prefixes: query.prefixes }),
      });
      if (!(await answer(source, query))) {
        result.silent.add(source.url);
        result.complete = false;
        continue;
      }
      // Each request ran once here, its completion tokens the length of its id.
      for (const id of query.ids) result.items.push(ended(`${id}.0`, source.id, id.length));
    }
    return result;
  };
  return { calls, send };
}

describe("asking origins what requests generated", () => {
  it("sends the asks of one origin that come together in one lookup, each answered with its own items", async () => {
    const { calls, send } = origins();
    const asks = new OutcomeAsks(send);
    const ids = ["a", "bb", "ccc", "dddd", "eeeee"];
    const answers = await Promise.all(ids.map((id) => asks.lookup([EU], { ids: [id] }, {})));
    expect(calls).toEqual([{ source: "eu-1", ids }]);
    for (const [i, id] of ids.entries()) {
      expect(answers[i]?.complete).toBe(true);
      expect(answers[i]?.items).toEqual([ended(`${id}.0`, "eu-1", id.length)]);
    }
    expect(asks.pending).toBe(0);
  });

  it("asks each origin in a lookup of its own", async () => {
    const { calls, send } = origins();
    const asks = new OutcomeAsks(send);
    const [both, eu] = await Promise.all([
      asks.lookup([EU, US], { ids: ["r1"] }, {}),
      asks.lookup([EU], { ids: ["r2"] }, {}),
    ]);
    expect(calls.toSorted((a, b) => a.source.localeCompare(b.source))).toEqual([
      { source: "eu-1", ids: ["r1", "r2"] },
      { source: "us-1", ids: ["r1"] },
    ]);
    expect(both.items.map((item) => item.origin).toSorted()).toEqual(["eu-1", "us-1"]);
    expect(eu.items).toEqual([ended("r2.0", "eu-1", 2)]);
  });

  it("tells every ask of an origin that did not answer that it is silent", async () => {
    const { send } = origins(async (source) => source.id !== "us-1");
    const asks = new OutcomeAsks(send);
    const [both, us] = await Promise.all([
      asks.lookup([EU, US], { ids: ["r1"] }, {}),
      asks.lookup([US], { ids: ["r2"] }, {}),
    ]);
    expect(both).toMatchObject({ complete: false, silent: new Set([US.url]) });
    expect(both.items).toEqual([ended("r1.0", "eu-1", 2)]);
    expect(us).toEqual({ items: [], complete: false, silent: new Set([US.url]) });
  });

  it("treats a lookup that throws as an origin that did not answer", async () => {
    const asks = new OutcomeAsks(async () => {
      throw new Error("connection refused");
    });
    const answer = await asks.lookup([EU], { ids: ["r1"] }, {});
    expect(answer).toEqual({ items: [], complete: false, silent: new Set([EU.url]) });
  });

  it("asks alone once the lookup another request sent with it has not answered within its time", async () => {
    let first = true;
    // The first lookup never answers (the request that sent it went away); the next ones do.
    const { calls, send } = origins(async () => {
      if (!first) return true;
      first = false;
      return new Promise<boolean>(() => {});
    });
    const asks = new OutcomeAsks(send);
    // The first ask's timer fires first: its request sends both.
    void asks.lookup([EU], { ids: ["r1"] }, {}, 50);
    const carried = await asks.lookup([EU], { ids: ["r2"] }, {}, 50);
    expect(calls).toEqual([
      { source: "eu-1", ids: ["r1", "r2"] },
      { source: "eu-1", ids: ["r2"] },
    ]);
    expect(carried).toEqual({
      items: [ended("r2.0", "eu-1", 2)],
      complete: true,
      silent: new Set(),
    });
  });

  it("sends a lookup by prefix at once, alone", async () => {
    const { calls, send } = origins();
    const asks = new OutcomeAsks(send);
    await Promise.all([
      asks.lookup([EU], { ids: [], prefixes: ["lease-1."] }, {}),
      asks.lookup([EU], { ids: ["r1"], prefixes: ["lease-2."] }, {}),
    ]);
    expect(calls).toEqual([
      { source: "eu-1", ids: [], prefixes: ["lease-1."] },
      { source: "eu-1", ids: ["r1"], prefixes: ["lease-2."] },
    ]);
  });
});

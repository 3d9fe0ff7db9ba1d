import { describe, expect, it } from "vitest";
import {
  chooseLeastLoaded,
  chooseLeastLoadedInTurn,
  type OriginCandidate,
} from "../../../../durable-objects/batcher/window/origin-choice.ts";

function candidate(id: string, over: Partial<OriginCandidate> = {}): OriginCandidate {
  return { id, load: 0, freeSlots: null, room: null, kvRoomTokens: null, inFlight: 0, ...over };
}

const head = { id: "r", lane: 0, promptTokens: 100 };

describe("least loaded, in turn", () => {
  it("gives a full tie to the origin sent to longest ago, and never sent first", () => {
    const sent = new Map<string, number>([
      ["a", 20],
      ["b", 10],
    ]);
    const choose = chooseLeastLoadedInTurn((id) => sent.get(id) ?? null);
    const tied = [candidate("a"), candidate("b"), candidate("c")];
    expect(choose(tied, head)).toBe("c");
    sent.set("c", 30);
    expect(choose(tied, head)).toBe("b");
    // The plain chooser keeps configuration order for the same tie.
    expect(chooseLeastLoaded(tied, head)).toBe("a");
  });

  it("still ranks by load and then KV room before taking turns", () => {
    const choose = chooseLeastLoadedInTurn((id) => (id === "a" ? null : 5));
    expect(choose([candidate("a", { load: 3 }), candidate("b", { load: 1 })], head)).toBe("b");
    expect(
      choose([candidate("a", { kvRoomTokens: 200 }), candidate("b", { kvRoomTokens: 900 })], head),
    ).toBe("b");
  });

  it("skips origins whose KV cache cannot hold the prompt", () => {
    const choose = chooseLeastLoadedInTurn(() => null);
    expect(choose([candidate("a", { kvRoomTokens: 50 })], head)).toBeNull();
    expect(choose([candidate("a", { kvRoomTokens: 50 }), candidate("b")], head)).toBe("b");
  });
});

import { describe, expect, it } from "vitest";
import { loadEndpoints } from "../../bench/cli-run.ts";

/** Two endpoints, the second ten times slower, counting each one's requests in flight. */
function twoEndpoints() {
  const inFlight = [0, 0];
  const most = [0, 0];
  const sent: number[][] = [[], []];
  const send = async (endpoint: number, i: number) => {
    inFlight[endpoint] = (inFlight[endpoint] ?? 0) + 1;
    most[endpoint] = Math.max(most[endpoint] ?? 0, inFlight[endpoint] ?? 0);
    sent[endpoint]?.push(i);
    await new Promise((resolve) => setTimeout(resolve, endpoint === 0 ? 1 : 10));
    inFlight[endpoint] = (inFlight[endpoint] ?? 0) - 1;
    return { endpoint, i };
  };
  return { send, most, sent };
}

describe("npm run bench's load", () => {
  it("gives each endpoint its own N clients, however slow the other is", async () => {
    const { send, most, sent } = twoEndpoints();
    const runs = await loadEndpoints({
      endpoints: 2,
      concurrency: 4,
      requests: 24,
      deadline: Number.POSITIVE_INFINITY,
      send,
    });
    // A pool shared by both would leave most of its clients waiting on the slower one.
    expect(most).toEqual([4, 4]);
    expect(runs.samples.map((s) => s.length)).toEqual([24, 24]);
    expect(sent.map((list) => list.toSorted((a, b) => a - b))).toEqual([
      Array.from({ length: 24 }, (_, i) => i),
      Array.from({ length: 24 }, (_, i) => i),
    ]);
    expect(runs.seconds.every((s) => s > 0)).toBe(true);
  });

  it("stops every endpoint's clients at the deadline", async () => {
    const { send } = twoEndpoints();
    const runs = await loadEndpoints({
      endpoints: 2,
      concurrency: 3,
      requests: null,
      deadline: performance.now() - 1,
      send,
    });
    expect(runs.samples).toEqual([[], []]);
  });
});

import { describe, expect, it } from "vitest";
import {
  type ScalePhase,
  scaleRows,
  scaleTargets,
  shardChanges,
} from "../../bench/scale-report.ts";

function phase(overrides: Partial<ScalePhase>): ScalePhase {
  return {
    kind: "scale",
    path: "edge",
    streams: 256,
    seconds: 10,
    samples: [],
    cut: 0,
    refused: 0,
    firstError: null,
    polls: [],
    breakerOpenings: 0,
    machineBusy: 0.9,
    edgeCores: 0.8,
    ...overrides,
  };
}

const stream = (tokens: number) => ({
  ttftMs: 1,
  totalMs: 2,
  tokens,
  tokenReads: tokens,
  gapsMs: [],
});

describe("the scale bench's report", () => {
  it("sets the edge's tokens/s against the origin's at the same stream count", () => {
    const rows = scaleRows([
      phase({ path: "origin", samples: [stream(1000)] }),
      phase({
        samples: [stream(700)],
        polls: [{ t: 1, count: 2, lagsMs: [30, 5], inFlight: [9, 9] }],
      }),
    ]);
    expect(rows[1]).toMatchObject({ ratio: 0.7, shardsMax: 2, lagMaxMs: 30 });
    expect(rows[0]?.ratio).toBeNull();
  });

  it("misses the targets when a stream was cut, a breaker opened or the shards never split under lag", () => {
    const rows = scaleRows([
      phase({ path: "origin", samples: [stream(1000)] }),
      phase({
        samples: [stream(500)],
        cut: 2,
        breakerOpenings: 1,
        polls: [{ t: 1, count: 1, lagsMs: [80], inFlight: [256] }],
      }),
    ]);
    const changes = shardChanges(
      rows.length > 0 ? [{ t: 1, count: 1, lagsMs: [80], inFlight: [1] }] : [],
    );
    const targets = scaleTargets(rows, [256], 20, changes);
    expect(targets["cut streams, 256 streams"]?.met).toBe(false);
    expect(targets["healthy breakers opened, 256 streams"]?.met).toBe(false);
    expect(targets["tokens/s / origin, 256 streams"]?.met).toBe(false);
    expect(targets["shards at the peak (split when one lags)"]?.met).toBe(false);
  });

  it("counts a split followed by a merge as scaling out and back", () => {
    const changes = shardChanges([
      { t: 1, count: 1, lagsMs: [], inFlight: [] },
      { t: 5, count: 2, lagsMs: [], inFlight: [] },
      { t: 6, count: 2, lagsMs: [], inFlight: [] },
      { t: 40, count: 1, lagsMs: [], inFlight: [] },
    ]);
    expect(changes).toEqual([
      { t: 1, count: 1 },
      { t: 5, count: 2 },
      { t: 40, count: 1 },
    ]);
    const targets = scaleTargets([], [], 20, changes);
    expect(targets["shards after the calm phase (merged back)"]?.met).toBe(true);
  });
});

import { afterEach, describe, expect, it } from "vitest";
import { keptAnswers } from "../../../durable-objects/batch-run/kept-answers.ts";
import { startOrigin } from "../../../origin/server.ts";
import type { RunningOrigin } from "../../../origin/server.ts";
import { postBatch, readBatch } from "../../origin/batch-client.ts";
import { createFakeEngine } from "../../origin/fake-engine.ts";

const origins: RunningOrigin[] = [];

afterEach(async () => {
  await Promise.all(origins.map((origin) => origin.close()));
  origins.length = 0;
});

async function startFake(id: string): Promise<RunningOrigin> {
  const started = await startOrigin({ engine: createFakeEngine(), originId: id, port: 0 });
  origins.push(started);
  return started;
}

function line(id: string, extra: Record<string, unknown> = {}) {
  const body = JSON.stringify({ model: "fake-model", messages: [], max_tokens: 2, ...extra });
  return { id, path: "/v1/chat/completions" as const, body, background: true };
}

describe("answers origins kept across a restart", () => {
  it("sends a line an origin answered back to that origin alone, and the others anywhere", async () => {
    const a = await startFake("a");
    const b = await startFake("b");
    const c = await startFake("c");
    // Before the edge died: line 1 ended ok on b, line 2 failed on a, line 3 never arrived.
    await readBatch(await postBatch(b.url, "call-1", [line("batch_x-1")]));
    await readBatch(await postBatch(a.url, "call-2", [line("batch_x-2", { x_fail: 500 })]));
    const run = {
      setup: {
        origins: [a, b, c].map((o) => ({ id: o.originId, url: `${o.url}/` })),
      },
    } as Parameters<typeof keptAnswers>[0];
    const lines = new Map([
      ["batch_x-1", 1],
      ["batch_x-2", 2],
      ["batch_x-3", 3],
    ]);
    const avoid = await keptAnswers(run, lines, {});
    expect([...avoid]).toEqual([[1, ["a", "c"]]]);
  });
});

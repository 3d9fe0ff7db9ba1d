import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, inject, it, vi } from "vitest";
import type { Batcher } from "../../durable-objects/batcher.ts";
import app from "../../functions/index.ts";
import { chatBody, edgeRequest } from "../support/edge-requests.ts";

const origin = inject("testOrigins").find((o) => o.id === "edge-batch-1");
if (origin === undefined) throw new Error("edge-batch-1 is not running");
const ORIGIN_URL = origin.url;

const config = JSON.stringify({
  models: [{ id: "warmgate-sim-8b", max_model_len: 32768 }],
  regions: [{ id: "v", origins: [{ id: "edge-batch-1", url: ORIGIN_URL }] }],
  default_region: "v",
  limits: { first_byte_timeout_ms: 5_000, retry_budget: 0 },
  batching: { idle_bypass_ms: 0 },
});

/**
 * Batchers as an edge meets them while a deploy rolls out: of the version before `answer`,
 * so the runtime refuses that method; the rest reaches the real object.
 */
function earlierBatchers(calls: string[]): DurableObjectNamespace<Batcher> {
  const real = env.BATCHER;
  const refuse = async () => {
    calls.push("answer");
    throw new TypeError('The RPC receiver does not implement "answer".');
  };
  return {
    getByName(name: string) {
      const stub = real.getByName(name);
      return {
        answer: refuse,
        submit: (...args: Parameters<Batcher["submit"]>) => {
          calls.push("submit");
          return stub.submit(...args);
        },
        open: (...args: Parameters<Batcher["open"]>) => stub.open(...args),
        end: (...args: Parameters<Batcher["end"]>) => stub.end(...args),
        cancel: (...args: Parameters<Batcher["cancel"]>) => stub.cancel(...args),
      } as unknown as DurableObjectStub<Batcher>;
    },
  } as unknown as DurableObjectNamespace<Batcher>;
}

describe("a batcher of the version before `answer`", () => {
  it("answers JSON through its frames instead, and asks for `answer` again a minute later", async () => {
    const calls: string[] = [];
    const namespace = earlierBatchers(calls);
    const body = chatBody({ max_tokens: 5 });
    // Asked twice: the second answer, like the edge's, finds its prompt in the prefix cache.
    const askOrigin = async () => {
      const direct = await fetch(`${ORIGIN_URL}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      return new Uint8Array(await direct.arrayBuffer());
    };
    await askOrigin();
    const expected = await askOrigin();
    const askEdge = async () => {
      const ctx = createExecutionContext();
      const res = await app.fetch(
        edgeRequest("/v1/chat/completions", { body }),
        { ...env, BATCHER: namespace, WARMGATE_CONFIG: config },
        ctx,
      );
      expect(res.status).toBe(200);
      expect(new Uint8Array(await res.arrayBuffer())).toEqual(expected);
      await waitOnExecutionContext(ctx);
    };
    await askEdge();
    await askEdge();
    expect(calls).toEqual(["answer", "submit", "submit"]);
    const later = Date.now() + 61_000;
    const clock = vi.spyOn(Date, "now").mockImplementation(() => later);
    try {
      await askEdge();
    } finally {
      clock.mockRestore();
    }
    expect(calls).toEqual(["answer", "submit", "submit", "answer", "submit"]);
  });
});

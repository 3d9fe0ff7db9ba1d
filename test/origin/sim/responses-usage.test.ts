import { afterEach, describe, expect, it } from "vitest";
import { LONG_SYSTEM, MODEL, call, closeEngines, engine } from "./sim-call.ts";

afterEach(closeEngines);

interface ResponsesUsage {
  input_tokens: number;
  input_tokens_details: { cached_tokens: number; cache_write_tokens: number };
}

async function usageOf(e: ReturnType<typeof engine>): Promise<ResponsesUsage> {
  const answer = await call(
    e,
    { model: MODEL, instructions: LONG_SYSTEM, input: "Where is my parcel?", max_output_tokens: 4 },
    "/v1/responses",
  );
  expect(answer.status).toBe(200);
  return (JSON.parse(answer.text) as { usage: ResponsesUsage }).usage;
}

describe("simulated engine: Responses usage", () => {
  it("reports the prompt's whole blocks it wrote to the cache, and none the next time", async () => {
    const e = engine({ blockSize: 16 });
    const first = await usageOf(e);
    expect(first.input_tokens_details.cached_tokens).toBe(0);
    expect(first.input_tokens_details.cache_write_tokens).toBe(
      Math.floor(first.input_tokens / 16) * 16,
    );
    const second = await usageOf(e);
    expect(second.input_tokens_details.cached_tokens).toBe(
      first.input_tokens_details.cache_write_tokens,
    );
    expect(second.input_tokens_details.cache_write_tokens).toBe(0);
  });
});

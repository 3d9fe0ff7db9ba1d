import OpenAI, { NotFoundError, toFile } from "openai";
import { describe, expect, inject, it } from "vitest";
import { EDGE, chatBody } from "../../support/edge-requests.ts";
import { TEST_API_KEY } from "../../support/provided-context.ts";
import { sendWith } from "../../support/test-origins.workers.ts";

const CONFIG = inject("warmgateConfig");

// The official SDK, unmodified, with the edge as its fetch.
const client = new OpenAI({
  baseURL: `${EDGE}/v1`,
  apiKey: TEST_API_KEY,
  maxRetries: 0,
  fetch: (url, init) => sendWith(CONFIG, new Request(url, init)),
});

describe("the official openai SDK's Batch API calls", () => {
  it("uploads a file, runs a batch, retrieves it and reads its output", async () => {
    const lines = ["q2", "q1", "q3"].map((id) =>
      JSON.stringify({
        custom_id: id,
        method: "POST",
        url: "/v1/chat/completions",
        body: chatBody({ max_tokens: 3 }),
      }),
    );
    const file = await client.files.create({
      file: await toFile(new TextEncoder().encode(lines.join("\n")), "requests.jsonl"),
      purpose: "batch",
    });
    expect(file).toMatchObject({ object: "file", purpose: "batch", filename: "requests.jsonl" });

    const created = await client.batches.create({
      input_file_id: file.id,
      endpoint: "/v1/chat/completions",
      completion_window: "24h",
      metadata: { job: "nightly" },
    });
    expect(created).toMatchObject({ object: "batch", input_file_id: file.id });

    let batch = await client.batches.retrieve(created.id);
    while (!["completed", "failed", "expired", "cancelled"].includes(batch.status)) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      batch = await client.batches.retrieve(created.id);
    }
    expect(batch.status).toBe("completed");
    expect(batch.metadata).toEqual({ job: "nightly" });
    expect(batch.request_counts).toEqual({ total: 3, completed: 3, failed: 0 });

    const content = await client.files.content(batch.output_file_id as string);
    const records = (await content.text())
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { custom_id: string; response: { status_code: number } });
    expect(records.map((r) => r.custom_id)).toEqual(["q1", "q2", "q3"]);
    expect(records.every((r) => r.response.status_code === 200)).toBe(true);

    const listed: string[] = [];
    for await (const listedFile of client.files.list({ purpose: "batch_output", limit: 1 })) {
      listed.push(listedFile.id);
    }
    expect(listed).toContain(batch.output_file_id);
    expect(listed).not.toContain(file.id);
  });

  it("raises the SDK's NotFoundError for an unknown batch", async () => {
    await expect(client.batches.retrieve("batch_unknown")).rejects.toBeInstanceOf(NotFoundError);
  });
});

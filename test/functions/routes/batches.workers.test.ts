import { describe, expect, inject, it } from "vitest";
import { createKey } from "../../support/admin-keys.workers.ts";
import { batchCreateBody, EDGE, chatBody } from "../../support/edge-requests.ts";
import { pricedConfig } from "../../support/metering.workers.ts";
import { TEST_API_KEY } from "../../support/provided-context.ts";
import { adminRequest, sendWith } from "../../support/test-origins.workers.ts";

// The tests' own origins; billing tests run on the metering origins, whose models have prices.
let config = inject("warmgateConfig");

type Batch = {
  id: string;
  status: string;
  output_file_id: string | null;
  error_file_id: string | null;
  request_counts: { total: number; completed: number; failed: number };
};

type FileList = {
  object: string;
  data: { id: string; purpose: string; bytes: number }[];
  first_id: string | null;
  last_id: string | null;
  has_more: boolean;
};

function line(customId: string, overrides: Record<string, unknown> = {}): string {
  return JSON.stringify({
    custom_id: customId,
    method: "POST",
    url: "/v1/chat/completions",
    body: chatBody({ max_tokens: 4, ...overrides }),
  });
}

async function call(path: string, init: RequestInit = {}, key = TEST_API_KEY): Promise<Response> {
  const headers = new Headers(init.headers);
  headers.set("authorization", `Bearer ${key}`);
  return sendWith(config, new Request(`${EDGE}${path}`, { ...init, headers }));
}

async function upload(text: string, key = TEST_API_KEY, purpose = "batch"): Promise<Response> {
  const form = new FormData();
  form.set("purpose", purpose);
  form.set("file", new File([text], "input.jsonl", { type: "application/jsonl" }));
  return call("/v1/files", { method: "POST", body: form }, key);
}

async function createBatch(fileId: string, key = TEST_API_KEY): Promise<Response> {
  return call(
    "/v1/batches",
    {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: batchCreateBody(fileId),
    },
    key,
  );
}

async function settled(id: string, key = TEST_API_KEY): Promise<Batch> {
  for (;;) {
    const batch = await (await call(`/v1/batches/${id}`, {}, key)).json<Batch>();
    if (["completed", "failed", "expired", "cancelled"].includes(batch.status)) return batch;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe("/v1/files", () => {
  it("stores a batch file, shows it, serves its bytes and deletes it", async () => {
    const text = `${line("a")}\n${line("b")}\n`;
    const res = await upload(text);
    expect(res.status).toBe(200);
    const file = await res.json<{ id: string; bytes: number; purpose: string; object: string }>();
    expect(file).toMatchObject({ object: "file", purpose: "batch", bytes: text.length });
    expect(await (await call(`/v1/files/${file.id}`)).json()).toMatchObject({ id: file.id });
    expect(await (await call(`/v1/files/${file.id}/content`)).text()).toBe(text);
    const deleted = await call(`/v1/files/${file.id}`, { method: "DELETE" });
    expect(await deleted.json()).toEqual({ id: file.id, object: "file", deleted: true });
    const gone = await call(`/v1/files/${file.id}`);
    expect(gone.status).toBe(404);
    expect(await gone.json()).toMatchObject({ error: { code: "file_not_found" } });
  });

  it("refuses a file whose line is not a batch request, naming the line", async () => {
    const bad = [
      line("a"),
      JSON.stringify({ custom_id: "b", method: "GET", url: "/v1/chat/completions", body: {} }),
    ];
    const res = await upload(bad.join("\n"));
    expect(res.status).toBe(400);
    const body = await res.json<{ error: { message: string; code: string; param: string } }>();
    expect(body.error).toMatchObject({ code: "invalid_file", param: "method" });
    expect(body.error.message).toContain("Line 2");
  });

  it("refuses duplicate custom ids and an invalid body", async () => {
    const dup = await upload(`${line("a")}\n${line("a")}`);
    expect(await dup.json()).toMatchObject({ error: { code: "invalid_file", param: "custom_id" } });
    const invalid = await upload(line("a", { max_tokens: "many" }));
    expect(await invalid.json()).toMatchObject({ error: { param: "body.max_tokens" } });
  });

  it("refuses lines for two endpoints by their url, not their models", async () => {
    const embedding = JSON.stringify({
      custom_id: "b",
      method: "POST",
      url: "/v1/embeddings",
      body: { model: "warmgate-sim-embed", input: "hi" },
    });
    const mixed = await upload(`${line("a")}\n${embedding}`);
    expect(mixed.status).toBe(400);
    const { error } = await mixed.json<{ error: { message: string; param: string } }>();
    expect(error.param).toBe("url");
    expect(error.message).toContain("same url ('/v1/chat/completions')");
  });

  it("keeps a key's files from every other key", async () => {
    const file = await (await upload(line("a"))).json<{ id: string }>();
    const other = await createKey({ name: "other-files" });
    expect((await call(`/v1/files/${file.id}`, {}, other.key)).status).toBe(404);
    expect((await call(`/v1/files/${file.id}/content`, {}, other.key)).status).toBe(404);
    const listed = await (await call("/v1/files", {}, other.key)).json<FileList>();
    expect(listed).toEqual({
      object: "list",
      data: [],
      first_id: null,
      last_id: null,
      has_more: false,
    });
  });

  it("lists the key's files by pages, in both orders, by purpose, without deleted ones", async () => {
    const { key } = await createKey({ name: "file-lister" });
    const made: string[] = [];
    for (const name of ["a", "b", "c"]) {
      made.push((await (await upload(line(name), key)).json<{ id: string }>()).id);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const ids = async (query: string) => {
      const res = await call(`/v1/files${query}`, {}, key);
      expect(res.status).toBe(200);
      const list = await res.json<FileList>();
      return { ids: list.data.map((f) => f.id), more: list.has_more, last: list.last_id };
    };
    expect(await ids("")).toEqual({ ids: [made[2], made[1], made[0]], more: false, last: made[0] });
    const first = await ids("?limit=2");
    expect(first).toEqual({ ids: [made[2], made[1]], more: true, last: made[1] });
    expect(await ids(`?limit=2&after=${first.last}`)).toMatchObject({
      ids: [made[0]],
      more: false,
    });
    expect((await ids("?order=asc&limit=2")).ids).toEqual([made[0], made[1]]);
    expect((await ids(`?order=asc&after=${made[1]}`)).ids).toEqual([made[2]]);
    expect((await ids("?purpose=batch_output")).ids).toEqual([]);

    const batch = await settled((await (await createBatch(made[0]!, key)).json<Batch>()).id, key);
    const outputs = await ids("?purpose=batch_output");
    expect(outputs.ids).toEqual([batch.output_file_id]);
    expect((await ids("?purpose=batch")).ids).toEqual([made[2], made[1], made[0]]);
    const [output] = (await (await call("/v1/files?limit=1", {}, key)).json<FileList>()).data;
    const content = await call(`/v1/files/${batch.output_file_id}/content`, {}, key);
    expect(output).toMatchObject({ purpose: "batch_output", bytes: (await content.text()).length });

    await call(`/v1/files/${made[1]}`, { method: "DELETE" }, key);
    expect((await ids("?purpose=batch")).ids).toEqual([made[2], made[0]]);
  });

  it("refuses a bad list query with the parameter it names", async () => {
    for (const [query, param, status] of [
      ["?limit=0", "limit", 400],
      ["?limit=10001", "limit", 400],
      ["?limit=2.5", "limit", 400],
      ["?order=newest", "order", 400],
      ["?after=file-000000000000000000000000", "after", 404],
    ] as const) {
      const res = await call(`/v1/files${query}`);
      const { error } = await res.json<{ error: { param: string } }>();
      expect({ query, status: res.status, param: error.param }).toEqual({ query, status, param });
    }
    expect((await call("/v1/files", { method: "PUT" })).status).toBe(405);
  });
});

describe("/v1/batches", () => {
  it("answers every line once, in custom_id order, and completes", async () => {
    const ids = ["c", "a", "e", "b", "d"];
    const file = await (await upload(ids.map((id) => line(id)).join("\n"))).json<{ id: string }>();
    const res = await createBatch(file.id);
    expect(res.status).toBe(200);
    const created = await res.json<Batch>();
    expect(created).toMatchObject({ object: "batch", status: "in_progress" });
    const done = await settled(created.id);
    expect(done.status).toBe("completed");
    expect(done.request_counts).toEqual({ total: 5, completed: 5, failed: 0 });
    expect(done.error_file_id).toBeNull();
    const output = await (await call(`/v1/files/${done.output_file_id}/content`)).text();
    const records = output
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(records.map((r) => r.custom_id)).toEqual(["a", "b", "c", "d", "e"]);
    for (const record of records) {
      expect(record.response.status_code).toBe(200);
      expect(record.response.body.object).toBe("chat.completion");
      expect(record.error).toBeNull();
    }
  });

  it("lists the key's batches newest first, by pages", async () => {
    const { key } = await createKey({ name: "lister" });
    const file = await (await upload(line("x"), key)).json<{ id: string }>();
    const made: string[] = [];
    for (let i = 0; i < 3; i++)
      made.push((await (await createBatch(file.id, key)).json<Batch>()).id);
    const first = await (
      await call("/v1/batches?limit=2", {}, key)
    ).json<{ data: Batch[]; has_more: boolean; last_id: string }>();
    expect(first.data.map((b) => b.id)).toEqual([made[2], made[1]]);
    expect(first.has_more).toBe(true);
    const second = await (
      await call(`/v1/batches?limit=2&after=${first.last_id}`, {}, key)
    ).json<{ data: Batch[]; has_more: boolean }>();
    expect(second.data.map((b) => b.id)).toEqual([made[0]]);
    expect(second.has_more).toBe(false);
    for (const id of made) await settled(id, key);
  });

  it("cancels a batch: lines never sent go to the error file", async () => {
    const lines = Array.from({ length: 200 }, (_, i) => line(`l${String(i).padStart(3, "0")}`));
    const file = await (await upload(lines.join("\n"))).json<{ id: string }>();
    const batch = await (await createBatch(file.id)).json<Batch>();
    const cancelling = await call(`/v1/batches/${batch.id}/cancel`, { method: "POST" });
    expect(await cancelling.json()).toMatchObject({ status: "cancelling" });
    const done = await settled(batch.id);
    expect(done.status).toBe("cancelled");
    const { completed, failed, total } = done.request_counts;
    expect(completed + failed).toBe(total);
    expect(failed).toBeGreaterThan(0);
    const errors = await (await call(`/v1/files/${done.error_file_id}/content`)).text();
    expect(errors).toContain('"code":"batch_cancelled"');
    const again = await call(`/v1/batches/${batch.id}/cancel`, { method: "POST" });
    expect(again.status).toBe(409);
  });

  it("keeps metadata within OpenAI's limits: 16 pairs, keys to 64 characters, values to 512", async () => {
    const file = await (await upload(line("a"))).json<{ id: string }>();
    const create = (metadata: unknown) =>
      call("/v1/batches", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: batchCreateBody(file.id, { metadata }),
      });
    const many = Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, "v"]));
    for (const metadata of [many, { ["k".repeat(65)]: "v" }, { k: "v".repeat(513) }]) {
      const res = await create(metadata);
      expect(res.status).toBe(400);
      const { error } = await res.json<{ error: { param: string; type: string } }>();
      expect(error).toMatchObject({ type: "invalid_request_error" });
      expect(error.param).toMatch(/^metadata/);
    }
    const fits = Object.fromEntries(
      Array.from({ length: 16 }, (_, i) => [`k${i}`, "v".repeat(512)]),
    );
    const res = await create(fits);
    expect(res.status).toBe(200);
    const batch = await res.json<Batch & { metadata: Record<string, string> }>();
    expect(Object.keys(batch.metadata)).toHaveLength(16);
    await settled(batch.id);
  });

  it("refuses a batch whose worst case exceeds the key's budget", async () => {
    config = pricedConfig();
    const { key } = await createKey({
      name: "thrifty",
      budgets: [{ period: "1d", max_usd: 0.000001 }],
    });
    const file = await (await upload(line("a", { max_tokens: 1000 }), key)).json<{ id: string }>();
    const res = await createBatch(file.id, key);
    expect(res.status).toBe(429);
    const body = await res.json<{ error: { code: string; message: string } }>();
    expect(body.error.code).toBe("insufficient_quota");
    expect(body.error.message).toContain("batch price");
  });

  it("bills each line once at half the price, and gives the hold back as lines end", async () => {
    // One line's worst case at the batch price is about $0.0002: two would not fit at once.
    const { key, id: keyId } = await createKey({
      name: "batch-billing",
      budgets: [{ period: "1d", max_usd: 0.0003 }],
    });
    const text = line("only", { max_tokens: 1000 });
    const file = await (await upload(text, key)).json<{ id: string }>();
    const first = await settled((await (await createBatch(file.id, key)).json<Batch>()).id, key);
    expect(first.request_counts).toEqual({ total: 1, completed: 1, failed: 0 });
    const output = await (await call(`/v1/files/${first.output_file_id}/content`, {}, key)).text();
    const usage = JSON.parse(output).response.body.usage as {
      prompt_tokens: number;
      completion_tokens: number;
      prompt_tokens_details?: { cached_tokens?: number };
    };
    const report = await (
      await call("/v1/usage", {}, key)
    ).json<{
      total: {
        requests: number;
        prompt_tokens: number;
        completion_tokens: number;
        cost_usd: number;
      };
    }>();
    expect(report.total).toMatchObject({
      requests: 1,
      prompt_tokens: usage.prompt_tokens,
      completion_tokens: usage.completion_tokens,
    });
    // warmgate-sim-8b: $0.1 in ($0.025 cached), $0.4 out per million tokens; the batch pays half.
    const cached = usage.prompt_tokens_details?.cached_tokens ?? 0;
    const full =
      ((usage.prompt_tokens - cached) * 0.1 + cached * 0.025 + usage.completion_tokens * 0.4) / 1e6;
    expect(report.total.cost_usd).toBeCloseTo(full / 2, 12);
    // The line is a row of the spend log, under its item id, tagged with its batch.
    const log = await (
      await sendWith(config, adminRequest(`/admin/requests?key_id=${keyId}&tag=batch:${first.id}`))
    ).json<{ data: { id: string; outcome: string; http_status: number; cost_usd: number }[] }>();
    expect(log.data).toHaveLength(1);
    expect(log.data[0]).toMatchObject({ id: `${first.id}-0`, outcome: "ok", http_status: 200 });
    expect(log.data[0]?.cost_usd).toBeCloseTo(full / 2, 12);
    // The first batch's hold is back: a second of the same worst case fits the budget.
    const second = await createBatch(file.id, key);
    expect(second.status).toBe(200);
    await settled((await second.json<Batch>()).id, key);
  });

  it("shows each line as a row of the spend log, page after page", async () => {
    config = inject("warmgateConfig");
    const { key } = await createKey({ name: "batch-log" });
    const origins = (JSON.parse(config) as { regions: { origins: { id: string }[] }[] }).regions
      .flatMap((region) => region.origins)
      .map((origin) => origin.id);
    const ids = Array.from({ length: 501 }, (_, i) => `l${String(i).padStart(3, "0")}`);
    const file = await (
      await upload(ids.map((id) => line(id, { max_tokens: 1 })).join("\n"), key)
    ).json<{ id: string }>();
    const batch = await settled((await (await createBatch(file.id, key)).json<Batch>()).id, key);
    expect(batch.request_counts.completed).toBe(501);
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const query: string = `tag=batch:${batch.id}&limit=500${cursor === null ? "" : `&cursor=${cursor}`}`;
      type Row = { id: string; attempts: { origin: string; result: string }[] };
      type Page = { data: Row[]; next_cursor: string | null };
      const page: Page = await (
        await sendWith(config, adminRequest(`/admin/requests?${query}`))
      ).json<Page>();
      seen.push(...page.data.map((row) => row.id));
      // Each row names the origin that answered its line.
      for (const row of page.data) {
        expect(row.attempts).toEqual([expect.objectContaining({ result: "served" })]);
        expect(origins).toContain(row.attempts[0]?.origin);
      }
      cursor = page.next_cursor;
    } while (cursor !== null);
    expect(seen.toSorted()).toEqual(ids.map((_, i) => `${batch.id}-${i}`).toSorted());
  });

  it("answers 404 for another key's batch", async () => {
    config = inject("warmgateConfig");
    const file = await (await upload(line("a"))).json<{ id: string }>();
    const batch = await (await createBatch(file.id)).json<Batch>();
    const other = await createKey({ name: "other-batches" });
    expect((await call(`/v1/batches/${batch.id}`, {}, other.key)).status).toBe(404);
    await settled(batch.id);
  });
});

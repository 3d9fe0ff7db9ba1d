import { describe, expect, inject, it } from "vitest";
import { createKey } from "../../../support/admin-keys.workers.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../../support/edge-requests.ts";
import { adminRequest, sendWith } from "../../../support/test-origins.workers.ts";

const CONFIG = inject("warmgateConfig");

type LogRow = {
  id: string;
  key_id: string;
  model: string;
  status: string;
  outcome: string | null;
  user: string | null;
  tags: string[];
  prompt_tokens: number | null;
  completion_tokens: number | null;
  cost_usd: number;
  http_status: number | null;
  latency_ms: number | null;
  ttft_ms: number | null;
  region: string | null;
  origin: string | null;
  attempts: unknown[];
};
type LogPage = { data: LogRow[]; has_more: boolean; next_cursor: string | null };

function log(query: string): Promise<Response> {
  return sendWith(CONFIG, adminRequest(`/admin/requests${query}`));
}

async function chat(key: string, body: Record<string, unknown> = {}, tags?: string) {
  const res = await sendWith(
    CONFIG,
    edgeRequest("/v1/chat/completions", {
      body: chatBody(body),
      headers: {
        authorization: `Bearer ${key}`,
        ...(tags === undefined ? {} : { "x-warmgate-tags": tags }),
      },
    }),
  );
  expect(res.status).toBe(200);
  return res.headers.get("x-request-id") ?? "";
}

describe("GET /admin/requests", () => {
  it("lists each request's tokens, cost, latency, origin and attempts, newest first", async () => {
    const { id, key } = await createKey({ name: "spend-log" });
    const first = await chat(key, { user: "ana" }, "exp:1");
    const second = await chat(key, { stream: true, stream_options: { include_usage: true } });
    const res = await log(`?key_id=${id}`);
    expect(res.status).toBe(200);
    const page = await res.json<LogPage>();
    expect(page.data.map((row) => row.id)).toEqual([second, first]);
    const [streamed, whole] = page.data;
    expect(whole).toMatchObject({
      key_id: id,
      status: "settled",
      outcome: "ok",
      user: "ana",
      tags: ["exp:1"],
      http_status: 200,
      ttft_ms: null,
    });
    expect(whole?.prompt_tokens).toBeGreaterThan(0);
    expect(whole?.latency_ms).toBeGreaterThanOrEqual(0);
    expect(whole?.origin).not.toBeNull();
    expect(whole?.attempts.length).toBe(1);
    expect(streamed?.ttft_ms).toBeGreaterThanOrEqual(0);
    // The ledger keeps no prompt and no output.
    expect(JSON.stringify(page)).not.toContain("about the sea");
  });

  it("filters by key, end user, tag, model, status and outcome, across keys", async () => {
    const a = await createKey({ name: "log-a", tags: ["team:a"] });
    const b = await createKey({ name: "log-b" });
    await chat(a.key, { user: "u-filter" });
    await chat(b.key, { user: "u-filter" }, "team:a");
    await chat(b.key, { user: "someone-else" });
    const byUser = await (await log("?user=u-filter")).json<LogPage>();
    expect(new Set(byUser.data.map((row) => row.key_id))).toEqual(new Set([a.id, b.id]));
    const byTag = await (await log("?tag=team:a&user=u-filter")).json<LogPage>();
    expect(byTag.data).toHaveLength(2);
    const model = byTag.data[0]?.model ?? "";
    expect((await (await log(`?key_id=${b.id}&model=${model}`)).json<LogPage>()).data).toHaveLength(
      2,
    );
    expect((await (await log(`?key_id=${b.id}&model=nope`)).json<LogPage>()).data).toHaveLength(0);
    // `status` and `outcome` filter on the rows' fields of those names.
    const rows = async (query: string) =>
      (await (await log(`?key_id=${b.id}&${query}`)).json<LogPage>()).data;
    expect(await rows("status=settled")).toHaveLength(2);
    expect((await rows("status=settled")).every((row) => row.status === "settled")).toBe(true);
    expect(await rows("status=open")).toHaveLength(0);
    expect(await rows("outcome=ok")).toHaveLength(2);
    expect(await rows("outcome=error")).toHaveLength(0);
    expect(await rows("status=settled&outcome=ok")).toHaveLength(2);
    const future = Math.floor(Date.now() / 1_000) + 3_600;
    expect((await (await log(`?key_id=${b.id}&from=${future}`)).json<LogPage>()).data).toHaveLength(
      0,
    );
  });

  it("pages with a cursor, every row once", async () => {
    const { id, key } = await createKey({ name: "log-pages" });
    const ids = [];
    for (let i = 0; i < 5; i++) ids.push(await chat(key));
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const query: string = `?key_id=${id}&limit=2${cursor === null ? "" : `&cursor=${cursor}`}`;
      const page: LogPage = await (await log(query)).json<LogPage>();
      seen.push(...page.data.map((row) => row.id));
      cursor = page.next_cursor;
      expect(page.has_more).toBe(cursor !== null);
    } while (cursor !== null);
    expect(seen).toEqual(ids.toReversed());
  });

  it("exports CSV, quoting fields and defusing formulas", async () => {
    const { id, key } = await createKey({ name: "log-csv" });
    await chat(key, { user: '=HYPERLINK("x"), "quoted"' });
    const res = await log(`?key_id=${id}&format=csv`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toContain("text/csv");
    const [header, line] = (await res.text()).split("\r\n");
    expect(header).toBe(
      "id,key_id,team_id,created_at,model,status,outcome,http_status,user,tags,prompt_tokens,cached_tokens,completion_tokens,cost_usd,latency_ms,ttft_ms,region,origin,attempts",
    );
    expect(line).toContain(`,"'=HYPERLINK(""x""), ""quoted""",`);
    expect(line).toContain(`,${id},`);
  });

  it("refuses bad parameters with OpenAI's 400 naming them", async () => {
    const cases: [string, string][] = [
      ["?limit=0", "limit"],
      ["?status=done", "status"],
      ["?status=ok", "status"],
      ["?outcome=settled", "outcome"],
      ["?cursor=%%%", "cursor"],
      ["?cursor=WzFd", "cursor"],
      ["?from=yesterday", "from"],
      ["?format=xml", "format"],
      ["?tag=a%20b", "tag"],
      ["?prompt=x", "prompt"],
    ];
    for (const [query, param] of cases) {
      const res = await log(query);
      expect(res.status).toBe(400);
      expect((await res.json<ErrorBody>()).error).toMatchObject({
        type: "invalid_request_error",
        param,
      });
    }
    expect((await log("?key_id=aaaaaaaaaaaaaaaa")).status).toBe(404);
  });
});

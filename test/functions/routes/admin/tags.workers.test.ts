import { describe, expect, inject, it } from "vitest";
import { createKey } from "../../../support/admin-keys.workers.ts";
import { type ErrorBody, chatBody, edgeRequest } from "../../../support/edge-requests.ts";
import { adminRequest, sendWith } from "../../../support/test-origins.workers.ts";

const CONFIG = inject("warmgateConfig");

type Totals = { requests: number; cost_usd: number };

function admin(path: string, method = "GET", body?: unknown): Promise<Response> {
  const request = adminRequest(path, body);
  return sendWith(CONFIG, new Request(request, { method }));
}

function chat(key: string, tags?: string): Promise<Response> {
  return sendWith(
    CONFIG,
    edgeRequest("/v1/chat/completions", {
      body: chatBody(),
      headers: {
        authorization: `Bearer ${key}`,
        ...(tags === undefined ? {} : { "x-warmgate-tags": tags }),
      },
    }),
  );
}

describe("tags and metadata on keys", () => {
  it("keeps a key's tags and metadata, and changes them with PATCH", async () => {
    const { id } = await createKey({
      name: "tagged",
      tags: ["team:search", "prod", "prod"],
      metadata: { owner: "ana", cost_center: 42, pilot: true, note: null },
    });
    const read = await (await admin(`/admin/keys/${id}`)).json<Record<string, unknown>>();
    expect(read).toMatchObject({
      tags: ["team:search", "prod"],
      metadata: { owner: "ana", cost_center: 42, pilot: true, note: null },
    });
    const patched = await admin(`/admin/keys/${id}`, "PATCH", { tags: ["staging"] });
    expect(await patched.json()).toMatchObject({
      tags: ["staging"],
      metadata: { owner: "ana" },
    });
  });

  it("refuses bad tags and metadata with a 400 naming the field", async () => {
    const bodies: [Record<string, unknown>, string][] = [
      [{ tags: ["has space"] }, "tags[0]"],
      [{ tags: Array.from({ length: 33 }, (_, i) => `t${i}`) }, "tags"],
      [{ metadata: { nested: { no: 1 } } }, "metadata.nested"],
      [
        { metadata: Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, i])) },
        "metadata",
      ],
      [{ metadata: ["not", "an", "object"] }, "metadata"],
    ];
    for (const [body, param] of bodies) {
      const res = await admin("/admin/keys", "POST", { name: "bad-tags", ...body });
      expect(res.status).toBe(400);
      expect((await res.json<ErrorBody>()).error).toMatchObject({
        type: "invalid_request_error",
        param,
      });
    }
  });
});

describe("a request's tags (x-warmgate-tags)", () => {
  it("are recorded on its ledger row with its key's, and spend is reported per tag", async () => {
    const { id, key } = await createKey({ name: "tag-spend", tags: ["svc:checkout"] });
    // The first request is admitted exactly, the next ones under the isolate's lease: the
    // tags reach the ledger row either way.
    const first = await chat(key, "feature:search, ab=1");
    expect(first.status).toBe(200);
    const requestId = first.headers.get("x-request-id") ?? "";
    expect((await chat(key, "feature:search")).status).toBe(200);
    expect((await chat(key)).status).toBe(200);
    const record = await sendWith(
      CONFIG,
      edgeRequest(`/v1/usage/requests/${requestId}`, {
        headers: { authorization: `Bearer ${key}` },
      }),
    );
    expect(await record.json()).toMatchObject({
      tags: ["svc:checkout", "feature:search", "ab=1"],
    });
    const search = await admin(`/admin/usage?key_id=${id}&tag=feature:search`);
    expect(await search.json()).toMatchObject({ tag: "feature:search", total: { requests: 2 } });
    const svc = await admin(`/admin/usage?tag=svc:checkout`);
    expect((await svc.json<{ total: Totals }>()).total.requests).toBe(3);
    const perTag = await admin(`/admin/usage/tags?key_id=${id}`);
    expect(perTag.status).toBe(200);
    const { data } = await perTag.json<{ data: (Totals & { tag: string })[] }>();
    expect(data.map((row) => [row.tag, row.requests])).toEqual([
      ["ab=1", 1],
      ["feature:search", 2],
      ["svc:checkout", 3],
    ]);
  });

  it("refuses a malformed or overlong header with a 400 before anything is reserved", async () => {
    const { key } = await createKey({ name: "tag-bad", limits: { concurrency: 1 } });
    const many = Array.from({ length: 17 }, (_, i) => `t${i}`).join(",");
    for (const header of ["a b", "ok,,", "x".repeat(65), many]) {
      const res = await chat(key, header);
      expect(res.status).toBe(400);
      expect((await res.json<ErrorBody>()).error).toMatchObject({
        type: "invalid_request_error",
        param: "x-warmgate-tags",
        code: "invalid_value",
      });
    }
    // Its one slot was never taken.
    expect((await chat(key, "fine")).status).toBe(200);
  });

  it("refuses a bad tag filter on the usage API", async () => {
    const res = await admin("/admin/usage?tag=a%20b");
    expect(res.status).toBe(400);
    expect((await res.json<ErrorBody>()).error.param).toBe("tag");
    const unknown = await admin("/admin/usage/tags?user=x");
    expect((await unknown.json<ErrorBody>()).error.code).toBe("unsupported_parameter");
  });
});

import { describe, expect, it } from "vitest";
import * as fc from "fast-check";
import {
  ITEM_BODY_ENVELOPE_CONTENT_TYPE,
  decodeEnvelope,
  encodeEnvelope,
} from "../../../contracts/protocol/envelope.ts";
import { BatchRequestSchema, type BatchItem } from "../../../contracts/protocol/schema.ts";

const item = (id: string, body: string): BatchItem => ({
  id,
  path: "/v1/chat/completions",
  body,
  headers: { "x-request-id": id },
});

describe("the envelope on the wire", () => {
  it("sends one item's body after the envelope, as it is, and several inside it", () => {
    const body = '{"model":"m",\n "messages":[{"role":"user","content":"say \\"hi\\" ✓"}]}';
    const one = encodeEnvelope({ v: 1, batch_id: "b", items: [item("a", body)], raw: true });
    expect(one.contentType).toBe(ITEM_BODY_ENVELOPE_CONTENT_TYPE);
    expect(one.body.endsWith(`\n${body}`)).toBe(true);
    expect(JSON.parse(one.body.slice(0, one.body.indexOf("\n")))).toEqual({
      v: 1,
      batch_id: "b",
      items: [{ id: "a", path: "/v1/chat/completions", headers: { "x-request-id": "a" } }],
      raw: true,
    });
    const two = encodeEnvelope({ v: 1, batch_id: "b", items: [item("a", body), item("b", body)] });
    expect(two.contentType).toBe("application/json");
    expect(JSON.parse(two.body)).toEqual({
      v: 1,
      batch_id: "b",
      items: [item("a", body), item("b", body)],
    });
  });

  it("reads back every envelope it writes, whatever the bodies hold", () => {
    fc.assert(
      fc.property(
        fc.array(fc.string({ unit: "binary" }), { minLength: 1, maxLength: 3 }),
        fc.string(),
        (bodies, batchId) => {
          const batch = {
            v: 1 as const,
            batch_id: `b${batchId}`,
            items: bodies.map((body, i) => item(`i${i}`, body)),
          };
          const { contentType, body } = encodeEnvelope(batch);
          const decoded = BatchRequestSchema.parse(decodeEnvelope(contentType, body));
          expect(decoded).toEqual(batch);
        },
      ),
    );
  });

  it("reads a JSON envelope whatever its media type says, but the one with a body after it", () => {
    const batch = { v: 1, batch_id: "b", items: [item("a", "{}")] };
    expect(decodeEnvelope("", JSON.stringify(batch))).toEqual(batch);
    expect(decodeEnvelope("application/json; charset=utf-8", JSON.stringify(batch))).toEqual(batch);
    expect(() => decodeEnvelope(ITEM_BODY_ENVELOPE_CONTENT_TYPE, JSON.stringify(batch))).toThrow(
      /after a line feed/,
    );
  });
});

import { createHmac } from "node:crypto";
import { describe, expect, it } from "vitest";
import { signAlert, verifyAlert } from "../../contracts/alert-signature.ts";

describe("alert signatures", () => {
  it("sign `<t>.<body>` with HMAC-SHA256, as a receiver recomputes it with any HMAC library", async () => {
    const body = '{"type":"soft_budget_crossed"}';
    const header = await signAlert("s3cret", 1_800_000_000, body);
    const expected = createHmac("sha256", "s3cret").update(`1800000000.${body}`).digest("hex");
    expect(header).toBe(`t=1800000000,v1=${expected}`);
  });

  it("verify only the body, secret and recent time they were made for", async () => {
    const body = '{"spent_usd":1}';
    const header = await signAlert("s3cret", 1_800_000_000, body);
    expect(await verifyAlert("s3cret", header, body, 1_800_000_100)).toBe(true);
    expect(await verifyAlert("s3cret", header, '{"spent_usd":2}', 1_800_000_100)).toBe(false);
    expect(await verifyAlert("other", header, body, 1_800_000_100)).toBe(false);
    // Replayed after the tolerance (five minutes by default).
    expect(await verifyAlert("s3cret", header, body, 1_800_000_301)).toBe(false);
    expect(await verifyAlert("s3cret", "garbage", body, 1_800_000_000)).toBe(false);
  });
});

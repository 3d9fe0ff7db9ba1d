import { describe, expect, it } from "vitest";
import { failedEverywhere, originFailure } from "../../contracts/errors.ts";

describe("origin failures", () => {
  it("always tell a client refused for want of a healthy origin when to come back", () => {
    const error = originFailure("unavailable");
    expect(error.status).toBe(503);
    expect(error.code).toBe("no_healthy_origin");
    expect(error.headers["retry-after"]).toBe("1");
    expect(originFailure("bad_answer").headers["retry-after"]).toBeUndefined();
  });
});

describe("a request that failed on two origins alike", () => {
  it("is a 400 with the engine's message when the engine said the input was bad", () => {
    const body = JSON.stringify({
      error: { message: "bad schema", type: "BadRequestError", code: 400 },
    });
    const error = failedEverywhere(body);
    expect(error.status).toBe(400);
    expect(error.toBody().error).toMatchObject({
      message: "bad schema",
      type: "invalid_request_error",
    });
  });

  it("is a 502 origin_error otherwise, whatever the engine's body holds", () => {
    for (const body of ["", "not json", JSON.stringify({ error: { message: "boom" } })]) {
      const error = failedEverywhere(body);
      expect(error.status).toBe(502);
      expect(error.code).toBe("origin_error");
    }
  });
});

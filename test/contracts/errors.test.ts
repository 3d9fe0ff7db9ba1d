import { describe, expect, it } from "vitest";
import {
  ApiError,
  ERROR_CODES,
  failedEverywhere,
  invalidApiKey,
  isErrorCode,
  isErrorStatus,
  missingApiKey,
  modelNotFound,
  notFound,
  openAIErrorBody,
  originFailure,
} from "../../contracts/errors.ts";

describe("origin failures", () => {
  it("always tell a client refused for want of a healthy origin when to come back", () => {
    const error = originFailure("unavailable");
    expect(error.status).toBe(503);
    expect(error.code).toBe("no_healthy_origin");
    expect(error.headers["retry-after"]).toBe("1");
    // The OpenAI SDKs read the milliseconds first.
    expect(error.headers["retry-after-ms"]).toBe("1000");
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

describe("the OpenAI error body", () => {
  it("is OpenAI's shape, its four fields in OpenAI's order, param and code null unless given", () => {
    const body = openAIErrorBody("No.", "invalid_request_error", null);
    expect(JSON.stringify(body)).toBe(
      '{"error":{"message":"No.","type":"invalid_request_error","param":null,"code":null}}',
    );
    expect(openAIErrorBody("Bad.", "invalid_request_error", "invalid_value", "n")).toEqual({
      error: { message: "Bad.", type: "invalid_request_error", param: "n", code: "invalid_value" },
    });
  });

  it("is what an ApiError answers", () => {
    const error = new ApiError(409, "Busy.", { type: "server_error", code: "batch_conflict" });
    expect(error.toBody()).toEqual(openAIErrorBody("Busy.", "server_error", "batch_conflict"));
  });
});

describe("the code catalogue", () => {
  it("names every code in snake case and says what each means", () => {
    for (const [code, meaning] of Object.entries(ERROR_CODES)) {
      expect(code).toMatch(/^[a-z]+(_[a-z]+)*$/);
      expect(meaning.length).toBeGreaterThan(0);
    }
  });

  it("knows its own codes and no others", () => {
    expect(isErrorCode("queue_full")).toBe(true);
    expect(isErrorCode("toString")).toBe(false);
    expect(isErrorCode("something_else")).toBe(false);
  });
});

describe("the shared factories", () => {
  it("answer a missing and a refused key 401 invalid_api_key, never quoting a key", () => {
    for (const error of [missingApiKey(), invalidApiKey(), invalidApiKey("Revoked.")]) {
      expect(error.status).toBe(401);
      expect(error.toBody().error).toMatchObject({
        type: "invalid_request_error",
        code: "invalid_api_key",
        param: null,
      });
    }
    expect(invalidApiKey().message).toBe("Incorrect API key provided.");
    expect(missingApiKey().message).toContain("You didn't provide an API key.");
  });

  it("answer a thing looked up by name 404 with its own code and param", () => {
    const error = notFound("No origin 'x' is configured.", "origin_not_found", "origin");
    expect({ status: error.status, ...error.toBody().error }).toEqual({
      status: 404,
      message: "No origin 'x' is configured.",
      type: "invalid_request_error",
      param: "origin",
      code: "origin_not_found",
    });
    expect(modelNotFound("m").toBody().error).toMatchObject({
      code: "model_not_found",
      param: "model",
    });
  });

  it("tell an error status from any other", () => {
    expect([400, 429, 503].every(isErrorStatus)).toBe(true);
    expect([200, 302, 499, 600].some(isErrorStatus)).toBe(false);
  });
});

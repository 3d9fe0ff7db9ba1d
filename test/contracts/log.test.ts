import { afterEach, describe, expect, it, vi } from "vitest";
import { logError, logWarn } from "../../contracts/log.ts";

afterEach(() => {
  vi.restoreAllMocks();
});

describe("structured logs", () => {
  it("writes one JSON object per line with the level, message and fields", () => {
    const error = vi.spyOn(console, "error").mockImplementation(() => {});
    const warn = vi.spyOn(console, "warn").mockImplementation(() => {});
    logError("settling failed", { key_id: "k1", count: 2, error: new TypeError("boom") });
    logWarn("origin answered", { status: 503, request_id: "req_1", origin: undefined });
    expect(JSON.parse(String(error.mock.calls[0]?.[0]))).toEqual({
      level: "error",
      msg: "settling failed",
      key_id: "k1",
      count: 2,
      error: "TypeError: boom",
    });
    expect(JSON.parse(String(warn.mock.calls[0]?.[0]))).toEqual({
      level: "warn",
      msg: "origin answered",
      status: 503,
      request_id: "req_1",
    });
  });
});

import { describe, expect, it } from "vitest";
import { openAIErrorBody } from "../../contracts/errors.ts";
import { OriginError } from "../../origin/http.ts";

describe("an origin's own error", () => {
  it("answers the shared OpenAI body, its type following its status", () => {
    const cases = [
      [400, "invalid_request_error"],
      [401, "authentication_error"],
      [409, "invalid_request_error"],
      [429, "rate_limit_error"],
      [500, "server_error"],
    ] as const;
    for (const [status, type] of cases) {
      const error = new OriginError(status, "Why.", "invalid_batch", "items");
      expect(error.toBody()).toEqual(openAIErrorBody("Why.", type, "invalid_batch", "items"));
    }
  });
});

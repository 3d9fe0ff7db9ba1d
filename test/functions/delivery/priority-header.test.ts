import { describe, expect, it } from "vitest";
import { checkPriority } from "../../../functions/delivery/batcher-plan.ts";

describe("x-warmgate-priority", () => {
  it("takes a lane's name or number, and no header", () => {
    for (const value of [undefined, "high", "standard", "LOW", " low ", "0", "2", "99"]) {
      expect(() => checkPriority(value)).not.toThrow();
    }
  });

  it("answers 400 invalid_value for anything else", () => {
    for (const value of ["ultra", "", "-1", "100", "1.5"]) {
      expect(() => checkPriority(value)).toThrow(
        expect.objectContaining({
          status: 400,
          param: "x-warmgate-priority",
          code: "invalid_value",
        }),
      );
    }
  });
});

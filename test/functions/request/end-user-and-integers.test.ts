import { describe, expect, it } from "vitest";
import { z } from "zod";
import {
  ChatCompletionRequestSchema,
  CompletionRequestSchema,
} from "../../../functions/request/openai-schemas.ts";
import {
  EmbeddingsRequestSchema,
  ResponsesRequestSchema,
} from "../../../functions/request/responses-schemas.ts";
import { MAX_USER_LENGTH } from "../../../functions/request/bounds.ts";
import { FIRST_ISSUE, validationError } from "../../../functions/request/validation-errors.ts";

type Schema = z.ZodType;

function errorOf(schema: Schema, body: unknown) {
  const result = schema.safeParse(body, FIRST_ISSUE);
  if (result.success) throw new Error("body was accepted");
  return validationError(result.error.issues).toBody().error;
}

const chat = { model: "m", messages: [{ role: "user", content: "hi" }] };
const bodies: [string, Schema, Record<string, unknown>][] = [
  ["chat", ChatCompletionRequestSchema, chat],
  ["completion", CompletionRequestSchema, { model: "m", prompt: "hi" }],
  ["responses", ResponsesRequestSchema, { model: "m", input: "hi" }],
  ["embeddings", EmbeddingsRequestSchema, { model: "m", input: "hi" }],
];

describe("the end user's id (`user`)", () => {
  it.each(bodies)("is at most 256 characters (%s)", (_, schema, body) => {
    const longest = "u".repeat(MAX_USER_LENGTH);
    expect(schema.safeParse({ ...body, user: longest }).success).toBe(true);
    expect(errorOf(schema, { ...body, user: `${longest}u` })).toMatchObject({
      param: "user",
      code: "string_above_max_length",
    });
  });
});

describe("integer parameters", () => {
  it("are named integers when out of range", () => {
    expect(
      errorOf(ResponsesRequestSchema, { model: "m", input: "hi", max_output_tokens: -1 }),
    ).toMatchObject({ param: "max_output_tokens", code: "integer_below_min_value" });
    expect(
      errorOf(EmbeddingsRequestSchema, { model: "m", input: "hi", dimensions: -3 }),
    ).toMatchObject({ param: "dimensions", code: "integer_below_min_value" });
  });
});

describe("a refinement's own message", () => {
  it("ends in one full stop, whether it was written with one or not", () => {
    for (const message of ["Expected soft_usd below max_usd.", "Expected soft_usd below max_usd"]) {
      const schema = z.object({ soft_usd: z.number() }).refine(() => false, {
        message,
        path: ["soft_usd"],
      });
      expect(errorOf(schema, { soft_usd: 2 }).message).toBe(
        "Invalid value for 'soft_usd': Expected soft_usd below max_usd.",
      );
    }
  });
});

/**
 * Reading the JSON bodies of the admin and token routes: JSON first, then the zod schema,
 * each failure an OpenAI-shaped 400 naming the field; an empty body counts as `{}`.
 */
import type { z } from "zod";
import { ApiError, invalidJson } from "./errors.ts";

/** Parses and validates a small JSON request body; throws {@link ApiError} on bad input. */
export async function readJsonBody<S extends z.ZodType>(
  request: Request,
  schema: S,
): Promise<z.infer<S>> {
  const text = await request.text();
  let raw: unknown = {};
  if (text.trim() !== "") {
    try {
      raw = JSON.parse(text);
    } catch {
      throw invalidJson();
    }
  }
  const parsed = schema.safeParse(raw);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0];
  throw new ApiError(400, issue?.message ?? "Invalid request body.", {
    type: "invalid_request_error",
    param: issue === undefined || issue.path.length === 0 ? null : issue.path.join("."),
  });
}

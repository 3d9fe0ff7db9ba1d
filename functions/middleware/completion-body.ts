/**
 * The validator of completion bodies: JSON content type, the configured size limit, JSON
 * syntax, then the OpenAI schema. It keeps the exact body text: that, not a
 * re-serialisation, is what the origin receives.
 * See docs/edge.md.
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv, CompletionBody } from "../app-env.ts";
import { invalidJson } from "../../contracts/errors.ts";
import { readBodyText, requireJsonType } from "../json-body.ts";
import { ChatCompletionRequestSchema, CompletionRequestSchema } from "../openai-schemas.ts";
import { validationError } from "../validation-errors.ts";

/** Validates the body of `/v1/chat/completions` (`chat`) or `/v1/completions` (`completion`). */
export function completionBody(kind: CompletionBody["kind"]) {
  return createMiddleware<AppEnv>(async function validateCompletionBody(c, next) {
    requireJsonType(c.req.raw);
    const text = await readBodyText(c.req.raw, c.var.config.limits.max_body_bytes);
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      throw invalidJson();
    }
    if (kind === "chat") {
      const result = ChatCompletionRequestSchema.safeParse(json, { reportInput: true });
      if (!result.success) throw validationError(result.error.issues);
      c.set("completion", { kind, body: result.data, text });
    } else {
      const result = CompletionRequestSchema.safeParse(json, { reportInput: true });
      if (!result.success) throw validationError(result.error.issues);
      c.set("completion", { kind, body: result.data, text });
    }
    await next();
  });
}

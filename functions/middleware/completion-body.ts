/**
 * The validator of completion bodies: JSON content type, the configured size limit, how
 * deep the JSON nests, JSON syntax, then the OpenAI schema. It keeps the exact body text:
 * that, not a re-serialisation, is what the origin receives.
 * See docs/edge.md.
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv, CompletionBody } from "../app-env.ts";
import { invalidJson } from "../../contracts/errors.ts";
import { readBodyText, requireJsonType } from "../request/json-body.ts";
import { BODY_SCHEMAS } from "../request/body-schemas.ts";
import { SCHEMA_PATHS, findDeepNesting, nestingTooDeep } from "../request/bounds.ts";
import { FIRST_ISSUE, validationError } from "../request/validation-errors.ts";

/**
 * Validates the body of `/v1/chat/completions` (`chat`), `/v1/completions` (`completion`),
 * `/v1/responses` (`responses`) or `/v1/embeddings` (`embeddings`).
 */
export function completionBody(kind: CompletionBody["kind"]) {
  return createMiddleware<AppEnv>(async function validateCompletionBody(c, next) {
    requireJsonType(c.req.raw);
    const text = await readBodyText(c.req.raw, c.get("config").limits.maxBodyBytes);
    // Measured on the text: parsing a deeply nested body costs far more than its size says.
    const deep = findDeepNesting(text, SCHEMA_PATHS[kind]);
    if (deep !== undefined) throw nestingTooDeep(deep);
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      throw invalidJson();
    }
    const result = BODY_SCHEMAS[kind].safeParse(json, FIRST_ISSUE);
    if (!result.success) throw validationError(result.error.issues);
    // The schema was chosen by `kind`, so the body is that kind's.
    c.set("completion", { kind, body: result.data, text } as CompletionBody);
    await next();
  });
}

/**
 * The OpenAI schema each kind of completion body is checked against: on the request path
 * and for every line of a batch input file.
 * See docs/edge.md.
 */
import { ChatCompletionRequestSchema, CompletionRequestSchema } from "./openai-schemas.ts";
import { EmbeddingsRequestSchema, ResponsesRequestSchema } from "./responses-schemas.ts";

export const BODY_SCHEMAS = {
  chat: ChatCompletionRequestSchema,
  completion: CompletionRequestSchema,
  responses: ResponsesRequestSchema,
  embeddings: EmbeddingsRequestSchema,
} as const;

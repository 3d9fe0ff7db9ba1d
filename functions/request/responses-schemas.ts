/**
 * zod schemas for OpenAI's `POST /v1/responses` and `POST /v1/embeddings` bodies: what
 * OpenAI rejects is rejected, other fields pass (`.loose()`), and the fields that need a
 * stored response (`previous_response_id`, `conversation`, `store: true`, `background`) are
 * refused by name, as the gateway keeps no responses.
 * See docs/edge.md.
 */
import { z } from "zod";
import {
  checkStreamOptions,
  functionName,
  nullableOptional,
  streamOptionsSchema,
} from "./openai-schemas.ts";
import { MAX_MESSAGES, MAX_PROMPTS, MAX_TOOLS, MAX_USER_LENGTH } from "./bounds.ts";

const inputItem = z.looseObject({
  type: z.string().optional(),
  role: z.enum(["user", "assistant", "system", "developer"]).optional(),
  content: z.union([z.string(), z.array(z.looseObject({ type: z.string() }))]).optional(),
});

// Function tools are checked; other tool types (web search, MCP, …) pass to the engine.
const responsesTool = z.union([
  z.looseObject({
    type: z.literal("function"),
    name: functionName,
    description: nullableOptional(z.string()),
    parameters: nullableOptional(z.record(z.string(), z.unknown())),
    strict: nullableOptional(z.boolean()),
  }),
  z.looseObject({ type: z.string().regex(/^(?!function$)/, "a tool type other than function") }),
]);

const responsesToolChoice = z.union([
  z.enum(["none", "auto", "required"]),
  z.looseObject({ type: z.string() }),
]);

/** Fields the gateway cannot serve, as it stores no responses: when each is refused, and why. */
const STORED_FIELDS: [field: string, refused: (value: unknown) => boolean, message: string][] = [
  [
    "previous_response_id",
    (v) => v != null,
    "'previous_response_id' needs stored responses, which this gateway does not keep; send the whole conversation in 'input' instead.",
  ],
  [
    "conversation",
    (v) => v != null,
    "'conversation' needs stored conversations, which this gateway does not keep; send the whole conversation in 'input' instead.",
  ],
  [
    "store",
    (v) => v === true,
    "'store: true' asks to keep the response, which this gateway does not do; send 'store: false' or leave it out.",
  ],
  [
    "background",
    (v) => v === true,
    "'background' responses are polled from a response store, which this gateway does not keep; stream the response instead.",
  ],
];

/** Body of `POST /v1/responses`. */
export const ResponsesRequestSchema = z
  .looseObject({
    model: z.string().min(1),
    input: z.union([z.string(), z.array(inputItem).min(1).max(MAX_MESSAGES)]),
    instructions: nullableOptional(z.string()),
    max_output_tokens: nullableOptional(z.int().min(1)),
    temperature: nullableOptional(z.number().min(0).max(2)),
    top_p: nullableOptional(z.number().min(0).max(1)),
    top_logprobs: nullableOptional(z.int().min(0).max(20)),
    stream: nullableOptional(z.boolean()),
    stream_options: streamOptionsSchema,
    tools: z.array(responsesTool).max(MAX_TOOLS).optional(),
    tool_choice: responsesToolChoice.optional(),
    parallel_tool_calls: nullableOptional(z.boolean()),
    text: nullableOptional(
      z.looseObject({ format: z.looseObject({ type: z.string() }).optional() }),
    ),
    include: nullableOptional(z.array(z.string())),
    metadata: nullableOptional(z.record(z.string(), z.string())),
    store: nullableOptional(z.boolean()),
    background: nullableOptional(z.boolean()),
    previous_response_id: nullableOptional(z.string()),
    conversation: nullableOptional(z.unknown()),
    truncation: nullableOptional(z.enum(["auto", "disabled"])),
    user: z.string().max(MAX_USER_LENGTH).optional(),
  })
  .superRefine((body, ctx) => {
    checkStreamOptions(body, ctx);
    for (const [field, refused, message] of STORED_FIELDS) {
      if (refused((body as Record<string, unknown>)[field])) {
        ctx.addIssue({
          code: "custom",
          path: [field],
          message,
          params: { openai: "unsupported_parameter", verbatim: true },
        });
      }
    }
  });

/** A parsed Responses API request. */
export type ResponsesRequest = z.output<typeof ResponsesRequestSchema>;

const tokenList = z.array(z.int().min(0)).min(1);

/** Body of `POST /v1/embeddings`: text, texts, tokens or token lists. */
export const EmbeddingsRequestSchema = z.looseObject({
  model: z.string().min(1),
  input: z.union([
    z.string().min(1),
    z.array(z.string().min(1)).min(1).max(MAX_PROMPTS),
    tokenList,
    z.array(tokenList).min(1).max(MAX_PROMPTS),
  ]),
  encoding_format: nullableOptional(z.enum(["float", "base64"])),
  dimensions: nullableOptional(z.int().min(1)),
  user: z.string().max(MAX_USER_LENGTH).optional(),
});

/** A parsed embeddings request. */
export type EmbeddingsRequest = z.output<typeof EmbeddingsRequestSchema>;

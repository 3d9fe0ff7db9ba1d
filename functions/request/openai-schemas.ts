/**
 * zod schemas for OpenAI's `POST /v1/chat/completions` and `POST /v1/completions` bodies.
 *
 * They reject what OpenAI rejects (types, ranges, enums, required fields) and let every
 * other field through (`.loose()`): engines such as vLLM accept extensions (`top_k`,
 * `guided_json`, …) and the original body text is what reaches the origin anyway.
 * See docs/edge.md.
 */
import { z } from "zod";
import {
  MAX_LOGIT_BIAS,
  MAX_MESSAGES,
  MAX_N,
  MAX_PROMPTS,
  MAX_SEQUENCES,
  MAX_STOP,
  MAX_TOOL_CALLS,
  MAX_TOOLS,
  MAX_USER_LENGTH,
  maxEntries,
} from "./bounds.ts";

/** A field that may be absent or null. */
export const nullableOptional = <T extends z.ZodType>(schema: T) => schema.nullable().optional();

const stopSchema = nullableOptional(z.union([z.string(), z.array(z.string()).max(MAX_STOP)]));

export const streamOptionsSchema = nullableOptional(
  z.looseObject({
    include_usage: z.boolean().optional(),
    include_obfuscation: z.boolean().optional(),
  }),
);

const logitBiasSchema = nullableOptional(
  z.record(z.string(), z.number().min(-100).max(100)).superRefine(maxEntries(MAX_LOGIT_BIAS)),
);

const textPart = z.looseObject({ type: z.literal("text"), text: z.string() });
const imagePart = z.looseObject({
  type: z.literal("image_url"),
  image_url: z.looseObject({
    url: z.string(),
    detail: z.enum(["auto", "low", "high"]).optional(),
  }),
});
const audioPart = z.looseObject({
  type: z.literal("input_audio"),
  input_audio: z.looseObject({ data: z.string(), format: z.enum(["wav", "mp3"]) }),
});
const filePart = z.looseObject({
  type: z.literal("file"),
  file: z.looseObject({
    file_data: z.string().optional(),
    file_id: z.string().optional(),
    filename: z.string().optional(),
  }),
});
const refusalPart = z.looseObject({ type: z.literal("refusal"), refusal: z.string() });

const textContent = z.union([z.string(), z.array(textPart)]);
const userContent = z.union([
  z.string(),
  z.array(z.discriminatedUnion("type", [textPart, imagePart, audioPart, filePart])),
]);
const assistantContent = z.union([
  z.string(),
  z.array(z.discriminatedUnion("type", [textPart, refusalPart])),
]);

const functionCall = z.looseObject({ name: z.string(), arguments: z.string() });

/** A tool call an assistant message made (function tools, and custom tools' free text). */
const toolCall = z.discriminatedUnion("type", [
  z.looseObject({ id: z.string(), type: z.literal("function"), function: functionCall }),
  z.looseObject({
    id: z.string(),
    type: z.literal("custom"),
    custom: z.looseObject({ name: z.string(), input: z.string() }),
  }),
]);

const name = z.string().optional();

/** One chat message, discriminated by `role` like OpenAI's API. */
export const ChatMessageSchema = z.discriminatedUnion("role", [
  z.looseObject({ role: z.literal("developer"), content: textContent, name }),
  z.looseObject({ role: z.literal("system"), content: textContent, name }),
  z.looseObject({ role: z.literal("user"), content: userContent, name }),
  z
    .looseObject({
      role: z.literal("assistant"),
      content: nullableOptional(assistantContent),
      refusal: nullableOptional(z.string()),
      tool_calls: z.array(toolCall).max(MAX_TOOL_CALLS).optional(),
      function_call: nullableOptional(functionCall),
      audio: nullableOptional(z.looseObject({ id: z.string() })),
      name,
    })
    // OpenAI: an assistant message needs `content` unless it carries tool or function calls.
    .refine(
      (m) =>
        (m.content !== undefined && m.content !== null) ||
        (m.tool_calls !== undefined && m.tool_calls.length > 0) ||
        (m.function_call !== undefined && m.function_call !== null) ||
        (m.audio !== undefined && m.audio !== null),
      { message: "expected a string or array of objects", path: ["content"], abort: true },
    ),
  z.looseObject({ role: z.literal("tool"), content: textContent, tool_call_id: z.string() }),
  z.looseObject({ role: z.literal("function"), content: z.string().nullable(), name: z.string() }),
]);

// OpenAI: function names are a-z, A-Z, 0-9, underscores and dashes, at most 64 characters.
export const functionName = z
  .string()
  .regex(/^[a-zA-Z0-9_-]{1,64}$/, "string does not match pattern '^[a-zA-Z0-9_-]{1,64}$'");

const toolSchema = z.discriminatedUnion("type", [
  z.looseObject({
    type: z.literal("function"),
    function: z.looseObject({
      name: functionName,
      description: z.string().optional(),
      parameters: z.record(z.string(), z.unknown()).optional(),
      strict: nullableOptional(z.boolean()),
    }),
  }),
  z.looseObject({
    type: z.literal("custom"),
    custom: z.looseObject({ name: functionName, description: z.string().optional() }),
  }),
]);

const toolChoiceSchema = z.union([
  z.enum(["none", "auto", "required"]),
  z.discriminatedUnion("type", [
    z.looseObject({ type: z.literal("function"), function: z.looseObject({ name: z.string() }) }),
    z.looseObject({ type: z.literal("custom"), custom: z.looseObject({ name: z.string() }) }),
    z.looseObject({
      type: z.literal("allowed_tools"),
      allowed_tools: z.looseObject({
        mode: z.enum(["auto", "required"]),
        tools: z.array(z.record(z.string(), z.unknown())).max(MAX_TOOLS),
      }),
    }),
  ]),
]);

const responseFormatSchema = z.discriminatedUnion("type", [
  z.looseObject({ type: z.literal("text") }),
  z.looseObject({ type: z.literal("json_object") }),
  z.looseObject({
    type: z.literal("json_schema"),
    json_schema: z.looseObject({
      name: functionName,
      description: z.string().optional(),
      schema: z.record(z.string(), z.unknown()).optional(),
      strict: nullableOptional(z.boolean()),
    }),
  }),
]);

/** Fields both endpoints share, with OpenAI's ranges. */
const samplingFields = {
  model: z.string().min(1),
  temperature: nullableOptional(z.number().min(0).max(2)),
  top_p: nullableOptional(z.number().min(0).max(1)),
  n: nullableOptional(z.int().min(1).max(MAX_N)),
  stop: stopSchema,
  seed: nullableOptional(z.int()),
  stream: nullableOptional(z.boolean()),
  stream_options: streamOptionsSchema,
  presence_penalty: nullableOptional(z.number().min(-2).max(2)),
  frequency_penalty: nullableOptional(z.number().min(-2).max(2)),
  logit_bias: logitBiasSchema,
  user: z.string().max(MAX_USER_LENGTH).optional(),
  max_tokens: nullableOptional(z.int().min(1)),
};

/** OpenAI refuses `stream_options` unless `stream` is true. */
export function checkStreamOptions(
  body: { stream?: boolean | null | undefined; stream_options?: unknown },
  ctx: z.RefinementCtx,
): void {
  if (body.stream_options != null && body.stream !== true) {
    ctx.addIssue({
      code: "custom",
      path: ["stream_options"],
      message: "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
      params: { openai: "invalid_value", verbatim: true },
    });
  }
}

/** Body of `POST /v1/chat/completions`. */
export const ChatCompletionRequestSchema = z
  .looseObject({
    ...samplingFields,
    messages: z.array(ChatMessageSchema).min(1).max(MAX_MESSAGES),
    max_completion_tokens: nullableOptional(z.int().min(1)),
    logprobs: nullableOptional(z.boolean()),
    top_logprobs: nullableOptional(z.int().min(0).max(20)),
    tools: z.array(toolSchema).max(MAX_TOOLS).optional(),
    tool_choice: toolChoiceSchema.optional(),
    parallel_tool_calls: z.boolean().optional(),
    response_format: responseFormatSchema.optional(),
    functions: z
      .array(z.looseObject({ name: functionName }))
      .max(MAX_TOOLS)
      .optional(),
    function_call: z
      .union([z.enum(["none", "auto"]), z.looseObject({ name: z.string() })])
      .optional(),
    metadata: nullableOptional(z.record(z.string(), z.string())),
    store: nullableOptional(z.boolean()),
    modalities: nullableOptional(z.array(z.enum(["text", "audio"]))),
    reasoning_effort: nullableOptional(z.enum(["minimal", "low", "medium", "high"])),
    service_tier: nullableOptional(z.enum(["auto", "default", "flex", "scale", "priority"])),
  })
  .superRefine((body, ctx) => {
    checkStreamOptions(body, ctx);
    // OpenAI: `top_logprobs` is only valid together with `logprobs: true`.
    if (body.top_logprobs != null && body.logprobs !== true) {
      ctx.addIssue({
        code: "custom",
        path: ["logprobs"],
        message: "Invalid value for 'logprobs': must be true when 'top_logprobs' is specified.",
        params: { openai: "invalid_value", verbatim: true },
      });
    }
    if (body.tool_choice !== undefined && body.tool_choice !== "none" && !body.tools?.length) {
      if (body.tool_choice !== "auto") {
        ctx.addIssue({
          code: "custom",
          path: ["tool_choice"],
          message:
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
          params: { openai: "invalid_value", verbatim: true },
        });
      }
    }
  });

/** A parsed chat completion request. */
export type ChatCompletionRequest = z.output<typeof ChatCompletionRequestSchema>;
/** A parsed chat message. */
export type ChatMessage = z.output<typeof ChatMessageSchema>;

/**
 * A legacy completion runs `n` sequences (`best_of` when larger) for each prompt: their
 * product is bounded, and reported as the bound on `n` (or `best_of`) for so many prompts.
 */
function checkSequences(
  body: {
    prompt: string | string[] | number[] | number[][];
    n?: number | null | undefined;
    best_of?: number | null | undefined;
  },
  ctx: z.RefinementCtx,
): void {
  const { prompt } = body;
  const prompts = typeof prompt === "string" || typeof prompt[0] === "number" ? 1 : prompt.length;
  const n = body.n ?? 1;
  const bestOf = body.best_of ?? 1;
  // Of `best_of` sequences the best `n` are returned: fewer cannot hold them (as vLLM says).
  if (body.best_of != null && bestOf < n) {
    ctx.addIssue({
      code: "custom",
      path: ["best_of"],
      message: `Invalid 'best_of': must be greater than or equal to n, got n=${n} and best_of=${bestOf}.`,
      params: { openai: "invalid_value", verbatim: true },
    });
    return;
  }
  const [field, each] = bestOf > n ? (["best_of", bestOf] as const) : (["n", n] as const);
  if (prompts * each <= MAX_SEQUENCES) return;
  const most = Math.floor(MAX_SEQUENCES / prompts);
  ctx.addIssue({
    code: "custom",
    path: [field],
    message: `Invalid '${field}': integer above maximum value. Expected a value <= ${most} for ${prompts} prompts (at most ${MAX_SEQUENCES} sequences per request), but got ${each} instead.`,
    params: { openai: "integer_above_max_value", verbatim: true },
  });
}

/** Body of the legacy `POST /v1/completions`: `prompt` as text, texts, tokens or token lists. */
export const CompletionRequestSchema = z
  .looseObject({
    ...samplingFields,
    prompt: z.union([
      z.string(),
      z.array(z.string()).min(1).max(MAX_PROMPTS),
      z.array(z.int().min(0)).min(1),
      z
        .array(z.array(z.int().min(0)).min(1))
        .min(1)
        .max(MAX_PROMPTS),
    ]),
    // Legacy completions take an integer: how many top log-probabilities to return (0–5).
    logprobs: nullableOptional(z.int().min(0).max(5)),
    echo: nullableOptional(z.boolean()),
    suffix: nullableOptional(z.string()),
    best_of: nullableOptional(z.int().min(1).max(20)),
  })
  .superRefine((body, ctx) => {
    checkStreamOptions(body, ctx);
    checkSequences(body, ctx);
  });

/** A parsed legacy completion request. */
export type CompletionRequest = z.output<typeof CompletionRequestSchema>;

import { describe, expect, it } from "vitest";
import {
  ChatCompletionRequestSchema,
  CompletionRequestSchema,
} from "../../../functions/request/openai-schemas.ts";
import { MAX_MESSAGES, MAX_TOOL_CALLS, MAX_TOOLS } from "../../../functions/request/bounds.ts";
import { FIRST_ISSUE, validationError } from "../../../functions/request/validation-errors.ts";

function chatError(body: unknown) {
  const result = ChatCompletionRequestSchema.safeParse(body, FIRST_ISSUE);
  if (result.success) throw new Error("body was accepted");
  const error = validationError(result.error.issues);
  return { status: error.status, ...error.toBody().error };
}

const user = { role: "user", content: "hi" };

describe("chat completion request schema", () => {
  it("accepts every message role, content parts, tool calls and tool results", () => {
    const body = {
      model: "m",
      messages: [
        { role: "developer", content: "be brief" },
        { role: "system", content: [{ type: "text", text: "sys" }] },
        {
          role: "user",
          name: "ann",
          content: [
            { type: "text", text: "what is this?" },
            { type: "image_url", image_url: { url: "data:image/png;base64,AA==", detail: "low" } },
            { type: "input_audio", input_audio: { data: "AAAA", format: "wav" } },
            { type: "file", file: { file_id: "file-1" } },
          ],
        },
        {
          role: "assistant",
          content: null,
          tool_calls: [
            { id: "call_1", type: "function", function: { name: "look", arguments: "{}" } },
          ],
        },
        { role: "tool", tool_call_id: "call_1", content: "a cat" },
        { role: "function", name: "look", content: null },
      ],
      tools: [{ type: "function", function: { name: "look", parameters: { type: "object" } } }],
      tool_choice: { type: "function", function: { name: "look" } },
      response_format: { type: "json_schema", json_schema: { name: "answer", schema: {} } },
      temperature: 0.2,
      top_p: 0.9,
      max_completion_tokens: 100,
      n: 2,
      stop: ["\n"],
      seed: 3,
      stream: true,
      stream_options: { include_usage: true },
      user: "u-1",
      logprobs: true,
      top_logprobs: 5,
      presence_penalty: 0.5,
      frequency_penalty: -0.5,
      logit_bias: { "42": -100 },
    };
    expect(ChatCompletionRequestSchema.safeParse(body).success).toBe(true);
  });

  it("keeps fields it does not know, at every level", () => {
    const parsed = ChatCompletionRequestSchema.parse({
      model: "m",
      messages: [{ ...user, cache_hint: true }],
      top_k: 40,
      guided_json: { type: "object" },
    });
    expect(parsed).toMatchObject({ top_k: 40, guided_json: { type: "object" } });
    expect(parsed.messages[0]).toMatchObject({ cache_hint: true });
  });

  it("reports a missing model as OpenAI's missing_required_parameter", () => {
    expect(chatError({ messages: [user] })).toEqual({
      status: 400,
      message: "Missing required parameter: 'model'.",
      type: "invalid_request_error",
      param: "model",
      code: "missing_required_parameter",
    });
  });

  it("reports an empty messages array as empty_array", () => {
    expect(chatError({ model: "m", messages: [] })).toMatchObject({
      message:
        "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
      param: "messages",
      code: "empty_array",
    });
  });

  it("reports an unknown role at messages[i].role with the supported values", () => {
    expect(
      chatError({ model: "m", messages: [user, { role: "robot", content: "x" }] }),
    ).toMatchObject({
      message:
        "Invalid value: 'robot'. Supported values are: 'developer', 'system', 'user', 'assistant', 'tool', and 'function'.",
      param: "messages[1].role",
      code: "invalid_value",
    });
  });

  it("reports a message without a role as a missing parameter", () => {
    expect(chatError({ model: "m", messages: [{ content: "x" }] })).toMatchObject({
      param: "messages[0].role",
      code: "missing_required_parameter",
    });
  });

  it("reports content of the wrong type with both accepted types", () => {
    expect(chatError({ model: "m", messages: [{ role: "user", content: 5 }] })).toMatchObject({
      message:
        "Invalid type for 'messages[0].content': expected one of a string or an array, but got an integer instead.",
      param: "messages[0].content",
      code: "invalid_type",
    });
  });

  it("points into content parts", () => {
    const bad = { role: "user", content: [{ type: "text", text: "a" }, { type: "video" }] };
    expect(chatError({ model: "m", messages: [bad] })).toMatchObject({
      param: "messages[0].content[1].type",
      code: "invalid_value",
    });
  });

  it("requires content on an assistant message without tool calls", () => {
    expect(chatError({ model: "m", messages: [user, { role: "assistant" }] })).toMatchObject({
      param: "messages[1].content",
      code: "invalid_value",
    });
  });

  it("requires tool_call_id on a tool message", () => {
    expect(chatError({ model: "m", messages: [{ role: "tool", content: "x" }] })).toMatchObject({
      message: "Missing required parameter: 'messages[0].tool_call_id'.",
      param: "messages[0].tool_call_id",
    });
  });

  it("reports ranges with OpenAI's decimal and integer wording", () => {
    expect(chatError({ model: "m", messages: [user], temperature: 3 })).toMatchObject({
      message:
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3 instead.",
      param: "temperature",
      code: "decimal_above_max_value",
    });
    expect(chatError({ model: "m", messages: [user], n: 0 })).toMatchObject({
      message:
        "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead.",
      code: "integer_below_min_value",
    });
    expect(chatError({ model: "m", messages: [user], max_tokens: 1.5 })).toMatchObject({
      param: "max_tokens",
      code: "invalid_type",
    });
  });

  it("allows at most four stop sequences", () => {
    expect(
      chatError({ model: "m", messages: [user], stop: ["a", "b", "c", "d", "e"] }),
    ).toMatchObject({
      param: "stop",
      code: "array_above_max_length",
    });
  });

  it("refuses an unknown tool_choice and a bad function name", () => {
    expect(chatError({ model: "m", messages: [user], tool_choice: "sometimes" })).toMatchObject({
      param: "tool_choice",
      code: "invalid_value",
    });
    const tools = [{ type: "function", function: { name: "has space" } }];
    expect(chatError({ model: "m", messages: [user], tools })).toMatchObject({
      param: "tools[0].function.name",
    });
  });

  it("refuses stream_options without stream, as OpenAI does", () => {
    expect(
      chatError({ model: "m", messages: [user], stream_options: { include_usage: true } }),
    ).toMatchObject({
      message: "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
      param: "stream_options",
    });
  });

  it("refuses top_logprobs without logprobs", () => {
    expect(chatError({ model: "m", messages: [user], top_logprobs: 2 })).toMatchObject({
      param: "logprobs",
    });
  });

  it("refuses an unknown response_format type", () => {
    expect(
      chatError({ model: "m", messages: [user], response_format: { type: "xml" } }),
    ).toMatchObject({
      param: "response_format.type",
      code: "invalid_value",
    });
  });

  it("refuses a body that is not an object", () => {
    expect(chatError([1, 2])).toMatchObject({ param: null, code: "invalid_type" });
  });
});

describe("completion request schema", () => {
  it("accepts text, texts, token ids and token-id lists as the prompt", () => {
    for (const prompt of ["hi", ["a", "b"], [1, 2, 3], [[1], [2, 3]]]) {
      expect(CompletionRequestSchema.safeParse({ model: "m", prompt }).success).toBe(true);
    }
  });

  it("takes an integer logprobs of at most 5", () => {
    expect(
      CompletionRequestSchema.safeParse({ model: "m", prompt: "x", logprobs: 5 }).success,
    ).toBe(true);
    const result = CompletionRequestSchema.safeParse({ model: "m", prompt: "x", logprobs: 6 });
    expect(result.success).toBe(false);
  });

  it("requires a prompt", () => {
    const result = CompletionRequestSchema.safeParse({ model: "m" }, FIRST_ISSUE);
    if (result.success) throw new Error("accepted");
    expect(validationError(result.error.issues).toBody().error).toMatchObject({
      param: "prompt",
      code: "missing_required_parameter",
    });
  });
});

const many = <T>(count: number, item: (i: number) => T) =>
  Array.from({ length: count }, (_, i) => item(i));
const toolCall = (i: number) => ({
  id: `call_${i}`,
  type: "function",
  function: { name: "look", arguments: "{}" },
});

describe("list bounds", () => {
  // Each list, by how many items it holds, with its param and OpenAI's (or our) limit.
  const LISTS: [param: string, max: number, body: (count: number) => Record<string, unknown>][] = [
    ["messages", MAX_MESSAGES, (count) => ({ messages: many(count, () => user) })],
    [
      "messages[1].tool_calls",
      MAX_TOOL_CALLS,
      (count) => ({ messages: [user, { role: "assistant", tool_calls: many(count, toolCall) }] }),
    ],
    [
      "functions",
      MAX_TOOLS,
      (count) => ({ messages: [user], functions: many(count, (i) => ({ name: `f${i}` })) }),
    ],
    [
      "tool_choice.allowed_tools.tools",
      MAX_TOOLS,
      (count) => ({
        messages: [user],
        tools: [{ type: "function", function: { name: "look" } }],
        tool_choice: {
          type: "allowed_tools",
          allowed_tools: { mode: "auto", tools: many(count, () => ({ type: "function" })) },
        },
      }),
    ],
  ];

  it("accepts each list at its limit and refuses one item more, naming the limit", () => {
    for (const [param, max, body] of LISTS) {
      expect(ChatCompletionRequestSchema.safeParse({ model: "m", ...body(max) }).success).toBe(
        true,
      );
      expect(chatError({ model: "m", ...body(max + 1) })).toMatchObject({
        param,
        code: "array_above_max_length",
        message: `Invalid '${param}': array too long. Expected an array with maximum length ${max}, but got an array with length ${max + 1} instead.`,
      });
    }
  });

  it("makes one issue however many values are wrong, as only the first is reported", () => {
    const result = ChatCompletionRequestSchema.safeParse(
      { model: "m", messages: many(MAX_MESSAGES, () => 1) },
      FIRST_ISSUE,
    );
    expect(result.error?.issues).toHaveLength(1);
  });
});

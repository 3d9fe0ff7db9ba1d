import { createOpenAI } from "@ai-sdk/openai";
import { ChatOpenAI, OpenAIEmbeddings } from "@langchain/openai";
import { embed, generateText, streamText } from "ai";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningStack, startStack } from "../../scripts/stack.ts";

// The clients people use, with their defaults, against the local stack as `npm start` runs it.
let stack: RunningStack;
let baseURL: string;
const MODEL = "warmgate-sim-8b";
const EMBED = "warmgate-sim-embed";

beforeAll(async () => {
  stack = await startStack({
    regions: [{ id: "eu", continents: ["EU"], origins: 1 }],
    sim: { timeScale: 0 },
  });
  baseURL = `${stack.edgeUrl}/v1`;
}, 180_000);

afterAll(async () => {
  await stack?.stop();
});

interface Recorded {
  model: string;
  outcome: string;
  prompt_tokens: number;
  completion_tokens: number;
  cost_usd: number;
}

/** The ledger's record of a request, once it is settled. */
async function recorded(requestId: string): Promise<Recorded> {
  for (let i = 0; i < 50; i++) {
    const res = await fetch(`${baseURL}/usage/requests/${requestId}`, {
      headers: { authorization: `Bearer ${stack.apiKey}` },
    });
    const body = (await res.json()) as Recorded & { status?: string };
    if (res.ok && body.status === "settled") return body;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`request ${requestId} was never settled`);
}

const client = () => new OpenAI({ baseURL, apiKey: stack.apiKey, maxRetries: 0 });
const provider = () => createOpenAI({ baseURL, apiKey: stack.apiKey });

describe("the official openai package", () => {
  it("creates a response, and the ledger bills its usage", async () => {
    const { data, response } = await client()
      .responses.create({ model: MODEL, input: "Say hi", max_output_tokens: 12 })
      .withResponse();
    expect(data.output_text.length).toBeGreaterThan(0);
    const record = await recorded(response.headers.get("x-request-id") ?? "");
    expect(record).toMatchObject({
      model: MODEL,
      outcome: "ok",
      prompt_tokens: data.usage?.input_tokens,
      completion_tokens: data.usage?.output_tokens,
    });
    expect(record.cost_usd).toBeGreaterThan(0);
  });

  it("streams a response as typed events", async () => {
    const stream = await client().responses.create({
      model: MODEL,
      input: "Say hi",
      max_output_tokens: 12,
      stream: true,
    });
    let text = "";
    let last = "";
    for await (const event of stream) {
      if (event.type === "response.output_text.delta") text += event.delta;
      last = event.type;
    }
    expect(text.length).toBeGreaterThan(0);
    expect(last).toMatch(/^response\.(completed|incomplete)$/);
  });

  it("runs a tool loop with tool_choice auto", async () => {
    const tools = [
      {
        type: "function" as const,
        name: "get_weather",
        parameters: { type: "object", properties: { city: { type: "string" } } },
        strict: false,
      },
    ];
    const first = await client().responses.create({
      model: MODEL,
      input: "What is the weather in Paris?",
      tools,
    });
    const call = first.output.find((item) => item.type === "function_call");
    expect(call?.type === "function_call" && call.name).toBe("get_weather");
    if (call?.type !== "function_call") return;
    const second = await client().responses.create({
      model: MODEL,
      tools,
      max_output_tokens: 12,
      input: [
        { role: "user", content: "What is the weather in Paris?" },
        call,
        { type: "function_call_output", call_id: call.call_id, output: "sunny" },
      ],
    });
    expect(second.output_text.length).toBeGreaterThan(0);
  });

  it("creates embeddings, billed by their input tokens", async () => {
    const { data, response } = await client()
      .embeddings.create({ model: EMBED, input: ["the sea", "the mountain"] })
      .withResponse();
    expect(data.data.map((d) => d.embedding.length)).toEqual([768, 768]);
    const record = await recorded(response.headers.get("x-request-id") ?? "");
    expect(record).toMatchObject({ prompt_tokens: data.usage.prompt_tokens, completion_tokens: 0 });
  });
});

describe("the Vercel AI SDK's default OpenAI provider (the Responses API)", () => {
  it("generates and streams text, with usage", async () => {
    const generated = await generateText({
      model: provider()(MODEL),
      prompt: "Say hi",
      maxOutputTokens: 12,
    });
    expect(generated.text.length).toBeGreaterThan(0);
    expect(generated.usage.outputTokens).toBeGreaterThan(0);
    const streamed = streamText({
      model: provider()(MODEL),
      prompt: "Say hi",
      maxOutputTokens: 12,
    });
    let text = "";
    for await (const part of streamed.textStream) text += part;
    expect(text.length).toBeGreaterThan(0);
    expect((await streamed.usage).inputTokens).toBeGreaterThan(0);
  });

  it("embeds a value", async () => {
    const { embedding } = await embed({ model: provider().embedding(EMBED), value: "the sea" });
    expect(embedding).toHaveLength(768);
  });
});

const chat = () =>
  new ChatOpenAI({
    model: MODEL,
    apiKey: stack.apiKey,
    configuration: { baseURL },
    useResponsesApi: true,
    maxTokens: 12,
    maxRetries: 0,
  });

describe("LangChain's ChatOpenAI with useResponsesApi", () => {
  it("invokes and streams, with usage metadata", async () => {
    const message = await chat().invoke("Say hi");
    expect(message.text.length).toBeGreaterThan(0);
    expect(message.usage_metadata?.output_tokens).toBeGreaterThan(0);
    let text = "";
    for await (const chunk of await chat().stream("Say hi")) text += chunk.text;
    expect(text.length).toBeGreaterThan(0);
  });

  it("embeds with OpenAIEmbeddings", async () => {
    const embeddings = new OpenAIEmbeddings({
      model: EMBED,
      apiKey: stack.apiKey,
      configuration: { baseURL },
    });
    expect(await embeddings.embedQuery("the sea")).toHaveLength(768);
  });
});

/**
 * The Responses API's answer from the simulated engine (docs/configuration.md, "The
 * simulated engine"): the `response` object with its output items (a message with
 * `output_text`, or a `function_call`), and the typed SSE events of a stream, numbered by
 * `sequence_number`, ending in `response.completed` (or `response.incomplete`).
 */
import { jsonBody } from "./format.ts";
import { Hasher, hashHex } from "./hash.ts";
import { generatedEntries } from "./logprobs.ts";
import type { Choice, Push, Run } from "./run.ts";

const encoder = new TextEncoder();

function event(run: Run, type: string, fields: Record<string, unknown>): Uint8Array {
  const data = { type, sequence_number: run.events++, ...fields };
  return encoder.encode(`event: ${type}\ndata: ${JSON.stringify(data)}\n\n`);
}

function itemId(run: Run, kind: string): string {
  return `${kind}_${hashHex(new Hasher(0x6974).str(run.head.id).str(kind).digest(), 32)}`;
}

function logprobsOf(run: Run, choice: Choice, from?: number, to?: number): unknown[] {
  const top = run.request.logprobs;
  if (top === null) return [];
  return generatedEntries({ seed: choice.seed, deltas: choice.plan.deltas }, top, from, to);
}

/** The output item of the response's one choice, as it stands. */
function outputItem(run: Run, choice: Choice, done: boolean): Record<string, unknown> {
  const call = choice.plan.toolCall;
  const status = done ? "completed" : "in_progress";
  if (call !== null) {
    return {
      type: "function_call",
      id: itemId(run, "fc"),
      call_id: `call_${call.id.slice(-24)}`,
      name: call.name,
      arguments: done ? call.arguments : "",
      status,
    };
  }
  return {
    type: "message",
    id: itemId(run, "msg"),
    status,
    role: "assistant",
    content: done ? [textPart(run, choice)] : [],
  };
}

function textPart(run: Run, choice: Choice): Record<string, unknown> {
  return {
    type: "output_text",
    text: choice.plan.text,
    annotations: [],
    logprobs: logprobsOf(run, choice),
  };
}

/** The `response` object: in progress (no output yet) or ended with its output and usage. */
function responseObject(run: Run, ended: boolean): Record<string, unknown> {
  const { head, request } = run;
  const choice = run.choices[0];
  const length = choice?.plan.finishReason === "length";
  let usage: unknown = null;
  if (ended) {
    const prompt = request.prompts.reduce((sum, p) => sum + p.length, 0);
    const output = run.choices.reduce((sum, c) => sum + c.produced, 0);
    const cached = run.cached.reduce((sum, c) => sum + c, 0);
    const written = run.cacheWritten.reduce((sum, c) => sum + c, 0);
    usage = {
      input_tokens: prompt,
      input_tokens_details: { cached_tokens: cached, cache_write_tokens: written },
      output_tokens: output,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: prompt + output,
    };
  }
  return {
    id: head.id,
    object: "response",
    created_at: head.created,
    status: ended ? (length ? "incomplete" : "completed") : "in_progress",
    background: false,
    error: null,
    incomplete_details: ended && length ? { reason: "max_output_tokens" } : null,
    model: head.model,
    output: ended && choice !== undefined ? [outputItem(run, choice, true)] : [],
    previous_response_id: null,
    service_tier: "default",
    store: false,
    temperature: request.temperature,
    top_p: request.topP,
    ...request.responses,
    usage,
  };
}

/** The events one token of a streamed response adds (the opening events before the first). */
export function responsesToken(run: Run, choice: Choice, index: number, push: Push): void {
  const delta = choice.plan.deltas[index] ?? "";
  const item = outputItem(run, choice, false);
  if (index === 0) {
    push(event(run, "response.created", { response: responseObject(run, false) }));
    push(event(run, "response.in_progress", { response: responseObject(run, false) }));
    push(event(run, "response.output_item.added", { output_index: 0, item }));
    if (item["type"] === "message") {
      push(
        event(run, "response.content_part.added", {
          item_id: item["id"],
          output_index: 0,
          content_index: 0,
          part: { type: "output_text", text: "", annotations: [], logprobs: [] },
        }),
      );
    }
  }
  if (delta === "") return;
  if (item["type"] === "function_call") {
    push(
      event(run, "response.function_call_arguments.delta", {
        item_id: item["id"],
        output_index: 0,
        delta,
      }),
    );
    return;
  }
  push(
    event(run, "response.output_text.delta", {
      item_id: item["id"],
      output_index: 0,
      content_index: 0,
      delta,
      logprobs: logprobsOf(run, choice, index, index + 1),
    }),
  );
}

/** The end of a response: the whole JSON object, or a stream's closing events. */
export function responsesFinal(run: Run): Uint8Array[] {
  const choice = run.choices[0];
  const response = responseObject(run, true);
  if (!run.request.stream) return [jsonBody(response)];
  if (choice === undefined) return [];
  const item = outputItem(run, choice, true);
  const out: Uint8Array[] = [];
  if (item["type"] === "function_call") {
    out.push(
      event(run, "response.function_call_arguments.done", {
        item_id: item["id"],
        output_index: 0,
        arguments: item["arguments"],
      }),
    );
  } else {
    const part = textPart(run, choice);
    const at = { item_id: item["id"], output_index: 0, content_index: 0 };
    out.push(
      event(run, "response.output_text.done", {
        ...at,
        text: part["text"],
        logprobs: part["logprobs"],
      }),
      event(run, "response.content_part.done", { ...at, part }),
    );
  }
  out.push(event(run, "response.output_item.done", { output_index: 0, item }));
  const type = response["status"] === "incomplete" ? "response.incomplete" : "response.completed";
  out.push(event(run, type, { response }));
  return out;
}

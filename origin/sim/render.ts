/**
 * The bytes of a simulated engine's answer (docs/configuration.md, "The simulated
 * engine"): each token's SSE event as the scheduler produces it, and the end of the
 * answer: the whole JSON body, or the usage chunk and `[DONE]`, in the shape of the
 * request's API.
 */
import {
  chatChunk,
  chatCompletion,
  jsonBody,
  sseEvent,
  SSE_DONE,
  textChunk,
  textCompletion,
  usageChunk,
  usageJson,
  type ChoiceResult,
} from "./format.ts";
import { DEFAULT_EMBEDDING_DIMENSIONS, embeddingsJson } from "./embeddings.ts";
import { hashString } from "./hash.ts";
import {
  chatLogprobs,
  completionLogprobs,
  generatedEntries,
  type LogprobSource,
  promptEntries,
} from "./logprobs.ts";
import { responsesFinal, responsesToken } from "./responses-format.ts";
import { type Choice, type Push, type Run, usageOf } from "./run.ts";
import { tokenizeWithText } from "./tokenizer.ts";

function sourceOf(choice: Choice): LogprobSource {
  return { seed: choice.seed, deltas: choice.plan.deltas };
}

function echoEntries(echo: string, seed: number, top: number) {
  if (echo === "") return [];
  const tokens = tokenizeWithText(echo).map((t) => t.text);
  return promptEntries(tokens, seed, Math.max(1, top));
}

/** Sends every token whose turn has come: token r of choice i after token r of choices before i. */
export function releaseTokens(run: Run, push: Push): void {
  const { choices } = run;
  for (;;) {
    const choice = choices[run.pos];
    if (choice === undefined) {
      run.round++;
      run.pos = 0;
      if (choices.every((c) => c.plan.ids.length <= run.round)) return;
      continue;
    }
    if (choice.plan.ids.length <= run.round) {
      run.pos++;
      continue;
    }
    if (choice.produced <= run.round) return;
    if (run.request.stream) streamToken(run, choice, run.round, push);
    run.pos++;
  }
}

export function streamToken(run: Run, choice: Choice, index: number, push: Push): void {
  const { head, request } = run;
  if (request.kind === "responses") {
    responsesToken(run, choice, index, push);
    return;
  }
  const plan = choice.plan;
  const last = index === plan.ids.length - 1;
  const finish = last ? plan.finishReason : null;
  const delta = plan.deltas[index] ?? "";
  const top = request.logprobs;
  if (request.kind === "completion") {
    const echo = request.echo?.[choice.promptIndex] ?? "";
    if (index === 0 && echo !== "") {
      const logprobs =
        top === null ? null : completionLogprobs(echoEntries(echo, choice.seed, top), 0);
      push(sseEvent(textChunk(head, choice.index, echo, null, request.includeUsage, logprobs)));
    }
    if (delta !== "" || last) {
      const logprobs =
        top === null
          ? null
          : completionLogprobs(
              generatedEntries(sourceOf(choice), Math.max(1, top), index, index + 1),
              echo.length + plan.deltas.slice(0, index).join("").length,
            );
      push(sseEvent(textChunk(head, choice.index, delta, finish, request.includeUsage, logprobs)));
    }
    return;
  }
  const logprobs =
    top === null ? null : chatLogprobs(generatedEntries(sourceOf(choice), top, index, index + 1));
  if (index === 0) {
    push(
      sseEvent(
        chatChunk(
          head,
          choice.index,
          { role: "assistant", content: "" },
          null,
          request.includeUsage,
        ),
      ),
    );
  }
  const call = plan.toolCall;
  if (call !== null) {
    const toolDelta =
      index === 0
        ? {
            index: 0 as const,
            id: call.id,
            type: "function" as const,
            function: { name: call.name, arguments: "" as const },
          }
        : { index: 0 as const, function: { arguments: delta } };
    push(
      sseEvent(
        chatChunk(head, choice.index, { tool_calls: [toolDelta] }, finish, request.includeUsage),
      ),
    );
    return;
  }
  if (delta !== "" || last) {
    push(
      sseEvent(
        chatChunk(
          head,
          choice.index,
          { content: delta },
          finish,
          request.includeUsage,
          delta === "" ? null : logprobs,
        ),
      ),
    );
  }
}

/** The last bytes of a run that ended well: the usage chunk and `[DONE]`, or the whole JSON. */
export function finalChunks(run: Run): Uint8Array[] {
  const { head, request } = run;
  if (request.kind === "responses") return responsesFinal(run);
  if (request.embedding !== null) {
    const size = request.model.dimensions ?? DEFAULT_EMBEDDING_DIMENSIONS;
    return [jsonBody(embeddingsJson(head.model, request.embedding, size, hashString(head.model)))];
  }
  const usage = usageOf(run);
  const json = usageJson(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens);
  if (!request.stream) {
    const top = request.logprobs;
    const results: ChoiceResult[] = run.choices.map((c) => {
      const echo = request.echo?.[c.promptIndex] ?? "";
      let logprobs: unknown = null;
      if (top !== null && request.kind === "chat") {
        logprobs = chatLogprobs(generatedEntries(sourceOf(c), top));
      } else if (top !== null) {
        const entries = [
          ...echoEntries(echo, c.seed, top),
          ...generatedEntries(sourceOf(c), Math.max(1, top)),
        ];
        logprobs = completionLogprobs(entries, 0);
      }
      return {
        index: c.index,
        text: echo + c.plan.text,
        finishReason: c.plan.finishReason,
        toolCall: c.plan.toolCall,
        logprobs,
      };
    });
    return [
      jsonBody(
        request.kind === "chat"
          ? chatCompletion(head, results, json)
          : textCompletion(head, results, json),
      ),
    ];
  }
  const object = request.kind === "chat" ? "chat.completion.chunk" : "text_completion";
  return request.includeUsage ? [sseEvent(usageChunk(head, object, json)), SSE_DONE] : [SSE_DONE];
}

/**
 * Resolves the requested model (an id, or an alias naming models in the order to try them)
 * and keeps the models whose window the request fits; when none does, it is refused before
 * any origin is called: estimated prompt tokens plus the requested completion tokens over
 * `max_model_len` is OpenAI's 400 `context_length_exceeded`.
 * See docs/edge.md.
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv, CompletionBody, CompletionPlan } from "../app-env.ts";
import { type ModelConfig, resolveModels } from "../../contracts/config/models.ts";
import { contextLengthExceeded, modelNotFound } from "../../contracts/errors.ts";
import {
  estimateChatPromptTokens,
  estimateCompletionPrompts,
  estimateEmbeddingInputs,
  estimateResponsesPromptTokens,
} from "../request/token-estimate.ts";

// OpenAI's legacy completions default `max_tokens` to 16; chat leaves it to the window.
const COMPLETIONS_DEFAULT_MAX_TOKENS = 16;

/** Completion tokens one sequence may produce on `model`: `max_tokens`, or the rest of its window. */
export function sequenceAllowance(
  plan: Omit<CompletionPlan, "model" | "models">,
  model: ModelConfig,
) {
  return plan.maxTokens ?? Math.max(0, model.maxModelLen - plan.promptTokens);
}

/** Completion tokens the whole request may produce on `model`: every sequence's allowance. */
export function completionAllowance(
  plan: Omit<CompletionPlan, "model" | "models">,
  model: ModelConfig,
): number {
  return sequenceAllowance(plan, model) * plan.sequences;
}

/** The field that holds each kind's prompt, named in a context-length error. */
const PROMPT_PARAMS: Record<CompletionBody["kind"], "messages" | "prompt" | "input"> = {
  chat: "messages",
  completion: "prompt",
  responses: "input",
  embeddings: "input",
};

/** What a request asks of a model: its prompt tokens, sequences, and completion tokens. */
export function requestShape(completion: CompletionBody): Omit<CompletionPlan, "model" | "models"> {
  const delivery = completion.body.stream === true ? "stream" : "whole";
  switch (completion.kind) {
    case "chat": {
      const { body } = completion;
      const promptTokens = estimateChatPromptTokens(body);
      return {
        promptTokens,
        totalPromptTokens: promptTokens,
        sequences: body.n ?? 1,
        maxTokens: body.max_completion_tokens ?? body.max_tokens ?? null,
        delivery,
      };
    }
    case "completion": {
      const { body } = completion;
      const prompts = estimateCompletionPrompts(body);
      return {
        promptTokens: Math.max(0, ...prompts),
        totalPromptTokens: prompts.reduce((sum, tokens) => sum + tokens, 0),
        // `best_of` sequences are generated (and billed) per prompt, `n` of them returned.
        sequences: prompts.length * Math.max(body.n ?? 1, body.best_of ?? 1),
        maxTokens: body.max_tokens ?? COMPLETIONS_DEFAULT_MAX_TOKENS,
        delivery,
      };
    }
    case "responses": {
      const promptTokens = estimateResponsesPromptTokens(completion.body);
      return {
        promptTokens,
        totalPromptTokens: promptTokens,
        sequences: 1,
        maxTokens: completion.body.max_output_tokens ?? null,
        delivery,
      };
    }
    default: {
      const inputs = estimateEmbeddingInputs(completion.body);
      // An embedding generates nothing: only its input is billed.
      return {
        promptTokens: Math.max(0, ...inputs),
        totalPromptTokens: inputs.reduce((sum, tokens) => sum + tokens, 0),
        sequences: inputs.length,
        maxTokens: 0,
        delivery: "whole",
      };
    }
  }
}

/** Sets `c.var.plan` for the validated completion. */
export function planCompletion() {
  return createMiddleware<AppEnv>(async function planCompletionRequest(c, next) {
    const completion = c.get("completion");
    // An alias names several models, in the order to try them.
    const named = resolveModels(c.get("config"), completion.body.model);
    const first = named[0];
    if (first === undefined) throw modelNotFound(completion.body.model);
    const request = requestShape(completion);
    const completionTokens = request.maxTokens ?? 0;
    // vLLM refuses when prompt + max_tokens > max_model_len, and a prompt that fills the
    // window leaves no room for even one token when max_tokens is unset.
    const fits = (model: ModelConfig) =>
      request.promptTokens + completionTokens <= model.maxModelLen &&
      (request.maxTokens !== null || request.promptTokens < model.maxModelLen);
    const models = named.filter(fits);
    const model = models[0];
    if (model === undefined) {
      throw contextLengthExceeded(
        first.maxModelLen,
        request.promptTokens,
        completionTokens,
        PROMPT_PARAMS[completion.kind],
      );
    }
    c.set("plan", { ...request, model, models });
    await next();
  });
}

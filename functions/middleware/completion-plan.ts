/**
 * Resolves the requested model (an id, or an alias naming models in the order to try them)
 * and keeps the models whose window the request fits; when none does, it is refused before
 * any origin is called: estimated prompt tokens plus the requested completion tokens over
 * `max_model_len` is OpenAI's 400 `context_length_exceeded`.
 * See docs/edge.md.
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv, CompletionPlan } from "../app-env.ts";
import { type ModelConfig, resolveModels } from "../config.ts";
import { contextLengthExceeded, modelNotFound } from "../../contracts/errors.ts";
import { estimateChatPromptTokens, estimateCompletionPrompts } from "../token-estimate.ts";

// OpenAI's legacy completions default `max_tokens` to 16; chat leaves it to the window.
const COMPLETIONS_DEFAULT_MAX_TOKENS = 16;

/** Completion tokens one sequence may produce on `model`: `max_tokens`, or the rest of its window. */
export function sequenceAllowance(
  plan: Omit<CompletionPlan, "model" | "models">,
  model: ModelConfig,
) {
  return plan.maxTokens ?? Math.max(0, model.max_model_len - plan.promptTokens);
}

/** Completion tokens the whole request may produce on `model`: every sequence's allowance. */
export function completionAllowance(
  plan: Omit<CompletionPlan, "model" | "models">,
  model: ModelConfig,
): number {
  return sequenceAllowance(plan, model) * plan.sequences;
}

/** Sets `c.var.plan` for the validated completion. */
export function planCompletion() {
  return createMiddleware<AppEnv>(async function planCompletionRequest(c, next) {
    const completion = c.var.completion;
    // An alias names several models, in the order to try them.
    const named = resolveModels(c.var.config, completion.body.model);
    const first = named[0];
    if (first === undefined) throw modelNotFound(completion.body.model);
    let request: Omit<CompletionPlan, "model" | "models">;
    if (completion.kind === "chat") {
      const { body } = completion;
      const promptTokens = estimateChatPromptTokens(body);
      request = {
        promptTokens,
        totalPromptTokens: promptTokens,
        sequences: body.n ?? 1,
        maxTokens: body.max_completion_tokens ?? body.max_tokens ?? null,
        delivery: body.stream === true ? "stream" : "whole",
      };
    } else {
      const { body } = completion;
      const prompts = estimateCompletionPrompts(body);
      request = {
        promptTokens: Math.max(0, ...prompts),
        totalPromptTokens: prompts.reduce((sum, tokens) => sum + tokens, 0),
        // `best_of` sequences are generated (and billed) per prompt, `n` of them returned.
        sequences: prompts.length * Math.max(body.n ?? 1, body.best_of ?? 1),
        maxTokens: body.max_tokens ?? COMPLETIONS_DEFAULT_MAX_TOKENS,
        delivery: body.stream === true ? "stream" : "whole",
      };
    }
    const completionTokens = request.maxTokens ?? 0;
    // vLLM refuses when prompt + max_tokens > max_model_len, and a prompt that fills the
    // window leaves no room for even one token when max_tokens is unset.
    const fits = (model: ModelConfig) =>
      request.promptTokens + completionTokens <= model.max_model_len &&
      (request.maxTokens !== null || request.promptTokens < model.max_model_len);
    const models = named.filter(fits);
    const model = models[0];
    if (model === undefined) {
      throw contextLengthExceeded(
        first.max_model_len,
        request.promptTokens,
        completionTokens,
        completion.kind === "chat" ? "messages" : "prompt",
      );
    }
    c.set("plan", { ...request, model, models });
    await next();
  });
}

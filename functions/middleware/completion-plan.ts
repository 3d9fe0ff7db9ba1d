/**
 * Resolves the requested model (id or alias) and refuses, before any origin is called,
 * a prompt that cannot fit: estimated prompt tokens plus the requested completion tokens
 * over the model's `max_model_len` is OpenAI's 400 `context_length_exceeded`.
 */
import { createMiddleware } from "hono/factory";
import type { AppEnv, CompletionPlan } from "../app-env.ts";
import { resolveModel } from "../config.ts";
import { contextLengthExceeded, modelNotFound } from "../errors.ts";
import { estimateChatPromptTokens, estimateCompletionPromptTokens } from "../token-estimate.ts";

// OpenAI's legacy completions default `max_tokens` to 16; chat leaves it to the window.
const COMPLETIONS_DEFAULT_MAX_TOKENS = 16;

/** Sets `c.var.plan` for the validated completion. */
export function planCompletion() {
  return createMiddleware<AppEnv>(async function planCompletionRequest(c, next) {
    const completion = c.var.completion;
    const model = resolveModel(c.var.config, completion.body.model);
    if (model === undefined) throw modelNotFound(completion.body.model);
    let plan: CompletionPlan;
    if (completion.kind === "chat") {
      const { body } = completion;
      plan = {
        model,
        promptTokens: estimateChatPromptTokens(body),
        maxTokens: body.max_completion_tokens ?? body.max_tokens ?? null,
        stream: body.stream === true,
      };
    } else {
      const { body } = completion;
      plan = {
        model,
        promptTokens: estimateCompletionPromptTokens(body),
        maxTokens: body.max_tokens ?? COMPLETIONS_DEFAULT_MAX_TOKENS,
        stream: body.stream === true,
      };
    }
    const completionTokens = plan.maxTokens ?? 0;
    // vLLM refuses when prompt + max_tokens > max_model_len, and a prompt that fills the
    // window leaves no room for even one token when max_tokens is unset.
    const overflows =
      plan.promptTokens + completionTokens > model.max_model_len ||
      (plan.maxTokens === null && plan.promptTokens >= model.max_model_len);
    if (overflows) {
      throw contextLengthExceeded(
        model.max_model_len,
        plan.promptTokens,
        completionTokens,
        completion.kind === "chat" ? "messages" : "prompt",
      );
    }
    c.set("plan", plan);
    await next();
  });
}

/**
 * How one line's attempt ended, from its Batcher's answer (docs/batch-api.md, "Lines"): a
 * response to record (with the usage to bill), a failure to record, or a wait before the
 * line is sent again. Pure: no I/O.
 */
import { parsePayload } from "../../contracts/protocol/framing.ts";
import { ItemTrailerSchema } from "../../contracts/protocol/schema.ts";
import type { TokenUsage } from "../../contracts/pricing.ts";
import { type BatcherAnswerResult, failureTrailerOf } from "../batcher/types.ts";

/** What to do with a line after an attempt. */
export type LineOutcome =
  | {
      kind: "answered";
      status: number;
      /** The origin that answered. */
      origin: string;
      body: string;
      /** What its origin generated, to bill; null when nothing was reported. */
      usage: TokenUsage | null;
    }
  | { kind: "failed"; code: string; message: string }
  | { kind: "retry"; afterMs: number };

/** Wait before a line that found no room or no origin is sent again. */
export const RETRY_MS = 1_000;

const textDecoder = new TextDecoder();

/** The outcome of a line's attempt from its Batcher's answer. */
export function lineOutcome(result: BatcherAnswerResult): LineOutcome {
  switch (result.kind) {
    // Every attempt carries the setup; should one arrive without, it is simply sent again.
    case "setup_needed":
      return { kind: "retry", afterMs: RETRY_MS };
    case "refused":
      return { kind: "retry", afterMs: Math.max(RETRY_MS, result.retryAfterMs) };
    case "failed":
      // A prompt no origin can hold will never fit; anything else may pass.
      return result.code === "prompt_too_large"
        ? { kind: "failed", code: result.code, message: result.detail }
        : { kind: "retry", afterMs: RETRY_MS };
    case "answered": {
      const id = "line";
      if (result.head === null) {
        const trailer = result.trailer === null ? null : failureTrailerOf(id, result.trailer);
        if (trailer?.error.code === "prompt_too_large") {
          return { kind: "failed", code: trailer.error.code, message: trailer.error.message };
        }
        // Never started on an origin (queue, origins down, a call that broke): again.
        return { kind: "retry", afterMs: RETRY_MS };
      }
      // Cut after its HEAD (a restart, a broken call): the answer is not whole, so again.
      if (result.trailer === null) return { kind: "retry", afterMs: RETRY_MS };
      const trailer = parsePayload(ItemTrailerSchema, result.trailer);
      const usage = trailer?.usage ?? null;
      return {
        kind: "answered",
        status: result.head.status,
        origin: result.head.origin,
        body: textDecoder.decode(result.body),
        usage:
          usage === null
            ? null
            : {
                promptTokens: usage.prompt_tokens,
                cachedTokens: usage.cached_tokens,
                completionTokens: usage.completion_tokens,
              },
      };
    }
    default: {
      const unknown: never = result;
      throw new Error(`unknown answer ${JSON.stringify(unknown)}`);
    }
  }
}

/**
 * What the simulated engine tells the origin of its prefix cache and speed
 * (docs/routing.md, "Block events"): its cache's changes as engine block events of the
 * items whose prompts they hold, and the prefill speed of its step cost model.
 */
import type { EngineBlockEvent } from "../engine.ts";
import type { CacheEvent } from "./kv-cache.ts";
import type { ResolvedSimEngineOptions } from "./options.ts";
import type { Choice, Run } from "./run.ts";

/**
 * A cache event as an engine block event; null for blocks of a sequence the origin does
 * not route by (a later prompt of a completions list) or no longer knows.
 */
export function engineBlockEvent(
  event: CacheEvent,
  seq: { run: Run; choice: Choice } | undefined,
  blockSize: number,
): EngineBlockEvent | null {
  if (event.kind === "removed") return { kind: "removed", hashes: [event.hash] };
  // The first prompt of a request is the one the edge routes by.
  if (seq === undefined || seq.choice.promptIndex !== 0) return null;
  return {
    kind: "stored",
    item: seq.run.item.id,
    start: event.start,
    hashes: event.hashes,
    promptBlocks: Math.floor((seq.run.request.prompts[0]?.length ?? 0) / blockSize),
  };
}

/** The prefill speed the step cost model gives, in real prompt tokens per second. */
export function prefillSpeed(options: ResolvedSimEngineOptions): { prefill_tokens_per_s?: number } {
  const msPerToken = options.timing.prefillMsPerToken * options.timeScale;
  return msPerToken > 0 ? { prefill_tokens_per_s: Math.round(1000 / msPerToken) } : {};
}

/** Window states, load reports and requests for the window policy's tests. */
import { type LoadReport } from "../../contracts/protocol/schema.ts";
import { type WindowConfigInput, windowConfig } from "./window-config.ts";
import { onOriginLoad } from "../../durable-objects/batcher/window/events.ts";
import { enqueue } from "../../durable-objects/batcher/window/flush.ts";
import { createWindowState } from "../../durable-objects/batcher/window/state.ts";
import type {
  Batch,
  EnqueueDecision,
  WindowOptions,
  WindowRequest,
  WindowState,
} from "../../durable-objects/batcher/window/types.ts";

// Origins here may queue without bound: holding for them is window/backpressure.test.ts's subject.
export function stateWith(input: Partial<WindowConfigInput> = {}, now = 0): WindowState {
  return createWindowState(windowConfig({ maxOriginQueue: 4096, ...input }), now);
}

export function report(over: Partial<LoadReport> = {}): LoadReport {
  return {
    origin: "a",
    t: 0,
    running: 0,
    waiting: 0,
    kv_usage: 0,
    kv_free_blocks: 1000,
    kv_total_blocks: 1000,
    block_size: 16,
    prefix_queries: 0,
    prefix_hits: 0,
    max_num_seqs: 8,
    ...over,
  };
}

export function request(id: string, over: Partial<WindowRequest> = {}): WindowRequest {
  return { id, lane: 0, promptTokens: 100, maxTokens: 100, ...over };
}

export function load(state: WindowState, originId: string, over: Partial<LoadReport>, now = 0) {
  return onOriginLoad(state, originId, report({ origin: originId, ...over }), now).state;
}

/** An origin whose engine is full and queueing: every new request has to wait anyway. */
export function saturated(input: Partial<WindowConfigInput> = {}): WindowState {
  return load(stateWith(input), "a", { running: 8, waiting: 2 });
}

export function add(
  state: WindowState,
  req: WindowRequest,
  now: number,
  options: WindowOptions = {},
) {
  return enqueue(state, req, now, options);
}

/** The health rule says these origins may take nothing (their breakers are open). */
export function without(...down: string[]): WindowOptions {
  return { usable: (id) => !down.includes(id) };
}

export function ids(batch: Batch): string[] {
  return batch.items.map((item) => item.id);
}

/** What an origin could take before a step: prompt tokens and sequences (null: unknown). */
export interface Room {
  kv: number | null;
  seqs: number | null;
}

export function expectQueued(decision: EnqueueDecision): { flushAt: number; windowMs: number } {
  if (decision.kind !== "queued") throw new Error(`expected queued, got ${decision.kind}`);
  return decision;
}

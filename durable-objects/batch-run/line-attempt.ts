/**
 * One line's attempt as its Batcher takes it (docs/batch-api.md, "Lines"): the shard and
 * the request, the same id on every attempt, and where routing is on, the line's prefix
 * blocks, so that the router sends it where they are warm. Pure: no I/O.
 */
import {
  MAX_ROUTE_BLOCKS,
  type PrefixRequest,
  promptBlocks,
  shardOfKey,
} from "../../contracts/prefix-blocks.ts";
import type { ItemPath } from "../../contracts/protocol/schema.ts";
import type { BatcherAttempt } from "../batcher/types.ts";
import type { BatchState } from "./lifecycle.ts";
import type { BatchRunPlan, LineToRun } from "./types.ts";

/** The Batcher a line goes to and what it is sent, from the line's body in the input file. */
export function lineAttempt(
  run: BatchRunPlan,
  state: BatchState,
  line: LineToRun,
  id: string,
  body: Record<string, unknown>,
  avoidOrigins: readonly string[] = [],
): { batcher: string; attempt: BatcherAttempt } {
  // As an interactive request with this prefix would go: to the shard its prefix keys.
  const routed = run.setup.routing !== null && line.prefix !== null;
  const shard = routed
    ? shardOfKey(line.prefix ?? 0, run.batchers.length)
    : line.idx % run.batchers.length;
  const attempt: BatcherAttempt = {
    setup: run.setup,
    // The same id on every attempt: a Batcher that still runs the line refuses a second.
    id,
    path: state.endpoint as ItemPath,
    body: JSON.stringify({ ...body, model: run.model }),
    headers: { "x-request-id": id },
    lane: run.lane,
    promptTokens: line.promptTokens,
    maxTokens: line.maxTokens,
    deadline: state.expiresAt,
    firstByteTimeoutMs: run.firstByteTimeoutMs,
    itemTimeoutMs: run.itemTimeoutMs,
    // Where an origin kept its answer, the line goes to that origin alone.
    avoidOrigins: [...avoidOrigins],
    ...(routed && {
      route: {
        blocks: promptBlocks(run.model, body as PrefixRequest, MAX_ROUTE_BLOCKS),
        session: null,
        pinned: null,
      },
    }),
  };
  return { batcher: run.batchers[shard] ?? "", attempt };
}

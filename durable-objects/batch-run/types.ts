/**
 * The contract of a `BatchRun` (docs/batch-api.md): what the edge sends to create a batch,
 * the OpenAI batch object every RPC answers with, and the statuses.
 */
import type { BatcherSetup } from "../../contracts/config/plans.ts";
import type { ModelPrice } from "../../contracts/pricing.ts";
import type { ItemPath } from "../../contracts/protocol/schema.ts";

/** OpenAI's batch statuses. */
export type BatchStatus =
  | "validating"
  | "failed"
  | "in_progress"
  | "finalizing"
  | "completed"
  | "expired"
  | "cancelling"
  | "cancelled";

/** One line of the input file as the edge planned it. */
export interface BatchLinePlan {
  customId: string;
  /**
   * The key of its prompt's leading prefix (contracts/prefix-blocks.ts `prefixKey`): lines
   * that share it are sent together; null for a prompt shorter than one block.
   */
  prefix: number | null;
  /** Where the line lies in the input file. */
  offset: number;
  bytes: number;
  /** Estimated prompt tokens and completion allowance of one sequence (for the Batcher). */
  promptTokens: number;
  maxTokens: number;
  /** Its worst-case cost at the batch price, reserved with the batch. */
  reservePicos: bigint;
}

/** A line ready to be sent. */
export interface LineToRun {
  idx: number;
  customId: string;
  /** The key of its prompt's leading prefix; null when shorter than one block. */
  prefix: number | null;
  offset: number;
  bytes: number;
  promptTokens: number;
  maxTokens: number;
}

/** How the lines are run: the Batchers of one region and model, in the batch lane. */
export interface BatchRunPlan {
  setup: BatcherSetup;
  /** Names of the region and model's Batchers, one per shard. */
  batchers: string[];
  lane: number;
  linesInFlight: number;
  firstByteTimeoutMs: number;
  itemTimeoutMs: number;
  /** The model id the origins know the lines by (an alias resolved). */
  model: string;
  /** The model's price and the share of it a line is billed, in millionths. */
  price: ModelPrice;
  priceSharePpm: number;
}

/** What `create` is given. */
export interface BatchCreateInput {
  id: string;
  /** Key id of the owner, whose account holds the batch's reservation. */
  owner: string;
  endpoint: ItemPath;
  inputFileId: string;
  metadata: Record<string, string> | null;
  /** Unix ms. */
  now: number;
  run: BatchRunPlan;
  lines: BatchLinePlan[];
}

/** OpenAI's batch object. */
export interface OpenAIBatch {
  id: string;
  object: "batch";
  endpoint: string;
  errors: { object: "list"; data: { code: string; message: string; line: number | null }[] } | null;
  input_file_id: string;
  completion_window: "24h";
  status: BatchStatus;
  output_file_id: string | null;
  error_file_id: string | null;
  created_at: number;
  in_progress_at: number | null;
  expires_at: number;
  finalizing_at: number | null;
  completed_at: number | null;
  failed_at: number | null;
  expired_at: number | null;
  cancelling_at: number | null;
  cancelled_at: number | null;
  request_counts: { total: number; completed: number; failed: number };
  metadata: Record<string, string> | null;
}

/** OpenAI's completion window, the only one it offers. */
export const COMPLETION_WINDOW_MS = 24 * 3_600_000;

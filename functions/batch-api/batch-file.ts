/**
 * A batch input file, line by line (docs/batch-api.md, "Files"): each line is a JSON object
 * with a unique `custom_id`, `method` `POST`, a supported `url` and a `body` that the
 * endpoint's own schema accepts, every line for the same model, within OpenAI's limits. A
 * batch plans each line: its model, prompt estimate, completion allowance and worst case.
 */
import type { CompletionBody } from "../app-env.ts";
import type { ResolvedConfig } from "../../contracts/config/gateway.ts";
import { type ModelConfig, resolveModels } from "../../contracts/config/models.ts";
import { MAX_BATCH_LINES } from "../../contracts/batch-files.ts";
import { type ApiError, clipped, invalidRequest } from "../../contracts/errors.ts";
import {
  COLD_KEY_BLOCKS,
  type PrefixRequest,
  prefixKey,
  promptBlocks,
} from "../../contracts/prefix-blocks.ts";
import { worstCasePicos } from "../../contracts/pricing.ts";
import type { ItemPath } from "../../contracts/protocol/schema.ts";
import type { BatchLinePlan } from "../../durable-objects/batch-run/types.ts";
import {
  completionAllowance,
  requestShape,
  sequenceAllowance,
} from "../middleware/completion-plan.ts";
import { BODY_SCHEMAS } from "../request/body-schemas.ts";
import { FIRST_ISSUE, validationError } from "../request/validation-errors.ts";
import { type JsonlLine, jsonlLines } from "./jsonl.ts";

/** The endpoints a batch may target, and the kind of body each takes. */
export const BATCH_ENDPOINTS: Readonly<Record<string, CompletionBody["kind"]>> = {
  "/v1/chat/completions": "chat",
  "/v1/completions": "completion",
  "/v1/responses": "responses",
  "/v1/embeddings": "embeddings",
};

/** One checked line: where it lies, its custom id, endpoint and validated body. */
export interface BatchLine {
  line: JsonlLine;
  customId: string;
  url: ItemPath;
  completion: CompletionBody;
}

/** A 400 naming the line of the file at fault, OpenAI's `invalid_batch_file`-style message. */
function lineError(line: number, message: string, param: string | null = null): ApiError {
  return invalidRequest(`Line ${line} of the batch file: ${message}`, param, "invalid_file");
}

/** Checks one line; throws the 400 that names it. */
export function checkLine(line: JsonlLine): BatchLine {
  let json: unknown;
  try {
    json = JSON.parse(line.text);
  } catch {
    throw lineError(line.number, "not valid JSON.");
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw lineError(line.number, "expected a JSON object.");
  }
  const { custom_id: customId, method, url, body } = json as Record<string, unknown>;
  if (typeof customId !== "string" || customId === "") {
    throw lineError(line.number, "'custom_id' must be a non-empty string.", "custom_id");
  }
  if (method !== "POST") throw lineError(line.number, "'method' must be 'POST'.", "method");
  const kind = typeof url === "string" ? BATCH_ENDPOINTS[url] : undefined;
  if (kind === undefined) {
    throw lineError(
      line.number,
      `'url' must be one of ${Object.keys(BATCH_ENDPOINTS).join(", ")}.`,
      "url",
    );
  }
  const parsed = BODY_SCHEMAS[kind].safeParse(body, FIRST_ISSUE);
  if (!parsed.success) {
    const issue = validationError(parsed.error.issues);
    throw lineError(
      line.number,
      issue.message,
      issue.param === null ? "body" : `body.${issue.param}`,
    );
  }
  if ((parsed.data as { stream?: boolean | null }).stream === true) {
    throw lineError(
      line.number,
      "a batch line cannot be streamed ('stream' must not be true).",
      "body.stream",
    );
  }
  const completion = { kind, body: parsed.data, text: "" } as CompletionBody;
  return { line, customId, url: url as ItemPath, completion };
}

/**
 * Checks every line of a file as it streams by: each line, unique custom ids, one model,
 * at most {@link MAX_BATCH_LINES}; `onLine` sees each checked line. Throws the first 400.
 */
export async function checkBatchFile(
  stream: ReadableStream<Uint8Array>,
  onLine: (line: BatchLine) => void = () => {},
): Promise<{ lines: number; model: string; url: ItemPath }> {
  const seen = new Set<string>();
  let model: string | null = null;
  let url: ItemPath | null = null;
  try {
    for await (const raw of jsonlLines(stream)) {
      if (seen.size >= MAX_BATCH_LINES) {
        throw invalidRequest(
          `A batch file holds at most ${MAX_BATCH_LINES} requests.`,
          "file",
          "invalid_file",
        );
      }
      const line = checkLine(raw);
      if (seen.has(line.customId)) {
        throw lineError(
          raw.number,
          `'custom_id' '${clipped(line.customId)}' is used twice.`,
          "custom_id",
        );
      }
      seen.add(line.customId);
      // The endpoint first: lines for another endpoint name another model too.
      if (url !== null && line.url !== url) {
        throw lineError(raw.number, `every line must use the same url ('${url}').`, "url");
      }
      const lineModel = line.completion.body.model;
      if (model !== null && lineModel !== model) {
        throw lineError(
          raw.number,
          `every line must use the same model ('${clipped(model)}').`,
          "body.model",
        );
      }
      model = lineModel;
      url = line.url;
      onLine(line);
    }
  } catch (error) {
    if (error instanceof TypeError) {
      throw invalidRequest("The batch file is not UTF-8 text.", "file", "invalid_file");
    }
    throw error;
  }
  if (model === null || url === null) {
    throw invalidRequest("The batch file has no requests.", "file", "invalid_file");
  }
  return { lines: seen.size, model, url };
}

/** The model a batch of `model` runs on: the first the alias names whose window fits every line. */
export function batchModel(config: ResolvedConfig, model: string): ModelConfig[] {
  return resolveModels(config, model);
}

/** One line's plan on `model` at `priceSharePpm` of its price; throws a 400 when it does not fit. */
export function planLine(
  line: BatchLine,
  model: ModelConfig,
  priceSharePpm: number,
): BatchLinePlan {
  const shape = requestShape(line.completion);
  const completionTokens = shape.maxTokens ?? 0;
  if (
    shape.promptTokens + completionTokens > model.maxModelLen ||
    (shape.maxTokens === null && shape.promptTokens >= model.maxModelLen)
  ) {
    throw lineError(
      line.line.number,
      `the request does not fit the ${model.maxModelLen}-token window of ${model.id}.`,
      "body",
    );
  }
  const full = worstCasePicos(
    model.price,
    shape.totalPromptTokens,
    completionAllowance(shape, model),
  );
  // Only the leading blocks that key a prefix; an embedding has nothing to reuse.
  const blocks =
    line.completion.kind === "embeddings"
      ? []
      : promptBlocks(model.id, line.completion.body as PrefixRequest, COLD_KEY_BLOCKS);
  return {
    customId: line.customId,
    prefix: prefixKey(blocks),
    offset: line.line.offset,
    bytes: line.line.bytes,
    promptTokens: shape.promptTokens,
    maxTokens: sequenceAllowance(shape, model),
    reservePicos: (full * BigInt(priceSharePpm) + 999_999n) / 1_000_000n,
  };
}

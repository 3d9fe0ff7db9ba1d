/**
 * `/v1/batches`: create a batch from an uploaded file, look it up, list the key's batches
 * (newest first, `after` and `limit`), cancel one. Each batch is a `BatchRun` Durable
 * Object, which runs its lines in its region's batch lane. See docs/batch-api.md.
 */
import { type Context, Hono } from "hono";
import { z } from "zod";
import type { AppEnv } from "../app-env.ts";
import { methodNotAllowed } from "../error-handler.ts";
import { checkCaller, verifyCredential } from "../middleware/auth.ts";
import { requireApiKey } from "../middleware/api-key-only.ts";
import { batchIndexKey, fileKey, newBatchId } from "../../contracts/batch-files.ts";
import { batchingPlan } from "../../contracts/config/plans.ts";
import type { ModelConfig } from "../../contracts/config/models.ts";
import {
  ApiError,
  clipped,
  invalidRequest,
  modelNotFound,
  notFound,
} from "../../contracts/errors.ts";
import { formatUsd } from "../../contracts/pricing.ts";
import { retryAfterHeaders } from "../accounts/rate-limit-headers.ts";
import { refusalError } from "../accounts/account-client.ts";
import type { ItemPath } from "../../contracts/protocol/schema.ts";
import type { BatchCreateResult } from "../../durable-objects/batch-run/index.ts";
import type { BatchLinePlan, OpenAIBatch } from "../../durable-objects/batch-run/types.ts";
import { batcherName } from "../delivery/batcher-plan.ts";
import { regionOrder } from "../delivery/region-choice.ts";
import { FIRST_ISSUE, validationError } from "../request/validation-errors.ts";
import { BATCH_ENDPOINTS, batchModel, checkBatchFile, planLine } from "../batch-api/batch-file.ts";
import { REGION_OVERRIDE_HEADER } from "./completions.ts";
import { ownFile } from "./files.ts";

// OpenAI's limits on an object's metadata: 16 pairs, keys to 64 characters, values to 512.
const BatchMetadata = z
  .record(z.string().max(64), z.string().max(512))
  .refine((metadata) => Object.keys(metadata).length <= 16, {
    message: "Metadata may have at most 16 keys.",
  });

const CreateBatchSchema = z.looseObject({
  input_file_id: z.string(),
  endpoint: z.enum(Object.keys(BATCH_ENDPOINTS) as [string, ...string[]]),
  completion_window: z.literal("24h"),
  metadata: BatchMetadata.nullable().optional(),
});

function notFoundBatch(id: string): ApiError {
  return notFound(`No batch found with id '${clipped(id)}'.`, "batch_not_found", "batch_id");
}

function refusedForBudget(
  refusal: Extract<BatchCreateResult, { ok: false }>["refusal"],
  keyId: string,
): ApiError {
  if (refusal.code === "invalid_api_key") {
    return new ApiError(401, "Incorrect API key provided.", {
      type: "invalid_request_error",
      code: "invalid_api_key",
    });
  }
  if (refusal.code === "key_blocked" || refusal.code === "model_not_allowed") {
    return refusalError({ ok: false, ...refusal }, keyId);
  }
  if (refusal.code === "team_busy") {
    return new ApiError(429, "The key's team allowance is in use by its other keys now; retry.", {
      type: "requests",
      code: "rate_limit_exceeded",
      headers: retryAfterHeaders(1_000),
    });
  }
  const owner =
    refusal.scope === "team" && refusal.teamId !== undefined
      ? `team ${refusal.teamId}`
      : `key ${keyId}`;
  return new ApiError(
    429,
    `This batch may cost up to $${formatUsd(refusal.requestedPicos)} at the batch price, more than the ${refusal.budget} budget of ${owner} has left (limit $${formatUsd(refusal.limitPicos)}, spent $${formatUsd(refusal.spentPicos)}, reserved $${formatUsd(refusal.reservedPicos)}). Split the file into smaller batches or lower max_tokens.`,
    {
      type: "insufficient_quota",
      param: "input_file_id",
      code: "insufficient_quota",
      headers: { "x-should-retry": "false" },
    },
  );
}

/** The regions to run a batch in, in order: the default first, or the one the key chose. */
async function batchRegions(c: Context<AppEnv>) {
  const config = c.get("config");
  const override = c.req.header(REGION_OVERRIDE_HEADER);
  if (override === undefined) return regionOrder(config, {});
  const { record } = await checkCaller(c);
  if (!record.allowRegionOverride) {
    throw new ApiError(403, `This key may not choose its region (${REGION_OVERRIDE_HEADER}).`, {
      type: "permission_error",
      param: REGION_OVERRIDE_HEADER,
      code: "region_override_not_allowed",
    });
  }
  return regionOrder(config, {}, override);
}

/** Plans every line of the input file on one model of the batch's region. */
async function planBatch(c: Context<AppEnv>, inputFileId: string, endpoint: ItemPath) {
  const config = c.get("config");
  const order = await batchRegions(c);
  if (order.kind === "unknown_region") {
    throw invalidRequest(
      `Unknown region '${clipped(order.region)}' in the ${REGION_OVERRIDE_HEADER} header.`,
      REGION_OVERRIDE_HEADER,
      "invalid_region",
    );
  }
  const { meta } = await ownFile(c, inputFileId);
  if (meta.purpose !== "batch") {
    throw invalidRequest(
      `File ${inputFileId} was not uploaded for batches.`,
      "input_file_id",
      "invalid_file",
    );
  }
  const object = await c.env.FILES.get(fileKey(inputFileId));
  if (object === null)
    throw notFound(
      `No such File object: ${clipped(inputFileId)}`,
      "file_not_found",
      "input_file_id",
    );
  const priceSharePpm = Math.round(config.batchApi.priceShare * 1_000_000);
  const lines: BatchLinePlan[] = [];
  let model: ModelConfig | null = null;
  await checkBatchFile(object.body, (line) => {
    if (line.url !== endpoint) {
      throw invalidRequest(
        `Line ${line.line.number} of the batch file targets ${line.url}, not the batch's endpoint ${endpoint}.`,
        "endpoint",
        "invalid_file",
      );
    }
    model ??= batchModel(config, line.completion.body.model)[0] ?? null;
    if (model === null) throw modelNotFound(line.completion.body.model);
    lines.push(planLine(line, model, priceSharePpm));
  });
  const chosen = model as ModelConfig | null;
  if (chosen === null)
    throw invalidRequest("The batch file has no requests.", "input_file_id", "invalid_file");
  for (const region of order.regions) {
    const plan = batchingPlan(config, region, chosen.id);
    if (plan === null) continue;
    const batchers = Array.from({ length: plan.shards }, (_, shard) =>
      batcherName(region.id, chosen.id, shard, plan),
    );
    const run = {
      setup: plan.setup,
      batchers,
      lane: plan.setup.window.batchLane ?? plan.setup.window.lanes.length - 1,
      linesInFlight: config.batchApi.linesInFlight,
      firstByteTimeoutMs: config.limits.firstByteTimeoutMs,
      itemTimeoutMs: config.limits.requestTimeoutMs,
      model: chosen.id,
      price: chosen.price,
      priceSharePpm,
    };
    return { run, lines };
  }
  throw modelNotFound(chosen.id);
}

/** The batches route group, mounted at `/v1/batches`. */
export const batches = new Hono<AppEnv>()
  .use(verifyCredential())
  .use(requireApiKey("use the Batch API"))
  .post("/", async (c) => {
    let json: unknown;
    try {
      json = await c.req.json();
    } catch {
      throw invalidRequest("We could not parse the JSON body of your request.", null, null);
    }
    const parsed = CreateBatchSchema.safeParse(json, FIRST_ISSUE);
    if (!parsed.success) throw validationError(parsed.error.issues);
    const body = parsed.data;
    const endpoint = body.endpoint as ItemPath;
    const { run, lines } = await planBatch(c, body.input_file_id, endpoint);
    const owner = c.get("caller").keyId;
    const now = Date.now();
    const id = newBatchId(now);
    const created = await c.env.BATCH_RUN.getByName(id).create({
      id,
      owner,
      endpoint,
      inputFileId: body.input_file_id,
      metadata: body.metadata ?? null,
      now,
      run,
      lines,
    });
    if (!created.ok) throw refusedForBudget(created.refusal, owner);
    await c.env.FILES.put(batchIndexKey(owner, id), "");
    return c.json(created.batch);
  })
  .get("/", async (c) => {
    const owner = c.get("caller").keyId;
    const limitText = c.req.query("limit");
    const limit = limitText === undefined ? 20 : Number(limitText);
    if (!Number.isInteger(limit) || limit < 1 || limit > 100) {
      throw invalidRequest("'limit' must be an integer from 1 to 100.", "limit", "invalid_value");
    }
    const after = c.req.query("after");
    const prefix = batchIndexKey(owner, "");
    const listed = await c.env.FILES.list({
      prefix,
      limit: limit + 1,
      ...(after !== undefined && { startAfter: prefix + after }),
    });
    const ids = listed.objects.map((o) => o.key.slice(prefix.length));
    const shown = ids.slice(0, limit);
    const found: (OpenAIBatch | null)[] = await Promise.all(
      shown.map(
        async (id) => (await c.env.BATCH_RUN.getByName(id).get(owner)) as OpenAIBatch | null,
      ),
    );
    const data = found.filter((batch) => batch !== null);
    return c.json({
      object: "list",
      data,
      first_id: data[0]?.id ?? null,
      last_id: data[data.length - 1]?.id ?? null,
      has_more: ids.length > limit,
    });
  })
  .all("/", methodNotAllowed(["GET", "POST"]))
  .get("/:id", async (c) => {
    const id = c.req.param("id");
    if (!id.startsWith("batch_")) throw notFoundBatch(id);
    const batch = await c.env.BATCH_RUN.getByName(id).get(c.get("caller").keyId);
    if (batch === null) throw notFoundBatch(id);
    return c.json(batch);
  })
  .all("/:id", methodNotAllowed(["GET"]))
  .post("/:id/cancel", async (c) => {
    const id = c.req.param("id");
    if (!id.startsWith("batch_")) throw notFoundBatch(id);
    const result = await c.env.BATCH_RUN.getByName(id).cancel(c.get("caller").keyId);
    if (result === null) throw notFoundBatch(id);
    if (!result.ok) {
      throw new ApiError(409, `Cannot cancel a batch with status '${result.batch.status}'.`, {
        type: "invalid_request_error",
        code: "batch_not_cancellable",
      });
    }
    return c.json(result.batch);
  })
  .all("/:id/cancel", methodNotAllowed(["POST"]));

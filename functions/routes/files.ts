/**
 * `/v1/files`: upload a batch input file (multipart, purpose `batch`, checked line by line),
 * look it up, read its content, delete it. Files lie in the `FILES` bucket and only the key
 * that uploaded them (or whose batch wrote them) sees them. See docs/batch-api.md.
 */
import { type Context, Hono } from "hono";
import type { AppEnv } from "../app-env.ts";
import { methodNotAllowed } from "../error-handler.ts";
import { verifyCredential } from "../middleware/auth.ts";
import { requireApiKey } from "../middleware/api-key-only.ts";
import {
  type FileMeta,
  MAX_BATCH_FILE_BYTES,
  fileIndexKey,
  fileIndexKeys,
  fileKey,
  fileObject,
  metaOf,
  newFileId,
  storedMeta,
} from "../../contracts/batch-files.ts";
import { ApiError, clipped, invalidRequest, notFound } from "../../contracts/errors.ts";
import { checkBatchFile } from "../batch-api/batch-file.ts";
import { listFiles } from "../batch-api/file-list.ts";

// OpenAI's bounds on `limit` when listing files, and its default.
const MAX_LIST_LIMIT = 10_000;

/** The file `id` of the caller, with its metadata; a 404 when there is none. */
export async function ownFile(
  c: Context<AppEnv>,
  id: string,
  param = "id",
): Promise<{ object: R2Object; meta: FileMeta }> {
  const object = await c.env.FILES.head(fileKey(id));
  const meta = metaOf(object?.customMetadata);
  if (object === null || meta === null || meta.owner !== c.get("caller").keyId) {
    throw notFound(`No such File object: ${clipped(id)}`, "file_not_found", param);
  }
  return { object, meta };
}

async function uploadedFile(c: Context<AppEnv>): Promise<{ file: File; purpose: string }> {
  const type = c.req.header("content-type") ?? "";
  if (!type.toLowerCase().startsWith("multipart/form-data")) {
    throw invalidRequest(
      "Upload a file as multipart/form-data with the fields 'file' and 'purpose'.",
      null,
      "unsupported_content_type",
    );
  }
  let form: FormData;
  try {
    form = await c.req.raw.formData();
  } catch {
    throw invalidRequest("The multipart body could not be read.", null, null);
  }
  const file = form.get("file");
  const purpose = form.get("purpose");
  if (typeof file === "string" || file === null) {
    throw invalidRequest(
      "Missing required parameter: 'file'.",
      "file",
      "missing_required_parameter",
    );
  }
  if (typeof purpose !== "string") {
    throw invalidRequest(
      "Missing required parameter: 'purpose'.",
      "purpose",
      "missing_required_parameter",
    );
  }
  return { file, purpose };
}

/** The query of `GET /v1/files`, checked as OpenAI documents it. */
async function listQuery(c: Context<AppEnv>) {
  const limitText = c.req.query("limit");
  const limit = limitText === undefined ? MAX_LIST_LIMIT : Number(limitText);
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIST_LIMIT) {
    throw invalidRequest(
      `'limit' must be an integer from 1 to ${MAX_LIST_LIMIT}.`,
      "limit",
      "invalid_value",
    );
  }
  const order = c.req.query("order") ?? "desc";
  if (order !== "asc" && order !== "desc") {
    throw invalidRequest(
      `Invalid value for 'order': expected 'asc' or 'desc', got '${clipped(order)}'.`,
      "order",
      "invalid_value",
    );
  }
  const after = c.req.query("after");
  const startAfter =
    after === undefined
      ? null
      : fileIndexKey(order, (await ownFile(c, after, "after")).meta, after);
  const purpose = c.req.query("purpose") ?? null;
  return { owner: c.get("caller").keyId, order, limit, purpose, startAfter } as const;
}

/** The files route group, mounted at `/v1/files`. */
export const files = new Hono<AppEnv>()
  .use(verifyCredential())
  .use(requireApiKey("use the Files API"))
  .post("/", async (c) => {
    const { file, purpose } = await uploadedFile(c);
    if (purpose !== "batch") {
      throw invalidRequest(
        `Invalid value for 'purpose': this gateway keeps files for batches only ('batch'), not '${clipped(purpose)}'.`,
        "purpose",
        "invalid_value",
      );
    }
    if (file.size > MAX_BATCH_FILE_BYTES) {
      throw new ApiError(413, `A batch input file may be at most ${MAX_BATCH_FILE_BYTES} bytes.`, {
        type: "invalid_request_error",
        param: "file",
        code: "file_too_large",
      });
    }
    await checkBatchFile(file.stream());
    const id = newFileId();
    const meta: FileMeta = {
      owner: c.get("caller").keyId,
      purpose: "batch",
      filename: file.name === "" ? "batch.jsonl" : file.name,
      createdMs: Date.now(),
    };
    await c.env.FILES.put(fileKey(id), file, { customMetadata: storedMeta(meta) });
    const entry = { customMetadata: storedMeta(meta, file.size) };
    await Promise.all(fileIndexKeys(meta, id).map((key) => c.env.FILES.put(key, "", entry)));
    return c.json(fileObject(id, file.size, meta));
  })
  .get("/", async (c) => {
    const { files: data, hasMore } = await listFiles(c.env.FILES, await listQuery(c));
    return c.json({
      object: "list",
      data,
      first_id: data[0]?.id ?? null,
      last_id: data[data.length - 1]?.id ?? null,
      has_more: hasMore,
    });
  })
  .all("/", methodNotAllowed(["GET", "POST"]))
  .get("/:id", async (c) => {
    const { object, meta } = await ownFile(c, c.req.param("id"));
    return c.json(fileObject(c.req.param("id"), object.size, meta));
  })
  .delete("/:id", async (c) => {
    const id = c.req.param("id");
    const { meta } = await ownFile(c, id);
    await c.env.FILES.delete([fileKey(id), ...fileIndexKeys(meta, id)]);
    return c.json({ id, object: "file", deleted: true });
  })
  .all("/:id", methodNotAllowed(["GET", "DELETE"]))
  .get("/:id/content", async (c) => {
    const id = c.req.param("id");
    await ownFile(c, id);
    const object = await c.env.FILES.get(fileKey(id));
    if (object === null)
      throw notFound(`No such File object: ${clipped(id)}`, "file_not_found", "id");
    return new Response(object.body, {
      headers: {
        "content-type": "application/octet-stream",
        "content-length": String(object.size),
      },
    });
  })
  .all("/:id/content", methodNotAllowed(["GET"]));

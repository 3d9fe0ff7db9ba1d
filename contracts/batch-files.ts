/**
 * What the edge and each batch's Durable Object agree on about Batch API files
 * (docs/batch-api.md): where a file lies in the bucket, the metadata stored with it, the
 * OpenAI file object, OpenAI's limits on a batch input file, and how ids are made.
 */

/** OpenAI's limits on a batch input file: lines and bytes. */
export const MAX_BATCH_LINES = 50_000;
export const MAX_BATCH_FILE_BYTES = 200 * 1024 * 1024;

/** The purposes a file may have; the gateway runs batches, so it keeps `batch` files. */
export type FilePurpose = "batch" | "batch_output";

/** Metadata stored with each file object in the bucket (strings only, as R2 keeps them). */
export interface FileMeta {
  /** Key id of the key that owns it: no other key sees it. */
  owner: string;
  purpose: FilePurpose;
  filename: string;
  /** Unix milliseconds. */
  createdMs: number;
}

/** The OpenAI file object. */
export interface OpenAIFile {
  id: string;
  object: "file";
  bytes: number;
  created_at: number;
  filename: string;
  purpose: FilePurpose;
  status: "processed";
  expires_at: number | null;
  status_details: null;
}

/** The bucket key of a file. */
export function fileKey(id: string): string {
  return `files/${id}`;
}

/** The bucket key that lists a key's batches, newest first (see {@link newBatchId}). */
export function batchIndexKey(owner: string, batchId: string): string {
  return `batches/${owner}/${batchId}`;
}

// Ids and lists sort newest first: the time counts down from this (year 2286).
const ID_EPOCH_END_MS = 0xfffffffffff;

/** Orders in which a key's files are listed by creation time. */
export type FileOrder = "asc" | "desc";

/** The bucket key of a file's entry in its owner's list in one order (see `GET /v1/files`). */
export function fileIndexKey(order: FileOrder, meta: FileMeta, id: string): string {
  const ms = order === "asc" ? meta.createdMs : ID_EPOCH_END_MS - meta.createdMs;
  return `${fileIndexPrefix(meta.owner, order)}${ms.toString(16).padStart(11, "0")}/${id}`;
}

/** The bucket prefix of a key's file list in one order. */
export function fileIndexPrefix(owner: string, order: FileOrder): string {
  return `file-index/${owner}/${order}/`;
}

/** The bucket keys of a file's list entries (both orders), each stored with its metadata. */
export function fileIndexKeys(meta: FileMeta, id: string): string[] {
  return [fileIndexKey("asc", meta, id), fileIndexKey("desc", meta, id)];
}

/** Metadata as stored (strings) from {@link FileMeta}. */
export function storedMeta(meta: FileMeta, bytes?: number): Record<string, string> {
  return {
    owner: meta.owner,
    purpose: meta.purpose,
    filename: meta.filename,
    created_ms: String(meta.createdMs),
    ...(bytes !== undefined && { bytes: String(bytes) }),
  };
}

/** {@link FileMeta} from what the bucket returned; null when it is not a file of ours. */
export function metaOf(stored: Record<string, string> | undefined): FileMeta | null {
  const owner = stored?.["owner"];
  const purpose = stored?.["purpose"];
  if (owner === undefined || (purpose !== "batch" && purpose !== "batch_output")) return null;
  return {
    owner,
    purpose,
    filename: stored?.["filename"] ?? "",
    createdMs: Number(stored?.["created_ms"] ?? 0),
  };
}

/** The OpenAI file object of a stored file. */
export function fileObject(id: string, bytes: number, meta: FileMeta): OpenAIFile {
  return {
    id,
    object: "file",
    bytes,
    created_at: Math.floor(meta.createdMs / 1000),
    filename: meta.filename,
    purpose: meta.purpose,
    status: "processed",
    expires_at: null,
    status_details: null,
  };
}

function randomHex(bytes: number): string {
  const values = crypto.getRandomValues(new Uint8Array(bytes));
  return Array.from(values, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** A new file id, `file-` and 24 random hex digits. */
export function newFileId(): string {
  return `file-${randomHex(12)}`;
}

/** A new batch id whose text sorts newest first, as OpenAI lists batches. */
export function newBatchId(now: number): string {
  const countdown = (ID_EPOCH_END_MS - now).toString(16).padStart(11, "0");
  return `batch_${countdown}${randomHex(6)}`;
}

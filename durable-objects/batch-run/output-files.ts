/**
 * Writing a batch's output and error files to the bucket (docs/batch-api.md, "Output"):
 * one record per line, ordered by custom id, streamed from SQLite page by page into a
 * stream of known length. Their ids follow from the batch's, so a write that a restart
 * cut is written again under the same id.
 */
import { fileIndexKeys, fileKey, storedMeta } from "../../contracts/batch-files.ts";
import type { BatchStore } from "./store.ts";

// Records read from SQLite per page while a file is written.
const PAGE = 500;

/** The id of a batch's output (`ok`) or error file. */
export function outputFileId(batchId: string, ok: boolean): string {
  return `file-${batchId.slice("batch_".length)}${ok ? "out" : "err"}`;
}

/** Writes the output (`ok`) or error file of a batch; null when it has no such lines. */
export async function writeOutputFile(
  bucket: R2Bucket,
  store: BatchStore,
  batchId: string,
  ok: boolean,
  now: number,
): Promise<string | null> {
  const bytes = store.recordBytes(ok);
  if (bytes === 0) return null;
  const id = outputFileId(batchId, ok);
  const { readable, writable } = new FixedLengthStream(bytes);
  const meta = {
    owner: store.owner,
    purpose: "batch_output" as const,
    filename: `${batchId}_${ok ? "output" : "error"}.jsonl`,
    createdMs: now,
  };
  const put = bucket.put(fileKey(id), readable, {
    customMetadata: storedMeta(meta),
    httpMetadata: { contentType: "application/jsonl" },
  });
  const writer = writable.getWriter();
  const encoder = new TextEncoder();
  let after: string | null = null;
  for (;;) {
    const page = store.records(ok, after, PAGE);
    if (page.length === 0) break;
    await writer.write(encoder.encode(page.map((row) => `${row.record}\n`).join("")));
    after = page[page.length - 1]?.customId ?? null;
  }
  await writer.close();
  await put;
  const entry = { customMetadata: storedMeta(meta, bytes) };
  await Promise.all(fileIndexKeys(meta, id).map((key) => bucket.put(key, "", entry)));
  return id;
}

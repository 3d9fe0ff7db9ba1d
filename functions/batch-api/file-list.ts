/**
 * A key's files listed from their entries in the bucket (`GET /v1/files`): one entry per
 * file and order, with the file's metadata, so a page needs no lookup per file. See
 * docs/batch-api.md, "Files".
 */
import {
  type FileOrder,
  type OpenAIFile,
  fileIndexPrefix,
  fileObject,
  metaOf,
} from "../../contracts/batch-files.ts";

/** What a page of the list asks for. */
export interface FileListQuery {
  owner: string;
  order: FileOrder;
  limit: number;
  /** Only files of this purpose. */
  purpose: string | null;
  /** The bucket key of the entry to list after (the `after` file's), or null. */
  startAfter: string | null;
}

/** Up to `limit` files and whether more follow. */
export async function listFiles(
  bucket: R2Bucket,
  query: FileListQuery,
): Promise<{ files: OpenAIFile[]; hasMore: boolean }> {
  const files: OpenAIFile[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await bucket.list({
      prefix: fileIndexPrefix(query.owner, query.order),
      limit: 1000,
      include: ["customMetadata"],
      ...(cursor === undefined
        ? query.startAfter !== null && { startAfter: query.startAfter }
        : { cursor }),
    });
    for (const entry of page.objects) {
      const meta = metaOf(entry.customMetadata);
      if (meta === null || meta.owner !== query.owner) continue;
      if (query.purpose !== null && meta.purpose !== query.purpose) continue;
      if (files.length === query.limit) return { files, hasMore: true };
      const id = entry.key.slice(entry.key.lastIndexOf("/") + 1);
      files.push(fileObject(id, Number(entry.customMetadata?.["bytes"] ?? 0), meta));
    }
    if (!page.truncated) return { files, hasMore: false };
    cursor = page.cursor;
  }
}

/**
 * Where cached answers live: Cloudflare's Cache API in the colo that served the request
 * (docs/cache.md, "Storage"). An entry is the answer's exact bytes with its content type,
 * usage and expiry in headers; the expiry is checked on every read, so an entry is never
 * served past its lifetime whatever the cache keeps.
 */
import type { ItemUsage } from "../../contracts/protocol/schema.ts";

/** A cached answer. */
export interface CacheEntry {
  /** The bytes the origin wrote, exactly. */
  body: Uint8Array;
  contentType: string;
  /** What generating it cost: the tokens a hit saves. */
  usage: ItemUsage;
  /** The model that generated it. */
  model: string;
  /** When it was stored and when it expires (epoch ms). */
  storedAt: number;
  expiresAt: number;
}

const EXPIRES = "x-warmgate-cache-expires";
const STORED = "x-warmgate-cache-stored";
const USAGE = "x-warmgate-cache-usage";
const MODEL = "x-warmgate-cache-model";

// Inside the Worker's own hostname: the Cache API keeps entries per zone.
function entryUrl(requestUrl: string, key: string): string {
  return `${new URL(requestUrl).origin}/__warmgate/cache/${key}`;
}

/** Whether an entry stored until `expiresAt` may still be served at `now`. */
export function isFresh(expiresAt: number, now: number): boolean {
  return now < expiresAt;
}

/** The entry under `key`, or null when there is none or it has expired. */
export async function readEntry(
  cache: Cache,
  requestUrl: string,
  key: string,
  now: number,
): Promise<CacheEntry | null> {
  const found = await cache.match(entryUrl(requestUrl, key));
  if (found === undefined) return null;
  const expiresAt = Number(found.headers.get(EXPIRES));
  let usage: ItemUsage;
  try {
    usage = JSON.parse(found.headers.get(USAGE) ?? "") as ItemUsage;
  } catch {
    await found.body?.cancel();
    return null;
  }
  if (!isFresh(expiresAt, now)) {
    await found.body?.cancel();
    return null;
  }
  return {
    body: new Uint8Array(await found.arrayBuffer()),
    contentType: found.headers.get("content-type") ?? "application/json",
    usage,
    model: found.headers.get(MODEL) ?? "",
    storedAt: Number(found.headers.get(STORED)),
    expiresAt,
  };
}

/** Stores an entry under `key` for `ttlSeconds`. */
export async function writeEntry(
  cache: Cache,
  requestUrl: string,
  key: string,
  entry: CacheEntry,
): Promise<void> {
  const ttlSeconds = Math.max(1, Math.ceil((entry.expiresAt - entry.storedAt) / 1_000));
  const response = new Response(entry.body, {
    headers: {
      "content-type": entry.contentType,
      "cache-control": `max-age=${ttlSeconds}`,
      [EXPIRES]: String(entry.expiresAt),
      [STORED]: String(entry.storedAt),
      [USAGE]: JSON.stringify(entry.usage),
      [MODEL]: entry.model,
    },
  });
  await cache.put(entryUrl(requestUrl, key), response);
}

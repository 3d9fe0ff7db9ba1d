/**
 * Where a key's account asks how its lapsed requests ended (docs/key-account.md, "Leases
 * and reconciliation"): every origin of the configuration, which remember each item they
 * ran (`POST /v1/batch/outcomes`); the lookup and the billing rule are in
 * `contracts/outcomes.ts`, shared with the edge, and what is asked in `lapsed.ts`.
 */
import { ConfigError, type ResolvedConfig, loadConfig } from "../../contracts/config/gateway.ts";
import type { OutcomeSource } from "../../contracts/outcomes.ts";
import type { RequestAttempt } from "./types.ts";

/** The origins a key's account asks, and where each origin id and region points. */
export interface OriginBook {
  /** Each URL once. */
  sources: OutcomeSource[];
  /** Origin id → its URL (two ids may name one URL). */
  urlOf: ReadonlyMap<string, string>;
  /** Region id → its origins' URLs. */
  regionUrls: ReadonlyMap<string, readonly string[]>;
}

/**
 * The origins of a `WARMGATE_CONFIG` document, resolved as the edge resolves it; none when
 * the document is unusable (the edge then admits nothing either).
 */
export function originBook(configText: string | undefined): OriginBook {
  const book = { sources: [], urlOf: new Map(), regionUrls: new Map() };
  let config: ResolvedConfig;
  try {
    config = loadConfig(configText);
  } catch (error) {
    if (error instanceof ConfigError) return book;
    throw error;
  }
  const sources = new Map<string, OutcomeSource>();
  const urlOf = new Map<string, string>();
  const regionUrls = new Map<string, string[]>();
  for (const region of config.regions) {
    const urls: string[] = [];
    for (const origin of region.origins) {
      const url = origin.url.replace(/\/+$/, "");
      sources.set(url, {
        id: origin.id,
        url,
        ...(origin.credentials !== undefined && { credentials: origin.credentials }),
      });
      urlOf.set(origin.id, url);
      urls.push(url);
    }
    regionUrls.set(region.id, urls);
  }
  return { sources: [...sources.values()], urlOf, regionUrls };
}

/**
 * Whether every origin that may hold one of a request's `attempts` answered (`silent`: the
 * URLs of those that did not): the one each attempt names, or every origin of its region
 * when it names none (a Batcher's failure may not); any, for a request whose edge told no
 * attempt (a lapsed one).
 */
export function answeredFor(
  attempts: readonly RequestAttempt[],
  silent: ReadonlySet<string>,
  book: Pick<OriginBook, "urlOf" | "regionUrls">,
): boolean {
  if (silent.size === 0) return true;
  if (attempts.length === 0) return false;
  return attempts.every((attempt) => {
    const urls =
      attempt.origin === null
        ? (book.regionUrls.get(attempt.region) ?? [])
        : [book.urlOf.get(attempt.origin)];
    // One no longer configured is not asked: nothing to wait for.
    return urls.every((url) => url === undefined || !silent.has(url));
  });
}

/**
 * The exact response cache on the completion routes (docs/cache.md): `cachePolicy` reads
 * and checks the cache headers before admission, `responseCache` answers a hit from the
 * colo's cache after it (a request like any other for the key's limits, settled at once at
 * the hit price), and on a miss passes the origin's bytes through unchanged while keeping
 * a copy, stored only once the answer ended whole.
 */
import { createMiddleware } from "hono/factory";
import type { Context } from "hono";
import type { AppEnv } from "../app-env.ts";
import { cacheSettings } from "../../contracts/config/cache.ts";
import { logWarn } from "../../contracts/log.ts";
import type { SettledRequest } from "../accounts/settlement.ts";
import { endUserOf, setHeaders } from "../middleware/auth.ts";
import type { Credential } from "../accounts/account-client.ts";
import { waitUntilOf } from "../middleware/request-context.ts";
import { type CacheScope, cacheKey } from "./key.ts";
import { CACHE_STATUS_HEADER, cacheDecision, readCacheHeaders } from "./policy.ts";
import { type CacheEntry, readEntry, writeEntry } from "./store.ts";
import type { CacheState } from "./state.ts";

/** The Cache API namespace the answers are kept in. */
export const RESPONSE_CACHE_NAME = "warmgate:responses";

/** Longest a miss's answer waits at its end for its entry to be stored. */
const STORE_WAIT_MS = 250;

/** Decides what the cache does for the planned completion; bad cache headers are a 400. */
export function cachePolicy() {
  return createMiddleware<AppEnv>(async function decideCache(c, next) {
    const completion = c.get("completion");
    const settings = cacheSettings(
      c.get("config").cache,
      c.get("caller").keyId,
      c.get("plan").model.id,
    );
    const read = readCacheHeaders((name) => c.req.header(name), settings.maxTtlSeconds);
    if (!read.ok) throw read.error;
    const body = completion.body as Record<string, unknown>;
    const decision = cacheDecision(settings, read.headers, completion.kind, body);
    c.set("cache", { settings, decision, result: decision.use ? "miss" : "bypass", bytes: 0 });
    await next();
  });
}

/** Answers from the cache, or lets the request through and keeps its answer. */
export function responseCache() {
  return createMiddleware<AppEnv>(async function serveFromCache(c, next) {
    const state = c.get("cache");
    if (!state.decision.use) {
      await next();
      setHeaders(c, { [CACHE_STATUS_HEADER]: "BYPASS" });
      return;
    }
    const completion = c.get("completion");
    const plan = c.get("plan");
    const settlement = c.get("settlement");
    // The text as sent, not the validated copy: nested fields the schema leaves out still
    // tell answers apart.
    const body = JSON.parse(completion.text) as Record<string, unknown>;
    const endUser = cacheEndUser(c.get("credential"), body["user"]);
    // A team's keys share entries where so configured; a key without a team keeps its own.
    const teamId = state.settings.scope === "team" ? c.get("admission").teamId : null;
    const scope: CacheScope =
      state.settings.scope === "shared"
        ? { kind: "shared" }
        : teamId !== null
          ? { kind: "team", teamId, endUser }
          : { kind: "key", keyId: c.get("caller").keyId, endUser };
    const key = await cacheKey({
      kind: completion.kind,
      body,
      delivery: plan.delivery,
      scope,
      customKey: state.decision.customKey,
    });
    // This colo's cache, a namespace of its own (docs/cache.md, "Storage").
    const cache = await caches.open(RESPONSE_CACHE_NAME);
    const now = Date.now();
    const entry = await readEntry(cache, c.req.url, key, now).catch((error: unknown) => {
      logWarn("response cache read failed", { request_id: settlement.requestId, error });
      return null;
    });
    if (entry !== null) {
      hit(c, state, entry, now);
      return;
    }
    const { ttlSeconds } = state.decision;
    const waitUntil = waitUntilOf(c);
    await next();
    const res = c.res;
    if (res.status !== 200 || res.body === null) {
      setHeaders(c, { [CACHE_STATUS_HEADER]: "MISS" });
      return;
    }
    const contentType = res.headers.get("content-type") ?? "application/json";
    // Kept only when it ended whole, as its origin wrote it.
    const keep = (settled: SettledRequest, bytes: Uint8Array): Promise<void> | null => {
      const { outcome, status, usage, model, origin } = settled;
      if (outcome !== "ok" || status !== 200 || usage === null || origin === null) return null;
      const storedAt = Date.now();
      const kept: CacheEntry = {
        body: bytes,
        contentType,
        usage,
        model: model ?? plan.model.id,
        storedAt,
        expiresAt: storedAt + ttlSeconds * 1_000,
      };
      const written = writeEntry(cache, c.req.url, key, kept).catch((error: unknown) => {
        logWarn("response cache write failed", { request_id: settlement.requestId, error });
      });
      waitUntil(written);
      return written;
    };
    const limit = state.settings.maxEntryBytes;
    const chunks: Uint8Array[] = [];
    let size = 0;
    // Each chunk goes on at once, unchanged; the copy is dropped once it outgrows the limit.
    const copy = new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, controller) {
        if (size <= limit) {
          size += chunk.byteLength;
          if (size <= limit) chunks.push(chunk);
          else chunks.length = 0;
        }
        controller.enqueue(chunk);
      },
      async flush() {
        if (size > limit) return;
        const bytes = concat(chunks, size);
        // Every byte is with the client; the answer's end waits (briefly) for its entry, so
        // that the client's next request finds it.
        const recorded = settlement.whenRecorded();
        const settled = await atMost(recorded, STORE_WAIT_MS);
        if (settled === undefined) {
          waitUntil(recorded.then((late) => keep(late, bytes)));
          return;
        }
        const written = keep(settled, bytes);
        if (written !== null) await atMost(written, STORE_WAIT_MS);
      },
    });
    c.res = new Response(res.body.pipeThrough(copy), res);
    c.res.headers.set(CACHE_STATUS_HEADER, "MISS");
  });
}

// A hit: settled now at the hit price with the tokens it saved; its bytes as stored.
function hit(c: Context<AppEnv>, state: CacheState, entry: CacheEntry, now: number): void {
  state.result = "hit";
  state.bytes = entry.body.byteLength;
  c.get("settlement").settle({
    model: entry.model === "" ? c.get("plan").model.id : entry.model,
    outcome: "ok",
    usage: entry.usage,
    region: null,
    origin: null,
    status: 200,
    originBegan: false,
    firstByteAt: now,
  });
  c.res = new Response(entry.body, {
    status: 200,
    headers: {
      "content-type": entry.contentType,
      [CACHE_STATUS_HEADER]: "HIT",
      age: String(Math.max(0, Math.floor((now - entry.storedAt) / 1_000))),
    },
  });
}

// What `promise` resolves to, or undefined once `ms` passed first.
async function atMost<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const elapsed = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), ms);
  });
  try {
    return await Promise.race([promise, elapsed]);
  } finally {
    clearTimeout(timer);
  }
}

function concat(chunks: Uint8Array[], size: number): Uint8Array {
  if (chunks.length === 1 && chunks[0] !== undefined) return chunks[0];
  const out = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.byteLength;
  }
  return out;
}

/**
 * Whose entries within the tenant a request reads: a browser token's end user as minted
 * (a token without `user` is its own, whatever its body says); an API key's `user`.
 */
export function cacheEndUser(credential: Credential, bodyUser: unknown): string | null {
  if (credential.kind === "browser") return credential.scope.user ?? credential.scope.subject;
  return endUserOf(credential, bodyUser);
}

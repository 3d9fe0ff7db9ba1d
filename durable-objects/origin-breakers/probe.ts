/**
 * The health probe of a half-open origin (docs/failover.md, "Breakers"): its `/health`, then,
 * where the region names a model for it, one real completion of one token through the batch
 * protocol, so that an origin failing part of its requests is seen failing, not only alive.
 * An answer of busy (429, or 503 with `retry-after`: an origin at its connection cap), to
 * either, passes: busy is not sick.
 * The reach check of a failing closed origin asks only whether anything is there at all.
 */
import { CredentialRing, credentialValues } from "../../contracts/credentials.ts";
import { onTimeTimeout } from "../../contracts/on-time.ts";
import { judgeHead } from "../../contracts/origin-health.ts";
import { BATCH_PROTOCOL_VERSION, type BatchRequest } from "../../contracts/protocol/schema.ts";
import { FrameType } from "../../contracts/protocol/framing.ts";
import { frameReader, postBatchWithCredentials } from "../../contracts/upstream.ts";
import type { ProbeTarget } from "./types.ts";

const ring = new CredentialRing();

/** Probes `target` within `timeoutMs` of this thread's on-time. */
export async function probeOrigin(
  target: ProbeTarget,
  env: object,
  timeoutMs: number,
): Promise<boolean> {
  const abort = new AbortController();
  const timer = onTimeTimeout(timeoutMs, () => abort.abort("probe timed out"));
  try {
    // `/health` is open (origin/PROTOCOL.md): no credential goes with it.
    const res = await fetch(`${target.url}/health`, { signal: abort.signal });
    await res.body?.cancel();
    if (!res.ok) return busy(res);
    if (target.probeModel === undefined) return true;
    return await completes(target, env, abort.signal);
  } catch {
    return false;
  } finally {
    timer.stop();
  }
}

/** Asks whether anything accepts a connection at `url` (see `listening.ts`). */
export type Listening = (url: string, signal: AbortSignal) => Promise<boolean>;

/**
 * Whether an origin that just failed is there at all (docs/failover.md, "Breakers"): false
 * only when its `/health` gets no answer because the connection failed (not for want of
 * time) and nothing accepts a TCP connection where it should be. Any answer, no answer
 * within `timeoutMs`, and a connection accepted and then closed (an origin far past its
 * connection cap) are true: a slow, busy or full origin is for the counts and the
 * slow-first-byte rule to judge, never this check.
 */
export async function reachable(
  target: ProbeTarget,
  timeoutMs: number,
  isListening: Listening,
): Promise<boolean> {
  const abort = new AbortController();
  const timer = onTimeTimeout(timeoutMs, () => abort.abort("reach check timed out"));
  try {
    const res = await fetch(`${target.url}/health`, { signal: abort.signal, redirect: "manual" });
    await res.body?.cancel().catch(() => {});
    return true;
  } catch {
    return abort.signal.aborted || (await isListening(target.url, abort.signal));
  } finally {
    timer.stop();
  }
}

async function completes(target: ProbeTarget, env: object, signal: AbortSignal) {
  const id = `probe-${crypto.randomUUID()}`;
  const body = JSON.stringify({
    model: target.probeModel,
    messages: [{ role: "user", content: "ping" }],
    max_tokens: 1,
  });
  const origin = {
    id: target.id,
    url: target.url,
    credentials: credentialValues(env, target.credentials),
    ring,
  };
  const batch: BatchRequest = {
    v: BATCH_PROTOCOL_VERSION,
    batch_id: id,
    items: [{ id, path: "/v1/chat/completions", body, headers: {} }],
  };
  const res = await postBatchWithCredentials(origin, batch, signal);
  if (res.status !== 200 || res.body === null) {
    await res.body?.cancel();
    return busy(res);
  }
  const frames = frameReader(res.body);
  let judged: ReturnType<typeof judgeHead> | null = null;
  let status = 0;
  for (;;) {
    const frame = await frames.next();
    if (typeof frame === "string") return false;
    if (frame.type === FrameType.HEAD) {
      status = frame.head.status;
      judged = judgeHead(status, frame.head.headers);
    } else if (frame.type === FrameType.END) {
      frames.cancel();
      // The engine answered; a 4xx is about the probe's own request, not the origin's health.
      return (
        frame.trailer.outcome === "ok" || judged === "busy" || (judged === "ok" && status >= 400)
      );
    }
  }
}

function busy(res: Response): boolean {
  return judgeHead(res.status, Object.fromEntries(res.headers)) === "busy";
}

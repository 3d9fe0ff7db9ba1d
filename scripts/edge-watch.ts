/**
 * Watches the local edge's `/health` and calls back when it stops answering: wrangler dev
 * restarts a runtime process that dies, but not always into one that answers again.
 * See docs/edge.md, "Running it locally".
 */

/** How the edge is watched. */
export interface EdgeWatchOptions {
  /** Between the end of one check and the start of the next. */
  intervalMs?: number;
  /** How long one check waits for any answer (a slow answer under load still counts). */
  timeoutMs?: number;
  /** Checks in a row without an answer before `onDown`. */
  misses?: number;
}

/**
 * Checks `url`/health until stopped; after `misses` checks in a row without an answer (of
 * any status) awaits `onDown`, then checks afresh. Returns a function that stops it.
 */
export function watchEdge(
  url: string,
  onDown: () => Promise<void>,
  options: EdgeWatchOptions = {},
): () => void {
  const { intervalMs = 5_000, timeoutMs = 10_000, misses = 3 } = options;
  let stopped = false;
  let missed = 0;
  let timer: NodeJS.Timeout | undefined;
  const check = async () => {
    try {
      const res = await fetch(new URL("/health", url), { signal: AbortSignal.timeout(timeoutMs) });
      await res.body?.cancel();
      missed = 0;
    } catch {
      missed++;
    }
    if (!stopped && missed >= misses) {
      missed = 0;
      await onDown().catch(() => undefined);
    }
    if (!stopped) {
      timer = setTimeout(() => void check(), intervalMs);
      timer.unref();
    }
  };
  timer = setTimeout(() => void check(), intervalMs);
  timer.unref();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

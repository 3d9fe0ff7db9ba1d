/**
 * Calls back once when the process that started this one is gone (its parent changes):
 * a process manager or npm stopped, and the shell between them passed no signal on.
 * See README.md, "Quick start".
 */

/** Checks every `intervalMs`; the timer keeps nothing alive. */
export function onParentExit(callback: () => void, intervalMs = 500): () => void {
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(timer);
    callback();
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}

/**
 * Whether anything accepts a TCP connection where an origin should be (docs/failover.md,
 * "Breakers"): the reach check's second question, asked only once its `GET /health` failed
 * without an answer. An origin far past its connection cap still accepts (and then closes);
 * only a dead or absent one refuses.
 */
import { connect } from "cloudflare:sockets";

/** False only when the connection to `url`'s host and port fails before `signal` aborts. */
export async function listening(url: string, signal: AbortSignal): Promise<boolean> {
  const { hostname, port, protocol } = new URL(url);
  const socket = connect({ hostname, port: Number(port) || (protocol === "https:" ? 443 : 80) });
  // A connection that fails rejects `closed` too; its answer is `opened`'s.
  socket.closed.catch(() => {});
  const aborted = new Promise<true>((resolve) => {
    if (signal.aborted) resolve(true);
    signal.addEventListener("abort", () => resolve(true), { once: true });
  });
  try {
    return await Promise.race([socket.opened.then(() => true), aborted]);
  } catch {
    return signal.aborted;
  } finally {
    socket.close().catch(() => {});
  }
}

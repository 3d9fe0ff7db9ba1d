/**
 * A client's response body that the `Batcher` writes for a caller (see `batcher.ts`). One
 * write is in flight at a time, and bytes that come meanwhile are joined behind it: at low
 * load each token leaves as it comes, and under load, when the runtime takes writes more
 * slowly, tokens leave in fewer, larger writes, so their fixed cost is paid less often.
 * Nothing is held back while no write is in flight, and the bytes and their order never
 * change.
 */
import { concatBytes } from "../origin/protocol.ts";

export class ClientBody {
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  #queued: Uint8Array[] = [];
  #writing = false;
  #closing = false;
  #done = false;

  constructor(writable: WritableStream<Uint8Array>) {
    this.#writer = writable.getWriter();
  }

  /** Rejects when the client went away (or the body was aborted); resolves once closed. */
  get closed(): Promise<void> {
    return this.#writer.closed;
  }

  /** Queues bytes to leave at the next {@link flush}; ignored once the body is ending. */
  push(bytes: Uint8Array): void {
    if (!this.#closing && !this.#done) this.#queued.push(bytes);
  }

  /** Writes what is queued, unless a write is in flight: its end writes the rest. */
  flush(): void {
    if (this.#writing || this.#done) return;
    if (this.#queued.length > 0) {
      const bytes = concatBytes(this.#queued);
      this.#queued = [];
      this.#writing = true;
      this.#writer.write(bytes).then(
        () => {
          this.#writing = false;
          this.flush();
        },
        () => {
          // The client went away; `closed` tells the owner once.
          this.#done = true;
          this.#queued = [];
        },
      );
      return;
    }
    if (this.#closing) {
      this.#done = true;
      this.#writer.close().catch(() => {});
    }
  }

  /** Ends the body cleanly once everything queued has been written. */
  close(): void {
    this.#closing = true;
    this.flush();
  }

  /** Drops what is queued and lets go of the body without a clean end. */
  abort(reason: string): void {
    if (this.#done) return;
    this.#done = true;
    this.#queued = [];
    this.#writer.abort(reason).catch(() => {});
  }
}

/**
 * A streamed client's body as the `Batcher` writes it (docs/batching.md, "Callers"): one
 * write in flight, bytes that come meanwhile joined behind it, so under load tokens leave
 * in fewer, larger writes; nothing waits while no write is in flight, and bytes and order
 * never change. Past `maxBacklogBytes` waiting behind a write the body is aborted (the
 * connection drops, never a clean end), and the owner, told by `closed`, cancels the item.
 */
import { concatBytes } from "../../../contracts/protocol/framing.ts";

/**
 * Bytes a client's body stream buffers; what may wait behind its write in flight before the
 * client counts as too slow is `batching.max_client_backlog_bytes`.
 */
export const BODY_BUFFER_BYTES = 64 * 1024;

/** A streamed client's body, written one write at a time. */
export class ClientBody {
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  readonly #closed: Promise<void>;
  #cut: (reason: unknown) => void = () => {};
  #queued: Uint8Array[] = [];
  #queuedBytes = 0;
  readonly #maxBacklogBytes: number;
  #writing = false;
  #closing = false;
  #done = false;

  constructor(writable: WritableStream<Uint8Array>, maxBacklogBytes = Number.POSITIVE_INFINITY) {
    this.#writer = writable.getWriter();
    this.#maxBacklogBytes = maxBacklogBytes;
    // An abort errors the writer only once its write in flight ends, which for a client
    // that stopped reading is never: the owner hears of an abort here at once.
    const cut = new Promise<never>((_, reject) => {
      this.#cut = reject;
    });
    this.#closed = Promise.race([this.#writer.closed, cut]);
    // Like a writer's own `closed`: a rejection nobody awaits is not an error.
    this.#closed.catch(() => {});
  }

  /** Rejects when the client went away (or the body was aborted); resolves once closed. */
  get closed(): Promise<void> {
    return this.#closed;
  }

  /** Queues bytes to leave at the next {@link flush}; ignored once the body is ending. */
  push(bytes: Uint8Array): void {
    if (this.#closing || this.#done) return;
    this.#queued.push(bytes);
    this.#queuedBytes += bytes.byteLength;
    if (this.#queuedBytes > this.#maxBacklogBytes) this.abort("the client reads too slowly");
  }

  /** Writes what is queued, unless a write is in flight: its end writes the rest. */
  flush(): void {
    if (this.#writing || this.#done) return;
    if (this.#queued.length > 0) {
      const bytes = concatBytes(this.#queued, this.#queuedBytes);
      this.#queued = [];
      this.#queuedBytes = 0;
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
          this.#queuedBytes = 0;
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
    this.#queuedBytes = 0;
    this.#cut(reason);
    this.#writer.abort(reason).catch(() => {});
  }
}

/**
 * A client's response body that the `Batcher` writes for a caller (see `index.ts`). One
 * write is in flight at a time, and bytes that come meanwhile are joined behind it: at low
 * load each token leaves as it comes, and under load, when the runtime takes writes more
 * slowly, tokens leave in fewer, larger writes, so their fixed cost is paid less often.
 * Nothing is held back while no write is in flight, and the bytes and their order never
 * change.
 *
 * A client that reads more slowly than its item is generated leaves its bytes here, in the
 * Batcher's memory, which every other stream of the Batcher shares. Past `maxBacklogBytes`
 * waiting behind a write the body is aborted: the client's connection drops (never a
 * clean end), and the owner, told by `closed`, cancels the item and bills what was
 * generated.
 */
import { concatBytes } from "../../contracts/protocol.ts";

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

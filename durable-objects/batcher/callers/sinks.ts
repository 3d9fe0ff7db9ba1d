/**
 * Where the `Batcher` sends a caller's HEAD, DATA and END (docs/batching.md, "Callers"):
 * the answers of `open` and `end` ({@link AnswerSink}, for a streamed item whose body has a
 * stream of its own), or one answer with all of them ({@link WholeSink}, for `answer`: a
 * JSON item, which its client gets whole anyway).
 */
import { concatBytes } from "../../../contracts/protocol/framing.ts";

/** What the Batcher tells a caller about its item, in order: HEAD, DATA…, END, close. */
export interface CallerSink {
  /** The item's HEAD (with the `origin` field naming the origin that serves it). */
  head(head: object): void;
  /** Body bytes, for a caller whose body has no stream of its own. */
  data(bytes: Uint8Array): void;
  /** The item's END: its trailer as JSON bytes. */
  end(trailer: Uint8Array): void;
  /** Hands over what came since the last flush (once per origin chunk). */
  flush(): void;
  /** Nothing more comes: after the END, or without one when the item was cut or cancelled. */
  close(): void;
  /** The item's first body bytes left for the caller, at `at` (epoch ms). */
  firstByte?(at: number): void;
}

/** How an item opened, as {@link AnswerSink.opened} tells it. */
export type SinkOpening =
  | { kind: "head"; head: object }
  /** It ended before any HEAD: the trailer says why. */
  | { kind: "ended"; trailer: Uint8Array }
  /** Closed with neither: its caller cancelled it. */
  | { kind: "closed" };

/**
 * A caller's HEAD and END as two promises, for an item whose body goes on a stream of its
 * own: `opened` settles at the HEAD (or at an END or close before one), and `ended` with the
 * END's trailer, or null when the item closed without one. Never rejects. DATA never comes
 * here; should any, it is dropped.
 */
export class AnswerSink implements CallerSink {
  readonly opened: Promise<SinkOpening>;
  readonly ended: Promise<Uint8Array | null>;
  /** When the item's first body bytes left (epoch ms), null before: kept past its caller. */
  firstByteAt: number | null = null;
  #open: (opening: SinkOpening) => void = () => {};
  #end: (trailer: Uint8Array | null) => void = () => {};
  #settled = false;

  constructor() {
    this.opened = new Promise((resolve) => {
      this.#open = resolve;
    });
    this.ended = new Promise((resolve) => {
      this.#end = resolve;
    });
  }

  head(head: object): void {
    this.#open({ kind: "head", head });
  }

  data(): void {}

  firstByte(at: number): void {
    this.firstByteAt ??= at;
  }

  end(trailer: Uint8Array): void {
    // A settled promise ignores later calls: after a HEAD, this only settles `ended`.
    this.#open({ kind: "ended", trailer });
    this.#end(trailer);
    this.#settled = true;
  }

  flush(): void {}

  /** Answers `ended` with `trailer` once it settles; a later `close` changes nothing. */
  endAfter(trailer: Promise<Uint8Array>): void {
    this.#settled = true;
    void trailer.then((bytes) => this.#end(bytes));
  }

  close(): void {
    if (this.#settled) return;
    this.#settled = true;
    this.#open({ kind: "closed" });
    this.#end(null);
  }
}

/** An item as {@link WholeSink} collected it, once it ended or closed. */
export interface WholeItem {
  /** The HEAD, or null when none came. */
  head: object | null;
  /** Ms from the sink's creation to the HEAD; null without one. */
  headMs: number | null;
  /** The body's bytes, in order. */
  body: Uint8Array;
  /** The END's trailer, or null when the item closed without one. */
  trailer: Uint8Array | null;
}

/**
 * A caller's HEAD, DATA and END collected whole, for an item its client only gets whole (a
 * JSON answer): `done` settles at the END, or when the item closes without one. Never
 * rejects.
 */
export class WholeSink implements CallerSink {
  readonly done: Promise<WholeItem>;
  #resolve: (item: WholeItem) => void = () => {};
  readonly #createdAt = Date.now();
  #head: object | null = null;
  #headMs: number | null = null;
  #chunks: Uint8Array[] = [];
  #settled = false;

  constructor() {
    this.done = new Promise((resolve) => {
      this.#resolve = resolve;
    });
  }

  head(head: object): void {
    this.#head = head;
    this.#headMs = Date.now() - this.#createdAt;
  }

  data(bytes: Uint8Array): void {
    // A copy: the payload may be a view into the origin's chunk.
    this.#chunks.push(bytes.slice());
  }

  end(trailer: Uint8Array): void {
    this.#settle(trailer.slice());
  }

  flush(): void {}

  close(): void {
    this.#settle(null);
  }

  // The first END or close wins; the close that follows an END joins nothing again.
  #settle(trailer: Uint8Array | null): void {
    if (this.#settled) return;
    this.#settled = true;
    this.#resolve({
      head: this.#head,
      headMs: this.#headMs,
      body: concatBytes(this.#chunks),
      trailer,
    });
  }
}

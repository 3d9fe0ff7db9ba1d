/**
 * A streamed item of a raw answer (origin/PROTOCOL.md, "Raw answers"; docs/edge.md,
 * "Delivery"): the runtime pipes its body to the client with no call into JavaScript per
 * read, as a pass-through would. A body that ends is whole (its origin breaks the
 * connection of an item it cut); its END is its origin's outcome record, which the request's
 * settlement reads. The body has no heartbeat: the origin is asked every `silenceMs`.
 */
import { errorEvent, originFailure } from "../../contracts/errors.ts";
import type { ItemHead } from "../../contracts/protocol/schema.ts";
import { concatBytes } from "../../contracts/protocol/framing.ts";
import { describe } from "../../contracts/upstream.ts";
import { type OnTimeTimer, onTimeClock } from "../../contracts/on-time.ts";
import type { ItemEnd, ItemStream, OpenItem } from "./item.ts";

/** How a raw item is stopped on its origin and kept an eye on. */
export interface RawItemControls {
  /** Closes its call: the origin cancels an item whose call closed and records what it made. */
  close(): void;
  /** Whether its origin answers within `ms` of this thread's on-time. */
  answers(ms: number): Promise<boolean>;
  /** An origin that answers no probe for this long is frozen: the stream is cut. */
  silenceMs: number;
}

/** Why the edge stopped a raw body's pipe. */
type Stop = "client" | "timeout" | "silent" | "cancelled";

/**
 * The {@link OpenItem} of a raw answer whose HEAD was read: `first` is the body's bytes that
 * came with the HEAD, `body` the rest of it.
 */
export function rawItem(
  head: ItemHead,
  first: Uint8Array,
  body: ReadableStream<Uint8Array>,
  controls: RawItemControls,
): OpenItem {
  let taken = false;
  const take = () => {
    if (taken) throw new Error("a raw item's body is read once");
    taken = true;
  };
  return {
    head,
    stream(onClientGone) {
      take();
      return new RawStream(head, first, body, controls, onClientGone).stream();
    },
    async whole() {
      take();
      let rest = new Uint8Array();
      let end: ItemEnd = { kind: "closed" };
      try {
        rest = new Uint8Array(await new Response(body).arrayBuffer());
      } catch (error) {
        end = { kind: "broken", detail: `read: ${describe(error)}` };
      }
      return { body: concatBytes([first, rest]), end };
    },
    cancel() {
      if (!taken) {
        taken = true;
        body.cancel().catch(() => {});
      }
      controls.close();
    },
  };
}

/** One raw body on its way to the client. */
class RawStream {
  readonly #head: ItemHead;
  readonly #first: Uint8Array;
  readonly #body: ReadableStream<Uint8Array>;
  readonly #controls: RawItemControls;
  readonly #onClientGone: () => void;
  readonly #stop = new AbortController();
  readonly #ended = Promise.withResolvers<ItemEnd>();
  // A runtime pipe: the runtime hands the origin's bytes to the client (see `item.ts`).
  readonly #pipe = new IdentityTransformStream();
  #firstByteAt: number | null = null;
  #firstRead: ReadableStreamDefaultReader<Uint8Array> | null = null;
  #watch: { timer: OnTimeTimer; stop(): void } | null = null;

  constructor(
    head: ItemHead,
    first: Uint8Array,
    body: ReadableStream<Uint8Array>,
    controls: RawItemControls,
    onClientGone: () => void,
  ) {
    this.#head = head;
    this.#first = first;
    this.#body = body;
    this.#controls = controls;
    this.#onClientGone = onClientGone;
  }

  stream(): ItemStream {
    this.#watchOrigin();
    void this.#run();
    return {
      body: this.#pipe.readable,
      ended: this.#ended.promise,
      clientGone: () => this.#halt("client"),
      timeOut: () => this.#halt("timeout"),
      firstByteAt: () => this.#firstByteAt,
    };
  }

  #halt(why: Stop): void {
    if (this.#stop.signal.aborted) return;
    this.#stop.abort(why);
    // A first read still waiting ends now; the pipe hears the signal.
    this.#firstRead?.cancel().catch(() => {});
  }

  /** Probes the origin each `silenceMs` of on-time; one that does not answer is frozen. */
  #watchOrigin(): void {
    const { silenceMs } = this.#controls;
    if (!Number.isFinite(silenceMs)) return;
    const clock = onTimeClock(silenceMs);
    const check = () => {
      void this.#controls.answers(silenceMs).then((answered) => {
        if (this.#stop.signal.aborted || this.#watch === null) return;
        if (!answered) this.#halt("silent");
        else this.#watch.timer = clock.timeout(silenceMs, check);
      });
    };
    this.#watch = { timer: clock.timeout(silenceMs, check), stop: () => clock.stop() };
  }

  async #run(): Promise<void> {
    const { writable } = this.#pipe;
    let how: ItemEnd;
    // The first bytes are written from here: their time is the stream's first byte.
    const firstOk = await this.#writeFirst();
    if (firstOk === "closed") {
      how = await this.#close();
    } else if (firstOk === "gone") {
      how = this.#clientLeft();
    } else if (firstOk === "failed") {
      how = await this.#fail("bad_answer", "read: the body broke before its first byte");
    } else {
      try {
        await this.#body.pipeTo(writable, {
          preventClose: true,
          preventAbort: true,
          preventCancel: true,
          signal: this.#stop.signal,
        });
        how = this.#stop.signal.aborted ? await this.#stopped() : await this.#close();
      } catch (error) {
        how = this.#stop.signal.aborted
          ? await this.#stopped()
          : await this.#fail("bad_answer", `read: ${describe(error)}`);
      }
    }
    this.#watch?.stop();
    this.#watch = null;
    this.#ended.resolve(how);
  }

  /** Writes the bytes that came with the HEAD, or the body's first read. */
  async #writeFirst(): Promise<"ok" | "closed" | "gone" | "failed"> {
    let bytes = this.#first;
    if (bytes.byteLength === 0) {
      const reader = this.#body.getReader();
      this.#firstRead = reader;
      try {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) return this.#stop.signal.aborted ? "ok" : "closed";
          if (value.byteLength > 0) {
            bytes = value;
            break;
          }
        }
      } catch {
        return this.#stop.signal.aborted ? "ok" : "failed";
      } finally {
        this.#firstRead = null;
        reader.releaseLock();
      }
    }
    if (this.#stop.signal.aborted) return "ok";
    const writer = this.#pipe.writable.getWriter();
    try {
      this.#firstByteAt = Date.now();
      await writer.write(bytes);
      return "ok";
    } catch {
      return "gone";
    } finally {
      writer.releaseLock();
    }
  }

  /** The body ended whole. */
  async #close(): Promise<ItemEnd> {
    await this.#pipe.writable.close().catch(() => {});
    return { kind: "closed" };
  }

  /** The pipe stopped for a reason of the edge's: close the call, end the body. */
  async #stopped(): Promise<ItemEnd> {
    const why = this.#stop.signal.reason as Stop;
    this.#body.cancel().catch(() => {});
    this.#controls.close();
    switch (why) {
      case "timeout":
        return this.#fail("timeout", "request timeout", false);
      case "silent":
        return this.#fail("bad_answer", "the origin went silent", false);
      default:
        await this.#pipe.writable.close().catch(() => {});
        return { kind: "broken", detail: "cancelled" };
    }
  }

  /**
   * The body broke (or was stopped): it ends with the OpenAI error event, unless the engine's
   * own answer was an error, which is whole as it is. A write that fails is a client gone.
   */
  async #fail(
    kind: "timeout" | "bad_answer",
    detail: string,
    closeCall = true,
  ): Promise<{ kind: "broken"; detail: string }> {
    if (closeCall) {
      this.#body.cancel().catch(() => {});
      this.#controls.close();
    }
    const writer = this.#pipe.writable.getWriter();
    try {
      if (this.#head.status < 400) await writer.write(errorEvent(originFailure(kind)));
      await writer.close();
    } catch {
      if (!this.#stop.signal.aborted) return this.#clientLeft();
    }
    return { kind: "broken", detail };
  }

  /** The client's read was cancelled: its item is stopped, and billed from its record. */
  #clientLeft(): { kind: "broken"; detail: string } {
    this.#halt("client");
    this.#body.cancel().catch(() => {});
    this.#controls.close();
    this.#onClientGone();
    return { kind: "broken", detail: "cancelled" };
  }
}

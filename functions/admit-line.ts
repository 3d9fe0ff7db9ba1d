/**
 * Admissions of one key that meet in an isolate leave together: while this isolate's call
 * to the key's account is under way, the key's next requests wait for it to end and then
 * go in one call (a group commit). A lone request goes at once, so this adds nothing at
 * low load; under load a key's requests share Durable Object calls instead of making one
 * each, and the account still decides each of them on its own, in order.
 *
 * The waiting follows the Workers rules for work across requests: each request waits in
 * its own context, with a timer of its own (a request waiting only on another's call
 * would look hung to the runtime), and a request whose leader never answers (its client
 * went away and its context ended) goes alone when that timer fires. Admitting is
 * idempotent by request id in the account, so a request that ends up sent twice is
 * admitted once.
 */

/** Longest a request waits for the call under way before it goes alone. */
export const ADMIT_WAIT_MS = 250;

/** Sends a group of admissions in one call; answers in the same order. */
export type SendAdmits<I, A> = (inputs: I[]) => Promise<A[]>;

type Outcome<A> = { kind: "answered"; answer: A } | { kind: "failed"; error: unknown };

interface Waiter<I, A> {
  input: I;
  /** Wakes the waiting request: with its answer, or to lead the next call. */
  wake?: (signal: Outcome<A> | { kind: "lead" }) => void;
}

interface Line<I, A> {
  /** When the call under way (or the one a woken request is about to make) began. */
  busySince: number | null;
  queue: Waiter<I, A>[];
}

/** Per-isolate lines of admissions, by key id. */
export class AdmitLines<I, A> {
  readonly #lines = new Map<string, Line<I, A>>();
  readonly #waitMs: number;

  constructor(options: { waitMs?: number } = {}) {
    this.#waitMs = options.waitMs ?? ADMIT_WAIT_MS;
  }

  /** Admits `input` for `key`, alone or with the key's other waiting requests. */
  async admit(key: string, input: I, send: SendAdmits<I, A>): Promise<A> {
    const line = this.#line(key);
    const now = Date.now();
    // A call older than the wait is taken as lost (its context ended): lead a new one.
    if (line.busySince === null || now - line.busySince > this.#waitMs) {
      line.busySince = now;
      return this.#lead(key, line, [{ input }], send);
    }
    const me: Waiter<I, A> = { input };
    line.queue.push(me);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const signal = await new Promise<Outcome<A> | { kind: "lead" } | { kind: "alone" }>(
      (resolve) => {
        me.wake = (woken) => {
          me.wake = undefined;
          resolve(woken);
        };
        timer = setTimeout(() => {
          // Out of the queue at once, so that no call counts on it any more.
          const at = line.queue.indexOf(me);
          if (at >= 0) line.queue.splice(at, 1);
          me.wake = undefined;
          resolve({ kind: "alone" });
        }, this.#waitMs);
      },
    );
    if (timer !== undefined) clearTimeout(timer);
    if (signal.kind === "answered") return signal.answer;
    if (signal.kind === "failed") throw signal.error;
    if (signal.kind === "lead") return this.#lead(key, line, [me, ...line.queue.splice(0)], send);
    const [answer] = await send([input]);
    if (answer === undefined) throw new Error("no admission answer");
    return answer;
  }

  /** Requests of a key waiting for a call (for tests and diagnostics). */
  waiting(key: string): number {
    return this.#lines.get(key)?.queue.length ?? 0;
  }

  // Sends the group (the leader first) and answers its members; then wakes the first
  // request that queued meanwhile to lead the next call.
  async #lead(key: string, line: Line<I, A>, group: Waiter<I, A>[], send: SendAdmits<I, A>) {
    let outcomes: Outcome<A>[];
    try {
      const answers = await send(group.map((waiter) => waiter.input));
      outcomes = group.map((_, i) => {
        const answer = answers[i];
        return answer === undefined
          ? { kind: "failed", error: new Error("no admission answer") }
          : { kind: "answered", answer };
      });
    } catch (error) {
      outcomes = group.map(() => ({ kind: "failed", error }));
    } finally {
      const next = line.queue.shift();
      if (next === undefined) {
        line.busySince = null;
        if (line.queue.length === 0) this.#lines.delete(key);
      } else {
        // Held for the woken request, so that newcomers queue behind it.
        line.busySince = Date.now();
        next.wake?.({ kind: "lead" });
      }
    }
    for (let i = 1; i < group.length; i++) group[i]?.wake?.(outcomes[i] as Outcome<A>);
    const mine = outcomes[0] as Outcome<A>;
    if (mine.kind === "failed") throw mine.error;
    return mine.answer;
  }

  #line(key: string): Line<I, A> {
    let line = this.#lines.get(key);
    if (line === undefined) {
      line = { busySince: null, queue: [] };
      this.#lines.set(key, line);
    }
    return line;
  }
}

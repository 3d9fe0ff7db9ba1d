/**
 * What keeps a Batcher at work (docs/batching.md, "Open calls"): the runtime's `waitUntil`
 * for work that runs behind an answer, and the backstop alarm, set only while calls are
 * open, items wait or orphans remain. The alarm is safe to run twice.
 */

/** How long the backstop alarm waits while work is pending. */
export const ALARM_BACKSTOP_MS = 30_000;

/** `waitUntil` and the backstop alarm of one Batcher. */
export class KeepAlive {
  readonly #ctx: DurableObjectState;
  #alarmArmed = false;

  constructor(ctx: DurableObjectState) {
    this.#ctx = ctx;
  }

  /** Keeps the object alive until `work` settles. */
  waitUntil(work: Promise<unknown>): void {
    this.#ctx.waitUntil(work);
  }

  /** Sets the backstop alarm, unless it is set. */
  armAlarm(): void {
    if (this.#alarmArmed) return;
    this.#alarmArmed = true;
    this.waitUntil(this.#ctx.storage.setAlarm(Date.now() + ALARM_BACKSTOP_MS));
  }

  /** Sets the alarm to run at once (an earlier incarnation left calls to cancel). */
  async alarmNow(): Promise<void> {
    this.#alarmArmed = true;
    await this.#ctx.storage.setAlarm(Date.now());
  }

  /** The alarm ran: the next {@link armAlarm} sets it again. */
  alarmRan(): void {
    this.#alarmArmed = false;
  }
}

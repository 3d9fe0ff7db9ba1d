/**
 * BatchRun: one Durable Object per Batch API batch (docs/batch-api.md). It holds the
 * batch's lines in SQLite, reserves its worst case with the key's account, sends its lines
 * to its region's Batchers in the batch lane a bounded number at a time, records each
 * line's answer once and bills it once, and writes the output and error files when every
 * line ended. Driven by its alarm; after a restart, lines that were running go again under
 * their own ids. RPC: `create`, `get`, `cancel`.
 */
import { DurableObject } from "cloudflare:workers";
import { fileKey } from "../../contracts/batch-files.ts";
import { costPicos } from "../../contracts/pricing.ts";
import type { BatchCharge, BatchHoldResult } from "../key-account/batch-holds.ts";
import {
  type BatchState,
  batchObject,
  cancellable,
  chargeDue,
  linesToStart,
  outputRecord,
  stepOf,
  stopped,
} from "./lifecycle.ts";
import { keptAnswers } from "./kept-answers.ts";
import { lineAttempt } from "./line-attempt.ts";
import { type LineBody, readBodies, unreadOutcome } from "./line-bodies.ts";
import { type LineOutcome, lineOutcome } from "./line-outcome.ts";
import { writeOutputFile } from "./output-files.ts";
import { BatchStore, type ChargedLine } from "./store.ts";
import {
  type BatchCreateInput,
  type BatchRunPlan,
  COMPLETION_WINDOW_MS,
  type LineToRun,
  type OpenAIBatch,
} from "./types.ts";

// While lines run, the alarm comes back at least this often: it resumes a batch whose
// incarnation ended and tops the lane up should a completion have been missed.
const BACKSTOP_MS = 2_000;

/** What `create` answers. */
export type BatchCreateResult =
  | { ok: true; batch: OpenAIBatch }
  | { ok: false; refusal: Extract<BatchHoldResult, { ok: false }>["refusal"] };

/** One Batch API batch: its lines, their answers and its files. */
export class BatchRun extends DurableObject<Env> {
  #store!: BatchStore;
  /** Lines this incarnation sent that have not ended. */
  readonly #running = new Set<number>();
  #resumed = false;
  /** Lines an origin answered before a restart: the origins their next attempt avoids. */
  #answeredOn = new Map<number, string[]>();
  /** No line is sent before this (ms): the lane or the origins asked to wait. */
  #pausedUntil = 0;
  #advancing = false;
  #again = false;
  /** When this incarnation last set the alarm for (null: not since it last rang). */
  #alarmAt: number | null = null;
  /** When the last charge was confirmed (ms). */
  #chargedAt = 0;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    void ctx.blockConcurrencyWhile(async () => {
      this.#store = new BatchStore(ctx.storage);
    });
  }

  /** Reserves the batch's worst case and stores it with its lines; idempotent per batch. */
  async create(input: BatchCreateInput): Promise<BatchCreateResult> {
    if (this.#store.state !== null) return { ok: true, batch: this.#view() };
    let reserve = 0n;
    for (const line of input.lines) reserve += line.reservePicos;
    const account = this.env.KEY_ACCOUNT.getByName(input.owner);
    const held = await account.holdBatch({
      batchId: input.id,
      model: input.run.model,
      picos: reserve,
    });
    if (!held.ok) return { ok: false, refusal: held.refusal };
    const state: BatchState = {
      id: input.id,
      endpoint: input.endpoint,
      inputFileId: input.inputFileId,
      metadata: input.metadata,
      status: "in_progress",
      createdAt: input.now,
      inProgressAt: input.now,
      expiresAt: input.now + COMPLETION_WINDOW_MS,
      finalizingAt: null,
      completedAt: null,
      failedAt: null,
      expiredAt: null,
      cancellingAt: null,
      cancelledAt: null,
      outputFileId: null,
      errorFileId: null,
    };
    this.#store.create(input, state);
    this.#resumed = true;
    await this.#alarmBy(Date.now());
    return { ok: true, batch: this.#view() };
  }

  /** The batch object; null when no batch has this id for key `owner`. */
  get(owner: string): OpenAIBatch | null {
    return this.#store.state === null || this.#store.owner !== owner ? null : this.#view();
  }

  /** Asks to cancel: lines not yet sent fail, running ones end; null when unknown. */
  async cancel(owner: string): Promise<{ ok: boolean; batch: OpenAIBatch } | null> {
    const state = this.#store.state;
    if (state === null || this.#store.owner !== owner) return null;
    if (!cancellable(state.status)) return { ok: false, batch: this.#view() };
    this.#store.update({ status: "cancelling", cancellingAt: Date.now() });
    await this.#alarmBy(Date.now());
    return { ok: true, batch: this.#view() };
  }

  override async alarm(): Promise<void> {
    this.#alarmAt = null;
    await this.#advance();
  }

  /** Has the alarm ring by `at`: set again only when it would ring later or has rung. */
  async #alarmBy(at: number): Promise<void> {
    if (this.#alarmAt !== null && this.#alarmAt > Date.now() && this.#alarmAt <= at) return;
    this.#alarmAt = at;
    await this.ctx.storage.setAlarm(at);
  }

  /** Takes the batch's next step; runs once at a time, again when asked meanwhile. */
  async #advance(): Promise<void> {
    if (this.#advancing) {
      this.#again = true;
      return;
    }
    this.#advancing = true;
    try {
      do {
        this.#again = false;
        await this.#step();
      } while (this.#again);
    } finally {
      this.#advancing = false;
    }
  }

  async #step(): Promise<void> {
    const state = this.#store.state;
    if (state === null) return;
    if (!this.#resumed) {
      // Lines an earlier incarnation sent never reported back: they go again, same ids,
      // each that an origin answered back to that origin, which keeps its answer.
      const requeued = this.#store.requeueRunning(this.#running);
      this.#resumed = true;
      if (requeued.length > 0) {
        const ids = new Map(requeued.map((idx) => [this.#lineId(idx), idx]));
        this.#answeredOn = await keptAnswers(this.#store.run, ids, this.env);
      }
    }
    await this.#charge();
    const now = Date.now();
    const step = stepOf(state, this.#store.counts(), now);
    switch (step.kind) {
      case "run":
        if (now >= this.#pausedUntil) this.#pump();
        await this.#alarmBy(
          Math.min(
            state.expiresAt,
            this.#pausedUntil > now ? this.#pausedUntil : now + BACKSTOP_MS,
          ),
        );
        return;
      case "drain": {
        for (const line of this.#store.pendingLines()) {
          const record = outputRecord(this.#lineId(line.idx), line.customId, {
            kind: "error",
            code: step.code,
            message: step.message,
          });
          this.#store.finish(line.idx, { ok: false, record, httpStatus: null, now }, null);
        }
        if (step.ending === "expired" && state.expiredAt === null) {
          this.#store.update({ expiredAt: now });
        }
        await this.#alarmBy(now + BACKSTOP_MS);
        return;
      }
      case "finalize":
        await this.#finalize(step.ending, now);
        return;
      case "done":
        return;
      default: {
        const unknown: never = step;
        throw new Error(`unknown step ${JSON.stringify(unknown)}`);
      }
    }
  }

  async #finalize(ending: "completed" | "expired" | "cancelled", now: number): Promise<void> {
    const state = this.#store.update({
      status: "finalizing",
      finalizingAt: this.#store.state?.finalizingAt ?? now,
    });
    await this.#charge(true);
    const outputFileId = await writeOutputFile(this.env.FILES, this.#store, state.id, true, now);
    const errorFileId = await writeOutputFile(this.env.FILES, this.#store, state.id, false, now);
    await this.#account().releaseBatch(state.id);
    const at = Date.now();
    this.#store.update({
      status: ending,
      outputFileId,
      errorFileId,
      ...(ending === "completed" && { completedAt: at }),
      ...(ending === "expired" && { expiredAt: state.expiredAt ?? at }),
      ...(ending === "cancelled" && { cancelledAt: at }),
    });
  }

  /** Sends the lines the lane has room for; each is marked running before it leaves. */
  #pump(): void {
    const { linesInFlight } = this.#store.run;
    const free = linesInFlight - this.#running.size;
    const count = linesToStart(linesInFlight, free, this.#store.counts().pending);
    const lines = this.#store.startLines(count, Date.now());
    for (const line of lines) this.#running.add(line.idx);
    if (lines.length > 0) this.ctx.waitUntil(this.#runLines(lines));
  }

  async #runLines(lines: LineToRun[]): Promise<void> {
    const state = this.#store.state as BatchState;
    const bodies = await readBodies(this.env.FILES, fileKey(state.inputFileId), lines);
    await Promise.all(lines.map((line) => this.#runLine(line, bodies.get(line.idx))));
  }

  async #runLine(line: LineToRun, body: LineBody | undefined): Promise<void> {
    let outcome: LineOutcome;
    try {
      outcome =
        body === undefined || body instanceof Error
          ? unreadOutcome(body, BACKSTOP_MS)
          : lineOutcome(await this.#send(line, body));
    } catch {
      // This object or its Batcher went away mid-call: the line goes again.
      outcome = { kind: "retry", afterMs: BACKSTOP_MS };
    }
    this.#running.delete(line.idx);
    // Once only: a line whose origin could not take it goes wherever there is room.
    this.#answeredOn.delete(line.idx);
    this.#record(line, outcome);
    await this.#advance();
  }

  #send(line: LineToRun, body: Record<string, unknown>) {
    const avoid = this.#answeredOn.get(line.idx) ?? [];
    const id = this.#lineId(line.idx);
    const state = this.#store.state as BatchState;
    const { batcher, attempt } = lineAttempt(this.#store.run, state, line, id, body, avoid);
    return this.env.BATCHER.getByName(batcher).answer(attempt);
  }

  #record(line: LineToRun, outcome: LineOutcome): void {
    const id = this.#lineId(line.idx);
    switch (outcome.kind) {
      case "answered": {
        const { price, priceSharePpm } = this.#store.run;
        const full = outcome.usage === null ? 0n : costPicos(outcome.usage, price);
        const bill = {
          costPicos: (full * BigInt(priceSharePpm)) / 1_000_000n,
          usage: outcome.usage,
        };
        const record = outputRecord(id, line.customId, {
          kind: "response",
          status: outcome.status,
          requestId: id,
          body: outcome.body,
        });
        const ok = outcome.status < 300;
        const end = { ok, record, httpStatus: outcome.status, now: Date.now() };
        this.#store.finish(line.idx, { ...end, origin: outcome.origin }, bill);
        return;
      }
      case "failed":
        this.#store.finish(
          line.idx,
          {
            ok: false,
            record: outputRecord(id, line.customId, {
              kind: "error",
              code: outcome.code,
              message: outcome.message,
            }),
            httpStatus: null,
            now: Date.now(),
          },
          null,
        );
        return;
      case "retry":
        this.#store.release(line.idx);
        this.#pausedUntil = Math.max(this.#pausedUntil, Date.now() + outcome.afterMs);
        return;
      default: {
        const unknown: never = outcome;
        throw new Error(`unknown outcome ${JSON.stringify(unknown)}`);
      }
    }
  }

  /**
   * Bills every ended line not billed yet, once: a charge is confirmed before the next. Sent
   * when due (`chargeDue`) or `now`; the batch's hold covers the lines meanwhile.
   */
  async #charge(now = false): Promise<void> {
    const state = this.#store.state;
    if (state === null) return;
    if (!now && !chargeDue(this.#store.uncharged(), Date.now() - this.#chargedAt)) return;
    for (;;) {
      const charge = this.#store.nextCharge();
      if (charge === null) return;
      const { stop } = await this.#account().chargeBatch(
        batchCharge(this.#store.run, state.id, charge),
      );
      this.#store.charged(charge.seq);
      this.#chargedAt = Date.now();
      // Revoked, expired or blocked meanwhile, or the model taken away: no line starts again.
      const change = stopped(this.#store.state ?? state, stop, this.#chargedAt);
      if (change !== null) this.#store.update(change);
    }
  }

  #account() {
    return this.env.KEY_ACCOUNT.getByName(this.#store.owner);
  }

  #lineId(idx: number): string {
    return `${this.#store.state?.id ?? "batch"}-${idx}`;
  }

  #view(): OpenAIBatch {
    return batchObject(this.#store.state as BatchState, this.#store.counts());
  }
}

/** The charge for the key's account of ended lines: each becomes a ledger row. */
function batchCharge(
  run: BatchRunPlan,
  batchId: string,
  charge: { seq: number; lines: ChargedLine[] },
): BatchCharge {
  const { model, setup } = run;
  const lines = charge.lines.map(({ idx, ...line }) => ({
    ...line,
    requestId: `${batchId}-${idx}`,
  }));
  return { batchId, seq: charge.seq, model, region: setup.region, lines };
}

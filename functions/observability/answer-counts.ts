/**
 * This isolate's count of every answer it gave (docs/metrics.md, "Every answer"): an
 * increment in a map per answer, pushed in bulk to one of the `AnswerTally` objects at
 * most every {@link PUSH_EVERY_MS} (and by a scrape, before it reads them), so no request
 * makes a Durable Object call for it.
 */
import { logWarn } from "../../contracts/log.ts";
import type { AnswerTally } from "../../durable-objects/answer-tally/index.ts";
import { statusClassOf } from "../../contracts/prometheus.ts";
import {
  ANSWER_TALLY_SHARDS,
  type AnswerBatch,
  type AnsweredError,
  TALLY_RECENT_ERRORS,
} from "../../durable-objects/answer-tally/types.ts";

/** Longest an isolate keeps its counts before pushing them. */
export const PUSH_EVERY_MS = 5_000;

/** Codes longer or stranger than an error code are counted as `other` (bounded labels). */
const CODE = /^[A-Za-z0-9_.-]{1,64}$/;

/** Where an answer was given: the OpenAI API, the admin API (and `/metrics`), or the rest. */
export function routeGroup(path: string): "v1" | "admin" | "other" {
  if (path === "/v1" || path.startsWith("/v1/")) return "v1";
  if (path === "/metrics" || path === "/admin" || path.startsWith("/admin/")) return "admin";
  return "other";
}

/** An error `code` as a label value: `none` when absent, `other` when unusable. */
export function codeLabel(code: unknown): string {
  // Nearly every answer: no code.
  if (code === null || code === undefined || code === "" || code === "none") return "none";
  const text = typeof code === "string" || typeof code === "number" ? String(code) : "";
  return CODE.test(text) ? text : "other";
}

/** One answer the isolate gave. */
export interface Answer {
  path: string;
  status: number;
  code: string;
}

/** The per-isolate counts; one lives in `EdgeState`. */
export class AnswerCounts {
  readonly #tally: DurableObjectNamespace<AnswerTally>;
  #counts = new Map<string, number>();
  #errors: AnsweredError[] = [];
  #lastPush = 0;
  #shard: number | null = null;

  constructor(tally: DurableObjectNamespace<AnswerTally>) {
    this.#tally = tally;
  }

  /** Counts one answer; an error answer is also kept for the dashboard's list. */
  count(answer: Answer, error?: Omit<AnsweredError, "status" | "code" | "path">): void {
    const code = codeLabel(answer.code);
    const slot = `${routeGroup(answer.path)}\u0000${statusClassOf(answer.status)}\u0000${code}`;
    this.#counts.set(slot, (this.#counts.get(slot) ?? 0) + 1);
    if (error !== undefined && answer.status >= 400) {
      this.#errors.push({ ...error, status: answer.status, code, path: answer.path.slice(0, 200) });
      if (this.#errors.length > TALLY_RECENT_ERRORS) this.#errors.shift();
    }
  }

  /** Whether counts wait and the last push is {@link PUSH_EVERY_MS} old. */
  due(now: number): boolean {
    return this.#counts.size > 0 && now - this.#lastPush >= PUSH_EVERY_MS;
  }

  /** Pushes what was counted since the last push; what a failed push held is kept for the next. */
  async push(now = Date.now()): Promise<void> {
    this.#lastPush = now;
    const batch = this.#take();
    if (batch.series.length === 0 && batch.errors.length === 0) return;
    try {
      await this.#stub(this.#shardOf()).add(batch);
    } catch (error) {
      this.#giveBack(batch);
      logWarn("answer counts not pushed", { error });
    }
  }

  /** Everything every tally object holds (this isolate's counts pushed first). */
  async gather(): Promise<AnswerBatch> {
    await this.push();
    const shards = await Promise.all(
      Array.from({ length: ANSWER_TALLY_SHARDS }, (_, i) => this.#stub(i).read()),
    );
    return {
      series: shards.flatMap((s) => s.series),
      errors: shards.flatMap((s) => s.errors).sort((a, b) => b.at - a.at),
    };
  }

  #take(): AnswerBatch {
    const series = [...this.#counts].map(([slot, count]) => {
      const [route = "", statusClass = "", code = ""] = slot.split("\u0000");
      return { route, statusClass, code, count };
    });
    const batch = { series, errors: this.#errors };
    this.#counts = new Map();
    this.#errors = [];
    return batch;
  }

  #giveBack(batch: AnswerBatch): void {
    for (const s of batch.series) {
      const slot = `${s.route}\u0000${s.statusClass}\u0000${s.code}`;
      this.#counts.set(slot, (this.#counts.get(slot) ?? 0) + s.count);
    }
    this.#errors = [...batch.errors, ...this.#errors].slice(-TALLY_RECENT_ERRORS);
  }

  // Chosen at the first push: random values are not allowed in a Worker's global scope,
  // where the isolate's state is built.
  #shardOf(): number {
    this.#shard ??= Math.floor(Math.random() * ANSWER_TALLY_SHARDS);
    return this.#shard;
  }

  #stub(shard: number) {
    return this.#tally.getByName(`shard-${shard}`);
  }
}

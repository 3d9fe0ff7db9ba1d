/**
 * A small scripted engine for origin tests: streams `max_tokens` SSE events (one per
 * tick), honours abort signals, counts running items, and fails on request through
 * the body's `x_fail` (a status) or `x_throw` fields.
 */
import type { Engine, EngineItem, EngineOutcome, EngineResponse } from "../../origin/engine.ts";

/** A fake engine plus what tests inspect. */
export interface FakeEngine extends Engine {
  /** Items currently holding a slot. */
  running(): number;
  /** Ids of items whose generation was stopped by their signal. */
  readonly aborted: string[];
  /** Ids of every submitted item, in order. */
  readonly submitted: string[];
  /** The body of every submitted item, in order, as the engine got it. */
  readonly bodies: string[];
  closed: boolean;
}

interface FakeBody {
  stream?: boolean;
  max_tokens?: number;
  x_fail?: number;
  x_throw?: boolean;
  x_tick_ms?: number;
}

const encoder = new TextEncoder();

/** Creates the fake engine; `tickMs` spaces out tokens so tests can act mid-stream. */
export function createFakeEngine(tickMs = 2): FakeEngine {
  let running = 0;
  const aborted: string[] = [];
  const submitted: string[] = [];
  const bodies: string[] = [];
  const engine: FakeEngine = {
    kind: "sim",
    aborted,
    submitted,
    bodies,
    closed: false,
    running: () => running,
    models: () => [{ id: "fake-model", max_model_len: 4096, owned_by: "warmgate" }],
    load: () => ({
      running,
      waiting: 0,
      kv_usage: running / 8,
      kv_free_blocks: 8 - running,
      kv_total_blocks: 8,
      block_size: 16,
      prefix_queries: 0,
      prefix_hits: 0,
      max_num_seqs: 8,
    }),
    metrics: () => `# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running ${running}`,
    health: () => Promise.resolve({ ok: true, engine: "sim" }),
    close: () => {
      engine.closed = true;
      return Promise.resolve();
    },
    submit(item: EngineItem): Promise<EngineResponse> {
      submitted.push(item.id);
      bodies.push(item.body);
      const request = JSON.parse(item.body) as FakeBody;
      if (request.x_throw === true) return Promise.reject(new Error("engine exploded"));
      if (request.x_fail !== undefined) {
        const text = JSON.stringify({
          error: { message: "scripted failure", type: "server_error", param: null, code: "fake" },
        });
        return Promise.resolve({
          status: request.x_fail,
          headers: { "content-type": "application/json" },
          body: (async function* () {
            yield encoder.encode(text);
          })(),
          outcome: Promise.resolve({
            outcome: "error",
            usage: null,
            error: { message: "scripted failure", type: "server_error", code: "fake" },
            queued_ms: 0,
            ttft_ms: 0,
          }),
        });
      }
      const tokens = request.max_tokens ?? 3;
      const tick = request.x_tick_ms ?? tickMs;
      const stream = request.stream === true;
      running++;
      let produced = 0;
      const { promise: outcome, resolve: settle } = Promise.withResolvers<EngineOutcome>();
      const usage = () => ({
        prompt_tokens: 5,
        completion_tokens: produced,
        total_tokens: 5 + produced,
        cached_tokens: 0,
      });
      const wait = () =>
        new Promise<boolean>((resolve) => {
          if (item.signal.aborted) return resolve(false);
          const timer = setTimeout(() => {
            item.signal.removeEventListener("abort", onAbort);
            resolve(true);
          }, tick);
          const onAbort = () => {
            clearTimeout(timer);
            resolve(false);
          };
          item.signal.addEventListener("abort", onAbort, { once: true });
        });
      async function* body(): AsyncGenerator<Uint8Array> {
        try {
          for (let i = 0; i < tokens; i++) {
            if (!(await wait())) {
              aborted.push(item.id);
              settle({ outcome: "cancelled", usage: usage(), queued_ms: 0, ttft_ms: 0 });
              return;
            }
            produced++;
            if (stream) yield encoder.encode(`data: {"id":"${item.id}","token":${i}}\n\n`);
          }
          if (stream) yield encoder.encode("data: [DONE]\n\n");
          else yield encoder.encode(JSON.stringify({ id: item.id, tokens: produced }));
          settle({ outcome: "ok", usage: usage(), queued_ms: 0, ttft_ms: 1 });
        } finally {
          running--;
          settle({ outcome: "cancelled", usage: usage(), queued_ms: 0, ttft_ms: 0 });
        }
      }
      return Promise.resolve({
        status: 200,
        headers: { "content-type": stream ? "text/event-stream" : "application/json" },
        body: body(),
        outcome,
      });
    },
  };
  return engine;
}

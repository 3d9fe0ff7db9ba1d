/**
 * One cell of `npm run bench:routing` (docs/benchmarks.md, "Routing"): a workload sent at
 * a request rate to simulated origins (the real origin server and simulated engine, at the
 * time scale given) by one placement policy, over the batch protocol as the Batcher sends
 * it, with the policy fed what the Batcher's router is fed: load reports, block events,
 * first tokens and usage.
 */
import { promptBlocks } from "../contracts/prefix-blocks.ts";
import {
  BATCH_PATH,
  type ItemTrailer,
  type KvEventCursor,
  type LoadReport,
} from "../contracts/protocol/schema.ts";
import { FrameType, readFrames } from "../contracts/protocol/framing.ts";
import { rendezvousOrder } from "../durable-objects/batcher/routing/placement.ts";
import { type RouteRequest, Router, coldKey } from "../durable-objects/batcher/routing/router.ts";
import { RoutingSchema, type RoutingSection } from "../contracts/config/routing.ts";
import { type SpawnedOrigin, simFlags, spawnOrigin } from "../scripts/stack.ts";
import { type LatencySummary, summarize } from "./lib.ts";
import {
  MODEL,
  type Message,
  type Sent,
  type Workload,
  chatBody,
  hitCeiling,
} from "./routing-workloads.ts";

export const POLICIES = ["round-robin", "least-loaded", "prefix-hash", "warmgate"] as const;
export type PolicyName = (typeof POLICIES)[number];

/** What one cell runs. */
export interface CellOptions {
  workload: Workload;
  policy: PolicyName;
  origins: number;
  /** Requests (or sessions) started per second of engine time. */
  rate: number;
  timeScale: number;
  /** Routers placing alternate requests, each with an index of its own (warmgate only). */
  edges?: 1 | 2;
  /** The router's `routing` settings (defaults where absent). */
  routing?: RoutingSection;
}

/** What one cell measured; times in engine ms. */
export interface CellResult {
  workload: string;
  policy: PolicyName;
  origins: number;
  rate: number;
  requests: number;
  failures: number;
  hitRate: number;
  ceiling: number;
  ttft: LatencySummary;
  /** Completion tokens per second of engine time, from the first request to the last answer. */
  throughput: number;
  /** Most requests one origin served over the mean. */
  imbalance: number;
  /** Most completion tokens one origin generated over the mean. */
  decodeImbalance: number;
  /**
   * Share of the streams in flight that the busiest origin carried, the mean over every
   * request's start: what killing it would cut.
   */
  busiestShare: number;
  /** The least that share could be (the streams split as evenly as they go), the same mean. */
  evenShare: number;
  /** Streams in flight, the mean over every request's start. */
  inFlight: number;
  /** Requests each origin served, in order. */
  perOrigin: number[];
  /** Share of placements the other router would have made the same (two edges only). */
  agreement: number | null;
  /** The (first) router's placements by reason and its predicted hit rate (warmgate only). */
  placements: Record<string, number> | null;
  predictedHitRate: number | null;
}

interface Tracked {
  inFlight: number;
  report: LoadReport | null;
  /** When the report came (ms). */
  reportAt: number;
}

/**
 * Runs one cell on fresh origins (cold caches), each in a process of its own as on a GPU
 * host, so that the engines' work does not slow the clients' timing, and stops them.
 */
export async function runCell(options: CellOptions): Promise<CellResult> {
  const flags = [
    ...simFlags({ timeScale: options.timeScale, seed: 1 }),
    "--load-interval-ms",
    "100",
  ];
  const origins = await Promise.all(
    Array.from({ length: options.origins }, (_, i) =>
      spawnOrigin([...flags, "--origin-id", `o${i}`, "--region", "sim"]),
    ),
  );
  try {
    return await drive(options, origins);
  } finally {
    await Promise.all(origins.map((origin) => origin.close()));
  }
}

async function drive(options: CellOptions, origins: SpawnedOrigin[]): Promise<CellResult> {
  const ids = origins.map((origin) => origin.originId);
  const urls = new Map(origins.map((origin) => [origin.originId, origin.url]));
  const tracked = new Map<string, Tracked>(
    ids.map((id) => [id, { inFlight: 0, report: null, reportAt: 0 }]),
  );
  const edges = options.policy === "warmgate" ? (options.edges ?? 1) : 1;
  const { settings } = RoutingSchema.parse(options.routing ?? {});
  const routers = Array.from({ length: edges }, () => new Router(ids, settings));
  const cursors = routers.map(() => new Map<string, KvEventCursor>());
  const carrying = routers.map(() => new Map<string, string>());
  let turn = 0;
  let agreed = 0;
  let compared = 0;

  const candidates = (router: Router | null) =>
    ids.map((id) => {
      const t = tracked.get(id) as Tracked;
      const speed = t.report?.prefill_tokens_per_s;
      return {
        id,
        load: t.inFlight,
        maxNumSeqs: t.report?.max_num_seqs ?? null,
        stepMs: t.report?.step_ms ?? 0,
        prefillTokensPerMs: speed === undefined ? null : speed / 1000,
        backlogTokens:
          router === null
            ? 0
            : router.backlogTokens(
                id,
                t.report?.prefill_backlog_tokens === undefined
                  ? null
                  : { tokens: t.report.prefill_backlog_tokens, at: t.reportAt },
              ),
        kvRoomTokens: null,
      };
    });

  const idAt = (i: number): string => ids[i % ids.length] ?? "";
  const routerAt = (edge: number): Router => {
    const router = routers[edge];
    if (router === undefined) throw new Error(`no router ${edge}`);
    return router;
  };
  const trackedAt = (id: string): Tracked => {
    const t = tracked.get(id);
    if (t === undefined) throw new Error(`unknown origin ${id}`);
    return t;
  };

  const choose = (request: RouteRequest, edge: number): string => {
    switch (options.policy) {
      case "round-robin":
        return idAt(turn++);
      case "least-loaded": {
        // Fewest in flight; ties take turns.
        const start = turn++;
        let best = idAt(start);
        for (let k = 0; k < ids.length; k++) {
          const id = idAt(start + k);
          if ((tracked.get(id)?.inFlight ?? 0) < (tracked.get(best)?.inFlight ?? 0)) best = id;
        }
        return best;
      }
      case "prefix-hash": {
        const order = rendezvousOrder(
          ids.map((id) => ({ id })),
          coldKey({ ...request, session: null }),
        );
        return idAt(order[0] ?? 0);
      }
      case "warmgate": {
        const router = routerAt(edge);
        const placed = router.place(request, candidates(router), Date.now()).origin;
        const other = routers[1 - edge];
        if (other !== undefined) {
          compared += 1;
          if (other.preview(request, candidates(other)).origin === placed) agreed += 1;
        }
        return placed;
      }
      default:
        throw new Error(`unknown policy ${String(options.policy)}`);
    }
  };

  const sent: Sent[] = [];
  const ttfts: number[] = [];
  const served = new Map<string, number>(ids.map((id) => [id, 0]));
  const generated = new Map<string, number>(ids.map((id) => [id, 0]));
  const busiest: { most: number; total: number }[] = [];
  let prompt = 0;
  let cached = 0;
  const answers: { tokens: number }[] = [];
  let failures = 0;
  let seq = 0;

  const send = async (body: string, session: string | null, edge: number): Promise<string> => {
    const id = `r${seq++}`;
    const blocks = promptBlocks(MODEL, JSON.parse(body) as { messages: Message[] });
    const request: RouteRequest = {
      id,
      blocks,
      promptTokens: blocks.length * 16,
      session,
      pinned: null,
    };
    const origin = choose(request, edge);
    const router = options.policy === "warmgate" ? routerAt(edge) : null;
    const t = trackedAt(origin);
    t.inFlight += 1;
    served.set(origin, (served.get(origin) ?? 0) + 1);
    const record: Sent = { body, answer: "" };
    sent.push(record);
    let total = 0;
    let most = 0;
    for (const other of tracked.values()) {
      total += other.inFlight;
      most = Math.max(most, other.inFlight);
    }
    busiest.push({ most, total });
    // As the Batcher does: one open call per origin and router brings the block events.
    const carriers = carrying[edge] ?? new Map<string, string>();
    const carries = router !== null && !carriers.has(origin);
    if (carries) carriers.set(origin, id);
    const cursor = carries ? (cursors[edge]?.get(origin) ?? { log: "", seq: 0 }) : null;
    const started = performance.now();
    let answer = "";
    let first = true;
    try {
      const response = await fetch(`${urls.get(origin)}${BATCH_PATH}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          v: 1,
          batch_id: id,
          items: [{ id, path: "/v1/chat/completions", body }],
          ...(cursor !== null && { kv_events_after: cursor }),
        }),
      });
      if (response.body === null) throw new Error("no body");
      let ended: ItemTrailer | null = null;
      for await (const frame of readFrames(response.body)) {
        if (frame.type === FrameType.LOAD) {
          const { report } = frame;
          t.report = report;
          t.reportAt = Date.now();
          if (router !== null) {
            router.report(origin, {
              kvTotalTokens: report.kv_total_blocks * report.block_size,
              prefixQueries: report.prefix_queries,
              at: report.t,
            });
            if (report.kv_events !== undefined) {
              router.events(origin, report.kv_events);
              cursors[edge]?.set(origin, { log: report.kv_events.log, seq: report.kv_events.seq });
            }
          }
        } else if (frame.type === FrameType.DATA) {
          if (first) {
            first = false;
            ttfts.push((performance.now() - started) / options.timeScale);
            router?.started(id);
          }
          answer += contentOf(new TextDecoder().decode(frame.payload));
        } else if (frame.type === FrameType.END) {
          ended = frame.trailer;
        }
      }
      router?.ended(id, ended?.usage ?? null);
      if (ended?.outcome !== "ok" || ended.usage === null) failures += 1;
      else {
        prompt += ended.usage.prompt_tokens;
        cached += ended.usage.cached_tokens;
        answers.push({ tokens: ended.usage.completion_tokens });
        generated.set(origin, (generated.get(origin) ?? 0) + ended.usage.completion_tokens);
      }
      record.answer = answer;
    } catch {
      failures += 1;
      router?.forget(id);
    } finally {
      t.inFlight -= 1;
      if (carriers.get(origin) === id) carriers.delete(origin);
    }
    return answer;
  };

  const wallRate = options.rate / options.timeScale;
  const began = performance.now();
  let at = began;
  let arrivals = 0;
  const runs: Promise<void>[] = [];
  for (const session of options.workload.sessions) {
    // Poisson arrivals, the same for every policy.
    at += (-Math.log(1 - fraction(arrivals++)) / wallRate) * 1000;
    const wait = at - performance.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    const edge = arrivals % edges;
    runs.push(
      (async () => {
        let history: Message[] = [];
        for (let k = 0; k < session.turns; k++) {
          const messages = session.turn(k, history);
          const reply = await send(chatBody(session, messages), session.user, edge);
          history = [...messages, { role: "assistant", content: reply }];
        }
      })(),
    );
  }
  await Promise.all(runs);
  const counts = [...served.values()];
  const mean = counts.reduce((a, b) => a + b, 0) / counts.length;
  const tokens = [...generated.values()];
  const meanTokens = tokens.reduce((a, b) => a + b, 0) / tokens.length;
  return {
    workload: options.workload.name,
    policy: options.policy,
    origins: options.origins,
    rate: options.rate,
    requests: sent.length,
    failures,
    hitRate: prompt === 0 ? 0 : cached / prompt,
    ceiling: hitCeiling(sent),
    ttft: summarize(ttfts),
    throughput:
      answers.reduce((n, a) => n + a.tokens, 0) /
      ((performance.now() - began) / 1000 / options.timeScale),
    imbalance: mean === 0 ? 0 : Math.max(...counts) / mean,
    decodeImbalance: meanTokens === 0 ? 0 : Math.max(...tokens) / meanTokens,
    busiestShare: meanOf(busiest.map((b) => b.most / b.total)),
    evenShare: meanOf(busiest.map((b) => Math.ceil(b.total / ids.length) / b.total)),
    inFlight: meanOf(busiest.map((b) => b.total)),
    perOrigin: counts,
    agreement: compared === 0 ? null : agreed / compared,
    placements: options.policy === "warmgate" ? (routers[0]?.view().placements ?? null) : null,
    predictedHitRate:
      options.policy === "warmgate" ? (routers[0]?.view().hit_rate.predicted ?? null) : null,
  };
}

function meanOf(values: readonly number[]): number {
  return values.length === 0 ? 0 : values.reduce((a, b) => a + b, 0) / values.length;
}

/** A fixed sequence in (0, 1): the same arrivals for every policy of a cell. */
function fraction(i: number): number {
  const x = Math.sin(i * 12.9898 + 78.233) * 43758.5453;
  return Math.min(0.999_999, Math.max(1e-6, x - Math.floor(x)));
}

/** The text of the content deltas in a chunk of SSE. */
function contentOf(sse: string): string {
  let out = "";
  for (const line of sse.split("\n")) {
    if (!line.startsWith("data: {")) continue;
    try {
      const chunk = JSON.parse(line.slice(6)) as { choices?: { delta?: { content?: string } }[] };
      out += chunk.choices?.[0]?.delta?.content ?? "";
    } catch {
      // A line split across chunks: the answer's text is only for the next turn's history.
    }
  }
  return out;
}

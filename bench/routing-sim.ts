/**
 * One cell of `npm run bench:routing` (docs/benchmarks.md, "Routing"): a workload sent at
 * a request rate to simulated origins (the real origin server and simulated engine, at the
 * time scale given) by one placement policy, over the batch protocol as the Batcher sends
 * it, with the policy fed what the Batcher's router is fed: load reports, block events,
 * first tokens and usage.
 */
import { setTimeout as sleep } from "node:timers/promises";
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
import { RoutingSchema } from "../contracts/config/routing.ts";
import { type SpawnedOrigin, simFlags, spawnOrigin } from "../scripts/stack.ts";
import { summarize } from "./lib.ts";
import type { CellOptions, CellResult, KillResult } from "./routing-cell.ts";
import {
  MODEL,
  type Message,
  type Sent,
  chatBody,
  fraction,
  hitCeiling,
} from "./routing-workloads.ts";

interface Tracked {
  inFlight: number;
  /** Streams past their first byte. */
  streaming: number;
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
    ids.map((id) => [id, { inFlight: 0, streaming: 0, report: null, reportAt: 0 }]),
  );
  const edges = options.policy === "warmgate" ? (options.edges ?? 1) : 1;
  const { settings } = RoutingSchema.parse(options.routing ?? {});
  const routers = Array.from({ length: edges }, () => new Router(ids, settings));
  const cursors = routers.map(() => new Map<string, KvEventCursor>());
  const carrying = routers.map(() => new Map<string, string>());
  let turn = 0;
  let agreed = 0;
  let compared = 0;

  // Origins killed: no longer candidates, as behind an open breaker.
  const dead = new Set<string>();
  const live = () => ids.filter((id) => !dead.has(id));
  const candidates = (router: Router | null) =>
    live().map((id) => {
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

  const idAt = (i: number): string => {
    const up = live();
    return up[i % up.length] ?? "";
  };
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
        for (let k = 0; k < live().length; k++) {
          const id = idAt(start + k);
          if ((tracked.get(id)?.inFlight ?? 0) < (tracked.get(best)?.inFlight ?? 0)) best = id;
        }
        return best;
      }
      case "prefix-hash": {
        const order = rendezvousOrder(
          live().map((id) => ({ id })),
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
  let kill: KillResult | undefined;

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
    let failOver = false;
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
            t.streaming += 1;
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
      router?.forget(id);
      // A killed origin's request with no byte yet goes to another origin, as at the edge.
      failOver = dead.has(origin) && first;
      if (kill !== undefined && dead.has(origin)) {
        if (failOver) kill.failedOver += 1;
        else kill.cut += 1;
      }
      if (!failOver) failures += 1;
    } finally {
      t.inFlight -= 1;
      if (!first) t.streaming -= 1;
      if (carriers.get(origin) === id) carriers.delete(origin);
    }
    if (failOver) {
      sent.splice(sent.indexOf(record), 1);
      return send(body, session, edge);
    }
    return answer;
  };

  const killFrom =
    options.killAt === undefined
      ? Number.POSITIVE_INFINITY
      : Math.floor(options.workload.sessions.length * options.killAt);
  const killBusiest = () => {
    const at = ids.map((id) => trackedAt(id));
    let most = 0;
    for (const [i, x] of at.entries()) if (x.streaming > (at[most]?.streaming ?? 0)) most = i;
    const victim = origins[most];
    if (victim === undefined) return;
    kill = {
      origin: victim.originId,
      streaming: at.map((x) => x.streaming),
      inFlight: at.map((x) => x.inFlight),
      cut: 0,
      failedOver: 0,
    };
    dead.add(victim.originId);
    victim.child.kill("SIGKILL");
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
    if (wait > 0) await sleep(wait);
    const edge = arrivals % edges;
    const streaming = [...tracked.values()].reduce((n, x) => n + x.streaming, 0);
    // A busy moment past the start: at least one stream per origin that a kill could cut.
    const late = arrivals >= options.workload.sessions.length - 1;
    if (kill === undefined && arrivals > killFrom && (streaming >= ids.length || late))
      killBusiest();
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
    ...(kill !== undefined && { kill }),
  };
}

function meanOf(values: readonly number[]): number {
  return values.length === 0 ? 0 : values.reduce((a, b) => a + b, 0) / values.length;
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

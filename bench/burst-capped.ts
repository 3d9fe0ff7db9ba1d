/**
 * The connection-cap phase of `npm run bench:burst` (docs/benchmarks.md, "Burst"): a stack
 * of its own whose origins serve few connections at once (`--max-connections`), the edge
 * sending straight to them (batching off, one connection per request), and bursts that
 * take each origin past its cap but within four times it. An origin at its cap is busy, not
 * sick: no breaker may open, and every request is served or refused at once.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { originCounter } from "./batch-api-checks.ts";
import { tally } from "./burst-client.ts";
import { stopOnSignal } from "./lib.ts";
import { type BurstContext, type BurstRun, burst, singles } from "./burst-phases.ts";
import { DEFAULT_REGIONS, DEV_KEY_LIMITS, createKey, startStack } from "../scripts/stack.ts";
import type { EdgeRuntime } from "../scripts/edge.ts";

/** What the phase ran with and what it saw. */
export interface CappedPhase {
  maxConnections: number;
  /** Origins of the stack: with `maxConnections`, how many streams they serve at once. */
  origins: number;
  baselineP50: number;
  runs: BurstRun[];
  /** Connections the origins turned away over the phase: answered busy, closed unanswered. */
  refused: { busy: number; closed: number };
}

/** Options of the phase, and what every phase shares. */
export interface CappedOptions {
  sizes: readonly number[];
  maxConnections: number;
  baseline: number;
  runtime: EdgeRuntime;
  timeScale: number;
  breakers: Record<string, unknown>;
  context: Omit<BurstContext, "stack" | "key">;
}

/** Runs the bursts of `sizes` at origins capped at `maxConnections`, each then singles. */
export async function cappedPhase(options: CappedOptions): Promise<CappedPhase> {
  const { context, maxConnections } = options;
  const state = await mkdtemp(join(tmpdir(), "warmgate-burst-capped-"));
  const stack = await startStack({
    regions: DEFAULT_REGIONS,
    sim: { timeScale: options.timeScale },
    originProcesses: true,
    runtime: options.runtime,
    persistTo: state,
    maxConnections,
    settings: { breakers: options.breakers, batching: { enabled: false } },
  });
  const stop = async () => {
    await stack.stop();
    await rm(state, { recursive: true, force: true });
  };
  const unregister = stopOnSignal(stop);
  try {
    const key = await createKey(stack.edgeUrl, stack.adminToken, {
      name: "burst-capped",
      limits: DEV_KEY_LIMITS,
      allow_region_override: true,
    });
    const ctx: BurstContext = { ...context, stack, key };
    ctx.log(`burst: origins capped at ${maxConnections} connections, batching off`);
    await singles(ctx, { count: 5 });
    const baselineP50 = tally(await singles(ctx, { count: options.baseline })).ttftP50;
    const runs: BurstRun[] = [];
    for (const size of options.sizes) runs.push(await burst(ctx, size, null, true));
    const origins = stack.origins.map((o) => ({
      id: o.origin.originId,
      url: o.origin.url,
      token: stack.originAccessToken,
    }));
    const refused = async (how: string) =>
      originCounter(origins, "warmgate_origin_connections_refused_total", `how="${how}"`);
    return {
      maxConnections,
      origins: stack.origins.length,
      baselineP50,
      runs,
      refused: { busy: await refused("busy"), closed: await refused("closed") },
    };
  } finally {
    await stop();
    unregister();
  }
}

/**
 * Charging a V8 CPU profile of the edge to the stages of a request (`npm run
 * bench:profile`, docs/benchmarks.md): each sample to the source module its function came
 * from, found by the `// path` markers esbuild writes before each module in the bundle;
 * a built-in (JSON, text codecs, regular expressions) to the module that called it.
 */

/** A V8 CPU profile, as `Profiler.stop` answers it. */
export interface CpuProfile {
  nodes: {
    id: number;
    callFrame: { functionName: string; scriptId: string; url: string; lineNumber: number };
    children?: number[];
  }[];
  samples: number[];
  timeDeltas: number[];
}

/** A sample is charged at most this many times the profile's median sample spacing. */
export const GAP_CAP_SPACINGS = 4;

/** Where each module starts in a bundle: sorted by line (0-based). */
export type ModuleRanges = { line: number; module: string }[];

const MARKER = /^\/\/ ((?:node_modules\/|functions\/|durable-objects\/|contracts\/)\S+)$/;

/** The module markers of a bundle's source. */
export function moduleRanges(source: string): ModuleRanges {
  const ranges: ModuleRanges = [];
  source.split("\n").forEach((text, line) => {
    const match = MARKER.exec(text);
    if (match?.[1]) ranges.push({ line, module: match[1] });
  });
  return ranges;
}

function moduleAt(ranges: ModuleRanges | undefined, line: number): string | null {
  if (ranges === undefined) return null;
  let found: string | null = null;
  for (const range of ranges) {
    if (range.line > line) break;
    found = range.module;
  }
  return found;
}

/** The stage of a request a module's code belongs to; first match wins. */
const STAGES: [RegExp, string][] = [
  [
    /^node_modules\/zod\/|request\/(openai|responses)-schemas|validation-errors/,
    "validation (zod)",
  ],
  [/request\/(json-body|bounds|json-text)|middleware\/completion-body/, "body: read, depth check"],
  [/request\/token-estimate/, "token estimate"],
  [/prefix-blocks|delivery\/prefix-route/, "prefix hashing"],
  [/middleware\/completion-plan|config\/models/, "plan (model, window)"],
  [
    /middleware\/auth|functions\/accounts\/|contracts\/(credentials|hashing)/,
    "key check, account client",
  ],
  [/^durable-objects\/key-account\//, "KeyAccount (in the Durable Object)"],
  [/^durable-objects\/batcher\//, "Batcher (in the Durable Object)"],
  [/^durable-objects\/batch-run\//, "BatchRun (in the Durable Object)"],
  [/^durable-objects\//, "other Durable Objects"],
  [/observability|prometheus/, "metrics"],
  [/contracts\/log/, "logging"],
  [
    /functions\/delivery\/|contracts\/(protocol|upstream|delivery|outcomes|origin-health|breaker)/,
    "delivery, framing",
  ],
  [/^node_modules\/hono\//, "hono"],
  [/^contracts\/config\//, "configuration"],
  [/^functions\//, "edge, other"],
  [/^contracts\//, "contracts, other"],
  [/^node_modules\//, "libraries, other"],
];

const RUNTIME = "runtime outside JS (I/O, RPC, HTTP)";

const BUILTIN_STAGES: Record<string, string | undefined> = {
  "(program)": RUNTIME,
  "(garbage collector)": "garbage collection",
  "(idle)": "(idle)",
  "(root)": "(idle)",
};

/** The runtime's `fetch` of an origin: the native call, whoever made it. */
const FETCH = "fetch() to the origin (native)";

function stageOf(module: string): string {
  return STAGES.find(([pattern]) => pattern.test(module))?.[1] ?? "edge, other";
}

/**
 * The profile's busy time (ms), by stage and by function (name, module), most first; each
 * sample charged at most {@link GAP_CAP_SPACINGS} median spacings, the rest of a gap to none.
 */
export function chargeProfile(profile: CpuProfile, ranges: Map<string, ModuleRanges>) {
  const parent = new Map<number, number>();
  for (const node of profile.nodes)
    for (const child of node.children ?? []) parent.set(child, node.id);
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  // A node's module, or its nearest caller's with one (built-ins have none).
  const moduleOf = (id: number): string | null => {
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const frame = byId.get(at)?.callFrame;
      if (frame === undefined) return null;
      const module = moduleAt(ranges.get(frame.scriptId), frame.lineNumber);
      if (module !== null) return module;
      if (frame.url !== "" && frame.scriptId !== "0") return frame.url;
    }
    return null;
  };
  // A sample lasts until the next one. A gap far longer than the usual spacing is the
  // thread parked (waiting for I/O) or outside the sampler's sight, not the function the
  // last sample caught: it is charged up to the cap, the rest to no stage (`gapMs`).
  const spacing = profile.timeDeltas.filter((d) => d > 0).sort((a, b) => a - b);
  const capUs = GAP_CAP_SPACINGS * (spacing[Math.floor(spacing.length / 2)] ?? 0);
  const self = new Map<number, number>();
  let gapMs = 0;
  profile.samples.forEach((id, i) => {
    const us = profile.timeDeltas[i + 1] ?? 0;
    const charged = capUs > 0 ? Math.min(us, capUs) : us;
    gapMs += (us - charged) / 1000;
    self.set(id, (self.get(id) ?? 0) + charged / 1000);
  });
  const stages = new Map<string, number>();
  const functions = new Map<string, [string, string, number]>();
  let busyMs = 0;
  for (const [id, ms] of self) {
    const frame = byId.get(id)?.callFrame;
    const name = frame?.functionName || "(anonymous)";
    const builtin =
      BUILTIN_STAGES[name] ?? (name === "fetch" && frame?.scriptId === "0" ? FETCH : undefined);
    const module = builtin === undefined ? moduleOf(id) : null;
    // Native code that no module of ours called: the runtime's own callbacks.
    const stage = builtin ?? (module === null ? RUNTIME : stageOf(module));
    if (stage === "(idle)") continue;
    busyMs += ms;
    stages.set(stage, (stages.get(stage) ?? 0) + ms);
    const key = `${name}|${module ?? ""}`;
    const entry = functions.get(key) ?? [name, module ?? "", 0];
    entry[2] += ms;
    functions.set(key, entry);
  }
  return {
    busyMs,
    gapMs,
    capMs: capUs / 1000,
    stages: [...stages].sort((a, b) => b[1] - a[1]),
    functions: [...functions.values()].sort((a, b) => b[2] - a[2]),
  };
}

/**
 * What holds a V8 heap: a heap snapshot (`HeapProfiler.takeHeapSnapshot`'s JSON) summed by
 * constructor, and two summaries set side by side, for `bench:soak` (docs/benchmarks.md,
 * "Memory over a long run").
 */

interface HeapSnapshot {
  snapshot: { meta: { node_fields: string[]; node_types: unknown[] } };
  nodes: number[];
  strings: string[];
}

/** Bytes and object counts per kind: a constructor's name, or `(string)`, `(code)`… */
export type HeapSummary = Map<string, { bytes: number; count: number }>;

/** Sums a snapshot's self sizes by constructor (objects, closures) or by V8 node type. */
export function summarizeHeap(snapshot: HeapSnapshot): HeapSummary {
  const fields = snapshot.snapshot.meta.node_fields;
  const types = snapshot.snapshot.meta.node_types[0] as string[];
  const width = fields.length;
  const typeAt = fields.indexOf("type");
  const nameAt = fields.indexOf("name");
  const sizeAt = fields.indexOf("self_size");
  const summary: HeapSummary = new Map();
  for (let i = 0; i < snapshot.nodes.length; i += width) {
    const type = types[snapshot.nodes[i + typeAt] ?? 0] ?? "?";
    const name = snapshot.strings[snapshot.nodes[i + nameAt] ?? 0] ?? "?";
    const kind = type === "object" || type === "closure" ? name : `(${type})`;
    const entry = summary.get(kind) ?? { bytes: 0, count: 0 };
    entry.bytes += snapshot.nodes[i + sizeAt] ?? 0;
    entry.count += 1;
    summary.set(kind, entry);
  }
  return summary;
}

/** The kinds that grew most from `before` to `after`, largest growth first. */
export function heapGrowth(
  before: HeapSummary,
  after: HeapSummary,
  top: number,
): { kind: string; before: number; after: number; count: number }[] {
  return [...new Set([...before.keys(), ...after.keys()])]
    .map((kind) => ({
      kind,
      before: before.get(kind)?.bytes ?? 0,
      after: after.get(kind)?.bytes ?? 0,
      count: (after.get(kind)?.count ?? 0) - (before.get(kind)?.count ?? 0),
    }))
    .sort((a, b) => b.after - b.before - (a.after - a.before))
    .slice(0, top);
}

/** Total self size of a summary, in bytes. */
export function heapBytes(summary: HeapSummary): number {
  let total = 0;
  for (const { bytes } of summary.values()) total += bytes;
  return total;
}

/**
 * What `npm run bench:batch-api` and the batch crash test check of a finished batch
 * (docs/benchmarks.md, "Batch API"; docs/batch-api.md): its output file (every line once,
 * in `custom_id` order), its ledger rows and the key's usage (every line billed once), and
 * what the origins remember (every line ended there, none run to the end twice).
 */
import { setTimeout as sleep } from "node:timers/promises";
import { OUTCOME_RETENTION_MS } from "../origin/outcome-log.ts";
import { type OriginAccess, readOriginItems } from "./chaos-lookup.ts";

/** A batch as `GET /v1/batches/{id}` answers it. */
export interface BatchView {
  id: string;
  status: string;
  output_file_id: string | null;
  error_file_id: string | null;
  request_counts: { total: number; completed: number; failed: number };
}

const ENDED = ["completed", "failed", "expired", "cancelled"];

function bearer(key: string): Record<string, string> {
  return { authorization: `Bearer ${key}` };
}

/** Uploads a JSONL batch file and creates its batch in `region`; answers the batch. */
export async function startBatch(
  edgeUrl: string,
  key: string,
  jsonl: string,
  region: string,
): Promise<BatchView> {
  const form = new FormData();
  form.set("purpose", "batch");
  form.set("file", new File([jsonl], "batch.jsonl", { type: "application/jsonl" }));
  const upload = await fetch(`${edgeUrl}/v1/files`, {
    method: "POST",
    headers: bearer(key),
    body: form,
  });
  const file = (await upload.json()) as { id?: string; error?: { message: string } };
  if (upload.status !== 200 || file.id === undefined) {
    throw new Error(`upload: ${upload.status} ${file.error?.message ?? ""}`);
  }
  const res = await fetch(`${edgeUrl}/v1/batches`, {
    method: "POST",
    headers: { ...bearer(key), "content-type": "application/json", "x-warmgate-region": region },
    body: JSON.stringify({
      input_file_id: file.id,
      endpoint: "/v1/chat/completions",
      completion_window: "24h",
    }),
  });
  if (res.status !== 200) throw new Error(`create batch: ${res.status} ${await res.text()}`);
  return (await res.json()) as BatchView;
}

/** The batch now; null while the edge does not answer (a restart). */
export async function batchNow(edgeUrl: string, key: string, id: string) {
  try {
    const res = await fetch(`${edgeUrl}/v1/batches/${id}`, { headers: bearer(key) });
    return res.status === 200 ? ((await res.json()) as BatchView) : null;
  } catch {
    return null;
  }
}

/** Waits until the batch ended, reading it every `everyMs`; `onView` sees each reading. */
export async function batchEnded(
  edgeUrl: string,
  key: string,
  id: string,
  onView: (view: BatchView) => Promise<void> | void = () => {},
  everyMs = 500,
): Promise<BatchView> {
  for (;;) {
    const view = await batchNow(edgeUrl, key, id);
    if (view !== null) {
      await onView(view);
      if (ENDED.includes(view.status)) return view;
    }
    await sleep(everyMs);
  }
}

/** Sum of one Prometheus counter's samples whose labels include `labels`. */
export function metricSum(text: string, name: string, labels = ""): number {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name) || !line.includes(labels)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== " " && rest[0] !== "{") continue;
    sum += Number(line.slice(line.lastIndexOf(" ") + 1)) || 0;
  }
  return sum;
}

/** A counter summed over the origins' `/metrics`. */
export async function originCounter(
  origins: readonly OriginAccess[],
  name: string,
  labels = "",
): Promise<number> {
  let sum = 0;
  for (const origin of origins) {
    const text = await (
      await fetch(`${origin.url}/metrics`, { headers: bearer(origin.token) })
    ).text();
    sum += metricSum(text, name, labels);
  }
  return sum;
}

/** Items that ended `ok` on the origins, from their own counters. */
export async function originOkItems(origins: readonly OriginAccess[]): Promise<number> {
  let ok = 0;
  for (const origin of origins) {
    const text = await (
      await fetch(`${origin.url}/metrics`, { headers: bearer(origin.token) })
    ).text();
    ok += metricSum(text, "warmgate_origin_item_outcomes_total", 'outcome="ok"');
  }
  return ok;
}

/**
 * What the origins' background lanes did, summed over the origins: lines run to the end
 * `ok` (the batch's lines alone: interactive items never count, nor an answer sent again
 * from its kept copy), lines answered from a kept answer, lines stopped for interactive
 * items, and the completion tokens those stopped runs had generated (generated again).
 */
export async function originBackground(origins: readonly OriginAccess[]) {
  const counter = (name: string) => originCounter(origins, `warmgate_origin_${name}_total`);
  return {
    okRuns: await counter("background_ok_runs"),
    replayed: await counter("items_replayed"),
    preemptions: await counter("background_preemptions"),
    rerunTokens: await counter("background_rerun_tokens"),
  };
}

/** What a finished batch's files, ledger and usage, and the origins, show. */
export interface BatchAudit {
  lines: number;
  status: string;
  /** Records in the output file, distinct custom ids among them, and whether sorted. */
  outputRecords: number;
  distinctCustomIds: number;
  orderedByCustomId: boolean;
  /** Lines that answered other than 200, and the error file's lines. */
  not200: number;
  errorRecords: number;
  /** Lines of the input with no record in the output file. */
  missing: number;
  /** Ledger rows tagged with the batch, distinct request ids, and their completion tokens. */
  ledgerRows: number;
  ledgerDistinct: number;
  ledgerCompletionTokens: number;
  /** Completion tokens the output file reports. */
  outputCompletionTokens: number;
  /** Requests the batch key's usage counts (the key runs nothing else). */
  usageRequests: number;
  /** Lines the origins do not remember ending `ok`, of those within their memory. */
  notEndedOnOrigins: number | null;
  /**
   * Lines not remembered that started more than the origins' memory (`OUTCOME_RETENTION_MS`)
   * before they were asked: forgotten, not checkable there (the output and ledger still are).
   */
  pastOriginMemory: number | null;
}

/** Reads every row of the spend log tagged with the batch, 500 at a time. */
async function ledgerRows(edgeUrl: string, adminToken: string, batchId: string) {
  // `created_at`: Unix seconds, as the admin API gives every time.
  const rows: { id: string; completion_tokens: number | null; created_at: number }[] = [];
  let cursor: string | null = null;
  do {
    const query = new URLSearchParams({ tag: `batch:${batchId}`, limit: "500" });
    if (cursor !== null) query.set("cursor", cursor);
    const res = await fetch(`${edgeUrl}/admin/requests?${query}`, { headers: bearer(adminToken) });
    if (res.status !== 200) throw new Error(`spend log: ${res.status} ${await res.text()}`);
    const page = (await res.json()) as { data: typeof rows; next_cursor: string | null };
    rows.push(...page.data);
    cursor = page.next_cursor;
  } while (cursor !== null);
  return rows;
}

/** Audits a finished batch of `customIds` run by `key` (a key that ran nothing else). */
export async function auditBatch(options: {
  edgeUrl: string;
  key: string;
  adminToken: string;
  batch: BatchView;
  customIds: readonly string[];
  origins: readonly OriginAccess[];
}): Promise<BatchAudit> {
  const { edgeUrl, key, batch } = options;
  const content = async (id: string | null) =>
    id === null
      ? []
      : (await (await fetch(`${edgeUrl}/v1/files/${id}/content`, { headers: bearer(key) })).text())
          .split("\n")
          .filter((line) => line !== "")
          .map(
            (line) =>
              JSON.parse(line) as {
                custom_id: string;
                response: { status_code: number; body: { usage?: { completion_tokens: number } } };
              },
          );
  const output = await content(batch.output_file_id);
  const errors = await content(batch.error_file_id);
  const ids = output.map((r) => r.custom_id);
  const seen = new Set(ids);
  const ledger = await ledgerRows(edgeUrl, options.adminToken, batch.id);
  const usage = (await (await fetch(`${edgeUrl}/v1/usage`, { headers: bearer(key) })).json()) as {
    total: { requests: number };
  };
  const lineIds = options.customIds.map((_, i) => `${batch.id}-${i}`);
  const remembered = await readOriginItems(options.origins, lineIds);
  const endedOk = (id: string) =>
    remembered?.get(id)?.some((item) => item.state === "ended" && item.outcome === "ok") === true;
  // An origin forgets an item `OUTCOME_RETENTION_MS` after it ended, which is after the line
  // started: only a line that started that long before the last answer came may be forgotten.
  const answeredAt = Date.now();
  const startedAt = new Map(ledger.map((row) => [row.id, row.created_at * 1_000]));
  const forgotten = (id: string) =>
    (startedAt.get(id) ?? answeredAt) < answeredAt - OUTCOME_RETENTION_MS;
  const notEnded = lineIds.filter((id) => !endedOk(id));
  return {
    lines: options.customIds.length,
    status: batch.status,
    outputRecords: output.length,
    distinctCustomIds: seen.size,
    orderedByCustomId: ids.every((id, i) => i === 0 || (ids[i - 1] ?? "") < id),
    not200: output.filter((r) => r.response.status_code !== 200).length,
    errorRecords: errors.length,
    missing: options.customIds.filter((id) => !seen.has(id)).length,
    ledgerRows: ledger.length,
    ledgerDistinct: new Set(ledger.map((row) => row.id)).size,
    ledgerCompletionTokens: ledger.reduce((sum, row) => sum + (row.completion_tokens ?? 0), 0),
    outputCompletionTokens: output.reduce(
      (sum, r) => sum + (r.response.body.usage?.completion_tokens ?? 0),
      0,
    ),
    usageRequests: usage.total.requests,
    notEndedOnOrigins: remembered === null ? null : notEnded.filter((id) => !forgotten(id)).length,
    pastOriginMemory: remembered === null ? null : notEnded.filter(forgotten).length,
  };
}

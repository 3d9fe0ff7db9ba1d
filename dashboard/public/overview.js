// The dashboard's overview (docs/metrics.md, "Dashboard"): polls GET /admin/stats and draws
// percentiles of each interval from the differences between two polls' histograms, over the
// time range chosen (the page keeps the last hour it has seen).
import { ApiFailure, api } from "./api.js";
import { $, actionButton, fill, percent, text, usd } from "./format.js";

const POLL_MS = 2000;
const KEEP_SECONDS = 3600;

let timer = null;
let previous = null;
const series = { t: [], lat: [[], [], []], ttft: [[], [], []], rps: [], eps: [] };
const charts = {};
let batchBounds = [];
// The key list's order: by `requests` or by `spend_usd`.
let keyOrder = "requests";
// The charts' time range in seconds, ending at the latest poll.
let rangeSeconds = 300;
let latest = Date.now() / 1000;
let openRequest = () => {};

function quantile(bounds, counts, q) {
  const total = counts.reduce((a, b) => a + b, 0);
  if (total === 0) return null;
  const rank = q * total;
  let seen = 0;
  for (let i = 0; i < counts.length; i++) {
    const n = counts[i];
    if (seen + n >= rank && n > 0) {
      const lower = i === 0 ? 0 : bounds[i - 1];
      return lower + (bounds[i] - lower) * ((rank - seen) / n);
    }
    seen += n;
  }
  return bounds[bounds.length - 1];
}

function deltas(now, before) {
  if (before === null) return now.counts.map(() => 0);
  return now.counts.map((n, i) => Math.max(0, n - (before.counts[i] ?? 0)));
}

function widthOf(id) {
  // Never wider than its card, so that a narrow screen does not scroll sideways.
  return Math.max(200, ($(id).clientWidth || 460) - 8);
}

function lineChart(id, labels) {
  const colors = ["#2b6cb0", "#c05621", "#9b2c2c"];
  const opts = {
    width: widthOf(id),
    height: 200,
    series: [
      {},
      ...labels.map((label, i) => ({ label, stroke: colors[i], width: 2, spanGaps: true })),
    ],
    axes: [{}, { size: 50 }],
    // The span drawn, in unix seconds, for whoever reads the page (its test among them).
    hooks: {
      setScale: [
        (u, key) => {
          if (key === "x")
            Object.assign($(id).dataset, { from: u.scales.x.min, to: u.scales.x.max });
        },
      ],
    },
    // The axis spans the chosen range whatever the points, so one point never stretches it.
    scales: { x: { time: true, range: () => [latest - rangeSeconds, latest] } },
  };
  return new uPlot(opts, [[], ...labels.map(() => [])], $(id));
}

function ensureCharts() {
  if (charts.latency) return;
  charts.latency = lineChart("chart-latency", ["p50", "p95", "p99"]);
  charts.ttft = lineChart("chart-ttft", ["p50", "p95", "p99"]);
  charts.rate = lineChart("chart-rate", ["requests/s", "errors/s"]);
  // One bar per batch-size bucket, evenly spaced and labelled by the bucket's bound.
  charts.batches = new uPlot(
    {
      width: widthOf("chart-batches"),
      height: 200,
      scales: { x: { time: false, range: (u, min, max) => [min - 0.5, max + 0.5] } },
      series: [
        { label: "bucket", value: (u, i) => (i === null ? "–" : `≤ ${batchBounds[i] ?? ""}`) },
        {
          label: "calls",
          stroke: "#2b6cb0",
          fill: "#2b6cb055",
          paths: uPlot.paths.bars({ size: [0.6] }),
        },
      ],
      axes: [
        {
          values: (u, ticks) =>
            ticks.map((i) => (Number.isInteger(i) ? `≤${batchBounds[i] ?? ""}` : "")),
        },
        { size: 50 },
      ],
    },
    [[], []],
    $("chart-batches"),
  );
}

// Drops points older than the longest range, then draws those within the chosen one.
function drawSeries() {
  const keepFrom = latest - KEEP_SECONDS;
  while (series.t.length > 0 && series.t[0] < keepFrom) {
    series.t.shift();
    series.rps.shift();
    series.eps.shift();
    for (const list of [...series.lat, ...series.ttft]) list.shift();
  }
  const from = series.t.findIndex((t) => t >= latest - rangeSeconds);
  const start = from === -1 ? series.t.length : from;
  const cut = (list) => list.slice(start);
  charts.latency.setData([cut(series.t), ...series.lat.map(cut)]);
  charts.ttft.setData([cut(series.t), ...series.ttft.map(cut)]);
  charts.rate.setData([cut(series.t), cut(series.rps), cut(series.eps)]);
}

function render(view) {
  ensureCharts();
  const t = view.at / 1000;
  latest = t;
  const seconds = previous === null ? null : (view.at - previous.at) / 1000;
  text($("total-requests"), String(view.totals.requests));
  text($("total-errors"), String(view.totals.errors));
  text($("total-spend"), usd(view.totals.spend_usd));
  text($("total-queued"), String(view.queued));
  const looked = view.cache.hits + view.cache.misses;
  const hitRate = looked === 0 ? "" : ` (${((100 * view.cache.hits) / looked).toFixed(0)}%)`;
  text($("cache-hits"), `${view.cache.hits}${hitRate}`);
  text($("cache-saved"), String(view.cache.tokens_saved));
  if (seconds !== null && seconds > 0) {
    const rps = (view.totals.requests - previous.totals.requests) / seconds;
    const eps = (view.totals.errors - previous.totals.errors) / seconds;
    text($("total-rps"), rps.toFixed(1));
    series.t.push(t);
    series.rps.push(rps);
    series.eps.push(eps);
    const lat = deltas(view.latency, previous.latency);
    const ttft = deltas(view.ttft, previous.ttft);
    [0.5, 0.95, 0.99].forEach((q, i) => {
      series.lat[i].push(quantile(view.latency.bounds, lat, q));
      series.ttft[i].push(quantile(view.ttft.bounds, ttft, q));
    });
  }
  drawSeries();
  batchBounds = view.batch_sizes.bounds;
  charts.batches.setData([batchBounds.map((_, i) => i), view.batch_sizes.counts]);

  fill(
    $("origins").tBodies[0],
    view.regions.flatMap((region) =>
      region.origins.map((o) => [
        [region.id],
        [o.id],
        [o.breaker.replace("_", "-"), o.breaker],
        [o.running ?? "–"],
        [o.waiting ?? "–"],
        [percent(o.kv_usage)],
        [percent(o.prefix_hit)],
      ]),
    ),
  );
  text(
    $("routing"),
    view.routing
      .map(
        (r) =>
          `${r.region}/${r.model}#${r.shard}: hit rate predicted ${percent(r.predicted)}, reported ${percent(r.reported)}`,
      )
      .join(" · "),
  );
  const keys = [...view.top_keys].sort((a, b) => b[keyOrder] - a[keyOrder]);
  fill(
    $("keys").tBodies[0],
    keys.map((k) => [
      [k.name || k.id],
      [k.tier],
      [String(k.requests)],
      [usd(k.spend_usd)],
      [String(k.cache_hits)],
    ]),
  );
  fill(
    $("errors").tBodies[0],
    view.recent_errors.map((e) => [
      [new Date(e.at).toLocaleTimeString()],
      [e.key],
      [e.model],
      [e.region],
      [String(e.status)],
      [e.code ?? e.outcome],
      actionButton("View", `request ${e.request_id}`, () => openRequest(e.request_id, e.key)),
    ]),
  );
  previous = view;
}

async function poll() {
  try {
    render(await api("GET", "/admin/stats"));
    text($("status"), `updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    if (error instanceof ApiFailure && error.status === 401) return;
    text($("status"), String(error.message ?? error));
  }
  timer = setTimeout(() => void poll(), POLL_MS);
}

/** Starts polling; `onOpenRequest(requestId, keyName)` shows one request. */
export function startOverview(onOpenRequest) {
  openRequest = onOpenRequest;
  void poll();
}

/** Stops polling and forgets what it drew. */
export function stopOverview() {
  clearTimeout(timer);
  previous = null;
}

function orderKeys(by) {
  keyOrder = by;
  $("by-requests").textContent = by === "requests" ? "requests ▾" : "requests";
  $("by-spend").textContent = by === "spend_usd" ? "spend (USD) ▾" : "spend (USD)";
  if (previous !== null) render(previous);
}
$("by-requests").addEventListener("click", () => orderKeys("requests"));
$("by-spend").addEventListener("click", () => orderKeys("spend_usd"));
$("range").addEventListener("change", () => {
  rangeSeconds = Number($("range").value);
  if (charts.latency) drawSeries();
});

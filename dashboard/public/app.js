// The warmgate dashboard (docs/metrics.md, "Dashboard"): polls GET /admin/stats with the
// admin token from this tab's session storage (never the URL), and draws percentiles of
// each interval from the differences between two polls' histograms.
"use strict";

const POLL_MS = 2000;
const KEEP_POINTS = 300;
const TOKEN_KEY = "warmgate-admin-token";

const $ = (id) => document.getElementById(id);
let timer = null;
let previous = null;
const series = { t: [], lat: [[], [], []], ttft: [[], [], []], rps: [], eps: [] };
const charts = {};
let batchBounds = [];
// The key list's order: by `requests` or by `spend_usd`.
let keyOrder = "requests";

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

function text(node, value) {
  node.textContent = value;
}

function cell(row, value, className) {
  const td = document.createElement("td");
  td.textContent = value;
  if (className) td.className = className;
  row.appendChild(td);
}

// USD with six decimal places, more where an amount needs them (billing is exact to the
// pico-dollar: docs/edge.md, "Pricing").
function usd(x) {
  return x.toFixed(12).replace(/0{1,6}$/, "");
}

function percent(x) {
  return x === null || x === undefined ? "–" : `${(x * 100).toFixed(1)}%`;
}

function fill(tbody, rows) {
  tbody.replaceChildren(
    ...rows.map((values) => {
      const tr = document.createElement("tr");
      for (const [value, className] of values) cell(tr, value, className);
      return tr;
    }),
  );
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
    // A lone point would stretch the time axis over years: show the last minute then.
    scales: {
      x: {
        time: true,
        range: (u, min, max) => (max - min < 10 ? [max - 60, max + 2] : [min, max]),
      },
    },
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

function push(list, value) {
  list.push(value);
  if (list.length > KEEP_POINTS) list.shift();
}

function render(view) {
  ensureCharts();
  const t = view.at / 1000;
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
    push(series.t, t);
    push(series.rps, rps);
    push(series.eps, eps);
    const lat = deltas(view.latency, previous.latency);
    const ttft = deltas(view.ttft, previous.ttft);
    [0.5, 0.95, 0.99].forEach((q, i) => {
      push(series.lat[i], quantile(view.latency.bounds, lat, q));
      push(series.ttft[i], quantile(view.ttft.bounds, ttft, q));
    });
    charts.latency.setData([series.t, ...series.lat]);
    charts.ttft.setData([series.t, ...series.ttft]);
    charts.rate.setData([series.t, series.rps, series.eps]);
  }
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
    ]),
  );
  previous = view;
}

async function poll() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token === null) return signedOut();
  try {
    const res = await fetch("/admin/stats", { headers: { authorization: `Bearer ${token}` } });
    if (res.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      return signedOut("That admin token was refused.");
    }
    if (!res.ok) throw new Error(`GET /admin/stats answered ${res.status}`);
    render(await res.json());
    text($("status"), `updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    text($("status"), String(error.message ?? error));
  }
  timer = setTimeout(() => void poll(), POLL_MS);
}

function signedIn() {
  $("sign-in").hidden = true;
  $("dashboard").hidden = false;
  $("sign-out").hidden = false;
  void poll();
}

function signedOut(message = "") {
  clearTimeout(timer);
  previous = null;
  $("sign-in").hidden = false;
  $("dashboard").hidden = true;
  $("sign-out").hidden = true;
  text($("sign-in-error"), message);
  text($("status"), "");
}

$("sign-in").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  $("token").value = "";
  if (token === "") return;
  sessionStorage.setItem(TOKEN_KEY, token);
  signedIn();
});

function orderKeys(by) {
  keyOrder = by;
  $("by-requests").textContent = by === "requests" ? "requests ▾" : "requests";
  $("by-spend").textContent = by === "spend_usd" ? "spend (USD) ▾" : "spend (USD)";
  if (previous !== null) render(previous);
}
$("by-requests").addEventListener("click", () => orderKeys("requests"));
$("by-spend").addEventListener("click", () => orderKeys("spend_usd"));

$("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  signedOut();
});

if (sessionStorage.getItem(TOKEN_KEY) === null) signedOut();
else signedIn();

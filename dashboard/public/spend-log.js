// The dashboard's spend log (docs/metrics.md, "Dashboard"): GET /admin/requests, newest
// first, filtered by key, how it ended, model, end user, tag and time range, a page at a
// time; the same page as CSV through a download fetched with the token in its header.
import { api, download, withQuery } from "./api.js";
import { $, actionButton, el, fill, text, usd, when } from "./format.js";
import { keyName, onKeys } from "./keys.js";
import { drawRequest } from "./requests.js";

const PAGE = 50;

let rows = [];
let cursor = null;

onKeys((keys) => {
  const select = $("log-key");
  const chosen = select.value;
  select.replaceChildren(
    el("option", "any key", { value: "" }),
    ...keys.map((k) => el("option", k.name, { value: k.id })),
  );
  select.value = keys.some((k) => k.id === chosen) ? chosen : "";
});

// A datetime-local value as unix seconds (the API takes them), or nothing.
function seconds(id) {
  const value = $(id).value;
  return value === "" ? undefined : Math.floor(new Date(value).getTime() / 1000);
}

function filters() {
  // "In flight" is a row's status; every other choice is how it ended, its outcome.
  const ended = $("log-status").value;
  return {
    key_id: $("log-key").value,
    status: ended === "open" ? ended : "",
    outcome: ended === "open" ? "" : ended,
    model: $("log-model").value.trim(),
    user: $("log-user").value.trim(),
    tag: $("log-tag").value.trim(),
    from: seconds("log-from"),
    to: seconds("log-to"),
  };
}

function view(row) {
  drawRequest(row);
  $("lookup-key").value = row.key_id;
  $("lookup-id").value = row.id;
  $("request-view").scrollIntoView();
}

function draw() {
  fill(
    $("log").tBodies[0],
    rows.map((r) => [
      [when(r.created_at)],
      [keyName(r.key_id)],
      [r.model],
      [r.status === "open" ? "in flight" : (r.outcome ?? r.status), `outcome-${r.outcome}`],
      [r.http_status == null ? "–" : String(r.http_status)],
      [r.user ?? "–"],
      [(r.tags ?? []).join(", ")],
      [r.total_tokens == null ? "–" : String(r.total_tokens)],
      [usd(r.cost_usd)],
      [r.latency_ms == null ? "–" : String(r.latency_ms)],
      [r.ttft_ms == null ? "–" : String(r.ttft_ms)],
      [r.origin ?? "–"],
      actionButton("View", `request ${r.id}`, () => view(r)),
    ]),
  );
}

async function loadPage(after) {
  text($("log-error"), "");
  try {
    const page = await api(
      "GET",
      withQuery("/admin/requests", { ...filters(), limit: PAGE, cursor: after }),
    );
    rows = after === null ? page.data : [...rows, ...page.data];
    cursor = page.next_cursor;
    $("log-more").hidden = cursor === null;
    draw();
  } catch (error) {
    text($("log-error"), error.message);
  }
}

/** Loads the spend log's first page with the filters as they are. */
export function loadSpendLog() {
  return loadPage(null);
}

$("log-filters").addEventListener("submit", (event) => {
  event.preventDefault();
  void loadPage(null);
});
$("log-more").addEventListener("click", () => void loadPage(cursor));
$("log-csv").addEventListener("click", () => {
  text($("log-error"), "");
  download(
    withQuery("/admin/requests", { ...filters(), limit: 500, format: "csv" }),
    "warmgate-requests.csv",
  ).catch((error) => text($("log-error"), error.message));
});

// The dashboard's view of one request (docs/metrics.md, "Dashboard"): its ledger record
// from GET /admin/keys/{id}/requests/{request_id}: tokens, cost, outcome and every origin
// tried. Never a prompt or an output: the ledger keeps neither.
import { api } from "./api.js";
import { $, el, fill, text, usd, when } from "./format.js";
import { onKeys } from "./keys.js";

onKeys((keys) => {
  const select = $("lookup-key");
  const chosen = select.value;
  select.replaceChildren(...keys.map((k) => el("option", `${k.name} (${k.id})`, { value: k.id })));
  if (keys.some((k) => k.id === chosen)) select.value = chosen;
});

function tokens(n) {
  return n === null ? "–" : String(n);
}

/** Shows a request's record (from the lookup, or a spend-log row). */
export function drawRequest(record) {
  const fields = [
    ["request id", record.id],
    ["model", record.model],
    ["status", record.status],
    ["outcome", record.outcome ?? "–"],
    ["HTTP status", record.http_status == null ? "–" : String(record.http_status)],
    ["latency (ms)", record.latency_ms == null ? "–" : String(record.latency_ms)],
    ["time to first token (ms)", record.ttft_ms == null ? "–" : String(record.ttft_ms)],
    ["tags", (record.tags ?? []).join(", ") || "–"],
    ["end user", record.user ?? "–"],
    ["started", when(record.created_at)],
    ["settled", when(record.settled_at)],
    ["prompt tokens", tokens(record.prompt_tokens)],
    ["cached tokens", tokens(record.cached_tokens)],
    ["completion tokens", tokens(record.completion_tokens)],
    ["cost (USD)", usd(record.cost_usd)],
    ["reserved (USD)", usd(record.reserved_usd)],
  ];
  $("request-fields").replaceChildren(
    ...fields.flatMap(([name, value]) => [el("dt", name), el("dd", value)]),
  );
  fill(
    $("request-attempts").tBodies[0],
    record.attempts.map((a, i) => [
      [String(i + 1)],
      [a.region ?? "–"],
      [a.origin ?? "none could be tried"],
      [a.result, `attempt-${a.result}`],
    ]),
  );
  $("request-view").hidden = false;
}

async function lookUp() {
  text($("request-error"), "");
  $("request-view").hidden = true;
  const keyId = $("lookup-key").value;
  const requestId = $("lookup-id").value.trim();
  if (keyId === "" || requestId === "") return;
  try {
    drawRequest(
      await api(
        "GET",
        `/admin/keys/${encodeURIComponent(keyId)}/requests/${encodeURIComponent(requestId)}`,
      ),
    );
  } catch (error) {
    text($("request-error"), error.message);
  }
}

/** Shows one request, its key picked by name where the list has exactly one so named. */
export function showRequest(requestId, keyName) {
  $("lookup-id").value = requestId;
  const options = [...$("lookup-key").options];
  const named = options.filter((o) => o.textContent.startsWith(`${keyName} (`));
  const byId = options.find((o) => o.value === keyName);
  if (named.length === 1) $("lookup-key").value = named[0].value;
  else if (byId) $("lookup-key").value = byId.value;
  return lookUp();
}

$("request-lookup").addEventListener("submit", (event) => {
  event.preventDefault();
  void lookUp();
});

// The dashboard's audit log (docs/metrics.md, "Dashboard"): GET /admin/audit, newest
// first: who changed what, on which object, when, and the change asked (never a secret).
import { api, withQuery } from "./api.js";
import { $, fill, text, when } from "./format.js";
import { keyName } from "./keys.js";

let entries = [];
let before = null;

function who(actor) {
  const name = actor.name ?? actor.credential;
  return actor.address ? `${name} (${actor.address})` : name;
}

function draw() {
  fill(
    $("audit").tBodies[0],
    entries.map((e) => [
      [when(e.created_at)],
      [who(e.actor)],
      [e.action],
      [e.target.type === "key" ? `key ${keyName(e.target.id)}` : `${e.target.type} ${e.target.id}`],
      [JSON.stringify(e.detail), "detail"],
    ]),
  );
}

async function loadPage(last) {
  text($("audit-error"), "");
  try {
    const page = await api(
      "GET",
      withQuery("/admin/audit", {
        action: $("audit-action").value,
        target_id: $("audit-target").value.trim(),
        before: last,
      }),
    );
    entries = last === null ? page.data : [...entries, ...page.data];
    before = page.last_id;
    $("audit-more").hidden = !page.has_more;
    draw();
  } catch (error) {
    text($("audit-error"), error.message);
  }
}

/** Loads the audit log's newest page with the filters as they are. */
export function loadAudit() {
  return loadPage(null);
}

$("audit-filters").addEventListener("submit", (event) => {
  event.preventDefault();
  void loadPage(null);
});
$("audit-more").addEventListener("click", () => void loadPage(before));

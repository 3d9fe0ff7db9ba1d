// The warmgate dashboard (docs/metrics.md, "Dashboard"): sign-in, the views (overview,
// keys, teams, requests, audit log) and moving between them. The admin token stays in this tab's
// session storage and travels only in the Authorization header (api.js), never in a URL.
import { hasToken, signIn, signOut, whenRefused } from "./api.js";
import { $, text } from "./format.js";
import { startOverview, stopOverview } from "./overview.js";
import { loadKeys } from "./keys.js";
import { loadTeams } from "./teams.js";
import { showRequest } from "./requests.js";
import { loadSpendLog } from "./spend-log.js";
import { loadAudit } from "./audit.js";

const VIEWS = ["overview", "keys", "teams", "requests", "audit"];

function show(view) {
  for (const name of VIEWS) {
    $(`view-${name}`).hidden = name !== view;
    const button = document.querySelector(`#views [data-view=${name}]`);
    if (name === view) button.setAttribute("aria-current", "page");
    else button.removeAttribute("aria-current");
  }
  // Keys first: the other views name keys from their list.
  // Teams before keys: the key list and form name teams.
  if (view === "keys") return loadTeams().then(loadKeys);
  if (view === "teams") return loadTeams();
  if (view === "requests") return loadKeys().then(loadSpendLog);
  if (view === "audit") return loadKeys().then(loadAudit);
  return Promise.resolve();
}

function signedIn() {
  $("sign-in").hidden = true;
  $("dashboard").hidden = false;
  $("sign-out").hidden = false;
  $("views").hidden = false;
  startOverview((requestId, keyName) => {
    void show("requests").then(() => showRequest(requestId, keyName));
  });
}

function signedOut(message = "") {
  stopOverview();
  for (const dialog of document.querySelectorAll("dialog[open]")) dialog.close();
  $("sign-in").hidden = false;
  $("dashboard").hidden = true;
  $("sign-out").hidden = true;
  $("views").hidden = true;
  void show("overview");
  text($("sign-in-error"), message);
  text($("status"), "");
}

whenRefused(signedOut);

$("sign-in").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  $("token").value = "";
  if (token === "") return;
  signIn(token, $("actor").value.trim());
  signedIn();
});

$("sign-out").addEventListener("click", () => {
  signOut();
  signedOut();
});

for (const button of document.querySelectorAll("#views [data-view]")) {
  button.addEventListener("click", () => void show(button.dataset.view));
}

if (hasToken()) signedIn();
else signedOut();

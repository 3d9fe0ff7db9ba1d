// The dashboard's dialogs (docs/metrics.md, "Dashboard"): a key's form (create and edit),
// the new secret shown once, and the confirmation of an action that cannot be undone.
import { api } from "./api.js";
import { $, budgetList, budgetText, text } from "./format.js";

/** Limits a new key gets in the form, as the admin API's own defaults (docs/api.md). */
const NEW_KEY = { rpm: 600, tpm: 1000000, concurrency: 64 };

let editing = null;
let saved = () => {};
let confirmed = async () => {};

// Unix seconds as a datetime-local value (the browser's local time, to the minute).
function localInput(seconds) {
  if (seconds === null || seconds === undefined) return "";
  const date = new Date(seconds * 1000);
  return new Date(date.getTime() - date.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
}

function number(id) {
  const value = $(id).value.trim();
  return value === "" ? null : Number(value);
}

/** The body of `POST /admin/keys` or `PATCH /admin/keys/{id}` from the form. */
function list(id) {
  return $(id)
    .value.split(",")
    .map((m) => m.trim())
    .filter((m) => m !== "");
}

function payload() {
  const models = list("kf-models");
  const expires = $("kf-expires").value;
  return {
    name: $("kf-name").value.trim(),
    tier: $("kf-tier").value,
    limits: {
      rpm: number("kf-rpm"),
      tpm: number("kf-tpm"),
      concurrency: number("kf-concurrency"),
      credit_usd: number("kf-credit"),
    },
    budgets: budgetList("kf-budgets"),
    tags: list("kf-tags"),
    team_id: $("kf-team").value === "" ? null : $("kf-team").value,
    models: models.length === 0 ? null : models,
    allowed_origins: $("kf-origins")
      .value.split(/\s+/)
      .filter((o) => o !== ""),
    expires_at: expires === "" ? null : new Date(expires).toISOString(),
  };
}

// The team choices: none, then each team by name.
function teamChoices(teams, chosen) {
  const none = new Option("none", "");
  const options = teams.map((team) => new Option(team.name, team.id));
  $("kf-team").replaceChildren(none, ...options);
  $("kf-team").value = chosen ?? "";
}

/**
 * Opens the key form: empty for a new key (`key` null), else filled with the key's
 * settings, with `teams` to choose from. `onSaved(key, secret)` gets the key as the API
 * answered (and a new key's secret).
 */
export function openKeyForm(key, onSaved, teams = []) {
  teamChoices(teams, key?.team_id);
  editing = key;
  saved = onSaved;
  text($("key-dialog-title"), key === null ? "New key" : `Edit ${key.name}`);
  const limits = key === null ? NEW_KEY : key.limits;
  $("kf-name").value = key?.name ?? "";
  $("kf-tier").value = key?.tier ?? "standard";
  $("kf-rpm").value = String(limits.rpm);
  $("kf-tpm").value = String(limits.tpm);
  $("kf-concurrency").value = String(limits.concurrency);
  $("kf-budgets").value = budgetText(key?.budgets);
  $("kf-credit").value = limits.credit_usd == null ? "" : String(limits.credit_usd);
  $("kf-tags").value = (key?.tags ?? []).join(", ");
  $("kf-models").value = (key?.models ?? []).join(", ");
  $("kf-origins").value = (key?.allowed_origins ?? []).join("\n");
  $("kf-expires").value = localInput(key?.expires_at);
  text($("key-form-error"), "");
  $("key-dialog").showModal();
}

async function saveKey() {
  text($("key-form-error"), "");
  try {
    const body = payload();
    const answer =
      editing === null
        ? await api("POST", "/admin/keys", body)
        : await api("PATCH", `/admin/keys/${encodeURIComponent(editing.id)}`, body);
    $("key-dialog").close();
    const { key: secret, ...record } = answer;
    saved(record, secret);
  } catch (error) {
    text($("key-form-error"), error.message);
  }
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  void saveKey();
});
$("key-form-cancel").addEventListener("click", () => $("key-dialog").close());

/** Shows a key's new secret, once; `Done` clears it from the page. */
export function showSecret(secret, note) {
  $("secret").value = secret;
  text($("secret-note"), note);
  $("secret-dialog").showModal();
  $("secret").select();
}

async function copySecret() {
  $("secret").select();
  try {
    await navigator.clipboard.writeText($("secret").value);
    text($("secret-copy"), "Copied");
  } catch {
    // Without clipboard access (plain HTTP) the selected text is there to copy by hand.
    text($("secret-copy"), "Selected: copy it");
  }
}

$("secret-copy").addEventListener("click", () => void copySecret());
function forgetSecret() {
  $("secret").value = "";
  text($("secret-copy"), "Copy");
}
// Closed by Escape as well as by Done.
$("secret-dialog").addEventListener("close", forgetSecret);
$("secret-done").addEventListener("click", () => {
  forgetSecret();
  $("secret-dialog").close();
});

/**
 * Asks before an action; `run(grace)` does it (grace: the rotation's grace seconds when
 * `withGrace`) and may answer what to do once the dialog has closed; a failure stays in it.
 */
export function confirmAction({ title, message, ok, withGrace = false, run }) {
  confirmed = run;
  text($("confirm-title"), title);
  text($("confirm-text"), message);
  text($("confirm-ok"), ok);
  text($("confirm-error"), "");
  $("confirm-grace").hidden = !withGrace;
  $("grace").value = "3600";
  $("confirm-dialog").showModal();
}

async function runConfirmed() {
  text($("confirm-error"), "");
  try {
    const then = await confirmed(Number($("grace").value));
    $("confirm-dialog").close();
    then?.();
  } catch (error) {
    text($("confirm-error"), error.message);
  }
}

$("confirm-form").addEventListener("submit", (event) => {
  event.preventDefault();
  void runConfirmed();
});
$("confirm-cancel").addEventListener("click", () => $("confirm-dialog").close());

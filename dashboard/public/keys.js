// The dashboard's key management (docs/metrics.md, "Dashboard"): the key list with limits
// and status from GET /admin/keys, and create, edit, rotate, block, unblock and revoke
// through the admin API (docs/api.md). A new secret is shown once and never kept.
import { api, withQuery } from "./api.js";
import { $, actionButton, budgets, el, fill, text, when } from "./format.js";
import { confirmAction, openKeyForm, showSecret } from "./dialogs.js";
import { loadedTeams, teamName } from "./teams.js";

const PAGE = 100;

let keys = [];
let lastId = null;
const listeners = [];

function keyPath(key, action = "") {
  return `/admin/keys/${encodeURIComponent(key.id)}${action}`;
}

function replace(record) {
  const at = keys.findIndex((k) => k.id === record.id);
  if (at === -1) keys.unshift(record);
  else keys[at] = record;
  draw();
}

function rotate(key) {
  confirmAction({
    title: `Rotate ${key.name}?`,
    message:
      "A new secret is made and shown once. The current one keeps working for the grace period, then stops.",
    ok: "Rotate",
    withGrace: true,
    run: async (grace) => {
      const { key: secret, ...record } = await api("POST", keyPath(key, "/rotate"), {
        grace_seconds: grace,
      });
      replace(record);
      return () =>
        showSecret(
          secret,
          `The previous secret works until ${when(record.previous_key_expires_at)}. This one is shown only this once.`,
        );
    },
  });
}

function revoke(key) {
  confirmAction({
    title: `Revoke ${key.name}?`,
    message:
      "Every request with this key is refused from the very next one. This cannot be undone (block it instead to stop it for a while).",
    ok: "Revoke",
    run: async () => replace(await api("DELETE", keyPath(key))),
  });
}

async function setBlocked(key, blocked) {
  text($("keys-error"), "");
  try {
    replace(await api("POST", keyPath(key, blocked ? "/block" : "/unblock")));
  } catch (error) {
    text($("keys-error"), error.message);
  }
}

function actions(key) {
  const revoked = key.status === "revoked";
  const name = `key ${key.name}`;
  return el(
    "div",
    [
      actionButton(
        "Edit",
        name,
        () => openKeyForm(key, (record) => replace(record), loadedTeams()),
        revoked,
      ),
      actionButton("Rotate", name, () => rotate(key), revoked),
      key.status === "blocked"
        ? actionButton("Unblock", name, () => void setBlocked(key, false))
        : actionButton("Block", name, () => void setBlocked(key, true), revoked),
      actionButton("Revoke", name, () => revoke(key), revoked),
    ],
    { class: "row-actions" },
  );
}

function draw() {
  const find = $("key-filter").value.trim().toLowerCase();
  const status = $("key-status").value;
  const shown = keys.filter(
    (k) =>
      (status === "" || k.status === status) &&
      (find === "" ||
        [k.name, k.id, ...(k.tags ?? [])].some((s) => s.toLowerCase().includes(find))),
  );
  fill(
    $("key-list").tBodies[0],
    shown.map((k) => [
      [k.name],
      el("code", k.id),
      [k.status, `status-${k.status}`],
      [k.tier],
      [k.team_id ? teamName(k.team_id) : "–"],
      [(k.tags ?? []).join(", ")],
      [String(k.limits.rpm)],
      [String(k.limits.tpm)],
      [String(k.limits.concurrency)],
      [budgets(k)],
      [when(k.previous_key_expires_at)],
      actions(k),
    ]),
  );
  for (const listener of listeners) listener(keys);
}

async function loadPage(after) {
  text($("keys-error"), "");
  try {
    const page = await api("GET", withQuery("/admin/keys", { limit: PAGE, after }));
    keys = after === null ? page.data : [...keys, ...page.data];
    lastId = page.last_id;
    $("more-keys").hidden = !page.has_more;
    draw();
  } catch (error) {
    text($("keys-error"), error.message);
  }
}

/** Loads the key list from its first page. */
export function loadKeys() {
  return loadPage(null);
}

/** The loaded keys' names by id. */
export function keyName(id) {
  return keys.find((k) => k.id === id)?.name ?? id;
}

/** Calls `listener(keys)` whenever the list changes (the request views pick from it). */
export function onKeys(listener) {
  listeners.push(listener);
}

$("new-key").addEventListener("click", () =>
  openKeyForm(
    null,
    (record, secret) => {
      replace(record);
      showSecret(secret, "It is shown only this once; warmgate keeps only its hash.");
    },
    loadedTeams(),
  ),
);
$("more-keys").addEventListener("click", () => void loadPage(lastId));
$("key-filter").addEventListener("input", draw);
$("key-status").addEventListener("change", draw);

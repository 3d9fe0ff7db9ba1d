// The dashboard's teams (docs/key-account.md, "Teams"): the team list with its limits and
// budgets from GET /admin/teams, and create, edit and delete through the admin API
// (docs/api.md). A team with keys cannot be deleted: the API's 409 is shown as it says.
import { api, withQuery } from "./api.js";
import { $, actionButton, budgetList, budgetText, budgets, el, fill, text } from "./format.js";
import { confirmAction } from "./dialogs.js";

const PAGE = 100;

let teams = [];
let editing = null;

function teamPath(team) {
  return `/admin/teams/${encodeURIComponent(team.id)}`;
}

function replace(record) {
  const at = teams.findIndex((t) => t.id === record.id);
  if (at === -1) teams.unshift(record);
  else teams[at] = record;
  draw();
}

function list(id) {
  return $(id)
    .value.split(",")
    .map((m) => m.trim())
    .filter((m) => m !== "");
}

function number(id) {
  const value = $(id).value.trim();
  return value === "" ? null : Number(value);
}

function openTeamForm(team) {
  editing = team;
  text($("team-dialog-title"), team === null ? "New team" : `Edit ${team.name}`);
  $("tf-name").value = team?.name ?? "";
  for (const field of ["rpm", "tpm", "concurrency"]) {
    $(`tf-${field}`).value = team === null ? "" : String(team.limits[field]);
  }
  $("tf-budgets").value = budgetText(team?.budgets);
  const credit = team?.limits.credit_usd;
  $("tf-credit").value = credit === null || credit === undefined ? "" : String(credit);
  $("tf-models").value = (team?.models ?? []).join(", ");
  $("tf-tags").value = (team?.tags ?? []).join(", ");
  text($("team-form-error"), "");
  $("team-dialog").showModal();
}

async function saveTeam() {
  text($("team-form-error"), "");
  const limits = Object.fromEntries(
    [
      ...["rpm", "tpm", "concurrency"].map((field) => [field, number(`tf-${field}`)]),
      ["credit_usd", number("tf-credit")],
    ].filter(([name, value]) => value !== null || name === "credit_usd"),
  );
  const models = list("tf-models");
  const body = {
    name: $("tf-name").value.trim(),
    limits,
    budgets: budgetList("tf-budgets"),
    models: models.length === 0 ? null : models,
    tags: list("tf-tags"),
  };
  try {
    const record =
      editing === null
        ? await api("POST", "/admin/teams", body)
        : await api("PATCH", teamPath(editing), body);
    $("team-dialog").close();
    replace(record);
  } catch (error) {
    text($("team-form-error"), error.message);
  }
}

function remove(team) {
  confirmAction({
    title: `Delete ${team.name}?`,
    message: "The team goes with its limits and budgets. A team that still has keys is kept.",
    ok: "Delete",
    run: async () => {
      await api("DELETE", teamPath(team));
      teams = teams.filter((t) => t.id !== team.id);
      draw();
    },
  });
}

function draw() {
  fill(
    $("team-list").tBodies[0],
    teams.map((t) => [
      [t.name],
      el("code", t.id),
      [(t.tags ?? []).join(", ")],
      [String(t.limits.rpm)],
      [String(t.limits.tpm)],
      [String(t.limits.concurrency)],
      [budgets(t)],
      [t.models === null ? "every model" : t.models.join(", ")],
      el(
        "div",
        [
          actionButton("Edit", `team ${t.name}`, () => openTeamForm(t)),
          actionButton("Delete", `team ${t.name}`, () => remove(t)),
        ],
        { class: "row-actions" },
      ),
    ]),
  );
}

/** Loads the team list (the first hundred teams). */
export async function loadTeams() {
  text($("teams-error"), "");
  try {
    teams = (await api("GET", withQuery("/admin/teams", { limit: PAGE }))).data;
    draw();
  } catch (error) {
    text($("teams-error"), error.message);
  }
}

/** The loaded teams. */
export function loadedTeams() {
  return teams;
}

/** A team's name by id (its id when not loaded). */
export function teamName(id) {
  return teams.find((t) => t.id === id)?.name ?? id;
}

$("new-team").addEventListener("click", () => openTeamForm(null));
$("team-form").addEventListener("submit", (event) => {
  event.preventDefault();
  void saveTeam();
});
$("team-form-cancel").addEventListener("click", () => $("team-dialog").close());

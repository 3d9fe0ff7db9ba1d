/**
 * Team ids and the edge's client of teams (docs/key-account.md, "Teams"): each team's
 * TeamAccount, named by its id, and the errors of the admin API about teams.
 */
import type { TeamAccount } from "../../durable-objects/team-account/index.ts";
import { ApiError, notFound } from "../../contracts/errors.ts";

/** A team id: `team_` and 16 base32 letters. */
export const TEAM_ID_PATTERN = /^team_[a-z2-7]{16}$/;

const BASE32 = "abcdefghijklmnopqrstuvwxyz234567";

/** A new random team id. */
export function newTeamId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return `team_${[...bytes].map((byte) => BASE32[byte % 32]).join("")}`;
}

/** The TeamAccount of a team. */
export function teamAccount(env: Env, teamId: string): DurableObjectStub<TeamAccount> {
  return env.TEAM_ACCOUNT.get(env.TEAM_ACCOUNT.idFromName(teamId));
}

/** The 404 of an unknown (or malformed) team id; `param` names where it came from. */
export function noSuchTeam(id: string, param = "id"): ApiError {
  const shown = TEAM_ID_PATTERN.test(id) ? id : "(malformed id)";
  return notFound(`No team with id ${shown}.`, "team_not_found", param);
}

/** The 409 of deleting a team that still has keys. */
export function teamNotEmpty(id: string, keys: readonly string[]): ApiError {
  const shown = keys.slice(0, 5).join(", ") + (keys.length > 5 ? ", …" : "");
  return new ApiError(
    409,
    `Team ${id} still has ${keys.length} key(s) (${shown}): move them to another team or revoke them first.`,
    { type: "invalid_request_error", code: "team_not_empty", param: "id" },
  );
}

/**
 * Keys for workers tests, made the way an operator makes them: through the edge's admin API.
 */
import { exports } from "cloudflare:workers";
import { expect } from "vitest";
import { TEST_ADMIN_TOKEN } from "./provided-context.ts";

/** The admin API's headers: its bearer token and a JSON body. */
export const ADMIN = {
  authorization: `Bearer ${TEST_ADMIN_TOKEN}`,
  "content-type": "application/json",
};

/**
 * Creates a key with `POST /admin/keys` (expecting 201) and returns its id and secret. The
 * tests pick regions with `x-warmgate-region`, so the key allows it unless `body` says not.
 */
export async function createKey(
  body: Record<string, unknown>,
): Promise<{ id: string; key: string }> {
  const res = await exports.default.fetch("http://edge.test/admin/keys", {
    method: "POST",
    headers: ADMIN,
    body: JSON.stringify({ allow_region_override: true, ...body }),
  });
  expect(res.status).toBe(201);
  return res.json();
}

/** Creates a team with `POST /admin/teams` (expecting 201) and returns its id. */
export async function createTeam(body: Record<string, unknown>): Promise<{ id: string }> {
  const res = await exports.default.fetch("http://edge.test/admin/teams", {
    method: "POST",
    headers: ADMIN,
    body: JSON.stringify(body),
  });
  expect(res.status).toBe(201);
  return res.json();
}

/**
 * Teams for the TeamAccount suites (docs/key-account.md, "Teams"): a fresh team with its
 * account, and member keys whose accounts lease from it.
 */
import { env } from "cloudflare:workers";
import type { Limits } from "../../durable-objects/key-account/types.ts";
import { type Budgets, NO_BUDGETS } from "../../durable-objects/key-account/budget-types.ts";
import { mintApiKey, newKeyId } from "../../functions/accounts/keys.ts";
import { newTeamId, teamAccount } from "../../functions/accounts/teams.ts";
import { LIMITS, PRICE } from "./key-accounts.workers.ts";

const BIG: Limits = { rpm: 1_000_000, tpm: 1_000_000_000, concurrency: 100_000 };

/** A new team with `limits` (else none that binds), `budgets`, `models` and webhook. */
export async function newTeam(
  limits: Partial<Limits>,
  budgets: Partial<Budgets> = {},
  models: string[] | null = null,
  alertWebhookUrl: string | null = null,
) {
  const id = newTeamId();
  const stub = teamAccount(env, id);
  await stub.create({
    id,
    name: "team",
    limits: { ...BIG, ...limits },
    budgets: { ...NO_BUDGETS, ...budgets },
    models,
    tags: [],
    metadata: {},
    alertWebhookUrl,
    now: Date.now(),
  });
  return { id, stub };
}

/** A new key of `teamId`; `admit` asks its account to admit a priced request. */
export async function teamKey(teamId: string, limits: Partial<Limits> = {}) {
  const id = newKeyId();
  const { secretHash } = await mintApiKey(env, id);
  const stub = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
  await stub.create({
    id,
    name: "member",
    secretHash,
    limits: { ...LIMITS, concurrency: 1_000, ...limits },
    allowedOrigins: [],
    models: null,
    tier: "standard",
    expiresAt: null,
    teamId,
    now: Date.now(),
  });
  const admit = (requestId: string, model = "m") =>
    stub.admit({
      requestId,
      credential: { kind: "key", secretHash },
      model,
      promptTokens: 10,
      maxTokens: 90,
      price: PRICE,
    });
  const check = () => stub.check({ credential: { kind: "key", secretHash } });
  return { id, stub, admit, check };
}

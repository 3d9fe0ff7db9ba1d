import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import type { KeyAccount } from "../../../durable-objects/key-account/index.ts";
import {
  admitRequest,
  authenticateBearer,
  queueSettlement,
} from "../../../functions/accounts/account-client.ts";
import { createKey } from "../../support/admin-keys.workers.ts";
import { EdgeState } from "../../../functions/edge-state.ts";

// This file's own isolate state (keys checked, settlements queued).
const edge = new EdgeState(env);

/** The isolate's settlements of a key not yet known durable. */
function held(keyId: string): { queued: number; unconfirmed: number } {
  return {
    queued: edge.settlements.queued(keyId),
    unconfirmed: edge.settlements.unconfirmed(keyId),
  };
}

function account(id: string): DurableObjectStub<KeyAccount> {
  return env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(id));
}

describe("settlements across an account crash", () => {
  // $0.15 / $0.075 / $0.60 per 1M input, cached input and output tokens.
  const price = {
    inputMicrosPerMtok: 150_000,
    cachedInputMicrosPerMtok: 75_000,
    outputMicrosPerMtok: 600_000,
  };
  // 1000 prompt tokens of which 400 cached, 500 completion tokens: 90 + 30 + 300 µ$.
  const usage = { prompt_tokens: 1_000, cached_tokens: 400, completion_tokens: 500 };
  const request = (requestId: string) => ({
    requestId,
    model: "m",
    promptTokens: 774,
    maxTokens: 1_000,
    price,
  });

  it("sends again a settlement a refused admit carried when the account crashed before committing it, and bills it once", async () => {
    const { id, key } = await createKey({ name: "crash", limits: { concurrency: 10 } });
    const auth = await authenticateBearer(env, `Bearer ${key}`, {
      now: Date.now(),
      apiKeys: edge.apiKeys,
      browserTokens: edge.browserTokens,
    });
    if (!auth.ok) throw new Error("the new key does not authenticate");
    const { ok: _ok, ...credential } = auth;

    // `a` is admitted and its admission committed.
    const a = await admitRequest(env, edge.settlements, credential, request("a"));
    if (!a.ok) throw new Error("`a` was refused");
    await runInDurableObject(account(id), (instance: KeyAccount) => instance.flush());

    // Its settlement rides on the admit of `b`, which is refused (too large for the key's
    // tokens per minute) and so written behind: held, not committed yet.
    const settled = queueSettlement(env, edge.settlements, id, {
      requestId: "a",
      outcome: "ok",
      usage,
      model: "m",
      admitted: { models: [{ model: "m", price }], reservedPicos: a.reservedPicos },
    });
    const b = await admitRequest(env, edge.settlements, credential, {
      ...request("b"),
      maxTokens: 100_000_000,
    });
    expect(b).toMatchObject({ ok: false, code: "rate_limit_exceeded" });
    expect(held(id)).toEqual({ queued: 0, unconfirmed: 1 });

    // The account crashes within its write window: the settlement of `a` is lost with it.
    await expect(
      runInDurableObject(account(id), (_instance: KeyAccount, state) => {
        state.abort("crash inside the write window");
      }),
    ).rejects.toThrow("crash inside the write window");
    expect(await account(id).record({ requestId: "a" })).toMatchObject({
      record: { state: "open", costPicos: 0n },
    });

    // The next calls from the edge meet another incarnation and send it again.
    expect((await admitRequest(env, edge.settlements, credential, request("c"))).ok).toBe(true);
    expect((await admitRequest(env, edge.settlements, credential, request("d"))).ok).toBe(true);
    await settled;
    expect(held(id)).toEqual({ queued: 0, unconfirmed: 0 });

    const restarted = account(id);
    expect(await restarted.record({ requestId: "a" })).toMatchObject({
      record: { state: "settled", promptTokens: 1_000, cachedTokens: 400, costPicos: 420_000_000n },
    });
    const day = new Date().toISOString().slice(0, 10);
    expect(await restarted.usage({ from: day, to: day })).toMatchObject({
      rows: [
        {
          model: "m",
          requests: 1,
          promptTokens: 1_000,
          cachedTokens: 400,
          costPicos: 420_000_000n,
        },
      ],
    });
    const spend = await runInDurableObject(restarted, (instance: KeyAccount, state) => {
      instance.flush();
      return state.storage.sql
        .exec<{ micros: number; picos: number }>(
          "SELECT settled_micros AS micros, settled_picos AS picos FROM spend WHERE period = 'all'",
        )
        .one();
    });
    expect(spend).toEqual({ micros: 420, picos: 0 });
  });
});

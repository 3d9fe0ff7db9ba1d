/**
 * Setup file of the workers project: makes sure the KeyAccount of the shared test key
 * exists (with limits no test reaches), so every test file can call the edge with
 * {@link TEST_API_KEY}. Creating it again is a no-op.
 */
import { env } from "cloudflare:workers";
import { beforeAll } from "vitest";
import { sha256Hex } from "../../contracts/hashing.ts";
import { TEST_API_KEY, TEST_KEY_ID } from "./provided-context.ts";

beforeAll(async () => {
  const account = env.KEY_ACCOUNT.get(env.KEY_ACCOUNT.idFromName(TEST_KEY_ID));
  await account.create({
    id: TEST_KEY_ID,
    name: "workers tests",
    secretHash: await sha256Hex(TEST_API_KEY),
    limits: { rpm: 1_000_000_000, tpm: 1_000_000_000_000, concurrency: 100_000 },
    allowedOrigins: [],
    models: null,
    tier: "standard",
    allowRegionOverride: true,
    expiresAt: null,
    now: Date.now(),
  });
});

/**
 * The local stack's development secrets (admin token, signing secret, alert signing
 * secret, the dev key), kept in its state folder across restarts so that printed keys keep
 * working; `ALERT_SIGNING_SECRET` in the environment chooses the alert signing secret.
 * See README.md, "Quick start", and docs/configuration.md.
 */
import { randomBytes } from "node:crypto";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";

/** Development secrets, kept across restarts when state persists so printed keys keep working. */
export interface DevSecrets {
  adminToken: string;
  signingSecret: string;
  /** Signs soft-budget alerts (the edge's `ALERT_SIGNING_SECRET`). */
  alertSigningSecret: string;
  apiKey?: string;
}

function devSecretsFile(dir: string): string {
  return join(dir, "warmgate-dev.json");
}

/**
 * The secrets saved in `dir` (fresh ones on a first run); a non-empty `ALERT_SIGNING_SECRET`
 * in `env` is the alert signing secret, else the saved or a fresh random one.
 */
export async function loadDevSecrets(
  dir: string | undefined,
  env: NodeJS.ProcessEnv = process.env,
): Promise<DevSecrets> {
  const given = env["ALERT_SIGNING_SECRET"] || undefined;
  const fresh: DevSecrets = {
    adminToken: `wgadmin_${randomBytes(18).toString("base64url")}`,
    signingSecret: randomBytes(32).toString("base64url"),
    alertSigningSecret: given ?? randomBytes(32).toString("base64url"),
  };
  if (!dir) return fresh;
  try {
    const saved = JSON.parse(await readFile(devSecretsFile(dir), "utf8")) as Partial<DevSecrets>;
    if (saved.adminToken && saved.signingSecret) {
      return {
        adminToken: saved.adminToken,
        signingSecret: saved.signingSecret,
        alertSigningSecret: given ?? saved.alertSigningSecret ?? fresh.alertSigningSecret,
        ...(saved.apiKey ? { apiKey: saved.apiKey } : {}),
      };
    }
  } catch {
    // First run: nothing saved yet.
  }
  return fresh;
}

export async function saveDevSecrets(dir: string | undefined, secrets: DevSecrets): Promise<void> {
  if (!dir) return;
  await mkdir(dir, { recursive: true });
  await writeFile(devSecretsFile(dir), JSON.stringify(secrets, null, 2) + "\n", { mode: 0o600 });
}

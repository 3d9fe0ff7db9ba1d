// The local stack's development secrets (scripts/dev-secrets.ts; docs/configuration.md, "Alerts"):
// the alert signing secret is made when none is given, kept across restarts, and taken
// from `ALERT_SIGNING_SECRET` when the environment has one.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { loadDevSecrets, saveDevSecrets } from "../../scripts/dev-secrets.ts";
import type { RunningStack } from "../../scripts/stack.ts";
import { exportLines, sourceCommand, startVars } from "../../scripts/start-env.ts";

const dirs: string[] = [];
afterEach(async () => {
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

async function stateDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "warmgate-secrets-"));
  dirs.push(dir);
  return dir;
}

describe("the alert signing secret of npm start", () => {
  it("is a fresh random secret when none is given", async () => {
    const one = await loadDevSecrets(undefined, {});
    const two = await loadDevSecrets(undefined, {});
    expect(one.alertSigningSecret.length).toBeGreaterThanOrEqual(32);
    expect(one.alertSigningSecret).not.toBe(two.alertSigningSecret);
  });

  it("is kept across restarts in the state folder", async () => {
    const dir = await stateDir();
    const first = await loadDevSecrets(dir, {});
    await saveDevSecrets(dir, first);
    expect((await loadDevSecrets(dir, {})).alertSigningSecret).toBe(first.alertSigningSecret);
  });

  it("is ALERT_SIGNING_SECRET when the environment has one, even over a saved one", async () => {
    const dir = await stateDir();
    expect(
      (await loadDevSecrets(undefined, { ALERT_SIGNING_SECRET: "mine" })).alertSigningSecret,
    ).toBe("mine");
    await saveDevSecrets(dir, await loadDevSecrets(dir, {}));
    expect((await loadDevSecrets(dir, { ALERT_SIGNING_SECRET: "mine" })).alertSigningSecret).toBe(
      "mine",
    );
  });

  it("is written to the env file as WARMGATE_ALERT_SIGNING_SECRET", () => {
    const stack = {
      edgeUrl: "http://127.0.0.1:8787",
      origins: [],
      apiKey: "wg_dev",
      adminToken: "wgadmin_x",
      alertSigningSecret: "alert-secret",
      originAdminToken: "oa",
      originAccessToken: "ot",
    } as unknown as RunningStack;
    expect(exportLines(startVars(stack))).toContain(
      "export WARMGATE_ALERT_SIGNING_SECRET='alert-secret'",
    );
  });
});

describe("the hint npm start prints", () => {
  it("sources the env file by its absolute path", () => {
    const outside = join(process.cwd(), "..", "x", "warmgate.env");
    expect(sourceCommand(outside)).toBe(`source ${outside}`);
    expect(sourceCommand("../x/warmgate.env")).toBe(
      `source ${join(process.cwd(), "../x/warmgate.env")}`,
    );
  });
});

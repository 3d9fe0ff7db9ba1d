import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { stripVTControlCharacters } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { ROOT, freePort } from "../../scripts/edge.ts";
import { until } from "../support/npm-start.ts";

// `npx wrangler dev` alone in a fresh checkout, with no .dev.vars: the committed .env is
// what it reads (named here, so a developer's own .dev.vars does not change the test).
let child: ChildProcess | undefined;
let state = "";
afterAll(async () => {
  if (child?.exitCode === null) process.kill(-(child.pid ?? 0), "SIGKILL");
  await rm(state, { recursive: true, force: true });
});

describe("wrangler dev alone", () => {
  it("starts quietly: only the missing secrets, no network noise, no misleading warnings", async () => {
    state = await mkdtemp(join(tmpdir(), "warmgate-wdev-"));
    const port = await freePort();
    child = spawn(
      "npx",
      ["wrangler", "dev", "--port", String(port), "--env-file", ".env", "--persist-to", state],
      { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], detached: true },
    );
    let out = "";
    child.stdout?.on("data", (c: Buffer) => (out += c.toString()));
    child.stderr?.on("data", (c: Buffer) => (out += c.toString()));
    await until("wrangler dev to be ready", () => out.includes("Ready on"));
    const res = await fetch(`http://127.0.0.1:${port}/v1/models`);
    expect(res.status).toBe(401);
    expect(await res.json()).toMatchObject({ error: { code: "invalid_api_key" } });
    const text = stripVTControlCharacters(out);
    expect(text).toContain("The secret ADMIN_TOKEN is not set");
    for (const noise of ["WARNING", "ENOTFOUND", "Request.cf", "out of date", "will not start"]) {
      expect(text).not.toContain(noise);
    }
  });
});

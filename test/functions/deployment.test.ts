import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it, vi } from "vitest";
import { checkDeployment, deploymentProblems } from "../../functions/deployment.ts";
import { ROOT } from "../../scripts/edge.ts";

const config = (url: string) =>
  JSON.stringify({
    models: [{ id: "m", max_model_len: 1024 }],
    regions: [{ id: "eu", origins: [{ id: "eu-1", url }] }],
    default_region: "eu",
  });
const secrets = { ADMIN_TOKEN: "a", TOKEN_SIGNING_SECRET: "s" };

describe("the Worker's start-up checks", () => {
  it("refuses to start outside local runs with an origin a Worker cannot reach", () => {
    for (const url of [
      "http://127.0.0.1:9101",
      "http://localhost:8000",
      "http://10.0.0.5",
      "http://192.168.1.2",
      "http://[::1]:9000",
    ]) {
      const log = vi.spyOn(console, "error").mockImplementation(() => {});
      expect(() => checkDeployment({ WARMGATE_CONFIG: config(url), ...secrets })).toThrow(
        /will not start: origin eu-1 of region eu is at .* cannot reach/,
      );
      log.mockRestore();
    }
    expect(
      deploymentProblems({ WARMGATE_CONFIG: config("https://gpu.example.com"), ...secrets }),
    ).toEqual([]);
  });

  it("lets local runs use loopback origins", () => {
    const env = {
      WARMGATE_CONFIG: config("http://127.0.0.1:9101"),
      WARMGATE_ENV: "local",
      ...secrets,
    };
    expect(deploymentProblems(env)).toEqual([]);
    expect(() => checkDeployment(env)).not.toThrow();
  });

  it("refuses to start with a missing or invalid config, naming the field", () => {
    const log = vi.spyOn(console, "error").mockImplementation(() => {});
    try {
      expect(() => checkDeployment({ ...secrets })).toThrow(/WARMGATE_CONFIG/);
      expect(() =>
        checkDeployment({ WARMGATE_CONFIG: '{"models":[]}', WARMGATE_ENV: "local", ...secrets }),
      ).not.toThrow();
      const line = JSON.parse(String(log.mock.calls.at(-1)?.[0])) as { level: string; msg: string };
      expect(line.level).toBe("error");
      expect(line.msg).toMatch(/^warmgate: WARMGATE_CONFIG is invalid at /);
    } finally {
      log.mockRestore();
    }
  });

  it("reports missing secrets with how to set them, and starts anyway", () => {
    const log = vi.spyOn(console, "error").mockImplementation(() => {});
    try {
      expect(() =>
        checkDeployment({ WARMGATE_CONFIG: config("https://gpu.example.com") }),
      ).not.toThrow();
      const lines = log.mock.calls.map((call) => String(call[0]));
      expect(lines).toEqual([
        expect.stringContaining("ADMIN_TOKEN is not set: run `wrangler secret put ADMIN_TOKEN`"),
        expect.stringContaining("TOKEN_SIGNING_SECRET is not set"),
      ]);
      expect(lines[0]).toContain(".dev.vars.example");
    } finally {
      log.mockRestore();
    }
  });
});

describe("the committed local settings", () => {
  it("let wrangler dev start with the default wrangler.toml: .dev.vars.example sets every secret", async () => {
    const vars = Object.fromEntries(
      (await readFile(join(ROOT, ".dev.vars.example"), "utf8"))
        .split("\n")
        .filter((line) => /^[A-Z_]+=/.test(line))
        .map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]),
    );
    expect(Object.keys(vars)).toEqual(
      expect.arrayContaining([
        "WARMGATE_ENV",
        "ADMIN_TOKEN",
        "TOKEN_SIGNING_SECRET",
        "ORIGIN_TOKEN",
      ]),
    );
    const toml = await readFile(join(ROOT, "wrangler.toml"), "utf8");
    const local = /^WARMGATE_CONFIG = '(.*)'$/m.exec(toml)?.[1];
    expect(deploymentProblems({ ...vars, WARMGATE_CONFIG: local })).toEqual([]);
    // Without them, the same config is one a Worker on Cloudflare could never serve.
    expect(deploymentProblems({ WARMGATE_CONFIG: local, ADMIN_TOKEN: "x" })).not.toEqual([]);
  });
});

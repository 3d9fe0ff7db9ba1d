import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/edge.ts";

const run = promisify(execFile);
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "warmgate-config-check-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function check(...args: string[]): Promise<{ code: number; out: string; err: string }> {
  try {
    const { stdout, stderr } = await run(
      process.execPath,
      [join(ROOT, "scripts", "config-check.ts"), ...args],
      { cwd: ROOT },
    );
    return { code: 0, out: stdout, err: stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, out: e.stdout, err: e.stderr };
  }
}

async function file(name: string, value: unknown): Promise<string> {
  const path = join(dir, name);
  await writeFile(path, typeof value === "string" ? value : JSON.stringify(value));
  return path;
}

const config = (url: string) => ({
  models: [{ id: "m", max_model_len: 1024 }],
  regions: [{ id: "eu", origins: [{ id: "eu-1", url }] }],
  default_region: "eu",
});

describe("npm run config:check", () => {
  it("passes a deployable document with a summary", async () => {
    const result = await check(await file("ok.json", config("https://gpu.example.com")));
    expect(result.code).toBe(0);
    expect(result.out).toContain("ok — 1 models, 1 regions, 1 origins");
  });

  it("fails with the Worker's own message for a bad field", async () => {
    const result = await check(
      await file("bad.json", { ...config("https://a.example"), default_region: 5 }),
    );
    expect(result.code).toBe(1);
    expect(result.err).toContain("WARMGATE_CONFIG is invalid at default_region");
  });

  it("lists every problem of a document, not only the first", async () => {
    const bad = {
      ...config("https://a.example"),
      default_region: 5,
      models: [{ id: "m", max_model_len: -1 }],
    };
    const result = await check(await file("bad-twice.json", bad));
    expect(result.code).toBe(1);
    expect(result.err).toContain("WARMGATE_CONFIG is invalid at default_region");
    expect(result.err).toContain("WARMGATE_CONFIG is invalid at models[0].max_model_len");
  });

  it("warns of an origin on plain HTTP at a public address, and passes it", async () => {
    const result = await check(await file("clear.json", config("http://gpu.example.com:9000")));
    expect(result.code).toBe(0);
    expect(result.err).toContain(
      "warning: origin eu-1 of region eu is at http://gpu.example.com:9000",
    );
    expect(result.err).toContain("in clear");
    const tls = await check(await file("tls.json", config("https://gpu.example.com")));
    expect(tls.err).not.toContain("warning");
  });

  it("fails for an origin a Worker cannot reach, unless --local", async () => {
    const path = await file("loopback.json", config("http://127.0.0.1:9101"));
    const deployed = await check(path);
    expect(deployed.code).toBe(1);
    expect(deployed.err).toContain("origin eu-1 of region eu is at http://127.0.0.1:9101");
    expect((await check(path, "--local")).code).toBe(0);
  });

  it("reads the document in a wrangler.toml, and fails the project's unchanged one", async () => {
    const result = await check(join(ROOT, "wrangler.toml"));
    expect(result.code).toBe(1);
    expect(result.err).toContain("cannot reach");
    expect((await check(join(ROOT, "wrangler.toml"), "--local")).code).toBe(0);
  });

  it("says how to call it", async () => {
    const result = await check();
    expect(result.code).toBe(2);
    expect(result.err).toContain("usage: npm run config:check -- FILE");
  });
});

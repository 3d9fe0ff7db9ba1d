import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/edge.ts";
import { type SpawnedOrigin, simFlags, spawnOrigin } from "../../scripts/stack.ts";

const run = promisify(execFile);
const TOKEN = "bench-cli-token";
let a: SpawnedOrigin;
let b: SpawnedOrigin;

beforeAll(async () => {
  const flags = [...simFlags({ timeScale: 0.02 }), "--access-token", TOKEN];
  [a, b] = await Promise.all([spawnOrigin(flags), spawnOrigin(flags)]);
}, 60_000);

afterAll(async () => {
  await Promise.all([a?.close(), b?.close()]);
});

async function bench(...args: string[]) {
  const { stdout, stderr } = await run(process.execPath, [join(ROOT, "bench", "cli.ts"), ...args], {
    cwd: ROOT,
  });
  return { stdout, stderr };
}

interface Report {
  command: string;
  results: {
    url: string;
    requests: number;
    ok: number;
    errors: Record<string, number>;
    tokensPerSecond: number;
    ttftMs: { p50: number | null };
    itlMs: { p50: number | null };
    totalMs: { p99: number | null };
  }[];
}

describe("npm run bench", () => {
  it("measures two endpoints in turn, streamed: TTFT, inter-token latency, tokens/s", async () => {
    const endpoints = ["--url", a.url, "--url", b.url, "--key", TOKEN];
    const load = ["--requests", "12", "--concurrency", "3", "--stream", "--max-tokens", "16"];
    const { stdout } = await bench(...endpoints, "--model", "warmgate-sim-8b", ...load, "--json");
    const report = JSON.parse(stdout) as Report;
    expect(report.results.map((r) => [r.url, r.requests, r.ok])).toEqual([
      [a.url, 12, 12],
      [b.url, 12, 12],
    ]);
    for (const r of report.results) {
      expect(r.ttftMs.p50).toBeGreaterThan(0);
      expect(r.itlMs.p50).toBeGreaterThan(0);
      expect(r.totalMs.p99).toBeGreaterThanOrEqual(r.ttftMs.p50 ?? 0);
      expect(r.tokensPerSecond).toBeGreaterThan(0);
    }
    expect(report.command).not.toContain(TOKEN);
  });

  it("prints a table with each figure's ratio, and counts errors by status and code", async () => {
    const endpoints = ["--url", a.url, "--url", b.url, "--key", TOKEN, "--key", "wrong"];
    const load = ["--model", "warmgate-sim-8b", "--requests", "4", "--concurrency", "2"];
    const { stdout } = await bench(...endpoints, ...load);
    expect(stdout).toContain("| B / A |");
    expect(stdout).toMatch(/\| TTFT p50 ms +\|/);
    expect(stdout).toMatch(/errors +\| none +\| 401 \S+: 4/);
  });

  it("refuses bad options with its usage", async () => {
    await expect(bench("--url", "nope", "--key", "k", "--model", "m")).rejects.toMatchObject({
      code: 2,
      stderr: expect.stringContaining("usage: npm run bench"),
    });
  });
});

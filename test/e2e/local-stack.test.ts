import { execFileSync } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import { createServer, connect } from "node:net";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { cleanUpStarts, npmStart, stateDir, until } from "../support/npm-start.ts";

// `npm start` as a user or a process manager runs it: its own state folder, real npm.
afterEach(cleanUpStarts);

function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

/** Processes whose command line names `marker` (the state folder), other than `ps`. */
function processesWith(marker: string): string[] {
  return execFileSync("ps", ["-eo", "args"], { encoding: "utf8" })
    .split("\n")
    .filter((line) => line.includes(marker) && !line.startsWith("ps "));
}

/** The lines `npm start` printed on failing to start, once it exited with 1. */
async function startFailures(run: ReturnType<typeof npmStart>): Promise<string[]> {
  const code = await new Promise<number | null>((r) => run.child.once("exit", r));
  expect(code).toBe(1);
  return run
    .err()
    .split("\n")
    .filter((l) => l.includes("could not start"));
}

describe("npm start", () => {
  it("fails at once with one clear line when --port is taken", async () => {
    const server = createServer();
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const address = server.address();
    const port = typeof address === "object" && address !== null ? address.port : 0;
    try {
      const run = npmStart(["--port", String(port), "--state", await stateDir()]);
      expect(await startFailures(run)).toEqual([
        expect.stringContaining(`port ${port} on 127.0.0.1 is already in use`),
      ]);
    } finally {
      server.close();
    }
  });

  it("fails with the configuration's own error, not a wait, when --config has a bad value", async () => {
    const state = await stateDir();
    const config = join(state, "bad.json");
    await writeFile(config, JSON.stringify({ batch_api: { lines_in_flight: 0 } }));
    const run = npmStart(["--config", config, "--state", state, "--time-scale", "0"]);
    expect(await startFailures(run)).toEqual([
      expect.stringContaining("WARMGATE_CONFIG is invalid at batch_api.lines_in_flight"),
    ]);
    expect(run.err()).not.toContain("not ready within");
    expect(processesWith(state)).toEqual([]);
  });

  it("stops what it started when SIGTERM comes while it starts", async () => {
    const state = await stateDir();
    const run = npmStart(["--state", state, "--origins-per-region", "1", "--time-scale", "0"]);
    // As soon as wrangler runs, before the edge answers.
    for (let i = 0; i < 3_000 && !processesWith(state).some((p) => p.includes("wrangler")); i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    expect(processesWith(state).length).toBeGreaterThan(0);
    process.kill(run.child.pid ?? 0, "SIGTERM");
    await new Promise((r) => run.child.once("exit", r));
    await until("every part to stop", () => processesWith(state).length === 0);
    expect(run.err()).not.toContain("warmgate: ready");
  });

  it("writes an env file that works from another shell, and stops every part on SIGTERM to npm", async () => {
    const state = await stateDir();
    const run = npmStart(["--state", state, "--origins-per-region", "1"]);
    const envFile = join(state, "warmgate.env");
    await until("the stack to be ready", () => run.err().includes("Ctrl-C stops everything"));
    const text = await readFile(envFile, "utf8");
    expect(
      text
        .split("\n")
        .filter(Boolean)
        .every((l) => l.startsWith("export ")),
    ).toBe(true);
    // The secret a soft-budget alert's receiver verifies its signature with.
    expect(text).toMatch(/^export WARMGATE_ALERT_SIGNING_SECRET='[^']+'$/m);
    expect(run.err()).toContain(`source ${envFile} &&`);
    // What the README tells a user to run in a second terminal.
    const status = execFileSync(
      "bash",
      [
        "-c",
        `source '${envFile}' && "${process.execPath}" -e 'fetch(process.env.OPENAI_BASE_URL + "/models", { headers: { authorization: "Bearer " + process.env.OPENAI_API_KEY } }).then((r) => process.stdout.write(String(r.status)))'`,
      ],
      { encoding: "utf8" },
    );
    expect(status).toBe("200");
    const ports = [...text.matchAll(/127\.0\.0\.1:(\d+)/g)].map((m) => Number(m[1]));
    expect(ports.length).toBeGreaterThanOrEqual(3);
    expect(processesWith(state).length).toBeGreaterThan(0);

    process.kill(run.child.pid ?? 0, "SIGTERM");
    await until("every part to stop", async () => {
      const open = await Promise.all(ports.map(listening));
      return !open.includes(true) && processesWith(state).length === 0;
    });
    await until("the env file to go", async () => {
      const gone = await readFile(envFile).then(
        () => false,
        () => true,
      );
      return gone;
    });
  });
});

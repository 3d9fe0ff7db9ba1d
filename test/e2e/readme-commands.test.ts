import { execFileSync, spawnSync } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/edge.ts";
import { cleanUpStarts, npmStart, stateDir, until } from "../support/npm-start.ts";

// The README's commands, as written, in a second shell against `npm start`: every block
// but those that need a GPU (`vllm serve`) or a Cloudflare login, and `npm start` itself.
const readme = await readFile(join(ROOT, "README.md"), "utf8");
const blocks = [...readme.matchAll(/```(sh|ts)\n([\s\S]*?)```/g)].map((m) => ({
  lang: m[1] as "sh" | "ts",
  text: m[2] ?? "",
}));
const shell = blocks.filter(
  (b) =>
    b.lang === "sh" &&
    !b.text.includes("npm start") &&
    !b.text.includes("vllm serve") &&
    !b.text.includes("wrangler login"),
);
let envFile = "";

beforeAll(async () => {
  const state = await stateDir();
  envFile = join(state, "warmgate.env");
  const run = npmStart(["--state", state, "--origins-per-region", "1", "--time-scale", "0"]);
  await until("the stack to be ready", () => run.err().includes("Ctrl-C stops everything"));
}, 150_000);
afterAll(cleanUpStarts);

/** Runs a README block in bash with the env file `npm start` wrote, where the README has it. */
function bash(text: string): { status: number | null; out: string } {
  const script = text.includes("warmgate.env")
    ? text.replaceAll(".wrangler/state/warmgate.env", `'${envFile}'`)
    : `source '${envFile}'\n${text}`;
  const run = spawnSync("bash", ["-eo", "pipefail", "-c", script], { cwd: ROOT, encoding: "utf8" });
  return { status: run.status, out: `${run.stdout}${run.stderr}` };
}

/** What a block's output must show: a whole stream, a new key's secret, or anything. */
function answers(text: string): RegExp {
  if (text.includes('"stream": true')) return /data: \[DONE\]/;
  if (text.includes("/admin/keys")) return /"key"\s*:\s*"wg_/;
  return /[\s\S]*/;
}

describe("the README's commands against npm start", () => {
  it("has the blocks this test runs", () => {
    expect(shell.length).toBeGreaterThanOrEqual(2);
    expect(blocks.filter((b) => b.lang === "ts")).toHaveLength(1);
  });

  it.each(shell.map((b) => [b.text.split("\n")[0] ?? "", b.text]))("runs: %s", (_, text) => {
    const run = bash(text);
    expect(run).toMatchObject({ status: 0, out: expect.stringMatching(answers(text)) });
    expect(run.out).not.toMatch(/"error"\s*:/);
  });

  it("runs the OpenAI SDK example", () => {
    const code = blocks.find((b) => b.lang === "ts")?.text ?? "";
    const out = execFileSync(
      "bash",
      ["-c", `source '${envFile}' && exec '${process.execPath}' --input-type=module`],
      {
        cwd: ROOT,
        input: `${code}\nconsole.log("\\n", response.status, data.length);`,
        encoding: "utf8",
      },
    );
    expect(out.trim().endsWith("completed 1")).toBe(true);
    expect(out.length).toBeGreaterThan(20);
  });

  it("checks the checkout's configuration before a deploy, refusing its loopback origins", () => {
    const deploy = blocks.find((b) => b.text.includes("wrangler login"))?.text ?? "";
    const check = deploy.split("\n").find((l) => l.startsWith("npm run config:check"));
    expect(check).toBeDefined();
    const { status, out } = bash(check?.replace(/#.*/, "") ?? "");
    expect(status).not.toBe(0);
    expect(out).toContain("which a Worker on Cloudflare cannot reach");
  });
});

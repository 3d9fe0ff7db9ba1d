import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/edge.ts";
import { DEFAULT_SIM_MODELS } from "../../origin/sim/options.ts";
import { SIM_ALIASES } from "../../scripts/stack.ts";

// The README's shell and TypeScript examples run against `npm start` as written.
describe("the README's examples", () => {
  it("name only models the local stack serves", async () => {
    const readme = await readFile(join(ROOT, "README.md"), "utf8");
    const blocks = [...readme.matchAll(/```(sh|ts)\n([\s\S]*?)```/g)]
      .map((m) => m[2] ?? "")
      // The vLLM example names the engine's own model, not one of the gateway's.
      .filter((block) => !block.includes("vllm serve"));
    const named = blocks.flatMap((block) => [
      ...[...block.matchAll(/"?model"?\s*:\s*\\?"([^"\\]+)\\?"/g)].map((m) => m[1] ?? ""),
      ...[...block.matchAll(/"models"\s*:\s*\[([^\]]*)\]/g)].flatMap((m) =>
        [...(m[1] ?? "").matchAll(/"([^"]+)"/g)].map((n) => n[1] ?? ""),
      ),
    ]);
    expect(named.length).toBeGreaterThan(3);
    const served = [...DEFAULT_SIM_MODELS.map((m) => m.id), ...Object.keys(SIM_ALIASES)];
    for (const model of named) expect(served, `README names ${model}`).toContain(model);
  });
});

import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/edge.ts";

describe("the dashboard's bundled files", () => {
  it("match dashboard/public and uPlot as they are now", async () => {
    const run = promisify(execFile);
    await expect(
      run(process.execPath, [join(ROOT, "dashboard", "build.mjs"), "--check"], { cwd: ROOT }),
    ).resolves.toBeDefined();
  });
});

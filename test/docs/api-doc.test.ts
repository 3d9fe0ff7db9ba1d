// docs/api.md agrees with itself: the parts of OpenAI's API it says are not served have no
// row in its table of routes.
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/edge.ts";

describe("docs/api.md", () => {
  it("names as not served no route family its table serves", async () => {
    const doc = await readFile(join(ROOT, "docs", "api.md"), "utf8");
    const sentence = /these are served; ([\s\S]*?) are not \(`404`\)/.exec(doc)?.[1];
    expect(sentence).toBeDefined();
    const unserved = (sentence ?? "")
      .split(/,|\band\b/)
      .map((name) => name.trim())
      .filter((name) => name !== "");
    expect(unserved.length).toBeGreaterThan(3);
    const routes = doc.split("\n").filter((line) => line.startsWith("| `"));
    for (const name of unserved) {
      const served = routes.filter((row) => row.includes(`/v1/${name}`));
      expect(served, `${name} is said not to be served`).toEqual([]);
    }
  });
});

import { existsSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { type Browser, chromium } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/edge.ts";
import { type RunningStack, startStack } from "../../scripts/stack.ts";

// The dashboard in a real browser: Debian's Chromium, driven by playwright-core.
const CHROMIUM = process.env["CHROMIUM_PATH"] ?? "/usr/bin/chromium";
const present = existsSync(CHROMIUM);
const required = process.env["CI"] === "true";
/** Where the test keeps its screenshot. */
export const ARTIFACTS = join(ROOT, "test-results");

if (!present && !required) {
  console.warn(
    `dashboard test skipped: no Chromium at ${CHROMIUM}. Install it with \`sudo apt-get install chromium\` (Debian/Ubuntu) or set CHROMIUM_PATH.`,
  );
}

describe.skipIf(!present && !required)("the dashboard in Chromium", () => {
  let stack: RunningStack;
  let browser: Browser;

  beforeAll(async () => {
    if (!present)
      throw new Error(`CI=true needs Chromium at ${CHROMIUM} (apt-get install chromium)`);
    [stack, browser] = await Promise.all([
      startStack({
        regions: [{ id: "eu", continents: ["EU"], origins: 2 }],
        sim: { timeScale: 0.05 },
      }),
      chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] }),
    ]);
  }, 180_000);

  afterAll(async () => {
    await Promise.all([browser?.close(), stack?.stop()]);
  });

  async function load(requests: number): Promise<void> {
    await Promise.all(
      Array.from({ length: requests }, (_, i) =>
        fetch(`${stack.edgeUrl}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${stack.apiKey}`, "content-type": "application/json" },
          body: JSON.stringify({
            model: "warmgate-sim-8b",
            max_tokens: 8,
            stream: i % 2 === 0,
            messages: [{ role: "user", content: `Question ${i}: what is a prefix cache?` }],
          }),
        }).then((r) => r.arrayBuffer()),
      ),
    );
  }

  it(
    "signs in without the token in the URL, and shows numbers that change under load",
    { timeout: 90_000 },
    async () => {
      const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
      const errors: string[] = [];
      page.on("pageerror", (error) => errors.push(error.message));
      await page.goto(stack.edgeUrl);
      await page.fill("#token", "not-the-token");
      await page.click("button[type=submit]");
      await page.waitForSelector("#sign-in-error:has-text('refused')");

      await page.fill("#token", stack.adminToken);
      await page.click("button[type=submit]");
      await page.waitForSelector("#dashboard:not([hidden])");
      expect(page.url()).not.toContain(stack.adminToken);
      const stored = await page.evaluate(() => sessionStorage.getItem("warmgate-admin-token"));
      expect(stored).toBe(stack.adminToken);

      await page.waitForFunction(() => document.querySelectorAll("#origins tbody tr").length === 2);
      const rows = await page.$$eval("#origins tbody tr", (trs) =>
        trs.map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent)),
      );
      expect(rows.map((r) => [r[0], r[1], r[2]])).toEqual([
        ["eu", "eu-1", "closed"],
        ["eu", "eu-2", "closed"],
      ]);
      const before = Number(await page.textContent("#total-requests"));
      await load(24);
      await page.waitForFunction(
        (n) => Number(document.getElementById("total-requests")?.textContent) >= n + 24,
        before,
        { timeout: 30_000 },
      );
      // Under load the rate chart gets points, and the key list its key.
      await load(24);
      await page.waitForFunction(
        () => Number(document.getElementById("total-rps")?.textContent) > 0,
      );
      await page.waitForFunction(() => document.querySelectorAll("#keys tbody tr").length > 0);
      expect(await page.textContent("#keys tbody tr td")).toBe("development");
      await page.click("#by-spend");
      expect(await page.textContent("#by-spend")).toContain("▾");
      expect(await page.textContent("#keys tbody tr td")).toBe("development");
      expect(await page.$$("#chart-latency canvas")).toHaveLength(1);
      await mkdir(ARTIFACTS, { recursive: true });
      await page.screenshot({ path: join(ARTIFACTS, "dashboard.png"), fullPage: true });
      expect(errors).toEqual([]);

      await page.click("#sign-out");
      expect(await page.evaluate(() => sessionStorage.getItem("warmgate-admin-token"))).toBeNull();
    },
  );

  it(
    "fits a narrow screen: tables scroll inside their card, the page never sideways",
    { timeout: 60_000 },
    async () => {
      const page = await browser.newPage({ viewport: { width: 360, height: 740 } });
      await page.goto(stack.edgeUrl);
      await page.fill("#token", stack.adminToken);
      await page.click("button[type=submit]");
      await page.waitForFunction(() => document.querySelectorAll("#origins tbody tr").length === 2);
      await load(4);
      await page.waitForFunction(() => document.querySelectorAll("#keys tbody tr").length > 0);
      const sizes = await page.evaluate(() => ({
        page: document.documentElement.scrollWidth,
        viewport: window.innerWidth,
        cards: [...document.querySelectorAll(".table-scroll")].map((card) => {
          const box = card.getBoundingClientRect();
          return { right: box.right, overflow: getComputedStyle(card).overflowX };
        }),
      }));
      expect(sizes.page).toBeLessThanOrEqual(sizes.viewport);
      expect(sizes.cards).toHaveLength(3);
      for (const card of sizes.cards) {
        expect(card.right).toBeLessThanOrEqual(sizes.viewport);
        expect(card.overflow).toBe("auto");
      }
      await page.close();
    },
  );
});

import { existsSync } from "node:fs";
import { mkdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { type Browser, type Page, chromium } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../scripts/edge.ts";
import { type RunningStack, startStack } from "../../scripts/stack.ts";
import { fitsWidth, manageTeams } from "../support/dashboard-page.ts";

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
  const pageErrors: string[] = [];

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

  async function signedIn(width: number, actor = ""): Promise<Page> {
    const page = await browser.newPage({ viewport: { width, height: 900 } });
    page.on("pageerror", (error) => pageErrors.push(error.message));
    await page.goto(stack.edgeUrl);
    await page.fill("#token", stack.adminToken);
    await page.getByLabel("Your name", { exact: false }).fill(actor);
    await page.click("button[type=submit]");
    await page.waitForSelector("#dashboard:not([hidden])");
    return page;
  }

  async function admin(path: string): Promise<Record<string, unknown>> {
    const res = await fetch(`${stack.edgeUrl}${path}`, {
      headers: { authorization: `Bearer ${stack.adminToken}` },
    });
    expect(res.status).toBe(200);
    return (await res.json()) as Record<string, unknown>;
  }

  async function modelsWith(secret: string): Promise<number> {
    const res = await fetch(`${stack.edgeUrl}/v1/models`, {
      headers: { authorization: `Bearer ${secret}` },
    });
    await res.arrayBuffer();
    return res.status;
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
      // The charts span the chosen range (5 minutes unless chosen), however few their points.
      const spans = (seconds: number) =>
        page.waitForFunction((want) => {
          const chart = document.getElementById("chart-rate");
          const span = Number(chart?.dataset["to"]) - Number(chart?.dataset["from"]);
          return Math.abs(span - want) < 0.001;
        }, seconds);
      await spans(300);
      await page.getByLabel("Charts show the last").selectOption({ label: "minute" });
      await spans(60);
      await mkdir(ARTIFACTS, { recursive: true });
      await page.screenshot({ path: join(ARTIFACTS, "dashboard.png"), fullPage: true });
      expect(errors).toEqual([]);

      await page.click("#sign-out");
      expect(await page.evaluate(() => sessionStorage.getItem("warmgate-admin-token"))).toBeNull();
    },
  );

  it(
    "manages keys: create shows the secret once, edit, rotate with grace, revoke after confirmation",
    { timeout: 90_000 },
    async () => {
      const page = await signedIn(1280, "Ada Operator");
      await page.getByRole("button", { name: "Keys", exact: true }).click();
      await page.getByRole("row", { name: /development/ }).waitFor();

      await page.getByRole("button", { name: "New key" }).click();
      await page.getByLabel("Name", { exact: true }).fill("checkout-e2e");
      await page.getByLabel("Requests per minute").fill("30");
      await page.getByLabel("Per period").fill("1d 5");
      await page.getByLabel("Tags").fill("team:checkout, env:prod");
      await page.getByRole("button", { name: "Save" }).click();
      await page.locator("#secret-dialog[open]").waitFor();
      const secret = await page.getByLabel("API key").inputValue();
      expect(secret).toMatch(/^wg_/);
      expect(page.url()).not.toContain(secret);
      expect(await modelsWith(secret)).toBe(200);
      await page.getByRole("button", { name: "Done" }).click();
      expect(await page.getByLabel("API key").inputValue()).toBe("");
      expect(await page.content()).not.toContain(secret);

      const row = page.getByRole("row", { name: /checkout-e2e/ });
      const id = await row.locator("code").textContent();
      expect(await row.locator("td").allTextContents()).toEqual([
        "checkout-e2e",
        id,
        "active",
        "standard",
        "–",
        "team:checkout, env:prod",
        "30",
        "1000000",
        "64",
        "1d 5.000000",
        "–",
        "EditRotateBlockRevoke",
      ]);

      await page.getByRole("button", { name: "Edit key checkout-e2e" }).click();
      await page.getByLabel("Requests per minute").fill("45");
      await page.getByLabel("Per period").fill("");
      await page.getByRole("button", { name: "Save" }).click();
      await row.locator("td", { hasText: "45" }).waitFor();
      const edited = await admin(`/admin/keys/${id}`);
      expect(edited).toMatchObject({ limits: { rpm: 45 }, budgets: [] });

      // A refused change keeps the form open with the API's own message.
      await page.getByRole("button", { name: "Edit key checkout-e2e" }).click();
      await page.getByLabel("Browser origins allowed").fill("not an origin");
      await page.getByRole("button", { name: "Save" }).click();
      await page.getByRole("alert").filter({ hasText: "origin" }).waitFor();
      await page.getByRole("button", { name: "Cancel" }).click();
      expect((await admin(`/admin/keys/${id}`))["allowed_origins"]).toEqual([]);

      await page.getByRole("button", { name: "Rotate key checkout-e2e" }).click();
      await page.getByLabel("The previous secret keeps working for").fill("0");
      await page.getByRole("button", { name: "Rotate", exact: true }).click();
      await page.locator("#secret-dialog[open]").waitFor();
      const rotated = await page.getByLabel("API key").inputValue();
      expect(rotated).toMatch(/^wg_/);
      expect(rotated).not.toBe(secret);
      await page.getByRole("button", { name: "Done" }).click();
      expect(await modelsWith(secret)).toBe(401);
      expect(await modelsWith(rotated)).toBe(200);

      await page.getByRole("button", { name: "Block key checkout-e2e" }).click();
      await row.locator("td.status-blocked").waitFor();
      expect(await modelsWith(rotated)).toBe(403);
      await page.getByRole("button", { name: "Unblock key checkout-e2e" }).click();
      await row.locator("td", { hasText: "active" }).waitFor();
      expect(await modelsWith(rotated)).toBe(200);

      await page.getByRole("button", { name: "Revoke key checkout-e2e" }).click();
      await page.getByRole("button", { name: "Cancel" }).click();
      expect(await modelsWith(rotated)).toBe(200);
      await page.getByRole("button", { name: "Revoke key checkout-e2e" }).click();
      await page.getByRole("button", { name: "Revoke", exact: true }).click();
      await row.locator("td.status-revoked").waitFor();
      expect(await page.getByRole("button", { name: "Edit key checkout-e2e" }).isDisabled()).toBe(
        true,
      );
      expect(await modelsWith(rotated)).toBe(401);

      await page.getByLabel("Find").fill("checkout-e2e");
      expect(await page.locator("#key-list tbody tr").count()).toBe(1);
      await page.getByLabel("Find").fill("");
      await page.getByLabel("Status").selectOption("active");
      expect(await page.getByRole("row", { name: /checkout-e2e/ }).count()).toBe(0);

      // Every change is in the audit log: who (the name given at sign-in), what, on which key.
      await page.getByRole("button", { name: "Audit log", exact: true }).click();
      await page.getByLabel("On", { exact: true }).fill(id ?? "");
      await page.getByRole("button", { name: "Apply" }).click();
      await page.waitForFunction(() => {
        const rows = [...document.querySelectorAll("#audit tbody tr")];
        return rows.length > 0 && rows.every((tr) => tr.textContent?.includes("checkout-e2e"));
      });
      const audit = await page
        .locator("#audit tbody tr")
        .evaluateAll((trs) =>
          trs.map((tr) => [...tr.querySelectorAll("td")].slice(1, 4).map((td) => td.textContent)),
        );
      const on = "key checkout-e2e";
      expect(audit).toEqual(
        ["key.revoke", "key.unblock", "key.block", "key.rotate", "key.update", "key.create"].map(
          (action) => [expect.stringContaining("Ada Operator"), action, on],
        ),
      );
      expect(await page.locator("#audit").textContent()).not.toContain(rotated);
      expect(pageErrors).toEqual([]);
      await page.close();
    },
  );

  it(
    "manages teams: create, assign a key, refuse deleting a team with keys, then delete it",
    { timeout: 90_000 },
    async () => {
      const page = await signedIn(1280, "Ada Operator");
      await manageTeams(page, { admin, modelsWith });
      expect(page.url()).not.toContain(stack.adminToken);
      expect(pageErrors).toEqual([]);
      await page.close();
    },
  );

  it(
    "shows one request: its tokens, cost and the origin that served it",
    { timeout: 60_000 },
    async () => {
      const res = await fetch(`${stack.edgeUrl}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${stack.apiKey}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: "warmgate-sim-8b",
          max_tokens: 8,
          messages: [{ role: "user", content: "One request to look at." }],
        }),
      });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      const requestId = res.headers.get("x-request-id") ?? "";
      const origin = res.headers.get("x-warmgate-origin");
      // Settlement follows the answer: wait until the ledger has it settled.
      const keys = (await admin("/admin/keys?limit=100"))["data"] as { id: string; name: string }[];
      const devId = keys.find((k) => k.name === "development")?.id ?? "";
      for (let tries = 0; tries < 100; tries++) {
        const record = await admin(`/admin/keys/${devId}/requests/${requestId}`).catch(() => null);
        if (record?.["status"] === "settled") break;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      const page = await signedIn(1280);
      await page.getByRole("button", { name: "Requests", exact: true }).click();
      await page.locator(`#lookup-key option[value="${devId}"]`).waitFor({ state: "attached" });
      await page.getByLabel("Its key").selectOption(devId);
      await page.getByLabel("Request id").fill(requestId);
      await page.getByRole("button", { name: "Show" }).click();
      await page.locator("#request-view:not([hidden])").waitFor();
      const fields = await page.locator("#request-fields dd").allTextContents();
      expect(fields.slice(0, 3)).toEqual([requestId, "warmgate-sim-8b", "settled"]);
      expect(
        await page.locator("#request-attempts tbody tr").last().locator("td").allTextContents(),
      ).toEqual([expect.any(String), "eu", origin, "served"]);

      // The spend log lists it among the key's requests, with what it cost and where it ran.
      const logged = page.locator("#log tbody tr", {
        has: page.getByRole("button", { name: `View request ${requestId}` }),
      });
      const cells = await logged.locator("td").allTextContents();
      expect([cells[1], cells[2], cells[3], cells[4], cells[11]]).toEqual([
        "development",
        "warmgate-sim-8b",
        "ok",
        "200",
        origin,
      ]);
      await page.getByLabel("Ended").selectOption("error");
      await page.getByRole("button", { name: "Apply" }).click();
      await logged.waitFor({ state: "detached" });
      await page.getByLabel("Ended").selectOption("");
      await page.getByLabel("Key", { exact: true }).selectOption(devId);
      await page.getByRole("button", { name: "Apply" }).click();
      await logged.waitFor();
      const [csv] = await Promise.all([
        page.waitForEvent("download"),
        page.getByRole("button", { name: "Download CSV" }).click(),
      ]);
      const text = await readFile(await csv.path(), "utf8");
      expect(text.split("\n")[0]).toMatch(/^id,key_id,/);
      expect(text).toContain(requestId);
      expect(page.url()).not.toContain(stack.adminToken);

      await page.getByLabel("Request id").fill("no-such-request");
      await page.getByRole("button", { name: "Show" }).click();
      await page
        .getByRole("alert")
        .filter({ hasText: "No request with id no-such-request" })
        .waitFor();
      expect(await page.locator("#request-view").isHidden()).toBe(true);
      expect(pageErrors).toEqual([]);
      await page.close();
    },
  );

  it(
    "fits a narrow screen: tables scroll inside their card, the page never sideways",
    { timeout: 60_000 },
    async () => {
      const page = await signedIn(360);
      await page.waitForFunction(() => document.querySelectorAll("#origins tbody tr").length === 2);
      await load(4);
      await page.waitForFunction(() => document.querySelectorAll("#keys tbody tr").length > 0);
      await fitsWidth(page);
      await page.getByRole("button", { name: "Keys", exact: true }).click();
      await page.getByRole("row", { name: /development/ }).waitFor();
      await fitsWidth(page);
      await page.getByRole("button", { name: "New key" }).click();
      await fitsWidth(page);
      await page.getByRole("button", { name: "Cancel" }).click();
      await page.getByRole("button", { name: "Teams", exact: true }).click();
      await fitsWidth(page);
      await page.getByRole("button", { name: "New team" }).click();
      await fitsWidth(page);
      await page.getByRole("button", { name: "Cancel" }).click();
      await page.getByRole("button", { name: "Requests", exact: true }).click();
      await fitsWidth(page);
      await page.getByRole("button", { name: "Audit log", exact: true }).click();
      await page.locator("#audit tbody tr").first().waitFor();
      await fitsWidth(page);
      await page.screenshot({ path: join(ARTIFACTS, "dashboard-narrow.png"), fullPage: true });
      expect(pageErrors).toEqual([]);
      await page.close();
    },
  );
});

/**
 * Checks of the dashboard in Chromium for test/e2e/dashboard.test.ts (docs/metrics.md,
 * "Dashboard"): the page fits the screen, and the Teams view (docs/key-account.md, "Teams"):
 * create and edit a team, assign a key from the key form, a refused delete while it has a
 * key, then a delete once the key has left.
 */
import type { Page } from "playwright-core";
import { expect } from "vitest";

/** The page is never wider than the screen; tables wider than it scroll inside their card. */
export async function fitsWidth(page: Page): Promise<void> {
  const sizes = await page.evaluate(() => ({
    page: document.documentElement.scrollWidth,
    viewport: window.innerWidth,
    cards: [...document.querySelectorAll<HTMLElement>(".table-scroll, dialog[open]")]
      .filter((card) => card.offsetParent !== null || card.matches("dialog[open]"))
      .map((card) => ({
        right: card.getBoundingClientRect().right,
        overflow: card.matches("dialog") ? "auto" : getComputedStyle(card).overflowX,
      })),
  }));
  expect(sizes.page).toBeLessThanOrEqual(sizes.viewport);
  expect(sizes.cards.length).toBeGreaterThan(0);
  for (const card of sizes.cards) {
    expect(card.right).toBeLessThanOrEqual(sizes.viewport);
    expect(card.overflow).toBe("auto");
  }
}

/** Reads of the admin API and of a key's access, as the test's stack answers them. */
export interface DashboardApi {
  admin: (path: string) => Promise<Record<string, unknown>>;
  modelsWith: (secret: string) => Promise<number>;
}

/** Runs the Teams scenario on a signed-in page. */
export async function manageTeams(page: Page, { admin, modelsWith }: DashboardApi): Promise<void> {
  await page.getByRole("button", { name: "Teams", exact: true }).click();
  await page.getByRole("button", { name: "New team" }).click();
  await page.getByLabel("Team name").fill("research-e2e");
  await page.getByLabel("Team concurrency").fill("3");
  await page.getByLabel(/^Team budgets, one a line/).fill("1d 2");
  await page.getByRole("button", { name: "Save team" }).click();
  const row = page.getByRole("row", { name: /research-e2e/ });
  await row.waitFor();
  const teamId = (await row.locator("code").textContent()) ?? "";
  expect(teamId).toMatch(/^team_/);
  expect(await row.locator("td").allTextContents()).toEqual([
    "research-e2e",
    teamId,
    "",
    "1000000000",
    "1000000000000",
    "3",
    "1d 2.000000",
    "every model",
    "EditDelete",
  ]);

  await page.getByRole("button", { name: "Edit team research-e2e" }).click();
  await page.getByLabel("Team RPM").fill("120");
  await page.getByRole("button", { name: "Save team" }).click();
  await row.locator("td", { hasText: "120" }).waitFor();
  const team = await admin(`/admin/teams/${teamId}`);
  expect(team["limits"]).toMatchObject({ rpm: 120, concurrency: 3 });
  expect(team["budgets"]).toMatchObject([{ period: "1d", max_usd: 2, soft_usd: null }]);

  // A key joins the team from its own form.
  await page.getByRole("button", { name: "Keys", exact: true }).click();
  await page.getByRole("button", { name: "New key" }).click();
  await page.getByLabel("Name", { exact: true }).fill("research-key-e2e");
  await page.getByLabel("Team", { exact: true }).selectOption({ label: "research-e2e" });
  await page.getByRole("button", { name: "Save" }).click();
  await page.locator("#secret-dialog[open]").waitFor();
  const secret = await page.getByLabel("API key").inputValue();
  await page.getByRole("button", { name: "Done" }).click();
  const keyRow = page.getByRole("row", { name: /research-key-e2e/ });
  await keyRow.locator("td", { hasText: "research-e2e" }).first().waitFor();
  const keyId = (await keyRow.locator("code").textContent()) ?? "";
  expect((await admin(`/admin/keys/${keyId}`))["team_id"]).toBe(teamId);
  expect(await modelsWith(secret)).toBe(200);

  // Its team keeps it: deleting is refused with the API's own message.
  await page.getByRole("button", { name: "Teams", exact: true }).click();
  await page.getByRole("button", { name: "Delete team research-e2e" }).click();
  await page.getByRole("button", { name: "Delete", exact: true }).click();
  await page.getByRole("alert").filter({ hasText: "still has 1 key" }).waitFor();
  await page.getByRole("button", { name: "Cancel" }).click();
  expect((await admin(`/admin/teams/${teamId}`))["key_ids"]).toEqual([keyId]);

  await page.getByRole("button", { name: "Keys", exact: true }).click();
  await page.getByRole("button", { name: "Edit key research-key-e2e" }).click();
  await page.getByLabel("Team", { exact: true }).selectOption({ label: "none" });
  await page.getByRole("button", { name: "Save" }).click();
  // The team column of its row: none.
  await page.waitForFunction(
    (name) =>
      [...document.querySelectorAll("#key-list tbody tr")].some(
        (tr) => tr.textContent?.includes(name) && tr.querySelectorAll("td")[4]?.textContent === "–",
      ),
    "research-key-e2e",
  );
  expect((await admin(`/admin/keys/${keyId}`))["team_id"]).toBeNull();

  await page.getByRole("button", { name: "Teams", exact: true }).click();
  await page.getByRole("button", { name: "Delete team research-e2e" }).click();
  await page.getByRole("button", { name: "Delete", exact: true }).click();
  await row.waitFor({ state: "detached" });
}

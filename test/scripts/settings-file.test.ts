import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readSettingsFile } from "../../scripts/settings-file.ts";

let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "warmgate-settings-file-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function file(name: string, text: string): Promise<string> {
  const path = join(dir, name);
  await writeFile(path, text);
  return path;
}

describe("npm start --config", () => {
  it("reads configuration sections from a JSON file", async () => {
    const path = await file("ok.json", '{"routing":{"balance_seqs":4}}');
    await expect(readSettingsFile(path)).resolves.toEqual({ routing: { balance_seqs: 4 } });
  });

  it("names the file and the reason when it cannot be used", async () => {
    await expect(readSettingsFile(join(dir, "missing.json"))).rejects.toThrow(/missing\.json/);
    await expect(readSettingsFile(await file("bad.json", "{routing"))).rejects.toThrow(
      /--config .*bad\.json/,
    );
    await expect(readSettingsFile(await file("list.json", "[1]"))).rejects.toThrow(
      /expected a JSON object/,
    );
  });
});

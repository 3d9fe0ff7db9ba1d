/**
 * `npm start -- --config FILE` (README.md, "Quick start"): sections of the edge's
 * configuration (`routing`, `batching`, `breakers`, …; docs/configuration.md) read from a
 * JSON file, laid over what the local stack sets.
 */
import { readFile } from "node:fs/promises";

/** The configuration sections in the JSON file at `path`; throws with a reason it cannot be used. */
export async function readSettingsFile(path: string): Promise<Record<string, unknown>> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(await readFile(path, "utf8"));
  } catch (error) {
    throw new Error(`--config ${path}: ${(error as Error).message}`, { cause: error });
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new Error(`--config ${path}: expected a JSON object of configuration sections`);
  }
  return parsed as Record<string, unknown>;
}

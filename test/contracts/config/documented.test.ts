import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import type { z } from "zod";
import { GatewayConfigSchema } from "../../../contracts/config/gateway.ts";
import { ROOT } from "../../../scripts/edge.ts";

// The parts of a zod schema the walk reads (zod 4's `def`).
type Def =
  | { type: "pipe"; in: z.ZodType }
  | { type: "default" | "prefault" | "optional" | "nullable"; innerType: z.ZodType }
  | { type: "object"; shape: Record<string, z.ZodType> }
  | { type: "array"; element: z.ZodType }
  | { type: "other" };

function defOf(schema: z.ZodType): Def {
  return schema.def as unknown as Def;
}

// Through transforms, defaults and optionals to the schema that says what is written.
function written(schema: z.ZodType): z.ZodType {
  const def = defOf(schema);
  switch (def.type) {
    case "pipe":
      return written(def.in);
    case "default":
    case "prefault":
    case "optional":
    case "nullable":
      return written(def.innerType);
    default:
      return schema;
  }
}

/** Every setting an operator can write, as `limits.retry_budget`, `models[].id`. */
function settingPaths(schema: z.ZodType, path: string): string[] {
  const def = defOf(written(schema));
  if (def.type === "object") {
    return Object.entries(def.shape).flatMap(([name, field]) =>
      settingPaths(field, path === "" ? name : `${path}.${name}`),
    );
  }
  if (def.type === "array" && defOf(written(def.element)).type === "object") {
    return settingPaths(def.element, `${path}[]`);
  }
  return [path];
}

// An override may set every batching field: each is documented once, under `batching.`.
function documentedAs(path: string): string {
  const override = /^batching\.overrides\[\]\.(.+)$/.exec(path)?.[1];
  return override === undefined || override === "region" || override === "model"
    ? path
    : `batching.${override}`;
}

describe("docs/configuration.md", () => {
  const doc = readFileSync(join(ROOT, "docs", "configuration.md"), "utf8");

  it("documents every setting of WARMGATE_CONFIG", () => {
    const paths = settingPaths(GatewayConfigSchema, "");
    expect(paths).toContain("batching.lanes[].queue_timeout_ms");
    const missing = [...new Set(paths.map(documentedAs))].filter((p) => !doc.includes(`\`${p}\``));
    expect(missing).toEqual([]);
  });
});

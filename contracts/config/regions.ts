/**
 * The regions of `WARMGATE_CONFIG`: where each region's callers are and the origins that
 * serve it (docs/configuration.md, "Regions and origins").
 */
import { z } from "zod";
import { ConfigIdSchema } from "./models.ts";

/** One origin server inside a region. */
export const OriginSchema = z.strictObject({
  id: ConfigIdSchema,
  url: z.url({ protocol: /^https?$/ }),
  /** Models this origin serves; absent means every configured model. */
  models: z.array(ConfigIdSchema).optional(),
  /**
   * Names of the secrets whose values the edge presents to this origin as bearer tokens,
   * in order of rotation (default `["ORIGIN_TOKEN"]`, see `contracts/credentials.ts`).
   */
  credentials: z
    .array(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "a secret's name"))
    .min(1)
    .max(8)
    .optional(),
});

/** A region: where its callers are (Cloudflare colos, countries, continents) and its origins. */
export const RegionSchema = z.strictObject({
  id: ConfigIdSchema,
  continents: z.array(z.string().length(2)).default([]),
  countries: z.array(z.string().length(2)).default([]),
  colos: z.array(z.string().min(3).max(4)).default([]),
  origins: z.array(OriginSchema).min(1),
});

/** A configured region. */
export type RegionConfig = z.output<typeof RegionSchema>;
/** A configured origin. */
export type OriginConfig = z.output<typeof OriginSchema>;

/** Whether an origin serves a model. */
export function originServes(origin: OriginConfig, model: string): boolean {
  return origin.models === undefined || origin.models.includes(model);
}

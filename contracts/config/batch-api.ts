/**
 * The `batch_api` section of `WARMGATE_CONFIG` (docs/configuration.md, "Batch API";
 * docs/batch-api.md): the batch price tier and how many lines one batch runs at once.
 */
import { z } from "zod";

/** Batch API settings as written, resolved to what the edge and each batch run with. */
export const BatchApiSchema = z
  .strictObject({
    /** Share of the interactive price a batch line is billed (OpenAI bills batches at half). */
    price_share: z.number().min(0).max(1).default(0.5),
    /** Lines one batch keeps in its Batcher's batch lane at once. */
    lines_in_flight: z.int().min(1).max(1024).default(64),
  })
  .transform((b) => ({ priceShare: b.price_share, linesInFlight: b.lines_in_flight }));

/** Batch API settings, every default applied. */
export type BatchApiSettings = z.output<typeof BatchApiSchema>;

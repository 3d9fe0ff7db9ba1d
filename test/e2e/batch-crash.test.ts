import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { auditBatch, batchEnded, originOkItems, startBatch } from "../../bench/batch-api-checks.ts";
import { batchFile } from "../../bench/batch-api-report.ts";
import { crashDetached } from "../../scripts/edge.ts";
import { DEV_KEY_LIMITS, createKey, startStack } from "../../scripts/stack.ts";

const LINES = 400;

// The whole edge (its process group: the Worker, every BatchRun and Batcher) killed while
// a batch's lines run on the origins, then started again on the same state.
describe("a batch across an edge crash", () => {
  it("completes with every line answered and billed once, none lost, none run again but those in transit", async () => {
    const state = await mkdtemp(join(tmpdir(), "warmgate-batch-crash-"));
    const stack = await startStack({
      regions: [{ id: "eu", continents: ["EU"], origins: 2 }],
      sim: { timeScale: 1, maxNumSeqs: 32 },
      runtime: "workerd",
      persistTo: state,
    });
    try {
      const origins = stack.origins.map(({ origin }) => ({
        id: origin.originId,
        url: origin.url,
        token: stack.originAccessToken,
      }));
      const key = await createKey(stack.edgeUrl, stack.adminToken, {
        name: "batch crash",
        limits: DEV_KEY_LIMITS,
        allow_region_override: true,
      });
      const { jsonl, customIds } = batchFile(LINES, 32);
      const batch = await startBatch(stack.edgeUrl, key, jsonl, "eu");
      let recordedBeforeKill = -1;
      let endedOnOriginsAtKill = 0;
      const done = await batchEnded(
        stack.edgeUrl,
        key,
        batch.id,
        async (view) => {
          if (recordedBeforeKill >= 0 || view.request_counts.completed < LINES / 4) return;
          recordedBeforeKill = view.request_counts.completed;
          await crashDetached(stack.edge);
          // What the origins ran to the end by the time the edge was gone, and what it cut.
          endedOnOriginsAtKill = await originOkItems(origins);
          await stack.restartEdge();
        },
        100,
      );
      expect(recordedBeforeKill).toBeGreaterThan(0);
      // Lines were still to run when the edge died.
      expect(endedOnOriginsAtKill).toBeLessThan(LINES);
      const audit = await auditBatch({
        edgeUrl: stack.edgeUrl,
        key,
        adminToken: stack.adminToken,
        batch: done,
        customIds,
        origins,
      });
      expect(audit).toMatchObject({
        status: "completed",
        outputRecords: LINES,
        distinctCustomIds: LINES,
        orderedByCustomId: true,
        not200: 0,
        errorRecords: 0,
        missing: 0,
        ledgerRows: LINES,
        ledgerDistinct: LINES,
        usageRequests: LINES,
        notEndedOnOrigins: 0,
        pastOriginMemory: 0,
      });
      expect(audit.ledgerCompletionTokens).toBe(audit.outputCompletionTokens);
      // A line runs to the end again only when its answer had ended on the origin but had
      // not reached the batch's storage when the edge died; none that was cut runs twice.
      const again = (await originOkItems(origins)) - LINES;
      expect(again).toBeGreaterThanOrEqual(0);
      expect(again).toBeLessThanOrEqual(endedOnOriginsAtKill - recordedBeforeKill);
    } finally {
      await stack.stop();
      await rm(state, { recursive: true, force: true });
    }
  }, 180_000);
});

import { describe, expect, it } from "vitest";
import { mulberry32 } from "../../../../origin/faults.ts";
import { windowConfig } from "../../../support/window-config.ts";
import {
  cancel,
  onDispatched,
  onItemDone,
  onOriginLoad,
} from "../../../../durable-objects/batcher/window/events.ts";
import { enqueue, tick } from "../../../../durable-objects/batcher/window/flush.ts";
import {
  createWindowState,
  queuedCount,
} from "../../../../durable-objects/batcher/window/state.ts";
import { healthyCandidates } from "../../../../durable-objects/batcher/window/terms.ts";
import type {
  Batch,
  WindowOptions,
  WindowState,
} from "../../../../durable-objects/batcher/window/types.ts";
import { report, request, type Room } from "../../../support/window-state.ts";

describe("no request is lost or duplicated", () => {
  for (let seed = 1; seed <= 20; seed++) {
    it(`settles every id exactly once under random arrivals (seed ${seed})`, () => {
      const random = mulberry32(seed);
      const pick = <T>(values: readonly T[]): T => {
        const value = values[Math.floor(random() * values.length)];
        if (value === undefined) throw new Error("empty choice");
        return value;
      };
      const origins = ["a", "b", "c"];
      const config = windowConfig({
        maxBatchSize: 1 + Math.floor(random() * 8),
        maxBatchTokens: 500 + Math.floor(random() * 3000),
        maxWindowMs: Math.floor(random() * 20),
        rateWindowMs: 20 + random() * 200,
        loadReportTtlMs: 50 + Math.floor(random() * 500),
        maxOriginQueue: 1 + Math.floor(random() * 16),
        lanes: [0, 1, 2].map(() => ({
          queueTimeoutMs: 20 + Math.floor(random() * 400),
          onTimeout: pick(["reject", "wait"] as const),
          maxQueue: 2 + Math.floor(random() * 20),
        })),
        origins: origins.map((id) => ({ id })),
      });
      let state = createWindowState(config, 0);
      let now = 0;
      let nextId = 0;
      const enqueueOrder = new Map<string, number>();
      const fates = new Map<string, string[]>();
      const violations: string[] = [];
      const check = (ok: boolean, message: string): void => {
        if (!ok) violations.push(message);
      };
      const settle = (id: string, fate: string): void => {
        fates.set(id, [...(fates.get(id) ?? []), fate]);
      };
      const inFlight = (): Array<[string, string]> =>
        state.origins.flatMap((o) => o.inFlight.map((i): [string, string] => [o.id, i.id]));

      const checkBatches = (batches: readonly Batch[], roomBefore: Map<string, Room>) => {
        const used = new Map<string, number>();
        const seqs = new Map<string, number>();
        for (const batch of batches) {
          expect(batch.items.length).toBeGreaterThan(0);
          expect(batch.items.length).toBeLessThanOrEqual(config.maxBatchSize);
          const tokens = batch.items.reduce((sum, i) => sum + i.promptTokens + i.maxTokens, 0);
          check(
            batch.items.length === 1 || tokens <= config.maxBatchTokens,
            `batch ${batch.seq} holds ${tokens} tokens`,
          );
          // Lane order, FIFO within a lane.
          for (let i = 1; i < batch.items.length; i++) {
            const prev = batch.items[i - 1];
            const item = batch.items[i];
            if (prev === undefined || item === undefined) throw new Error("gap in batch");
            check(prev.lane <= item.lane, `batch ${batch.seq}: ${item.id} overtook a lower lane`);
            check(
              prev.lane !== item.lane ||
                (enqueueOrder.get(prev.id) ?? 0) < (enqueueOrder.get(item.id) ?? 0),
              `batch ${batch.seq}: ${item.id} overtook ${prev.id} in lane ${item.lane}`,
            );
          }
          // Never more prompt tokens than the origin's report said it could hold.
          const room = roomBefore.get(batch.originId);
          const sent =
            (used.get(batch.originId) ?? 0) + batch.items.reduce((s, i) => s + i.promptTokens, 0);
          used.set(batch.originId, sent);
          check(roomBefore.has(batch.originId), `batch ${batch.seq} went to an unhealthy origin`);
          check(room?.kv == null || sent <= room.kv, `${sent} tokens over KV room`);
          // Never more sequences than its engine may queue beyond its slots.
          const count = (seqs.get(batch.originId) ?? 0) + batch.items.length;
          seqs.set(batch.originId, count);
          check(room?.seqs == null || count <= room.seqs, `${count} sequences over room`);
          for (const item of batch.items) settle(item.id, "batch");
        }
      };
      // The health rule's verdicts, as the shell would pass them: down until a time.
      const downUntil = new Map<string, number>();
      const health: WindowOptions = { usable: (id) => (downUntil.get(id) ?? 0) <= now };
      const rooms = (): Map<string, Room> =>
        new Map(
          healthyCandidates(state, now, health.usable).map((c) => [
            c.id,
            { kv: c.kvRoomTokens, seqs: c.room },
          ]),
        );

      for (let step = 0; step < 500; step++) {
        now += random() < 0.3 ? 0 : random() * 8;
        const op = random();
        if (op < 0.4) {
          const id = `r${nextId++}`;
          enqueueOrder.set(id, nextId);
          const roomBefore = rooms();
          const result = enqueue(
            state,
            {
              id,
              lane: Math.floor(random() * 3),
              promptTokens: random() < 0.05 ? 3000 : 1 + Math.floor(random() * 400),
              maxTokens: Math.floor(random() * 300),
              ...(random() < 0.2 ? { deadline: now + random() * 300 } : {}),
            },
            now,
            health,
          );
          state = result.state;
          const decision = result.decision;
          switch (decision.kind) {
            case "dispatch-now":
              checkBatches([decision.batch], roomBefore);
              break;
            case "queued":
              check(decision.windowMs <= config.maxWindowMs, `window ${decision.windowMs}`);
              break;
            case "rejected":
              settle(id, `rejected:${decision.reason}`);
              break;
          }
        } else if (op < 0.47) {
          // A retried id that is still queued or running is refused, never admitted twice.
          const known = [...state.lanes.flat().map((i) => i.id), ...inFlight().map(([, id]) => id)];
          if (known.length > 0) {
            const result = enqueue(state, request(pick(known)), now, health);
            check(
              result.decision.kind === "rejected" &&
                result.decision.reason === "duplicate_id" &&
                result.state === state,
              `a known id was admitted again at step ${step}`,
            );
          }
        } else if (op < 0.67) {
          const roomBefore = rooms();
          const result = tick(state, now, health);
          state = result.state;
          checkBatches(result.batches, roomBefore);
          for (const notice of result.notices) {
            switch (notice.kind) {
              case "timed-out":
              case "too-large":
              case "no-origin":
                settle(notice.item.id, notice.kind);
                break;
              case "overdue":
                break;
            }
          }
          check(result.nextWakeAt === null || result.nextWakeAt > now, "wake in the past");
        } else if (op < 0.77) {
          state = onOriginLoad(
            state,
            pick(origins),
            report({
              running: Math.floor(random() * 10),
              waiting: Math.floor(random() * 3),
              max_num_seqs: 8,
              kv_free_blocks: Math.floor(random() * 60),
              kv_total_blocks: 100 + Math.floor(random() * 100),
            }),
            now,
          ).state;
        } else if (op < 0.87) {
          const running = inFlight();
          if (running.length > 0) {
            const [originId, itemId] = pick(running);
            if (random() < 0.3) state = onDispatched(state, originId, itemId, now).state;
            else state = onItemDone(state, originId, itemId, now).state;
          }
        } else if (op < 0.96 && nextId > 0) {
          const id = `r${Math.floor(random() * nextId)}`;
          const result = cancel(state, id, now);
          state = result.state;
          if (result.outcome.kind === "removed") settle(id, "cancelled");
        } else {
          downUntil.set(pick(origins), now + random() * 200);
        }

        // The shell persists state as JSON and may rebuild it at any step.
        state = JSON.parse(JSON.stringify(state)) as WindowState;
        const queued = state.lanes.flat().map((i) => i.id);
        const running = inFlight().map(([, id]) => id);
        expect(new Set([...queued, ...running]).size).toBe(queued.length + running.length);
        for (const [lane, queue] of state.lanes.entries()) {
          expect(queue.length).toBeLessThanOrEqual(config.lanes[lane]?.maxQueue ?? 0);
        }
      }

      // Load falls away: every origin is healthy with room to spare, and time moves on.
      for (const id of origins) {
        downUntil.delete(id);
        state = onOriginLoad(
          state,
          id,
          report({ kv_free_blocks: 1000, kv_total_blocks: 1000 }),
          now,
        ).state;
      }
      for (let round = 0; round < 1000 && queuedCount(state) > 0; round++) {
        now += 50;
        const roomBefore = rooms();
        const result = tick(state, now);
        state = result.state;
        checkBatches(result.batches, roomBefore);
        for (const notice of result.notices) {
          if (notice.kind !== "overdue") settle(notice.item.id, notice.kind);
        }
        for (const [originId, itemId] of inFlight()) {
          state = onItemDone(state, originId, itemId, now).state;
        }
      }
      expect(queuedCount(state)).toBe(0);
      expect(violations).toEqual([]);

      expect([...fates.keys()].every((id) => enqueueOrder.has(id))).toBe(true);
      for (const id of enqueueOrder.keys()) {
        expect({ id, fates: fates.get(id) ?? [] }).toEqual({
          id,
          fates: [expect.any(String)],
        });
      }
    });
  }
});

import { type Server, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { watchEdge } from "../../scripts/edge-watch.ts";

const servers: Server[] = [];
const stops: (() => void)[] = [];

afterEach(async () => {
  for (const stop of stops.splice(0)) stop();
  await Promise.all(
    servers.splice(0).map((server) => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(resolve));
    }),
  );
});

/** A server whose `/health` answers (any status) while `state.answer`, and hangs otherwise. */
async function edge(state: { answer: boolean; status: number }) {
  const server = createServer((req, res) => {
    if (!state.answer) return;
    res.statusCode = state.status;
    res.end("{}");
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 10));
}

const FAST = { intervalMs: 10, timeoutMs: 50, misses: 3 };

describe("watchEdge", () => {
  it("calls back after checks in a row find no answer, then watches afresh", async () => {
    const state = { answer: false, status: 200 };
    const url = await edge(state);
    let downs = 0;
    stops.push(
      watchEdge(
        url,
        async () => {
          downs++;
          state.answer = true;
        },
        FAST,
      ),
    );
    await until(() => downs === 1);
    // Answering again: no further callback however long it watches.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(downs).toBe(1);
  });

  it("takes any answer, an error status included, as alive", async () => {
    const url = await edge({ answer: true, status: 503 });
    let downs = 0;
    let checks = 0;
    const server = servers[0];
    server?.on("request", () => checks++);
    stops.push(watchEdge(url, async () => void downs++, FAST));
    await until(() => checks >= 10);
    expect(downs).toBe(0);
  });

  it("counts a refused connection as a miss, and stops when asked", async () => {
    const url = await edge({ answer: true, status: 200 });
    const server = servers.pop();
    await new Promise((resolve) => server?.close(resolve));
    let downs = 0;
    const stop = watchEdge(url, async () => void downs++, FAST);
    await until(() => downs >= 2);
    stop();
    const seen = downs;
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(downs).toBe(seen);
  });
});

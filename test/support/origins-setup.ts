/**
 * Global setup of the workers project: starts simulated origins in Node on free ports and
 * hands their URLs to the Worker under test (as `WARMGATE_CONFIG`) and to the tests.
 *
 * Regions: `eu` (two origins) and `us` (one) for ordinary traffic; `faulty` (two origins,
 * reached only through `x-warmgate-region`) for fault injection, so tests that break
 * origins never disturb the others; `slow` (one origin, realistic pace) for cancellation.
 * `garbled-1` is no simulated origin but one that sends malformed frames (`garbled-origin.ts`);
 * `full-1` accepts every connection and closes it at once, as an origin past four times its cap
 * does; `capped-1` is a simulated origin whose one connection this setup holds, so it
 * answers every other `503` with `retry-after`, as an origin at its cap does.
 */
import { type Server, type Socket, connect, createServer } from "node:net";
import type { AddressInfo } from "node:net";
import type { TestProject } from "vitest/node";
import { type RunningOrigin, startOrigin } from "../../origin/server.ts";
import { createSimEngine } from "../../origin/sim/engine.ts";
import { startGarbledOrigin } from "./garbled-origin.ts";
import { startAlertReceiver } from "./alert-receiver.ts";
import { CREDENTIAL_ORIGIN_TOKEN, type TestOrigin } from "./provided-context.ts";

/** Engine seed shared by every origin, so the same request gives the same bytes anywhere. */
export const SIM_SEED = 7;

const ORIGINS: {
  id: string;
  region: string;
  timeScale: number;
  accessToken?: string;
  maxNumSeqs?: number;
}[] = [
  { id: "eu-1", region: "eu", timeScale: 0 },
  { id: "eu-2", region: "eu", timeScale: 0 },
  { id: "us-1", region: "us", timeScale: 0 },
  { id: "faulty-1", region: "faulty", timeScale: 0 },
  { id: "faulty-2", region: "faulty", timeScale: 0 },
  // About 20 ms per token: a long stream is still running when a test cancels it.
  { id: "slow-1", region: "slow", timeScale: 5 },
  // The batcher's own tests address these directly (no region in the shared config), so
  // their call counts are theirs alone.
  { id: "batch-1", region: "batching", timeScale: 5 },
  { id: "batch-2", region: "batching", timeScale: 5 },
  { id: "edge-batch-1", region: "edge-batching", timeScale: 5 },
  { id: "edge-batch-2", region: "edge-batching", timeScale: 5 },
  // The Batcher shard tests address it in configs of their own.
  { id: "shards-1", region: "batching", timeScale: 0 },
  // Runs two sequences at once: the Batcher's backpressure tests fill it.
  { id: "batch-narrow", region: "batching", timeScale: 5, maxNumSeqs: 2 },
  // Metering tests inject faults into these and address them directly, in configs of their own.
  { id: "meter-1", region: "metering", timeScale: 0 },
  // The breaker tests break these and address them directly, in configs of their own.
  { id: "breaker-1", region: "breakers", timeScale: 0 },
  { id: "breaker-2", region: "breakers", timeScale: 0 },
  { id: "breaker-3", region: "breakers", timeScale: 0 },
  // The canary tests break the first and address both in configs of their own.
  { id: "canary-1", region: "canaries", timeScale: 0 },
  { id: "canary-2", region: "canaries", timeScale: 0 },
  // Demands a bearer token; the credential tests address it in configs of their own.
  {
    id: "credential-1",
    region: "credentials",
    timeScale: 0,
    accessToken: CREDENTIAL_ORIGIN_TOKEN,
  },
  { id: "meter-slow-1", region: "metering", timeScale: 5 },
  // The routing tests address these in configs of their own; their caches are theirs.
  { id: "route-1", region: "routing", timeScale: 0 },
  { id: "route-2", region: "routing", timeScale: 0 },
  { id: "route-3", region: "routing", timeScale: 0 },
];

/** Builds the edge configuration for the started origins. */
export function testConfig(origins: readonly TestOrigin[]): string {
  const regions = [
    { id: "eu", continents: ["EU", "AF"], countries: ["GB"], colos: [] as string[] },
    { id: "us", continents: ["NA", "SA"], countries: [] as string[], colos: ["SIN"] },
    { id: "faulty", continents: [] as string[], countries: [] as string[], colos: [] as string[] },
    { id: "slow", continents: [] as string[], countries: [] as string[], colos: [] as string[] },
  ];
  return JSON.stringify({
    models: [
      { id: "warmgate-sim-8b", max_model_len: 32768, owned_by: "warmgate", aliases: ["fast"] },
      { id: "warmgate-sim-70b", max_model_len: 8192, owned_by: "warmgate" },
    ],
    regions: regions.map((region) => ({
      ...region,
      origins: origins
        .filter((origin) => origin.region === region.id)
        .map((origin) => ({ id: origin.id, url: origin.url })),
    })),
    default_region: "eu",
    limits: { first_byte_timeout_ms: 3_000, request_timeout_ms: 60_000, retry_budget: 2 },
    // Tests that break origins on purpose must not open breakers for the tests after them;
    // the breakers' own tests use configs of their own.
    breakers: { enabled: false },
    // Soft-budget alert retries come quickly, so their tests wait little.
    alerts: { retry_base_ms: 50, max_attempts: 4 },
  });
}

/** Starts the origins; the returned function stops them. */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const running: RunningOrigin[] = [];
  const origins: TestOrigin[] = [];
  for (const spec of ORIGINS) {
    const origin = await startOrigin({
      engine: createSimEngine({
        seed: SIM_SEED,
        timeScale: spec.timeScale,
        deterministic: true,
        ...(spec.maxNumSeqs !== undefined && { maxNumSeqs: spec.maxNumSeqs }),
      }),
      originId: spec.id,
      region: spec.region,
      port: 0,
      ...(spec.accessToken !== undefined && { accessToken: spec.accessToken }),
    });
    running.push(origin);
    origins.push({ id: spec.id, region: spec.region, url: origin.url });
  }
  // Its tests address it directly, in configs of their own.
  const garbled = await startGarbledOrigin("garbled-1");
  origins.push({ id: "garbled-1", region: "garbled", url: garbled.url });
  const full = await startFullOrigin();
  origins.push({ id: "full-1", region: "full", url: full.url });
  const capped = await startCappedOrigin();
  running.push(capped.origin);
  origins.push({ id: "capped-1", region: "capped", url: capped.origin.url });
  const receiver = await startAlertReceiver();
  project.provide("alertReceiver", receiver.url);
  project.provide("testOrigins", origins);
  project.provide("warmgateConfig", testConfig(origins));
  return async () => {
    receiver.server.closeAllConnections();
    await new Promise((resolve) => receiver.server.close(resolve));
    await new Promise((resolve) => full.server.close(resolve));
    capped.held.destroy();
    garbled.server.closeAllConnections();
    await new Promise((resolve) => garbled.server.close(resolve));
    await Promise.all(running.map((origin) => origin.close()));
  };
}

/**
 * A simulated origin that serves one connection at once, held open here with no request:
 * every connection the edge opens is over its cap. Its timeouts outlast any test run.
 */
async function startCappedOrigin(): Promise<{ origin: RunningOrigin; held: Socket }> {
  const hour = 3_600_000;
  const origin = await startOrigin({
    engine: createSimEngine({ seed: SIM_SEED, timeScale: 0, deterministic: true }),
    originId: "capped-1",
    region: "capped",
    port: 0,
    maxConnections: 1,
    headersTimeoutMs: hour,
    requestTimeoutMs: hour,
  });
  const held = connect({ port: origin.port, host: "127.0.0.1" });
  await new Promise<void>((resolve, reject) => {
    held.once("connect", resolve);
    held.once("error", reject);
  });
  held.on("error", () => {});
  return { origin, held };
}

/** Accepts every connection and closes it unanswered, as Node past `maxConnections` does. */
async function startFullOrigin(): Promise<{ server: Server; url: string }> {
  const server = createServer((socket) => socket.destroy());
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

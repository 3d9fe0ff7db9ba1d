/**
 * The simulated origins as workers tests reach them: their URLs, their injected faults and
 * counts, and the edge called with a configuration of the test's own.
 */
import { env } from "cloudflare:workers";
import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { expect, inject } from "vitest";
import app from "../../functions/index.ts";
import { metricValue } from "./edge-requests.ts";
import { TEST_ADMIN_TOKEN } from "./provided-context.ts";

/** The URL of a running test origin. */
export function originUrl(id: string): string {
  const origin = inject("testOrigins").find((o) => o.id === id);
  if (origin === undefined) throw new Error(`${id} is not running`);
  return origin.url;
}

/** Sets an origin's injected faults; null clears them. */
export async function setFaults(id: string, faults: Record<string, unknown> | null) {
  const res = await fetch(`${originUrl(id)}/admin/faults`, {
    method: faults === null ? "DELETE" : "PUT",
    headers: { "content-type": "application/json" },
    ...(faults !== null && { body: JSON.stringify(faults) }),
  });
  expect(res.ok).toBe(true);
  await res.arrayBuffer();
}

/** How many faults of a kind an origin has injected. */
export async function injected(id: string, kind: string): Promise<number> {
  const text = await (await fetch(`${originUrl(id)}/metrics`)).text();
  return metricValue(text, "warmgate_origin_fault_injections_total", `kind="${kind}"`);
}

/** The edge's answer to `request` under `config` (and extra secrets), read whole. */
export async function sendWith(
  config: string,
  request: Request,
  secrets: Record<string, string> = {},
  /** Given, the request's background work (its settlement) is left here to wait for. */
  background?: Promise<void>[],
): Promise<Response> {
  const ctx = createExecutionContext();
  const response = await app.fetch(request, { ...env, ...secrets, WARMGATE_CONFIG: config }, ctx);
  // Read the body before waiting: settlement runs when the stream ends.
  const body = await response.arrayBuffer();
  if (background === undefined) await waitOnExecutionContext(ctx);
  else background.push(waitOnExecutionContext(ctx));
  return new Response(body, response);
}

/** An admin API request, with a JSON body when given one. */
export function adminRequest(path: string, body?: unknown): Request {
  return new Request(`https://edge.test${path}`, {
    method: body === undefined ? "GET" : "POST",
    headers: {
      authorization: `Bearer ${TEST_ADMIN_TOKEN}`,
      ...(body !== undefined && { "content-type": "application/json" }),
    },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  });
}

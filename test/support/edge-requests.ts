/**
 * Request builders and readers shared by the edge's workers tests (runtime-neutral: no
 * `cloudflare:*` imports, so both tsconfig projects can type-check it).
 */
import { TEST_API_KEY } from "./provided-context.ts";

/** Base URL the tests address the edge with (the host is not used for routing). */
export const EDGE = "http://edge.test";

/** A small, deterministic chat request. */
export function chatBody(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    model: "warmgate-sim-8b",
    messages: [{ role: "user", content: "Say something short about the sea." }],
    max_tokens: 16,
    seed: 1,
    temperature: 0,
    ...overrides,
  };
}

/** The body of `POST /v1/batches` for a chat completions file, with `extra` fields (metadata). */
export function batchCreateBody(fileId: string, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({
    input_file_id: fileId,
    endpoint: "/v1/chat/completions",
    completion_window: "24h",
    ...extra,
  });
}

/** Options of {@link edgeRequest}. */
export interface EdgeRequestOptions {
  method?: string;
  body?: unknown;
  /** Raw body text (wins over `body`). */
  text?: string;
  headers?: Record<string, string>;
  /** Region to try first (`x-warmgate-region`). */
  region?: string;
  /** Leave out the Authorization header. */
  anonymous?: boolean;
}

/** Builds a request to the edge with the test API key. */
export function edgeRequest(path: string, options: EdgeRequestOptions = {}): Request {
  const headers = new Headers(options.headers);
  if (!options.anonymous && !headers.has("authorization")) {
    headers.set("authorization", `Bearer ${TEST_API_KEY}`);
  }
  if (options.region !== undefined) headers.set("x-warmgate-region", options.region);
  let body: string | undefined = options.text;
  if (body === undefined && options.body !== undefined) body = JSON.stringify(options.body);
  if (body !== undefined && !headers.has("content-type")) {
    headers.set("content-type", "application/json");
  }
  return new Request(`${EDGE}${path}`, {
    method: options.method ?? (body ? "POST" : "GET"),
    headers,
    body,
  });
}

/** The OpenAI error body of a response. */
export interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

/** Reads a response body as bytes. */
export async function bytesOf(response: Response): Promise<Uint8Array> {
  return new Uint8Array(await response.arrayBuffer());
}

/** Reads a Prometheus sample (`name{labels} value` or `name value`) from `/metrics` text. */
export function metricValue(text: string, name: string, labels = ""): number {
  const prefix = labels === "" ? `${name} ` : `${name}{${labels}} `;
  const line = text.split("\n").find((l) => l.startsWith(prefix));
  return line === undefined ? 0 : Number(line.slice(prefix.length));
}

/** The last event of an SSE stream, parsed, and whether the stream said `[DONE]`. */
export function lastEvent(text: string): { last: unknown; done: boolean } {
  const events = text.split("\n\n").filter((e) => e !== "");
  return {
    last: JSON.parse((events.at(-1) ?? "").replace(/^data: /, "")),
    done: text.includes("[DONE]"),
  };
}

/**
 * The exact pico-dollars an amount of the API stands for (`cost_usd`, or the number of an
 * `x-warmgate-cost-usd` header): its twelve decimal places, exact for a test's small amounts.
 */
export function usdPicos(usd: number): bigint {
  return BigInt(usd.toFixed(12).replace(".", ""));
}

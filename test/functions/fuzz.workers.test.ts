import { exports } from "cloudflare:workers";
import * as fc from "fast-check";
import { describe, expect, it } from "vitest";
import { TEST_ADMIN_TOKEN, TEST_API_KEY } from "../support/provided-context.ts";

// Random bodies and headers on every route: each answer is below 500, and every 4xx is
// OpenAI's error shape. Bodies lean on the routes' own field names, so the validators'
// deeper branches are reached, not just the JSON parser.

const FIELDS = [
  "model",
  "messages",
  "prompt",
  "max_tokens",
  "max_completion_tokens",
  "n",
  "best_of",
  "stream",
  "stream_options",
  "temperature",
  "tools",
  "tool_choice",
  "response_format",
  "user",
  "logprobs",
  "stop",
  "seed",
  "name",
  "limits",
  "allowed_origins",
  "models",
  "tier",
  "expires_at",
  "allow_region_override",
  "grace_seconds",
  "ttl_seconds",
  "role",
  "content",
  "input",
  "instructions",
  "max_output_tokens",
  "text",
  "include",
  "store",
  "previous_response_id",
  "dimensions",
  "encoding_format",
];

const fieldValue = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.constantFrom(
    "warmgate-sim-8b",
    "warmgate-sim-embed",
    "fast",
    "user",
    "assistant",
    "system",
    "tool",
    "",
  ),
  fc.array(
    fc.record(
      {
        type: fc.constantFrom("function", "message", "function_call", "web_search", "x"),
        name: fc.oneof(fc.constantFrom("get_weather", ""), fc.jsonValue({ maxDepth: 1 })),
        role: fc.constantFrom("user", "assistant", "x"),
        content: fc.jsonValue({ maxDepth: 2 }),
        parameters: fc.jsonValue({ maxDepth: 2 }),
      },
      { requiredKeys: [] },
    ),
    { maxLength: 3 },
  ),
  fc.array(
    fc.record(
      {
        role: fc.constantFrom("user", "system", "assistant", "tool", "x"),
        content: fc.jsonValue({ maxDepth: 2 }),
      },
      { requiredKeys: [] },
    ),
    { maxLength: 3 },
  ),
  fc.integer({ min: -5, max: 5_000_000 }),
);

const bodyText = fc.oneof(
  fc
    .dictionary(fc.constantFrom(...FIELDS), fieldValue, { maxKeys: 6 })
    .map((o) => JSON.stringify(o)),
  fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.stringify(v)),
  fc.string({ maxLength: 64 }),
  fc.constant(""),
);

const contentType = fc.option(
  fc.oneof(
    fc.constantFrom(
      "application/json",
      "application/json; charset=utf-8",
      "text/plain",
      "application/x-www-form-urlencoded",
    ),
    fc.string({ maxLength: 20 }).filter((s) => /^[\x21-\x7e]*$/.test(s)),
  ),
  { nil: undefined },
);

const printable = fc.string({ maxLength: 40 }).filter((s) => /^[\x20-\x7e]*$/.test(s));

const userBearer = fc.option(
  fc.oneof(
    fc.constant(`Bearer ${TEST_API_KEY}`),
    fc.constant(`Bearer ${TEST_API_KEY.slice(0, -2)}xx`),
    fc.constant("Bearer a.b.c"),
    printable.map((s) => `Bearer ${s}`),
    printable,
  ),
  { nil: undefined },
);

const adminBearer = fc.option(
  fc.oneof(
    fc.constant(`Bearer ${TEST_ADMIN_TOKEN}`),
    printable.map((s) => `Bearer ${s}`),
  ),
  { nil: undefined },
);

const extraHeaders = fc.record(
  {
    "x-warmgate-region": fc.oneof(fc.constantFrom("eu", "us", "nowhere"), printable),
    origin: fc.constantFrom("https://app.example", "null", "https://evil.example"),
    "x-client-request-id": printable,
  },
  { requiredKeys: [] },
);

function isOpenAIError(body: unknown): boolean {
  if (typeof body !== "object" || body === null) return false;
  const error = (body as { error?: Record<string, unknown> }).error;
  return (
    typeof error === "object" &&
    error !== null &&
    typeof error.message === "string" &&
    typeof error.type === "string" &&
    "param" in error &&
    "code" in error
  );
}

async function expectSound(request: Request): Promise<void> {
  const res = await exports.default.fetch(request);
  const text = await res.text();
  expect(res.status, `${request.method} ${request.url}: ${text.slice(0, 300)}`).toBeLessThan(500);
  let parsed: unknown = null;
  try {
    parsed = JSON.parse(text);
  } catch {
    // Not JSON: an error answer then fails below.
  }
  const shaped = res.status < 400 || isOpenAIError(parsed);
  expect(shaped, `${res.status} ${text.slice(0, 300)}`).toBe(true);
}

function routeRequest(
  method: string,
  path: string,
  body: string,
  type: string | undefined,
  authorization: string | undefined,
  extra: Record<string, string>,
): Request {
  const headers = new Headers(extra);
  if (type !== undefined) headers.set("content-type", type);
  if (authorization !== undefined) headers.set("authorization", authorization);
  const withBody = method !== "GET" && method !== "HEAD";
  return new Request(`http://edge.test${path}`, {
    method,
    headers,
    ...(withBody ? { body } : {}),
  });
}

const ROUTES: { method: string; path: fc.Arbitrary<string>; admin: boolean }[] = [
  { method: "POST", path: fc.constant("/v1/chat/completions"), admin: false },
  { method: "POST", path: fc.constant("/v1/completions"), admin: false },
  { method: "POST", path: fc.constant("/v1/responses"), admin: false },
  { method: "POST", path: fc.constant("/v1/embeddings"), admin: false },
  {
    method: "GET",
    path: printable.map((s) => `/v1/responses/${encodeURIComponent(s)}`),
    admin: false,
  },
  { method: "POST", path: fc.constant("/v1/tokens"), admin: false },
  {
    method: "GET",
    path: fc.constantFrom("/v1/models", "/v1/models/warmgate-sim-8b", "/v1/models/nope"),
    admin: false,
  },
  {
    method: "GET",
    path: fc.oneof(
      fc.constantFrom("/v1/usage", "/v1/usage?from=2026-01-01&to=2026-02-30", "/v1/usage?user="),
      printable.map((s) => `/v1/usage/requests/${encodeURIComponent(s)}`),
    ),
    admin: false,
  },
  { method: "POST", path: fc.constant("/admin/keys"), admin: true },
  {
    method: "PATCH",
    path: fc.oneof(
      fc.constant("/admin/keys/warmgatetestkey2"),
      printable.map((s) => `/admin/keys/${encodeURIComponent(s)}`),
    ),
    admin: true,
  },
  {
    method: "POST",
    path: printable.map((s) => `/admin/keys/${encodeURIComponent(s)}/rotate`),
    admin: true,
  },
  {
    method: "GET",
    path: fc.oneof(
      fc.constantFrom(
        "/admin/keys?limit=0",
        "/admin/keys?limit=5",
        "/admin/usage",
        "/admin/batchers/eu/warmgate-sim-8b",
      ),
      printable.map((s) => `/admin/batchers/${encodeURIComponent(s)}/x`),
    ),
    admin: true,
  },
];

describe("random bodies and headers on every route", () => {
  for (const route of ROUTES) {
    it(`answers ${route.method} ${route.admin ? "admin" : "API"} requests below 500 with OpenAI errors`, async () => {
      await expect(
        fc.assert(
          fc.asyncProperty(
            route.path,
            bodyText,
            contentType,
            route.admin ? adminBearer : userBearer,
            extraHeaders,
            async (path, body, type, authorization, extra) => {
              await expectSound(routeRequest(route.method, path, body, type, authorization, extra));
            },
          ),
          { numRuns: 100, seed: 42 },
        ),
      ).resolves.toBeUndefined();
    });
  }
});

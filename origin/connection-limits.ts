/**
 * The limits an origin's HTTP server keeps (docs/configuration.md, "The origin"): how many
 * connections may be open, and how long a client has to send its request, so a flood of
 * connections or a slow client (slowloris) cannot starve the edge's own calls.
 */
import type { ServerOptions } from "node:http";

/** Default most open connections. */
export const DEFAULT_MAX_CONNECTIONS = 1024;
/** Default milliseconds to receive a request's headers. */
export const DEFAULT_HEADERS_TIMEOUT_MS = 10_000;
/** Default milliseconds to receive a whole request; a batch envelope is a few MB at most. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;
/** Default idle keep-alive: longer than common load balancers' 60 s, so they close first. */
export const DEFAULT_KEEP_ALIVE_TIMEOUT_MS = 65_000;

/** An origin's connection limits; each has a default. */
export interface ConnectionLimits {
  /** Most open connections; one more is closed at once (default 1024). */
  maxConnections?: number;
  /** Milliseconds a client has to send a request's headers (default 10 s). */
  headersTimeoutMs?: number;
  /**
   * Milliseconds a client has to send a whole request, headers and body (default 60 s), at
   * least `headersTimeoutMs`. The answer may stream for as long as it takes.
   */
  requestTimeoutMs?: number;
  /** Milliseconds an idle keep-alive connection stays open (default 65 s). */
  keepAliveTimeoutMs?: number;
}

/** Why these limits cannot hold, or null when they can. */
export function connectionLimitsProblem(limits: ConnectionLimits): string | null {
  const headers = limits.headersTimeoutMs ?? DEFAULT_HEADERS_TIMEOUT_MS;
  const request = limits.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  return headers > request
    ? `the request timeout (${request} ms) must be at least the headers timeout (${headers} ms)`
    : null;
}

/** The Node `http.createServer` options that enforce the timeouts. */
export function timeoutServerOptions(limits: ConnectionLimits): ServerOptions {
  const headersTimeout = limits.headersTimeoutMs ?? DEFAULT_HEADERS_TIMEOUT_MS;
  return {
    keepAliveTimeout: limits.keepAliveTimeoutMs ?? DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
    // Node answers 408 and closes a connection whose request headers, or whole request, did
    // not arrive in time; it stops counting once the request is in, so answers stream on.
    headersTimeout,
    requestTimeout: limits.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
    // Node looks for late requests every 30 s by default, which would let a slow client
    // hold its connection up to 30 s past the timeout.
    connectionsCheckingInterval: Math.max(1, Math.min(1_000, Math.floor(headersTimeout / 4))),
  };
}

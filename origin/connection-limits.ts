/**
 * The limits an origin's HTTP server keeps (docs/configuration.md, "The origin"): how many
 * connections may be open, and how long a client has to send its request, so a flood of
 * connections or a slow client (slowloris) cannot starve the edge's own calls. An origin at
 * its cap answers `503` with `retry-after`: busy, not gone (origin/PROTOCOL.md, "Connections").
 */
import type {
  IncomingMessage,
  RequestListener,
  Server,
  ServerOptions,
  ServerResponse,
} from "node:http";
import type { Socket } from "node:net";
import { openAIErrorBody } from "../contracts/errors.ts";

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
  /**
   * Most connections served at once (default 1024); one more is answered `503` with
   * `retry-after` and closed, and past four times this many one is closed unanswered.
   */
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

/**
 * Past this many times the cap a new connection is closed unanswered: a busy answer holds a
 * connection for a round trip, so the band is wide, and still bounds the file descriptors
 * (the process needs this many times `maxConnections` of them).
 */
export const CLOSE_PAST_CAP_TIMES = 4;
/** Seconds a client over the cap is asked to wait (`retry-after`). */
export const BUSY_RETRY_AFTER_S = 1;
/** Milliseconds a connection over the cap may stay idle before it is closed unanswered. */
export const BUSY_IDLE_MS = 2_000;
/** Most request body bytes read (and dropped) before the busy answer; more closes the socket. */
export const BUSY_DRAIN_BYTES = 16 * 1024 * 1024;

/** Connections turned away: answered busy (`503`), or closed unanswered. */
export interface RefusedConnections {
  busy: number;
  closed: number;
}

/**
 * Holds `server` to `limit` connections served at once. One over the cap is accepted and its
 * request answered `503` with `retry-after` and `connection: close`, so a client (the edge)
 * tells an origin at its cap from one that is gone. The request's body is read first (and
 * dropped): a socket closed with unread bytes is reset, and its client would see no answer.
 * Past four times the cap, for a client idle for {@link BUSY_IDLE_MS}, or for a body over
 * {@link BUSY_DRAIN_BYTES}, the connection is closed unanswered, so a flood of connections
 * holds a bounded number of file descriptors. Wrap the server's request listener with the
 * returned function.
 */
export function capConnections(
  server: Server,
  limit: number,
  refused: RefusedConnections,
): (listener: RequestListener) => RequestListener {
  let open = 0;
  const overCap = new WeakSet<Socket>();
  server.maxConnections = CLOSE_PAST_CAP_TIMES * limit;
  server.on("drop", () => refused.closed++);
  server.prependListener("connection", (socket: Socket) => {
    open++;
    socket.once("close", () => open--);
    if (open <= limit) return;
    overCap.add(socket);
    socket.setTimeout(BUSY_IDLE_MS, () => {
      refused.closed++;
      socket.destroy();
    });
  });
  return (listener) => (request, response) => {
    if (!overCap.has(request.socket)) {
      listener(request, response);
      return;
    }
    answerBusy(request, response, limit, refused);
  };
}

function answerBusy(
  request: IncomingMessage,
  response: ServerResponse,
  limit: number,
  refused: RefusedConnections,
): void {
  let read = 0;
  request.on("data", (chunk: Buffer) => {
    read += chunk.byteLength;
    if (read <= BUSY_DRAIN_BYTES) return;
    refused.closed++;
    request.socket.destroy();
  });
  request.once("end", () => {
    refused.busy++;
    const body = JSON.stringify(
      openAIErrorBody(
        `The origin serves ${limit} connections at once and has them all open. Please try again in ${BUSY_RETRY_AFTER_S}s.`,
        "server_error",
        "too_many_connections",
      ),
    );
    response.writeHead(503, {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(body),
      "retry-after": String(BUSY_RETRY_AFTER_S),
      connection: "close",
    });
    response.end(body);
  });
}

/**
 * How one attempt reaches an origin (docs/edge.md, "Delivery"): an {@link ItemOpener} opens
 * the request's item at a candidate, straight to the origin as a batch of one
 * ({@link directOpener}) or through the region's `Batcher` (`batcher.ts`); both answer with
 * an `OpenItem` (`item.ts`) or a failure, and the failover loop (`failover.ts`) drives them.
 */
import type { ApiError } from "../../contracts/errors.ts";
import { type CredentialRing, credentialValues } from "../../contracts/credentials.ts";
import type { DeliveryMode } from "../../contracts/delivery.ts";
import type { ItemPath } from "../../contracts/protocol/schema.ts";
import type { RegionOrigin } from "./origin-pool.ts";
import { type ItemAttempt, openItem } from "./direct.ts";

/** One attempt at serving the request, as an opener receives it. */
export interface AttemptRequest {
  requestId: string;
  /** Item id for this attempt: the request id, suffixed for retries (unique per attempt). */
  attemptId: string;
  path: ItemPath;
  body: string;
  headers: Record<string, string>;
  firstByteTimeoutMs: number;
  /** How the client gets its answer: streamed as it comes, or whole once it ended. */
  delivery: DeliveryMode;
  /** Sent straight to an origin, a stream whose body the runtime pipes (`raw-item.ts`). */
  piped?: boolean;
  itemTimeoutMs: number;
  /** Origins that already failed this request. */
  avoidOrigins: readonly string[];
  /** For an attempt sent straight to an origin: told once it is under way (see `direct.ts`). */
  onStart?: (giveUp: () => void) => void;
  /** For an attempt sent straight to an origin: its HEAD is late while the origin is idle. */
  onSlowHead?: () => void;
  /** How long the origin may send nothing before it counts as frozen. */
  silenceMs?: number;
  /** Where the origins' credentials are (the Worker's secrets). */
  secrets: object;
  /** Aborts when the client goes away (see `direct.ts`; a Batcher's attempt hears it apart). */
  clientSignal?: AbortSignal;
}

/** An attempt's outcome: an open item, a failure worth another candidate, or a final refusal. */
export type DispatchAttempt =
  | ItemAttempt
  /** Refused for a reason no other origin changes (a full queue): answered as it is. */
  | { kind: "refused"; error: ApiError };

/** Opens the request's item for one candidate; never rejects. */
export type ItemOpener = (
  candidate: RegionOrigin,
  request: AttemptRequest,
) => Promise<DispatchAttempt>;

/** The unbatched path: the candidate origin, a batch of one, on the isolate's credentials. */
export const directOpener =
  (ring: CredentialRing): ItemOpener =>
  (candidate, request) =>
    openItem(candidate.origin, {
      requestId: request.attemptId,
      credentials: credentialValues(request.secrets, candidate.origin.credentials),
      ring,
      path: request.path,
      body: request.body,
      headers: request.headers,
      firstByteTimeoutMs: request.firstByteTimeoutMs,
      delivery: request.delivery,
      piped: request.piped === true,
      itemTimeoutMs: request.itemTimeoutMs,
      ...(request.onStart !== undefined && { onStart: request.onStart }),
      ...(request.onSlowHead !== undefined && { onSlowHead: request.onSlowHead }),
      ...(request.silenceMs !== undefined && { silenceMs: request.silenceMs }),
      ...(request.clientSignal !== undefined && { clientSignal: request.clientSignal }),
    });

/**
 * The Hono environment shared by every route and middleware of the edge.
 * See docs/edge.md.
 */
import type { DeliveryMode } from "../contracts/delivery.ts";
import type { AdmitOk } from "../durable-objects/key-account/types.ts";
import type { ResolvedConfig } from "../contracts/config/gateway.ts";
import type { ModelConfig } from "../contracts/config/models.ts";
import type { EdgeState } from "./edge-state.ts";
import type { Credential } from "./accounts/account-client.ts";
import type { ChatCompletionRequest, CompletionRequest } from "./request/openai-schemas.ts";
import type { EmbeddingsRequest, ResponsesRequest } from "./request/responses-schemas.ts";
import type { Settlement } from "./accounts/settlement.ts";
import type { CacheState } from "./cache/state.ts";

/** Who is calling, as authentication established it. */
export interface Caller {
  /** An API key, or a browser token minted with one. */
  kind: Credential["kind"];
  /** A stable, non-secret name for the key (never the key itself): for logs and metering. */
  keyId: string;
}

/** A validated completion body with the exact text it came as. */
export type CompletionBody =
  | { kind: "chat"; body: ChatCompletionRequest; text: string }
  | { kind: "completion"; body: CompletionRequest; text: string }
  | { kind: "responses"; body: ResponsesRequest; text: string }
  | { kind: "embeddings"; body: EmbeddingsRequest; text: string };

/** What the edge decided about a completion before dispatching it. */
export interface CompletionPlan {
  /** The first model to try (`models[0]`). */
  model: ModelConfig;
  /** Every model that may serve it, in order: one, or an alias's list whose window fits. */
  models: ModelConfig[];
  /** Estimated prompt tokens of one sequence, the longest (conservative, see request/token-estimate.ts). */
  promptTokens: number;
  /** Estimated prompt tokens of every prompt together (a completion's prompt list). */
  totalPromptTokens: number;
  /** Sequences generated: `n` (or `best_of`) for every prompt. */
  sequences: number;
  /** Completion tokens of one sequence (`max_completion_tokens`/`max_tokens`), null when unbounded. */
  maxTokens: number | null;
  /** Streamed as it comes (`stream: true`) or whole once it ended: decided here, once. */
  delivery: DeliveryMode;
}

/** The one Hono environment: Worker bindings plus per-request variables. */
export type AppEnv = {
  Bindings: Env;
  Variables: {
    /** What this isolate remembers between requests (set first, on every request). */
    edge: EdgeState;
    /** `x-request-id` of this request, echoed on every response. */
    requestId: string;
    /** The validated gateway configuration. */
    config: ResolvedConfig;
    /** Runs completion hooks once when the request ends (metering, limit release). */
    settlement: Settlement;
    /** Set by authentication on `/v1/*`. */
    caller: Caller;
    /** The accepted credential, set with `caller` (holds secrets' hashes: never log it). */
    credential: Credential;
    /** The browser Origin that may read this response (CORS), once the key allowed it. */
    allowedOrigin: string | null;
    /** Set when the key's account admitted a completion (its reservation and limits). */
    admission: AdmitOk;
    /** Set when the completion was admitted under the isolate's lease of its key. */
    leased: { admittedAt: number; endUser: string | null };
    /** Set by the body validator on completion routes. */
    completion: CompletionBody;
    /** Set once the model is resolved and the context window checked. */
    plan: CompletionPlan;
    /** What the response cache decided and did, set on completion routes before admission. */
    cache: CacheState;
  };
};

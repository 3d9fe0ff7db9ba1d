/**
 * Everything one edge isolate remembers between requests, in one object (docs/edge.md,
 * "Isolate state"): built once by the entry from the bindings, set on `c.var.edge`, and
 * passed down to what needs it. All of it is a cache or a queue that a new isolate rebuilds.
 */
import { EdgeBreakers } from "./health/breakers.ts";
import { BrowserTokenMemo } from "./accounts/browser-token.ts";
import { CanaryCopies } from "./health/canaries.ts";
import { Dispatcher } from "./delivery/dispatcher.ts";
import { type AccountSettleQueue, accountSettleQueue } from "./accounts/account-client.ts";
import { ApiKeyMemo } from "./accounts/keys.ts";
import { AccountLeases } from "./accounts/leases.ts";
import { AnswerCounts } from "./observability/answer-counts.ts";
import { KeyRequests } from "./accounts/key-requests.ts";

/** The bindings an isolate's state talks to. */
export type EdgeBindings = Pick<Env, "ORIGIN_BREAKERS" | "CANARIES" | "ANSWER_TALLY">;

/** One isolate's state; see the file header. */
export class EdgeState {
  /** The copy of the origins' breakers, and the direct attempts watching them. */
  readonly breakers: EdgeBreakers;
  /** The copies of the models' canaries. */
  readonly canaries: CanaryCopies;
  /**
   * Sends completions to origins: holds the origin pool and its health view, the retry
   * budget, the credential ring and what the isolate remembers of its Batchers.
   */
  readonly dispatcher: Dispatcher;
  /** Settlements until their key's account holds them durably. */
  readonly settlements: AccountSettleQueue = accountSettleQueue();
  /** API keys already checked, and the derived check keys. */
  readonly apiKeys = new ApiKeyMemo();
  /** Browser-token secrets and CORS preflight answers. */
  readonly browserTokens = new BrowserTokenMemo();
  /** The leases of the keys' accounts this isolate admits under. */
  readonly leases = new AccountLeases();
  /** Each key's requests in flight here, for a refused one to wait on (concurrency). */
  readonly keyRequests = new KeyRequests();
  /** Every answer this isolate gave, counted until its next push to the tally objects. */
  readonly answers: AnswerCounts;

  constructor(bindings: EdgeBindings) {
    this.breakers = new EdgeBreakers(bindings.ORIGIN_BREAKERS);
    this.canaries = new CanaryCopies(bindings.CANARIES);
    this.dispatcher = new Dispatcher(this.breakers, this.canaries);
    this.answers = new AnswerCounts(bindings.ANSWER_TALLY);
  }
}

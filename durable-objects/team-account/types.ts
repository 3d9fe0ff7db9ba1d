/**
 * The contract of a team's `TeamAccount` (docs/key-account.md, "Teams"): the team record,
 * what the admin API changes, and the allowance a member key's account leases from it.
 */
import type { MetadataValue } from "../../contracts/tags.ts";
import type { AdmissionRefusal, Limits } from "../key-account/types.ts";
import type { BudgetStatus, Budgets } from "../key-account/budget-types.ts";
import type { AlertOutcome } from "../key-account/metrics.ts";

/** A team as its TeamAccount holds it (times in epoch ms, money in micro-dollars). */
export interface TeamRecord {
  id: string;
  name: string;
  limits: Limits;
  budgets: Budgets;
  /** Models its keys may call, or null for every model. */
  models: string[] | null;
  tags: string[];
  metadata: Record<string, MetadataValue>;
  /** Where its soft-budget alerts go; null: the configuration's `alerts.webhook_url`. */
  alertWebhookUrl: string | null;
  createdAt: number;
  updatedAt: number;
  /** Increases with every change, so copies of the record (the directory) keep the newest. */
  version: number;
}

/** What `create` needs. */
export type TeamCreateInput = Omit<TeamRecord, "createdAt" | "updatedAt" | "version"> & {
  now: number;
};

/** A partial change; `models: null` allows every model, `budgets.periods` replaces the list. */
export interface TeamUpdateInput {
  name?: string;
  limits?: Partial<Limits>;
  budgets?: Partial<Budgets>;
  models?: string[] | null;
  tags?: string[];
  metadata?: Record<string, MetadataValue>;
  alertWebhookUrl?: string | null;
  now: number;
}

/** An allowance in each dimension a team limits. */
export interface TeamAllowance {
  requests: number;
  tokens: number;
  /** Money in pico-dollars (ignored when the team has no budget). */
  picos: bigint;
  slots: number;
}

/**
 * One call of a member key's account: what it settled and gives back since its last call,
 * what it must have now (`need`: refused unless all of it fits) and would like to hold.
 * Calls carry a sequence number: a repeated call is answered as the first time.
 */
export interface TeamLeaseCall {
  keyId: string;
  seq: number;
  /** Money settled by the key's requests since its last call (pico-dollars). */
  settledPicos: bigint;
  giveBack: TeamAllowance;
  need: TeamAllowance | null;
  want: TeamAllowance;
  now?: number;
}

/** A team's refusal, as the key's account answers it (scope `team`). */
export type TeamRefusal = Extract<
  AdmissionRefusal,
  { code: "rate_limit_exceeded" | "insufficient_quota" }
>;

/** The answer to a lease call: what was added to the key's allowance, and the team's terms. */
export interface TeamLeaseAnswer {
  seq: number;
  /** Added to what the key holds (all zero when refused). */
  granted: TeamAllowance;
  /** Why `need` did not fit, or null. */
  refusal: TeamRefusal | null;
  /** Null when the team no longer exists: the key admits as if it had none. */
  terms: { models: string[] | null; budgeted: boolean } | null;
}

/** The team's alert counts, for `/metrics` (docs/metrics.md). */
export interface TeamMetrics {
  teamId: string;
  budgetAlerts: { period: string; outcome: AlertOutcome; count: number }[];
}

/** The team's state as `GET /admin/teams/{id}` shows it. */
export interface TeamView {
  record: TeamRecord;
  /** Each budget's window, its settled spend and what member keys hold, and its reset. */
  budgets: BudgetStatus[];
  /** Concurrency slots leased to member keys now. */
  slotsHeld: number;
}

// Secrets (`wrangler secret put`) and `.dev.vars` variables; `wrangler types` cannot see
// them, so they are declared here, once, for both views of the environment.
// See docs/edge.md.
interface SecretsEnv {
  /** Bearer token of the `/admin` API. */
  ADMIN_TOKEN?: string;
  /**
   * Signs API key checks and browser tokens. When unset, the admin token is used instead,
   * which ties every issued key to the admin token: set this in production.
   */
  TOKEN_SIGNING_SECRET?: string;
  /**
   * Signs soft-budget alerts (HMAC-SHA256, docs/key-account.md); receivers verify with it.
   * When unset, alerts are counted but not sent.
   */
  ALERT_SIGNING_SECRET?: string;
  /** Bearer token the edge presents to origins started with `--access-token`. */
  ORIGIN_TOKEN?: string;
  /** `local` for `wrangler dev` and `npm start` (in `.dev.vars`): origins may be on loopback. */
  WARMGATE_ENV?: string;
  /** Workers Analytics Engine dataset for per-request events; optional (wrangler.toml). */
  ANALYTICS?: AnalyticsEngineDataset;
  /**
   * Benchmarks only: milliseconds added before every call the edge makes to a key's account,
   * as if it lived on another continent. Unset (no delay) in production.
   */
  WARMGATE_ACCOUNT_DELAY_MS?: string;
}

interface Env extends SecretsEnv {}

declare namespace Cloudflare {
  interface Env extends SecretsEnv {}
}

// Secrets are not in wrangler.toml, so `wrangler types` cannot see them; declare them here.
interface Env {
  /** Comma-separated API keys accepted until per-key accounts exist (`wrangler secret put`). */
  WARMGATE_API_KEYS?: string;
}

declare namespace Cloudflare {
  interface Env {
    WARMGATE_API_KEYS?: string;
  }
}

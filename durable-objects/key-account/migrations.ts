/**
 * The key account's SQLite migrations, in order (docs/key-account.md, "Storage"): each
 * entry is one version, applied once and never edited; a change of schema is a new entry.
 */

/** The schema migrations, in order (version n is entry n - 1). */
export const KEY_ACCOUNT_MIGRATIONS: readonly string[] = [
  `CREATE TABLE key_record (
     singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
     id TEXT NOT NULL, name TEXT NOT NULL, status TEXT NOT NULL,
     rpm INTEGER NOT NULL, tpm INTEGER NOT NULL, concurrency INTEGER NOT NULL,
     allowed_origins TEXT NOT NULL, models TEXT, tier TEXT NOT NULL, expires_at INTEGER,
     created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, revoked_at INTEGER,
     version INTEGER NOT NULL);
   CREATE TABLE secrets (
     secret_hash TEXT PRIMARY KEY, created_at INTEGER NOT NULL, valid_until INTEGER);
   CREATE TABLE buckets (
     scope TEXT NOT NULL, kind TEXT NOT NULL, level REAL NOT NULL, updated_at INTEGER NOT NULL,
     PRIMARY KEY (scope, kind));
   CREATE TABLE reservations (
     request_id TEXT PRIMARY KEY, state TEXT NOT NULL, model TEXT NOT NULL,
     subject TEXT, subject_tpm INTEGER, end_user TEXT,
     reserved_tokens INTEGER NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
     closed_at INTEGER, outcome TEXT, prompt_tokens INTEGER, completion_tokens INTEGER);
   CREATE INDEX reservations_open ON reservations (state, expires_at);
   CREATE INDEX reservations_subject ON reservations (state, subject);
   CREATE INDEX reservations_closed ON reservations (closed_at);`,
  // Budgets, costs, the ledger and its rollups. Reservations become ledger rows and
  // rows closed before this migration count in the rollups with their tokens, at no cost.
  `ALTER TABLE key_record ADD COLUMN budget_day_micros INTEGER;
   ALTER TABLE key_record ADD COLUMN budget_month_micros INTEGER;
   ALTER TABLE key_record ADD COLUMN credit_micros INTEGER;
   ALTER TABLE reservations RENAME TO ledger;
   ALTER TABLE ledger ADD COLUMN day TEXT NOT NULL DEFAULT '';
   ALTER TABLE ledger ADD COLUMN cached_tokens INTEGER;
   ALTER TABLE ledger ADD COLUMN reserved_micros INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE ledger ADD COLUMN cost_micros INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE ledger ADD COLUMN candidates TEXT NOT NULL DEFAULT '[]';
   UPDATE ledger SET day = strftime('%Y-%m-%d', created_at / 1000, 'unixepoch'),
     cached_tokens = CASE WHEN prompt_tokens IS NULL THEN NULL ELSE 0 END;
   CREATE INDEX ledger_day ON ledger (day);
   CREATE TABLE usage_daily (
     day TEXT NOT NULL, model TEXT NOT NULL, requests INTEGER NOT NULL,
     prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
     completion_tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL,
     PRIMARY KEY (day, model));
   INSERT INTO usage_daily (day, model, requests, prompt_tokens, cached_tokens,
       completion_tokens, cost_micros)
     SELECT day, model, COUNT(*), COALESCE(SUM(prompt_tokens), 0), 0,
       COALESCE(SUM(completion_tokens), 0), 0
     FROM ledger WHERE state <> 'open' GROUP BY day, model;
   CREATE TABLE spend (
     period TEXT PRIMARY KEY, settled_micros INTEGER NOT NULL, reserved_micros INTEGER NOT NULL);`,
  `ALTER TABLE key_record ADD COLUMN allow_region_override INTEGER NOT NULL DEFAULT 0;`,
  `ALTER TABLE ledger ADD COLUMN attempts TEXT NOT NULL DEFAULT '[]';`,
  `CREATE TABLE metrics (name TEXT PRIMARY KEY, data TEXT NOT NULL);`,
  // Each secret's generation, which browser tokens name: a token ends with its secret.
  `ALTER TABLE secrets ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
   UPDATE secrets SET generation = rowid;`,
  // Amounts exact at any price: each amount's whole micro-dollars stay where they were, the
  // pico-dollars below one micro-dollar go beside them (see storedPicos); the metrics count
  // spend in pico-dollars.
  `ALTER TABLE ledger ADD COLUMN reserved_picos INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE ledger ADD COLUMN cost_picos INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE usage_daily ADD COLUMN cost_picos INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE spend ADD COLUMN settled_picos INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE spend ADD COLUMN reserved_picos INTEGER NOT NULL DEFAULT 0;
   UPDATE metrics SET data = json_remove(
       json_set(data, '$.spendPicos', json_extract(data, '$.spendMicros') * 1000000),
       '$.spendMicros')
     WHERE name <> 'errors';`,
  // Leased allowances: each isolate's lease, kept until its requests are all accounted for.
  `CREATE TABLE leases (
     lease_id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL, day TEXT NOT NULL, state TEXT NOT NULL,
     created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, requests INTEGER NOT NULL,
     tokens INTEGER NOT NULL, ids INTEGER NOT NULL, budgeted INTEGER NOT NULL,
     picos_micros INTEGER NOT NULL, picos_picos INTEGER NOT NULL, reserved_micros INTEGER NOT NULL,
     reserved_picos INTEGER NOT NULL, slots INTEGER NOT NULL, ids_used INTEGER NOT NULL,
     models TEXT NOT NULL, ended_at INTEGER);`,
  // Blocking: a key may be blocked and unblocked (status 'blocked'), unlike revoked.
  `ALTER TABLE key_record ADD COLUMN blocked_at INTEGER;`,
  // Tags and metadata on the key; each ledger row's tags (the key's and the request's).
  `ALTER TABLE key_record ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
   ALTER TABLE key_record ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
   ALTER TABLE ledger ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';`,
  // Spend logs: how the client saw each request, and rows listed newest first.
  `ALTER TABLE ledger ADD COLUMN http_status INTEGER;
   ALTER TABLE ledger ADD COLUMN duration_ms INTEGER;
   ALTER TABLE ledger ADD COLUMN ttft_ms INTEGER;
   CREATE INDEX ledger_created ON ledger (created_at, request_id);`,
  // Requests answered from the edge's response cache (docs/cache.md).
  `ALTER TABLE ledger ADD COLUMN cache_hit INTEGER NOT NULL DEFAULT 0;`,
  // Batch API holds: a batch's worst case reserved at creation, charged as its lines end.
  `CREATE TABLE batch_holds (
     batch_id TEXT PRIMARY KEY, day TEXT NOT NULL, reserved_picos TEXT NOT NULL,
     applied_seq INTEGER NOT NULL, created_at INTEGER NOT NULL);`,
  // End users' leases: whose requests a lease admits (JSON; null: the key's own).
  `ALTER TABLE leases ADD COLUMN scope TEXT;`,
  // Budgets over any period (a list on the key) and spend per scope and UTC hour; what was
  // spent or reserved before counts in its day's first hour, as do the rows holding it.
  `ALTER TABLE key_record ADD COLUMN budgets TEXT NOT NULL DEFAULT '[]';
   UPDATE key_record SET budgets = json_array(
     json_object('period', '1d', 'limitMicros', budget_day_micros, 'softMicros', NULL),
     json_object('period', 'month', 'limitMicros', budget_month_micros, 'softMicros', NULL));
   UPDATE key_record SET budgets = json_remove(budgets, '$[1]') WHERE budget_month_micros IS NULL;
   UPDATE key_record SET budgets = json_remove(budgets, '$[0]') WHERE budget_day_micros IS NULL;
   ALTER TABLE key_record DROP COLUMN budget_day_micros;
   ALTER TABLE key_record DROP COLUMN budget_month_micros;
   ALTER TABLE key_record ADD COLUMN model_limits TEXT NOT NULL DEFAULT '{}';
   ALTER TABLE key_record ADD COLUMN alert_webhook_url TEXT;
   CREATE TABLE spend_hours (scope TEXT NOT NULL, hour INTEGER NOT NULL,
     settled_micros INTEGER NOT NULL, settled_picos INTEGER NOT NULL,
     reserved_micros INTEGER NOT NULL, reserved_picos INTEGER NOT NULL, PRIMARY KEY (scope, hour));
   INSERT INTO spend_hours SELECT 'key', CAST(strftime('%s', substr(period, 3)) AS INTEGER) / 3600,
     settled_micros, settled_picos, reserved_micros, reserved_picos FROM spend WHERE period LIKE 'd:%';
   DELETE FROM spend WHERE period <> 'all';
   ALTER TABLE ledger ADD COLUMN hour INTEGER NOT NULL DEFAULT 0;
   UPDATE ledger SET hour = CAST(strftime('%s', day) AS INTEGER) / 3600;
   ALTER TABLE leases ADD COLUMN hour INTEGER NOT NULL DEFAULT 0;
   UPDATE leases SET hour = CAST(strftime('%s', day) AS INTEGER) / 3600;
   ALTER TABLE batch_holds ADD COLUMN hour INTEGER NOT NULL DEFAULT 0;
   UPDATE batch_holds SET hour = CAST(strftime('%s', day) AS INTEGER) / 3600;
   CREATE TABLE budget_alerts (
     alert_id TEXT PRIMARY KEY, scope TEXT NOT NULL, period TEXT NOT NULL,
     window_start INTEGER NOT NULL, body TEXT NOT NULL, url TEXT, attempts INTEGER NOT NULL,
     next_at INTEGER, delivered_at INTEGER, created_at INTEGER NOT NULL);`,
  // Teams: the key's team, each row's, and the key's lease of its team's allowance.
  `ALTER TABLE key_record ADD COLUMN team_id TEXT;
   ALTER TABLE ledger ADD COLUMN team_id TEXT;
   CREATE TABLE team_pool (singleton INTEGER PRIMARY KEY CHECK (singleton = 1), data TEXT NOT NULL);`,
];

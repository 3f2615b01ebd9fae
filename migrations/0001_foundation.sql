-- Foundation: tenants, API keys, cross-instance rate counters and the event
-- outbox every later feature writes to.

CREATE TABLE workspaces (
    id          text PRIMARY KEY,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- An API key is stored only as HMAC-SHA-256(KEY_HASH_SECRET, secret). The
-- secret embeds the key id, so authentication is a primary-key lookup followed
-- by a constant-time comparison of the hashes.
CREATE TABLE api_keys (
    id                         text PRIMARY KEY,
    workspace_id               text NOT NULL REFERENCES workspaces(id),
    name                       text NOT NULL,
    secret_hash                bytea NOT NULL,
    scopes                     text[] NOT NULL,
    tools                      text[],
    daily_spend_ceiling_micros bigint CHECK (daily_spend_ceiling_micros >= 0),
    rate_limit_per_minute      integer CHECK (rate_limit_per_minute > 0),
    created_by_key_id          text,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    revoked_at                 timestamptz
);
CREATE INDEX api_keys_workspace_idx ON api_keys (workspace_id, id);

-- Fixed-window counters for rate limits that must hold across serverless
-- instances. Each window is split into shards so that many clients sharing
-- one key increment different rows instead of queueing on one row lock.
CREATE TABLE rate_counters (
    bucket       text NOT NULL,
    window_start timestamptz NOT NULL,
    shard        smallint NOT NULL,
    count        integer NOT NULL,
    PRIMARY KEY (bucket, window_start, shard)
);

-- Outbox of domain events (effect.indeterminate, run.finished, ...). Written in
-- the same transaction as the change they describe; webhook delivery reads it.
CREATE TABLE events (
    id           text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces(id),
    type         text NOT NULL,
    subject_id   text NOT NULL,
    data         jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- One event per (type, subject, dedupe) so that a sweeper racing an inline
    -- transition records the event once.
    dedupe_key   text NOT NULL DEFAULT '',
    UNIQUE (workspace_id, type, subject_id, dedupe_key)
);
CREATE INDEX events_workspace_idx ON events (workspace_id, id);

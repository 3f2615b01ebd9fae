-- The effect gate: per-type policies, effects with their attempts, approvals.
--
-- Every decision is made from these rows (unique constraints and row locks),
-- never from process memory. A lease is live while lease_expires_at is in the
-- future; a lapsed lease reads as indeterminate at once (the queries compare
-- with the caller's clock) and the sweeper makes that durable later.

CREATE TABLE gate_policies (
    workspace_id                 text NOT NULL REFERENCES workspaces(id),
    effect_type                  text NOT NULL,
    version                      bigint NOT NULL CHECK (version >= 1),
    mode                         text NOT NULL CHECK (mode IN ('allow', 'require_approval', 'deny')),
    on_indeterminate             text NOT NULL CHECK (on_indeterminate IN ('block', 'retry', 'probe')),
    lease_seconds                integer NOT NULL CHECK (lease_seconds BETWEEN 5 AND 3600),
    max_attempts                 integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 50),
    max_cost_micros              bigint CHECK (max_cost_micros >= 0),
    approval_above_micros        bigint CHECK (approval_above_micros >= 0),
    daily_budget_micros          bigint CHECK (daily_budget_micros >= 0),
    reconcile_every_hours        integer CHECK (reconcile_every_hours BETWEEN 1 AND 8760),
    require_cost                 boolean NOT NULL,
    required_dimensions          text[] NOT NULL,
    dimension_limits             jsonb NOT NULL,
    structuring_threshold_micros bigint CHECK (structuring_threshold_micros >= 0),
    surge_per_hour               integer CHECK (surge_per_hour >= 1),
    surge_multiplier             integer CHECK (surge_multiplier >= 2),
    surge_action                 text NOT NULL CHECK (surge_action IN ('monitor', 'require_approval', 'deny')),
    surge_cooldown_seconds       integer NOT NULL CHECK (surge_cooldown_seconds BETWEEN 60 AND 86400),
    retention_days               integer NOT NULL CHECK (retention_days BETWEEN 1 AND 400),
    created_at                   timestamptz NOT NULL,
    updated_at                   timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, effect_type),
    CHECK (approval_above_micros IS NULL OR max_cost_micros IS NULL OR approval_above_micros <= max_cost_micros)
);

CREATE TABLE effects (
    id                    text PRIMARY KEY,
    workspace_id          text NOT NULL REFERENCES workspaces(id),
    effect_type           text NOT NULL,
    idempotency_key       text NOT NULL,
    -- Hex SHA-256 of canonical JSON over effect_type, payload, cost_micros, dimensions.
    fingerprint           text NOT NULL,
    -- Stored state. 'leased' with lease_expires_at <= now reads as indeterminate.
    state                 text NOT NULL CHECK (state IN
                              ('leased', 'succeeded', 'failed', 'indeterminate', 'awaiting_approval', 'denied')),
    denial_code           text,
    -- Number of execute grants so far; the current attempt's number.
    attempt               integer NOT NULL DEFAULT 0,
    -- The current attempt's lease (copied onto the attempt row), so that every
    -- transition locks and tests this one row.
    lease_token_hash      bytea,
    lease_seconds         integer NOT NULL,
    lease_expires_at      timestamptz,
    attempt_started_at    timestamptz,
    probe                 boolean NOT NULL DEFAULT false,
    approval_id           text,
    approval_state        text CHECK (approval_state IN ('pending', 'approved', 'rejected')),
    -- Sealed (lib/seal) with aad "<id>/payload", "<id>/result", "<id>/compensation".
    payload               bytea,
    payload_preview       jsonb,
    result                bytea,
    result_preview        jsonb,
    cost_micros           bigint,
    -- Dimension names with keyed hashes of their values; never the values.
    dimensions            jsonb NOT NULL DEFAULT '{}',
    run_id                text,
    group_id              text,
    compensation          bytea,
    compensates_effect_id text,
    created_by_key_id     text NOT NULL,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    UNIQUE (workspace_id, idempotency_key)
);
CREATE INDEX effects_list_idx ON effects (workspace_id, id);
CREATE INDEX effects_state_idx ON effects (workspace_id, state, id);
-- The sweeper's scan for lapsed leases.
CREATE INDEX effects_leased_idx ON effects (lease_expires_at) WHERE state = 'leased';

CREATE TABLE effect_attempts (
    effect_id          text NOT NULL REFERENCES effects(id),
    attempt            integer NOT NULL,
    workspace_id       text NOT NULL,
    lease_token_hash   bytea NOT NULL,
    probe              boolean NOT NULL,
    started_at         timestamptz NOT NULL,
    lease_expires_at   timestamptz NOT NULL,
    -- NULL while the lease is live (or lapsed and not yet made durable).
    outcome            text CHECK (outcome IN ('succeeded', 'failed', 'indeterminate')),
    reported_at        timestamptz,
    began_by_key_id    text NOT NULL,
    reported_by_key_id text,
    resolved_by_key_id text,
    resolved_at        timestamptz,
    resolve_note       text,
    PRIMARY KEY (effect_id, attempt)
);
CREATE UNIQUE INDEX effect_attempts_token_idx ON effect_attempts (effect_id, lease_token_hash);

CREATE TABLE approvals (
    id                text PRIMARY KEY,
    workspace_id      text NOT NULL REFERENCES workspaces(id),
    effect_id         text NOT NULL REFERENCES effects(id),
    effect_type       text NOT NULL,
    state             text NOT NULL CHECK (state IN ('pending', 'approved', 'rejected')),
    reason            text NOT NULL,
    created_at        timestamptz NOT NULL,
    decided_at        timestamptz,
    decided_by_key_id text,
    note              text
);
CREATE INDEX approvals_list_idx ON approvals (workspace_id, state, id);

-- Tool contracts (input/output JSON Schemas, timeout and retry policy per
-- published version of a tool), synthetic test runs, and replay of ended steps.

-- The per-tool version counter: publication bumps it with an upsert, so
-- concurrent publications of one tool get 1, 2, 3… without gaps or races.
CREATE TABLE tool_contract_heads (
    workspace_id     text NOT NULL REFERENCES workspaces(id),
    name             text NOT NULL,
    last_version     integer NOT NULL,
    PRIMARY KEY (workspace_id, name)
);

-- A published contract is immutable. Its retry policy is stored expanded (a
-- built-in preset as its schedule), like an endpoint's, so snapshotting it
-- into a job is a plain copy.
CREATE TABLE tool_contracts (
    workspace_id     text NOT NULL REFERENCES workspaces(id),
    name             text NOT NULL,
    contract_version integer NOT NULL CHECK (contract_version >= 1),
    handler_version  text NOT NULL,
    input_schema     jsonb NOT NULL,
    output_schema    jsonb NOT NULL,
    timeout_ms       bigint NOT NULL,
    retry_preset     text NOT NULL CHECK (retry_preset IN ('STANDARD', 'AGGRESSIVE', 'RELAXED', 'CUSTOM')),
    max_attempts     integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 10),
    initial_delay_ms bigint NOT NULL,
    multiplier       double precision NOT NULL,
    max_delay_ms     bigint NOT NULL,
    jitter_percent   double precision NOT NULL,
    status           text NOT NULL CHECK (status IN ('ACTIVE', 'FORBIDDEN')),
    created_by       text NOT NULL,
    created_at       timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, name, contract_version)
);
-- Implicit selection at enqueue: the latest ACTIVE contract of name@version.
CREATE INDEX tool_contracts_implicit_idx ON tool_contracts (workspace_id, name, handler_version, contract_version DESC)
    WHERE status = 'ACTIVE';

-- The attempt count of a job's policy snapshot when it differs from the job's
-- lifetime ceiling (max_attempts): after a replay the ceiling includes prior
-- attempts, while the policy keeps (same version) or caps at 10 (upgrade)
-- its own count. NULL means "equal to max_attempts".
ALTER TABLE jobs ADD COLUMN policy_max_attempts integer;

-- An execution whose SUCCEEDED report was refused by the contract's
-- outputSchema: recorded as a non-retryable failure, and a repeat of that
-- same report answers the same object.
ALTER TABLE job_executions ADD COLUMN output_rejected boolean NOT NULL DEFAULT false;

-- synthetic: a run made by POST /tools/{name}/test. reopened counts replays
-- that took a FAILED run back to RUNNING, so each later finish records its
-- own run.finished event.
ALTER TABLE job_runs ADD COLUMN synthetic boolean NOT NULL DEFAULT false;
ALTER TABLE job_runs ADD COLUMN reopened integer NOT NULL DEFAULT 0;

-- The replay audit trail: who replayed which job, when, why, with how many
-- additional executions, and the versions before and after.
CREATE TABLE job_replays (
    id                   text PRIMARY KEY,
    workspace_id         text NOT NULL REFERENCES workspaces(id),
    job_id               text NOT NULL REFERENCES jobs(id),
    step_id              text NOT NULL,
    key_id               text NOT NULL,
    reason               text,
    prior_status         text NOT NULL,
    prior_attempt        integer NOT NULL,
    additional_attempts  integer NOT NULL,
    max_attempts         integer NOT NULL,
    old_handler_version  text NOT NULL,
    new_handler_version  text NOT NULL,
    old_contract_version integer,
    new_contract_version integer,
    created_at           timestamptz NOT NULL
);
CREATE INDEX job_replays_job_idx ON job_replays (job_id, created_at);

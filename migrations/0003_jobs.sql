-- Durable jobs: runs, steps (one durable job each), endpoints ("services")
-- with their retry policies and gates, workers and per-attempt executions.

-- An endpoint stores its effective policy in columns (built-in presets are
-- expanded), so snapshotting it into a new job is a plain copy.
CREATE TABLE job_endpoints (
    id                    text PRIMARY KEY,
    workspace_id          text NOT NULL REFERENCES workspaces(id),
    name                  text NOT NULL,
    version               bigint NOT NULL DEFAULT 1,
    preset                text NOT NULL CHECK (preset IN ('STANDARD', 'AGGRESSIVE', 'RELAXED', 'CUSTOM')),
    max_attempts          integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 10),
    initial_delay_ms      bigint NOT NULL,
    multiplier            double precision NOT NULL,
    max_delay_ms          bigint NOT NULL,
    jitter_percent        double precision NOT NULL,
    default_timeout_ms    bigint NOT NULL,
    max_concurrent        integer CHECK (max_concurrent BETWEEN 1 AND 1000),
    rate_limit_per_minute integer CHECK (rate_limit_per_minute BETWEEN 1 AND 100000),
    paused                boolean NOT NULL DEFAULT false,
    circuit_state         text NOT NULL DEFAULT 'closed',
    circuit_opened_at     timestamptz,
    -- Gate counters, changed only under this row's lock, so maxConcurrent and
    -- rateLimitPerMinute hold across concurrent claimers. running_count is
    -- kept only while max_concurrent is set (an unlimited endpoint's reports
    -- then never touch this row); setting a limit recounts it (see
    -- lib/jobs/sql.go, "endpoint gate protocol").
    running_count         integer NOT NULL DEFAULT 0,
    rate_window_start     timestamptz,
    rate_window_count     integer NOT NULL DEFAULT 0,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    UNIQUE (workspace_id, name)
);

CREATE TABLE job_runs (
    id                   text PRIMARY KEY,
    workspace_id         text NOT NULL REFERENCES workspaces(id),
    name                 text NOT NULL,
    status               text NOT NULL CHECK (status IN ('RUNNING', 'SUCCEEDED', 'FAILED')),
    completion_requested boolean NOT NULL DEFAULT false,
    created_at           timestamptz NOT NULL,
    finished_at          timestamptz
);
-- The sweeper's run-completion backstop.
CREATE INDEX job_runs_finishing_idx ON job_runs (id) WHERE status = 'RUNNING' AND completion_requested;

-- One row per step; the step's durable job lives in the same row (a replay
-- re-queues the same job), with its own id.
CREATE TABLE jobs (
    id               text PRIMARY KEY,
    step_id          text NOT NULL UNIQUE,
    workspace_id     text NOT NULL REFERENCES workspaces(id),
    run_id           text NOT NULL REFERENCES job_runs(id),
    name             text NOT NULL,
    -- The exact handler version a worker must register; a replay upgrade
    -- changes it together with contract_version.
    version          text NOT NULL,
    contract_version integer,
    endpoint_id      text NOT NULL REFERENCES job_endpoints(id),
    idempotency_key  text NOT NULL,
    -- HMAC of the canonical operation, to tell a duplicate from a key reuse.
    request_hash     bytea NOT NULL,
    after_step_id    text,
    after_status     text CHECK (after_status IN ('SUCCEEDED', 'FAILED')),
    status           text NOT NULL CHECK (status IN ('WAITING', 'QUEUED', 'RUNNING', 'RETRY_SCHEDULED',
                                                     'SUCCEEDED', 'EXHAUSTED', 'CANCELLED', 'SKIPPED')),
    attempt          integer NOT NULL DEFAULT 0,
    -- Policy snapshot taken at enqueue: later endpoint edits never change it.
    policy_version   bigint NOT NULL,
    policy_preset    text NOT NULL,
    max_attempts     integer NOT NULL,
    initial_delay_ms bigint NOT NULL,
    multiplier       double precision NOT NULL,
    max_delay_ms     bigint NOT NULL,
    jitter_percent   double precision NOT NULL,
    timeout_ms       bigint NOT NULL,
    -- due_at is the public "next attempt due" time; ready_at is when the row
    -- is claimable: due_at while queued, the lease expiry while RUNNING (a
    -- lapsed lease is reclaimable at once), so one index serves both.
    due_at           timestamptz,
    ready_at         timestamptz,
    lease_token      text,
    lease_expires_at timestamptz,
    worker_id        text,
    cancel_requested boolean NOT NULL DEFAULT false,
    -- Set (under this row's lock) when a step names this one as afterStepId,
    -- so a report knows whether it has dependents to release.
    has_dependents   boolean NOT NULL DEFAULT false,
    input_sealed     bytea,
    output_sealed    bytea,
    input_preview    jsonb,
    output_preview   jsonb,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    UNIQUE (workspace_id, idempotency_key)
);
-- The claim index: a claim reads the head of (workspace, name, version) in
-- ready_at order, so its cost does not grow with queue depth.
CREATE INDEX jobs_claim_idx ON jobs (workspace_id, name, version, ready_at)
    WHERE status IN ('QUEUED', 'RETRY_SCHEDULED', 'RUNNING');
CREATE INDEX jobs_run_idx ON jobs (run_id, step_id);
CREATE INDEX jobs_waiting_idx ON jobs (after_step_id) WHERE status = 'WAITING';
-- Recounting an endpoint's leased jobs when a concurrency limit is set.
CREATE INDEX jobs_running_idx ON jobs (endpoint_id) WHERE status = 'RUNNING';
-- The sweeper's lapsed-lease scan.
CREATE INDEX jobs_lapsed_idx ON jobs (ready_at) WHERE status = 'RUNNING';

CREATE TABLE job_workers (
    id           text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES workspaces(id),
    key_id       text NOT NULL,
    names        text[] NOT NULL,
    versions     text[] NOT NULL,
    created_at   timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL
);
CREATE INDEX job_workers_seen_idx ON job_workers (workspace_id, last_seen_at);

-- One row per attempt (claim). A report fills in outcome and reported_at; a
-- lapsed lease is marked FAILED with a warning and no reported_at.
CREATE TABLE job_executions (
    job_id           text NOT NULL REFERENCES jobs(id),
    attempt          integer NOT NULL,
    workspace_id     text NOT NULL,
    worker_id        text NOT NULL,
    lease_token      text NOT NULL,
    started_at       timestamptz NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    outcome          text CHECK (outcome IN ('SUCCEEDED', 'FAILED')),
    warning          text,
    retryable        boolean,
    retry_after_ms   bigint,
    error_sealed     bytea,
    reported_at      timestamptz,
    -- What the report answered, so a repeated report answers the same object.
    result_status    text,
    next_due_at      timestamptz,
    ended_at         timestamptz,
    PRIMARY KEY (job_id, attempt)
);

-- Job enqueue as one PL/pgSQL function, so that the common enqueue (the run
-- and the endpoint exist, no contract applies) is one round trip. Before,
-- Service.Enqueue ran a transaction of five to seven statements (BEGIN, the
-- dependency, the run and key lookup, the endpoint, the contract, the
-- insert, COMMIT), each a round trip, and in the pool's default
-- DB_QUERY_EXEC_MODE=exec each was parsed and planned on every call (see
-- 0008_gate_functions.sql). Now the client sends a one-line call; sent
-- outside a transaction it is its own transaction (no BEGIN/COMMIT), and
-- PL/pgSQL keeps the plan of each statement of the body for the life of the
-- server session.
--
-- This function is the only copy of the enqueue's SQL: lib/jobs/runs.go
-- holds the call and what stays in Go (ids, the sealed input and its
-- preview, the request hash, creating a missing endpoint, checking a
-- contract and validating the input against its inputSchema). A later
-- change is a new migration with CREATE OR REPLACE FUNCTION; Postgres
-- refuses that when the parameters' types or the result columns change, and
-- such a migration drops the function first in the same file.
--
-- VOLATILE: under READ COMMITTED every statement of the body takes a new
-- snapshot, exactly as the statements of the former transaction did, so the
-- fallback read after a conflicting insert sees the row that won. SECURITY
-- INVOKER, with the search_path the tables were created under. In the body,
-- a name that is both a result column and a table column means the table's
-- column (#variable_conflict use_column); the statements qualify their
-- columns anyway.
--
-- The answer is one row. outcome is one of:
--   not_found   no run p_run_id in the workspace;
--   existing    a step holds the key: step_id, job_id, status, due_at and
--               request_hash are that step's, and the caller tells a
--               duplicate (same hash) from a key reuse;
--   ended       the run's completion was requested, or the run ended;
--   dependency  p_after_step_id is not a step of this run;
--   contract    a contract applies (contract_version: the explicit
--               p_contract_version, else the latest ACTIVE contract of
--               p_name@p_version): the caller checks it and validates the
--               input, then calls again with p_contract_checked;
--   endpoint    no endpoint p_endpoint yet: the caller creates it and calls
--               again (after the contract, so that a refused input does
--               not leave a new endpoint behind);
--   inserted    the new step: step_id, job_id, status, due_at and the
--               contract_version it was enqueued under.
-- The checks run in that order, which is the order of the errors a client
-- sees. Every answer but inserted leaves nothing written except the
-- dependency's has_dependents flag, which is only a hint (a report with it
-- set looks for dependents to release) and was already left set by a
-- deduplicated enqueue.
--
-- Locks: the dependency's row is locked first (UPDATE), then the run's
-- (FOR SHARE: enqueues do not block each other, a finish waits for them and
-- they for it), the order a report follows too (job row, then run locks),
-- so an enqueue, a report and a finish cannot wait on each other in a
-- cycle. The dependency's ending, which locks its row, either came first
-- (this reads the ended status and decides the step at once) or waits for
-- this enqueue's commit and then sees has_dependents and the new step.
--
-- Policy snapshot: the contract's complete policy and timeout when one is
-- selected (even STANDARD: it overrides the endpoint's), else the
-- endpoint's; then p_max_attempts and p_timeout_ms, the enqueue's
-- overrides, when set. policy_version is the endpoint's version.
CREATE OR REPLACE FUNCTION jobs_enqueue(p_workspace_id text, p_run_id text, p_idempotency_key text,
    p_request_hash bytea, p_name text, p_version text, p_endpoint text, p_after_step_id text, p_after_status text,
    p_contract_version integer, p_contract_checked boolean, p_max_attempts integer, p_timeout_ms bigint,
    p_job_id text, p_step_id text, p_input_sealed bytea, p_input_preview jsonb, p_now timestamptz,
    OUT outcome text, OUT step_id text, OUT job_id text, OUT status text, OUT due_at timestamptz,
    OUT request_hash bytea, OUT contract_version integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
DECLARE
    v_dep          text;    -- the dependency's status, NULL when there is none
    v_run_status   text;
    v_requested    boolean;
    v_pol          record;  -- the endpoint, the selected contract and the policy snapshot
    v_status       text;
    v_due          timestamptz;
BEGIN
    IF p_after_step_id IS NOT NULL THEN
        UPDATE jobs d SET has_dependents = true
        WHERE d.step_id = p_after_step_id AND d.run_id = p_run_id AND d.workspace_id = p_workspace_id
        RETURNING d.status INTO v_dep;
    END IF;

    SELECT r.status, r.completion_requested, j.step_id, j.id, j.status, j.due_at, j.request_hash
    INTO v_run_status, v_requested, step_id, job_id, status, due_at, request_hash
    FROM job_runs r
    LEFT JOIN jobs j ON j.workspace_id = r.workspace_id AND j.idempotency_key = p_idempotency_key
    WHERE r.id = p_run_id AND r.workspace_id = p_workspace_id
    FOR SHARE OF r;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    ELSIF step_id IS NOT NULL THEN
        outcome := 'existing';
        RETURN;
    ELSIF v_requested OR v_run_status <> 'RUNNING' THEN
        outcome := 'ended';
        RETURN;
    ELSIF p_after_step_id IS NOT NULL AND v_dep IS NULL THEN
        outcome := 'dependency';
        RETURN;
    END IF;

    IF NOT p_contract_checked THEN
        -- The explicit contract, else the implicit one: the latest ACTIVE
        -- contract of name@version (tool_contracts_implicit_idx).
        contract_version := coalesce(p_contract_version, (
            SELECT c.contract_version FROM tool_contracts c
            WHERE c.workspace_id = p_workspace_id AND c.name = p_name AND c.handler_version = p_version
              AND c.status = 'ACTIVE'
            ORDER BY c.contract_version DESC LIMIT 1));
        IF contract_version IS NOT NULL THEN
            outcome := 'contract';
            RETURN;
        END IF;
    END IF;

    -- The contract's columns are NOT NULL, so coalesce takes the whole
    -- policy from the contract when one is joined, else from the endpoint.
    SELECT e.id AS endpoint_id, e.version, c.contract_version,
           coalesce(c.retry_preset, e.preset) AS preset,
           coalesce(p_max_attempts, c.max_attempts, e.max_attempts) AS max_attempts,
           coalesce(c.initial_delay_ms, e.initial_delay_ms) AS initial_delay_ms,
           coalesce(c.multiplier, e.multiplier) AS multiplier,
           coalesce(c.max_delay_ms, e.max_delay_ms) AS max_delay_ms,
           coalesce(c.jitter_percent, e.jitter_percent) AS jitter_percent,
           coalesce(p_timeout_ms, c.timeout_ms, e.default_timeout_ms) AS timeout_ms
    INTO v_pol
    FROM job_endpoints e
    LEFT JOIN tool_contracts c ON p_contract_checked AND c.workspace_id = e.workspace_id AND c.name = p_name
                              AND c.contract_version = p_contract_version
    WHERE e.workspace_id = p_workspace_id AND e.name = p_endpoint;
    IF NOT FOUND THEN
        outcome := 'endpoint';
        RETURN;
    ELSIF p_contract_version IS NOT NULL AND v_pol.contract_version IS NULL THEN
        -- Contracts are never deleted, and the caller read this one.
        RAISE EXCEPTION 'jobs_enqueue: contract % of % not found', p_contract_version, p_name;
    END IF;

    -- Without a dependency the step is due now. With one that has not ended
    -- it waits; one that ended decides at once, by the rule
    -- sqlReleaseDependents applies when it ends later (lib/jobs/sql.go):
    -- afterStatus SUCCEEDED waits for a success, FAILED for an exhausted
    -- dependency, and any other ending skips the step.
    v_status := CASE
        WHEN v_dep IS NULL THEN 'QUEUED'
        WHEN v_dep NOT IN ('SUCCEEDED', 'EXHAUSTED', 'CANCELLED', 'SKIPPED') THEN 'WAITING'
        WHEN (p_after_status = 'SUCCEEDED' AND v_dep = 'SUCCEEDED')
          OR (p_after_status = 'FAILED' AND v_dep = 'EXHAUSTED') THEN 'QUEUED'
        ELSE 'SKIPPED' END;
    v_due := CASE WHEN v_status = 'QUEUED' THEN p_now END;

    INSERT INTO jobs AS j (id, step_id, workspace_id, run_id, name, version, contract_version, endpoint_id,
                           idempotency_key, request_hash, after_step_id, after_status, status, policy_version,
                           policy_preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms, jitter_percent,
                           timeout_ms, due_at, ready_at, input_sealed, input_preview, created_at, updated_at,
                           finished_at)
    VALUES (p_job_id, p_step_id, p_workspace_id, p_run_id, p_name, p_version, v_pol.contract_version,
            v_pol.endpoint_id, p_idempotency_key, p_request_hash, p_after_step_id, p_after_status, v_status,
            v_pol.version, v_pol.preset, v_pol.max_attempts, v_pol.initial_delay_ms, v_pol.multiplier,
            v_pol.max_delay_ms, v_pol.jitter_percent, v_pol.timeout_ms, v_due, v_due, p_input_sealed,
            p_input_preview, p_now, p_now, CASE WHEN v_status = 'SKIPPED' THEN p_now END)
    ON CONFLICT (workspace_id, idempotency_key) DO NOTHING
    RETURNING j.step_id, j.id, j.status, j.due_at, j.contract_version
    INTO step_id, job_id, status, due_at, contract_version;
    IF FOUND THEN
        outcome := 'inserted';
        RETURN;
    END IF;

    -- A concurrent enqueue with the same key committed first (the insert
    -- waited for it); this statement's snapshot sees its row.
    SELECT j.step_id, j.id, j.status, j.due_at, j.request_hash
    INTO STRICT step_id, job_id, status, due_at, request_hash
    FROM jobs j WHERE j.workspace_id = p_workspace_id AND j.idempotency_key = p_idempotency_key;
    outcome := 'existing';
END
$fn$;

-- A producer's retry of an accepted step is answered that step
-- (deduplicated) when the run's completion was requested meanwhile, as
-- README promises, rather than refused like a new step (409 invalid_state;
-- CI, TestEnqueueRacingFinish). jobs_enqueue reads the run's row FOR SHARE
-- and, in the same statement, the step holding the key. Under READ
-- COMMITTED a statement that waits for the run's row (behind FinishRun's
-- update, itself behind the first enqueue's lock) re-reads, once woken,
-- only that row, now completion_requested; the jobs it joined are as of
-- the statement's start, before the first enqueue committed its step. So
-- it saw an ended run and no step. A run that reads as ended now has the
-- key looked up again in a new statement, which sees the committed step.
-- The function's other answers do not rest on such a read: a run that is
-- not ended goes on to the insert, whose conflict waits for the other
-- enqueue and whose fallback read is a new statement; a missing
-- dependency was read by an earlier statement.
-- jobs_enqueue is 0048's verbatim but for that lookup. Same arguments and
-- result: the previous release calls it during a deploy and answers such a
-- retry the same way from the moment it is applied (its Go code dedupes an
-- 'existing' outcome whatever the branch).

CREATE OR REPLACE FUNCTION jobs_enqueue(p_workspace_id text, p_run_id text, p_idempotency_key text,
    p_request_hash bytea, p_name text, p_version text, p_endpoint text, p_after_step_id text, p_after_status text,
    p_contract_version integer, p_contract_checked boolean, p_max_attempts integer, p_timeout_ms bigint,
    p_job_id text, p_step_id text, p_input_sealed bytea, p_input_preview jsonb, p_now timestamptz,
    p_not_before timestamptz, p_keyed_key text, p_keyed_hash bytea, p_key_id text,
    OUT outcome text, OUT step_id text, OUT job_id text, OUT status text, OUT due_at timestamptz,
    OUT request_hash bytea, OUT contract_version integer, OUT key_taken text)
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
    v_hash         bytea;   -- the request hash of the key taken
BEGIN
    -- The calling key, unless revoked since the calling instance cached it
    -- (NULL: the service's own call, for no key). First, so that a revoked
    -- key's call changes nothing, not even its dependency's flag.
    IF p_key_id IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM api_keys k WHERE k.id = p_key_id AND k.revoked_at IS NULL) THEN
        outcome := 'revoked';
        RETURN;
    END IF;

    IF p_after_step_id IS NOT NULL THEN
        UPDATE jobs d SET has_dependents = true
        WHERE d.step_id = p_after_step_id AND d.run_id = p_run_id AND d.workspace_id = p_workspace_id
        RETURNING d.status INTO v_dep;
    END IF;

    -- A generated key (p_keyed_key set) is the keyed one in a run started
    -- since 0031, the plain one (p_idempotency_key) in a run from before.
    SELECT r.status, r.completion_requested, j.step_id, j.id, j.status, j.due_at, j.request_hash, k.key, k.hash
    INTO v_run_status, v_requested, step_id, job_id, status, due_at, request_hash, key_taken, v_hash
    FROM job_runs r
    CROSS JOIN LATERAL (SELECT CASE WHEN r.keyed_step_keys AND p_keyed_key IS NOT NULL
                                    THEN p_keyed_key ELSE p_idempotency_key END AS key,
                               CASE WHEN r.keyed_step_keys AND p_keyed_key IS NOT NULL
                                    THEN p_keyed_hash ELSE p_request_hash END AS hash) k
    LEFT JOIN jobs j ON j.workspace_id = r.workspace_id AND j.idempotency_key = k.key
    WHERE r.id = p_run_id AND r.workspace_id = p_workspace_id
    FOR SHARE OF r;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    ELSIF step_id IS NOT NULL THEN
        outcome := 'existing';
        RETURN;
    ELSIF v_requested OR v_run_status = 'SUCCEEDED' THEN
        -- The statement above may have waited for the run's row: woken, it
        -- re-read that row alone, and its jobs are as of its start. A step
        -- with the key committed meanwhile (the run's ending waited for
        -- it) is found by a new statement, which sees what committed
        -- before it; it is answered, not refused.
        SELECT j.step_id, j.id, j.status, j.due_at, j.request_hash
        INTO step_id, job_id, status, due_at, request_hash
        FROM jobs j WHERE j.workspace_id = p_workspace_id AND j.idempotency_key = key_taken;
        outcome := CASE WHEN step_id IS NOT NULL THEN 'existing' ELSE 'ended' END;
        RETURN;
    ELSIF p_after_step_id IS NOT NULL AND v_dep IS NULL THEN
        outcome := 'dependency';
        RETURN;
    END IF;

    IF NOT p_contract_checked THEN
        -- The explicit contract, else the implicit one: the latest ACTIVE
        -- contract of name@version (tool_contracts_implicit_idx), else,
        -- when name@version has contracts but none ACTIVE, the latest of
        -- them, FORBIDDEN, which the caller refuses (checkContract).
        contract_version := coalesce(p_contract_version, (
            SELECT c.contract_version FROM tool_contracts c
            WHERE c.workspace_id = p_workspace_id AND c.name = p_name AND c.handler_version = p_version
              AND c.status = 'ACTIVE'
            ORDER BY c.contract_version DESC LIMIT 1), (
            SELECT c.contract_version FROM tool_contracts c
            WHERE c.workspace_id = p_workspace_id AND c.name = p_name AND c.handler_version = p_version
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
    v_due := CASE WHEN v_status = 'QUEUED' THEN greatest(p_now, coalesce(p_not_before, p_now)) END;

    INSERT INTO jobs AS j (id, step_id, workspace_id, run_id, name, version, contract_version, endpoint_id,
                           idempotency_key, request_hash, after_step_id, after_status, status, policy_version,
                           policy_preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms, jitter_percent,
                           timeout_ms, due_at, ready_at, input_sealed, input_preview, created_at, updated_at,
                           finished_at)
    VALUES (p_job_id, p_step_id, p_workspace_id, p_run_id, p_name, p_version, v_pol.contract_version,
            v_pol.endpoint_id, key_taken, v_hash, p_after_step_id, p_after_status, v_status,
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
    FROM jobs j WHERE j.workspace_id = p_workspace_id AND j.idempotency_key = key_taken;
    outcome := 'existing';
END
$fn$;

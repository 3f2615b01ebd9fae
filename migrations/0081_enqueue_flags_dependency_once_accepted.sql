-- jobs_enqueue set its dependency's has_dependents before it decided, so an
-- enqueue it then refused (the run's completion requested, the key taken
-- by another operation, an input its contract refused, which the caller
-- checks between two calls) left the flag set on a step no step waits
-- for: each of that step's endings then looked for dependents to
-- release and woke every parked claim of the workspace (task review). The
-- dependency's row is now locked first with SELECT ... FOR NO KEY UPDATE,
-- the lock mode the update took, in the same place of the lock order
-- (dependency row, run row FOR SHARE, insert), and its flag is set only
-- once the step is inserted, in the same transaction and under that lock:
-- an ending that waited for the lock reads the flag and the new step as
-- before. jobs_enqueue is 0071's verbatim but for that. Same arguments and
-- result: the previous release calls it during a deploy and gets the same
-- answers; a flag its refused enqueues set before is left as it is (a
-- hint: a step whose flag is set and has no dependents releases nothing).

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
    -- key's call takes no lock.
    IF p_key_id IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM api_keys k WHERE k.id = p_key_id AND k.revoked_at IS NULL) THEN
        outcome := 'revoked';
        RETURN;
    END IF;

    -- The dependency's row is locked first, in the mode the flag's update
    -- takes, and read as the lock was granted: its ending either committed
    -- before (read here) or waits for this enqueue. Its flag is set only
    -- once the step is inserted, below.
    IF p_after_step_id IS NOT NULL THEN
        SELECT d.status INTO v_dep FROM jobs d
        WHERE d.step_id = p_after_step_id AND d.run_id = p_run_id AND d.workspace_id = p_workspace_id
        FOR NO KEY UPDATE OF d;
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
        IF p_after_step_id IS NOT NULL THEN
            -- Under the lock taken first: the dependency's ending, which
            -- waits for it, reads the flag and releases this step.
            UPDATE jobs d SET has_dependents = true
            WHERE d.step_id = p_after_step_id AND d.run_id = p_run_id AND d.workspace_id = p_workspace_id
              AND NOT d.has_dependents;
        END IF;
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

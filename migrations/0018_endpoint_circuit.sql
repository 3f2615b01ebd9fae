-- The endpoint circuit breaker (API.md §3.2's `circuit`, seed 000: "If a
-- circuit is open, inspect recent attempts and the external service before
-- resuming traffic"). The state and POST …/circuit/close existed since
-- 0003, but nothing ever opened a circuit. Like the gate's surge breakers
-- (seed 003: "stays off until you set a threshold"), it is off until an
-- endpoint's policy sets circuitFailureThreshold.
--
-- circuit_failures counts the endpoint's consecutive retryable failures
-- (reports only: a lapsed lease says its worker vanished, not that the
-- service failed; a non-retryable failure is about its input); a success
-- resets it. Reaching the threshold opens the circuit: claims then skip the
-- endpoint's jobs, consuming no attempts, as a pause does. Once
-- circuit_probe_at (opening + circuitCooldownMs) has passed, one claim may
-- lease one of its jobs as a probe and moves circuit_probe_at a cooldown
-- on, so at most one probe is leased per cooldown even if a probe's worker
-- vanishes. A success closes the circuit; a retryable failure while open
-- restarts the cooldown. Counting and opening happen in Go's report path
-- (lib/jobs/circuit.go) under the endpoint's row lock.
ALTER TABLE job_endpoints
    ADD COLUMN circuit_failure_threshold integer CHECK (circuit_failure_threshold BETWEEN 1 AND 1000),
    ADD COLUMN circuit_cooldown_ms bigint NOT NULL DEFAULT 60000
        CHECK (circuit_cooldown_ms BETWEEN 1000 AND 86400000),
    ADD COLUMN circuit_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN circuit_probe_at timestamptz,
    ADD CONSTRAINT job_endpoints_circuit_state_check CHECK (circuit_state IN ('closed', 'open'));

-- jobs_claim is 0015's, verbatim but for the circuit: candidates skip an
-- endpoint whose circuit is open until its probe time (a filter on the
-- snapshot, as for the other gates); under the endpoint's lock an open
-- circuit grants at most one job (probe_left), only once the probe time
-- has come, and a grant moves the probe time a cooldown on. And the
-- endpoints are locked FOR NO KEY UPDATE instead of FOR UPDATE, like every
-- endpoint lock from now on (see 0021).
CREATE OR REPLACE FUNCTION jobs_claim(p_worker_id text, p_workspace_id text, p_now timestamptz, p_key_id text,
    p_limit integer, p_grace_ms bigint, p_rate_window timestamptz, p_warning text)
RETURNS TABLE (id text, step_id text, run_id text, name text, version text, attempt integer, max_attempts integer,
    lease_token text, lease_expires_at timestamptz, timeout_ms bigint, idempotency_key text, input_sealed bytea)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH wk AS (
    UPDATE job_workers SET last_seen_at = $3::timestamptz
    WHERE id = $1::text AND workspace_id = $2::text AND key_id = $4::text
    RETURNING names, versions
), tools AS (
    SELECT DISTINCT t.name, t.version FROM wk, unnest(wk.names, wk.versions) AS t(name, version)
), cand AS (
    SELECT c.id, c.endpoint_id, c.ready_at, c.status = 'RUNNING' AS reclaim
    FROM tools t
    CROSS JOIN LATERAL (
        SELECT j.id, j.endpoint_id, j.ready_at, j.status FROM jobs j
        WHERE j.workspace_id = $2::text AND j.name = t.name AND j.version = t.version
          AND j.status IN ('QUEUED', 'RETRY_SCHEDULED', 'RUNNING') AND j.ready_at <= $3::timestamptz
          AND (j.status <> 'RUNNING' OR j.attempt < j.max_attempts)
          AND NOT EXISTS (SELECT 1 FROM job_endpoints p WHERE p.id = j.endpoint_id
              AND (p.paused
                   OR (p.rate_limit_per_minute IS NOT NULL AND p.rate_window_start >= $7::timestamptz
                       AND p.rate_window_count >= p.rate_limit_per_minute)
                   OR (j.status <> 'RUNNING' AND p.max_concurrent IS NOT NULL
                       AND p.running_count >= p.max_concurrent)
                   OR (p.circuit_state = 'open' AND p.circuit_probe_at > $3::timestamptz)))
        ORDER BY j.ready_at
        LIMIT $5::int
        FOR UPDATE OF j SKIP LOCKED
    ) c
    ORDER BY c.ready_at
    LIMIT $5::int
), eps AS (
    SELECT e.id, e.paused, e.running_count, e.max_concurrent, e.rate_limit_per_minute, e.circuit_state,
           e.circuit_probe_at,
           CASE WHEN e.rate_window_start >= $7::timestamptz THEN e.rate_window_count ELSE 0 END AS window_count
    FROM job_endpoints e WHERE e.id IN (SELECT endpoint_id FROM cand)
    ORDER BY e.id
    FOR NO KEY UPDATE
), room AS (
    SELECT e.id, c.n_re, c.n_new,
           CASE WHEN e.paused THEN 0
                WHEN e.rate_limit_per_minute IS NULL THEN 2147483647
                ELSE GREATEST(0, e.rate_limit_per_minute - e.window_count) END AS rate_left,
           CASE WHEN e.max_concurrent IS NULL THEN 2147483647
                ELSE GREATEST(0, e.max_concurrent - e.running_count) END AS conc_left,
           CASE WHEN e.circuit_state <> 'open' THEN 2147483647
                WHEN e.circuit_probe_at IS NULL OR e.circuit_probe_at <= $3::timestamptz THEN 1
                ELSE 0 END AS probe_left
    FROM eps e
    JOIN (SELECT endpoint_id, count(*) FILTER (WHERE reclaim)::int AS n_re,
                 count(*) FILTER (WHERE NOT reclaim)::int AS n_new
          FROM cand GROUP BY endpoint_id) c ON c.endpoint_id = e.id
), grants AS (
    SELECT id, g_re, LEAST(n_new, rate_left - g_re, conc_left, probe_left - g_re) AS g_new
    FROM (SELECT room.*, LEAST(n_re, rate_left, probe_left) AS g_re FROM room) r
), bump AS (
    UPDATE job_endpoints e SET
        running_count = e.running_count + CASE WHEN e.max_concurrent IS NULL THEN 0 ELSE g.g_new END,
        rate_window_count = CASE WHEN e.rate_window_start >= $7::timestamptz THEN e.rate_window_count ELSE 0 END
                            + g.g_re + g.g_new,
        rate_window_start = greatest(e.rate_window_start, $7::timestamptz),
        circuit_probe_at = CASE WHEN e.circuit_state = 'open'
                                THEN $3::timestamptz + e.circuit_cooldown_ms * interval '1 millisecond'
                                ELSE e.circuit_probe_at END
    FROM grants g
    WHERE e.id = g.id AND ((e.max_concurrent IS NOT NULL AND g.g_new > 0)
                           OR ((e.rate_limit_per_minute IS NOT NULL OR e.circuit_state = 'open')
                               AND g.g_re + g.g_new > 0))
), pick AS (
    SELECT c.id, c.reclaim FROM (
        SELECT cand.*, row_number() OVER (PARTITION BY endpoint_id, reclaim ORDER BY ready_at, id) AS rn FROM cand
    ) c JOIN grants g ON g.id = c.endpoint_id
    WHERE c.rn <= CASE WHEN c.reclaim THEN g.g_re ELSE g.g_new END
), claimed AS (
    UPDATE jobs j SET status = 'RUNNING', attempt = j.attempt + 1,
        lease_token = replace(gen_random_uuid()::text, '-', ''),
        lease_expires_at = $3::timestamptz + (j.timeout_ms + $6::bigint) * interval '1 millisecond',
        ready_at = $3::timestamptz + (j.timeout_ms + $6::bigint) * interval '1 millisecond',
        worker_id = $1::text, updated_at = $3::timestamptz
    FROM pick p WHERE j.id = p.id
    RETURNING j.id, j.step_id, j.run_id, j.name, j.version, j.attempt, j.max_attempts, j.lease_token,
              j.lease_expires_at, j.timeout_ms, j.idempotency_key, j.input_sealed, p.reclaim
), lapsed AS (
    UPDATE job_executions x SET outcome = 'FAILED', warning = $8::text, ended_at = $3::timestamptz
    FROM claimed c
    -- The array keeps this a primary-key probe however the planner sizes claimed.
    WHERE x.job_id = ANY (ARRAY(SELECT id FROM claimed WHERE reclaim))
      AND c.reclaim AND x.job_id = c.id AND x.attempt = c.attempt - 1 AND x.outcome IS NULL
), exe AS (
    INSERT INTO job_executions (job_id, attempt, workspace_id, worker_id, lease_token, started_at, lease_expires_at)
    SELECT id, attempt, $2::text, $1::text, lease_token, $3::timestamptz, lease_expires_at FROM claimed
)
SELECT id, step_id, run_id, name, version, attempt, max_attempts, lease_token, lease_expires_at, timeout_ms,
       idempotency_key, input_sealed
FROM claimed ORDER BY lease_expires_at, id;
END
$fn$;

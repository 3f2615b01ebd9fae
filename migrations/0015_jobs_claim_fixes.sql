-- Three fixes to the claim (issue 6's QA), each a condition of 0011's
-- statement; the body is otherwise 0011's, verbatim.
--
-- 1. A lapsed lease on a job's last attempt is not reclaimed (seed 000:
--    "After the configured maximum attempts, the job is EXHAUSTED"). 0011
--    took every RUNNING job whose lease had lapsed and counted one more
--    attempt, so a claim that came before the sweeper (or a run read) had
--    ended such a job ran it past its maxAttempts: attempt 2 of 1, a tool
--    test's second run. Such a job is now left to exhaustLapsed
--    (lib/jobs/sweep.go), which ends it with its run, dependents and
--    events; until then the current lease token's late report is still
--    accepted (API.md §5, "Job leases"), as for any lapsed lease no newer
--    claim superseded.
--
-- 2. The rate window only moves forward. A claim computes its window (the
--    minute of its now, $7) before it waits for a connection and the
--    endpoint's lock, and 0011 reset the count whenever the stored window
--    differed from $7: a claim still in the old minute, locking after one
--    in the new minute, reset the new minute's count and wrote the old
--    minute back, and the next claim reset it again, each granting a full
--    allowance (2-5x rateLimitPerMinute around every minute boundary). A
--    stored window at or after $7 is now the current one.
--
-- 3. Candidates skip endpoints that cannot take a job now: paused (as
--    before), out of rate allowance in the current window, or, for a new
--    lease (a reclaim needs no new slot), at maxConcurrent. 0011 took the
--    $5 oldest due jobs before applying the gates, so a backlog on a
--    saturated endpoint filled every candidate slot and a claim answered
--    nothing while other endpoints' jobs were due. The filter reads the
--    endpoint as the statement's snapshot has it, so it is a hint: the
--    gates are still computed under the endpoint's lock (eps, room,
--    grants), and a job skipped because its endpoint looked full is
--    claimed at the next look. An endpoint with some room can still take
--    candidate slots beyond it, so a claim may answer fewer jobs than are
--    due; never none while others are claimable.
--
-- The claim index still serves the candidate scan: the new conditions are
-- a filter on the rows it returns and a primary-key probe of the endpoint,
-- which 0011's pause check already made.
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
                       AND p.running_count >= p.max_concurrent)))
        ORDER BY j.ready_at
        LIMIT $5::int
        FOR UPDATE OF j SKIP LOCKED
    ) c
    ORDER BY c.ready_at
    LIMIT $5::int
), eps AS (
    SELECT e.id, e.paused, e.running_count, e.max_concurrent, e.rate_limit_per_minute,
           CASE WHEN e.rate_window_start >= $7::timestamptz THEN e.rate_window_count ELSE 0 END AS window_count
    FROM job_endpoints e WHERE e.id IN (SELECT endpoint_id FROM cand)
    ORDER BY e.id
    FOR UPDATE
), room AS (
    SELECT e.id, c.n_re, c.n_new,
           CASE WHEN e.paused THEN 0
                WHEN e.rate_limit_per_minute IS NULL THEN 2147483647
                ELSE GREATEST(0, e.rate_limit_per_minute - e.window_count) END AS rate_left,
           CASE WHEN e.max_concurrent IS NULL THEN 2147483647
                ELSE GREATEST(0, e.max_concurrent - e.running_count) END AS conc_left
    FROM eps e
    JOIN (SELECT endpoint_id, count(*) FILTER (WHERE reclaim)::int AS n_re,
                 count(*) FILTER (WHERE NOT reclaim)::int AS n_new
          FROM cand GROUP BY endpoint_id) c ON c.endpoint_id = e.id
), grants AS (
    SELECT id, LEAST(n_re, rate_left) AS g_re,
           LEAST(n_new, rate_left - LEAST(n_re, rate_left), conc_left) AS g_new
    FROM room
), bump AS (
    UPDATE job_endpoints e SET
        running_count = e.running_count + CASE WHEN e.max_concurrent IS NULL THEN 0 ELSE g.g_new END,
        rate_window_count = CASE WHEN e.rate_window_start >= $7::timestamptz THEN e.rate_window_count ELSE 0 END
                            + g.g_re + g.g_new,
        rate_window_start = greatest(e.rate_window_start, $7::timestamptz)
    FROM grants g
    WHERE e.id = g.id AND ((e.max_concurrent IS NOT NULL AND g.g_new > 0)
                           OR (e.rate_limit_per_minute IS NOT NULL AND g.g_re + g.g_new > 0))
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

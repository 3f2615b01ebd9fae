-- The durable jobs' hot path, claims and reports, as PL/pgSQL functions,
-- for the reason migration 0008 gave for the gate's: in the pool's default
-- DB_QUERY_EXEC_MODE=exec (unnamed statements, required behind
-- transaction-mode poolers) Postgres parses and plans every statement it is
-- sent, and the claim's statement (twelve CTEs) and the two statements of a
-- report batch cost more to parse and plan than a batch of them costs to
-- run. The client now sends a one-line call; PL/pgSQL parses each body once
-- per server session and keeps its plan where the generic plan is no
-- costlier than the custom ones. (The claim's is: a generic plan cannot see
-- the LIMIT, so the claim is planned with each call's values, which stays
-- right however deep the queue.)
--
-- Each body is the statement lib/jobs sent before this migration, verbatim,
-- with $n now naming the function's parameters (declared with the types the
-- statement cast them to). lib/jobs/sql.go documents the protocol and the
-- parameters and holds only the calls; the SQL lives here alone. A later
-- change is a new migration with CREATE OR REPLACE FUNCTION (DROP first
-- when the parameters' types or the result columns change).
--
-- Behaviour is unchanged: each body is one statement (one snapshot, the
-- same locks in the same order), VOLATILE, SECURITY INVOKER, with the
-- search_path the tables were created under, and #variable_conflict
-- use_column so that a name that is both a result column and a table
-- column means the table's column, as in the plain statement.

-- jobs_claim leases up to $5 due jobs for worker $1 (see sqlClaim in
-- lib/jobs/sql.go for the protocol): $2 workspace, $3 now, $4 key, $5 limit,
-- $6 lease grace ms, $7 rate window (minute), $8 the lapse warning.
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
          AND NOT EXISTS (SELECT 1 FROM job_endpoints p WHERE p.id = j.endpoint_id AND p.paused)
        ORDER BY j.ready_at
        LIMIT $5::int
        FOR UPDATE OF j SKIP LOCKED
    ) c
    ORDER BY c.ready_at
    LIMIT $5::int
), eps AS (
    SELECT e.id, e.paused, e.running_count, e.max_concurrent, e.rate_limit_per_minute,
           CASE WHEN e.rate_window_start = $7::timestamptz THEN e.rate_window_count ELSE 0 END AS window_count
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
        rate_window_count = CASE WHEN e.rate_window_start = $7::timestamptz THEN e.rate_window_count ELSE 0 END
                            + g.g_re + g.g_new,
        rate_window_start = $7::timestamptz
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

-- jobs_report_lock locks a report batch's jobs in id order ($1, sorted) in
-- workspace $2 and reads each with the execution its token ($3, parallel to
-- $1) names (see sqlReportLock).
CREATE OR REPLACE FUNCTION jobs_report_lock(p_job_ids text[], p_workspace_id text, p_lease_tokens text[])
RETURNS TABLE (endpoint_locked text, run_locked boolean, has_dependents boolean, status text, attempt integer,
    max_attempts integer, step_id text, run_id text, endpoint_id text, policy_preset text, initial_delay_ms bigint,
    multiplier double precision, max_delay_ms bigint, jitter_percent double precision, completion_requested boolean,
    x_attempt integer, x_outcome text, x_reported_at timestamptz, x_result_status text, x_next_due_at timestamptz,
    name text, contract_version integer, x_output_rejected boolean, id text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
SELECT pg_advisory_xact_lock_shared(hashtextextended(j.endpoint_id, 0))::text,
       pg_try_advisory_xact_lock_shared(hashtextextended(j.run_id, 0)), j.has_dependents, j.status, j.attempt, j.max_attempts, j.step_id, j.run_id, j.endpoint_id, j.policy_preset, j.initial_delay_ms,
       j.multiplier, j.max_delay_ms, j.jitter_percent, r.completion_requested,
       x.attempt, x.outcome, x.reported_at, x.result_status, x.next_due_at,
       j.name, j.contract_version, coalesce(x.output_rejected, false), j.id
FROM unnest($1::text[], $3::text[]) AS u(job_id, lease_token)
JOIN jobs j ON j.id = u.job_id AND j.workspace_id = $2::text
JOIN job_runs r ON r.id = j.run_id
LEFT JOIN job_executions x ON x.job_id = j.id AND x.lease_token = u.lease_token
ORDER BY j.id
FOR UPDATE OF j;
END
$fn$;

-- jobs_report_apply records a batch's decided reports in workspace $1 at
-- $2: parallel arrays $3…$16, one element per report (see sqlReportApply).
CREATE OR REPLACE FUNCTION jobs_report_apply(p_workspace_id text, p_now timestamptz, p_job_ids text[],
    p_attempts integer[], p_next text[], p_due timestamptz[], p_finished timestamptz[], p_output bytea[],
    p_preview text[], p_outcome text[], p_retryable boolean[], p_retry_after bigint[], p_error bytea[],
    p_update_job boolean[], p_warning text[], p_rejected boolean[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
BEGIN
WITH u AS (
    SELECT * FROM unnest($3::text[], $4::int[], $5::text[], $6::timestamptz[], $7::timestamptz[], $8::bytea[],
                         $9::text[], $10::text[], $11::bool[], $12::bigint[], $13::bytea[], $14::bool[], $15::text[],
                         $16::bool[])
        AS u(job_id, attempt, next, due, finished, output, preview, outcome, retryable, retry_after, err, update_job,
             warning, rejected)
), j AS (
    UPDATE jobs SET status = u.next, due_at = u.due, ready_at = u.due, finished_at = u.finished,
        output_sealed = u.output, output_preview = u.preview::jsonb, updated_at = $2::timestamptz
    FROM u WHERE jobs.id = u.job_id AND jobs.workspace_id = $1::text AND u.update_job
    RETURNING jobs.endpoint_id
), x AS (
    UPDATE job_executions x SET outcome = u.outcome, retryable = u.retryable, retry_after_ms = u.retry_after,
        error_sealed = u.err, reported_at = $2::timestamptz, ended_at = $2::timestamptz, result_status = u.next,
        next_due_at = u.due, warning = coalesce(u.warning, x.warning), output_rejected = u.rejected
    FROM u WHERE x.job_id = u.job_id AND x.attempt = u.attempt
), freed AS (
    SELECT endpoint_id, count(*)::int AS n FROM j GROUP BY endpoint_id
), gated AS (
    SELECT e.id FROM job_endpoints e
    WHERE e.id IN (SELECT endpoint_id FROM freed) AND e.max_concurrent IS NOT NULL
    ORDER BY e.id
    FOR UPDATE
)
UPDATE job_endpoints e SET running_count = GREATEST(0, e.running_count - f.n)
FROM freed f JOIN gated g ON g.id = f.endpoint_id
WHERE e.id = f.endpoint_id;
END
$fn$;

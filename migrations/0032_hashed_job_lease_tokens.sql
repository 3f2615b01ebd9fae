-- Job lease tokens are stored hashed (security review): jobs.lease_token
-- and job_executions.lease_token held each token in clear, so anyone who
-- could read the database (a backup, a read replica, a support query)
-- could heartbeat or report another worker's job, and so end it with an
-- output of their choosing. The gate has stored only a hash of its lease
-- tokens since 0002. A claim now answers the token and stores its SHA-256
-- (hex: 64 characters); a random 128-bit token needs no key to resist
-- guessing, and presenting the stored hash itself proves nothing.
--
-- Tokens stored before this migration are the 32-character tokens
-- themselves, and their attempts may still be at work or be reported again
-- (a repeated report answers what the first one did), so a stored token is
-- compared by its length: 64 characters are a hash, anything else is a
-- token from before (jobs_lease_token_matches). Every comparison goes
-- through it (jobs_report_lock below, lib/jobs/sql.go).
--
-- Claims go through jobs_claim_hashed, 0018's jobs_claim verbatim but for
-- the token (pick draws it, the job and its execution store its hash, the
-- answer carries it) and for a bound on the answer's size (p_max_input_bytes:
-- the candidates are cut where their inputs pass it, before slots are
-- granted; deployment review: a claim of 100 large inputs passed what
-- Vercel and Lambda can answer, and its leased jobs were lost each time). jobs_claim stays, unchanged, for the previous release
-- during a deploy: a job it claims keeps a token in clear, which both
-- releases accept.

-- jobs_lease_token_stored is the form in which a lease token is stored.
CREATE FUNCTION jobs_lease_token_stored(p_token text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $fn$ SELECT encode(sha256(convert_to(p_token, 'UTF8')), 'hex') $fn$;

-- jobs_lease_token_matches says whether a presented token ($2) is the one
-- stored ($1): its hash, or, stored before 0032, itself. NULL when either
-- is NULL (a requeued job's token).
CREATE FUNCTION jobs_lease_token_matches(p_stored text, p_token text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
SELECT CASE WHEN length(p_stored) = 64 THEN p_stored = encode(sha256(convert_to(p_token, 'UTF8')), 'hex')
            ELSE p_stored = p_token END
$fn$;

-- jobs_claim_hashed leases up to $5 jobs to worker $1 whose sealed inputs
-- add up to at most $9 bytes (see sqlClaim).
CREATE FUNCTION jobs_claim_hashed(p_worker_id text, p_workspace_id text, p_now timestamptz, p_key_id text,
    p_limit integer, p_grace_ms bigint, p_rate_window timestamptz, p_warning text, p_max_input_bytes bigint)
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
), locked AS (
    SELECT c.id, c.endpoint_id, c.ready_at, c.status = 'RUNNING' AS reclaim, c.size
    FROM tools t
    CROSS JOIN LATERAL (
        SELECT j.id, j.endpoint_id, j.ready_at, j.status, coalesce(octet_length(j.input_sealed), 0) AS size
        FROM jobs j
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
), cand AS (
    -- The answer carries every input, and serverless platforms cap an
    -- answer (Vercel 4.5 MB, Lambda 6 MB; a claim over it is lost with its
    -- leases, again and again): the first candidates whose inputs fit in
    -- $9 bytes together, and always the first. Endpoint slots are granted
    -- from these only.
    SELECT b.id, b.endpoint_id, b.ready_at, b.reclaim FROM (
        SELECT l.*, sum(l.size) OVER (ORDER BY l.ready_at, l.id) AS upto,
               row_number() OVER (ORDER BY l.ready_at, l.id) AS n
        FROM locked l
    ) b
    WHERE b.n = 1 OR b.upto <= $9::bigint
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
    -- A CTE with a volatile call is never inlined: one token per job.
    SELECT c.id, c.reclaim, replace(gen_random_uuid()::text, '-', '') AS token FROM (
        SELECT cand.*, row_number() OVER (PARTITION BY endpoint_id, reclaim ORDER BY ready_at, id) AS rn FROM cand
    ) c JOIN grants g ON g.id = c.endpoint_id
    WHERE c.rn <= CASE WHEN c.reclaim THEN g.g_re ELSE g.g_new END
), claimed AS (
    UPDATE jobs j SET status = 'RUNNING', attempt = j.attempt + 1,
        lease_token = jobs_lease_token_stored(p.token),
        lease_expires_at = $3::timestamptz + (j.timeout_ms + $6::bigint) * interval '1 millisecond',
        ready_at = $3::timestamptz + (j.timeout_ms + $6::bigint) * interval '1 millisecond',
        worker_id = $1::text, updated_at = $3::timestamptz
    FROM pick p WHERE j.id = p.id
    RETURNING j.id, j.step_id, j.run_id, j.name, j.version, j.attempt, j.max_attempts, p.token AS lease_token,
              j.lease_token AS stored_token, j.lease_expires_at, j.timeout_ms, j.idempotency_key, j.input_sealed,
              p.reclaim
), lapsed AS (
    UPDATE job_executions x SET outcome = 'FAILED', warning = $8::text, ended_at = $3::timestamptz
    FROM claimed c
    -- The array keeps this a primary-key probe however the planner sizes claimed.
    WHERE x.job_id = ANY (ARRAY(SELECT id FROM claimed WHERE reclaim))
      AND c.reclaim AND x.job_id = c.id AND x.attempt = c.attempt - 1 AND x.outcome IS NULL
), exe AS (
    INSERT INTO job_executions (job_id, attempt, workspace_id, worker_id, lease_token, started_at, lease_expires_at)
    SELECT id, attempt, $2::text, $1::text, stored_token, $3::timestamptz, lease_expires_at FROM claimed
)
SELECT id, step_id, run_id, name, version, attempt, max_attempts, lease_token, lease_expires_at, timeout_ms,
       idempotency_key, input_sealed
FROM claimed ORDER BY lease_expires_at, id;
END
$fn$;

-- jobs_report_lock locks a report batch's jobs in id order ($1, sorted) in
-- workspace $2 and reads each with the execution its token ($3, parallel to
-- $1) names (see sqlReportLock). 0011's, verbatim but for the comparison of
-- tokens; the previous release calls it too, with tokens either form accepts.
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
LEFT JOIN job_executions x ON x.job_id = j.id AND jobs_lease_token_matches(x.lease_token, u.lease_token)
ORDER BY j.id
FOR UPDATE OF j;
END
$fn$;

-- A claim marks its worker seen at most once a minute, as a heartbeat does
-- (0011 made it stamp job_workers.last_seen_at at every claim). A worker
-- long-polling an empty queue looks once a second (lib/jobs pollMax), and
-- every look was a write: a row update and a commit waiting for its WAL
-- flush, per idle worker per second, for a timestamp read only by queue
-- health (seen within 2 minutes) and the idle-workers prune (not seen for
-- JOB_RETENTION_DAYS). An empty look now writes nothing.
--
-- And the sweeper's idle-workers prune (lib/jobs sqlDeleteIdleWorkers)
-- gets an index leading with last_seen_at: it read the whole table for the
-- few registrations due (61 ms a pass at 200k; job_workers_seen_idx, 0003,
-- leads with the workspace). An update of last_seen_at was already not HOT
-- (job_workers_seen_idx holds it); now it comes once a minute at most.
--
-- Built inside the migration's transaction, which blocks writes to
-- job_workers (registrations, and claims marking their worker seen) while
-- it builds: on a large table build it first with CREATE INDEX
-- CONCURRENTLY under the same name (README, "Upgrading"): IF NOT EXISTS
-- then leaves it be.
--
-- And each execution records the handler version it was claimed for
-- (job_executions.version): an endpoint's attempts list read the job's
-- current version, so after a replay onto another handler version every
-- earlier attempt read as run by the new one (console QA). Nullable with no
-- default, so adding it rewrites nothing; executions from before read the
-- job's version, as they did.
--
-- Same arguments and result as 0052's, which is otherwise unchanged.

-- The column first, then the index: the executions' lock before the
-- workers'. The previous release serves while this applies, and its
-- heartbeats and its claims sent with a claimId (every SDK's) take
-- job_executions before job_workers in one statement: the other way round,
-- one that came while the index was built held its lock on executions and
-- waited for the build, and the ALTER then waited for it, a deadlock that
-- failed the heartbeat, the claim, or (once the build took over a second,
-- deadlock_timeout) the migration and the deploy with it. Both IF NOT
-- EXISTS forms take their lock even when there is nothing to do. A claim
-- sent without a claimId locks job_workers before job_executions, in two
-- statements: one caught between them as this applies may still deadlock
-- with it, and Postgres fails one of the two (the server runs a claim
-- again; a migration fails whole, and is run again).
ALTER TABLE job_executions ADD COLUMN IF NOT EXISTS version text;

CREATE INDEX IF NOT EXISTS job_workers_last_seen_idx ON job_workers (last_seen_at);

CREATE OR REPLACE FUNCTION jobs_claim_keyed(p_worker_id text, p_workspace_id text, p_now timestamptz, p_key_id text,
    p_limit integer, p_grace_ms bigint, p_rate_window timestamptz, p_warning text, p_max_input_bytes bigint,
    p_claim_id text, p_claim_secret text)
RETURNS TABLE (id text, step_id text, run_id text, name text, version text, attempt integer, max_attempts integer,
    lease_token text, lease_expires_at timestamptz, timeout_ms bigint, idempotency_key text, input_sealed bytea)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
DECLARE
    v_ids text[];
    v_endpoints text[];
    v_ready timestamptz[];
    v_reclaim boolean[];
    v_attempts integer[];
    v_gated bigint; -- read only so that the endpoint lock (gated) runs
    -- Jobs this claim leaves alone (see above); NULL when none.
    v_skip text[] := string_to_array(nullif(current_setting('ratchet.claim_skip', true), ''), ',');
BEGIN
IF $10 IS NOT NULL THEN
    -- A claim sent again under its claim id takes the id's turn (the
    -- two-key form: a key space of its own), so that it waits for the first
    -- to commit, and answers what the first leased while those leases hold,
    -- renewed from now as a heartbeat would: the answer says the lease's
    -- full length (leaseMs), which the worker measures from when it sent
    -- this claim (review: the lease left by the first was shorter, and the
    -- worker's first heartbeat came after it lapsed and another worker had
    -- the job). Held jobs are locked in id order, as reports lock them.
    PERFORM pg_advisory_xact_lock(hashtext('ratchet.job_claim'), hashtext($1 || ':' || $10));
    RETURN QUERY
    WITH held AS (
        SELECT j.id, j.attempt
        FROM job_executions x
        JOIN jobs j ON j.id = x.job_id AND j.attempt = x.attempt
        WHERE x.worker_id = $1::text AND x.claim_id = $10::text AND x.workspace_id = $2::text
          AND j.status = 'RUNNING' AND j.worker_id = $1::text AND j.lease_expires_at > $3::timestamptz
          -- Only within one lease's length of the claim that leased it: a
          -- worker whose answers keep getting lost would otherwise renew
          -- the lease for good by asking again, and the job would never
          -- lapse to another worker.
          AND x.started_at > $3::timestamptz - (j.timeout_ms + $6::bigint) * interval '1 millisecond'
          AND jobs_lease_token_matches(j.lease_token, jobs_claim_token($11, j.id, j.attempt))
          AND EXISTS (SELECT 1 FROM job_workers w WHERE w.id = $1::text AND w.workspace_id = $2::text
                      AND w.key_id = $4::text)
        ORDER BY j.id
        FOR UPDATE OF j
    ), renewed AS (
        -- Never shorter: a heartbeat may have renewed it later than this
        -- claim's clock reading, taken before it waited for its turn.
        UPDATE jobs j SET lease_expires_at = greatest(j.lease_expires_at,
                $3::timestamptz + (j.timeout_ms + $6::bigint) * interval '1 millisecond'),
            ready_at = greatest(j.ready_at, $3::timestamptz + (j.timeout_ms + $6::bigint) * interval '1 millisecond'),
            updated_at = $3::timestamptz
        FROM held h
        WHERE j.id = h.id AND j.attempt = h.attempt AND j.status = 'RUNNING'
        RETURNING j.id, j.step_id, j.run_id, j.name, j.version, j.attempt, j.max_attempts, j.lease_expires_at,
                  j.timeout_ms, j.idempotency_key, j.input_sealed
    ), renewed_executions AS (
        UPDATE job_executions x SET lease_expires_at = r.lease_expires_at
        FROM renewed r WHERE x.job_id = r.id AND x.attempt = r.attempt
    ), wk AS (
        UPDATE job_workers SET last_seen_at = $3::timestamptz
        WHERE id = $1::text AND workspace_id = $2::text AND key_id = $4::text AND EXISTS (SELECT 1 FROM renewed)
          AND last_seen_at < $3::timestamptz - interval '1 minute'
    )
    SELECT r.id, r.step_id, r.run_id, r.name, r.version, r.attempt, r.max_attempts,
           jobs_claim_token($11, r.id, r.attempt), r.lease_expires_at, r.timeout_ms, r.idempotency_key,
           r.input_sealed
    FROM renewed r
    ORDER BY r.lease_expires_at, r.id;
    IF FOUND THEN
        RETURN;
    END IF;
END IF;
-- First statement: lease candidates (the jobs, SKIP LOCKED) and their
-- endpoints' rows, locked in id order. The second statement reads and
-- updates those rows: as a statement of its own, its snapshot is taken
-- after the locks, so it sees the versions locked. In one statement the
-- update read the row with the statement's older snapshot and could meet
-- an older version (one updated since by a transaction now committed, its
-- xmax a multixact with an enqueue's live foreign-key KEY SHARE): it then
-- queued for that version's tuple lock behind a claim that waited for it,
-- a deadlock (concurrency QA).
WITH wk AS (
    SELECT names, versions FROM job_workers
    WHERE id = $1::text AND workspace_id = $2::text AND key_id = $4::text
), seen AS (
    -- At most once a minute (see above); never back, under an instance
    -- whose clock is behind.
    UPDATE job_workers SET last_seen_at = $3::timestamptz
    WHERE id = $1::text AND workspace_id = $2::text AND key_id = $4::text
      AND last_seen_at < $3::timestamptz - interval '1 minute'
), tools AS (
    SELECT DISTINCT t.name, t.version FROM wk, unnest(wk.names, wk.versions) AS t(name, version)
), locked AS (
    SELECT c.id, c.endpoint_id, c.ready_at, c.status = 'RUNNING' AS reclaim, c.size, c.attempt
    FROM tools t
    CROSS JOIN LATERAL (
        SELECT j.id, j.endpoint_id, j.ready_at, j.status, coalesce(octet_length(j.input_sealed), 0) AS size,
               j.attempt
        FROM jobs j
        WHERE j.workspace_id = $2::text AND j.name = t.name AND j.version = t.version
          AND j.status IN ('QUEUED', 'RETRY_SCHEDULED', 'RUNNING') AND j.ready_at <= $3::timestamptz
          AND (j.status <> 'RUNNING' OR j.attempt < j.max_attempts)
          AND (v_skip IS NULL OR j.id <> ALL (v_skip))
          AND NOT EXISTS (SELECT 1 FROM job_endpoints p WHERE p.id = j.endpoint_id
              AND (p.paused
                   OR (p.rate_limit_per_minute IS NOT NULL AND p.rate_window_start >= $7::timestamptz
                       AND p.rate_window_count >= p.rate_limit_per_minute)
                   OR (j.status <> 'RUNNING' AND p.max_concurrent IS NOT NULL
                       AND p.running_count >= p.max_concurrent)
                   OR (p.circuit_state = 'open' AND p.circuit_probe_at > $3::timestamptz)
                   -- A replayed job whose cancelled attempt still holds a
                   -- slot waits for it (see above).
                   OR (j.slot_attempt IS NOT NULL AND p.max_concurrent IS NOT NULL)))
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
    SELECT b.id, b.endpoint_id, b.ready_at, b.reclaim, b.attempt FROM (
        SELECT l.*, sum(l.size) OVER (ORDER BY l.ready_at, l.id) AS upto,
               row_number() OVER (ORDER BY l.ready_at, l.id) AS n
        FROM locked l
    ) b
    WHERE b.n = 1 OR b.upto <= $9::bigint
), gated AS (
    SELECT e.id FROM job_endpoints e WHERE e.id IN (SELECT endpoint_id FROM cand)
    ORDER BY e.id
    FOR NO KEY UPDATE
)
SELECT array_agg(c.id ORDER BY c.ready_at, c.id), array_agg(c.endpoint_id ORDER BY c.ready_at, c.id),
       array_agg(c.ready_at ORDER BY c.ready_at, c.id), array_agg(c.reclaim ORDER BY c.ready_at, c.id),
       array_agg(c.attempt ORDER BY c.ready_at, c.id), (SELECT count(*) FROM gated)
INTO v_ids, v_endpoints, v_ready, v_reclaim, v_attempts, v_gated
FROM cand c;
IF v_ids IS NULL THEN
    RETURN;
END IF;

-- Second statement: grant from the locked endpoints' latest versions,
-- count the grants on them, and lease.
RETURN QUERY
WITH cand AS (
    SELECT * FROM unnest(v_ids, v_endpoints, v_ready, v_reclaim, v_attempts)
        AS c(id, endpoint_id, ready_at, reclaim, attempt)
), eps AS (
    SELECT e.id, e.paused, e.running_count, e.max_concurrent, e.rate_limit_per_minute, e.circuit_state,
           e.circuit_probe_at,
           CASE WHEN e.rate_window_start >= $7::timestamptz THEN e.rate_window_count ELSE 0 END AS window_count
    FROM job_endpoints e WHERE e.id IN (SELECT endpoint_id FROM cand)
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
    SELECT c.id, c.reclaim,
           CASE WHEN $11 IS NULL THEN replace(gen_random_uuid()::text, '-', '')
                ELSE jobs_claim_token($11, c.id, c.attempt + 1) END AS token FROM (
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
              p.reclaim, j.endpoint_id
), lapsed AS (
    UPDATE job_executions x SET outcome = 'FAILED', warning = $8::text, ended_at = $3::timestamptz
    FROM claimed c
    -- The array keeps this a primary-key probe however the planner sizes claimed.
    WHERE x.job_id = ANY (ARRAY(SELECT id FROM claimed WHERE reclaim))
      AND c.reclaim AND x.job_id = c.id AND x.attempt = c.attempt - 1 AND x.outcome IS NULL
), exe AS (
    INSERT INTO job_executions (job_id, attempt, workspace_id, worker_id, lease_token, started_at, lease_expires_at,
        claim_id, endpoint_id, version)
    SELECT id, attempt, $2::text, $1::text, stored_token, $3::timestamptz, lease_expires_at, $10::text, endpoint_id,
           version
    FROM claimed
)
SELECT id, step_id, run_id, name, version, attempt, max_attempts, lease_token, lease_expires_at, timeout_ms,
       idempotency_key, input_sealed
FROM claimed ORDER BY lease_expires_at, id;
END
$fn$;

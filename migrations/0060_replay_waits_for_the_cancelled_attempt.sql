-- A step cancelled while it ran and replayed before its attempt ended is not
-- claimed until that attempt has ended, on every endpoint: at most one
-- attempt of a step may be running at a time, as Temporal and River keep an
-- activity or job to one live attempt. Until now the replayed job was
-- claimable at once (except on an endpoint with maxConcurrent, 0052), while
-- the cancelled attempt's worker, told of the cancel only at its next
-- heartbeat, might still be calling the service: two attempts of one step
-- ran at once (replay QA).
--
-- The cancelled attempt is jobs.slot_attempt (0023: set by the cancel of
-- every RUNNING job, whatever its endpoint's limit, and cleared when the
-- attempt reports or the sweeper fails it once its lease expired), and its
-- lease is the job's lease_expires_at, which neither the cancel nor a replay
-- changes and nothing extends after the cancel (a heartbeat extends only a
-- RUNNING job's): once expired it stays so. The job's own column, not the
-- execution's, so that the claim's scan reads no other table (the step's
-- read shows the same lease, durableJob.leaseExpiresAt). A claim now passes
-- over a job whose held attempt's lease has not expired; once it has, the
-- claim takes the job at once, as it takes any lapsed job, without waiting
-- for the sweeper: the new attempt takes over the slot the held attempt held
-- (on an endpoint with maxConcurrent the count stays as it is, the held
-- attempt's slot becoming the new attempt's, as a lapsed job's reclaim keeps
-- its own), and the held attempt's execution is failed with the lapse
-- warning, as the sweeper fails it. The decision is taken on the job's
-- locked row (the claim's SKIP LOCKED re-reads a row changed since its
-- snapshot): a report of the held attempt, which locks the same row, comes
-- wholly before the claim (the job then needs a slot of its own) or after it
-- (then lease_lost: the claim superseded it).
--
-- A job claimed beside its held attempt before this migration (on an
-- endpoint without maxConcurrent) keeps that attempt in slot_attempt until
-- it reports or lapses, and the job's lease is then a later attempt's:
-- such a job is claimed again once that later lease expired.
--
-- Same arguments and result as 0058's, which is otherwise unchanged: the
-- previous release's claims during the deploy call this one.

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
    v_held integer[];
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
    -- reclaim: the job keeps the slot it holds (a lapsed RUNNING job's own,
    -- or the one its cancelled attempt held, held) and needs no new one.
    SELECT c.id, c.endpoint_id, c.ready_at, c.status = 'RUNNING' OR c.held IS NOT NULL AS reclaim, c.size,
           c.attempt, c.held
    FROM tools t
    CROSS JOIN LATERAL (
        SELECT j.id, j.endpoint_id, j.ready_at, j.status, coalesce(octet_length(j.input_sealed), 0) AS size,
               j.attempt, CASE WHEN j.status <> 'RUNNING' THEN j.slot_attempt END AS held
        FROM jobs j
        WHERE j.workspace_id = $2::text AND j.name = t.name AND j.version = t.version
          AND j.status IN ('QUEUED', 'RETRY_SCHEDULED', 'RUNNING') AND j.ready_at <= $3::timestamptz
          AND (j.status <> 'RUNNING' OR j.attempt < j.max_attempts)
          AND (v_skip IS NULL OR j.id <> ALL (v_skip))
          -- Never beside a cancelled attempt that may still run (see above):
          -- a job holding one waits for its report or its lease's expiry,
          -- on any endpoint.
          AND (j.slot_attempt IS NULL OR j.lease_expires_at <= $3::timestamptz)
          AND NOT EXISTS (SELECT 1 FROM job_endpoints p WHERE p.id = j.endpoint_id
              AND (p.paused
                   OR (p.rate_limit_per_minute IS NOT NULL AND p.rate_window_start >= $7::timestamptz
                       AND p.rate_window_count >= p.rate_limit_per_minute)
                   OR (j.status <> 'RUNNING' AND j.slot_attempt IS NULL AND p.max_concurrent IS NOT NULL
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
    SELECT b.id, b.endpoint_id, b.ready_at, b.reclaim, b.attempt, b.held FROM (
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
       array_agg(c.attempt ORDER BY c.ready_at, c.id), array_agg(c.held ORDER BY c.ready_at, c.id),
       (SELECT count(*) FROM gated)
INTO v_ids, v_endpoints, v_ready, v_reclaim, v_attempts, v_held, v_gated
FROM cand c;
IF v_ids IS NULL THEN
    RETURN;
END IF;

-- Second statement: grant from the locked endpoints' latest versions,
-- count the grants on them, and lease.
RETURN QUERY
WITH cand AS (
    SELECT * FROM unnest(v_ids, v_endpoints, v_ready, v_reclaim, v_attempts, v_held)
        AS c(id, endpoint_id, ready_at, reclaim, attempt, held)
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
    SELECT c.id, c.reclaim, c.held,
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
        worker_id = $1::text, updated_at = $3::timestamptz,
        -- The new attempt takes over the slot its cancelled attempt held.
        slot_attempt = CASE WHEN p.held IS NULL THEN j.slot_attempt END
    FROM pick p WHERE j.id = p.id
    RETURNING j.id, j.step_id, j.run_id, j.name, j.version, j.attempt, j.max_attempts, p.token AS lease_token,
              j.lease_token AS stored_token, j.lease_expires_at, j.timeout_ms, j.idempotency_key, j.input_sealed,
              p.reclaim, j.endpoint_id, p.held
), lapsed AS (
    UPDATE job_executions x SET outcome = 'FAILED', warning = $8::text, ended_at = $3::timestamptz
    FROM claimed c
    -- The array keeps this a primary-key probe however the planner sizes claimed.
    WHERE x.job_id = ANY (ARRAY(SELECT id FROM claimed WHERE reclaim))
      AND c.reclaim AND x.job_id = c.id AND x.attempt = coalesce(c.held, c.attempt - 1) AND x.outcome IS NULL
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

-- Three fixes to the surge breaker and one to leases (session 11's QA).
--
-- 1. The surge ceiling is exact whatever the callers' clocks say
--    (gate_surge). Begins of a type's new keys take turns (0025), but each
--    counted only the keys created at or before its own clock reading, taken
--    before it waited for its turn: a begin whose reading was earlier than
--    those of begins that went first (it read the clock, then queued; or
--    another instance's clock is behind) did not count them, and 60 new keys
--    at once from two instances let 11 to 16 through a ceiling of 10. Under
--    the turn nothing uncounted can be newer, so the count has no upper
--    bound now. gate_surge's body is 0013's, verbatim but for that line.
--
-- 2. A begin that waited for its turn is decided as of when it got it
--    (gate_begin_in_turn): its clock reading plus the time it waited. A
--    lease measured from before the wait was partly spent when granted, or
--    already lapsed: under on_indeterminate retry the key's next begin was
--    granted too while the first holder acted on its execute. (lib/gate
--    does the same after the locks it takes in statements of its own: a
--    run wallet's, a group's, an existing key's row.)
--
-- 3. A surge breaker whose cooldown ended and that trips again before the
--    sweeper's next pass is recorded closed first (gate_begin_in_turn, the
--    sweeper's own statement, lib/gate lapsedCloseSQL): gate_begin's trip
--    reopened the row in place, so subscribers saw tripped, tripped, closed.
--    The new parameter is that circuit.closed event's id; the 23-parameter
--    form stays for the previous release during a deploy.
--
-- 4. A heartbeat never shortens a lease (gate_heartbeat, 0010's body but for
--    that line): one that waited for the effect's row behind a later
--    heartbeat set the lease from its older clock reading.

CREATE OR REPLACE FUNCTION gate_surge(p_workspace_id text, p_effect_type text, p_idempotency_key text, p_surge_per_hour integer,
    p_surge_multiplier integer, p_first_seen timestamptz, p_now timestamptz, p_baseline_for timestamptz,
    p_baseline_median double precision, p_allowance_from timestamptz)
RETURNS TABLE (median double precision, stale boolean, volume bigint, threshold bigint, trips boolean)
LANGUAGE plpgsql STABLE ROWS 1
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH pol AS (SELECT $4 AS surge_per_hour, $5 AS surge_multiplier),
cbs AS (SELECT $6 AS first_seen, $8 AS baseline_for, $9 AS baseline_median, $10 AS allowance_from),
srg_base AS MATERIALIZED (
    SELECT b.median, b.stale, CASE WHEN pol.surge_per_hour IS NOT NULL THEN pol.surge_per_hour::bigint
     WHEN pol.surge_multiplier IS NOT NULL AND cbs.first_seen <= $7::timestamptz - interval '6 hours'
     THEN greatest(30, floor(pol.surge_multiplier * b.median))::bigint END AS threshold
    FROM pol, cbs, LATERAL (
        SELECT CASE WHEN NOT stale.v THEN cbs.baseline_median
                    WHEN pol.surge_per_hour IS NULL AND cbs.first_seen IS NOT NULL
                    THEN (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY coalesce(n.c, 0)) FILTER (WHERE cbs.first_seen IS NOT NULL)
    FROM generate_series(greatest(date_trunc('hour', (cbs.first_seen)::timestamptz, 'UTC'), date_trunc('hour', ($7::timestamptz)::timestamptz, 'UTC') - interval '168 hours'),
                         date_trunc('hour', ($7::timestamptz)::timestamptz, 'UTC') - interval '1 hour', interval '1 hour') h(hr)
    LEFT JOIN (SELECT date_trunc('hour', (x.created_at)::timestamptz, 'UTC') AS hr, count(*) AS c FROM effects x
               WHERE x.workspace_id = $1 AND x.effect_type = $2
                 AND x.created_at >= date_trunc('hour', ($7::timestamptz)::timestamptz, 'UTC') - interval '168 hours' AND x.created_at < date_trunc('hour', ($7::timestamptz)::timestamptz, 'UTC')
               GROUP BY 1) n ON n.hr = h.hr) END AS median,
            stale.v AND pol.surge_per_hour IS NULL AND cbs.first_seen IS NOT NULL AS stale
        FROM (SELECT cbs.baseline_for IS DISTINCT FROM date_trunc('hour', ($7)::timestamptz, 'UTC') AS v) stale
        OFFSET 0 -- not pulled up, so the median is one subplan, evaluated once
    ) b
    WHERE NOT EXISTS (SELECT 1 FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3)
),
srg AS MATERIALIZED (
    SELECT v.median, v.stale, v.volume, v.threshold, v.threshold IS NOT NULL AND v.volume > v.threshold AS trips
    FROM (
        SELECT b.median, b.stale, b.threshold, 1 + (SELECT count(*) FROM (
            SELECT 1 FROM effects x
            WHERE x.workspace_id = $1 AND x.effect_type = $2
              AND x.created_at > (SELECT greatest($7::timestamptz - interval '1 hour', cbs.allowance_from) FROM cbs)
            ORDER BY x.created_at DESC
            LIMIT coalesce(b.threshold, 0)) q) AS volume
        FROM srg_base b
    ) v
)
SELECT srg.median, srg.stale, srg.volume, srg.threshold, srg.trips FROM srg;
END
$fn$;


CREATE FUNCTION gate_begin_in_turn(p_workspace_id text, p_effect_type text, p_idempotency_key text, p_cost_micros bigint,
    p_dimension_names text[], p_lease_seconds integer, p_fingerprint text, p_now timestamptz,
    p_effect_id text, p_dimensions jsonb, p_payload bytea, p_payload_preview jsonb, p_token_hash bytea,
    p_key_id text, p_approval_id text, p_run_id text, p_group_id text, p_compensation bytea,
    p_compensates_effect_id text, p_event_id text, p_key_ceiling bigint, p_refused text, p_trip_event_id text, p_close_event_id text)
RETURNS TABLE (on_indeterminate text, max_attempts integer, max_cost_micros bigint, approval_above_micros bigint,
    precheck text, missing_dimensions text[], fresh text, approval_reason text, eff_lease integer,
    key_found boolean, inserted boolean,
    id text, workspace_id text, effect_type text, idempotency_key text, fingerprint text, state text,
    denial_code text, attempt integer, lease_seconds integer, lease_expires_at timestamptz,
    attempt_started_at timestamptz, probe boolean, approval_id text, approval_state text, result bytea,
    result_preview jsonb, payload_preview jsonb, cost_micros bigint, run_id text, group_id text,
    compensates_effect_id text, created_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := $8;
    v_closed bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM gate_policies p
               WHERE p.workspace_id = $1 AND p.effect_type = $2
                 AND (p.surge_per_hour IS NOT NULL OR p.surge_multiplier IS NOT NULL))
       AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3) THEN
        IF NOT pg_try_advisory_xact_lock(hashtextextended('surge:' || $1 || ':' || $2, 0)) THEN
            PERFORM pg_advisory_xact_lock(hashtextextended('surge:' || $1 || ':' || $2, 0));
            v_now := $8 + (clock_timestamp() - statement_timestamp());
        END IF;

WITH cand AS (SELECT workspace_id, effect_type FROM gate_circuits
    WHERE workspace_id = $1 AND effect_type = $2 AND state = 'open' AND closes_at <= v_now
    FOR UPDATE), up AS (
    UPDATE gate_circuits c SET state = 'closed', updated_at = v_now,
        allowance_from = CASE WHEN c.closes_at <= v_now THEN c.closes_at ELSE v_now END
    FROM cand WHERE c.workspace_id = cand.workspace_id AND c.effect_type = cand.effect_type AND c.state = 'open'
    RETURNING c.workspace_id, c.effect_type, c.opened_by, c.opened_at, c.allowance_from
), n AS (
    SELECT up.*, row_number() OVER (ORDER BY up.workspace_id, up.effect_type) AS i FROM up
), evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
    SELECT (ARRAY[$24]::text[])[n.i], n.workspace_id, 'circuit.closed', n.effect_type,
        jsonb_build_object('effect_type', CASE WHEN n.effect_type <> '*' THEN n.effect_type END,
            'opened_by', n.opened_by, 'opened_at', n.opened_at, 'closed_at', n.allowance_from), v_now,
        'closed:' || extract(epoch FROM n.opened_at)::text
    FROM n
    ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING
)
SELECT count(*) INTO v_closed FROM up;
    END IF;
    RETURN QUERY SELECT * FROM gate_begin($1, $2, $3, $4, $5, $6, $7, v_now, $9, $10, $11, $12, $13, $14, $15, $16,
        $17, $18, $19, $20, $21, $22, $23);
END
$fn$;

CREATE OR REPLACE FUNCTION gate_heartbeat(p_effect_id text, p_workspace_id text, p_token_hash bytea, p_now timestamptz)
RETURNS TABLE (lease_expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    live boolean;
BEGIN
SELECT e.state = 'leased' AND e.lease_token_hash = $3 AND e.lease_expires_at > $4 INTO live
FROM effects e WHERE e.id = $1 AND e.workspace_id = $2
FOR UPDATE;
IF live IS NOT TRUE THEN
    RETURN;
END IF;
RETURN QUERY
WITH upd AS (
    UPDATE effects SET lease_expires_at = greatest(lease_expires_at, $4::timestamptz + make_interval(secs => lease_seconds)),
        updated_at = $4
    WHERE id = $1
    RETURNING id, attempt, lease_expires_at
), upa AS (
    UPDATE effect_attempts a SET lease_expires_at = upd.lease_expires_at
    FROM upd WHERE a.effect_id = upd.id AND a.attempt = upd.attempt
)
SELECT lease_expires_at FROM upd;
END
$fn$;

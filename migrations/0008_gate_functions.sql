-- The effect gate's hot statements as PL/pgSQL functions, so that they are
-- cheap to plan in the pool's default DB_QUERY_EXEC_MODE=exec (unnamed
-- statements, required behind transaction-mode poolers). In that mode
-- Postgres parses and plans every statement it is sent; begin's statement
-- (policy defaults, circuits, four inserts, the ceilings' charge, the
-- fallback read) took longer to plan than to run. PL/pgSQL keeps each
-- statement's plan for the life of the server session, so the client now
-- sends a one-line call and the large statement is planned once per
-- connection (custom plans for its first five runs, then the cached generic
-- plan, which stays on the primary-key and unique-key indexes).
--
-- Each body is the statement lib/gate sent before this migration, verbatim,
-- with $n now naming the function's parameters (declared with the types the
-- statement used to cast them to), except that the policy's evaluation,
-- which begin's two statements shared as one Go fragment, is the function
-- gate_evaluate that both call. lib/gate/queries.go documents each
-- parameter and holds only the calls. The SQL lives here alone: a later
-- change is a new migration with CREATE OR REPLACE FUNCTION and the same
-- signature. Postgres refuses CREATE OR REPLACE when the parameters' types
-- or the result columns (names or types) change: such a migration drops the
-- function first (DROP FUNCTION gate_begin(text, ...)) in the same file, and
-- the Go call changes with it.
--
-- Behaviour is unchanged:
--   - one RETURN QUERY statement, so one snapshot, as before: begin's
--     fallback read still sees exactly what its insert raced with;
--   - gate_refuse() raises through the function with its SQLSTATE (RTB01)
--     and DETAIL intact, and aborts the whole call, as it aborted the
--     statement;
--   - VOLATILE, SECURITY INVOKER (the caller's privileges), and the
--     search_path the tables were created under (FROM CURRENT), whatever
--     the calling session's is;
--   - #variable_conflict use_column: a name that is both a result column
--     and a table column means the table's column, as in the plain statement
--     (parameters are referred to as $n only).


-- gate_evaluate: the policy's verdict on a begin, shared by gate_begin and
-- gate_begin_locked ($7 is now). It only reads, and is STABLE so that it
-- reads with the snapshot of the statement that calls it, as the same CTEs
-- did inline. The CTEs:
--   pol      the effective policy (the defaults of sqlEffectivePolicy);
--   cbs..brk the circuits holding the begin. cbs reads the type's breaker,
--            the stop and the type's sighting (three primary-key probes on
--            every begin). srg runs only when the policy configures surge,
--            the type's breaker is not already open and the key is new (a
--            surge counts keys begun for the first time). Its cost is
--            bounded: the learned baseline (the 7-day median of hourly
--            volume) is cached per UTC hour on gate_effect_types, computed by
--            the first new key of an hour and read back by the rest; the
--            volume counts at most threshold rows of the effects index, from
--            the later of an hour ago and the breaker's last close (a closed
--            breaker grants a fresh allowance). brk is the strictest action;
--   ev       the verdict: precheck, fresh, the effective lease.
-- It answers one row: the verdict, what a grant charges against (the
-- policy's ceilings), and the surge (whether this new key trips the breaker,
-- and the baseline to cache).
CREATE OR REPLACE FUNCTION gate_evaluate(p_workspace_id text, p_effect_type text, p_idempotency_key text, p_cost_micros bigint,
    p_dimension_names text[], p_lease_seconds integer, p_now timestamptz)
RETURNS TABLE (on_indeterminate text, max_attempts integer, max_cost_micros bigint, approval_above_micros bigint,
    precheck text, missing_dimensions text[], fresh text, approval_reason text, eff_lease integer,
    daily_budget_micros bigint, dimension_limits jsonb, surge_action text, surge_cooldown_seconds integer,
    surge_trips boolean, surge_volume bigint, surge_threshold bigint, surge_median double precision,
    surge_stale boolean)
LANGUAGE plpgsql STABLE ROWS 1
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH pol AS (
SELECT coalesce(p.version, 0) AS version,
       coalesce(p.mode, 'allow') AS mode,
       coalesce(p.on_indeterminate, 'block') AS on_indeterminate,
       coalesce(p.lease_seconds, 60) AS lease_seconds,
       coalesce(p.max_attempts, 5) AS max_attempts,
       p.max_cost_micros, p.approval_above_micros, p.daily_budget_micros, p.reconcile_every_hours,
       coalesce(p.require_cost, false) AS require_cost,
       coalesce(p.required_dimensions, '{}') AS required_dimensions,
       coalesce(p.dimension_limits, '{}') AS dimension_limits,
       p.structuring_threshold_micros, p.surge_per_hour, p.surge_multiplier,
       coalesce(p.surge_action, 'require_approval') AS surge_action,
       coalesce(p.surge_cooldown_seconds, 3600) AS surge_cooldown_seconds,
       coalesce(p.retention_days, 90) AS retention_days,
       p.updated_at
FROM (SELECT 1) AS one
LEFT JOIN gate_policies p ON p.workspace_id = $1 AND p.effect_type = $2),
cbs AS (
    SELECT (SELECT s.action FROM gate_circuits s
            WHERE s.workspace_id = $1 AND s.effect_type = '*' AND s.state = 'open') AS stop_action,
        CASE WHEN c.state = 'open' AND (c.closes_at IS NULL OR c.closes_at > $7) THEN c.action END AS own_action,
        CASE WHEN c.state = 'open' AND c.closes_at <= $7 THEN c.closes_at ELSE c.allowance_from END AS allowance_from,
        t.first_seen_at AS first_seen, t.baseline_for, t.baseline_median
    FROM (SELECT 1) one
    LEFT JOIN gate_circuits c ON c.workspace_id = $1 AND c.effect_type = $2
    LEFT JOIN gate_effect_types t ON t.workspace_id = $1 AND t.effect_type = $2
),
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
    WHERE (pol.surge_per_hour IS NOT NULL OR pol.surge_multiplier IS NOT NULL) AND cbs.own_action IS NULL
      AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3)
),
srg AS (
    SELECT v.median, v.stale, v.volume, v.threshold, v.threshold IS NOT NULL AND v.volume > v.threshold AS trips
    FROM (
        SELECT b.median, b.stale, b.threshold, 1 + (SELECT count(*) FROM (
            SELECT 1 FROM effects x, cbs
            WHERE x.workspace_id = $1 AND x.effect_type = $2 AND x.created_at <= $7
              AND x.created_at > greatest($7::timestamptz - interval '1 hour', cbs.allowance_from)
            LIMIT coalesce(b.threshold, 0)) q) AS volume
        FROM srg_base b
    ) v
),
brk AS (
    SELECT (ARRAY['monitor', 'require_approval', 'deny'])[greatest(
               array_position(ARRAY['monitor', 'require_approval', 'deny'], cbs.stop_action),
               array_position(ARRAY['monitor', 'require_approval', 'deny'], cbs.own_action),
               array_position(ARRAY['monitor', 'require_approval', 'deny'],
                              CASE WHEN srg.trips THEN pol.surge_action END))] AS action
    FROM cbs, pol LEFT JOIN srg ON true
),
ev AS (
    SELECT pol.on_indeterminate, pol.max_attempts, pol.max_cost_micros, pol.approval_above_micros,
        CASE WHEN (pol.require_cost OR pol.approval_above_micros IS NOT NULL) AND $4::bigint IS NULL THEN 'cost_required'
             WHEN cardinality(m.missing) > 0 THEN 'dimension_required' END AS precheck,
        m.missing AS missing_dimensions,
        CASE WHEN pol.mode = 'deny' THEN 'policy_denied'
             WHEN $4::bigint > pol.max_cost_micros THEN 'cost_ceiling_exceeded'
             WHEN brk.action = 'deny' THEN 'circuit_open'
             WHEN pol.mode = 'require_approval' THEN 'approval'
             WHEN brk.action = 'require_approval' THEN 'approval'
             WHEN $4::bigint >= pol.approval_above_micros THEN 'approval'
             ELSE 'execute' END AS fresh,
        CASE WHEN pol.mode = 'require_approval' THEN 'policy_requires_approval'
             WHEN brk.action = 'require_approval' THEN 'circuit_open'
             ELSE 'cost_at_or_above_threshold' END AS approval_reason,
        least(pol.lease_seconds, coalesce($6::int, pol.lease_seconds)) AS eff_lease
    FROM pol, brk, LATERAL (
        SELECT coalesce(array_agg(d ORDER BY d), '{}') AS missing
        FROM (SELECT unnest(pol.required_dimensions) UNION SELECT jsonb_object_keys(pol.dimension_limits)) x(d)
        WHERE NOT d = ANY($5::text[])
    ) m
)
SELECT ev.on_indeterminate, ev.max_attempts, ev.max_cost_micros, ev.approval_above_micros, ev.precheck,
    ev.missing_dimensions, ev.fresh, ev.approval_reason, ev.eff_lease,
    pol.daily_budget_micros, pol.dimension_limits, pol.surge_action, pol.surge_cooldown_seconds,
    srg.trips, srg.volume, srg.threshold, srg.median, srg.stale
FROM ev, pol LEFT JOIN srg ON true;
END
$fn$;

-- gate_begin: begin in one round trip for a new key (insert the effect, its
-- first attempt or its approval) and for an existing one (read it back); see
-- lib/gate/queries.go for its parameters and answer. The CTEs:
--   ev       gate_evaluate's row;
--   ins      the effect; grant_src..refused charge the ceilings of an
--            execute grant (gate_refuse aborts the call when one does not
--            fit); att the first attempt with its charges;
--   trip..   open the breaker once when this new key tripped it, record
--            circuit.tripped, the type's first sighting and the baseline;
--   apr, evt the approval and approval.requested;
--   cur      the inserted row, or the existing one read with the same
--            snapshot (no row when a concurrent begin inserted the key: the
--            caller then takes the locked path).
CREATE OR REPLACE FUNCTION gate_begin(p_workspace_id text, p_effect_type text, p_idempotency_key text, p_cost_micros bigint,
    p_dimension_names text[], p_lease_seconds integer, p_fingerprint text, p_now timestamptz,
    p_effect_id text, p_dimensions jsonb, p_payload bytea, p_payload_preview jsonb, p_token_hash bytea,
    p_key_id text, p_approval_id text, p_run_id text, p_group_id text, p_compensation bytea,
    p_compensates_effect_id text, p_event_id text, p_key_ceiling bigint, p_refused text, p_trip_event_id text)
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
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH ev AS (SELECT * FROM gate_evaluate($1, $2, $3, $4, $5, $6, $8)),
ins AS (
    INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state, denial_code,
        attempt, lease_token_hash, lease_seconds, lease_expires_at, attempt_started_at, probe, approval_id,
        approval_state, payload, payload_preview, cost_micros, dimensions, run_id, group_id, compensation,
        compensates_effect_id, created_by_key_id, created_at, updated_at)
    SELECT $9, $1, $2, $3, $7,
        CASE ev.fresh WHEN 'execute' THEN 'leased' WHEN 'approval' THEN 'awaiting_approval' ELSE 'denied' END,
        CASE WHEN ev.fresh NOT IN ('execute', 'approval') THEN ev.fresh END,
        CASE ev.fresh WHEN 'execute' THEN 1 ELSE 0 END,
        CASE ev.fresh WHEN 'execute' THEN $13::bytea END,
        ev.eff_lease,
        CASE ev.fresh WHEN 'execute' THEN $8::timestamptz + make_interval(secs => ev.eff_lease) END,
        CASE ev.fresh WHEN 'execute' THEN $8::timestamptz END,
        false,
        CASE ev.fresh WHEN 'approval' THEN $15::text END,
        CASE ev.fresh WHEN 'approval' THEN 'pending' END,
        $11, $12::jsonb, $4, $10::jsonb, $16, $17, $18, $19, $14, $8, $8
    FROM (SELECT e.precheck, e.eff_lease, e.approval_reason,
              CASE WHEN e.fresh = 'execute' AND $22::text IS NOT NULL THEN $22::text
                   ELSE e.fresh END AS fresh
          FROM ev e) ev
    WHERE ev.precheck IS NULL
    ON CONFLICT (workspace_id, idempotency_key) DO NOTHING
    RETURNING id, workspace_id, effect_type, idempotency_key, fingerprint, state, denial_code, attempt, lease_seconds, lease_expires_at, attempt_started_at, probe, approval_id, approval_state, result, result_preview, payload_preview, cost_micros, run_id, group_id, compensates_effect_id, created_at, updated_at
),
grant_src AS (
    SELECT $1::text AS workspace_id, $2::text AS effect_type, $4::bigint AS cost, $14::text AS key_id,
        $21::bigint AS key_ceiling, $10::jsonb AS dims, ev.daily_budget_micros, ev.dimension_limits,
        (($8)::timestamptz AT TIME ZONE 'UTC')::date AS day
    FROM ev, ins WHERE ins.state = 'leased'
),
plan AS (
    SELECT s.workspace_id, s.day, p.scope, p.label, coalesce(s.cost, 0)::bigint AS micros, 1::bigint AS count,
        p.cap_micros, p.cap_count
    FROM grant_src s, LATERAL (
        SELECT 'type:' || s.effect_type AS scope, 'type' AS label, s.daily_budget_micros AS cap_micros,
            NULL::bigint AS cap_count
        WHERE s.daily_budget_micros IS NOT NULL
        UNION ALL
        SELECT 'key:' || s.key_id, 'key', s.key_ceiling, NULL WHERE s.key_ceiling IS NOT NULL
        UNION ALL
        SELECT 'dim:' || s.effect_type || ':' || l.key || ':' || coalesce(s.dims ->> l.key, ''), 'dim:' || l.key,
            (l.value ->> 'daily_micros')::bigint, (l.value ->> 'daily_count')::bigint
        FROM jsonb_each(s.dimension_limits) l
        WHERE l.value ->> 'daily_micros' IS NOT NULL OR l.value ->> 'daily_count' IS NOT NULL
    ) p
),
chg AS (
    INSERT INTO gate_spend AS g (workspace_id, scope, day, micros, count, cap_micros, cap_count)
    SELECT workspace_id, scope, day, micros, count, cap_micros, cap_count FROM plan
    WHERE (cap_micros IS NULL OR micros <= cap_micros) AND (cap_count IS NULL OR count <= cap_count)
    ORDER BY scope
    ON CONFLICT (workspace_id, scope, day) DO UPDATE
    SET micros = g.micros + excluded.micros, count = g.count + excluded.count,
        cap_micros = excluded.cap_micros, cap_count = excluded.cap_count
    WHERE (excluded.cap_micros IS NULL OR g.micros + excluded.micros <= excluded.cap_micros)
      AND (excluded.cap_count IS NULL OR g.count + excluded.count <= excluded.cap_count)
    RETURNING scope
),
refused AS (
    SELECT gate_refuse(min(label)) AS refused FROM plan WHERE scope NOT IN (SELECT scope FROM chg)
    HAVING count(*) > 0
),
att AS (
    INSERT INTO effect_attempts (effect_id, attempt, workspace_id, lease_token_hash, probe, started_at,
        lease_expires_at, began_by_key_id, charges, charged_on)
    SELECT ins.id, 1, $1, $13, false, $8, ins.lease_expires_at, $14, (SELECT jsonb_agg(jsonb_build_object('scope', scope, 'micros', micros, 'count', count)
    ORDER BY scope) FROM plan), (SELECT max(day) FROM plan)
    FROM ins WHERE ins.state = 'leased'
),
trip AS (
    INSERT INTO gate_circuits AS c (workspace_id, effect_type, state, opened_by, action, reason, opened_at,
        closes_at, allowance_from, updated_at)
    SELECT $1, $2, 'open', 'surge', ev.surge_action, NULL, $8,
        $8::timestamptz + make_interval(secs => ev.surge_cooldown_seconds), NULL, $8
    FROM ev, ins WHERE ev.surge_trips
    ON CONFLICT (workspace_id, effect_type) DO UPDATE
    SET state = 'open', opened_by = 'surge', action = excluded.action, reason = NULL,
        opened_at = excluded.opened_at, closes_at = excluded.closes_at, updated_at = excluded.updated_at
    WHERE c.state = 'closed' OR c.closes_at <= excluded.opened_at
    RETURNING c.action, c.opened_at, c.closes_at
),
trip_evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
    SELECT $23, $1, 'circuit.tripped', $2,
        jsonb_build_object('effect_type', $2::text, 'opened_by', 'surge', 'action', trip.action,
            'volume_last_hour', ev.surge_volume, 'threshold', ev.surge_threshold, 'opened_at', trip.opened_at,
            'closes_at', trip.closes_at), $8, 'surge:' || extract(epoch FROM trip.opened_at)::text
    FROM trip, ev
    ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING
),
seen AS (
    INSERT INTO gate_effect_types (workspace_id, effect_type, first_seen_at)
    SELECT $1, $2, $8 FROM ins
    ON CONFLICT (workspace_id, effect_type) DO NOTHING
),
baseline_cache AS (
    UPDATE gate_effect_types t SET baseline_for = date_trunc('hour', ($8)::timestamptz, 'UTC'), baseline_median = ev.surge_median
    FROM ev WHERE ev.surge_stale AND ev.surge_median IS NOT NULL AND t.workspace_id = $1 AND t.effect_type = $2
      AND t.baseline_for IS DISTINCT FROM date_trunc('hour', ($8)::timestamptz, 'UTC')
),
apr AS (
    INSERT INTO approvals (id, workspace_id, effect_id, effect_type, state, reason, created_at)
    SELECT $15, $1, ins.id, $2, 'pending', ev.approval_reason, $8 FROM ins, ev WHERE ins.state = 'awaiting_approval'
),
evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at)
    SELECT $20, $1, 'approval.requested', $15,
        jsonb_build_object('approval_id', $15::text, 'effect_id', ins.id, 'effect_type', $2::text,
                           'reason', ev.approval_reason), $8
    FROM ins, ev WHERE ins.state = 'awaiting_approval'
),
cur AS (
    SELECT true AS inserted, ins.* FROM ins
    UNION ALL
    SELECT false, e.id, e.workspace_id, e.effect_type, e.idempotency_key, e.fingerprint, e.state, e.denial_code, e.attempt, e.lease_seconds, e.lease_expires_at, e.attempt_started_at, e.probe, e.approval_id, e.approval_state, e.result, e.result_preview, e.payload_preview, e.cost_micros, e.run_id, e.group_id, e.compensates_effect_id, e.created_at, e.updated_at FROM effects e
    WHERE e.workspace_id = $1 AND e.idempotency_key = $3 AND NOT EXISTS (SELECT 1 FROM ins)
)
SELECT ev.on_indeterminate, ev.max_attempts, ev.max_cost_micros, ev.approval_above_micros,
	ev.precheck, ev.missing_dimensions, ev.fresh, ev.approval_reason, ev.eff_lease, cur.inserted IS NOT NULL, coalesce(cur.inserted, false), coalesce(cur.id, ''), coalesce(cur.workspace_id, ''), coalesce(cur.effect_type, ''), coalesce(cur.idempotency_key, ''), coalesce(cur.fingerprint, ''), coalesce(cur.state, ''), cur.denial_code, coalesce(cur.attempt, 0), coalesce(cur.lease_seconds, 0), cur.lease_expires_at, cur.attempt_started_at, coalesce(cur.probe, false), cur.approval_id, cur.approval_state, cur.result, cur.result_preview, cur.payload_preview, cur.cost_micros, cur.run_id, cur.group_id, cur.compensates_effect_id, coalesce(cur.created_at, 'epoch'), coalesce(cur.updated_at, 'epoch')
FROM ev LEFT JOIN cur ON true
WHERE NOT EXISTS (SELECT 1 FROM refused);
END
$fn$;

-- gate_begin_locked: the same evaluation, with the effect's row locked until
-- the caller's transaction ends.
CREATE OR REPLACE FUNCTION gate_begin_locked(p_workspace_id text, p_effect_type text, p_idempotency_key text, p_cost_micros bigint,
    p_dimension_names text[], p_lease_seconds integer, p_fingerprint text, p_now timestamptz)
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
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH ev AS (SELECT * FROM gate_evaluate($1, $2, $3, $4, $5, $6, $8))
SELECT ev.on_indeterminate, ev.max_attempts, ev.max_cost_micros, ev.approval_above_micros,
	ev.precheck, ev.missing_dimensions, ev.fresh, ev.approval_reason, ev.eff_lease, true, false, e.id, e.workspace_id, e.effect_type, e.idempotency_key, e.fingerprint, e.state, e.denial_code, e.attempt, e.lease_seconds, e.lease_expires_at, e.attempt_started_at, e.probe, e.approval_id, e.approval_state, e.result, e.result_preview, e.payload_preview, e.cost_micros, e.run_id, e.group_id, e.compensates_effect_id, e.created_at, e.updated_at
FROM ev, effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3
    AND $7::text IS NOT NULL -- types the fingerprint, which this statement does not use
FOR UPDATE OF e;
END
$fn$;

-- gate_report: records the outcome of the live attempt, releases a failed
-- one's charges, and returns the effect with its attempts (no row when the
-- lease is not live: the caller classifies under the row lock).
CREATE OR REPLACE FUNCTION gate_report(p_effect_id text, p_workspace_id text, p_token_hash bytea, p_outcome text, p_result bytea,
    p_result_preview jsonb, p_now timestamptz, p_key_id text)
RETURNS TABLE (id text, workspace_id text, effect_type text, idempotency_key text, fingerprint text, state text,
    denial_code text, attempt integer, lease_seconds integer, lease_expires_at timestamptz,
    attempt_started_at timestamptz, probe boolean, approval_id text, approval_state text, result bytea,
    result_preview jsonb, payload_preview jsonb, cost_micros bigint, run_id text, group_id text,
    compensates_effect_id text, created_at timestamptz, updated_at timestamptz,
    attempts jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH upd AS (
    UPDATE effects SET state = $4, result = $5, result_preview = $6::jsonb, updated_at = $7
    WHERE id = $1 AND workspace_id = $2 AND state = 'leased' AND lease_token_hash = $3 AND lease_expires_at > $7
    RETURNING id, workspace_id, effect_type, idempotency_key, fingerprint, state, denial_code, attempt, lease_seconds, lease_expires_at, attempt_started_at, probe, approval_id, approval_state, result, result_preview, payload_preview, cost_micros, run_id, group_id, compensates_effect_id, created_at, updated_at
), upa AS (
    UPDATE effect_attempts a SET outcome = $4, reported_at = $7, reported_by_key_id = $8
    FROM upd WHERE a.effect_id = upd.id AND a.attempt = upd.attempt
    RETURNING a.*
),
rel_rows AS (
    SELECT g.workspace_id, g.scope, g.day, c.micros, c.count
    FROM upa a, jsonb_to_recordset(a.charges) AS c(scope text, micros bigint, count bigint), gate_spend g
    WHERE a.outcome = 'failed' AND g.workspace_id = a.workspace_id AND g.scope = c.scope AND g.day = a.charged_on
    ORDER BY g.scope
    FOR UPDATE OF g
),
rel AS (
    UPDATE gate_spend g SET micros = g.micros - r.micros, count = g.count - r.count
    FROM rel_rows r WHERE g.workspace_id = r.workspace_id AND g.scope = r.scope AND g.day = r.day
)
SELECT e.id, e.workspace_id, e.effect_type, e.idempotency_key, e.fingerprint, e.state, e.denial_code, e.attempt, e.lease_seconds, e.lease_expires_at, e.attempt_started_at, e.probe, e.approval_id, e.approval_state, e.result, e.result_preview, e.payload_preview, e.cost_micros, e.run_id, e.group_id, e.compensates_effect_id, e.created_at, e.updated_at,
  (SELECT jsonb_agg(jsonb_build_object(
      'attempt', a.attempt, 'outcome', a.outcome, 'probe', a.probe, 'started_at', a.started_at,
      'lease_expires_at', a.lease_expires_at, 'reported_at', a.reported_at,
      'began_by_key_id', a.began_by_key_id, 'reported_by_key_id', a.reported_by_key_id,
      'resolved_by_key_id', a.resolved_by_key_id, 'resolved_at', a.resolved_at) ORDER BY a.attempt)
   FROM (SELECT * FROM effect_attempts WHERE effect_id = $1 AND attempt <> e.attempt
         UNION ALL SELECT * FROM upa) a)
FROM upd e;
END
$fn$;

-- gate_heartbeat: extends a live lease by its length from now.
CREATE OR REPLACE FUNCTION gate_heartbeat(p_effect_id text, p_workspace_id text, p_token_hash bytea, p_now timestamptz)
RETURNS TABLE (lease_expires_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH upd AS (
    UPDATE effects SET lease_expires_at = $4::timestamptz + make_interval(secs => lease_seconds), updated_at = $4
    WHERE id = $1 AND workspace_id = $2 AND state = 'leased' AND lease_token_hash = $3 AND lease_expires_at > $4
    RETURNING id, attempt, lease_expires_at
), upa AS (
    UPDATE effect_attempts a SET lease_expires_at = upd.lease_expires_at
    FROM upd WHERE a.effect_id = upd.id AND a.attempt = upd.attempt
)
SELECT lease_expires_at FROM upd;
END
$fn$;

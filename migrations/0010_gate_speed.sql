-- Plans of the gate's functions (issue 6). Migration 0008 moved the hot
-- statements into PL/pgSQL so that they would be planned once per server
-- connection. They were not: PL/pgSQL plans a statement with its parameters'
-- values (a custom plan) for the first five calls and then switches to the
-- cached generic plan only if that plan's estimated cost is no higher than
-- the custom plans' average. For gate_evaluate and gate_begin it is higher
-- (a generic estimate cannot know that the surge subqueries are skipped), so
-- Postgres planned both large statements again on every begin. Measured
-- with pgbench calling the functions alone (one connection, 100 000
-- effects, this shared 2-core machine under load): gate_evaluate 4.8 ms per
-- call with custom plans, 0.27 ms with the cached generic plan; a begin on a
-- new key 3.2 ms, 0.6 ms.
--
-- And where the generic plan was taken it could be the wrong one: the
-- report's and the heartbeat's UPDATE (WHERE id = $1 ... AND state =
-- 'leased' AND lease_expires_at > $7) has a generic plan on
-- effects_leased_idx, which the planner prices below the primary key because
-- it is small at ANALYZE time. That scan visits every lease live or recently
-- live (dead index entries included, until vacuum): 680 buffers and 12 ms for
-- one report after some 13 000 leases, and growing with the load.
--
-- So:
--   - every gate function sets plan_cache_mode = force_generic_plan for its
--     own statements (a function's SET applies while it runs, and to
--     gate_evaluate called from gate_begin): each statement is planned once
--     per connection and its plan reused. The generic plans were checked
--     with EXPLAIN on 100 000 effects in one workspace (the case where a
--     workspace predicate selects everything): every probe is on a primary
--     or unique key, or on effects_type_created_idx with both ends of its
--     range, whatever the policy configures.
--   - gate_evaluate's surge volume takes its lower bound from a scalar
--     subquery (cbs is always exactly one row), so both ends of the hour are
--     index conditions instead of a filter after the join, and walks the
--     index newest first: the generic plan was otherwise a sequential scan
--     of effects that the LIMIT only cut short when the threshold was
--     reached (the whole table when the hour holds fewer keys). srg is
--     MATERIALIZED, as it is referenced twice and was counted twice. The
--     answer is unchanged.
--   - gate_report and gate_heartbeat first lock the effect by its primary
--     key alone (no state predicate, so no plan can take the partial index)
--     and check the lease on the locked row, then update by primary key.
--     The row lock is the one the UPDATE took: a concurrent report, grant or
--     lapse still serialises on it, the check reads the latest committed row
--     (READ COMMITTED locks the newest version), and a lease that is not
--     live still returns no row, so the caller classifies under the lock as
--     before. The attempt, charges and answer are the same statements.
--   - gate_begin and gate_begin_locked keep 0008's bodies (ALTER FUNCTION
--     adds the setting).
-- The three replaced bodies are 0008's otherwise, verbatim, and now live
-- here (0008 keeps gate_begin's and gate_begin_locked's). A later change is
-- a new migration; CREATE OR REPLACE without a SET clause would drop the
-- setting (TestGateFunctionsExist checks it).

-- gate_evaluate: 0008's, with the surge volume's bound as an index condition.
CREATE OR REPLACE FUNCTION gate_evaluate(p_workspace_id text, p_effect_type text, p_idempotency_key text, p_cost_micros bigint,
    p_dimension_names text[], p_lease_seconds integer, p_now timestamptz)
RETURNS TABLE (on_indeterminate text, max_attempts integer, max_cost_micros bigint, approval_above_micros bigint,
    precheck text, missing_dimensions text[], fresh text, approval_reason text, eff_lease integer,
    daily_budget_micros bigint, dimension_limits jsonb, surge_action text, surge_cooldown_seconds integer,
    surge_trips boolean, surge_volume bigint, surge_threshold bigint, surge_median double precision,
    surge_stale boolean)
LANGUAGE plpgsql STABLE ROWS 1
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
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
srg AS MATERIALIZED (
    SELECT v.median, v.stale, v.volume, v.threshold, v.threshold IS NOT NULL AND v.volume > v.threshold AS trips
    FROM (
        SELECT b.median, b.stale, b.threshold, 1 + (SELECT count(*) FROM (
            SELECT 1 FROM effects x
            WHERE x.workspace_id = $1 AND x.effect_type = $2 AND x.created_at <= $7
              AND x.created_at > (SELECT greatest($7::timestamptz - interval '1 hour', cbs.allowance_from) FROM cbs)
            ORDER BY x.created_at DESC
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

-- gate_begin and gate_begin_locked keep 0008's bodies; only their plans
-- change.
ALTER FUNCTION gate_begin(text, text, text, bigint, text[], integer, text, timestamptz, text, jsonb, bytea, jsonb,
    bytea, text, text, text, text, bytea, text, text, bigint, text, text)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION gate_begin_locked(text, text, text, bigint, text[], integer, text, timestamptz)
    SET plan_cache_mode = force_generic_plan;

-- gate_report: 0008's, with the lease checked on the row locked by primary key.
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
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    live boolean;
BEGIN
SELECT e.state = 'leased' AND e.lease_token_hash = $3 AND e.lease_expires_at > $7 INTO live
FROM effects e WHERE e.id = $1 AND e.workspace_id = $2
FOR UPDATE;
IF live IS NOT TRUE THEN
    RETURN;
END IF;
RETURN QUERY
WITH upd AS (
    UPDATE effects SET state = $4, result = $5, result_preview = $6::jsonb, updated_at = $7
    WHERE id = $1
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

-- gate_heartbeat: likewise.
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
    UPDATE effects SET lease_expires_at = $4::timestamptz + make_interval(secs => lease_seconds), updated_at = $4
    WHERE id = $1
    RETURNING id, attempt, lease_expires_at
), upa AS (
    UPDATE effect_attempts a SET lease_expires_at = upd.lease_expires_at
    FROM upd WHERE a.effect_id = upd.id AND a.attempt = upd.attempt
)
SELECT lease_expires_at FROM upd;
END
$fn$;

-- A key the evaluation refused before it was ever granted, policy_denied or
-- cost_ceiling_exceeded, counts towards the surge again when it is next
-- begun, as a key the breaker refused (circuit_open) has since 0040
-- (surge QA). Those two refusals come before the breaker's in
-- gate_evaluate, so a runaway loop's keys over the threshold under them
-- were recorded with them, not circuit_open: with surge_per_hour 10, action
-- deny and mode deny, 30 new keys were refused policy_denied and tripped
-- the breaker; once it cooled down and the policy let them through (mode
-- allow, or a higher max_cost_micros), all 30 executed when retried and
-- nothing tripped, where a backlog the breaker had refused is admitted up
-- to the threshold and trips it again. The ceilings refused at the grant
-- (budget_exceeded, key_budget_exceeded, dimension_limit_exceeded,
-- run_budget_exceeded) are not arrivals: the surge admitted those keys
-- within its allowance before a ceiling refused them.
--
-- gate_surge's body is 0040's but for the denial codes that make a key an
-- arrival (lib/gate arrivalDenials, which begin's locked path reads the
-- same way). Signature and result are unchanged. Until an instance of the
-- previous release is replaced, it reads these keys as no arrival: it
-- takes no surge turn for them and records no arrival, and its locked
-- path's evaluation (gate_begin_locked, through this function) counts one
-- outside the turn, which can only hold it (circuit_open, or an approval
-- under require_approval) when the count is over the threshold; it trips
-- no breaker.

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
    FROM generate_series(greatest(date_trunc('hour', (cbs.first_seen)::timestamptz, 'UTC'), date_trunc('hour', ($7::timestamptz)::timestamptz, 'UTC') - interval '168 hours',
                                  date_trunc('hour', ((SELECT h.history_from FROM gate_effect_history h WHERE h.workspace_id = $1 AND h.effect_type = $2))::timestamptz, 'UTC') + interval '1 hour'),
                         date_trunc('hour', ($7::timestamptz)::timestamptz, 'UTC') - interval '1 hour', interval '1 hour') h(hr)
    LEFT JOIN (SELECT date_trunc('hour', (x.created_at)::timestamptz, 'UTC') AS hr, count(*) AS c FROM effects x
               WHERE x.workspace_id = $1 AND x.effect_type = $2
                 AND x.created_at >= date_trunc('hour', ($7::timestamptz)::timestamptz, 'UTC') - interval '168 hours' AND x.created_at < date_trunc('hour', ($7::timestamptz)::timestamptz, 'UTC')
               GROUP BY 1) n ON n.hr = h.hr) END AS median,
            stale.v AND pol.surge_per_hour IS NULL AND cbs.first_seen IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3) AS stale
        FROM (SELECT cbs.baseline_for IS DISTINCT FROM date_trunc('hour', ($7)::timestamptz, 'UTC') AS v) stale
        OFFSET 0 -- not pulled up, so the median is one subplan, evaluated once
    ) b
    WHERE NOT EXISTS (SELECT 1 FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3
                      AND NOT (e.effect_type = $2 AND e.state = 'denied' AND e.denial_code IN ('circuit_open', 'policy_denied', 'cost_ceiling_exceeded')
                               AND e.attempt = 0))
),
win AS (SELECT greatest($7::timestamptz - interval '1 hour', cbs.allowance_from) AS start FROM cbs),
srg AS MATERIALIZED (
    SELECT v.median, v.stale, v.volume, v.threshold, v.threshold IS NOT NULL AND v.volume > v.threshold AS trips
    FROM (
        SELECT b.median, b.stale, b.threshold, 1 + (SELECT count(*) FROM (
            SELECT 1 FROM effects x
            WHERE x.workspace_id = $1 AND x.effect_type = $2
              AND x.created_at > (SELECT start FROM win)
            ORDER BY x.created_at DESC
            LIMIT coalesce(b.threshold + 1, 0)) q) + (SELECT count(*) FROM (
            SELECT 1 FROM effects x
            WHERE x.workspace_id = $1 AND x.effect_type = $2
              AND x.surge_arrived_at > (SELECT start FROM win) AND x.created_at <= (SELECT start FROM win)
            LIMIT coalesce(b.threshold + 1, 0)) r) - (SELECT count(*) FROM effects me
            WHERE me.workspace_id = $1 AND me.idempotency_key = $3 AND me.effect_type = $2
              AND (me.created_at > (SELECT start FROM win)
                   OR (me.surge_arrived_at > (SELECT start FROM win) AND me.created_at <= (SELECT start FROM win))))
            AS volume
        FROM srg_base b
    ) v
)
SELECT srg.median, srg.stale, srg.volume, srg.threshold, srg.trips FROM srg;
END
$fn$;

-- A learned surge baseline counts only the hours whose effects are all
-- still there (session 18). Retention deletes an effect type's ended effects
-- after its retention_days; with fewer than 7, the baseline's 7-day window
-- counted the deleted hours as quiet, its median fell to 0 and the learned
-- ceiling to its floor of 30, so ordinary traffic tripped the breaker.
--
-- gate_effect_history.history_from is the creation time of the newest
-- effect retention has deleted of a type (lib/gate sqlPurgeExpired upserts
-- it in the statement that deletes; it only moves forward): every hour after
-- its hour is complete, so the window starts there when that is later than
-- the first sighting and the week. No row: nothing deleted. A table of its
-- own, not a column of gate_effect_types: every begin of a new key inserts
-- into that one (ON CONFLICT DO NOTHING), and such an insert waits for a
-- transaction that updated the row it conflicts with, so a retention pass
-- held every new key of the types it purged until it committed (review).
-- It is read only when the hourly baseline is recomputed (the stale
-- branch), not on every begin, so gate_evaluate, which passes the first
-- sighting, is unchanged. gate_surge's body is 0028's but for that bound.
--
-- Types whose effects retention may already have deleted get the bound
-- their policy's retention gives (a deleted effect was created before it),
-- and their cached baselines are recomputed at their next begin. A type
-- whose retention was under 7 days before the upgrade but is longer now is
-- not bounded: until a week has passed, its baseline counts the hours
-- deleted before the upgrade as quiet, as it did before.
CREATE TABLE IF NOT EXISTS gate_effect_history (
    workspace_id text NOT NULL REFERENCES workspaces(id),
    effect_type  text NOT NULL,
    history_from timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, effect_type)
);

INSERT INTO gate_effect_history (workspace_id, effect_type, history_from)
SELECT t.workspace_id, t.effect_type, now() - make_interval(days => p.retention_days)
FROM gate_effect_types t
JOIN gate_policies p ON p.workspace_id = t.workspace_id AND p.effect_type = t.effect_type
WHERE p.retention_days < 8 AND t.first_seen_at < now() - make_interval(days => p.retention_days)
ON CONFLICT (workspace_id, effect_type) DO NOTHING;

UPDATE gate_effect_types t SET baseline_for = NULL
FROM gate_effect_history h
WHERE h.workspace_id = t.workspace_id AND h.effect_type = t.effect_type;

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

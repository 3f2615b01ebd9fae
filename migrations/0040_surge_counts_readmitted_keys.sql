-- A key a breaker refused before it was ever granted counts towards the
-- surge again when it is next begun after the breaker closed (session 22's
-- fix of session 21's circuits QA, high). The surge counted keys begun for
-- the first time only (API.md §5), and a refused key had been begun: with
-- surge_per_hour 10 and action deny, 80 new keys gave 10 execute and 70
-- circuit_open, and once the breaker closed (its cooldown, or an operator)
-- the same 70 keys all executed and nothing tripped again, so the backlog of
-- a runaway loop ran in full the moment the breaker let go. Seed 003:
-- closing "gives the effect type a fresh allowance; it does not disarm the
-- breaker, so a second surge trips it again".
--
-- Such a key (state denied, denial_code circuit_open, attempt 0) is now
-- counted as an arrival when begun again: begin's locked path takes the
-- type's surge turn first, as a new key's begin does, gate_surge counts it
-- with the new keys since the allowance began, it trips the breaker when it
-- goes over the threshold (and is held by its action, as the new key that
-- trips it is), and it is recorded in effects.surge_arrived_at whatever the
-- decision, as a new key is counted whatever its decision.
--
-- gate_surge's body is 0035's but for three things. It counts for a key
-- that is new or such an arrival (it counted only a new key). Its volume
-- adds the keys that arrived since the later of an hour ago and the
-- allowance's start and were created before it (one created after it is
-- counted by its creation already). And it takes the begin's own key out
-- of both counts, for the "1 +" counts it (review: a key refused under the
-- emergency stop, created within the hour, or begun again within the hour
-- of its last arrival, was counted twice and tripped the breaker one key
-- early); each count reads one row more than the threshold for that, so
-- that taking one out still leaves the threshold's worth. A key begun again
-- and again (under the stop, which does not stop the counting, or a
-- weaker breaker) counts once, at its latest arrival. The volume_last_hour
-- that GET /circuits shows still counts keys begun for the first time in
-- the trailing hour.
--
-- The column is NULL for every effect but those arrivals, so the partial
-- index has no entry for the rest and a begin of a new key adds none.
--
-- An arrival never reports the cached baseline stale (final read): its
-- begin's first statement, the fast path's, runs outside the surge turn,
-- inside a grouped or run-wallet begin's transaction, and gate_begin's
-- refresh of gate_effect_types held that row into the turn the arrival
-- takes next, while a new key's begin held the turn and waited for the row
-- (a deadlock). Only a new key's begin, which holds the turn, refreshes it;
-- an arrival computes the median when it is stale and writes nothing.
--
-- Built inside this migration's transaction, which blocks begins
-- meanwhile; README "Upgrading" shows how to build it first, concurrently.
ALTER TABLE effects ADD COLUMN IF NOT EXISTS surge_arrived_at timestamptz;
CREATE INDEX IF NOT EXISTS effects_surge_arrivals_idx ON effects (workspace_id, effect_type, surge_arrived_at)
    WHERE surge_arrived_at IS NOT NULL;

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
                      AND NOT (e.effect_type = $2 AND e.state = 'denied' AND e.denial_code = 'circuit_open'
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

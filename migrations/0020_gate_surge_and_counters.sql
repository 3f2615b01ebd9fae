-- Three fixes to the gate's functions (session 8's QA); each body
-- is 0013's, verbatim but for the lines named here.
--
-- 1. An open breaker of a weaker action no longer disarms a surge ceiling
--    (gate_evaluate). A type's surge was counted only while the type had
--    no open breaker of its own, whatever that breaker's action: a manual
--    `monitor` breaker (no cooldown) let every begin of a type whose policy
--    says surge_action `deny` execute for as long as it stayed open, and
--    seed 003's "watch before you enforce" (a monitor trip, then the policy
--    changed to deny) enforced nothing until the monitor trip's cooldown
--    ended. The surge is now counted unless the open breaker is at least as
--    strict as the policy's surge_action, and the strictest action decides,
--    as it does with the emergency stop.
-- 2. A surge that trips over such a weaker breaker opened by a surge
--    raises that breaker's action (gate_begin), keeping when it opened and
--    when it closes, and records circuit.tripped with the new action (its
--    dedupe key names the action, so the opening's own event is not taken
--    for it). A breaker opened by hand is left as the operator set it: the
--    surge's action then holds each begin while the volume is over the
--    ceiling.
-- 3. A scope with only a count ceiling (a dimension's daily_count) is
--    charged no micros (gate_begin's plan, and chargeCTEs in lib/gate):
--    nothing bounded their sum there, and ten grants of 10^18 overflowed
--    bigint, answering 500 to every begin charging that scope until the
--    UTC day rolled. A scope with a micros ceiling (at most 10^18) holds at
--    most that plus one amount, which fits. The attempt records what was
--    charged, so a failure's release gives back exactly that and a counter
--    never goes below zero (a sum saturating at the bigint maximum would
--    have, on the releases that followed).

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
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    ev         record;           -- gate_evaluate's one row
    v_grant    text;             -- what a new effect is given: ev.fresh, or a refused ceiling's denial
    cur        effects%ROWTYPE;  -- the new effect, or the one that holds the key (all NULL: none)
    v_found    boolean := false;
    v_inserted boolean := false;
    v_charges  jsonb;
    v_day      date;
BEGIN
    SELECT * INTO ev FROM gate_evaluate($1, $2, $3, $4, $5, $6, $8);

    IF ev.precheck IS NULL THEN
        v_grant := CASE WHEN ev.fresh = 'execute' AND $22::text IS NOT NULL THEN $22::text ELSE ev.fresh END;
        INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state, denial_code,
            attempt, lease_token_hash, lease_seconds, lease_expires_at, attempt_started_at, probe, approval_id,
            approval_state, payload, payload_preview, cost_micros, dimensions, run_id, group_id, compensation,
            compensates_effect_id, created_by_key_id, created_at, updated_at)
        VALUES ($9, $1, $2, $3, $7,
            CASE v_grant WHEN 'execute' THEN 'leased' WHEN 'approval' THEN 'awaiting_approval' ELSE 'denied' END,
            CASE WHEN v_grant NOT IN ('execute', 'approval') THEN v_grant END,
            CASE v_grant WHEN 'execute' THEN 1 ELSE 0 END,
            CASE v_grant WHEN 'execute' THEN $13::bytea END,
            ev.eff_lease,
            CASE v_grant WHEN 'execute' THEN $8::timestamptz + make_interval(secs => ev.eff_lease) END,
            CASE v_grant WHEN 'execute' THEN $8::timestamptz END,
            false,
            CASE v_grant WHEN 'approval' THEN $15::text END,
            CASE v_grant WHEN 'approval' THEN 'pending' END,
            $11, $12::jsonb, $4, $10::jsonb, $16, $17, $18, $19, $14, $8, $8)
        ON CONFLICT (workspace_id, idempotency_key) DO NOTHING
        RETURNING * INTO cur;
        v_inserted := FOUND;
    END IF;

    IF v_inserted THEN
        v_found := true;
        IF cur.state = 'leased' THEN
            -- The grant's charges, only when a ceiling applies: with none,
            -- plan is empty, nothing is charged, and the attempt records
            -- no charges (NULL), as before.
            IF ev.daily_budget_micros IS NOT NULL OR $21::bigint IS NOT NULL
               OR coalesce(ev.dimension_limits, '{}'::jsonb) <> '{}'::jsonb THEN
                WITH grant_src AS (
                    SELECT $1::text AS workspace_id, $2::text AS effect_type, $4::bigint AS cost, $14::text AS key_id,
                        $21::bigint AS key_ceiling, $10::jsonb AS dims, ev.daily_budget_micros AS daily_budget_micros,
                        ev.dimension_limits AS dimension_limits, ((($8)::timestamptz AT TIME ZONE 'UTC')::date) AS day
                ),
plan AS (
    SELECT s.workspace_id, s.day, p.scope, p.label,
        CASE WHEN p.cap_micros IS NULL THEN 0 ELSE coalesce(s.cost, 0) END::bigint AS micros, 1::bigint AS count,
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
)
                -- refused is read so that it runs: gate_refuse raises.
                SELECT (SELECT jsonb_agg(jsonb_build_object('scope', scope, 'micros', micros, 'count', count)
    ORDER BY scope) FROM plan), (SELECT max(day) FROM plan)
                INTO v_charges, v_day
                WHERE NOT EXISTS (SELECT 1 FROM refused);
            END IF;
            INSERT INTO effect_attempts (effect_id, attempt, workspace_id, lease_token_hash, probe, started_at,
                lease_expires_at, began_by_key_id, charges, charged_on)
            VALUES (cur.id, 1, $1, $13, false, $8, cur.lease_expires_at, $14, v_charges, v_day);
        END IF;

        IF ev.surge_trips THEN
            WITH trip AS (
                INSERT INTO gate_circuits AS c (workspace_id, effect_type, state, opened_by, action, reason, opened_at,
                    closes_at, allowance_from, updated_at)
                VALUES ($1, $2, 'open', 'surge', ev.surge_action, NULL, $8,
                    $8::timestamptz + make_interval(secs => ev.surge_cooldown_seconds), NULL, $8)
                ON CONFLICT (workspace_id, effect_type) DO UPDATE
                SET state = 'open', opened_by = 'surge', action = excluded.action,
                    reason = CASE WHEN c.state = 'closed' OR c.closes_at <= excluded.opened_at THEN NULL ELSE c.reason END,
                    opened_at = CASE WHEN c.state = 'closed' OR c.closes_at <= excluded.opened_at
                                     THEN excluded.opened_at ELSE c.opened_at END,
                    closes_at = CASE WHEN c.state = 'closed' OR c.closes_at <= excluded.opened_at
                                     THEN excluded.closes_at ELSE c.closes_at END,
                    updated_at = excluded.updated_at
                WHERE c.state = 'closed' OR c.closes_at <= excluded.opened_at
                   OR (c.opened_by = 'surge' AND array_position(ARRAY['monitor', 'require_approval', 'deny'], c.action)
                                                 < array_position(ARRAY['monitor', 'require_approval', 'deny'], excluded.action))
                RETURNING c.action, c.opened_at, c.closes_at
            )
            INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
            SELECT $23, $1, 'circuit.tripped', $2,
                jsonb_build_object('effect_type', $2::text, 'opened_by', 'surge', 'action', trip.action,
                    'volume_last_hour', ev.surge_volume, 'threshold', ev.surge_threshold, 'opened_at', trip.opened_at,
                    'closes_at', trip.closes_at), $8,
                'surge:' || extract(epoch FROM trip.opened_at)::text
                    || CASE WHEN trip.opened_at = $8 THEN '' ELSE ':' || trip.action END
            FROM trip
            ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING;
        END IF;

        INSERT INTO gate_effect_types (workspace_id, effect_type, first_seen_at)
        VALUES ($1, $2, $8)
        ON CONFLICT (workspace_id, effect_type) DO NOTHING;
    END IF;

    IF ev.surge_stale AND ev.surge_median IS NOT NULL THEN
        UPDATE gate_effect_types t SET baseline_for = date_trunc('hour', ($8)::timestamptz, 'UTC'), baseline_median = ev.surge_median
        WHERE t.workspace_id = $1 AND t.effect_type = $2
          AND t.baseline_for IS DISTINCT FROM date_trunc('hour', ($8)::timestamptz, 'UTC');
    END IF;

    IF v_inserted AND cur.state = 'awaiting_approval' THEN
        INSERT INTO approvals (id, workspace_id, effect_id, effect_type, state, reason, created_at)
        VALUES ($15, $1, cur.id, $2, 'pending', ev.approval_reason, $8);
        INSERT INTO events (id, workspace_id, type, subject_id, data, created_at)
        VALUES ($20, $1, 'approval.requested', $15,
            jsonb_build_object('approval_id', $15::text, 'effect_id', cur.id, 'effect_type', $2::text,
                               'reason', ev.approval_reason), $8);
    END IF;

    IF NOT v_inserted THEN
        SELECT * INTO cur FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3;
        v_found := FOUND;
    END IF;

    RETURN QUERY
    SELECT ev.on_indeterminate, ev.max_attempts, ev.max_cost_micros, ev.approval_above_micros,
        ev.precheck, ev.missing_dimensions, ev.fresh, ev.approval_reason, ev.eff_lease, v_found, v_inserted,
        coalesce(cur.id, ''), coalesce(cur.workspace_id, ''), coalesce(cur.effect_type, ''),
        coalesce(cur.idempotency_key, ''), coalesce(cur.fingerprint, ''), coalesce(cur.state, ''), cur.denial_code,
        coalesce(cur.attempt, 0), coalesce(cur.lease_seconds, 0), cur.lease_expires_at, cur.attempt_started_at,
        coalesce(cur.probe, false), cur.approval_id, cur.approval_state, cur.result, cur.result_preview,
        cur.payload_preview, cur.cost_micros, cur.run_id, cur.group_id, cur.compensates_effect_id,
        coalesce(cur.created_at, 'epoch'), coalesce(cur.updated_at, 'epoch');
END
$fn$;

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
DECLARE
    pol      record;  -- the effective policy
    cbs      record;  -- the circuits holding the type, and its sighting
    v_action text;    -- the strictest breaker action
BEGIN
    SELECT * INTO pol FROM (
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
LEFT JOIN gate_policies p ON p.workspace_id = $1 AND p.effect_type = $2) x;

    SELECT (SELECT s.action FROM gate_circuits s
            WHERE s.workspace_id = $1 AND s.effect_type = '*' AND s.state = 'open') AS stop_action,
        CASE WHEN c.state = 'open' AND (c.closes_at IS NULL OR c.closes_at > $7) THEN c.action END AS own_action,
        CASE WHEN c.state = 'open' AND c.closes_at <= $7 THEN c.closes_at ELSE c.allowance_from END AS allowance_from,
        t.first_seen_at AS first_seen, t.baseline_for, t.baseline_median
    INTO cbs
    FROM (SELECT 1) one
    LEFT JOIN gate_circuits c ON c.workspace_id = $1 AND c.effect_type = $2
    LEFT JOIN gate_effect_types t ON t.workspace_id = $1 AND t.effect_type = $2;

    -- A surge counts keys begun for the first time; gate_surge checks that.
    -- The type's own open breaker makes counting moot only when its action
    -- is at least as strict as the surge's (0020).
    IF (pol.surge_per_hour IS NOT NULL OR pol.surge_multiplier IS NOT NULL)
       AND (cbs.own_action IS NULL
            OR array_position(ARRAY['monitor', 'require_approval', 'deny'], cbs.own_action)
               < array_position(ARRAY['monitor', 'require_approval', 'deny'], pol.surge_action)) THEN
        SELECT s.trips, s.volume, s.threshold, s.median, s.stale
        INTO surge_trips, surge_volume, surge_threshold, surge_median, surge_stale
        FROM gate_surge($1, $2, $3, pol.surge_per_hour, pol.surge_multiplier, cbs.first_seen, $7,
            cbs.baseline_for, cbs.baseline_median, cbs.allowance_from) s;
    END IF;

    v_action := (ARRAY['monitor', 'require_approval', 'deny'])[greatest(
               array_position(ARRAY['monitor', 'require_approval', 'deny'], cbs.stop_action),
               array_position(ARRAY['monitor', 'require_approval', 'deny'], cbs.own_action),
               array_position(ARRAY['monitor', 'require_approval', 'deny'],
                              CASE WHEN surge_trips THEN pol.surge_action END))];

    -- A dimension with a ceiling is required even when the policy forgot to
    -- list it.
    missing_dimensions := '{}';
    IF cardinality(pol.required_dimensions) > 0 OR pol.dimension_limits <> '{}'::jsonb THEN
        SELECT coalesce(array_agg(d ORDER BY d), '{}') INTO missing_dimensions
        FROM (SELECT unnest(pol.required_dimensions) UNION SELECT jsonb_object_keys(pol.dimension_limits)) x(d)
        WHERE NOT d = ANY($5::text[]);
    END IF;

    on_indeterminate := pol.on_indeterminate;
    max_attempts := pol.max_attempts;
    max_cost_micros := pol.max_cost_micros;
    approval_above_micros := pol.approval_above_micros;
    precheck := CASE WHEN (pol.require_cost OR pol.approval_above_micros IS NOT NULL) AND $4::bigint IS NULL THEN 'cost_required'
             WHEN cardinality(missing_dimensions) > 0 THEN 'dimension_required' END;
    fresh := CASE WHEN pol.mode = 'deny' THEN 'policy_denied'
             WHEN $4::bigint > pol.max_cost_micros THEN 'cost_ceiling_exceeded'
             WHEN v_action = 'deny' THEN 'circuit_open'
             WHEN pol.mode = 'require_approval' THEN 'approval'
             WHEN v_action = 'require_approval' THEN 'approval'
             WHEN $4::bigint >= pol.approval_above_micros THEN 'approval'
             ELSE 'execute' END;
    approval_reason := CASE WHEN pol.mode = 'require_approval' THEN 'policy_requires_approval'
             WHEN v_action = 'require_approval' THEN 'circuit_open'
             ELSE 'cost_at_or_above_threshold' END;
    eff_lease := least(pol.lease_seconds, coalesce($6::int, pol.lease_seconds));
    daily_budget_micros := pol.daily_budget_micros;
    dimension_limits := pol.dimension_limits;
    surge_action := pol.surge_action;
    surge_cooldown_seconds := pol.surge_cooldown_seconds;
    RETURN NEXT;
END
$fn$;

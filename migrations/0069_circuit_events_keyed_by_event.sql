-- Every surge trip and every close of a breaker is announced, each keyed
-- by its own event (concurrency QA). circuit.tripped of a surge trip was
-- keyed by when the breaker opened (and the action of a raise), and
-- circuit.closed by when the breaker it closed opened, so a surge breaker
-- re-opened at the instant an earlier one of it opened took the earlier
-- cycle's keys: its trip and its close went unannounced. That instant
-- comes back when the instances' clocks lag: a trip at T through one
-- instance, the policy turning surge off through another whose clock
-- reads before T (the next allowance starts at that close, before T, and
-- the keys begun at T count in it), surge on again, and the next new key
-- through the first instance trips it at T again. A begin that met no
-- surge policy takes no surge turn, and its clock is not moved past the
-- allowance's start: when a PUT turning surge on lands before it
-- evaluates, it trips through an instance whose clock lags at an instant
-- the breaker opened at before, whatever closed that cycle.
--
-- Each event's key now ends with its event id, as the keys of an
-- operator's openings and closes do, so no transition takes another's
-- key. A repeat is still announced once: a trip records its event only
-- when its upsert changed the row, and a close only when it closed an open
-- row, each under the row's lock, so two racers never both record one
-- transition; the key was not what held that.
--
-- gate_begin is 0020's and gate_begin_in_turn 0056's, verbatim but for the
-- dedupe key of the trip's event and of the lapsed close's; lib/gate's
-- statements (surgeTripSQL, closeCTEs) key theirs the same way. Signatures
-- and results are unchanged. In a rolling deploy an instance of the
-- previous release begins through these bodies once this migration has
-- run, and keys the events of its own statements (an arrival's trip, the
-- sweeper's and a policy's closes, the lapsed close before an operator's
-- opening) as before: the old keys
-- never equal the new ones, so no event of the new release is lost to an
-- old one, and a transition is still announced once, held by the row as
-- above; two of the old instances' own events may still meet as before
-- until they are replaced.

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
                'surge:' || extract(epoch FROM trip.opened_at)::text || ':' || trip.action || ':' || $23
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

CREATE OR REPLACE FUNCTION gate_begin_in_turn(p_workspace_id text, p_effect_type text, p_idempotency_key text, p_cost_micros bigint,
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
    -- The begin's key, unless revoked since the calling instance cached it:
    -- no row, as the call's join on api_keys answered before 0046.
    IF NOT EXISTS (SELECT 1 FROM api_keys k WHERE k.id = $14 AND k.revoked_at IS NULL) THEN
        RETURN;
    END IF;

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
        'closed:' || extract(epoch FROM n.opened_at)::text || ':' || (ARRAY[$24]::text[])[n.i]
    FROM n
    ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING
)
SELECT count(*) INTO v_closed FROM up;
        v_now := greatest(v_now, (SELECT c.allowance_from + interval '1 microsecond' FROM gate_circuits c
    WHERE c.workspace_id = $1 AND c.effect_type = $2));
    END IF;
    RETURN QUERY SELECT * FROM gate_begin($1, $2, $3, $4, $5, $6, $7, v_now, $9, $10, $11, $12, $13, $14, $15, $16,
        $17, $18, $19, $20, $21, $22, $23);
END
$fn$;

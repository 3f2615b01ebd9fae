-- A begin of a type that counts no surge is stamped after the start of the
-- type's surge allowance too, when its clock reads at or before it, as a
-- begin in the surge turn is (0056). The surge counts the keys begun for
-- the first time since the allowance started whatever the policy said when
-- they were begun, so a policy turning surge on counts the keys begun
-- since the last close; one begun after the close through an instance
-- whose clock lags was stamped before its start and counted by no begin
-- after the PUT (concurrency QA: a close at C, a key begun through an
-- instance reading C - 1s, surge turned on at 1 an hour, and the next new
-- key executed too).
--
-- Such a begin takes no surge turn, so it reads the allowance in its own
-- snapshot: a close committing meanwhile comes after it, as it would were
-- the begin decided first. A breaker opened since holds the start of the
-- allowance its last close began, before its opening, and is read open
-- all the same (an opening is not compared with the clock): as in the
-- turn. A begin of a key begun before inserts nothing; its clock only
-- tells whether a breaker's cooldown ended, and is moved to no later than
-- just after the last close's. The price is one primary-key probe of
-- gate_circuits in each begin outside the turn.
--
-- The body is 0069's but for that statement, now after the IF rather than
-- inside it. Signature and result are unchanged: the previous release's
-- call gets the same stamping from the moment this runs.

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
    END IF;
    v_now := greatest(v_now, (SELECT c.allowance_from + interval '1 microsecond' FROM gate_circuits c
    WHERE c.workspace_id = $1 AND c.effect_type = $2));
    RETURN QUERY SELECT * FROM gate_begin($1, $2, $3, $4, $5, $6, $7, v_now, $9, $10, $11, $12, $13, $14, $15, $16,
        $17, $18, $19, $20, $21, $22, $23);
END
$fn$;

-- A new key's begin in the surge turn is stamped just after the start of
-- the surge allowance it is counted in when its clock reads at or before
-- it (race QA). The surge counts keys created after the allowance's start,
-- which is the cooldown's end or the closer's clock: the sweeper's, another
-- instance's, or an operator's, any of which may be ahead of the begin's
-- reading, itself taken before the request waited for the turn (0028 adds
-- the wait only to a begin that waited). A begin decided after the close
-- but stamped before its start was granted and counted by no later begin:
-- with the sweeper closing at 61 s and new keys begun at 59 s every one of
-- them executed, against an allowance of 2, until the begins' clocks
-- passed the cooldown's end; two instances' burst at the cooldown's end
-- gave 6 execute against 5.
--
-- Every close takes the turn (lib/gate: the sweeper tries it, an opening
-- of a lapsed breaker takes it, as did the rest), so the allowance read
-- here is the one gate_evaluate reads next, in the same turn. A begin that
-- read its clock after the start is unchanged, as is one that waited: the
-- wait already moved its reading. The stamp is the begin's clock for the
-- whole begin (its lease too), as a wait's is.
--
-- The body is 0046's but for that one statement, after the lapsed close;
-- lib/gate's arrivals apply the same text (afterAllowanceSQL) in the
-- statement that closes their lapsed breaker. Signature
-- and result are unchanged: the previous release's call begins as before.
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
        'closed:' || extract(epoch FROM n.opened_at)::text
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

-- gate_begin_locked: 0008's, with the effect's row locked by a statement of
-- its own before the policy and the circuits are evaluated. 0008 evaluated
-- them (gate_evaluate, in the statement's snapshot) and then waited for the
-- row in the same statement: a begin queued behind another request on the
-- same key (a begin, a report, a resolve) decided, once it got the row, on
-- the breakers as they stood before its wait, so a deny breaker or the
-- emergency stop opened meanwhile, and answered 200, did not refuse it
-- (gate QA: a failed key's retry queued behind a resolve was granted
-- execute after the stop). READ COMMITTED takes a new snapshot for each
-- statement of a VOLATILE function, so the evaluation below sees every
-- change committed before the lock was granted. Still one round trip.
-- The policy itself could not change during the wait (a begin holds its
-- type's policy turn shared from before it, sqlSharePolicy); the breakers
-- do not take that turn.
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
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
BEGIN
PERFORM 1 FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3 FOR UPDATE OF e;
IF NOT FOUND THEN
    RETURN; -- gone (retention): the caller answers retry_request
END IF;
RETURN QUERY
WITH ev AS (SELECT * FROM gate_evaluate($1, $2, $3, $4, $5, $6, $8))
SELECT ev.on_indeterminate, ev.max_attempts, ev.max_cost_micros, ev.approval_above_micros,
	ev.precheck, ev.missing_dimensions, ev.fresh, ev.approval_reason, ev.eff_lease, true, false, e.id, e.workspace_id, e.effect_type, e.idempotency_key, e.fingerprint, e.state, e.denial_code, e.attempt, e.lease_seconds, e.lease_expires_at, e.attempt_started_at, e.probe, e.approval_id, e.approval_state, e.result, e.result_preview, e.payload_preview, e.cost_micros, e.run_id, e.group_id, e.compensates_effect_id, e.created_at, e.updated_at
FROM ev, effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3
    AND $7::text IS NOT NULL -- types the fingerprint, which this statement does not use
FOR UPDATE OF e;
END
$fn$;

-- gate_begin_in_turn: 0070's, with a new key's turn taken first. gate_begin
-- evaluates the policy and the breakers, then inserts the key, and an
-- insert meeting the same key's uncommitted insert (a concurrent begin still
-- in its statement or its transaction) waits there; when that one rolled
-- back (a ceiling's refusal, a grouped begin done again) the waiter inserted
-- with the verdict read before its wait, so a deny breaker or the emergency
-- stop opened meanwhile, and answered 200, did not refuse it (gate QA). Every
-- begin of a key not yet in its snapshot now takes the key's turn
-- (an advisory lock held until its transaction ends) before gate_begin
-- evaluates: the second waits for the first there, and evaluates after.
-- Same parameters and result; still one call per begin.
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

    -- A key new to this statement's snapshot takes its turn (0077): a begin
    -- of the same new key whose insert is not committed holds it, so this
    -- one waits here, before anything is evaluated, not in its insert after
    -- evaluating, and evaluates in statements of their own once that one
    -- ended (committed: this one reads its row; rolled back: this one
    -- inserts, deciding on the breakers as they are then).
    IF NOT EXISTS (SELECT 1 FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3) THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('gate_key:' || $1 || '/' || $3, 0));
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

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

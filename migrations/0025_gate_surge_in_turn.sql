-- A surge breaker counts an effect type's new keys over the trailing hour
-- (gate_surge), and each begin counted what had committed when it started:
-- begins of new keys arriving together all saw the count from before the
-- burst, and 50 at once let up to 49 through a ceiling of 20 (QA; README had
-- called containment a rate alarm that may overshoot by the number in
-- flight). Now the first begins of a type whose policy configures a surge
-- take turns on a transaction-scoped advisory lock per (workspace, type),
-- taken before gate_begin's first statement: each of its statements reads
-- with a new snapshot (it is VOLATILE), so each begin counts every one that
-- held the lock before it, and the ceiling is exact under any concurrency.
-- Other types, and keys already begun (which a surge does not count), take
-- no lock. The lock is held until the caller's transaction ends: for the
-- one-statement begin, that statement.
--
-- gate_begin_in_turn takes gate_begin's parameters and answers its rows;
-- lib/gate calls it instead of gate_begin (sqlBeginFast).
CREATE FUNCTION gate_begin_in_turn(p_workspace_id text, p_effect_type text, p_idempotency_key text, p_cost_micros bigint,
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
BEGIN
    IF EXISTS (SELECT 1 FROM gate_policies p
               WHERE p.workspace_id = $1 AND p.effect_type = $2
                 AND (p.surge_per_hour IS NOT NULL OR p.surge_multiplier IS NOT NULL))
       AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $3) THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('surge:' || $1 || ':' || $2, 0));
    END IF;
    RETURN QUERY SELECT * FROM gate_begin($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
        $17, $18, $19, $20, $21, $22, $23);
END
$fn$;

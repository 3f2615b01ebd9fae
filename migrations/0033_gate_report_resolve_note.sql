-- An effect's attempts show the resolve note (resolve_note: the operator's
-- note, "reconciliation" for a reconciliation, "probe" for the attempts a
-- failed probe settled), as GET /api/v1/effects/{id} reads them (lib/gate,
-- attemptsJSON); the report's answer builds its attempts in gate_report,
-- which left the note out (review). The body is 0026's, verbatim but for
-- that one field, as CREATE OR REPLACE FUNCTION requires; the eight-
-- parameter gate_report (0026) calls this one, so it answers the note too.

CREATE OR REPLACE FUNCTION gate_report(p_effect_id text, p_workspace_id text, p_token_hash bytea, p_outcome text, p_result bytea,
    p_result_preview jsonb, p_now timestamptz, p_key_id text, p_event_id text)
RETURNS TABLE (id text, workspace_id text, effect_type text, idempotency_key text, fingerprint text, state text,
    denial_code text, attempt integer, lease_seconds integer, lease_expires_at timestamptz,
    attempt_started_at timestamptz, probe boolean, approval_id text, approval_state text, result bytea,
    result_preview jsonb, payload_preview jsonb, cost_micros bigint, run_id text, group_id text,
    compensates_effect_id text, created_at timestamptz, updated_at timestamptz,
    attempts jsonb)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    live       boolean;
    v_probe    boolean;
    v_attempt  integer;
    v_state    text;
    v_settle   integer[];  -- the unknown attempts a failed probe settles
    v_eff      effects%ROWTYPE;
    v_att      effect_attempts%ROWTYPE;
    v_released bigint;
BEGIN
SELECT e.state = 'leased' AND e.lease_token_hash = $3 AND e.lease_expires_at > $7, e.probe, e.attempt
INTO live, v_probe, v_attempt
FROM effects e WHERE e.id = $1 AND e.workspace_id = $2
FOR UPDATE;
IF live IS NOT TRUE THEN
    RETURN;
END IF;

-- A failed attempt after an unknown one leaves the effect's outcome unknown
-- (a probe's holder checked the vendor first, so its failure settles it).
v_state := $4;
IF $4 = 'failed' AND NOT v_probe
   AND EXISTS (SELECT 1 FROM gate_unknown_attempts($1) u WHERE u.attempt < v_attempt) THEN
    v_state := 'indeterminate';
END IF;

-- A probe's holder checked the vendor for the attempts before it: reported
-- failed, they did not happen either, and are settled failed with this
-- attempt below (reported succeeded, which of them acted is unknown, and
-- gate_unknown_attempts already leaves them out). Chosen before this
-- attempt's outcome is recorded, which would hide them.
IF $4 = 'failed' AND v_probe THEN
    SELECT array_agg(u.attempt) INTO v_settle FROM gate_unknown_attempts($1) u WHERE u.attempt < v_attempt;
END IF;

UPDATE effects SET state = v_state, result = $5, result_preview = $6::jsonb, updated_at = $7
WHERE id = $1
RETURNING * INTO v_eff;

UPDATE effect_attempts x SET outcome = $4, reported_at = $7, reported_by_key_id = $8
WHERE x.effect_id = $1 AND x.attempt = v_eff.attempt
RETURNING x.* INTO v_att;

-- Back on the operator's list: announced again, naming the latest attempt
-- whose outcome is unknown (lib/gate, sqlLatestUnknownAttempt).
IF v_state = 'indeterminate' AND p_event_id IS NOT NULL THEN
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
    SELECT p_event_id, v_eff.workspace_id, 'effect.indeterminate', v_eff.id,
        jsonb_build_object('effect_id', v_eff.id, 'effect_type', v_eff.effect_type, 'attempt', u.attempt,
                           'lease_expired_at', u.lease_expires_at), $7, 'after-attempt:' || v_eff.attempt
    FROM (SELECT a.attempt, a.started_at, a.lease_expires_at FROM effect_attempts a
    WHERE a.effect_id = $1 AND a.attempt IN (SELECT attempt FROM gate_unknown_attempts($1))
    ORDER BY a.attempt DESC LIMIT 1) u
    ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING;
END IF;

-- A failed attempt gives back its charges, and with a probe's, the
-- attempts it settles give back theirs: in one statement, so the counters
-- are locked in one order, as every charge and release locks them.
IF v_att.outcome = 'failed' AND (v_att.charges IS NOT NULL OR v_settle IS NOT NULL) THEN
    WITH settled AS (
        UPDATE effect_attempts a SET outcome = 'failed', resolved_at = $7, resolved_by_key_id = $8,
            resolve_note = 'probe'
        WHERE a.effect_id = $1 AND a.attempt = ANY (v_settle)
        RETURNING a.workspace_id, a.charges, a.charged_on, a.outcome
    ), upa AS (
        SELECT workspace_id, charges, charged_on, outcome FROM settled
        UNION ALL
        SELECT v_att.workspace_id, v_att.charges, v_att.charged_on, v_att.outcome
    ), freed AS (
    SELECT c.workspace_id, c.charged_on, jsonb_agg(jsonb_build_object('scope', c.scope, 'micros', c.micros,
        'count', c.count)) AS charges
    FROM (SELECT a.workspace_id, a.charged_on, x.scope, sum(x.micros)::bigint AS micros, sum(x.count)::bigint AS count
          FROM upa a, jsonb_to_recordset(a.charges) AS x(scope text, micros bigint, count bigint)
          WHERE a.outcome = 'failed'
          GROUP BY 1, 2, 3) c
    GROUP BY c.workspace_id, c.charged_on
),
rel_rows AS (
    SELECT g.workspace_id, g.scope, g.day, c.micros, c.count
    FROM freed a, jsonb_to_recordset(a.charges) AS c(scope text, micros bigint, count bigint), gate_spend g
    WHERE true AND g.workspace_id = a.workspace_id AND g.scope = c.scope AND g.day = a.charged_on
    ORDER BY g.scope, g.day
    FOR UPDATE OF g
),
rel AS (
    UPDATE gate_spend g SET micros = g.micros - r.micros, count = g.count - r.count
    FROM rel_rows r WHERE g.workspace_id = r.workspace_id AND g.scope = r.scope AND g.day = r.day
)
    SELECT count(*) INTO v_released FROM rel_rows;
END IF;

RETURN QUERY
SELECT v_eff.id, v_eff.workspace_id, v_eff.effect_type, v_eff.idempotency_key, v_eff.fingerprint, v_eff.state,
  v_eff.denial_code, v_eff.attempt, v_eff.lease_seconds, v_eff.lease_expires_at, v_eff.attempt_started_at,
  v_eff.probe, v_eff.approval_id, v_eff.approval_state, v_eff.result, v_eff.result_preview, v_eff.payload_preview,
  v_eff.cost_micros, v_eff.run_id, v_eff.group_id, v_eff.compensates_effect_id, v_eff.created_at, v_eff.updated_at,
  (SELECT jsonb_agg(jsonb_build_object(
      'attempt', a.attempt, 'outcome', a.outcome, 'probe', a.probe, 'started_at', a.started_at,
      'lease_expires_at', a.lease_expires_at, 'reported_at', a.reported_at,
      'began_by_key_id', a.began_by_key_id, 'reported_by_key_id', a.reported_by_key_id,
      'resolved_by_key_id', a.resolved_by_key_id, 'resolved_at', a.resolved_at,
      'resolve_note', a.resolve_note) ORDER BY a.attempt)
   FROM effect_attempts a WHERE a.effect_id = $1);
END
$fn$;

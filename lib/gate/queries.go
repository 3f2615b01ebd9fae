package gate

import (
	"strconv"
	"strings"

	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/money"
)

// All of the gate's SQL. Every statement takes the service clock as a
// parameter; none calls now().

// policyCols are the effective policy's columns in scanPolicy order; every
// read of a policy adds lastReconciledAt after them.
const policyCols = `version, mode, on_indeterminate, lease_seconds, max_attempts,
	max_cost_micros, approval_above_micros, daily_budget_micros, reconcile_every_hours,
	require_cost, required_dimensions, dimension_limits, structuring_threshold_micros,
	surge_per_hour, surge_multiplier, surge_action, surge_cooldown_seconds, retention_days, updated_at`

// sqlEffectivePolicy is the type's policy row, or the safe default with
// version 0 (API.md §2.3). The defaults live here and nowhere else.
// $1 workspace, $2 effect type.
const sqlEffectivePolicy = `
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
LEFT JOIN gate_policies p ON p.workspace_id = $1 AND p.effect_type = $2`

// sqlLockPolicy serialises the writers of one type's policy until the end
// of their transaction, and holds them apart from the type's begins, which
// hold policyTurn shared for theirs: a write waits for the begins that read
// the policy before it, and a begin after it reads what it wrote. So a
// ceiling set during the day counts every grant made under the policy
// before it (sqlChargeEarlierGrants sees them all, committed), and none
// escapes it (budgets QA: a budget set during a burst of begins on new
// keys missed those in flight, which were never counted: 570 granted
// against a budget of 400, and a budget raised later admitted them again).
// $1 workspace, $2 effect type.
const sqlLockPolicy = `SELECT pg_advisory_xact_lock(` + policyTurn + `)`

// policyTurn is the advisory lock key of the policy of workspace $1's type
// $2, and sqlSharePolicy holds it shared until the end of a begin's
// transaction, before any other lock the begin takes (so a policy write,
// which holds it first too, cannot wait for a begin waiting for it).
const (
	policyTurn     = `hashtextextended('gate_policy:' || $1::text || '/' || $2::text, 0)`
	sqlSharePolicy = `SELECT pg_advisory_xact_lock_shared(` + policyTurn + `)`
)

// lastReconciledAt is the policy's last column (scanPolicy): when workspace
// $1's type named by effectType was last reconciled, null before the first.
// Read from the reconciliation calendar, not the policy row: a type on the
// safe default is reconciled too.
func lastReconciledAt(effectType string) string {
	return `(SELECT r.last_reconciled_at FROM reconciliations r WHERE r.workspace_id = $1 AND r.effect_type = ` +
		effectType + `)`
}

var sqlGetPolicy = `SELECT ` + policyCols + `, ` + lastReconciledAt("$2") + ` FROM (` + sqlEffectivePolicy + `) pol`

var sqlListPolicies = `SELECT effect_type, ` + policyCols + `, ` + lastReconciledAt("gate_policies.effect_type") + `
FROM gate_policies WHERE workspace_id = $1 AND effect_type > $2 ORDER BY effect_type LIMIT $3`

// The policy writes take $1 workspace, $2 type, $3 the version read, every
// field, $21 now. The update also checks the version read (it changes nothing
// when it moved), a guard behind the lock PutPolicy takes. Both date
// reconcile_since (migration 0054): now when reconcile_every_hours is
// turned on (null before the write, whatever a previous release left in
// the column), kept while it stays on (whatever its value; one a previous
// release turned on undated reads as the policy's creation, as the sweeper
// reads it), null when off.
var sqlInsertPolicy = `
INSERT INTO gate_policies (workspace_id, effect_type, version, mode, on_indeterminate, lease_seconds,
    max_attempts, max_cost_micros, approval_above_micros, daily_budget_micros, reconcile_every_hours,
    require_cost, required_dimensions, dimension_limits, structuring_threshold_micros, surge_per_hour,
    surge_multiplier, surge_action, surge_cooldown_seconds, retention_days, created_at, updated_at, reconcile_since)
VALUES ($1, $2, $3::bigint + 1, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::text[], $14::jsonb, $15, $16, $17,
    $18, $19, $20, $21, $21, CASE WHEN $11::int IS NOT NULL THEN $21::timestamptz END)
RETURNING ` + policyCols + `, ` + lastReconciledAt("$2")

var sqlUpdatePolicy = `
UPDATE gate_policies SET version = version + 1, mode = $4, on_indeterminate = $5, lease_seconds = $6,
    max_attempts = $7, max_cost_micros = $8, approval_above_micros = $9, daily_budget_micros = $10,
    reconcile_every_hours = $11, require_cost = $12, required_dimensions = $13::text[],
    dimension_limits = $14::jsonb, structuring_threshold_micros = $15, surge_per_hour = $16,
    surge_multiplier = $17, surge_action = $18, surge_cooldown_seconds = $19, retention_days = $20,
    updated_at = $21, reconcile_since = CASE WHEN $11::int IS NULL THEN NULL
        WHEN reconcile_every_hours IS NULL THEN $21::timestamptz
        ELSE coalesce(reconcile_since, created_at) END
WHERE workspace_id = $1 AND effect_type = $2 AND version = $3
RETURNING ` + policyCols + `, ` + lastReconciledAt("$2")

// effectColumn is one column of effectRow, with the value that stands for it
// when a LEFT JOIN found no effect (NOT NULL columns only).
type effectColumn struct{ name, zero string }

var effectColumns = []effectColumn{
	{"id", "''"}, {"workspace_id", "''"}, {"effect_type", "''"}, {"idempotency_key", "''"},
	{"fingerprint", "''"}, {"state", "''"}, {"denial_code", ""}, {"attempt", "0"},
	{"lease_seconds", "0"}, {"lease_expires_at", ""}, {"attempt_started_at", ""}, {"probe", "false"},
	{"approval_id", ""}, {"approval_state", ""}, {"result", ""}, {"result_preview", ""},
	{"payload_preview", ""}, {"cost_micros", ""}, {"run_id", ""}, {"group_id", ""},
	{"compensates_effect_id", ""}, {"created_at", "'epoch'"}, {"updated_at", "'epoch'"},
}

// effectCols lists the effect columns qualified by alias ("" for none);
// nullSafe wraps NOT NULL ones in coalesce for outer joins.
func effectCols(alias string, nullSafe bool) string {
	var b strings.Builder
	for i, c := range effectColumns {
		if i > 0 {
			b.WriteString(", ")
		}
		name := c.name
		if alias != "" {
			name = alias + "." + name
		}
		if nullSafe && c.zero != "" {
			b.WriteString("coalesce(" + name + ", " + c.zero + ")")
		} else {
			b.WriteString(name)
		}
	}
	return b.String()
}

// ---- Begin, report and heartbeat: PL/pgSQL functions ----
//
// The hot statements live in migrations as the functions gate_begin (0013,
// as steps; 0008 before) and gate_begin_locked (0077; 0008 before), both calling
// gate_evaluate, the policy's and the circuits' verdict (0013; 0010
// before), gate_report (0013) and gate_heartbeat (0010); this file holds
// only their calls. There is no Go copy of their SQL to edit: a change is a
// new migration (CREATE OR REPLACE FUNCTION; DROP and CREATE
// when the parameters or the result columns change, with the call here).
// Why functions: the pool's default exec mode plans every statement it
// sends, and begin's statement cost more to plan than to run; PL/pgSQL
// caches each statement's plan per server connection, so only the one-line
// call is planned per request. Every gate function sets plan_cache_mode =
// force_generic_plan (0010): left to choose, Postgres kept re-planning the
// large statements on every call (their generic cost estimate is above the
// custom one), and picked the wrong index for the report's where it did not.
// The fragments here that the functions also hold (sqlEffectivePolicy's
// defaults, chargeCTEs, releaseCTEs, the surge threshold and baseline) were
// copied into 0008 (and 0010, 0013) as they stood; changing one
// of them means a new migration too (TestGateFunctionsMatchFragments fails
// until the functions hold the new text).
// Each call casts every parameter to the function's declared type, so the
// call resolves to exactly one function whatever types pgx infers from Go.
//
// Begin's parameters, shared by the one-statement path and the locked path
// so that both evaluate the policy with the same SQL:
//
//	$1 workspace  $2 effect type  $3 idempotency key  $4 cost_micros
//	$5 declared dimension names  $6 requested lease seconds  (the locked path
//	takes only these six)  $7 fingerprint  $8 now  $9 new effect id
//	$10 hashed dimensions (jsonb)  $11 sealed payload  $12 payload preview (jsonb)
//	$13 lease token hash  $14 key id  $15 new approval id  $16 run id
//	$17 group id  $18 sealed compensation  $19 compensates effect id
//	$20 new event id  then riskInput.appendArgs: $21 the key's daily spend
//	ceiling  $22 a ceiling's denial code that replaces execute (after a
//	refused charge, see Begin)  $23 new circuit event id  $24 new event id
//	for a lapsed breaker's close (sqlBeginFast only)
//
// The locked path takes $1-$8 ($7 unused); the circuits need the clock.
//
// Both answer the policy's evaluation (scanBegin: on_indeterminate,
// max_attempts, max_cost_micros, approval_above_micros, precheck, the
// missing dimensions, fresh, approval_reason, the effective lease), whether
// an effect row follows, whether this call inserted it, then the effect's
// columns (effectColumns). precheck is a 400 that changes nothing
// (cost_required, dimension_required with the missing names), fresh is what
// a fresh evaluation grants (policy_denied, cost_ceiling_exceeded,
// circuit_open, approval, execute). A dimension with a ceiling is required
// even when the policy forgot to list it: a ceiling keyed on an undeclared
// dimension would otherwise be evaded.

// sqlBeginFast is begin in one round trip for a new key (insert the effect,
// its first attempt or its approval, charge its ceilings, count it towards
// a surge and trip the breaker) and for an existing one (read it back). The
// fallback read is a statement of its own (0013), so it sees a key that a
// concurrent begin inserted and committed while this one's insert waited
// (one that rolled back leaves the key to this insert). When no row holds
// the key (a precheck failed on a new key, or the row went between the
// insert and the read) neither branch returns a row and the caller answers
// the precheck or takes the locked path. A charge that does not fit aborts it through
// gate_refuse (SQLSTATE RTB01, the ceiling in DETAIL). The call is
// gate_begin_in_turn (0025, 0028): gate_begin, after the first begins of a
// type with a surge breaker have taken their turn, so that the surge counts
// exactly, as of when the turn came. A key not yet stored takes its own turn
// first (0077), so a begin meeting the same key's uncommitted begin waits
// before it evaluates, not in its insert after evaluating: one that rolled
// back leaves this one to decide on the breakers as they are then.
//
// The call runs only while the begin's key ($14) is not revoked: the
// function checks it first (0046; before, a LATERAL join of api_keys on this
// statement did, planned again with every begin) and answers no row once
// the revocation committed, so a key revoked on one instance is refused at
// once by every other, whose caches still hold it for KEY_CACHE_TTL (race
// QA: about 390 begins executed in that window). Otherwise the function
// always answers a row, so no row means a revoked key.
//
// Its first argument holds the type's policy turn shared first
// (sqlSharePolicy), an init plan that runs before the function does: the
// function reads the policy after it, in statements of their own. It reads
// it twice, each time in a fresh snapshot: gate_begin_in_turn, to learn
// whether the type counts a surge (and so takes the surge turn), then
// gate_evaluate, to count and trip. Both read one version of it: every
// policy write holds the turn alone from before it reads the policy until
// it commits (sqlLockPolicy), so none commits while the begin holds it
// shared, from before the first read until the begin commits. A PUT
// turning surge on (or changing its threshold) therefore needs no surge
// turn of its own: a begin that met no surge policy is decided, and
// commits, before the PUT writes one, and counts and trips nothing; one
// that met it reads the same policy when it evaluates, in the turn
// (concurrency QA asked whether a PUT landing between the two reads
// tripped a begin at its raw clock outside the turn: it cannot land there;
// TestABeginAndAPolicyTurningSurgeOnTakeTurns).
const sqlBeginFast = `SELECT * FROM gate_begin_in_turn((SELECT $1::text WHERE pg_advisory_xact_lock_shared(` +
	policyTurn + `)::text = ''), $2::text, $3::text, $4::bigint, $5::text[], $6::int,
    $7::text, $8::timestamptz, $9::text, $10::jsonb, $11::bytea, $12::jsonb, $13::bytea, $14::text, $15::text,
    $16::text, $17::text, $18::bytea, $19::text, $20::text, $21::bigint, $22::text, $23::text, $24::text)`

// sqlRejoin says whether effect $1's live lease is attempt $2's with token
// hash $3 at $4 (begin's rejoin).
const sqlRejoin = `SELECT EXISTS (SELECT 1 FROM effects WHERE id = $1::text AND state = 'leased' AND attempt = $2::int
    AND lease_token_hash = $3::bytea AND lease_expires_at > $4::timestamptz)`

// sqlLengthenLease moves the live lease of effect $1's attempt $2 to $3
// when that is later (afterSlowGrant), on the attempt's record too.
const sqlLengthenLease = `
WITH e AS (
    UPDATE effects SET lease_expires_at = greatest(lease_expires_at, $3::timestamptz)
    WHERE id = $1::text AND attempt = $2::int AND state = 'leased'
    RETURNING id, attempt, lease_expires_at
), a AS (
    UPDATE effect_attempts x SET lease_expires_at = e.lease_expires_at
    FROM e WHERE x.effect_id = e.id AND x.attempt = e.attempt
)
SELECT lease_expires_at FROM e`

// sqlBeginLocked reads the effect with the same evaluation, holding its row
// until the transaction ends. Under READ COMMITTED a waiter gets the newest
// version of the row once the holder commits, and the function evaluates
// the policy and the circuits only once it holds the row (0077), so a
// breaker or the emergency stop opened while it waited refuses it. (Every
// begin passed sqlBeginFast's check of its key first.)
const sqlBeginLocked = `SELECT * FROM gate_begin_locked($1::text, $2::text, $3::text, $4::bigint, $5::text[],
    $6::int, $7::text, $8::timestamptz)`

// sqlGrant starts a new attempt on a locked effect and charges its ceilings
// (gate_refuse aborts it when one does not fit). A probe is not charged
// again on a counter an unknown attempt before it holds a charge on (the
// same scope and day): the probe protocol lets at most one of the two act
// (its holder reports what it found, or acts because nothing was done), so
// charging both counted one action twice there, and refused a probe whose
// cost did not fit beside the earlier charge, leaving the key unsettled
// behind a budget it would not have exceeded. On another day, or another
// key's ceiling, the probe is charged: what acts on a day stays bounded by
// that day's counters (review).
// $1 effect id, $2 now, $3 token hash, $4 lease seconds, $5 probe, $6 key id,
// $7 the key's daily spend ceiling.
var sqlGrant = `
WITH e AS (
    UPDATE effects SET state = 'leased', attempt = attempt + 1, lease_token_hash = $3, lease_seconds = $4,
        lease_expires_at = $2::timestamptz + make_interval(secs => $4::int), attempt_started_at = $2,
        probe = $5, denial_code = NULL, updated_at = $2
    WHERE id = $1
    RETURNING ` + effectCols("", false) + `, dimensions
), grant_src AS (
    SELECT e.workspace_id, e.effect_type, e.cost_micros AS cost, $6::text AS key_id, $7::bigint AS key_ceiling,
        e.dimensions AS dims, p.daily_budget_micros, coalesce(p.dimension_limits, '{}') AS dimension_limits,
        ` + utcDay("$2") + ` AS day
    FROM e LEFT JOIN gate_policies p ON p.workspace_id = e.workspace_id AND p.effect_type = e.effect_type
),` + chargeCTEsExcept("grant_src", `$5::boolean AND EXISTS (
        SELECT 1 FROM effect_attempts u, jsonb_to_recordset(u.charges) AS c(scope text)
        WHERE u.effect_id = $1 AND u.charged_on = s.day AND c.scope = p.scope
          AND u.attempt IN (SELECT attempt FROM gate_unknown_attempts($1)))`) + `,
a AS (
    INSERT INTO effect_attempts (effect_id, attempt, workspace_id, lease_token_hash, probe, started_at,
        lease_expires_at, began_by_key_id, charges, charged_on)
    SELECT e.id, e.attempt, e.workspace_id, $3, $5, $2, e.lease_expires_at, $6, ` + chargesJSON + `, ` + chargedOn + `
    FROM e
)
SELECT ` + effectCols("e", false) + ` FROM e WHERE NOT EXISTS (SELECT 1 FROM refused)`

// sqlDeny records a denial. An effect whose last attempt's outcome is
// unknown stays indeterminate (listed, resolvable, reconcilable, unresolved
// in its group's rollback) with the denial's code beside it: refusing a
// retry must not bury the unknown outcome. $1 effect id, $2 now, $3 code.
var sqlDeny = `UPDATE effects SET state = CASE WHEN state = 'indeterminate' THEN state ELSE 'denied' END,
    denial_code = $3, updated_at = $2 WHERE id = $1
RETURNING ` + effectCols("", false)

// sqlRequestApproval holds a locked effect for an operator. A retry of an
// effect whose last attempt's outcome is unknown waits for its approval
// still indeterminate, as sqlDeny keeps it.
// $1 effect id, $2 now, $3 approval id, $4 reason, $5 event id.
var sqlRequestApproval = `
WITH a AS (
    INSERT INTO approvals (id, workspace_id, effect_id, effect_type, state, reason, created_at)
    SELECT $3, workspace_id, id, effect_type, 'pending', $4, $2 FROM effects WHERE id = $1
    RETURNING id, workspace_id, effect_id, effect_type
), evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at)
    SELECT $5, a.workspace_id, '` + events.ApprovalRequested + `', a.id,
        jsonb_build_object('approval_id', a.id, 'effect_id', a.effect_id, 'effect_type', a.effect_type,
                           'reason', $4::text), $2
    FROM a
)
UPDATE effects SET state = CASE WHEN state = 'indeterminate' THEN state ELSE 'awaiting_approval' END,
    approval_id = $3, approval_state = 'pending', denial_code = NULL, updated_at = $2
WHERE id = $1
RETURNING ` + effectCols("", false)

// sqlApprovalsAnswer reads the reasons an effect's approvals answer (what
// each recorded as it was given; one given before 0041, the reason it was
// asked for), leaving out a breaker's reason when a breaker or the emergency
// stop holding the type now opened, or was given another action, after it was
// decided (updated_at, since opening an open breaker or stop again, a
// monitor stop escalated to require_approval, keeps its opened_at), and
// whether one holds the type with require_approval now. $1 effect id, $2
// workspace, $3 effect type, $4 now.
var sqlApprovalsAnswer = `
WITH holding AS (` + holdingCircuitsSQL("$3") + `)
SELECT (SELECT coalesce(array_agg(DISTINCT r.reason), '{}')
        FROM approvals a, unnest(coalesce(a.answers, ARRAY[a.reason])) AS r (reason)
        WHERE a.effect_id = $1 AND a.workspace_id = $2 AND a.state = 'approved'
          AND (r.reason <> '` + reasonCircuitOpen + `'
               OR NOT EXISTS (SELECT 1 FROM holding h WHERE h.updated_at > a.decided_at))),
    EXISTS (SELECT 1 FROM holding)`

// holdingCircuitsSQL selects the breakers, and the emergency stop, that
// hold the effect type effectType names, of workspace $2, with
// require_approval at $4 (as gate_evaluate reads them: the stop has no
// cooldown, a breaker holds until closes_at), with when each was last
// opened or given another action (updated_at).
func holdingCircuitsSQL(effectType string) string {
	return `
    SELECT c.updated_at FROM gate_circuits c
    WHERE c.workspace_id = $2 AND c.state = 'open' AND c.action = 'require_approval'
      AND (c.effect_type = '*' OR (c.effect_type = ` + effectType + ` AND (c.closes_at IS NULL OR c.closes_at > $4)))`
}

// lapseSQL makes lapsed leases durably indeterminate: the effect, its current
// attempt, and one effect.indeterminate event per attempt in the outbox. The
// condition state = 'leased' AND lease_expires_at <= now is re-checked under
// the row lock, so a report that won the race is never overwritten and a
// lapse is recorded once. $1 now, $2 limit, $3 event ids (one per row), and
// what filter names.
func lapseSQL(filter string) string {
	return `
WITH cand AS (
    SELECT id FROM effects
    WHERE state = 'leased' AND lease_expires_at <= $1 AND ` + filter + `
    ORDER BY lease_expires_at LIMIT $2
    FOR UPDATE SKIP LOCKED
), e AS (
    UPDATE effects e SET state = 'indeterminate', updated_at = $1
    FROM cand WHERE e.id = cand.id AND e.state = 'leased' AND e.lease_expires_at <= $1
    RETURNING e.id, e.workspace_id, e.effect_type, e.attempt, e.lease_expires_at
), a AS (
    UPDATE effect_attempts a SET outcome = 'indeterminate'
    FROM e WHERE a.effect_id = e.id AND a.attempt = e.attempt AND a.outcome IS NULL
), n AS (
    SELECT e.*, row_number() OVER (ORDER BY e.id) AS i FROM e
), evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
    SELECT ($3::text[])[n.i], n.workspace_id, '` + events.EffectIndeterminate + `', n.id,
        jsonb_build_object('effect_id', n.id, 'effect_type', n.effect_type, 'attempt', n.attempt,
                           'lease_expired_at', n.lease_expires_at), $1, n.attempt::text
    FROM n
    ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING
)
SELECT count(*) FROM e`
}

// sqlLapseDue is the sweeper's pass over every workspace: up to $2 lapsed
// leases taking turns among the workspaces that have some (db.FairPick),
// each workspace's longest lapsed first, so that one workspace's backlog
// (a fleet of agents that crashed at once) holds no other's lapse, nor its
// effect.indeterminate, back for passes on end (multi-tenant QA: ordered
// by expiry alone, 100,000 lapses of one workspace held another's back for
// 200 passes). The workspaces are found through effects_leased_ws_idx,
// a descent each (db.WorkspacesWith), and each one's first $2 lapses are
// read from it, so a pass costs the same whatever the backlog. sqlLapseThese
// makes the lapse of given effects durable inline ($4 their ids), through
// their primary key, in one statement however many there are.
var (
	sqlLapseDue = lapseSQL(`id = ANY(ARRAY(` + db.FairPick(db.Backlog{
		Table: "effects", Where: "state = 'leased'", Also: "lease_expires_at <= $1",
		Order: "lease_expires_at", Due: "lease_expires_at",
	}, "$2::int") + `))`)
	sqlLapseThese = lapseSQL("id = ANY($4::text[])")
)

// attemptsJSON aggregates an effect's attempts (alias e) in order.
const attemptsJSON = `(SELECT coalesce(jsonb_agg(jsonb_build_object(
    'attempt', a.attempt, 'outcome', a.outcome, 'probe', a.probe, 'started_at', a.started_at,
    'lease_expires_at', a.lease_expires_at, 'reported_at', a.reported_at,
    'began_by_key_id', a.began_by_key_id, 'reported_by_key_id', a.reported_by_key_id,
    'resolved_by_key_id', a.resolved_by_key_id, 'resolved_at', a.resolved_at, 'resolve_note', a.resolve_note)
    ORDER BY a.attempt), '[]')
  FROM effect_attempts a WHERE a.effect_id = e.id)`

// sqlGetEffect reads one effect with its attempts. $1 id, $2 workspace.
var sqlGetEffect = `SELECT ` + effectCols("e", false) + `, ` + attemptsJSON + `
FROM effects e WHERE e.id = $1 AND e.workspace_id = $2`

// sqlLockEffect reads and locks one effect. $1 id, $2 workspace.
var sqlLockEffect = `SELECT ` + effectCols("e", false) + ` FROM effects e
WHERE e.id = $1 AND e.workspace_id = $2 FOR UPDATE`

// sqlListEffects is the statement db.NewestFirst pages a workspace's
// effects with, unfiltered ($1 the workspace; effects_list_idx).
var sqlListEffects = `SELECT ` + effectCols("e", false) + `, ` + attemptsJSON + `
FROM effects e WHERE e.workspace_id = $1::text`

// listEffectsIn pages them filtered, by state, by effect type or both:
// the statement that reads n stored states ($5 to $4+n; the filter a page
// reads as state is $3, see storedStates), of one type when byType, after
// a cursor when afterCursor (each the next parameter after the states, the
// cursor first). Each state's newest $2 ids come from one ordered range of
// an index, effects_state_idx or with a type effects_type_state_idx
// (migration 0057), read alone (index only), and the page is the newest
// of those, read from the table. A lapsed lease is indeterminate here
// too: the filter indeterminate reads the stored leased effects whose
// lease lapsed by $4 (now), leased those whose lease is live (their
// branch reads the table for the lease; leased effects are few).
//
// As one condition over the states (indeterminate's two, every state for
// a type alone), or with a type, the planner walked the workspace's
// effects newest first testing each, and read far when those wanted were
// few or not recent (scale QA, 1.1M effects: the indeterminate ones of an
// incident two weeks back, 1.1 s and 147k buffers a page, 0.5-0.8 s with
// a type; a type retired two weeks ago, 0.75 s and 147k buffers; now
// 0.5-1.5 ms and under 470 buffers, first page or deep). Each state is a
// parameter of its own branch, so that the plan knows which range it
// reads, and a branch reads ids only, so that the range is cheaper than
// that walk whatever the planner expects of it (reading rows, it still
// walked the table when it took the rows wanted to be many: a burst of
// another type's effects since then made it read 8,000 buffers a page).
//
// The type and the cursor are conditions only of the statements that have
// them: written as "$n = ” OR …" for any, a plan made for any value (a
// prepared statement's generic plan) kept them as filters, so that a
// branch read its state's whole range for a type and down from the
// state's newest entry to the cursor for a page deep in it.
func listEffectsIn(n int, byType, afterCursor bool) string {
	cursor, effectType := 4+n+1, 4+n+1
	if afterCursor {
		effectType++
	}
	branches := make([]string, n)
	for i := range branches {
		state := `$` + strconv.Itoa(5+i) + `::text`
		key, bound := []string{"e.workspace_id"}, []string{"$1::text"}
		where := `e.workspace_id = $1::text`
		if byType {
			typ := `$` + strconv.Itoa(effectType) + `::text`
			key, bound = append(key, "e.effect_type"), append(bound, typ)
			where += ` AND e.effect_type = ` + typ
		}
		key, bound = append(key, "e.state"), append(bound, state)
		where += ` AND e.state = ` + state
		if afterCursor {
			// The cursor bounds the index's whole key: "id < cursor" alone
			// bounds the primary key as well, and a generic plan read that
			// backwards, the workspace's effects of every state.
			where += ` AND (` + strings.Join(key, ", ") + `, e.id) < (` + strings.Join(bound, ", ") + `, $` +
				strconv.Itoa(cursor) + `::text)`
		}
		branches[i] = `(SELECT e.id FROM effects e
    WHERE ` + where + `
      AND (` + state + ` <> 'leased' OR CASE $3::text WHEN 'indeterminate' THEN e.lease_expires_at <= $4
                                    WHEN 'leased' THEN e.lease_expires_at > $4 ELSE true END)
    ORDER BY ` + strings.Join(key[1:], " DESC, ") + ` DESC, e.id DESC LIMIT $2::int)`
	}
	return `SELECT ` + effectCols("e", false) + `, ` + attemptsJSON + `
FROM (SELECT id FROM (` + strings.Join(branches, "\nUNION ALL ") + `) b ORDER BY id DESC LIMIT $2::int) page
JOIN effects e ON e.id = page.id
ORDER BY e.id DESC`
}

// effectsInKey names one of listEffectsIn's statements.
type effectsInKey struct {
	states              int
	byType, afterCursor bool
}

// sqlListEffectsIn holds listEffectsIn's statements: of one state, two
// (indeterminate) or every state (a type alone), each with and without a
// type and a cursor.
var sqlListEffectsIn = func() map[effectsInKey]string {
	m := map[effectsInKey]string{}
	for _, n := range []int{1, 2, len(States)} {
		for _, byType := range []bool{false, true} {
			for _, afterCursor := range []bool{false, true} {
				m[effectsInKey{n, byType, afterCursor}] = listEffectsIn(n, byType, afterCursor)
			}
		}
	}
	return m
}()

// sqlTokenAttempt finds the attempt a lease token belongs to.
// $1 effect id, $2 token hash.
const sqlTokenAttempt = `SELECT attempt, outcome, reported_at FROM effect_attempts
WHERE effect_id = $1 AND lease_token_hash = $2`

// sqlReport records the outcome of the current, live attempt in one
// statement (releasing a failed attempt's charges), and returns the effect
// with its attempts as they now are (gate_report, migrations 0013 and 0026;
// $9 is the id of the effect.indeterminate event it records when a failed
// retry leaves the effect indeterminate).
// $1 effect id, $2 workspace, $3 token hash, $4 outcome, $5 sealed result,
// $6 result preview, $7 now, $8 key id, $9 event id.
const sqlReport = `SELECT * FROM gate_report($1::text, $2::text, $3::bytea, $4::text, $5::bytea, $6::jsonb,
    $7::timestamptz, $8::text, $9::text)`

// sqlLatestUnknown is sqlLatestUnknownAttempt of effect $1.
var sqlLatestUnknown = sqlLatestUnknownAttempt("$1::text")

// sqlLatestUnknownAttempt is the latest attempt of effect (an SQL
// expression) whose outcome is unknown (gate_unknown_attempts): its number,
// start and lease's end. No row when none is. gate_report (migration 0026)
// holds a copy with effect $1 (TestGateFunctionsMatchFragments).
func sqlLatestUnknownAttempt(effect string) string {
	return `SELECT a.attempt, a.started_at, a.lease_expires_at FROM effect_attempts a
    WHERE a.effect_id = ` + effect + ` AND a.attempt IN (SELECT attempt FROM gate_unknown_attempts(` + effect + `))
    ORDER BY a.attempt DESC LIMIT 1`
}

// sqlHeartbeat extends a live lease by its length from now (gate_heartbeat,
// migration 0010). $1 effect id, $2 workspace, $3 token hash, $4 now.
const sqlHeartbeat = `SELECT * FROM gate_heartbeat($1::text, $2::text, $3::bytea, $4::timestamptz)`

// settledDenial is the denial_code an indeterminate effect keeps once its
// outcome is settled to outcome (an SQL expression): none after a success
// (it was not denied: a refused retry's code no longer says anything), and
// after a failure only max_attempts_exceeded, which still answers the key,
// or approval_rejected when settledState denies it. closed is the
// parameter holding rolledBackNote (see rejectedRetry).
func settledDenial(outcome, closed string) string {
	return `CASE WHEN ` + rejectedRetry(outcome, closed) + ` THEN 'approval_rejected'
    WHEN ` + outcome + ` = 'failed' AND denial_code = 'max_attempts_exceeded' THEN denial_code END`
}

// settledState is the state an indeterminate effect takes once its outcome
// is settled to outcome: that outcome, but denied when rejectedRetry holds,
// as a rejection of the effect already failed makes it (sqlDecideApproval),
// so that the effect ends the same whichever came first (gate QA: rejected
// first, it read failed until its key's next begin denied it).
func settledState(outcome, closed string) string {
	return `CASE WHEN ` + rejectedRetry(outcome, closed) + ` THEN 'denied' ELSE ` + outcome + ` END`
}

// rejectedRetry is true of an effect (its columns unqualified) settled to
// outcome whose retry an operator rejected while its outcome was unknown:
// settled failed, the rejection is what answers its key. Not one a group's
// rollback closed (its note the parameter closed, rolledBackNote): that
// leaves the effect its state, settled before it or after
// (closeApprovalsSQL).
func rejectedRetry(outcome, closed string) string {
	return `(` + outcome + ` = 'failed' AND approval_state = 'rejected' AND NOT EXISTS (SELECT 1 FROM approvals ap
        WHERE ap.id = approval_id AND ap.note IS NOT DISTINCT FROM ` + closed + `::text))`
}

// sqlResolve records what an operator found for an indeterminate effect:
// the effect and every attempt whose outcome was unknown (usually its last;
// with on_indeterminate retry, also those before a retry reported failed:
// gate_unknown_attempts, migration 0026). A failed one is a known failure,
// so those attempts' ceilings are released like a failed report's.
// $1 effect id, $2 outcome, $3 sealed result, $4 result preview, $5 now,
// $6 key id, $7 note, $8 rolledBackNote.
var sqlResolve = `
WITH upd AS (
    UPDATE effects SET state = ` + settledState("$2", "$8") + `, result = $3, result_preview = $4::jsonb,
        updated_at = $5, denial_code = ` + settledDenial("$2", "$8") + `
    WHERE id = $1 AND state = 'indeterminate'
    RETURNING id
), upa AS (
    UPDATE effect_attempts a SET outcome = $2, resolved_by_key_id = $6, resolved_at = $5, resolve_note = $7
    FROM upd WHERE a.effect_id = upd.id AND a.attempt IN (SELECT attempt FROM gate_unknown_attempts(upd.id))
    RETURNING a.workspace_id, a.charges, a.charged_on, a.outcome
), ` + freedCTE("upa") + `,` + releaseCTEs("freed", "true") + `
SELECT count(*) FROM upa`

// ---- Effect groups (groups.go) ----

const groupCols = `id, name, state, created_at, updated_at, committed_at, unwind_started_at, finished_at,
    idempotency_key`

// sqlCreateGroup: $1 id, $2 workspace, $3 name, $4 key id, $5 now, $6 the
// idempotency key (NULL: none). A group the key already names answers no
// row (sqlGroupByKey reads it); a concurrent create under the same key waits
// here for the other to commit.
const sqlCreateGroup = `INSERT INTO effect_groups (id, workspace_id, name, state, created_by_key_id, created_at, updated_at,
    idempotency_key)
VALUES ($1, $2, $3, 'open', $4, $5, $5, $6)
ON CONFLICT (workspace_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING ` + groupCols

// sqlGroupByKey is the id and name of the group workspace $1 opened under
// idempotency key $2, and whether key $3 may act on it (NULL: any key may;
// see groupOwner).
const sqlGroupByKey = `SELECT id, name, ($3::text IS NULL OR created_by_key_id = $3::text)
FROM effect_groups WHERE workspace_id = $1 AND idempotency_key = $2`

// sqlGetGroup: $1 id, $2 workspace, $3 the key that must have created it
// (NULL: any; see groupReader and groupOwner).
const sqlGetGroup = `SELECT ` + groupCols + ` FROM effect_groups
WHERE id = $1 AND workspace_id = $2 AND ($3::text IS NULL OR created_by_key_id = $3::text)`

// sqlLockGroup takes the group for a transition. $1 id, $2 workspace, $3
// as for sqlGetGroup.
const sqlLockGroup = sqlGetGroup + ` FOR UPDATE`

// sqlAdmitGroup reads a group for begin, holding it shared so no commit or
// unwind can change its state until the begin commits, and says whether
// the idempotency key already names an effect (a replay, which the group's
// state does not refuse) and that effect's group. $1 group id, $2
// workspace, $3 idempotency key, $4 the key that must have created the
// group (NULL: any; see groupOwner). The effect is as of the statement's
// start, not as of the lock (see admit, which looks again by sqlKeysGroup).
const sqlAdmitGroup = `SELECT g.state, e.id IS NOT NULL, e.group_id
FROM effect_groups g LEFT JOIN effects e ON e.workspace_id = $2 AND e.idempotency_key = $3
WHERE g.id = $1 AND g.workspace_id = $2 AND ($4::text IS NULL OR g.created_by_key_id = $4::text)
FOR SHARE OF g`

// sqlKeysGroup is the group of the effect key $2 names in workspace $1 (no
// row: the key is new), read again after sqlAdmitGroup in a statement of
// its own (see admit).
const sqlKeysGroup = `SELECT group_id FROM effects WHERE workspace_id = $1 AND idempotency_key = $2`

// sqlLockGroupSteps takes group $1's turn to add a forward step
// (groupHasRoom), until the transaction ends.
const sqlLockGroupSteps = `SELECT pg_advisory_xact_lock(hashtextextended('group_steps:' || $1::text, 0))`

// sqlCountGroupSteps counts the effects of group $1, at most $2
// (effects_group_idx): sent after sqlLockGroupSteps, in a statement of its
// own, its snapshot holds every step whose begin held the turn before.
const sqlCountGroupSteps = `SELECT count(*) FROM (SELECT 1 FROM effects WHERE group_id = $1 LIMIT $2) s`

// sqlTakenKeys answers which of the keys $2 name an effect of group $1's
// workspace.
const sqlTakenKeys = `SELECT e.idempotency_key FROM effect_groups g
JOIN effects e ON e.workspace_id = g.workspace_id AND e.idempotency_key = ANY($2::text[])
WHERE g.id = $1`

// sqlEffectCompensation reads an effect's sealed compensation. $1 effect id.
const sqlEffectCompensation = `SELECT compensation FROM effects WHERE id = $1`

// sqlGroupVisible says whether group $1 is workspace $2's and, with $3,
// was created by key $3.
const sqlGroupVisible = `SELECT EXISTS (SELECT 1 FROM effect_groups
    WHERE id = $1 AND workspace_id = $2 AND ($3::text IS NULL OR created_by_key_id = $3::text))`

// sqlGroupOfKey says whether group $1 was created by key $2.
const sqlGroupOfKey = `SELECT EXISTS (SELECT 1 FROM effect_groups WHERE id = $1 AND created_by_key_id = $2)`

// sqlShareGroupState is a grouped effect's group state for a new attempt.
// $1 group id.
const sqlShareGroupState = `SELECT state FROM effect_groups WHERE id = $1 FOR SHARE`

// sqlGroupState is a grouped effect's group state, read only. $1 group id.
const sqlGroupState = `SELECT state FROM effect_groups WHERE id = $1`

// sqlRunWallet reads a durable-jobs run of the workspace ($1, workspace $2):
// no row when it is not the workspace's. It answers the wallet that charges
// a begin of key $3: an effect is charged to the run it was begun under, so
// once the key names an effect, that effect's run (NULL: none) and its
// budget; otherwise this run and its budget (NULL: no wallet).
const sqlRunWallet = `SELECT CASE WHEN e.id IS NULL THEN r.id ELSE e.run_id END,
       CASE WHEN e.id IS NULL THEN r.budget_micros ELSE er.budget_micros END
FROM job_runs r
LEFT JOIN effects e ON e.workspace_id = $2 AND e.idempotency_key = $3
LEFT JOIN job_runs er ON er.id = e.run_id
WHERE r.id = $1 AND r.workspace_id = $2`

// sqlWalletBudget is a run's budget (NULL: no wallet; no row: the run is
// gone). $1 run id.
const sqlWalletBudget = `SELECT budget_micros FROM job_runs WHERE id = $1`

// sqlLockWallet serialises the begins charged to one run's wallet ($1), so
// that each reads the spend the previous one left. An advisory lock, not
// the run's row: enqueues and reports lock that row, and a wallet has no
// business waiting for them.
const sqlLockWallet = `SELECT pg_advisory_xact_lock(hashtextextended('wallet:' || $1::text, 0))`

// sqlShareWalletRun holds a wallet's run ($1) FOR KEY SHARE until the
// begin's transaction ends, once the wallet is locked (sqlLockWallet): run
// retention (lib/jobs, which locks the runs it deletes FOR UPDATE SKIP
// LOCKED) then skips it, or deleted it already and no row is read. Enqueues
// and reports take no lock that waits for it (FOR SHARE, or updates that
// leave the key).
const sqlShareWalletRun = `SELECT budget_micros FROM job_runs WHERE id = $1 FOR KEY SHARE`

// sqlRunSpend is what a run's wallet ($2, workspace $1) has spent, the
// attempts of the effect being begun again included: a new attempt adds its
// cost to theirs. Read after sqlLockWallet, in a later statement, so that
// its snapshot sees the spend of every begin that held the lock before.
var sqlRunSpend = `SELECT ` + money.RunSpendSQL("$1::text", "$2::text")

// sqlKeyInRun is whether the key ($3) already names an effect begun under
// the run ($1) in the workspace ($2): the run may be gone (JOB_RETENTION_DAYS)
// while its effects are kept, and a repeated begin must still answer them.
const sqlKeyInRun = `SELECT EXISTS (SELECT 1 FROM effects WHERE workspace_id = $2 AND idempotency_key = $3 AND run_id = $1)`

// sqlLockEffectStates locks effects (in id order, so that concurrent
// reconciliations cannot deadlock) and reads their state and attempt as
// they now are. $1 ids, $2 workspace.
const sqlLockEffectStates = `SELECT id, state, lease_expires_at, attempt FROM effects
WHERE id = ANY($1::text[]) AND workspace_id = $2 ORDER BY id FOR UPDATE`

// sqlCompensationTarget reads the effect a compensating begin names, and
// whether it declared a compensation (not the sealed value, of up to 1 MiB:
// a replay of a compensation's key, as every retry following a plan is,
// never compares it; sqlEffectCompensation reads it when a new
// compensating effect must match it). $1 effect id, $2
// workspace, $3 the key whose group it must be a step of (NULL: any effect;
// see groupOwner): to a key that may not act on it, another key's step, or
// an effect of no group, does not exist (a key that reads every effect is
// then told what it lacks: admit reads it again without $3).
const sqlCompensationTarget = `SELECT e.group_id, e.state, e.lease_expires_at, e.compensates_effect_id,
    e.compensation IS NOT NULL
FROM effects e LEFT JOIN effect_groups g ON g.id = e.group_id
WHERE e.id = $1 AND e.workspace_id = $2 AND ($3::text IS NULL OR g.created_by_key_id = $3::text)`

// sqlCompensationOf is the compensating effect of a step and its key (no
// row: none). $1 the step's effect id.
const sqlCompensationOf = `SELECT id, idempotency_key FROM effects WHERE compensates_effect_id = $1`

// sqlGroupSteps lists a group's effects, forward and compensating, with the
// length of each one's sealed compensation (0: none) rather than the value
// (up to 1 MiB each; octet_length reads it from the TOAST pointer, the
// value left unread): a group's read and commit show only whether a step
// has one, a settle and a compensating begin's check only need to know,
// and an unwind opens those of the plan items its answer holds
// (sqlPlanCompensations). And with the time each succeeded: its succeeded
// attempt's report, or for an outcome found later (resolve, reconcile) the
// end of that attempt's lease, the latest it could have acted, which is
// also where the step sat in the order while its outcome was unknown. (Not
// the current attempt's: a retry reported failed after an unknown attempt
// that is then resolved succeeded did not succeed when it was reported.)
// So, for an indeterminate effect, the next column is the end of the lease
// of its latest attempt of unknown outcome (recorded indeterminate, or
// lapsed unrecorded), where it sits until then (model QA: it sat at the
// failed retry's lease end, after steps that succeeded once the unknown
// attempt could no longer act, holding their compensations back).
// $1 group id.
//
// The last column says a failed or denied effect can never be tried
// again: it used every attempt its type's policy allows (5 unset, as in
// sqlEffectivePolicy; a denied one too, refused for a reason a begin could
// lift before max_attempts was lowered), or, failed, was refused max_attempts_exceeded while its
// outcome was unknown (the code kept once resolved failed, settledDenial,
// whatever max_attempts says since), or its retry's approval was rejected
// (one a group's rollback closed leaves it failed; an operator's rejection
// denies it, settledState, sqlDecideApproval, but one resolved failed
// before a release that did reads failed). Its key's next begin is
// max_attempts_exceeded or approval_rejected, final.
const sqlGroupSteps = `SELECT e.id, e.effect_type, e.idempotency_key, e.state, e.denial_code, e.lease_expires_at,
    coalesce(octet_length(e.compensation), 0), e.compensates_effect_id, e.created_at, e.updated_at,
    (SELECT max(coalesce(a.reported_at, a.lease_expires_at)) FROM effect_attempts a
      WHERE a.effect_id = e.id AND a.outcome = 'succeeded' AND e.state = 'succeeded'),
    CASE WHEN e.state = 'indeterminate' THEN (SELECT a.lease_expires_at FROM effect_attempts a
      WHERE a.effect_id = e.id AND (a.outcome IS NULL OR a.outcome = 'indeterminate')
      ORDER BY a.attempt DESC LIMIT 1) END,
    e.state = 'failed' AND (e.approval_state IS NOT DISTINCT FROM 'rejected'
      OR e.denial_code IS NOT DISTINCT FROM 'max_attempts_exceeded')
    OR e.state IN ('failed', 'denied') AND e.attempt >= coalesce((SELECT p.max_attempts FROM gate_policies p
        WHERE p.workspace_id = e.workspace_id AND p.effect_type = e.effect_type), 5)
FROM effects e WHERE e.group_id = $1 ORDER BY e.id`

// sqlPlanCompensations reads the sealed compensations of the steps $2 of
// group $1: the plan items an unwind's answer holds.
const sqlPlanCompensations = `SELECT id, compensation FROM effects WHERE group_id = $1 AND id = ANY($2::text[])`

// sqlGroupStepsPage pages a group's effects in id order, as a group's read
// lists them (effects_group_idx): $1 group id, $2 the previous page's last
// effect id (” for the first), $3 the limit.
const sqlGroupStepsPage = `SELECT e.id, e.effect_type, e.idempotency_key, e.state, e.lease_expires_at,
    e.compensation IS NOT NULL, e.compensates_effect_id
FROM effects e WHERE e.group_id = $1::text AND e.id > $2::text ORDER BY e.id LIMIT $3::int`

// sqlSetGroupState moves a locked group. $1 id, $2 state, $3 now. A commit,
// and the end of a rollback, set keep_until (migrations 0037, 0038) from the
// group's effects' types' retention; an unwind clears it (an unwinding
// group is kept whole until it ends).
const sqlSetGroupState = `UPDATE effect_groups SET state = $2, updated_at = $3,
    committed_at = CASE WHEN $2 = 'committed' THEN $3 ELSE committed_at END,
    keep_until = CASE WHEN $2 IN ('committed', 'unwound', 'unwind_failed')
                      THEN $3::timestamptz + make_interval(days => (` + sqlLongestRetention + `)) END,
    unwind_started_at = CASE WHEN $2 = 'unwinding' THEN $3 ELSE unwind_started_at END,
    finished_at = CASE WHEN $2 IN ('unwound', 'unwind_failed') THEN $3 ELSE finished_at END
WHERE id = $1 RETURNING ` + groupCols

// sqlLockUnwinding takes an unwinding group for settling; the sweeper's
// variant skips a group another settle holds. $1 id, $2 workspace (” for any).
const (
	sqlLockUnwinding     = `SELECT ` + groupCols + ` FROM effect_groups WHERE id = $1 AND ($2::text = '' OR workspace_id = $2) AND state = 'unwinding' FOR UPDATE`
	sqlLockUnwindingSkip = sqlLockUnwinding + ` SKIP LOCKED`
)

// sqlUnwindingDue picks the unwinding groups the sweeper checks this pass,
// taking turns among the workspaces that have some (db.FairPick), each
// one's least recently checked first, and marks them checked. In that order
// alone, a group checked once went behind every other workspace's groups,
// and a workspace that left 100,000 rollbacks unwinding had another's
// group, whose compensations had all ended, settled a thousand passes
// later (multi-tenant QA). Through effect_groups_unwinding_ws_idx (0062),
// a descent a workspace. $1 now, $2 limit.
var sqlUnwindingDue = `
WITH c AS (
    SELECT id FROM effect_groups WHERE state = 'unwinding' AND id = ANY(ARRAY(` + db.FairPick(db.Backlog{
	Table: "effect_groups", Where: "state = 'unwinding'",
	Order: "swept_at NULLS FIRST", Due: "coalesce(swept_at, '-infinity'::timestamptz)",
}, "$2::int") + `))
    FOR UPDATE SKIP LOCKED
)
UPDATE effect_groups g SET swept_at = $1 FROM c WHERE g.id = c.id RETURNING g.id`

// ---- Reconciliation (reconcile.go) ----

// sqlReconcileEffects reads the effects a reconciliation compares: those of
// the type that happened in [from, to), and those the vendor's records name
// (the last column says which are in the window).
//
// An effect happened when its latest attempt that did not fail started:
// the attempt that may have reached the vendor (the one that succeeded,
// the live or unknown one). A vendor's export lists charges by when they
// were made, which is inside an attempt, after its start and within its
// lease; not when the effect was first begun (QA: one begun the day before
// and retried into the window read missing_at_vendor the day before, and
// one retried after the window read missing in it), nor when its outcome
// was recorded, which a resolve can do days later. An effect no attempt of
// which may have acted (failed, denied, awaiting approval) is placed by its
// creation; none of those is listed unless a record names it.
//
// That time lies between the effect's creation and its latest attempt's
// start (attempt_started_at), so the attempts are read only for an effect
// whose span crosses a bound of the window. The candidates come from
// indexes, never from the type's whole history, in three disjoint parts:
// the effects created in the window, the others the records name, and the
// others created before it with an attempt started in it (found among
// every type's attempts started in it, effect_attempts_started_idx, by
// their effect ids below $7, the least id of from's next millisecond: ids
// sort by creation time; OFFSET 0 keeps each a lookup by id, as the
// planner cannot tell how few they are).
// $1 workspace, $2 effect type, $3 from, $4 to, $5 vendor keys, $6 limit,
// $7 effect id bound.
const sqlReconcileEffects = `
WITH c AS (
    SELECT ` + reconCols + ` FROM effects e
    WHERE e.workspace_id = $1 AND e.effect_type = $2 AND e.created_at >= $3 AND e.created_at < $4
    UNION ALL
    SELECT ` + reconCols + ` FROM effects e
    WHERE e.workspace_id = $1 AND e.effect_type = $2 AND e.idempotency_key = ANY($5::text[])
      AND NOT (e.created_at >= $3 AND e.created_at < $4)
    UNION ALL
    SELECT e.* FROM (SELECT DISTINCT effect_id FROM effect_attempts
        WHERE workspace_id = $1 AND started_at >= $3 AND started_at < $4 AND effect_id < $7
          AND outcome IS DISTINCT FROM 'failed') t
    CROSS JOIN LATERAL (SELECT ` + reconCols + ` FROM effects e
        WHERE e.id = t.effect_id AND e.workspace_id = $1 AND e.effect_type = $2 AND e.created_at < $3
          AND e.idempotency_key <> ALL($5::text[]) OFFSET 0) e
), w AS (
    SELECT c.*, CASE
        WHEN c.created_at >= $3 AND coalesce(c.attempt_started_at, c.created_at) < $4 THEN true
        WHEN coalesce(c.attempt_started_at, c.created_at) < $3 OR c.created_at >= $4 THEN false
        ELSE tstzrange($3, $4) @> (SELECT coalesce(max(a.started_at), c.created_at) FROM effect_attempts a
            WHERE a.effect_id = c.id AND a.outcome IS DISTINCT FROM 'failed')
    END AS in_window
    FROM c
)
SELECT id, idempotency_key, state, lease_expires_at, cost_micros, attempt, in_window FROM w
WHERE in_window OR idempotency_key = ANY($5::text[]) ORDER BY id LIMIT $6`

// sqlReconcilePlan turns JIT compilation and parallel workers off for the
// rest of the reconciliation's transaction. sqlReconcileEffects' third
// part reads every type's attempts started in the window, and the planner,
// which cannot see how few of their effects were created before it,
// estimates it past jit_above_cost on a busy workspace: compiling then took
// 650 ms of a 1.1 s statement that runs in 72 ms without (review: 1M
// effects in a day, a 1% type over two hours; 3 ms when the window went by
// creation time). The same estimate (27,000 attempts for the 1,500 of an
// hour) planned that part with parallel workers, whose start was most of
// the statement (scale QA, 1.1M effects over 30 days: an hour's window
// 25 ms with them, 0.5-1.4 ms without; a day's 40-80 ms, 7-38 ms).
const sqlReconcilePlan = `SELECT set_config('jit', 'off', true), set_config('max_parallel_workers_per_gather', '0', true)`

// reconCols are what sqlReconcileEffects reads of an effect e.
const reconCols = `e.id, e.idempotency_key, e.state, e.lease_expires_at, e.cost_micros, e.attempt, e.created_at,
    e.attempt_started_at`

// sqlReconcileResolve settles indeterminate effects from the vendor's
// records, like an operator's resolve (every unknown attempt), releasing the
// ceilings of those that failed as a resolve does. Lapsed leases were made
// durable first. It answers the groups of the effects it settled, once each.
// $1 workspace, $2 effect ids, $3 outcomes, $4 now, $5 key id, $6
// rolledBackNote.
var sqlReconcileResolve = `
WITH t AS (SELECT * FROM unnest($2::text[], $3::text[]) AS t(id, outcome)),
upd AS (
    UPDATE effects e SET state = ` + settledState("t.outcome", "$6") + `, updated_at = $4,
        denial_code = ` + settledDenial("t.outcome", "$6") + `
    FROM t WHERE e.id = t.id AND e.workspace_id = $1 AND e.state = 'indeterminate'
    RETURNING e.id, e.group_id, t.outcome
), upa AS (
    UPDATE effect_attempts a SET outcome = upd.outcome, resolved_by_key_id = $5, resolved_at = $4,
        resolve_note = '` + resolveNoteReconciliation + `'
    FROM upd WHERE a.effect_id = upd.id AND a.attempt IN (SELECT attempt FROM gate_unknown_attempts(upd.id))
    RETURNING a.workspace_id, a.charges, a.charged_on, a.outcome
), ` + freedCTE("upa") + `,` + releaseCTEs("freed", "true") + `
SELECT DISTINCT group_id FROM upd WHERE group_id IS NOT NULL ORDER BY group_id`

// sqlGroupStates reads the states of groups $2 of workspace $1 (empty: of
// any, as sqlLockUnwinding) once no transition of theirs is in progress:
// an unwind, a commit or a settle holds the group's row FOR UPDATE (a
// begin of a step only FOR SHARE, which KEY SHARE does not wait for), and
// the locked rows are the latest versions, so a state is the one that
// transition left. A settled step may end only a group being rolled back
// (settleGroup), and read on the statement's snapshot alone (state = 'unwinding' in a WHERE) a group an
// unwind was making unwinding was passed over: the unwind had read the
// step as unresolved, and the rollback stayed unwinding, its last step
// settled, until a read or the sweeper ended it (QA: a reconciliation, a
// resolve or a report racing the unwind). In id order, as every lock of
// several groups. sqlGroupStatesSkip waits for none: the groups another
// transaction holds are left out, for a settle of each to wait for
// (endRollbacks), so that one held long holds back none of the others.
const (
	sqlGroupStates = `SELECT id, state FROM effect_groups
WHERE id = ANY($2::text[]) AND ($1::text = '' OR workspace_id = $1) ORDER BY id FOR KEY SHARE`
	sqlGroupStatesSkip = sqlGroupStates + ` SKIP LOCKED`
)

// sqlSpentAmongUnwinding answers up to $5 unwinding groups of workspace
// $1 holding an effect of type $2 that failed, or was denied, after $3
// attempts or more but fewer than $4: those a max_attempts lowered from $4
// to $3 has made spent (sqlGroupSteps), which may end their rollback
// (settleSpentGroups). Through effects_type_state_idx.
const sqlSpentAmongUnwinding = `SELECT DISTINCT e.group_id FROM effects e
JOIN effect_groups g ON g.id = e.group_id AND g.state = 'unwinding'
WHERE e.workspace_id = $1 AND e.effect_type = $2 AND e.state IN ('failed', 'denied')
  AND e.group_id IS NOT NULL AND e.attempt >= $3 AND e.attempt < $4
ORDER BY e.group_id LIMIT $5`

// sqlReconciled records when a type was last reconciled, never moving it
// back: a reconciliation whose clock reads earlier than the one recorded
// (another instance's clock behind, or two committing out of order) leaves
// the later one, which policies read and the reminders' calendar restarts
// from (review). $1 workspace, $2 effect type, $3 now, $4 from, $5 to.
const sqlReconciled = `INSERT INTO reconciliations (workspace_id, effect_type, last_reconciled_at, last_from, last_to)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (workspace_id, effect_type) DO UPDATE
SET last_reconciled_at = $3, last_from = $4, last_to = $5
WHERE reconciliations.last_reconciled_at <= $3`

// sqlReconcileDue records one reconciliation.due event per overdue type and
// due period. A type is due reconcile_every_hours after the later of its
// last reconciliation and the time reminders were turned on for it
// (reconcile_since; QA: from the policy's creation, a type whose policy was
// older than a period was due the moment reminders were turned on); left
// overdue it is reminded again each further period. A type reminded since
// its current period fell due (last_reminded_at at or after that time,
// whatever period that reminder was for) is not picked again, so a period
// is reminded once, and the LIMIT reaches the others: known by its dedupe
// key alone, a period changed while the type was overdue was reminded
// again at once (review: lengthened from 5 h to 24 h just after the
// reminder due at 25 h, the period due at 24 h, reminded at 26 h, had a
// second reminder). When a type was last reminded is read from
// reconciliation_reminders (migration 0086), which this statement writes
// with each reminder: probing events for a reminder since the period fell
// due cost an index probe for every type overdue and reminded, every pass
// (scale QA: 100,000 such types, some 800,000 buffers and 1.2 to 1.7 s a
// pass; some 4,000 buffers and 0.2 s reading the table). The reminder's
// row is written first, and only a type whose row it wrote is reminded:
// its conflict path rereads the row at its latest version, so of two
// sweeps overlapping a policy write that changes the period (each reading
// its own period, with its own dedupe key), the second waits for the
// first's row and, reminded since its period fell due, records nothing
// (review: both found no reminder and recorded one each). Rows are written
// in key order, one order for every sweep. The period's due time is still
// the event's dedupe key: a reminder of the previous release, which does
// not write the table, is not recorded again during the deploy. A
// reminder's created_at is its sweep's now ($1), within the period it was
// for. The type's latest reminder outlives event retention
// (webhooks.Service.PurgeDelivered). The pass takes turns among the
// workspaces with types due, each one's longest due first (as
// db.RoundRobin orders): in due order alone, with 500 a pass, a workspace
// with 100,000 types overdue held another's reminder back for 200 passes
// (multi-tenant QA). It reads every type with reminders on in any case
// (the local loop runs it once a minute: lib/app, sweep.Task.Every). $1
// now, $2 limit, $3 event ids (one per row).
var sqlReconcileDue = `
WITH due AS (
    SELECT p.workspace_id, p.effect_type, p.reconcile_every_hours AS h, r.last_reconciled_at, m.last_reminded_at,
        greatest(r.last_reconciled_at, coalesce(p.reconcile_since, p.created_at))
            + make_interval(hours => p.reconcile_every_hours) AS first_due
    FROM gate_policies p
    LEFT JOIN reconciliations r ON r.workspace_id = p.workspace_id AND r.effect_type = p.effect_type
    LEFT JOIN reconciliation_reminders m ON m.workspace_id = p.workspace_id AND m.effect_type = p.effect_type
    WHERE p.reconcile_every_hours IS NOT NULL
), per AS (
    SELECT d.*, d.first_due + make_interval(hours => d.h *
        floor(extract(epoch FROM ($1::timestamptz - d.first_due)) / (d.h * 3600))::int) AS period_due
    FROM due d WHERE d.first_due <= $1
), pick AS (
    SELECT per.*, to_char(per.period_due AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS dedupe
    FROM per WHERE per.last_reminded_at IS NULL OR per.last_reminded_at < per.period_due
), n AS (
    SELECT pick.*, row_number() OVER (ORDER BY pick.workspace_id, pick.effect_type) AS i
    FROM (SELECT pick.*, row_number() OVER (PARTITION BY pick.workspace_id ORDER BY pick.period_due, pick.effect_type) AS turn
        FROM pick
        ORDER BY turn, pick.period_due, pick.workspace_id, pick.effect_type LIMIT $2) pick
), reminded AS (
    INSERT INTO reconciliation_reminders AS m (workspace_id, effect_type, last_reminded_at, last_due_at)
    SELECT n.workspace_id, n.effect_type, $1, n.period_due FROM n ORDER BY n.workspace_id, n.effect_type
    ON CONFLICT (workspace_id, effect_type) DO UPDATE
    SET last_reminded_at = excluded.last_reminded_at, last_due_at = excluded.last_due_at
    WHERE m.last_reminded_at < excluded.last_due_at
    RETURNING m.workspace_id, m.effect_type
), ins AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
    SELECT ($3::text[])[n.i], n.workspace_id, '` + events.ReconciliationDue + `', n.effect_type,
        jsonb_build_object('effect_type', n.effect_type, 'reconcile_every_hours', n.h,
                           'last_reconciled_at', n.last_reconciled_at, 'due_at', n.period_due), $1, n.dedupe
    FROM n JOIN reminded ON reminded.workspace_id = n.workspace_id AND reminded.effect_type = n.effect_type
    ON CONFLICT (workspace_id, type, subject_id, dedupe_key) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM ins`

// approvalCols are an approval's fields; answers is what an approved one
// answers (one approved before 0041 recorded none: its reason alone), and
// decided_by_key_id the key that decided it (null while pending, and for
// one a rollback's end or the sweeper closed, which no key decided); the
// effect's cost_micros and idempotency_key say what it holds (both bound by
// the effect's fingerprint, so what is approved is what runs). Read from a
// row of approvals under that name (a statement's FROM, or an UPDATE's
// RETURNING).
const approvalCols = `id, effect_id, effect_type, state, reason, created_at, decided_at, note,
    CASE WHEN state = 'approved' THEN coalesce(answers, ARRAY[reason]) END AS answers, decided_by_key_id,
    (SELECT f.cost_micros FROM effects f WHERE f.id = approvals.effect_id) AS cost_micros,
    (SELECT f.idempotency_key FROM effects f WHERE f.id = approvals.effect_id) AS idempotency_key`

// sqlDecideApproval approves or rejects a pending approval and updates its
// effect in one statement: a rejection is a final denial for the key. An
// effect whose last attempt's outcome is unknown (a retry after a lapse
// that needed approval) waited indeterminate and stays so, its unknown
// outcome resolvable; begin still answers approval_rejected, and settled
// failed it is denied approval_rejected (settledState). (One that
// waited as awaiting_approval before that rule goes back to indeterminate.)
// One whose retry waited indeterminate and that an operator resolved failed
// meanwhile is denied approval_rejected at once too, as begin would make it
// (gate QA: it read failed until its key's next begin). A failed effect is
// denied whatever u reads: u is read in the statement's snapshot, and a
// rejection that waited for the effect's row while a resolve to failed
// committed updates the effect as it is now, failed, but read its latest
// attempt as the snapshot had it, of unknown outcome, and left the effect
// indeterminate with no attempt of unknown outcome left to resolve (QA,
// TestARejectionWaitingOnAResolveToFailedDeniesTheEffect). A failed effect's
// latest attempt is known to have failed, so only awaiting_approval (an
// effect that waited so before indeterminate retries waited indeterminate)
// asks u.
// An approval records what it answers (answers): the reason it was asked
// for and every other that holds as it is given, read in the statement's
// snapshot (see approvalStillAnswers).
// $1 approval id, $2 workspace, $3 'approved'|'rejected', $4 now, $5 key id,
// $6 note, $7 event id.
var sqlDecideApproval = `
WITH asked AS (
    SELECT ap.reason, ap.effect_type, f.cost_micros FROM approvals ap JOIN effects f ON f.id = ap.effect_id
    WHERE ap.id = $1 AND ap.workspace_id = $2 AND ap.state = 'pending'
), held AS (
    SELECT ARRAY(SELECT r FROM unnest(ARRAY[asked.reason,
        CASE WHEN p.mode = 'require_approval' THEN '` + reasonPolicy + `' END,
        CASE WHEN EXISTS (` + holdingCircuitsSQL("asked.effect_type") + `)
             THEN '` + reasonCircuitOpen + `' END,
        CASE WHEN asked.cost_micros >= p.approval_above_micros THEN '` + reasonAmount + `' END]) AS r
        WHERE r IS NOT NULL GROUP BY r
        ORDER BY array_position(ARRAY['` + reasonPolicy + `', '` + reasonCircuitOpen + `', '` + reasonAmount + `'], r)) AS answers
    FROM asked LEFT JOIN gate_policies p ON p.workspace_id = $2 AND p.effect_type = asked.effect_type
), a AS (
    UPDATE approvals SET state = $3, decided_at = $4, decided_by_key_id = $5, note = $6,
        answers = CASE WHEN $3 = 'approved' THEN (SELECT held.answers FROM held) END
    WHERE id = $1 AND workspace_id = $2 AND state = 'pending'
      -- Decided only by a key not revoked (another instance's cache may
      -- still hold a revoked one): an approval lets an effect execute.
      AND ` + auth.LiveKeySQL("$5") + `
      AND ($3 = 'rejected' OR NOT EXISTS (` + sqlApprovalRolledBack + `))
    RETURNING ` + approvalCols + `
), e AS (
    UPDATE effects e SET approval_state = $3, updated_at = $4,
        state = CASE WHEN $3 = 'rejected' AND e.state IN ('awaiting_approval', 'failed')
                     THEN CASE WHEN e.state = 'awaiting_approval' AND u.unknown THEN 'indeterminate' ELSE 'denied' END
                     ELSE e.state END,
        denial_code = CASE WHEN $3 = 'rejected' AND (e.state = 'failed' OR (e.state = 'awaiting_approval' AND NOT u.unknown))
                           THEN 'approval_rejected' ELSE e.denial_code END
    FROM a, LATERAL (SELECT EXISTS (SELECT 1 FROM effect_attempts x WHERE x.effect_id = a.effect_id
        AND x.attempt = (SELECT f.attempt FROM effects f WHERE f.id = a.effect_id) AND x.outcome = 'indeterminate')
        AS unknown) u
    WHERE e.id = a.effect_id AND e.approval_id = a.id
    RETURNING e.group_id
), evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at)
    SELECT $7, $2, '` + events.ApprovalDecided + `', a.id,
        jsonb_build_object('approval_id', a.id, 'effect_id', a.effect_id, 'effect_type', a.effect_type,
                           'state', a.state, 'answers', a.answers, 'decided_by_key_id', a.decided_by_key_id), $4
    FROM a
)
SELECT a.*, (SELECT group_id FROM e) FROM a`

// sqlMootApprovals answers the pending approvals of those of effects $1
// (workspace $2) that are settled succeeded: a resolution settled an effect
// whose retry waited for an operator, and nothing can run on its key again.
// It locks them, passing over one another transaction holds: a decide locks
// its approval, then its effect, and the resolution holds the effect
// already, so waiting for the approval would close a cycle with it
// (deadlock); one held is being decided by an operator, or is left pending.
const sqlMootApprovals = `SELECT ap.id FROM effects e JOIN approvals ap ON ap.id = e.approval_id
WHERE e.id = ANY($1::text[]) AND e.workspace_id = $2 AND e.state = 'succeeded' AND ap.state = 'pending'
ORDER BY ap.id
FOR UPDATE OF ap SKIP LOCKED`

// sqlSweepMootApprovals is the backstop of closeMootApprovals and
// closeRolledBackApprovals: at $1, it closes up to $2 pending approvals
// that ask nothing any more, rejected and announced (approval.decided, ids
// $4 in turn): those whose effect is settled succeeded (one settled before
// resolutions closed them, or one a resolution passed over because another
// transaction held it then), with note $3, decided by the key that resolved
// the effect's latest attempt settled (none when no key did), whether or
// not that key was revoked since (a rejection lets nothing run, and the
// decision is the resolution's); and those whose effect its group's
// rollback keeps from ever running (one an unwind or a rollback's end
// passed over, or that was left pending before they closed them), with
// note $5, decided by no key (the key that unwound is not recorded).
// Each workspace takes its turn: one approval of each workspace with any,
// then a second of each, up to $2, read through the primary key as
// = ANY(ARRAY(…)) (db.RoundRobin: as IN (…), the planner hashed them and
// read every approval, scale QA). The candidates are the effects whose
// approval is pending and that are settled succeeded or grouped
// (mootCandidateSQL), read through effects_moot_approval_idx (migration
// 0085), and the workspaces those of any, found through it too
// (db.WorkspacesWith), one descent each: it read every workspace, and
// probed approvals_list_idx for each, on every pass (sweeper scalability
// QA: 10,000 buffers a pass for 5,000 workspaces with none pending); then
// every pending approval of each workspace with one, with its effect, moot
// or not (scale QA: 20,000 awaiting an operator, 100,000 buffers a pass
// with none moot). It locks the approvals and their effects, passing over
// any another transaction holds (a decide, a resolve, a begin), so it
// waits for no lock: the next pass takes them.
var sqlSweepMootApprovals = `
WITH turns AS (
    SELECT c.id, row_number() OVER (PARTITION BY c.workspace_id ORDER BY c.id) AS turn, c.workspace_id
    FROM ` + db.WorkspacesWith("effects", mootCandidateSQL("")) + ` w CROSS JOIN LATERAL (
        SELECT ap.id, ap.workspace_id FROM effects e JOIN approvals ap ON ap.id = e.approval_id
        WHERE e.workspace_id = w.workspace_id AND ` + mootCandidateSQL("e.") + ` AND ap.effect_id = e.id
          AND ap.state = 'pending' AND (e.state = 'succeeded' OR ` + rolledBackSQL("e") + `)
        ORDER BY e.approval_id
        LIMIT $2::int) c
), moot AS (
    SELECT ap.id, CASE WHEN e.state = 'succeeded' THEN $3 ELSE $5 END AS note,
        CASE WHEN e.state = 'succeeded' THEN (SELECT x.resolved_by_key_id FROM effect_attempts x
            WHERE x.effect_id = e.id AND x.outcome = 'succeeded' AND x.resolved_by_key_id IS NOT NULL
            ORDER BY x.attempt DESC LIMIT 1) END AS decided_by
    FROM approvals ap JOIN effects e ON e.id = ap.effect_id
    WHERE ap.id = ANY(ARRAY(SELECT t.id FROM turns t ORDER BY t.turn, t.workspace_id, t.id LIMIT $2::int))
      AND ap.state = 'pending' AND e.approval_id = ap.id AND (e.state = 'succeeded' OR ` + rolledBackSQL("e") + `)
    ORDER BY ap.id
    FOR UPDATE OF ap, e SKIP LOCKED
` + closeApprovalsSQL

// mootCandidateSQL is effects_moot_approval_idx's predicate (migration
// 0085), its columns prefixed with p ("" or an alias and a dot): an effect
// whose approval is pending (approval_state follows its approval's) and
// that is settled succeeded or grouped, as any whose approval is moot is.
func mootCandidateSQL(p string) string {
	return p + `approval_state = 'pending' AND (` + p + `state = 'succeeded' OR ` + p + `group_id IS NOT NULL)`
}

// closeApprovalsSQL ends a statement whose CTE moot (id, note, decided_by)
// names pending approvals it holds: each is rejected at $1 with its note,
// decided by its key (answers none), its effect's approval_state follows,
// the effect keeping its state, and it is announced (approval.decided, ids
// $4 in turn: one event per approval, whatever its past). It answers how
// many it closed.
const closeApprovalsSQL = `), a AS (
    UPDATE approvals ap SET state = 'rejected', decided_at = $1, note = m.note, answers = NULL,
        decided_by_key_id = m.decided_by
    FROM moot m WHERE ap.id = m.id
    RETURNING ap.id, ap.workspace_id, ap.effect_id, ap.effect_type, ap.decided_by_key_id
), e AS (
    UPDATE effects e SET approval_state = 'rejected', updated_at = $1
    FROM a WHERE e.id = a.effect_id AND e.approval_id = a.id
), numbered AS (
    SELECT a.*, row_number() OVER (ORDER BY a.id) AS n FROM a
), evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at)
    SELECT ($4::text[])[n], workspace_id, '` + events.ApprovalDecided + `', id,
        jsonb_build_object('approval_id', id, 'effect_id', effect_id, 'effect_type', effect_type,
                           'state', 'rejected', 'answers', NULL, 'decided_by_key_id', decided_by_key_id), $1
    FROM numbered
    ON CONFLICT DO NOTHING -- announced already: one event per approval, whatever its past
)
SELECT count(*) FROM a`

// sqlLockRolledBackApprovals locks the pending approvals of group $1's
// effects that its rollback keeps from ever running (rolledBackSQL; one
// whose effect is settled succeeded is closeMootApprovals'), passing over
// one another transaction holds, approval or effect: a decide locks its
// approval, then its effect, so waiting could close a cycle with it; the
// sweeper closes such later (sqlSweepMootApprovals). The caller holds the
// group, so what it reads of it stands.
var sqlLockRolledBackApprovals = `SELECT ap.id FROM effects e JOIN approvals ap ON ap.id = e.approval_id
WHERE e.group_id = $1 AND ap.state = 'pending' AND e.state <> 'succeeded' AND ` + rolledBackSQL("e") + `
ORDER BY ap.id
FOR UPDATE OF ap, e SKIP LOCKED`

// sqlCloseRolledBackApprovals closes the approvals $2 that
// sqlLockRolledBackApprovals locked, at $1, with note $3, decided by key $5
// (closeApprovalsSQL, events $4).
const sqlCloseRolledBackApprovals = `WITH moot AS (
    SELECT ap.id, $3::text AS note, $5::text AS decided_by FROM approvals ap
    WHERE ap.id = ANY($2::text[]) AND ap.state = 'pending'
` + closeApprovalsSQL

// rolledBackSQL is true of effect f (an alias) when its group's rollback
// keeps it from ever taking an attempt: a forward step of a group being
// (or that was) rolled back, or a compensation of one whose rollback
// ended.
func rolledBackSQL(f string) string {
	return `EXISTS (SELECT 1 FROM effect_groups g WHERE g.id = ` + f + `.group_id AND ` + rolledBackGroupSQL(f) + `)`
}

// rolledBackGroupSQL is rolledBackSQL's test of group g's state.
func rolledBackGroupSQL(f string) string {
	return `(g.state IN ('unwound', 'unwind_failed') OR (g.state = 'unwinding' AND ` + f + `.compensates_effect_id IS NULL))`
}

// sqlApprovalRolledBack answers the state of the group whose rollback
// keeps approval $1's effect from ever taking its attempt: a forward step
// of a group being (or that was) rolled back, or a compensation of one
// whose rollback ended. No row otherwise.
var sqlApprovalRolledBack = `SELECT g.state FROM approvals ap
JOIN effects f ON f.id = ap.effect_id
JOIN effect_groups g ON g.id = f.group_id
WHERE ap.id = $1 AND ` + rolledBackGroupSQL("f")

// sqlEffectGroupOf is the group of effect $1 (NULL: none).
const sqlEffectGroupOf = `SELECT group_id FROM effects WHERE id = $1`

// $1 approval id, $2 workspace.
const sqlGetApproval = `SELECT ` + approvalCols + ` FROM approvals WHERE id = $1 AND workspace_id = $2`

// sqlListApprovals is the statement db.NewestFirst pages a workspace's
// approvals with ($1 the workspace; a state, as column state): one range
// of approvals_list_idx with a state, of approvals_workspace_idx
// (migration 0066) without.
const sqlListApprovals = `SELECT ` + approvalCols + ` FROM approvals WHERE workspace_id = $1::text`

// sqlLongestRetention is the longest retention_days (90 without a policy)
// among the types of the effects of the group effect_groups.id names.
const sqlLongestRetention = `SELECT coalesce(max(coalesce(p.retention_days, 90)), 90)
    FROM effects f
    LEFT JOIN gate_policies p ON p.workspace_id = f.workspace_id AND p.effect_type = f.effect_type
    WHERE f.group_id = effect_groups.id`

// groupsToShorten answers the ended groups of workspace $1 holding an
// effect of type $2 whose retention a policy write lowered to $3 days:
// keep_until was set from the longest retention of a group's types when
// it ended, and only a pass reaching it rereads the policies (so a raised
// retention keeps a group longer, but a lowered one kept it as long as
// before). Only a group kept longer than $3 days past its end can be
// shortened.
const groupsToShorten = `SELECT g.id FROM effect_groups g
WHERE g.workspace_id = $1 AND g.state IN ('committed', 'unwound', 'unwind_failed')
  AND g.keep_until > coalesce(g.finished_at, g.committed_at) + make_interval(days => $3::int)
  AND EXISTS (SELECT 1 FROM effects e WHERE e.group_id = g.id AND e.effect_type = $2)`

// sqlLockGroupsToShortenAfter locks a batch of those groups (groupsToShorten):
// up to $5 of them after id $4, in id order, so that two datings cannot
// deadlock; it waits for a pass holding one (sqlLockDueGroups) and then
// reads what that pass left. Run by dateGroupsBatch only, once the lowered
// policy is committed, in a transaction holding nothing but the type's
// claim (sqlClaimGroupsToDate).
const sqlLockGroupsToShortenAfter = groupsToShorten + `
  AND g.id > $4::text
ORDER BY g.id
LIMIT $5::int
FOR UPDATE`

// sqlClaimGroupsToDate and sqlTryClaimGroupsToDate take the claim of
// workspace $1's type $2's groups to date, for the rest of the
// transaction: a batch of them is dated under it (dateGroupsBatch), so
// two transactions never date one batch, nor count it, twice (two
// sweepers at once each dated and counted the same batch). Before any
// other lock of the batch's transaction, and taken by nothing else, so a
// transaction waiting for it holds nothing another waits for. The policy
// write's dating waits for it; a sweeper's pass tries it, and passes the
// type over when another holds it (sqlTryClaimGroupsToDate answers false).
const (
	sqlClaimGroupsToDate    = `SELECT pg_advisory_xact_lock(` + groupsToDateClaim + `)`
	sqlTryClaimGroupsToDate = `SELECT pg_try_advisory_xact_lock(` + groupsToDateClaim + `)`
	groupsToDateClaim       = `hashtextextended('groups_to_date:' || $1::text || ':' || $2::text, 0)`
)

// sqlGroupsToDateOf answers the record of workspace $1's type $2's groups
// to date (its days, after_id, batched, final_at and ended_from, migration
// 0079, and restarts, 0080), read under the type's claim: what the last
// batch left of it. No row when none is left to date.
const sqlGroupsToDateOf = `SELECT days, after_id, batched, final_at, ended_from, restarts FROM gate_groups_to_date
WHERE workspace_id = $1 AND effect_type = $2`

// sqlMarkGroupsToDate records, as the last statement of a policy write
// that lowers type $2's retention to $3 days (workspace $1), or repeats
// it ($6 false: the write changed nothing), that the type's ended groups
// are to be dated again (gate_groups_to_date, 0078). A write that lowers
// it ($6) dates them from the first group again, by $3: a group the
// batches had passed may have been kept longer since by a retention
// raised in between (a retention pass reaching a group due reads the
// policies of the day), and kept that date past $3 (review); the
// lowest retention recorded since would read groups dated by the policy
// in force as ones to shorten. A repeat keeps the lowest and goes on
// from where the batches are, but from the first group again when the
// groups were dated already (batched: only the final pass was left), or
// $3 is lower than the one recorded. Each restart counts in restarts
// (0080): a batch that read the record before it leaves the record as it
// is (sqlGroupsDatedTo). The final pass (0079) is at $4 at the earliest
// over the groups ended from $5 on, the latest and the earliest of the
// writes recorded. Last, so that a sweep holding a group and waiting for
// this row waits for the write's commit only. The type's ungrouped effects
// are due for a check at once (gate_retention_checks, migration 0084:
// retentionChecks says why), so those the lowered retention made due go
// at the next retention pass, not when the check the pair had stored came.
const sqlMarkGroupsToDate = `WITH checked AS (
    INSERT INTO gate_retention_checks AS c (workspace_id, effect_type, check_at)
    VALUES ($1, $2, '-infinity')
    ON CONFLICT (workspace_id, effect_type) DO UPDATE SET check_at = excluded.check_at
)
INSERT INTO gate_groups_to_date AS t (workspace_id, effect_type, days, final_at, ended_from)
VALUES ($1, $2, $3::int, $4::timestamptz, $5::timestamptz)
ON CONFLICT (workspace_id, effect_type) DO UPDATE
SET days = CASE WHEN $6::boolean THEN excluded.days ELSE least(t.days, excluded.days) END,
    after_id = CASE WHEN ` + groupsToDateRestart + ` THEN '' ELSE t.after_id END,
    restarts = t.restarts + CASE WHEN ` + groupsToDateRestart + ` THEN 1 ELSE 0 END,
    batched = false,
    final_at = greatest(t.final_at, excluded.final_at),
    ended_from = least(t.ended_from, excluded.ended_from)`

// groupsToDateRestart says that sqlMarkGroupsToDate dates the type's
// groups from the first again.
const groupsToDateRestart = `($6::boolean OR excluded.days < t.days OR t.batched)`

// sqlGroupsBatched marks the record of type $2's groups to date
// (workspace $1) batched once they are dated, unless the dating was
// restarted since its batch read restarts $3 (sqlMarkGroupsToDate): only
// its final pass is left (sqlLockEndedGroupsToShorten), from its
// ended_from on (after_id empty).
const sqlGroupsBatched = `UPDATE gate_groups_to_date SET batched = true, after_id = ''
WHERE workspace_id = $1 AND effect_type = $2 AND restarts = $3::bigint AND NOT batched`

// sqlGroupsDated deletes the record of type $2's groups to date (workspace
// $1) once its final pass has dated them, unless the dating was restarted
// since its batch read restarts $3 (which makes it to date in batches
// again).
const sqlGroupsDated = `DELETE FROM gate_groups_to_date
WHERE workspace_id = $1 AND effect_type = $2 AND restarts = $3::bigint AND batched`

// sqlFinalDatedTo moves the final pass of type $2's groups to date
// (workspace $1) on past group $5, ended at $4, the last of its batch,
// unless the dating was restarted since its batch read restarts $3.
const sqlFinalDatedTo = `UPDATE gate_groups_to_date SET ended_from = $4, after_id = $5
WHERE workspace_id = $1 AND effect_type = $2 AND restarts = $3::bigint AND batched`

// sqlLockEndedGroupsToShorten reads the final pass's batch: up to $6 of
// workspace $1's ended groups in the order they ended, from after
// ($4, $5), the end and id the last batch left off at
// (effect_groups_ended_ws_idx, migration 0079), up to $7, the pass's
// final_at (an end that read the policies before the write dated its group
// by then; the pass would otherwise chase the ends of a busy workspace,
// never done), whatever their types, and
// locks those of them the type $2's retention lowered to $3 days shortens
// (groupsToShorten), in id order as sqlLockGroupsToShortenAfter does, so
// that two datings cannot deadlock. It answers each group of the batch
// with its end and whether it is locked to shorten. Bounded by the batch,
// and read from the end of the groups the datings before it read.
const sqlLockEndedGroupsToShorten = `
WITH c AS MATERIALIZED (
    SELECT g.id, coalesce(g.finished_at, g.committed_at) AS ended FROM effect_groups g
    WHERE g.workspace_id = $1 AND g.state IN ('committed', 'unwound', 'unwind_failed')
      AND (coalesce(g.finished_at, g.committed_at), g.id) > ($4::timestamptz, $5::text)
      AND coalesce(g.finished_at, g.committed_at) <= $7::timestamptz
    ORDER BY coalesce(g.finished_at, g.committed_at), g.id
    LIMIT $6::int
), l AS MATERIALIZED (` + groupsToShorten + `
      AND g.id IN (SELECT id FROM c)
    ORDER BY g.id
    FOR UPDATE
)
SELECT c.id, c.ended, l.id IS NOT NULL FROM c LEFT JOIN l ON l.id = c.id ORDER BY c.ended, c.id`

// sqlGroupsDatedTo moves the record of type $2's groups to date (workspace
// $1) on past group $4, the last of a batch, unless the dating was
// restarted since the batch read restarts $3 (sqlMarkGroupsToDate): a
// lowering to the days it read, after a raise, too.
const sqlGroupsDatedTo = `UPDATE gate_groups_to_date SET after_id = $4
WHERE workspace_id = $1 AND effect_type = $2 AND restarts = $3::bigint AND NOT batched`

// sqlGroupsToDate answers up to $1 types with groups to date, each
// workspace's first before any workspace's second: those still to date in
// batches, and those whose final pass is due at $2.
const sqlGroupsToDate = `SELECT workspace_id, effect_type FROM (
    SELECT t.*, row_number() OVER (PARTITION BY t.workspace_id ORDER BY t.effect_type) AS turn
    FROM gate_groups_to_date t WHERE NOT t.batched OR t.final_at <= $2::timestamptz) x
ORDER BY turn, workspace_id, effect_type
LIMIT $1::int`

// sqlShortenKeptGroups dates the groups sqlLockGroupsToShortenAfter
// locked ($1) again by sqlLongestRetention, once the lowered policy is
// written. It changes, and counts, only those whose date that changes: a
// group another type keeps longer is read as one to shorten, and is
// dated the same again (review: counted as dated, once per lowering).
const sqlShortenKeptGroups = `UPDATE effect_groups g SET keep_until = d.until
FROM (SELECT effect_groups.id,
             coalesce(finished_at, committed_at) + make_interval(days => (` + sqlLongestRetention + `)) AS until
      FROM effect_groups WHERE effect_groups.id = ANY($1::text[])) d
WHERE g.id = d.id AND g.keep_until IS DISTINCT FROM d.until`

// sqlLockDueGroups locks, at $1, up to $2 ended groups (committed,
// unwound, unwind_failed) that are due (keep_until; none, for a group an
// instance older than 0037 committed or 0038 ended), oldest first
// (effect_groups_kept_idx), skipping a group a commit, unwind or begin
// holds: an unwind waiting for it would find no group (404), never a plan
// with steps missing. A statement of its own, before sqlPurgeKeptGroups:
// that one then reads the policies of the day in a snapshot taken once the
// groups are locked, so a policy write that shortened one of them
// (sqlLockGroupsToShortenAfter waits for the lock) either committed before
// it or reads what the pass left; read in the same snapshot as the lock, a
// pass could date a group by the retention just lowered (review).
const sqlLockDueGroups = lockDueGroups + `
ORDER BY coalesce(g.keep_until, '-infinity'::timestamptz)
LIMIT $2::int
FOR UPDATE SKIP LOCKED`

// sqlLockDueGroup is sqlLockDueGroups for group $2 alone: a batch that
// failed is purged group by group (purgeGroupsApart).
const sqlLockDueGroup = lockDueGroups + `
  AND g.id = $2::text
FOR UPDATE SKIP LOCKED`

const lockDueGroups = `SELECT g.id FROM effect_groups g
WHERE g.state IN ('committed', 'unwound', 'unwind_failed')
  AND coalesce(g.keep_until, '-infinity'::timestamptz) <= $1::timestamptz`

// sqlPutOffGroup moves group $1's keep_until on to $2 (never back): a
// group whose purge failed alone is read again then. A group another
// transaction holds is passed over, as sqlPutOffCheck passes over a pair:
// the failed purge's savepoint let go of its lock, so another pass may
// hold it now, which purges it or puts it off (an unwind holding it makes
// it unwinding, not due), and the put-off does not wait for the whole of
// that pass, nor two passes putting off each other's groups for each other.
const sqlPutOffGroup = `UPDATE effect_groups g
SET keep_until = greatest(coalesce(g.keep_until, '-infinity'::timestamptz), $2::timestamptz)
FROM (SELECT id FROM effect_groups WHERE id = $1::text FOR UPDATE SKIP LOCKED) l
WHERE g.id = l.id`

// sqlPurgeKeptGroups deletes, at $1, the groups sqlLockDueGroups locked
// ($2) whose every effect has passed its type's retention under the
// policies of the day, counted from the later of its end and the group's
// (a committed group could be unwound until then, and its plan needed them
// all; an ended rollback's record is its steps with their compensations),
// and answers their ids; sqlPurgeExpired then deletes their effects in the
// same transaction. It takes, oldest due first, those that start within $3
// steps (the first always, the last perhaps past it). It locks only their
// steps and their approvals, and keeps a group any of which another
// transaction holds (a report, a resolve, a replayed begin, a decide), so
// no step can outlive its group and no pass waits for a lock (review). A
// group due whose retention was raised since it ended, or not yet dated,
// gets its keep_until instead, so it is not read again before then. The
// locked steps and approvals are counted once, by group, then joined: a
// count per group over the batch's locked approvals read them all again
// for each group, growing with the square of the batch (scale QA: 100
// groups of 10 approved steps read 100,000 of them; 1,000 groups took
// 1.4-2.5 s, now 0.3-0.45 s). The groups and their steps are read by id
// (= ANY(ARRAY(…)), as db.RoundRobin says): a plan made for the batch's
// values scanned every group once the batch was a few percent of them
// (scale QA: all 4,000 groups read for a batch of 100). The steps'
// approvals are read by those steps' ids too: joined to the steps, they
// were hashed against a scan of every approval (2,400 read, twice, for
// the 300 steps of a batch of 100 groups).
const sqlPurgeKeptGroups = `
WITH due AS (
    SELECT g.id, g.state, coalesce(g.finished_at, g.committed_at) AS ended_at,
        coalesce(g.keep_until, '-infinity'::timestamptz) AS due_at
    FROM effect_groups g
    WHERE g.id = ANY(ARRAY(SELECT unnest($2::text[])))
), kept AS (
    SELECT d.id, d.due_at, s.steps, s.until
    FROM due d CROSS JOIN LATERAL (
        SELECT count(*) AS steps,
            -- a step not ended (none is expected) is looked at again a day
            -- on; one awaiting an approval in an ended rollback never takes
            -- its attempt (the group refuses it), and goes with the group
            CASE WHEN bool_or(f.state NOT IN ('succeeded', 'failed', 'denied')
                              AND NOT (f.state = 'awaiting_approval' AND d.state <> 'committed'))
                 THEN $1::timestamptz + interval '1 day'
                 ELSE max(greatest(f.updated_at, d.ended_at)
                          + make_interval(days => coalesce(p.retention_days, 90))) END AS until
        FROM effects f
        LEFT JOIN gate_policies p ON p.workspace_id = f.workspace_id AND p.effect_type = f.effect_type
        WHERE f.group_id = d.id) s
), expired AS (
    SELECT x.id, x.steps FROM (
        SELECT k.id, k.steps, sum(k.steps) OVER (ORDER BY k.due_at, k.id) AS running
        FROM kept k
        WHERE k.until IS NULL OR k.until <= $1::timestamptz
    ) x
    WHERE x.running - x.steps < $3::int
), locked AS (
    SELECT e.group_id FROM effects e WHERE e.group_id = ANY(ARRAY(SELECT id FROM expired))
    FOR UPDATE SKIP LOCKED
), held AS (
    SELECT l.group_id, count(*) AS steps FROM locked l GROUP BY l.group_id
), step_approvals AS (
    SELECT e.group_id, count(*) AS approvals FROM approvals a JOIN effects e ON e.id = a.effect_id
    WHERE a.effect_id = ANY(ARRAY(SELECT f.id FROM effects f WHERE f.group_id = ANY(ARRAY(SELECT id FROM expired))))
    GROUP BY e.group_id
), approvals_locked AS (
    -- their approvals, locked too: a decide locks its approval, then its
    -- effect, so a pass that waited for an approval a decide holds while
    -- holding its effect would deadlock with it (review)
    SELECT e.group_id FROM approvals a JOIN effects e ON e.id = a.effect_id
    WHERE a.effect_id = ANY(ARRAY(SELECT f.id FROM effects f WHERE f.group_id = ANY(ARRAY(SELECT id FROM expired))))
    FOR UPDATE OF a SKIP LOCKED
), held_approvals AS (
    SELECT al.group_id, count(*) AS approvals FROM approvals_locked al GROUP BY al.group_id
), later AS (
    UPDATE effect_groups g SET keep_until = k.until FROM kept k WHERE g.id = k.id AND k.until > $1::timestamptz
)
DELETE FROM effect_groups g USING expired x
LEFT JOIN held h ON h.group_id = x.id
LEFT JOIN step_approvals sa ON sa.group_id = x.id
LEFT JOIN held_approvals ha ON ha.group_id = x.id
WHERE g.id = x.id AND coalesce(h.steps, 0) = x.steps
  AND coalesce(sa.approvals, 0) = coalesce(ha.approvals, 0)
RETURNING g.id`

// sqlPurgeExpired deletes up to $2 effects whose retention has passed: the
// effect type's retention_days (90 when the type has no policy) counted from
// the effect's last change (updated_at: when it ended, for an ended one), so
// an effect that waited days for a resolve or an approval keeps its record
// that long after it ended, and its key keeps answering duplicate. Ended
// effects only (succeeded, failed, denied; never a live lease, an unresolved
// indeterminate outcome or a pending approval: an effect resolved failed
// while its retry waited for one is ended, but its question is open and
// holds its key, retention QA), outside any group (a group
// is kept whole: an open or unwinding one for as long as it lasts, an ended
// one until sqlPurgeKeptGroups deletes it; then all its effects, $3, go
// here too), with their attempts and approvals. It reads the (workspace,
// effect type) pairs sqlLockDueChecks locked ($4, $5: those that may have
// an effect due, gate_retention_checks, migration 0084) and each one's
// range of creation times older than its retention through
// effects_ended_ungrouped_idx (migration 0038: ended, ungrouped effects
// only; an effect changed last is never created later), so a batch costs
// an index probe per pair that may have effects due, and one more per pair
// with effects to delete: it visited every pair present in effects with a
// loose scan, and probed each, on every batch (sweeper scalability QA:
// 35,000 idle pairs, 211,720 buffers a batch). The batch is shared among
// the workspaces that have effects to delete, each one's share split among
// its types, oldest first in each: taken in the scan's order, the first
// workspace's backlog (one that lowered a type's retention_days from 90 to
// 1) filled every batch until it was gone, and every workspace after it in
// id order waited, its effects kept past their retention (multi-tenant
// QA). A workspace with less than its share leaves the rest of the batch
// unused; the next batch (the task drains) shares it among those left.
// Once deleted, a key is new again: its next begin executes. What the deleted effects spent of a run's wallet stays spent
// (money.RetiredRunSpendSQL). Each type's gate_effect_history moves up to
// the newest effect deleted, so its learned surge baseline leaves out the
// hours that lost effects (baselineSQL); begins never write that table, so
// a pass holds none of them. The batch's effects, attempts and approvals
// are deleted by its effects' ids (= ANY(ARRAY(…)), as db.RoundRobin
// says), not joined to the batch: a plan made for the pass's values hashed
// the batch and scanned every attempt or approval kept (scale QA: all
// 20,000 attempts of 20,000 effects, or all 20,000 approvals of 200,000,
// read for a batch of 100 effects), and every effect (all 20,000, for the
// same batch). The groups' effects are read by their groups' ids the same
// way, not matched to the literal list: a plan made for its values scanned
// every grouped effect once the groups were a few percent of them (all
// 12,000 steps of 4,000 groups read for the 300 of 100).
var sqlPurgeExpired = `
WITH expired AS (
    -- the effects of the groups sqlPurgeKeptGroups deleted ($3), which
    -- it locked: all of them, whatever the limit, so none outlives its group
    SELECT s.id, s.workspace_id, s.effect_type, s.created_at FROM (
        SELECT e.id, e.workspace_id, e.effect_type, e.created_at FROM effects e
        WHERE e.group_id = ANY(ARRAY(SELECT unnest($3::text[])))
        FOR UPDATE OF e
    ) s
    UNION
    (WITH pairs AS (
        SELECT * FROM unnest($4::text[], $5::text[]) AS p(workspace_id, effect_type)
    )
    , cut AS (
        SELECT p.workspace_id, p.effect_type,
            $1::timestamptz - make_interval(days => coalesce(pol.retention_days, 90)) AS cutoff
        FROM pairs p
        LEFT JOIN gate_policies pol ON pol.workspace_id = p.workspace_id AND pol.effect_type = p.effect_type
    ), due AS (
        -- a probe a pair: as EXISTS, a batch of pairs was planned as a hash
        -- join over a scan of every ended effect
        SELECT c.* FROM cut c WHERE (SELECT true FROM effects e
            WHERE e.workspace_id = c.workspace_id AND e.effect_type = c.effect_type
              AND e.created_at < c.cutoff AND e.updated_at < c.cutoff
              AND e.state IN ('succeeded', 'failed', 'denied') AND e.group_id IS NULL
              AND e.approval_state IS DISTINCT FROM 'pending'
            LIMIT 1)
    ), share AS (
        -- each workspace's share of the batch, split among its types
        SELECT d.*, ceil(ceil($2::numeric / (SELECT count(DISTINCT workspace_id) FROM due))
                         / count(*) OVER (PARTITION BY d.workspace_id))::int AS n
        FROM due d
    )
    SELECT x.id, s.workspace_id, s.effect_type, x.created_at FROM share s
    CROSS JOIN LATERAL (
        SELECT e.id, e.created_at FROM effects e
        WHERE e.workspace_id = s.workspace_id AND e.effect_type = s.effect_type
          AND e.created_at < s.cutoff AND e.updated_at < s.cutoff
          AND e.state IN ('succeeded', 'failed', 'denied')
          AND e.group_id IS NULL -- these two: effects_ended_ungrouped_idx
          AND e.approval_state IS DISTINCT FROM 'pending'
        ORDER BY e.created_at
        LIMIT s.n
        FOR UPDATE OF e SKIP LOCKED
    ) x
    LIMIT $2::int)
), ` + money.RetiredRunSpendSQL + `, attempts AS (
    DELETE FROM effect_attempts a WHERE a.effect_id = ANY(ARRAY(SELECT id FROM expired))
), approvals AS (
    DELETE FROM approvals a WHERE a.effect_id = ANY(ARRAY(SELECT id FROM expired))
), history AS (
    INSERT INTO gate_effect_history AS h (workspace_id, effect_type, history_from)
    SELECT workspace_id, effect_type, max(created_at) FROM expired
    GROUP BY 1, 2 ORDER BY 1, 2 -- one lock order for concurrent passes
    ON CONFLICT (workspace_id, effect_type) DO UPDATE
    SET history_from = greatest(h.history_from, excluded.history_from)
)
DELETE FROM effects e WHERE e.id = ANY(ARRAY(SELECT id FROM expired))`

// retentionChecks is how effects.retention knows which (workspace, effect
// type) pairs to read (gate_retention_checks, migration 0084): a pair's
// check_at is the earliest time it may next have an ungrouped effect due,
// so a batch reads the pairs due for a check (sqlLockDueChecks), not every
// pair. Why a check_at is never late:
//   - An effect is due once both its created_at and its updated_at are
//     retention_days (1 at least, policy.go) before now; updated_at is
//     never before created_at, so it is due at updated_at + retention_days.
//   - Every change that ends an ungrouped effect, or makes an ended one
//     deletable, sets updated_at to the time of the change: a report
//     (gate_report), a denial (sqlDeny, gate_begin inserting one denied), a
//     resolve (sqlResolve), a reconciliation's (sqlReconcileResolve), a
//     decided approval (sqlDecideApproval) and a moot one closed
//     (closeApprovalsSQL); nothing clears a group_id. So an
//     effect that ends, or leaves its pending approval, after a check at t
//     is due no earlier than t + its type's retention_days, less the time
//     a transaction that began before the check's may take to commit and
//     the instances' clock skew (endsInFlight covers both).
//   - A check that leaves a pair with nothing due (sqlRescheduleChecks)
//     stores the earliest due time among the ended, ungrouped effects it
//     reads, and at most its now + the retention it read - endsInFlight
//     (not now + 1 day whatever the retention: a batch checks up to 1,000
//     pairs, and a daily check of every idle pair outran a pass a minute
//     past 1.44 million pairs, each then read later than its effects were
//     due, review); a pair with
//     effects still due (past its share, or held by another transaction)
//     stays due, behind the pairs waiting longer (check_at = now).
//   - A retention raised only delays what is due; one lowered, or a first
//     policy under the 90-day default, resets check_at to -infinity in
//     the policy write's transaction (sqlMarkGroupsToDate). A batch locks
//     its pairs' rows before it reads the policies (a statement of their
//     own), so a write that lowers a retention while a batch holds the
//     pair waits for it and resets the time the batch stored.
//   - The pairs the table does not know yet (a new workspace or type, a
//     pair forgotten: one left with no ended, ungrouped effect has no row)
//     are found by a loose scan of effects_ended_ungrouped_idx in rounds
//     (sqlDiscoverChecks): a chunk of retentionDiscoveryPairs pairs a run,
//     a round an hour (retentionDiscoveryEvery). A pair gets its row, due
//     at once, by the end of the first round that begins after its first
//     ended effect committed, within an hour and two rounds of it; its
//     effects are due a day after they ended at the earliest, so none is
//     kept past its retention while a round takes under 11 hours (at one
//     run a minute, 3.3 million pairs with ended, ungrouped effects).

// endedUngrouped is an effect that ended outside any group: those
// effects_ended_ungrouped_idx holds (migration 0038).
const endedUngrouped = `e.state IN ('succeeded', 'failed', 'denied') AND e.group_id IS NULL`

// sqlDiscoverChecks gives each pair with an ended, ungrouped effect after
// ($1, $2), up to $3 of them (all when NULL), in order, a row of
// gate_retention_checks due at $4, and answers how many it read and the
// last. It walks effects_ended_ungrouped_idx, one descent a pair, with a
// loose scan. onConflict: a known pair's row is left as it is (DO NOTHING),
// or made due at $4 if it is later (every pass: retentionCheckEveryPass).
func sqlDiscoverChecks(onConflict string) string {
	return `
WITH RECURSIVE pairs AS (
    (SELECT e.workspace_id, e.effect_type FROM effects e
     WHERE (e.workspace_id, e.effect_type) > ($1::text, $2::text) AND ` + endedUngrouped + `
     ORDER BY e.workspace_id, e.effect_type
     LIMIT 1)
    UNION ALL
    SELECT n.workspace_id, n.effect_type FROM pairs p CROSS JOIN LATERAL (
        SELECT e.workspace_id, e.effect_type FROM effects e
        WHERE (e.workspace_id, e.effect_type) > (p.workspace_id, p.effect_type) AND ` + endedUngrouped + `
        ORDER BY e.workspace_id, e.effect_type
        LIMIT 1
    ) n
), chunk AS (
    SELECT * FROM pairs LIMIT $3::int
), known AS (
    INSERT INTO gate_retention_checks AS c (workspace_id, effect_type, check_at)
    SELECT workspace_id, effect_type, $4::timestamptz FROM chunk ORDER BY 1, 2
    ON CONFLICT (workspace_id, effect_type) ` + onConflict + `
)
SELECT count(*)::int, coalesce(max(workspace_id), ''),
    coalesce((SELECT max(effect_type) FROM chunk WHERE workspace_id = (SELECT max(workspace_id) FROM chunk)), '')
FROM chunk`
}

var (
	sqlDiscoverNewChecks = sqlDiscoverChecks(`DO NOTHING`)
	sqlDiscoverAllChecks = sqlDiscoverChecks(`DO UPDATE SET check_at = excluded.check_at
    WHERE c.check_at > excluded.check_at`)
)

// sqlRetentionDiscovery reads, and locks, the state of the pairs'
// discovery (gate_retention_discovery); none when another run holds it. At
// $1 (now): where the round under way is, whether it is to begin again
// (dated after $2: a clock went back) and whether a run is due.
const sqlRetentionDiscovery = `SELECT after_workspace_id, after_effect_type, round_from > $2::timestamptz,
    next_at <= $1::timestamptz
FROM gate_retention_discovery FOR UPDATE SKIP LOCKED`

// sqlRetentionDiscovered records the discovery's state: the last pair read
// ($1, $2; empty once a round is done), the round's start ($3; NULL: the
// round goes on) and the next round's time ($4; NULL: the round is under
// way, and the next run goes on with it).
const sqlRetentionDiscovered = `UPDATE gate_retention_discovery
SET after_workspace_id = $1, after_effect_type = $2, round_from = coalesce($3::timestamptz, round_from),
    next_at = coalesce($4::timestamptz, '-infinity')`

// sqlLockDueChecks locks up to $2 of the pairs due for a check at $1, those
// waiting longest first, and answers them; those another batch holds are
// passed over.
const sqlLockDueChecks = lockDueChecks + `
ORDER BY check_at
LIMIT $2::int
FOR UPDATE SKIP LOCKED`

// sqlLockDueCheck is sqlLockDueChecks for the pair ($2, $3) alone: a batch
// that failed is purged pair by pair (purgeChecksApart).
const sqlLockDueCheck = lockDueChecks + `
  AND workspace_id = $2::text AND effect_type = $3::text
FOR UPDATE SKIP LOCKED`

const lockDueChecks = `SELECT workspace_id, effect_type FROM gate_retention_checks
WHERE check_at <= $1::timestamptz`

// sqlPutOffCheck moves the next check of the pair ($1, $2) on to $3 (never
// back): a pair whose purge failed alone is read again then. A pair
// another pass holds is passed over: that pass purges it, or puts it off,
// and two passes putting off each other's pairs do not wait for each other.
const sqlPutOffCheck = `UPDATE gate_retention_checks c SET check_at = greatest(c.check_at, $3::timestamptz)
FROM (SELECT workspace_id, effect_type FROM gate_retention_checks
      WHERE workspace_id = $1::text AND effect_type = $2::text
      FOR UPDATE SKIP LOCKED) l
WHERE c.workspace_id = l.workspace_id AND c.effect_type = l.effect_type`

// sqlRetentionPlan turns JIT compilation off for the rest of a retention
// batch's transaction, as sqlReconcilePlan does: sqlRescheduleChecks'
// three probes a pair are estimated pessimistically, and a batch of 1,000
// pairs beside a million known ones was planned past jit_above_cost,
// compiling 96 functions (50 ms of its 155, review: 200,000 effects over
// 3,000 pairs), where its probes read a few index pages each.
const sqlRetentionPlan = `SELECT set_config('jit', 'off', true)`

// sqlRescheduleChecks stores, once sqlPurgeExpired has run at $1 in the
// same transaction, the next check of each pair it read ($2, $3): now ($1),
// while effects are still due (past the pair's share, or held by another
// transaction), else the earliest due time among its ended, ungrouped
// effects, at most $4 + the retention it reads ($4: now - endsInFlight;
// those that end later are due no earlier: a retention lowered since makes
// the pair due again, sqlMarkGroupsToDate, and one raised only delays);
// a pair with no ended, ungrouped effect left is forgotten (its row
// deleted) until a discovery finds it again. The earliest due time: those
// created before the cut-off and changed since are due when their change
// is retention_days old (the ones the probe for effects due walks past),
// those created since no earlier than their creation's. The CASE reads the
// minimum only for a pair with nothing due: a backlog is never read whole.
// Each test a subquery with a value, evaluated pair by pair: an EXISTS
// over a batch of pairs was planned as a hash over every ended effect.
const sqlRescheduleChecks = `
WITH p AS (
    SELECT u.workspace_id, u.effect_type, make_interval(days => coalesce(pol.retention_days, 90)) AS keep
    FROM unnest($2::text[], $3::text[]) AS u(workspace_id, effect_type)
    LEFT JOIN gate_policies pol ON pol.workspace_id = u.workspace_id AND pol.effect_type = u.effect_type
), next AS (
    SELECT p.workspace_id, p.effect_type, CASE
        WHEN (SELECT true FROM effects e
              WHERE e.workspace_id = p.workspace_id AND e.effect_type = p.effect_type AND ` + endedUngrouped + `
              LIMIT 1) IS NULL
        THEN NULL
        WHEN (SELECT true FROM effects e
              WHERE e.workspace_id = p.workspace_id AND e.effect_type = p.effect_type AND ` + endedUngrouped + `
                AND e.created_at < $1::timestamptz - p.keep AND e.updated_at < $1::timestamptz - p.keep
                AND e.approval_state IS DISTINCT FROM 'pending'
              LIMIT 1)
        THEN $1::timestamptz
        ELSE least($4::timestamptz + p.keep,
            (SELECT min(e.updated_at) FROM effects e
             WHERE e.workspace_id = p.workspace_id AND e.effect_type = p.effect_type AND ` + endedUngrouped + `
               AND e.created_at < $1::timestamptz - p.keep
               AND e.approval_state IS DISTINCT FROM 'pending') + p.keep,
            (SELECT min(e.created_at) FROM effects e
             WHERE e.workspace_id = p.workspace_id AND e.effect_type = p.effect_type AND ` + endedUngrouped + `
               AND e.created_at >= $1::timestamptz - p.keep
               AND e.approval_state IS DISTINCT FROM 'pending') + p.keep)
        END AS check_at
    FROM p
), forgotten AS (
    DELETE FROM gate_retention_checks c USING next n
    WHERE c.workspace_id = n.workspace_id AND c.effect_type = n.effect_type AND n.check_at IS NULL
)
UPDATE gate_retention_checks c SET check_at = n.check_at FROM next n
WHERE c.workspace_id = n.workspace_id AND c.effect_type = n.effect_type AND n.check_at IS NOT NULL`

package gate

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// BeginLocked runs only begin's locked path, so a test can show its answer
// when the key it was sent to lock is not there (the fast statement lost a
// race with an insert that then rolled back).
func (s *Service) BeginLocked(ctx context.Context, p *auth.Principal, req BeginRequest) (Decision, error) {
	in, err := s.prepare(p, req)
	if err != nil {
		return Decision{}, err
	}
	return s.beginLocked(ctx, in)
}

// AfterSlowGrant runs afterSlowGrant for attempt of effect id, granted by a
// statement sent at sent, as if it were leased for five seconds, so a test
// can show the answer when the lease is gone by then.
func (s *Service) AfterSlowGrant(ctx context.Context, id string, attempt int, sent time.Time) error {
	row := effectRow{ID: id, Attempt: attempt, State: StateLeased, LeaseSeconds: 5}
	return s.afterSlowGrant(ctx, s.pool, &beginInput{now: s.now()}, &row, sent)
}

// surgeHistoryFrom is how gate_surge (0035) reads the type's history_from:
// in the baseline's branch, so only a begin that recomputes it reads it.
const surgeHistoryFrom = `(SELECT h.history_from FROM gate_effect_history h WHERE h.workspace_id = $1 AND h.effect_type = $2)`

// FunctionFragments are the SQL fragments that migrations 0008, 0010, 0013,
// 0020, 0026, 0028, 0035, 0056, 0069 and 0076 copied into the gate's
// functions and that Go statements still splice (or Go code reads as they
// do: arrivalDenials), by the function that must contain each (see
// TestGateFunctionsMatchFragments).
var FunctionFragments = map[string][]string{
	"gate_evaluate": {sqlEffectivePolicy},
	"gate_surge": {thresholdSQL("pol", "$7::timestamptz", "cbs.first_seen", "b.median"),
		baselineSQL("$1", "$2", "$7::timestamptz", "cbs.first_seen", surgeHistoryFrom), arrivalDenialsSQL()},
	"gate_begin": {chargeCTEs("grant_src"), chargesJSON, chargedOn, utcDay("$8"),
		surgeTripSQL("$1", "$2", "ev.surge_action", "$8", "ev.surge_cooldown_seconds", "ev.surge_volume",
			"ev.surge_threshold", "$23")},
	"gate_report": {freedCTE("upa") + "," + releaseCTEs("freed", "true"), sqlLatestUnknownAttempt("$1")},
	"gate_begin_in_turn": {strings.TrimSuffix(lapsedCloseSQL("v_now", "ARRAY[$24]"), "SELECT count(*) FROM up") +
		"SELECT count(*) INTO v_closed FROM up;", "v_now := " + afterAllowanceSQL("v_now", allowanceAfterSQL) + ";"},
}

// PurgeExpired runs the retention pass's purge of ungrouped effects at now
// in tx, every pair with an ended, ungrouped effect checked (as
// CheckRetentionEveryPass has it), so a test can hold one open in a
// transaction of its own; it answers how many effects it deleted.
func PurgeExpired(ctx context.Context, tx pgx.Tx, now time.Time, limit int) (int64, error) {
	if _, err := tx.Exec(ctx, sqlDiscoverAllChecks, "", "", nil, now); err != nil {
		return 0, err
	}
	_, n, err := (&Service{checkEveryPass: true}).purgeDueChecks(ctx, tx, now, limit)
	return int64(n), err
}

// SQLPurgeExpired is the statement retention deletes a batch of effects
// with ($1 now, $2 limit, $3 groups deleted, $4 and $5 the pairs checked),
// for a test of its plan.
var SQLPurgeExpired = sqlPurgeExpired

// SQLPurgeKeptGroups is the statement PurgeKeptGroups deletes the groups
// with ($1 now, $2 groups locked, $3 steps at most), for a test of its plan.
const SQLPurgeKeptGroups = sqlPurgeKeptGroups

// PurgeKeptGroups is the retention pass's group deletion (now, groups read,
// steps deleted at most), so a test can run it in a transaction of its own:
// it locks the groups due and deletes those kept long enough, with their
// effects, and answers those groups and how many effects it deleted.
func PurgeKeptGroups(ctx context.Context, tx pgx.Tx, now time.Time, limit, steps int) ([]string, int, error) {
	due, err := db.CollectIDs(tx.Query(ctx, sqlLockDueGroups, now, limit))
	if err != nil {
		return nil, 0, err
	}
	return purgeKeptGroups(ctx, tx, now, due, steps)
}

// SQLGroupStates is the statement a report's settling of its group
// begins with, so a test can fail it after the report committed.
var SQLGroupStates = sqlGroupStates

// SQLClaimGroupsToDate is the statement a lowered retention's dating of
// kept groups begins with, after the policy's write committed, so a test
// can fail it then.
var SQLClaimGroupsToDate = sqlClaimGroupsToDate

// SQLBeginFast and SQLLengthenLease are begin's one-statement path and the
// statement that measures a slow grant's lease again after it committed.
var (
	SQLBeginFast     = sqlBeginFast
	SQLLengthenLease = sqlLengthenLease
)

// SQLListCircuits is ListCircuits' statement, for a test of its plan.
var SQLListCircuits = sqlListCircuits

// SQLCloseCircuit and SQLCloseSurgeCircuit are an operator's close and a
// policy PUT's turning surge off, for a test of their plans.
var (
	SQLCloseCircuit      = sqlCloseCircuit
	SQLCloseSurgeCircuit = sqlCloseSurgeCircuit
)

// SQLPruneSpend is SweepSpend's statement, for a test of its plan.
const SQLPruneSpend = sqlPruneSpend

// SQLReconcileDue is SweepReconcileDue's statement ($1 now, $2 limit, $3
// EventIDsAt(now, limit)), for a test of its plan and one of two sweeps
// overlapping.
var SQLReconcileDue = sqlReconcileDue

// EventIDsAt answers n event ids made at now, as a sweep records events.
func EventIDsAt(now time.Time, n int) []string { return eventIDsAt(now, n) }

// SQLReconcileEffects is the statement a reconciliation reads its effects
// with, for a test of how it is sent.
const SQLReconcileEffects = sqlReconcileEffects

// ListEffectsSQL is the statement and arguments ListEffects reads a page
// with, for a test of its plan.
func ListEffectsSQL(workspaceID, cursor string, limit int, state, effectType string, now time.Time) (string, []any) {
	return listEffectsQuery(workspaceID, ListFilter{State: state, EffectType: effectType, Cursor: cursor, Limit: limit}, now)
}

// ReconciliationSize is the size Reconcile reckons for r's answer (its
// counts set from its lists) and r as the API writes it.
func ReconciliationSize(r Reconciliation) (reckoned int, written []byte, err error) {
	r.count()
	written, err = jsonx.Marshal(r)
	return r.size(), written, err
}

// MaxNoteRunes is the longest resolve note, in characters.
const MaxNoteRunes = maxNoteRunes

// SetMaxGroupSteps makes s's groups take at most n forward steps, so a
// test can fill one.
func SetMaxGroupSteps(s *Service, n int) { s.maxGroupSteps = n }

// SetMaxWalletMoves makes one Begin of s make at most n begins when its
// wallet moves (maxWalletMoves), so a test can use the bound up.
func SetMaxWalletMoves(s *Service, n int) { s.walletMoves = n }

// SetDatingBatches makes s's policy writes date the groups a lowered
// retention shortens in batches of batch groups, batches at most.
func SetDatingBatches(s *Service, batch, batches int) {
	s.datingBatch, s.datingBatches = batch, batches
}

// EndsInFlight is how long after a policy write lowering a retention its
// dating's final pass is due (endsInFlight).
const EndsInFlight = endsInFlight

// SQLLapseDue and SQLUnwindingDue are the sweeper's picks of lapsed leases
// and of unwinding groups, for a test of their plans.
var (
	SQLLapseDue     = sqlLapseDue
	SQLUnwindingDue = sqlUnwindingDue
)

// SQLListApprovals is GET /approvals's statement before db.NewestFirst
// pages it.
const SQLListApprovals = sqlListApprovals

// Logger is the logger the service writes with.
func (s *Service) Logger() *slog.Logger { return s.logger }

// SQLSweepMootApprovals is the statement SweepMootApprovals runs, for a
// test of its plan.
var SQLSweepMootApprovals = sqlSweepMootApprovals

// MootNote is the note of an approval a resolution, or the sweeper, closed.
const MootNote = mootNote

// RolledBackNote is the note of an approval a group's rollback, or the
// sweeper, closed.
const RolledBackNote = rolledBackNote

// AfterStep runs afterStep: what follows a step's commit.
func (s *Service) AfterStep(ctx context.Context, workspaceID string, groupID *string) error {
	return s.afterStep(ctx, workspaceID, groupID)
}

// CheckRetentionAsDeployed puts s's retention passes back as a deployment
// runs them, whose clock is not injected: a pair is read once it may have
// an effect due, the pairs gate_retention_checks does not know found in
// rounds of chunks of pairs pairs (undoing CheckRetentionEveryPass).
func (s *Service) CheckRetentionAsDeployed(pairs int) {
	s.checkEveryPass, s.discoveryPairs = false, pairs
}

// PurgeDueChecks runs a deployed retention batch's purge of ungrouped
// effects at now in tx (the pairs due for a check, up to limit, and their
// next checks), and answers how many effects it deleted.
func PurgeDueChecks(ctx context.Context, tx pgx.Tx, now time.Time, limit int) (int, error) {
	_, n, err := (&Service{}).purgeDueChecks(ctx, tx, now, limit)
	return n, err
}

// RetentionDiscoveryEvery is how often a deployed pass begins a round of
// discovery of the pairs gate_retention_checks does not know.
const RetentionDiscoveryEvery = retentionDiscoveryEvery

// SQLPutOffGroup is sqlPutOffGroup.
const SQLPutOffGroup = sqlPutOffGroup

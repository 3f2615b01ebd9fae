package gate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
)

// A surge counts keys begun for the first time (API.md §5, which
// volume_last_hour still reports), and a key a breaker refused had been
// begun: once the breaker closed, every such key of a runaway loop's
// backlog executed when retried, and nothing tripped again (session 21's
// circuits QA: 80 keys at surge_per_hour 10 and deny gave 10 execute and 70
// circuit_open, then the 70 all executed after the close). Seed 003:
// closing "gives the effect type a fresh allowance; it does not disarm the
// breaker, so a second surge trips it again". So a key refused before it
// was ever granted is counted once more when it is next begun, as an
// arrival within the fresh allowance (migration 0040): it takes the type's
// surge turn, is counted with the new keys, trips the breaker over the
// threshold and is held by its action, as the new key that trips it is.

// refusedBeforeGrant says whether a breaker, or a refusal of the evaluation
// that comes before the breaker's (arrivalDenials), refused the effect
// before any attempt was granted: its next begin is the surge's arrival. A
// refusal of a later attempt (a retry after a failure) is not: the key was
// admitted.
func (r *effectRow) refusedBeforeGrant() bool {
	return r.State == StateDenied && r.DenialCode != nil && slices.Contains(arrivalDenials, *r.DenialCode) &&
		r.Attempt == 0
}

// arrivalDenials are the denials of a key that make its next begin an
// arrival (migration 0076, gate_surge, holds them as arrivalDenialsSQL
// writes them): the breaker's, and the evaluation's two that come before
// it (gate_evaluate), so that a key over the threshold refused by them is
// refused by neither the breaker nor its count: once a policy lets such a
// backlog through (mode allow again, a higher max_cost_micros) after the
// breaker cooled down, it ran in full, counted by no begin (surge QA: 30
// of 30 executed against an allowance of 10). A ceiling refused at the
// grant is not among them: the surge admitted that key within its
// allowance before the ceiling refused it.
var arrivalDenials = []string{apierr.CodeCircuitOpen, apierr.CodePolicyDenied, apierr.CodeCostCeilingExceeded}

// arrivalDenialsSQL is arrivalDenials as gate_surge lists them.
func arrivalDenialsSQL() string {
	quoted := make([]string, len(arrivalDenials))
	for i, code := range arrivalDenials {
		quoted[i] = "'" + code + "'"
	}
	return "e.denial_code IN (" + strings.Join(quoted, ", ") + ")"
}

// takeArrivalTurn takes the type's surge turn for a begin whose key read as
// an arrival before its row lock (in.arrival): the turn comes before the
// row, the order of a new key's begin (gate_begin_in_turn takes it, then
// inserts) and of the policy PUT that holds it while it charges grants. It
// records a breaker whose cooldown ended closed first, as
// gate_begin_in_turn does, so that a trip after it is announced after its
// close, and moves the begin's clock reading to after the start of the
// allowance it is counted in (afterAllowanceSQL), in the same statement
// (sqlCloseLapsedForArrival): recorded at or before it, the arrival was
// counted by no later begin. taken says whether the turn is held.
//
// It is taken whether or not the policy configures a surge, though with
// none only the moved clock reading is needed: arrive records the arrival
// at it all the same, for a policy turning surge on later to count. No PUT
// changes the policy before arrive evaluates it: the begin holds the
// type's policy turn shared from before this until it commits
// (sharePolicy, first in beginLocked and beginInTxOnce), as the PUT holds
// it alone. Under a policy with no surge sqlEvaluateArrival answers no
// count, so nothing is tripped, and no breaker of the type is lapsed (only
// a trip sets a cooldown, and a PUT turning surge off closes the surge's
// breaker); a begin of a new key moves its reading outside the turn then
// (migration 0070). The turn is kept because the transaction reads the
// policy only with the key's row (sqlBeginLocked), and the turn cannot be
// taken after the row (arrive): taking it only for a surge would cost
// every arrival a policy read of its own, to spare a lock that, with no
// surge, only closes and other arrivals take.
func (s *Service) takeArrivalTurn(ctx context.Context, tx pgx.Tx, in *beginInput) (taken bool, err error) {
	if !in.arrival {
		return false, nil
	}
	if _, err := tx.Exec(ctx, sqlLockSurgeTurn, in.ws, in.effectType); err != nil {
		return false, fmt.Errorf("begin: surge turn: %w", err)
	}
	s.lockedAt(in)
	var now time.Time
	if err := tx.QueryRow(ctx, sqlCloseLapsedForArrival, in.ws, in.effectType, in.now,
		[]string{in.risk.closeEventID}).Scan(&now); err != nil {
		return false, fmt.Errorf("begin: close lapsed breaker: %w", err)
	}
	in.now = now.UTC()
	return true, nil
}

// arrive evaluates a locked key a breaker refused before it was ever
// granted as the surge's arrival: ev becomes that evaluation, whose fresh
// verdict holds the key when the surge is over its threshold. The arrival
// is recorded whatever the decision, and a trip opens (or raises) the
// breaker. A key that turned into an arrival after it was read (turn not
// taken) is begun again: taking the turn now, after the row, could
// deadlock with a begin that holds the turn and waits for the row.
func (s *Service) arrive(ctx context.Context, tx pgx.Tx, in *beginInput, turn bool, ev *eval, row *effectRow) error {
	var (
		action    string
		cooldown  int
		trips     *bool
		volume    *int64
		threshold *int64
		next      eval
	)
	if err := tx.QueryRow(ctx, sqlEvaluateArrival, in.ws, in.effectType, in.key, in.cost, in.dimNames, in.lease,
		in.now).Scan(
		&next.onIndeterminate, &next.maxAttempts, &next.maxCost, &next.approvalAbove, &next.precheck,
		&next.missingDimensions, &next.fresh, &next.approvalReason, &next.lease, &action, &cooldown, &trips,
		&volume, &threshold); err != nil {
		return fmt.Errorf("begin: evaluate arrival: %w", err)
	}
	if volume == nil {
		// No surge counted: none configured, or a breaker at least as
		// strict holds the type. The arrival is recorded all the same, as
		// a new key's begin is (by its creation) whatever the policy says:
		// a policy turning surge on counts the keys begun since the last
		// close, and a refused backlog begun again under none was counted
		// by no begin after it (the next new key under surge_per_hour 5
		// executed after five arrivals, and was refused after five new
		// keys). A key that turned into an arrival after it was read is
		// not: its clock was not moved after the allowance's start.
		if !turn {
			return nil
		}
		return recordArrival(ctx, tx, in, row)
	}
	if !turn {
		return retryRequest()
	}
	*ev = next
	if err := recordArrival(ctx, tx, in, row); err != nil {
		return err
	}
	if trips != nil && *trips {
		if _, err := tx.Exec(ctx, sqlTripSurge, in.ws, in.effectType, action, in.now, cooldown, *volume, *threshold,
			in.risk.tripEventID); err != nil {
			return fmt.Errorf("begin: trip surge breaker: %w", err)
		}
	}
	return nil
}

// recordArrival records the arrival of row's key at the begin's clock
// reading, moved after its allowance's start in the surge turn: gate_surge
// counts it from then.
func recordArrival(ctx context.Context, tx pgx.Tx, in *beginInput, row *effectRow) error {
	if _, err := tx.Exec(ctx, sqlRecordArrival, row.ID, in.now); err != nil {
		return fmt.Errorf("begin: record arrival: %w", err)
	}
	return nil
}

package gate

import (
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/ids"
)

// Daily ceilings (API.md §5): the effect type's daily_budget_micros, the
// calling key's daily_spend_ceiling_micros and the policy's
// dimension_limits are charged by the statement that grants execute and
// released by the one that records the attempt failed. See chargeCTEs.

// sqlStateRefused is gate_refuse's SQLSTATE (migrations/0005_risk.sql).
const sqlStateRefused = "RTB01"

// riskInput is what begin's statements need of the risk controls.
type riskInput struct {
	keyCeiling   *int64
	tripEventID  string
	closeEventID string // a lapsed surge breaker's circuit.closed (lapsedCloseSQL)
	// refused is set after a grant did not fit a ceiling: the next
	// evaluation records this denial instead of granting.
	refused *apierr.Error
}

func newRiskInput(p *auth.Principal, now time.Time) riskInput {
	return riskInput{keyCeiling: p.DailySpendCeilingMicros, tripEventID: ids.NewAt(ids.Event, now),
		closeEventID: ids.NewAt(ids.Event, now)}
}

// riskArgs is how many parameters appendArgs adds.
const riskArgs = 4

// appendArgs appends begin's parameters $21-$24 to args.
func (r *riskInput) appendArgs(args []any) []any {
	var code *string
	if r.refused != nil {
		code = &r.refused.Code
	}
	return append(args, r.keyCeiling, code, r.tripEventID, r.closeEventID)
}

// refusedCeiling reports whether err is gate_refuse's, and which ceiling
// ("type", "key" or "dim:<dimension>") did not fit.
func refusedCeiling(err error) (string, bool) {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == sqlStateRefused {
		return pg.Detail, true
	}
	return "", false
}

// nextUTCMidnight is when the daily window containing now rolls.
func nextUTCMidnight(now time.Time) time.Time {
	y, m, d := now.UTC().Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
}

// refuse records which ceiling refused the grant, as the denial to answer.
func (r *riskInput) refuse(label string, now time.Time) {
	resets := nextUTCMidnight(now)
	switch {
	case label == "key":
		r.refused = apierr.Of(apierr.CodeKeyBudgetExceeded,
			"The calling key's daily spend ceiling would be exceeded.").WithDetail("resets_at", resets)
	case strings.HasPrefix(label, "dim:"):
		r.refused = apierr.Of(apierr.CodeDimensionLimitExceeded,
			"A per-counterparty daily ceiling would be exceeded.").
			WithDetail("dimension", strings.TrimPrefix(label, "dim:")).WithDetail("resets_at", resets)
	default:
		r.refused = apierr.Of(apierr.CodeBudgetExceeded,
			"The effect type's daily budget would be exceeded.").WithDetail("resets_at", resets)
	}
}

// denial is the error of a denied begin: the ceiling's when one refused it.
func (r *riskInput) denial(code string, ev *eval, row *effectRow) *apierr.Error {
	if r.refused != nil && r.refused.Code == code {
		return r.refused
	}
	return denial(code, ev, row)
}

// Package money bounds amounts of money: integer micros of USD (API.md §0).
package money

// MaxMicros is the largest amount the API takes, 10^18 micros ($1 trillion).
// Ceilings add a grant's cost to a day's counter before comparing, and two
// amounts within this bound always sum within int64, so no counter
// overflows into an internal error instead of answering the ceiling.
const MaxMicros int64 = 1_000_000_000_000_000_000

// Valid reports whether v is an amount the API takes: 0 to MaxMicros.
func Valid(v int64) bool { return v >= 0 && v <= MaxMicros }

// Rule is the validation message for an amount field.
const Rule = "must be an integer from 0 to 10^18 (micros of USD)"

// RunSpendSQL is the SQL of what a run's wallet has spent (bigint): the
// declared costs of the run's effects that were granted and are not known
// to have failed (leased, succeeded or indeterminate; a failed attempt
// gives its cost back, as it does to the daily ceilings). ws and run are
// SQL expressions for the workspace and the run id; except, when not
// empty, one for an idempotency key whose effect is left out. A run's
// granted spend never exceeds its budget (at most MaxMicros: every grant is
// checked against it), so the sum fits.
func RunSpendSQL(ws, run, except string) string {
	cond := ""
	if except != "" {
		cond = " AND x.idempotency_key <> " + except
	}
	return `(SELECT coalesce(sum(x.cost_micros), 0)::bigint FROM effects x
    WHERE x.run_id = ` + run + ` AND x.workspace_id = ` + ws + cond + `
      AND x.state IN ('leased', 'succeeded', 'indeterminate'))`
}

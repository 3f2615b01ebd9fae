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
// declared cost of every attempt of the run's effects that was granted and
// is not known to have failed (live, succeeded or indeterminate; a failed
// attempt gives its cost back, as it does to the daily ceilings). An
// attempt whose outcome is unknown keeps counting when its effect is tried
// again, as it does on the daily ceilings: each may have spent the money
// (QA: counting each effect once let a run spend max_attempts times its
// wallet under on_indeterminate: retry). Effects retention deleted keep
// counting through the run's run_retired_spend rows (RetiredRunSpendSQL). ws
// and run are SQL expressions for the workspace and the run id. A run's
// granted spend never exceeds its budget (at most MaxMicros: every grant is
// checked against it), so the sum fits. A compensating effect is the
// run's undo, not its spend (walletEffect).
func RunSpendSQL(ws, run string) string {
	return `((SELECT coalesce(sum(x.cost_micros), 0)
      FROM effects x JOIN effect_attempts a ON a.effect_id = x.id
      WHERE x.run_id = ` + run + ` AND x.workspace_id = ` + ws + ` AND ` + walletEffect + ` AND ` + spendingAttempt + `)
    + coalesce((SELECT sum(r.micros) FROM run_retired_spend r WHERE r.run_id = ` + run + `), 0))::bigint`
}

// spendingAttempt is true of an attempt (alias a) a wallet counts: granted,
// not known to have failed, and not a probe. A probe is granted only after
// an attempt whose outcome is unknown, which keeps counting until it is
// known to have failed (a probe reported failed, or a resolution, settles
// it so, and the probe with it); of the two at most one acted, so the
// probe adds nothing, as it adds nothing to a daily counter the earlier
// attempt charged the same day (lib/gate, sqlGrant). A wallet has no days.
const spendingAttempt = `a.outcome IS DISTINCT FROM 'failed' AND NOT a.probe`

// walletEffect is true of an effect (alias x) a run's wallet pays for: any
// but a compensating one. A rollback's refund counted as the run's spend,
// and refused when the wallet had no room left for it, left the group
// unwinding for good (QA): the undo of what the wallet paid for must never
// wait on it. Each compensation still counts on its type's daily ceilings.
const walletEffect = `x.compensates_effect_id IS NULL`

// RetiredRunSpendSQL is two CTEs of the effects purge (lib/gate,
// sqlPurgeExpired): they record, for each run with a wallet, what
// RunSpendSQL counted of the effects about to be deleted, whose ids the CTE
// named expired holds (migration 0030), so that a run's wallet lasts its
// whole life, however long its effects are kept. The runs are held FOR KEY
// SHARE first: one that run retention deletes meanwhile is skipped (its
// wallet goes with it) rather than failing the insert's foreign key, and
// with it the whole pass (review). The effects are read in the statement's
// snapshot, before its deletes; they are ended, so their attempts'
// outcomes no longer move. The batch's effects, then their runs, are read
// by their ids as = ANY(ARRAY(…)), through the primary keys: as id IN (…)
// over the effects joined to the batch, with no run's budget set (wallets
// are rare), a plan made for the batch's values hashed the batch against a
// scan of every effect with a run, then of every run, for each batch
// (scale QA).
var RetiredRunSpendSQL = `retired_runs AS (
    SELECT r.id FROM job_runs r
    WHERE r.id = ANY(ARRAY(SELECT x.run_id FROM effects x
                           WHERE x.id = ANY(ARRAY(SELECT id FROM expired)) AND x.run_id IS NOT NULL))
      AND r.budget_micros IS NOT NULL
    FOR KEY SHARE
), retired AS (
    INSERT INTO run_retired_spend (run_id, micros)
    SELECT x.run_id, sum(x.cost_micros)
    FROM expired d JOIN effects x ON x.id = d.id JOIN effect_attempts a ON a.effect_id = x.id
    JOIN retired_runs r ON r.id = x.run_id
    WHERE ` + walletEffect + ` AND ` + spendingAttempt + `
    GROUP BY x.run_id
    HAVING sum(x.cost_micros) > 0
)`

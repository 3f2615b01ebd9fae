package db

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DeadlockRetries is how many times RetryDeadlocks runs work again after
// Postgres chose it as a deadlock's victim.
const DeadlockRetries = 3

// RetryDeadlocks runs work, and runs it again, up to DeadlockRetries times,
// while it fails as a deadlock's victim (40P01). Postgres rolls the victim's
// transaction back whole (or, in a request's transaction, the savepoint db.Tx
// ran it in), so the retry starts from nothing applied, and the transactions
// it waited for have gone on. work must be safe to run again: it may only
// assign what it answers, never accumulate across runs.
//
// Why it is needed even where locks are taken in one order: a statement that
// locks a row in one CTE (… ORDER BY id FOR NO KEY UPDATE, which waits for
// and locks the row's newest version) and updates it in another reads the
// row with the snapshot taken when the statement began; when the row was
// updated in between and a foreign-key check still holds KEY SHARE on the
// older version, the update waits for that version's tuple lock, which a
// transaction waiting for this one can hold (concurrency QA: claims, reports
// and the sweeper, over endpoints with a concurrency limit, answered 500
// now and then). Claims and reports now lock those rows in a statement of
// their own first (migration 0047, lib/jobs sqlReportLock, which chooses
// them after its gate locks: migration 0049); the retry stays
// for the statements that still lock and update in one (the sweeper's, a
// cancel's) and for any cycle not found yet.
func RetryDeadlocks(ctx context.Context, work func() error) error {
	for attempt := 0; ; attempt++ {
		err := work()
		if err == nil || attempt == DeadlockRetries || !HasCode(err, CodeDeadlockDetected) {
			return err
		}
		// The survivors hold their locks until they commit: a short,
		// jittered pause keeps the retries from meeting them again at once.
		pause := time.Duration(attempt+1) * (5*time.Millisecond + rand.N(20*time.Millisecond))
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// TxRetryingDeadlocks is Tx under RetryDeadlocks: fn runs in a new
// transaction each time.
func TxRetryingDeadlocks(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return RetryDeadlocks(ctx, func() error { return Tx(ctx, pool, fn) })
}

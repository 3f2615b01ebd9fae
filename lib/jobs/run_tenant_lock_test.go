package jobs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
)

// A finish sent by another workspace with a run's id answers 404 without
// taking or waiting for that run's key: it used to lock the run by id
// before checking whose it was, so a tenant who knew (or guessed) the id
// waited behind the run's transactions and, inside a transaction of its
// own (an Idempotency-Key request), made the run's finish and every report
// ending one of its steps wait behind it. Here a transaction holds the
// run's key shared, as a report of its step does; the other workspace's
// finish answers at once, the owner's own finish waits for it.
func TestAFinishOfAnotherWorkspacesRunTakesNoLockOfIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	other := b.env.Signup()

	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(hashtextextended($1::text, 0))`, runID)
	require.NoError(t, err)
	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, tx))

	done := make(chan struct{})
	var finishErr error
	go func() {
		defer close(done)
		_, finishErr = b.svc.FinishRun(ctx, other.ID, runID)
	}()
	require.False(t, waits.Wait(done, "the other workspace's finish answers or waits for the run's key"),
		"the other workspace's finish waited for the run's key")
	require.Equal(t, apierr.CodeNotFound, code(t, finishErr))

	own := make(chan struct{})
	var ownErr error
	go func() {
		defer close(own)
		_, ownErr = b.svc.FinishRun(ctx, b.ws, runID)
	}()
	waits.Waiting(own, "the owner's finish waits for the run's key")
	require.NoError(t, tx.Commit(ctx))
	<-own
	require.NoError(t, ownErr)
}

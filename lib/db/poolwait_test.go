package db_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/testpg"
)

// A statement that waits for a pooled connection waits DB_ACQUIRE_TIMEOUT
// at most, not the whole of its caller's time, and its failure says that
// nothing was sent (pool QA: four requests waiting on one locked row held
// a Lambda-sized pool of 4, and every other request on the instance, a
// health check aside, waited out its 15 s deadline and was answered
// "may have been applied" though it never reached the database).
func TestWaitingForAPooledConnectionIsBoundedAndUnapplied(t *testing.T) {
	t.Parallel()
	pool, err := db.Open(context.Background(), &config.Config{DatabaseURL: apitest.DatabaseURL(t), DBMaxConns: 1,
		DBMaxConnIdleTime: time.Minute, DBConnectTimeout: 5 * time.Second, DBQueryExecMode: "exec",
		DBAcquireTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer pool.Close()

	held, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer held.Release()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pool.Exec(ctx, `SELECT 1`)
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "the wait ended at its own bound, not at the caller's deadline")
	require.True(t, db.IsPoolWait(err), "%v", err)
	require.True(t, db.IsPoolBusy(err), "%v", err)
	require.True(t, db.Unapplied(err), "nothing was sent: %v", err)
	require.True(t, db.IsUnavailable(err), "%v", err)
	require.ErrorIs(t, err, context.DeadlineExceeded, "still a timeout to callers that ask")

	// The caller's own end is told apart from the bound's: a caller that
	// went away is still a cancellation.
	gone, leave := context.WithCancel(context.Background())
	leave()
	_, err = pool.Exec(gone, `SELECT 1`)
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, db.Unapplied(err), "nothing was sent either: %v", err)

	// A statement that was sent and then ran out of time is not one that
	// waited for a connection.
	held.Release()
	short, stop := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer stop()
	_, err = pool.Exec(short, `SELECT pg_sleep(5)`)
	require.Error(t, err)
	require.False(t, db.IsPoolWait(err), "%v", err)
	require.False(t, errors.Is(err, context.Canceled))

	// The pool serves again once a connection is free (the ended
	// statement's closes first, sending its cancel request).
	require.Eventually(t, func() bool {
		return pool.QueryRow(context.Background(), `SELECT 1`).Scan(new(int)) == nil
	}, 10*time.Second, 50*time.Millisecond)
}

// A statement whose caller's time ends while its connection is still being
// opened sent nothing either (it read as "may have been applied"), and is
// not said to have found the pool busy.
func TestTimeEndingWhileConnectingIsUnapplied(t *testing.T) {
	t.Parallel()
	silent := testpg.SilentURL(t) // accepts, never answers
	pool, err := db.Open(context.Background(), &config.Config{
		DatabaseURL: silent, DBMaxConns: 2,
		DBMaxConnIdleTime: time.Minute, DBConnectTimeout: time.Minute, DBQueryExecMode: "exec",
		DBAcquireTimeout: time.Hour})
	require.NoError(t, err)
	defer pool.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = pool.Exec(ctx, `SELECT 1`)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, db.IsPoolWait(err), "%v", err)
	require.False(t, db.IsPoolBusy(err), "%v", err)
	require.True(t, db.Unapplied(err), "nothing was sent: %v", err)
}

package apitest

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/testpg"
)

// LockWaits takes a request's wait for its own: with one request already
// waiting for the holder, a second still on its way to the lock is not
// seen waiting (any waiter was enough before, and a test let the second
// go early); once it waits, its backend is another one.
func TestLockWaitsNamesEachRequestsOwnWait(t *testing.T) {
	ctx := context.Background()
	cluster, err := testpg.Provision(ctx, testpg.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Close() })
	pool, err := pgxpool.New(ctx, cluster.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	key := rand.Int64()
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, key)
	require.NoError(t, err)
	w := NewLockWaits(t, pool, BackendPID(t, holder))

	// request sends one that waits for the key once start is closed.
	request := func(start <-chan struct{}) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			<-start
			if _, err := pool.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, key); err != nil {
				t.Error(err)
			}
		}()
		return done
	}
	now := make(chan struct{})
	close(now)
	first := request(now)
	w.Waiting(first, "the first request waits")

	onItsWay := make(chan struct{})
	second := request(onItsWay)
	require.NotEmpty(t, w.waiting(), "a backend waits for the holder: the first request's")
	require.Zero(t, w.newWaiter(), "the first request's wait is not the second's")
	close(onItsWay)
	w.Waiting(second, "the second request waits")
	require.NotEqual(t, w.sent[0].backend, w.sent[1].backend)

	require.NoError(t, holder.Rollback(ctx))
	<-first
	<-second
}

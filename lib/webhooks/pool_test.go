package webhooks_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
)

// A delivery pass leaves the instance's requests room in its pool (soak:
// a backlog of failing deliveries took every connection of the local
// server's pool each 5 s pass, up to 100 outcomes recorded at once, each
// on a connection of its own, and the API's requests queued behind them).
// With the serverless pool of 4 (DB_MAX_CONNS's default), the pass holds
// no connection while its sends wait on their receiver, and at most
// half the pool, leaving two (db.ShareSize; here 2) while it records their outcomes: with those
// records stuck on a lock, a request's acquire still gets a connection,
// and gets it while they are stuck, not once they have given up (each
// record has 5 s: one that ran out is an outcome lost and sent again). The
// sends are answered one at a time until the records stuck fill the
// share, each then recorded alone (the pass records the outcomes of sends
// that end together in one statement), and the rest together.
func TestADeliveryPassLeavesRequestsRoomInThePool(t *testing.T) {
	const maxConns, share, sends = 4, 2, 8 // share: db.ShareSize(maxConns)
	env, clk := start(t, true, apitest.WithConfig(func(c *config.Config) { c.DBMaxConns = maxConns }))
	ctx := context.Background()
	pool := env.App.Pool
	require.EqualValues(t, maxConns, pool.Config().MaxConns)
	srv, hits, answerOne, answerAll := newTurnReceiver(t, http.StatusInternalServerError)
	hook, done := sendsInFlight(t, env, clk, srv.URL, hits, sends)

	// The sends wait on their receiver: the pass holds none of the pool.
	acquireAll(t, pool, maxConns)

	// Their outcomes' records wait on a lock of the test's own, on a
	// connection of its own (outside the pool).
	blocker, err := pgx.Connect(ctx, apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var locked int
	require.NoError(t, tx.QueryRow(ctx, `WITH l AS (SELECT id FROM webhook_deliveries WHERE webhook_id = $1 FOR UPDATE)
		SELECT count(*) FROM l`, hook).Scan(&locked))
	require.Equal(t, sends, locked)
	var blockerPID int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&blockerPID))
	watcher, err := pgx.Connect(ctx, apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer watcher.Close(ctx)
	blocked := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) int {
		var n int
		require.NoError(t, q.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE $1::int = ANY (pg_blocking_pids(pid))`, blockerPID).Scan(&n))
		return n
	}
	for k := 1; k <= share; k++ {
		answerOne()
		require.Eventually(t, func() bool { return blocked(watcher) >= k }, 30*time.Second, 10*time.Millisecond,
			"the records reach the lock")
	}
	answerAll()

	// A request's connection, while every one of the pass's records is
	// stuck or waiting for its share (a generous bound on failure only).
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pool.Acquire(actx)
	require.NoError(t, err, "no connection of the pool was left to requests")
	defer conn.Release() // a second Release does nothing
	require.Equal(t, share, blocked(conn), "the pass's records still stuck as the request got its connection, its "+
		"share of the pool and no more (none: the request waited for them to give up)")
	conn.Release()
	require.NoError(t, tx.Rollback(ctx))

	require.NoError(t, <-done, "every outcome is recorded: the acquire did not wait for the records to give up")
	var recorded int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries
		WHERE webhook_id = $1 AND state = 'pending' AND attempts = 1 AND last_status_code = 500`, hook).Scan(&recorded))
	require.Equal(t, sends, recorded)
}

// newTurnReceiver answers each request with status, one request each time
// answerOne is called, or all of them from answerAll on (or once the test
// ends); hits counts them.
func newTurnReceiver(t *testing.T, status int) (srv *httptest.Server, hits *atomic.Int32, answerOne, answerAll func()) {
	turns, all := make(chan struct{}, 1000), make(chan struct{})
	var once sync.Once
	answerAll = func() { once.Do(func() { close(all) }) }
	hits = new(atomic.Int32)
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		select {
		case <-turns:
		case <-all:
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(answerAll) // runs first: the handlers return before the server closes
	return srv, hits, func() { turns <- struct{}{} }, answerAll
}

// acquireAll acquires n connections of pool at once, and releases them.
func acquireAll(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound on failure only
	defer cancel()
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err, "the pass holds a connection while its sends wait on their receiver")
		held = append(held, c)
	}
}

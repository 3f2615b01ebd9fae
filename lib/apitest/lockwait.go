package apitest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// WaitForLock waits until a statement of this database whose text matches
// like (a LIKE pattern) waits for a lock whose wait_event matches event (a
// LIKE pattern too: "%" for any, "advisory" for an advisory lock): the
// other side of a race a test stages by hand has reached it. Ten seconds
// at most, a hang guard only.
func WaitForLock(t testing.TB, pool *pgxpool.Pool, like, event, why string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event LIKE $2
			  AND query LIKE $1)`, like, event).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, why)
}

// BackendPID is the server process id of tx's connection, for
// WaitDoneOrBlockedBy.
func BackendPID(t testing.TB, tx pgx.Tx) int {
	t.Helper()
	var pid int
	require.NoError(t, tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid))
	return pid
}

// WaitDoneOrBlockedBy waits until done is closed (a request answered) or a
// statement waits for a lock that the backend pid holds (the request met
// the rows of a transaction a test holds open: pg_blocking_pids), so that
// a test can end that transaction knowing the request either answered
// before it or waits for it. Ten seconds at most, a hang guard only.
func WaitDoneOrBlockedBy(t testing.TB, pool *pgxpool.Pool, pid int, done <-chan struct{}, why string) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		var waiting bool
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND $1::int = ANY (pg_blocking_pids(pid)))`, pid).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, why)
}

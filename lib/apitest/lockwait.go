package apitest

import (
	"context"
	"testing"
	"time"

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

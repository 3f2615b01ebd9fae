package auth_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
)

// Pruning ended rate-limit windows is bounded per pass, like every sweep
// task: a backlog is taken a batch at a time, oldest windows and all, and
// a window not yet ended stays (scale QA: one statement deleting a day's
// backlog outlived the task's time and was rolled back on every pass).
func TestPruneCountersIsBoundedPerPass(t *testing.T) {
	env := apitest.Start(t)
	ctx := context.Background()
	pool := env.App.Pool
	now := time.Now().UTC().Truncate(time.Minute)
	_, err := pool.Exec(ctx, `INSERT INTO rate_counters (bucket, window_start, shard, count)
		SELECT 'prune-test', $1::timestamptz - m * interval '1 minute', 0, 1 FROM generate_series(0, 5) m`, now)
	require.NoError(t, err)
	left := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM rate_counters WHERE bucket = 'prune-test'`).Scan(&n))
		return n
	}
	cutoff := now.Add(-time.Second) // every window but the current one ended
	n, err := auth.PruneCounters(ctx, pool, cutoff, 3)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	require.Equal(t, 3, left())
	n, err = auth.PruneCounters(ctx, pool, cutoff, 3)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the rest of the backlog")
	require.Equal(t, 1, left(), "the current window stays")
}

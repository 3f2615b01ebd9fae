package auth_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/testpg"
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

// The prune finds the windows due by their start (rate_counters_window_idx,
// migration 0053) and deletes them by the addresses it locked, so a pass
// reads the windows it deletes, not the table: it scanned the whole table
// to find them and read it again to join what it found (scale QA: 1.25M
// rows, 40k due, 1.15 s; none due, 0.15 s on every pass). On a seeded
// table, the plan reads rate_counters only through that index and the
// locked addresses.
func TestPruneCountersReadsOnlyTheWindowsDue(t *testing.T) {
	env := apitest.Start(t)
	ctx := context.Background()
	pool := env.App.Pool
	// 20,000 windows of 100 buckets, far ahead of every other test's.
	from := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
	_, err := pool.Exec(ctx, `INSERT INTO rate_counters (bucket, window_start, shard, count)
		SELECT 'plan-test-' || b, $1::timestamptz + m * interval '1 minute', 0, 1
		FROM generate_series(0, 199) m, generate_series(1, 100) b`, from)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DELETE FROM rate_counters WHERE bucket LIKE 'plan-test-%'`)
		require.NoError(t, err)
	})
	_, err = pool.Exec(ctx, `ANALYZE rate_counters`)
	require.NoError(t, err)

	nodes, err := testpg.Explain(ctx, pool, auth.SQLPruneCounters, from.Add(5*time.Minute), 50_000)
	require.NoError(t, err)
	// What reads rate_counters: the index (a plain or a bitmap scan of it),
	// and the locked addresses; never the table whole, nor its primary key
	// for a join.
	reads := testpg.Reads(nodes, "rate_counters")
	require.Contains(t, reads, "Tid Scan <nil>", "deleted by the addresses it locked")
	require.Subset(t, []string{"Index Scan rate_counters_window_idx", "Bitmap Heap Scan <nil>",
		"Bitmap Index Scan rate_counters_window_idx", "Tid Scan <nil>"}, reads)
	require.Condition(t, func() bool {
		return slices.Contains(reads, "Index Scan rate_counters_window_idx") ||
			slices.Contains(reads, "Bitmap Index Scan rate_counters_window_idx")
	}, "found by window_start's index: %v", reads)
}

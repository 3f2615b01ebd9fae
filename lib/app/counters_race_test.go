package app_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// endedCounters is how many ended rate-limit windows and spend counters of
// days past the passes below find: more than a pass's batch of spend
// counters (spendCountersPerPass, 1,000), so that the passes share them.
const endedCounters = 3000

// Passes at once delete each ended rate-limit window (rate_counters.prune)
// and each spend counter of a day past (gate.spend_counters) once: their
// counts add up to the rows there were, and none is left. The two-instance
// hammer (TestSweepersOfTwoInstancesHandleEachRecordOnce) reaches neither.
// Not parallel: a pass acts on every workspace of the package database;
// the clock lives in 1933, before every other test's counters.
func TestPassesAtOnceDeleteEachEndedCounterOnce(t *testing.T) {
	clock := apitest.NewClock(time.Date(1933, 6, 1, 0, 0, 0, 0, time.UTC))
	env := apitest.Start(t, apitest.WithNow(clock.Now))
	ws := env.Signup()
	ctx := context.Background()
	now := clock.Now()
	_, err := env.App.Pool.Exec(ctx, `INSERT INTO rate_counters (bucket, window_start, shard, count)
		SELECT 'race', $1::timestamptz - interval '3 hours' - g * interval '1 minute', 0, 1
		FROM generate_series(1, $2::int) g`, now, endedCounters)
	require.NoError(t, err)
	_, err = env.App.Pool.Exec(ctx, `INSERT INTO gate_spend (workspace_id, scope, day, micros, count)
		SELECT $1, 'race' || g, ($2::timestamptz - interval '3 days' - (g % 30) * interval '1 day')::date, 0, 0
		FROM generate_series(1, $3::int) g`, ws.ID, now, endedCounters)
	require.NoError(t, err)

	const passes = 8
	changed := make([]map[string]int, passes)
	failed := make([]map[string]string, passes)
	apitest.StartTogether(passes, func(i int) {
		res := env.App.Sweeper.RunOnce(ctx) // no deadline: a batch each
		changed[i], failed[i] = res.Changed, res.Errors
	})
	sum := map[string]int{}
	for i := range passes {
		require.Empty(t, failed[i], "pass %d", i)
		sum["rate_counters.prune"] += changed[i]["rate_counters.prune"]
		sum["gate.spend_counters"] += changed[i]["gate.spend_counters"]
	}
	var windows, spend int
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM rate_counters WHERE bucket = 'race'),
		(SELECT count(*) FROM gate_spend WHERE workspace_id = $1)`, ws.ID).Scan(&windows, &spend))
	require.Equal(t, []int{0, 0}, []int{windows, spend}, "left")
	require.Equal(t, map[string]int{"rate_counters.prune": endedCounters, "gate.spend_counters": endedCounters}, sum,
		"each deleted once, counted once")
}

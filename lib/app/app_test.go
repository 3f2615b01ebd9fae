package app_test

import (
	"context"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// A serverless instance whose first start met the database down (it
// migrates at start) starts at the next invocation once the database is
// back: the failure is not kept for the instance's life.
func TestDefaultStartsAgainAfterAFailedStart(t *testing.T) {
	cfg := apitest.Config(t)
	t.Setenv("RESULT_ENCRYPTION_KEY", cfg.ResultEncryptionKey)
	t.Setenv("KEY_HASH_SECRET", cfg.KeyHashSecret)
	t.Setenv("AUTO_MIGRATE", "true")
	down, err := url.Parse(cfg.DatabaseURL)
	require.NoError(t, err)
	down.Host = "127.0.0.1:1" // nothing listens there
	t.Setenv("DATABASE_URL", down.String())
	app.ForgetDefault()
	t.Cleanup(app.ForgetDefault)

	_, err = app.Default()
	require.Error(t, err)
	require.True(t, db.IsUnavailable(err), "an outage, not a configuration error: %v", err)

	// For a few seconds the failure answers for itself (requests during an
	// outage fail at once), then the next call builds again.
	t.Setenv("DATABASE_URL", cfg.DatabaseURL)
	_, again := app.Default()
	require.Equal(t, err, again)
	app.ForgetFailedStart()
	a, err := app.Default()
	require.NoError(t, err)
	same, err := app.Default()
	require.NoError(t, err)
	require.Same(t, a, same, "built once, then reused")
}

// Retention of runs and events is a sweeper task when its period is set
// (as by default) and absent at 0, which keeps those records for ever.
func TestRetentionTasksFollowTheirSettings(t *testing.T) {
	tasks := func(jobDays, eventDays int) []string {
		env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) {
			c.JobRetentionDays, c.EventRetentionDays = jobDays, eventDays
		}))
		return env.App.Sweeper.Tasks()
	}
	all := tasks(90, 30)
	require.Contains(t, all, "jobs.retention")
	require.Contains(t, all, "events.retention")
	none := tasks(0, 0)
	require.NotContains(t, none, "jobs.retention")
	require.NotContains(t, none, "events.retention")
	require.NotContains(t, none, "webhooks.expire_held", "held deliveries are kept as long as events are")
	require.Len(t, none, len(all)-3)
}

// A sweeper pass (the cron route's, the local server's loop) covers what
// API.md §4 says one does: lapsed leases of effects and jobs, dependencies,
// run completion, breaker cooldowns, reconciliation reminders, webhook
// deliveries and retention. (Due retries need no task: a job is claimable
// at its dueAt, inline.)
func TestASweepPassCoversWhatAPIMdLists(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { // the defaults (TestLoadDefaults)
		c.JobRetentionDays, c.EventRetentionDays = 90, 30
	}))
	tasks := env.App.Sweeper.Tasks()
	for _, name := range []string{"effects.lapsed_leases", "jobs.lapsed_leases", "jobs.dependencies",
		"jobs.run_completion", "circuits.cooled_down", "approvals.moot", "groups.retention_lowered", "reconciliation.due", "webhooks.dispatch", "webhooks.deliver",
		"effects.retention", "jobs.retention", "events.retention"} {
		require.Contains(t, tasks, name)
	}
}

// The default clock reads UTC, as API.md answers every timestamp: what a
// request stamps with it would otherwise carry the host's zone.
func TestTheDefaultClockReadsUTC(t *testing.T) {
	t.Parallel()
	east := time.FixedZone("UTC+5", 5*3600)
	env := apitest.Start(t, apitest.WithWall(func() time.Time { return time.Now().In(east) }))
	require.Equal(t, time.UTC, env.App.Server.Now().Location())
}

// The default clock is the database's, whatever the instance's own says
// (clock QA): an instance whose clock runs 90 s ahead or behind decides
// with the database's time, to within a statement's round trip.
func TestTheDefaultClockIsTheDatabases(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{90 * time.Second, -90 * time.Second} {
		env := apitest.Start(t, apitest.WithWall(func() time.Time { return time.Now().Add(skew) }))
		var before, after time.Time
		ctx := context.Background()
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before))
		now := env.App.Server.Now()
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after))
		require.False(t, now.Before(before.Add(-time.Second)) || now.After(after.Add(time.Second)),
			"skew %s: %s not within [%s, %s]", skew, now, before, after)
	}
}

// A cron pass works off a backlog of lapsed effect leases batch after
// batch while it has time, each made durable with its effect.indeterminate
// (multi-tenant QA: a batch a pass, 100,000 lapses took 200 passes, over
// three hours on the cron). Batches of 2 stand for the pass's 500. The
// clock lives in 1941, before every other test's leases, so that only
// this test's have lapsed.
func TestAPassWithTimeDrainsLapsedEffectLeases(t *testing.T) {
	app.SetLapsedLeasesPerPass(t, 2)
	clock := apitest.NewClock(time.Date(1941, 1, 1, 0, 0, 0, 0, time.UTC))
	env := apitest.Start(t, apitest.WithNow(clock.Now))
	ws := env.Signup()
	var ids []string
	for i := range 5 {
		d := env.Must(200, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{"effect_type": "email.send",
			"idempotency_key": "lapse-" + string(rune('a'+i)), "payload": map[string]any{}, "lease_seconds": 1}).JSON()
		require.Equal(t, "execute", d["decision"])
		ids = append(ids, d["effect_id"].(string))
	}
	clock.Add(time.Minute)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // as the cron route's
	defer cancel()
	res := env.App.Sweeper.RunOnce(ctx)
	require.Empty(t, res.Errors)
	require.Equal(t, 5, res.Changed["effects.lapsed_leases"], "three batches in one pass")
	var indeterminate int
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE id = ANY($1) AND state = 'indeterminate'`,
		ids).Scan(&indeterminate))
	require.Equal(t, 5, indeterminate)
}

// A cron pass deletes a backlog of spend counters of days past batch after
// batch while it has time, as the other deletions do, not a batch a pass
// (scale QA: 72,000 counters of 3,000 workspaces' days took 72 passes).
// More than two batches (spendCountersPerPass, 1,000) here. The clock
// lives in 1945, before every other test's counters but 1933's, which
// that test deletes.
func TestAPassWithTimeDrainsSpendCounters(t *testing.T) {
	clock := apitest.NewClock(time.Date(1945, 1, 1, 0, 0, 0, 0, time.UTC))
	env := apitest.Start(t, apitest.WithNow(clock.Now))
	ws := env.Signup()
	ctx := context.Background()
	const counters = 2500
	_, err := env.App.Pool.Exec(ctx, `INSERT INTO gate_spend (workspace_id, scope, day, micros, count)
		SELECT $1, 'drain' || g, ($2::timestamptz - interval '3 days' - (g % 30) * interval '1 day')::date, 0, 0
		FROM generate_series(1, $3::int) g`, ws.ID, clock.Now(), counters)
	require.NoError(t, err)

	pass, cancel := context.WithTimeout(ctx, time.Minute) // as the cron route's
	defer cancel()
	res := env.App.Sweeper.RunOnce(pass)
	require.Empty(t, res.Errors)
	require.Equal(t, counters, res.Changed["gate.spend_counters"], "three batches in one pass")
	var left int
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM gate_spend WHERE workspace_id = $1`,
		ws.ID).Scan(&left))
	require.Zero(t, left)
}

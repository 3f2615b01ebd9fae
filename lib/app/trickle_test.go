package app_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
)

// tickingClock reads a second later at each reading while ticking, so that
// each run of a sweep task (which reads the clock once) finds its cut-off a
// second on: a busy deployment's steady stream of rows falling due while a
// pass runs.
type tickingClock struct {
	mu      sync.Mutex
	t       time.Time
	ticking bool
}

func (c *tickingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ticking {
		c.t = c.t.Add(time.Second)
	}
	return c.t
}

func (c *tickingClock) tick(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ticking = on
}

// trickled is how many rows of each deletion fall due while a pass runs,
// one a second; fewer than a batch (retentionPerPass, idempotentAnswersPerPass,
// rateCountersPerPass).
const trickled = 500

// A pass with a deadline (the cron route, the Lambda schedule) runs a
// deletion again while it deletes rows, but at the same now: the rows
// falling due while it runs wait for the next pass (review: idempotent
// answers expire a day after their requests, events and held deliveries
// at their retention, one after another on a busy deployment, so each
// further run, at a later now, found a few and the task ran again and
// again to its 20 s every pass, and on the cron route idempotency.expired,
// third of the pass, took every later task's time but their reserve).
// Here each task's rows fall due one a second, and the clock reads a
// second on at each reading: the pass leaves most of them.
// Not parallel: a pass acts on every workspace of the package database;
// the clock lives in 1937, before every other test's rows.
func TestAPassLeavesRowsFallingDueMeanwhileToTheNext(t *testing.T) {
	clock := &tickingClock{t: time.Date(1937, 1, 1, 0, 0, 0, 0, time.UTC)}
	env := apitest.Start(t, apitest.WithNow(clock.Now), apitest.WithConfig(func(c *config.Config) {
		c.EventRetentionDays = 30
	}))
	ws := env.Signup()
	hook := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}}).JSON()["id"].(string)
	ctx := context.Background()
	now := clock.Now()
	_, err := env.App.Pool.Exec(ctx, `UPDATE webhooks SET disabled_at = $2 WHERE id = $1`, hook, now)
	require.NoError(t, err)

	// Row g falls due g seconds from now.
	due := func(age time.Duration) time.Time { return now.Add(-age) }
	retention := now.Sub(now.AddDate(0, 0, -30))
	for _, q := range []struct {
		sql  string
		at   time.Time
		more []any
	}{
		{`INSERT INTO idempotent_requests (key_id, idempotency_key, request_hash, request_id, created_at)
			SELECT 'key_trickle', 'k' || g, '\x00', 'req_trickle', $1::timestamptz + g * interval '1 second'
			FROM generate_series(1, $2::int) g`, due(24 * time.Hour), nil},
		{`INSERT INTO rate_counters (bucket, window_start, shard, count)
			SELECT 'trickle', $1::timestamptz + g * interval '1 second', 0, 1
			FROM generate_series(1, $2::int) g`, due(2 * time.Hour), nil},
		{`INSERT INTO events (id, workspace_id, type, subject_id, created_at, dispatched_at)
			SELECT 'evt_trickle' || g, $3::text, 'run.finished', 'run_trickle' || g,
			    $1::timestamptz + g * interval '1 second', $1::timestamptz
			FROM generate_series(1, $2::int) g`, due(retention), []any{ws.ID}},
		// Held by the disabled subscription, each due g seconds past
		// the retention's cut-off, of events recorded before.
		{`WITH e AS (
			INSERT INTO events (id, workspace_id, type, subject_id, created_at, dispatched_at)
			SELECT 'evt_held' || g, $3::text, 'run.finished', 'run_held' || g, $1::timestamptz - interval '1 hour',
			    $1::timestamptz - interval '1 hour'
			FROM generate_series(1, $2::int) g RETURNING id)
		  INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event_id, event_type, state, next_attempt_at, created_at)
			SELECT 'dlv_held' || g, $4::text, $3::text, 'evt_held' || g, 'run.finished', 'pending',
			    $1::timestamptz + g * interval '1 second', $1::timestamptz - interval '1 hour'
			FROM generate_series(1, $2::int) g`, due(retention), []any{ws.ID, hook}},
	} {
		_, err := env.App.Pool.Exec(ctx, q.sql, append([]any{q.at, trickled}, q.more...)...)
		require.NoError(t, err)
	}

	clock.tick(true)
	pass, cancel := context.WithTimeout(ctx, time.Minute) // as the cron route's
	defer cancel()
	res := env.App.Sweeper.RunOnce(pass)
	clock.tick(false)
	require.Empty(t, res.Errors)

	for task, left := range map[string]string{
		"idempotency.expired":  `SELECT count(*) FROM idempotent_requests WHERE key_id = 'key_trickle'`,
		"rate_counters.prune":  `SELECT count(*) FROM rate_counters WHERE bucket = 'trickle'`,
		"events.retention":     `SELECT count(*) FROM events WHERE id LIKE 'evt\_trickle%'`,
		"webhooks.expire_held": `SELECT count(*) FROM webhook_deliveries WHERE id LIKE 'dlv\_held%' AND state = 'pending'`,
	} {
		var n int
		require.NoError(t, env.App.Pool.QueryRow(ctx, left).Scan(&n))
		assert.Positive(t, n, "%s ran again while its rows fell due one by one (changed %d)", task, res.Changed[task])
	}
}

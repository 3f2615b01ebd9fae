package webhooks_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// startRetaining is start with EVENT_RETENTION_DAYS of 30, private
// receivers allowed, and a workspace whose subscription id (to
// run.finished) is rcv, answering statuses (subscribe, newReceiver).
func startRetaining(t *testing.T, statuses ...int) (env *apitest.Env, clk *apitest.Clock, ws apitest.Workspace,
	rcv *receiver, id string) {
	env, clk = start(t, true, apitest.WithConfig(func(cfg *config.Config) { cfg.EventRetentionDays = 30 }))
	ws = env.Signup()
	rcv = newReceiver(t, statuses...)
	id, _ = subscribe(t, env, ws.Key, rcv.URL)
	return env, clk, ws, rcv, id
}

// olderElsewhere leaves more events past the retention than a purge takes
// at once (retentionPerPass, 1,000), from an hour before than (older than
// the test's events), fanned out, in another
// workspace, as the tests before leave theirs (the outbox is the package
// database's, and a purge takes the oldest first): under -shuffle, after
// the bursts of other tests, a pass without a deadline purged those and
// not this test's.
func olderElsewhere(t *testing.T, env *apitest.Env, than time.Time) {
	t.Helper()
	ws := env.Signup()
	_, err := env.App.Pool.Exec(context.Background(), `INSERT INTO events (id, workspace_id, type, subject_id, data,
		created_at, dispatched_at)
		SELECT 'evt_old' || g || $1, $1, 'run.finished', 'run_old' || g, '{}', $2::timestamptz + g * interval '1 ms', $2
		FROM generate_series(1, 1001) g`, ws.ID, than.Add(-time.Hour))
	require.NoError(t, err)
}

// retentionPass runs a sweep pass with a deadline, as the cron route and
// the Lambda schedule do, so that its retention drains, batch after batch
// (sweep.Task.Drains), whatever other tests left older; it fails no task.
func retentionPass(t *testing.T, env *apitest.Env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.Empty(t, env.App.Sweeper.RunOnce(ctx).Errors)
}

// eventKept says whether event id is still in the outbox.
func eventKept(t *testing.T, env *apitest.Env, id string) bool {
	t.Helper()
	var kept bool
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM events WHERE id = $1)`,
		id).Scan(&kept))
	return kept
}

// deliveryOf reads the state and last_error of webhook id's delivery of
// event evt, as stored (a deleted webhook's are not listed).
func deliveryOf(t *testing.T, env *apitest.Env, id, evt string) (state string, lastError *string) {
	t.Helper()
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT state, last_error FROM webhook_deliveries
		WHERE webhook_id = $1 AND event_id = $2`, id, evt).Scan(&state, &lastError))
	return state, lastError
}

// A delivery held while its subscription is disabled keeps its event no
// longer than the events' retention: once it has waited that long it ends
// failed (expired while disabled), is not sent when the subscription is
// enabled again, and goes with its event (webhooks QA: held until the
// subscription was enabled or deleted, it kept its event, payload
// included, for as long as it stayed disabled). One held for less is kept,
// held. A live subscription's pending delivery is never ended so, however
// long ago it fell due.
func TestAHeldDeliveryEndsWithTheEventsRetention(t *testing.T) {
	env, clk, ws, rcv, id := startRetaining(t)
	start := clk.Now()
	ctx := context.Background()
	live := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": rcv.URL, "events": []string{events.StepExhausted}}).JSON()["id"].(string)
	held := eventOf(t, env, record(t, env, ws.ID, events.RunFinished, clk.Now()))
	sent := eventOf(t, env, record(t, env, ws.ID, events.StepExhausted, clk.Now()))
	_, err := env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
	require.NoError(t, err)
	env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"disabled": true})

	clk.Add(29 * 24 * time.Hour)
	env.App.Sweeper.RunOnce(ctx)
	require.ElementsMatch(t, []string{sent}, sentIDs(t, rcv))
	ds := deliveries(t, env, ws.Key, id)
	require.Len(t, ds, 1)
	require.Equal(t, "pending", ds[0]["state"], "held for less than the retention: kept, held")
	require.EqualValues(t, 0, ds[0]["attempts"])
	require.True(t, eventKept(t, env, held))

	clk.Add(2 * 24 * time.Hour)
	// A live subscription's delivery due as long ago is not the sweeper's
	// to end: it is sent.
	_, err = env.App.Pool.Exec(ctx, `UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = $2
		WHERE webhook_id = $1`, live, clk.Now().AddDate(0, 0, -40))
	require.NoError(t, err)
	cutoff := clk.Now().AddDate(0, 0, -30)
	// A subscription an update holds (it may be enabling it) is left to a
	// later pass: ended now, a delivery the update then enabled was lost.
	tx, err := env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM webhooks WHERE id = $1 FOR NO KEY UPDATE`, id)
	require.NoError(t, err)
	_, err = env.App.Server.Webhooks.ExpireHeld(ctx, cutoff, 1000)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, "pending", deliveries(t, env, ws.Key, id)[0]["state"], "its webhook's row was held")
	n, err := env.App.Server.Webhooks.ExpireHeld(ctx, cutoff, 1000)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 1)
	state, lastError := deliveryOf(t, env, live, sent)
	require.Equal(t, "pending", state, "a live subscription's")
	require.Nil(t, lastError)
	ds = deliveries(t, env, ws.Key, id)
	require.Len(t, ds, 1)
	require.Equal(t, "failed", ds[0]["state"])
	require.Equal(t, "expired while disabled", ds[0]["last_error"])
	require.EqualValues(t, 0, ds[0]["attempts"], "never sent")

	// Enabled again, the subscription is not sent it, and the sweeper's
	// retention takes it with its event.
	env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"disabled": false})
	olderElsewhere(t, env, start)
	retentionPass(t, env)
	require.ElementsMatch(t, []string{sent, sent}, sentIDs(t, rcv), "the live one's sent again, the expired one not")
	require.False(t, eventKept(t, env, held), "the event goes with the retention")
	require.Empty(t, deliveries(t, env, ws.Key, id))
}

// The sweeper's retention ends a held delivery by itself: a subscription
// that stays disabled keeps its events no longer than the retention.
func TestTheSweeperEndsHeldDeliveriesOfADisabledWebhook(t *testing.T) {
	env, clk, ws, rcv, id := startRetaining(t, repeat(500, 3)...)
	ctx := context.Background()
	evt := eventOf(t, env, record(t, env, ws.ID, events.RunFinished, clk.Now()))
	env.App.Sweeper.RunOnce(ctx) // its first attempt fails: pending, retried later
	require.Equal(t, 1, rcv.count())
	env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"disabled": true})
	olderElsewhere(t, env, clk.Now())

	clk.Add(31 * 24 * time.Hour)
	retentionPass(t, env)
	require.False(t, eventKept(t, env, evt), "the held delivery ended, and its event went")
	require.Empty(t, deliveries(t, env, ws.Key, id))
	require.Equal(t, 1, rcv.count())
}

// A pending delivery of a deleted subscription (an instance of an earlier
// release fanning out as the delete commits leaves one: never sent, it
// held its event for good) ends as the delete ends them, webhook deleted,
// and goes with its event at the retention.
func TestRetentionEndsAPendingDeliveryADeleteLeft(t *testing.T) {
	env, clk, ws, rcv, id := startRetaining(t)
	start := clk.Now()
	ctx := context.Background()
	evt := eventOf(t, env, record(t, env, ws.ID, events.RunFinished, clk.Now()))
	_, err := env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
	require.NoError(t, err)
	env.Must(http.StatusOK, "DELETE", "/api/v1/webhooks/"+id, ws.Key, nil)
	// As the earlier release's fan-out left it: made after the delete.
	_, err = env.App.Pool.Exec(ctx, `UPDATE webhook_deliveries SET state = 'pending', last_error = NULL
		WHERE webhook_id = $1`, id)
	require.NoError(t, err)

	clk.Add(31 * 24 * time.Hour)
	_, err = env.App.Server.Webhooks.ExpireHeld(ctx, clk.Now().AddDate(0, 0, -30), 1000)
	require.NoError(t, err)
	state, lastError := deliveryOf(t, env, id, evt)
	require.Equal(t, "failed", state)
	require.NotNil(t, lastError)
	require.Equal(t, "webhook deleted", *lastError)

	_, err = env.App.Pool.Exec(ctx, `UPDATE webhook_deliveries SET state = 'pending', last_error = NULL
		WHERE webhook_id = $1`, id)
	require.NoError(t, err)
	olderElsewhere(t, env, start)
	retentionPass(t, env)
	require.False(t, eventKept(t, env, evt), "the sweeper's retention ends it, and its event goes")
	require.Zero(t, rcv.count())
}

// Ending held deliveries reads a batch of a disabled subscription's held
// backlog, not the backlog nor the deliveries that ended, whichever way
// its statement is planned (testpg.CheckBacklog).
func TestEndingHeldDeliveriesReadsABatch(t *testing.T) {
	t.Parallel()
	env, _ := start(t, true)
	testpg.CheckBacklog(t, env.App.Pool, testpg.Backlog{
		Tables: []string{"webhook_deliveries", "webhooks"},
		Seed:   heldBacklog,
		SQL:    webhooks.SQLExpireHeld,
		Args:   func(limit int) []any { return []any{time.Now().AddDate(0, 0, -30), limit} },
		Limits: []int{100, 1000},
	})
}

// heldBacklog seeds deliveries for testpg.CheckBacklog: delivered ones of
// a live subscription, and a backlog, newer, held 45 days by a disabled
// subscription of workspace ws_h0.
const heldBacklog = `WITH hooks AS (
	INSERT INTO webhooks (id, workspace_id, url, events, secret, created_at, disabled_at)
	VALUES ('whk_live', 'ws_h1', 'https://example.com/a', '{run.finished}', '\x00', now() - interval '90 days', NULL),
	       ('whk_held', 'ws_h0', 'https://example.com/b', '{run.finished}', '\x00', now() - interval '90 days',
	        now() - interval '45 days')
)
INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event_id, event_type, state, attempts,
	next_attempt_at, created_at, delivered_at)
SELECT 'dlv_h' || g, 'whk_live', 'ws_h' || g % $2, 'evt_h' || g, 'run.finished', 'delivered', 1,
	now() - interval '60 days' + g * interval '1 ms', now() - interval '60 days', now() - interval '60 days'
FROM generate_series(1, $1::int) g
UNION ALL
SELECT 'dlv_b' || g, 'whk_held', 'ws_h0', 'evt_b' || g, 'run.finished', 'pending', 0,
	now() - interval '45 days' + g * interval '1 ms', now() - interval '45 days', NULL
FROM generate_series(1, $3::int) g`

package webhooks_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// dispatchAll fans out every event left undispatched (by earlier tests:
// the outbox is the package database's), so that a test's batches hold
// its own events only.
func dispatchAll(t *testing.T, env *apitest.Env, now time.Time) {
	t.Helper()
	for {
		n, err := env.App.Server.Webhooks.Dispatch(context.Background(), now)
		require.NoError(t, err)
		if n == 0 {
			return
		}
	}
}

// dispatched counts a workspace's events fanned out and not.
func dispatched(t *testing.T, env *apitest.Env, ws string) (done, left int) {
	t.Helper()
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT
		count(*) FILTER (WHERE dispatched_at IS NOT NULL), count(*) FILTER (WHERE dispatched_at IS NULL)
		FROM events WHERE workspace_id = $1`, ws).Scan(&done, &left))
	return done, left
}

// A fan-out takes turns among the workspaces with events: one workspace's
// burst older than another's event takes one place of the batch a turn,
// and the other's event (and so its webhooks' deliveries) goes out in the
// first pass (multi-tenant QA: in creation order alone, 100,000
// run.finished of one workspace's bulk import held every other
// workspace's events back for 200 passes, over three hours on the cron).
// A batch of 2 stands for the pass's 500.
func TestAFanOutTakesTurnsAmongWorkspaces(t *testing.T) {
	env, clk := start(t, true)
	ctx := context.Background()
	dispatchAll(t, env, clk.Now())
	noisy, quiet := env.Signup(), env.Signup()
	for range 5 {
		record(t, env, noisy.ID, events.RunFinished, clk.Now())
		clk.Add(time.Millisecond)
	}
	clk.Add(time.Second) // after the whole burst
	record(t, env, quiet.ID, events.RunFinished, clk.Now())
	webhooks.SetDispatchBatch(env.App.Server.Webhooks, 2)

	n, err := env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
	require.NoError(t, err)
	require.Equal(t, 2, n)
	done, _ := dispatched(t, env, quiet.ID)
	require.Equal(t, 1, done, "the quiet workspace's event is fanned out in the first pass")
	done, left := dispatched(t, env, noisy.ID)
	require.Equal(t, []int{1, 4}, []int{done, left})
	for _, want := range []int{2, 2, 0} {
		n, err := env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
		require.NoError(t, err)
		require.Equal(t, want, n, "alone, the burst fills each batch")
	}
}

// A pass with a deadline (the cron route, the Lambda schedule) fans out
// batch after batch while it has time (sweep.Task.Drains): one batch of
// 500 a pass, a pass a minute, was every workspace's fan-out together, so
// a service recording more events than that a minute fell behind for all
// of them, further each minute (multi-tenant QA). A batch of 2 stands for
// the pass's 500.
func TestAPassFansOutWhileItHasTime(t *testing.T) {
	env, clk := start(t, true)
	dispatchAll(t, env, clk.Now())
	ws := env.Signup()
	for range 5 {
		record(t, env, ws.ID, events.RunFinished, clk.Now())
	}
	dueElsewhere(t, env, clk)
	webhooks.SetDispatchBatch(env.App.Server.Webhooks, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res := env.App.Sweeper.RunOnce(ctx)
	require.Empty(t, res.Errors)
	done, left := dispatched(t, env, ws.ID)
	require.Equal(t, []int{5, 0}, []int{done, left}, "three batches in one pass")
	require.Equal(t, dispatchedAt(t, env, clk.Now()), res.Changed["webhooks.dispatch"],
		"the pass counts what it fanned out (of every workspace: the outbox is the package database's)")
}

// dispatchedAt counts the events, of every workspace, fanned out by a pass
// at now: a pass's own count, whatever other tests left in the outbox or
// its other tasks recorded (a lapse) before its fan-out.
func dispatchedAt(t *testing.T, env *apitest.Env, now time.Time) (n int) {
	t.Helper()
	require.NoError(t, env.App.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM events WHERE dispatched_at = $1`, now).Scan(&n))
	return n
}

// A round of deliveries takes turns among workspaces, each workspace's
// sends in flight counted as its first turns: receivers of three
// workspaces that hang (held here for as long as the test takes, their
// timeout raised past it, not cut at 10 s) do not fill the
// pass's room for sends ahead of a fourth workspace's delivery, due after
// all of theirs (multi-tenant QA: in the order deliveries fell due, the
// three took the whole room, 40 + 40 + 20 sends, and took it again as
// their sends timed out, so the fourth waited for all their backlog). The
// fourth's delivery arrives while every hung send is still in flight:
// none has been recorded.
func TestHungReceiversOfThreeWorkspacesHoldNoOtherDelivery(t *testing.T) {
	env, clk := start(t, true)
	ctx := context.Background()
	webhooks.SetSendTimeout(env.App.Server.Webhooks, time.Hour)
	dispatchAll(t, env, clk.Now())
	hung, _, unblock := newBlockingReceiver(t)
	arrived := make(chan struct{})
	var once sync.Once
	fine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(arrived) })
	}))
	t.Cleanup(fine.Close)

	// Three workspaces of two webhooks each on the hung receiver, 20 events
	// each: 40 deliveries a workspace, its share of the pass.
	var noisy []string
	for range 3 {
		ws := env.Signup()
		noisy = append(noisy, ws.ID)
		for range 2 {
			env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
				map[string]any{"url": hung.URL, "events": []string{events.StepExhausted}})
		}
		for range 20 {
			record(t, env, ws.ID, events.StepExhausted, clk.Now())
		}
	}
	dispatchAll(t, env, clk.Now())
	clk.Add(time.Second) // due after all of theirs
	quiet := env.Signup()
	env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", quiet.Key,
		map[string]any{"url": fine.URL, "events": []string{events.StepExhausted}})
	record(t, env, quiet.ID, events.StepExhausted, clk.Now())
	dispatchAll(t, env, clk.Now())

	done := make(chan error, 1)
	go func() {
		_, err := env.App.Server.Webhooks.Deliver(ctx, clk.Now())
		done <- err
	}()
	<-arrived
	var ended int
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries
		WHERE workspace_id = ANY($1) AND (last_error IS NOT NULL OR last_status_code IS NOT NULL)`, noisy).Scan(&ended))
	require.Zero(t, ended, "the quiet workspace's delivery went out while every hung send was in flight")
	unblock()
	require.NoError(t, <-done)
}

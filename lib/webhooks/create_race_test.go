package webhooks_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/events"
)

// createAsync sends a create of a run.finished subscription of url, its
// answer on the channel, closed done once it answered.
func createAsync(env *apitest.Env, key, url string) (<-chan *apitest.Response, <-chan struct{}) {
	answer, done := make(chan *apitest.Response, 1), make(chan struct{})
	go func() {
		defer close(done)
		answer <- env.Do("POST", "/api/v1/webhooks", key, map[string]any{"url": url, "events": []string{events.RunFinished}})
	}()
	return answer, done
}

// createdAt is a create's answer's created_at.
func createdAt(t *testing.T, r *apitest.Response) time.Time {
	t.Helper()
	require.Equal(t, http.StatusCreated, r.Status)
	at, err := time.Parse(time.RFC3339Nano, r.JSON()["created_at"].(string))
	require.NoError(t, err)
	return at
}

// A webhook gets an event recorded after its created_at that is fanned
// out while its create is still in progress: the fan-out waits for the
// create, then sees the webhook (webhooks QA: the fan-out, blind to the
// uncommitted webhook, marked the event dispatched, and the webhook never
// got it, though its created_at came first and its create answered before
// any later pass).
func TestAFanOutWaitsForACreateInProgress(t *testing.T) {
	env, clk := start(t, true)
	ctx := context.Background()
	pool := env.App.Pool
	ws := env.Signup()
	rcv := newReceiver(t)

	// Holds the create between its lock (its clock read) and its insert.
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `LOCK TABLE webhooks IN SHARE MODE`)
	require.NoError(t, err)
	waits := apitest.NewLockWaits(t, pool, apitest.BackendPID(t, holder))
	answer, createDone := createAsync(env, ws.Key, rcv.URL)
	waits.Waiting(createDone, "the create waits to insert its webhook")

	clk.Add(time.Second)
	subject := record(t, env, ws.ID, events.RunFinished, clk.Now())
	dispatched, dispatchDone := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(dispatchDone)
		_, err := env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
		dispatched <- err
	}()
	waits.Wait(dispatchDone, "the fan-out answered or waits for the create")
	require.NoError(t, holder.Commit(ctx))

	created := <-answer
	require.NoError(t, <-dispatched)
	require.True(t, createdAt(t, created).Before(clk.Now()), "the webhook was created before the event")
	env.App.Sweeper.RunOnce(ctx)
	require.Equal(t, 1, rcv.count(), "the event recorded after the webhook's created_at reaches it")
	require.Contains(t, string(rcv.bodies[0]), subject)
	require.Len(t, deliveries(t, env, ws.Key, created.JSON()["id"].(string)), 1)
}

// A create that waits for a fan-out in progress of its workspace's events
// is created once that fan-out commits: its created_at comes after the
// events the fan-out took without it, so what it says is what it gets,
// every event from its created_at on and none before (webhooks QA: its
// clock, read before the wait, put created_at at or before such an event,
// which it never got).
func TestACreateWaitingForAFanOutComesAfterItsEvents(t *testing.T) {
	env, clk := start(t, true)
	ctx := context.Background()
	pool := env.App.Pool
	ws := env.Signup()
	rcv := newReceiver(t)
	record(t, env, ws.ID, events.RunFinished, clk.Now())

	fanOut, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = fanOut.Rollback(ctx) }()
	n, err := env.App.Server.Webhooks.DispatchIn(ctx, fanOut, clk.Now())
	require.NoError(t, err)
	require.Positive(t, n)
	waits := apitest.NewLockWaits(t, pool, apitest.BackendPID(t, fanOut))
	answer, createDone := createAsync(env, ws.Key, rcv.URL)
	waits.Waiting(createDone, "the create waits for the fan-out of its workspace's event")
	first := clk.Now()
	clk.Add(time.Second)
	require.NoError(t, fanOut.Commit(ctx))

	created := <-answer
	require.True(t, createdAt(t, created).After(first), "created after the event the fan-out took without it")
	later := record(t, env, ws.ID, events.RunFinished, clk.Now())
	env.App.Sweeper.RunOnce(ctx)
	require.Equal(t, 1, rcv.count(), "only the event from its created_at on")
	require.Contains(t, string(rcv.bodies[0]), later)
}

package webhooks_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// A send that outlives its claim's minute (an instance frozen mid-send and
// thawed later) is sent again by a later pass; the first send's failure,
// answered while the second is in flight, records nothing: on the last
// attempt it ended the delivery failed, and the second send's 2xx, answered
// after it, was then dropped, so an event that arrived read failed
// (webhooks model QA). The second's answer decides.
func TestASupersededSendsFailureRecordsNothing(t *testing.T) {
	t.Parallel()
	env, clk := start(t, true)
	ctx := context.Background()
	dispatchAll(t, env, clk.Now())
	ws := env.Signup()
	// The first send is held and answers 500, the second is held and
	// answers 200.
	var hits atomic.Int32
	arrived := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	answer := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	status := [2]int{http.StatusInternalServerError, http.StatusOK}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1) - 1
		if n > 1 {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		close(arrived[n])
		<-answer[n]
		w.WriteHeader(status[n])
	}))
	defer srv.Close()
	defer func() {
		for _, c := range answer {
			select {
			case <-c:
			default:
				close(c)
			}
		}
	}()
	hook, _ := subscribe(t, env, ws.Key, srv.URL)
	record(t, env, ws.ID, events.RunFinished, clk.Now())
	dispatchAll(t, env, clk.Now())
	// One attempt left: the first send is the last one counted.
	_, err := env.App.Pool.Exec(ctx, `UPDATE webhook_deliveries SET attempts = $2 WHERE webhook_id = $1`,
		hook, webhooks.MaxAttempts-1)
	require.NoError(t, err)

	pass := func(at time.Time) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := env.App.Server.Webhooks.Deliver(ctx, at)
			done <- err
		}()
		return done
	}
	first := pass(clk.Now())
	<-arrived[0]
	clk.Add(time.Minute + time.Second) // the first send's claim lapses
	second := pass(clk.Now())
	<-arrived[1]
	claimEnd := func() (state string, attempts int, next time.Time) {
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT state, attempts, next_attempt_at
			FROM webhook_deliveries WHERE webhook_id = $1`, hook).Scan(&state, &attempts, &next))
		return state, attempts, next
	}
	_, _, claimed := claimEnd()

	close(answer[0])
	require.NoError(t, <-first)
	state, attempts, next := claimEnd()
	require.Equal(t, "pending", state, "the superseded send's failure ends nothing")
	require.Equal(t, webhooks.MaxAttempts+1, attempts)
	require.True(t, next.Equal(claimed), "the second send keeps its claim: %s, want %s", next, claimed)

	close(answer[1])
	require.NoError(t, <-second)
	got := deliveries(t, env, ws.Key, hook)
	require.Len(t, got, 1)
	require.Equal(t, "delivered", got[0]["state"])
	require.EqualValues(t, http.StatusOK, got[0]["last_status_code"])
}

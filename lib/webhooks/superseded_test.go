package webhooks_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// heldTwice is a receiver that holds its first two sends: the n-th
// (0-based) closes arrived[n] when it comes and is answered status[n] once
// answer[n] is closed (or the test ends); a later one is answered 418 at
// once, counted in hits with the others.
type heldTwice struct {
	srv     *httptest.Server
	hits    atomic.Int32
	arrived [2]chan struct{}
	answer  [2]chan struct{}
}

func newHeldTwice(t *testing.T, status [2]int) *heldTwice {
	h := &heldTwice{arrived: [2]chan struct{}{make(chan struct{}), make(chan struct{})},
		answer: [2]chan struct{}{make(chan struct{}), make(chan struct{})}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.hits.Add(1) - 1
		if n > 1 {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		close(h.arrived[n])
		<-h.answer[n]
		w.WriteHeader(status[n])
	}))
	t.Cleanup(h.srv.Close)
	t.Cleanup(func() { // runs first: the handlers return before the server closes
		for n := range h.answer {
			h.release(n)
		}
	})
	return h
}

// release answers the n-th held send.
func (h *heldTwice) release(n int) {
	select {
	case <-h.answer[n]:
	default:
		close(h.answer[n])
	}
}

// supersededCase is a delivery one attempt short of MaxAttempts, to a
// receiver that holds its first two sends: the first answered 500, the
// second 200.
type supersededCase struct {
	t             *testing.T
	env           *apitest.Env
	clk           *apitest.Clock
	ws            apitest.Workspace
	hook          string
	rcv           *heldTwice
	first, second <-chan error // the passes that sent them
	claimed       time.Time    // the second send's claim's end
}

func newSupersededCase(t *testing.T) *supersededCase {
	t.Helper()
	return newSupersededCaseAnswering(t, [2]int{http.StatusInternalServerError, http.StatusOK})
}

// newSupersededCaseAnswering is newSupersededCase whose receiver answers
// the first send status[0] and the second status[1].
func newSupersededCaseAnswering(t *testing.T, status [2]int) *supersededCase {
	t.Helper()
	env, clk := start(t, true)
	ctx := context.Background()
	dispatchAll(t, env, clk.Now())
	c := &supersededCase{t: t, env: env, clk: clk, ws: env.Signup(),
		rcv: newHeldTwice(t, status)}
	c.hook, _ = subscribe(t, env, c.ws.Key, c.rcv.srv.URL)
	record(t, env, c.ws.ID, events.RunFinished, clk.Now())
	dispatchAll(t, env, clk.Now())
	// One attempt left: the first send is the last one counted.
	_, err := env.App.Pool.Exec(ctx, `UPDATE webhook_deliveries SET attempts = $2 WHERE webhook_id = $1`,
		c.hook, webhooks.MaxAttempts-1)
	require.NoError(t, err)
	return c
}

// pass runs a delivery pass at the clock's now, aside.
func (c *supersededCase) pass() <-chan error { return deliverAside(c.env, c.clk.Now()) }

// sendFirst sends the delivery, held at the receiver.
func (c *supersededCase) sendFirst() {
	c.first = c.pass()
	<-c.rcv.arrived[0]
}

// sendAgain lets the first send's claim lapse and sends the delivery again,
// held at the receiver too.
func (c *supersededCase) sendAgain() {
	c.clk.Add(time.Minute + time.Second)
	c.second = c.pass()
	<-c.rcv.arrived[1]
	_, _, c.claimed = c.row()
}

// answerFirst answers the first send (500) and checks that it recorded
// nothing: the delivery still pending, its attempts the second claim's,
// and that claim kept.
func (c *supersededCase) answerFirst(attempts int) {
	c.rcv.release(0)
	require.NoError(c.t, <-c.first)
	state, n, next := c.row()
	require.Equal(c.t, []any{"pending", attempts}, []any{state, n}, "the superseded send's failure ends nothing")
	require.True(c.t, next.Equal(c.claimed), "the second send keeps its claim: %s, want %s", next, c.claimed)
}

// retry retries the delivery (POST …/deliveries/retry).
func (c *supersededCase) retry() {
	var dlv string
	require.NoError(c.t, c.env.App.Pool.QueryRow(context.Background(), `SELECT id FROM webhook_deliveries
		WHERE webhook_id = $1`, c.hook).Scan(&dlv))
	c.env.Must(http.StatusOK, "POST", "/api/v1/webhooks/"+c.hook+"/deliveries/retry", c.ws.Key,
		map[string]any{"delivery_ids": []string{dlv}})
}

// answerSecond answers the second send (200): the delivery reads
// delivered, 200.
func (c *supersededCase) answerSecond() {
	c.rcv.release(1)
	require.NoError(c.t, <-c.second)
	requireDeliveredOK(c.t, c.env, c.ws.Key, c.hook)
}

// requireDeliveredOK checks that hook's one delivery reads delivered, 200.
func requireDeliveredOK(t *testing.T, env *apitest.Env, key, hook string) {
	t.Helper()
	got := deliveries(t, env, key, hook)
	require.Len(t, got, 1)
	require.Equal(t, "delivered", got[0]["state"])
	require.EqualValues(t, http.StatusOK, got[0]["last_status_code"])
}

// row reads the delivery's state, attempts and next attempt.
func (c *supersededCase) row() (state string, attempts int, next time.Time) {
	require.NoError(c.t, c.env.App.Pool.QueryRow(context.Background(), `SELECT state, attempts, next_attempt_at
		FROM webhook_deliveries WHERE webhook_id = $1`, c.hook).Scan(&state, &attempts, &next))
	return state, attempts, next
}

// A send that outlives its claim's minute (an instance frozen mid-send and
// thawed later) is sent again by a later pass; the first send's failure,
// answered while the second is in flight, records nothing: on the last
// attempt it ended the delivery failed, and the second send's 2xx, answered
// after it, was then dropped, so an event that arrived read failed
// (webhooks model QA). The second's answer decides.
func TestASupersededSendsFailureRecordsNothing(t *testing.T) {
	t.Parallel()
	c := newSupersededCase(t)
	c.sendFirst()
	c.sendAgain()
	c.answerFirst(webhooks.MaxAttempts + 1)
	c.answerSecond()
}

// The same with a retry of the delivery while its last attempt is in
// flight: the retry gives its attempts back, so the later claim counts one
// attempt, fewer than the first send's claim (12). Fenced by attempts, that
// send's late failure still recorded: due at once (a retry gave the
// attempts back), it cut the later send's claim short, and the next pass
// sent the delivery a third time while the second was in flight (webhooks
// QA). Each claim counts one more claim (migration 0073), and only the
// latest claim's failure records. Not parallel: its passes sweep the
// package's shared deliveries, the other superseded test's among them.
func TestASupersededSendsFailureRecordsNothingAfterARetry(t *testing.T) {
	c := newSupersededCase(t)
	ctx := context.Background()
	c.sendFirst()
	c.retry()
	state, attempts, _ := c.row()
	require.Equal(t, []any{"pending", 0}, []any{state, attempts}, "its last attempt in flight, the retry gives it back")
	c.sendAgain()

	c.answerFirst(1)
	got := deliveries(t, c.env, c.ws.Key, c.hook)
	require.Nil(t, got[0]["last_status_code"], "the superseded send's failure records nothing")
	dueElsewhere(t, c.env, c.clk) // another test's, sent in this pass
	_, err := c.env.App.Server.Webhooks.Dispatch(ctx, c.clk.Now())
	require.NoError(t, err)
	_, err = c.env.App.Server.Webhooks.Deliver(ctx, c.clk.Now())
	require.NoError(t, err)
	require.EqualValues(t, 2, c.rcv.hits.Load(), "nothing is sent again while the second send is in flight")

	c.answerSecond()
	require.EqualValues(t, 2, c.rcv.hits.Load())
}

// An instance of the release before migration 0073, still sweeping during
// the deploy, claims without counting a claim: its claim counts an attempt
// only, and that alone tells its send for the later one, so this release's
// earlier send's failure records nothing over it (README, Upgrading: this
// release fences by both claims and attempts). Fenced by claims alone, the
// failure, the delivery's twelfth attempt, ended it failed while the later
// send was in flight. Not parallel: its pass sweeps the package's shared
// deliveries.
func TestAFailureSupersededByAPreviousReleasesClaimRecordsNothing(t *testing.T) {
	c := newSupersededCase(t)
	c.sendFirst()
	c.clk.Add(time.Minute + time.Second)
	// The previous release's claim (its sqlClaim): an attempt, no claim.
	c.claimed = c.clk.Now().Add(time.Minute).Truncate(time.Microsecond)
	_, err := c.env.App.Pool.Exec(context.Background(), `UPDATE webhook_deliveries
		SET attempts = attempts + 1, next_attempt_at = $2 WHERE webhook_id = $1`, c.hook, c.claimed)
	require.NoError(t, err)
	c.answerFirst(webhooks.MaxAttempts + 1)
}

// The other order of answers: the later send fails, on the delivery's last
// attempt, and ends it failed; the earlier send's 2xx, answered after
// that, is still recorded (README: when the earlier one answers, a 2xx is
// recorded, the event arrived). It recorded nothing: the delivery read
// failed, 500, though its event had arrived. Not parallel: its passes
// sweep the package's shared deliveries.
func TestASupersededSendsLate2xxIsRecordedAfterTheLaterSendFailed(t *testing.T) {
	c := newSupersededCaseAnswering(t, [2]int{http.StatusOK, http.StatusInternalServerError})
	c.sendFirst()
	c.sendAgain()
	c.rcv.release(1)
	require.NoError(t, <-c.second)
	state, attempts, _ := c.row()
	require.Equal(t, []any{"failed", webhooks.MaxAttempts + 1}, []any{state, attempts},
		"the later send's failure, past the last attempt, ends the delivery failed")
	c.rcv.release(0)
	require.NoError(t, <-c.first)
	requireDeliveredOK(t, c.env, c.ws.Key, c.hook)
}

// A superseded send's late 2xx ends the delivery delivered while the later
// send is still in flight; a retry of it then waits for that send, as for
// any send in flight (sqlRetryDeliveries): the 2xx's record cleared the
// later claim's hold, and the retry made the delivery due at once, so the
// next pass sent it a third time beside the second send (webhooks review).
// Not parallel: its passes sweep the package's shared deliveries.
func TestARetryAfterASupersededSends2xxWaitsForTheLaterSend(t *testing.T) {
	c := newSupersededCaseAnswering(t, [2]int{http.StatusOK, http.StatusInternalServerError})
	ctx := context.Background()
	c.sendFirst()
	c.sendAgain()
	c.rcv.release(0)
	require.NoError(t, <-c.first)
	requireDeliveredOK(t, c.env, c.ws.Key, c.hook)
	c.retry()
	state, attempts, next := c.row()
	require.Equal(t, []any{"pending", 0}, []any{state, attempts})
	require.True(t, next.Equal(c.claimed), "due once the later send's claim lapses: %s, want %s", next, c.claimed)
	_, err := c.env.App.Server.Webhooks.Deliver(ctx, c.clk.Now())
	require.NoError(t, err)
	require.EqualValues(t, 2, c.rcv.hits.Load(), "not sent again while the later send is in flight")

	// The later send's failure is recorded, due at once (the retry's
	// attempts): sent again, by that send's pass (its next round) or the
	// next, once (the receiver answers 418 now).
	c.rcv.release(1)
	require.NoError(t, <-c.second)
	_, err = c.env.App.Server.Webhooks.Deliver(ctx, c.clk.Now())
	require.NoError(t, err)
	require.EqualValues(t, 3, c.rcv.hits.Load())
	state, attempts, _ = c.row()
	require.Equal(t, []any{"pending", 1}, []any{state, attempts})
}

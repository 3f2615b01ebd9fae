package webhooks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/sweep"
	"github.com/getratchet/ratchet/lib/webhooks"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// Hammers of the sweeper's delivery invariants: several instances of the
// server over the package database (as the local loop, the cron route and
// the Lambda schedule may overlap), their passes released together
// (apitest.StartTogether), against a receiver that counts each send by
// webhook and event id. They sweep the package's shared outbox, so none is
// parallel (see TestMain).

// tally is a receiver that counts the sends it is given by webhook (the
// path the webhook was subscribed with) and event id, answering each with
// status(the request, event id, sends of it so far, this one included):
// hangUp closes the connection without an answer, and a 3xx redirects to
// redirect when it is set. It also counts the sends of one delivery (a
// webhook's of an event) in flight at once, and the sends that arrived
// once late() is true.
type tally struct {
	*httptest.Server
	status   func(req *http.Request, event string, n int) int
	late     func() bool
	redirect string

	mu          sync.Mutex
	hits        map[string]map[string]int // path → event id → sends
	lateHits    map[string]map[string]int // the same, arrived once late()
	inFlight    map[string]int            // "path event id" → sends in flight
	overlapping []string                  // deliveries ("path event id") sent again while a send of them was in flight
	log         []tallySend               // every send, in the order they arrived (take)
	arrived     atomic.Int32
}

// tallySend is one send a tally was given: the path, its signature
// header and its body.
type tallySend struct {
	path, signature string
	body            []byte
}

// take answers the sends given since the last take.
func (r *tally) take() []tallySend {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

func newTally(t *testing.T, status func(req *http.Request, event string, n int) int) *tally {
	r := &tally{status: status, late: func() bool { return false }, hits: map[string]map[string]int{},
		lateHits: map[string]map[string]int{}, inFlight: map[string]int{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var ev struct{ ID string }
		if err := json.Unmarshal(body, &ev); err != nil || ev.ID == "" || ev.ID != req.Header.Get("Ratchet-Event-Id") {
			t.Errorf("a send with no event id: %q", body)
		}
		late := r.late()
		r.mu.Lock()
		n := r.count(r.hits, req.URL.Path, ev.ID)
		r.log = append(r.log, tallySend{path: req.URL.Path, signature: req.Header.Get("Ratchet-Signature"), body: body})
		if late {
			r.count(r.lateHits, req.URL.Path, ev.ID)
		}
		// By delivery, not by event: two webhooks' deliveries of one event
		// are sent at once by design (a pass sends its deliveries at once,
		// README), and keyed by event alone they read as one sent twice
		// (the fan-out hammer failed so under load, every send counted once).
		delivery := req.URL.Path + " " + ev.ID
		if r.inFlight[delivery]++; r.inFlight[delivery] > 1 {
			r.overlapping = append(r.overlapping, delivery)
		}
		r.mu.Unlock()
		r.arrived.Add(1)
		switch code := r.status(req, ev.ID, n); {
		case code == hangUp:
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		default:
			if code/100 == 3 && r.redirect != "" {
				w.Header().Set("Location", r.redirect)
			}
			w.WriteHeader(code)
		}
		r.mu.Lock()
		r.inFlight[delivery]--
		r.mu.Unlock()
	}))
	t.Cleanup(r.Close)
	return r
}

// hangUp is a tally's status for a send it closes the connection on,
// answering nothing.
const hangUp = -1

// count adds a send to m and answers the sends of path's event so far.
func (r *tally) count(m map[string]map[string]int, path, event string) int {
	if m[path] == nil {
		m[path] = map[string]int{}
	}
	m[path][event]++
	return m[path][event]
}

// sends answers the sends of each event to the webhook at path (of every
// send, or of those that arrived once late() when late).
func (r *tally) sends(path string, late bool) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	from := r.hits
	if late {
		from = r.lateHits
	}
	out := map[string]int{}
	for ev, n := range from[path] {
		out[ev] = n
	}
	return out
}

// miscounted answers the events whose sends are not as want says (an event
// left out of want is to be sent no time), as "event: got n, want m", the
// first five of them and how many in all.
func miscounted(want, got map[string]int) []string {
	out := allMiscounted(want, got)
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("(%d events in all)", len(out)))
	}
	return out
}

func allMiscounted(want, got map[string]int) []string {
	var out []string
	for ev, n := range got {
		if want[ev] != n {
			out = append(out, fmt.Sprintf("%s: got %d, want %d", ev, n, want[ev]))
		}
	}
	for ev, n := range want {
		if _, ok := got[ev]; !ok && n != 0 {
			out = append(out, fmt.Sprintf("%s: got 0, want %d", ev, n))
		}
	}
	return out
}

// each wants every event of lists sent n times.
func each(n int, lists ...[]string) map[string]int {
	out := map[string]int{}
	for _, list := range lists {
		for _, ev := range list {
			out[ev] = n
		}
	}
	return out
}

// always answers status to every send.
func always(status int) func(*http.Request, string, int) int {
	return func(*http.Request, string, int) int { return status }
}

// instances answers env and n-1 more instances of the server over the
// package database, on the same clock, as several sweepers would run.
func instances(t *testing.T, env *apitest.Env, clk *apitest.Clock, n int) []*apitest.Env {
	out := []*apitest.Env{env}
	for len(out) < n {
		out = append(out, apitest.Start(t, apitest.WithNow(clk.Now),
			apitest.WithConfig(func(cfg *config.Config) { cfg.WebhookAllowPrivateNetworks = true })))
	}
	return out
}

// hammered signs up a workspace whose outbox, events and deliveries, is
// deleted when the test ends: a hammer records thousands of events, which
// the package's later tests would otherwise find in their retention's
// batches before their own.
func hammered(t *testing.T, env *apitest.Env) apitest.Workspace {
	ws := env.Signup()
	t.Cleanup(func() {
		_, err := env.App.Pool.Exec(context.Background(), `DELETE FROM webhook_deliveries WHERE workspace_id = $1`, ws.ID)
		require.NoError(t, err)
		_, err = env.App.Pool.Exec(context.Background(), `DELETE FROM events WHERE workspace_id = $1`, ws.ID)
		require.NoError(t, err)
	})
	return ws
}

// passesTogether runs n sweeper passes released together, taking turns
// among the instances, and requires each to have failed no task.
func passesTogether(t *testing.T, envs []*apitest.Env, n int) []sweep.Result {
	t.Helper()
	res := make([]sweep.Result, n)
	apitest.StartTogether(n, func(i int) { res[i] = envs[i%len(envs)].App.Sweeper.RunOnce(context.Background()) })
	for i, r := range res {
		require.Empty(t, r.Errors, "pass %d", i)
	}
	return res
}

// deliveriesOf answers webhook id's deliveries by event id: state,
// attempts and last_error ("" for none).
func deliveriesOf(t *testing.T, env *apitest.Env, id string) map[string]deliveryRow {
	t.Helper()
	rows, err := env.App.Pool.Query(context.Background(), `SELECT event_id, state, attempts, coalesce(last_error, '')
		FROM webhook_deliveries WHERE webhook_id = $1`, id)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]deliveryRow{}
	for rows.Next() {
		var ev string
		var d deliveryRow
		require.NoError(t, rows.Scan(&ev, &d.State, &d.Attempts, &d.LastError))
		_, twice := out[ev]
		require.False(t, twice, "event %s fanned out twice to %s", ev, id)
		out[ev] = d
	}
	require.NoError(t, rows.Err())
	return out
}

type deliveryRow struct {
	State     string
	Attempts  int
	LastError string
}

// recordMany records n events of type typ in workspace ws, answering their
// event ids.
func recordMany(t *testing.T, env *apitest.Env, clk *apitest.Clock, ws, typ string, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		out[i] = eventOf(t, env, record(t, env, ws, typ, clk.Now()))
	}
	return out
}

// Sweepers of three instances, six passes released together and six more,
// fan each event out into exactly one delivery per matching live
// subscription (none to one that does not subscribe to its type, none to
// a deleted one, none to one disabled before it), and send each delivery
// once, recording it once: delivered after one attempt.
func TestSweepersRacingFanOutAndSendEachDeliveryOnce(t *testing.T) {
	env, clk := start(t, true)
	envs := instances(t, env, clk, 3)
	ws := hammered(t, env)
	rcv := newTally(t, always(http.StatusOK))
	hook := func(path string, types ...string) string {
		return env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
			map[string]any{"url": rcv.URL + path, "events": types}).JSON()["id"].(string)
	}
	a, b := hook("/a", events.RunFinished), hook("/b", events.RunFinished, events.StepExhausted)
	c := hook("/c", events.StepExhausted)
	deleted, disabled := hook("/deleted", events.RunFinished), hook("/disabled", events.RunFinished)
	env.Must(http.StatusOK, "DELETE", "/api/v1/webhooks/"+deleted, ws.Key, nil)
	env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+disabled, ws.Key, map[string]any{"disabled": true})
	dueElsewhere(t, env, clk) // another test's event, fanned out in these passes
	finished := recordMany(t, env, clk, ws.ID, events.RunFinished, 120)
	exhausted := recordMany(t, env, clk, ws.ID, events.StepExhausted, 30)

	counted := 0
	for range 2 {
		for _, r := range passesTogether(t, envs, 6) {
			counted += r.Changed["webhooks.dispatch"]
		}
	}
	// Counted against the rows the passes fanned out, of every workspace
	// (what earlier tests left, and what the passes' other tasks recorded,
	// a lapse of theirs, went out with them: counted before the passes, a
	// lapse recorded in one was one too many).
	done, left := dispatched(t, env, ws.ID)
	require.Equal(t, []int{len(finished) + len(exhausted), 0}, []int{done, left})
	require.Equal(t, dispatchedAt(t, env, clk.Now()), counted, "each event fanned out by one pass")
	for _, w := range []struct {
		id, path string
		want     map[string]int
	}{{a, "/a", each(1, finished)}, {b, "/b", each(1, finished, exhausted)}, {c, "/c", each(1, exhausted)},
		{deleted, "/deleted", map[string]int{}}, {disabled, "/disabled", map[string]int{}}} {
		require.Empty(t, miscounted(w.want, rcv.sends(w.path, false)), "sends to %s", w.path)
		got := deliveriesOf(t, env, w.id)
		require.Len(t, got, len(w.want), "deliveries of %s", w.path)
		for ev, d := range got {
			require.Equal(t, deliveryRow{State: "delivered", Attempts: 1}, d, "%s's delivery of %s", w.path, ev)
		}
	}
	require.Empty(t, rcv.overlapping)
}

// A failing receiver is sent each delivery exactly MaxAttempts times, by
// three sweepers whose passes are released together each time its retry
// falls due: no attempt is sent twice, none is lost, and the delivery ends
// failed with MaxAttempts attempts, never more. Its retries are made due
// by moving their time, not the clock, so that other tests' deliveries
// left in the outbox do not fall due.
func TestSweepersNeverSendMoreThanMaxAttempts(t *testing.T) {
	env, clk := start(t, true)
	envs := instances(t, env, clk, 3)
	ws := hammered(t, env)
	rcv := newTally(t, always(http.StatusServiceUnavailable))
	id := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": rcv.URL + "/failing", "events": []string{events.RunFinished}}).JSON()["id"].(string)
	evs := recordMany(t, env, clk, ws.ID, events.RunFinished, 50)
	ctx := context.Background()
	_, err := env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
	require.NoError(t, err)

	for range webhooks.MaxAttempts + 2 {
		errs := make([]error, 3)
		apitest.StartTogether(3, func(i int) { _, errs[i] = envs[i].App.Server.Webhooks.Deliver(ctx, clk.Now()) })
		for _, err := range errs {
			require.NoError(t, err)
		}
		_, err := env.App.Pool.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = $2
			WHERE webhook_id = $1 AND state = 'pending'`, id, clk.Now())
		require.NoError(t, err)
	}
	require.Empty(t, miscounted(each(webhooks.MaxAttempts, evs), rcv.sends("/failing", false)))
	for ev, d := range deliveriesOf(t, env, id) {
		require.Equal(t, deliveryRow{State: "failed", Attempts: webhooks.MaxAttempts, LastError: "non-2xx response"}, d, ev)
	}
	require.Empty(t, rcv.overlapping)
}

// claimedNow answers which of webhook id's deliveries, by event id, have
// been claimed (an attempt counted), once every claim holding one of them
// has committed: read FOR UPDATE, in id order as the other lockers lock
// them. Read after a change answered, it holds every delivery claimed
// before the answer.
func claimedNow(t *testing.T, env *apitest.Env, id string) map[string]bool {
	t.Helper()
	ctx := context.Background()
	tx, err := env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, `SELECT event_id, attempts > 0 FROM webhook_deliveries WHERE webhook_id = $1
		ORDER BY id FOR UPDATE`, id)
	require.NoError(t, err)
	out := map[string]bool{}
	for rows.Next() {
		var ev string
		var claimed bool
		require.NoError(t, rows.Scan(&ev, &claimed))
		out[ev] = claimed
	}
	require.NoError(t, rows.Err())
	require.NoError(t, tx.Commit(ctx))
	return out
}

// A DELETE, or a PATCH taking the event type out or disabling the
// subscription, racing three sweepers' passes that send its deliveries
// (it is sent once its receiver has been sent a few, or many): after its answer
// nothing is sent but the deliveries claimed before it (at most once
// each), which are recorded as their sends ended (delivered: the receiver
// answers 200). Every delivery pending at the answer is never sent: it
// ends failed (webhook deleted, event type unsubscribed) or, disabled,
// stays pending, its attempts untouched, and is sent once when the
// subscription is enabled again.
func TestAChangeRacingPassesSendsNothingPendingOnceAnswered(t *testing.T) {
	ended := map[string]deliveryRow{"delete": {State: "failed", LastError: "webhook deleted"},
		"unsubscribe": {State: "failed", LastError: "event type unsubscribed"}, "disable": {State: "pending"}}
	for _, run := range []struct {
		change string
		after  int32 // the change is sent once the receiver has had this many sends
	}{{"delete", 15}, {"delete", 100}, {"unsubscribe", 15}, {"unsubscribe", 100}, {"disable", 15}, {"disable", 100}} {
		change := run.change
		t.Run(fmt.Sprintf("%s after %d sends", change, run.after), func(t *testing.T) {
			env, clk := start(t, true)
			envs := instances(t, env, clk, 3)
			ws := hammered(t, env)
			ctx := context.Background()
			var answered atomic.Bool
			var arrivals atomic.Int32
			trigger := make(chan struct{})
			rcv := newTally(t, func(*http.Request, string, int) int {
				if arrivals.Add(1) == run.after {
					close(trigger)
				}
				return http.StatusOK
			})
			rcv.late = answered.Load
			id := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key, map[string]any{"url": rcv.URL + "/" + change,
				"events": []string{events.RunFinished, events.CircuitTripped}}).JSON()["id"].(string)
			evs := recordMany(t, env, clk, ws.ID, events.RunFinished, 200)
			_, err := env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
			require.NoError(t, err)

			var claimed map[string]bool
			errs := make([]error, 3)
			apitest.StartTogether(4, func(i int) {
				if i < 3 {
					_, errs[i] = envs[i].App.Server.Webhooks.Deliver(ctx, clk.Now())
					return
				}
				<-trigger
				path := "/api/v1/webhooks/" + id
				switch change {
				case "delete":
					env.Must(http.StatusOK, "DELETE", path, ws.Key, nil)
				case "unsubscribe":
					env.Must(http.StatusOK, "PATCH", path, ws.Key, map[string]any{"events": []string{events.CircuitTripped}})
				case "disable":
					env.Must(http.StatusOK, "PATCH", path, ws.Key, map[string]any{"disabled": true})
				}
				answered.Store(true)
				claimed = claimedNow(t, env, id)
			})
			for _, err := range errs {
				require.NoError(t, err)
			}
			_, err = env.App.Server.Webhooks.Deliver(ctx, clk.Now()) // a later pass sends none of them either
			require.NoError(t, err)

			sent := rcv.sends("/"+change, false)
			for ev := range rcv.sends("/"+change, true) {
				require.True(t, claimed[ev], "%s sent after the answer, not claimed before it", ev)
			}
			for ev, n := range sent {
				require.Equal(t, 1, n, "%s sent more than once", ev)
			}
			got := deliveriesOf(t, env, id)
			require.Len(t, got, len(evs))
			for _, ev := range evs {
				want := ended[change]
				if sent[ev] == 1 {
					want = deliveryRow{State: "delivered", Attempts: 1}
				}
				require.Equal(t, want, got[ev], "delivery of %s", ev)
			}
			t.Logf("%d sent (%d after the answer), %d never", len(sent), len(rcv.sends("/"+change, true)), len(evs)-len(sent))
			require.Empty(t, rcv.overlapping)
			if change != "disable" {
				return
			}
			env.Must(http.StatusOK, "PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"disabled": false})
			passesTogether(t, envs, 3)
			require.Empty(t, miscounted(each(1, evs), rcv.sends("/"+change, false)), "the held ones sent once enabled")
			for ev, d := range deliveriesOf(t, env, id) {
				require.Equal(t, deliveryRow{State: "delivered", Attempts: 1}, d, ev)
			}
		})
	}
}

// broadcast wakes every waiter at each Ping.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func newBroadcast() *broadcast { return &broadcast{ch: make(chan struct{})} }

// Next answers a channel closed at the next Ping.
func (b *broadcast) Next() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcast) Ping() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}

// Retries of every delivery racing three sweepers' passes that send them:
// each delivery's last attempt (attempts at MaxAttempts-1 before) is sent
// and refused, and a retry is answered while it is in flight (the receiver
// holds it until one is). A retry never answers a delivery pending with no
// attempt left: its last attempt in flight gets its attempts back, so that
// attempt, refused, is not the end, and every delivery ends delivered. No
// delivery is sent while a send of it is in flight (a retry keeps a
// pending delivery's schedule, its claim's included), each retry answers
// 200, and no delivery ever has more than MaxAttempts attempts.
func TestRetriesRacingPassesKeepEachDeliveryGoing(t *testing.T) {
	env, clk := start(t, true)
	envs := instances(t, env, clk, 3)
	ws := hammered(t, env)
	ctx := context.Background()
	retried := newBroadcast()
	rcv := newTally(t, nil)
	var lastAttempts atomic.Int32 // sent so far
	rcv.status = func(req *http.Request, _ string, n int) int {
		if n > 1 {
			return http.StatusOK
		}
		lastAttempts.Add(1)
		select { // the last attempt's send, held until a retry is answered
		case <-retried.Next():
		case <-req.Context().Done():
		}
		return http.StatusInternalServerError
	}
	id := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": rcv.URL + "/retried", "events": []string{events.RunFinished}}).JSON()["id"].(string)
	evs := recordMany(t, env, clk, ws.ID, events.RunFinished, 40)
	_, err := env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
	require.NoError(t, err)
	_, err = env.App.Pool.Exec(ctx, `UPDATE webhook_deliveries SET attempts = $2 WHERE webhook_id = $1`, id,
		webhooks.MaxAttempts-1)
	require.NoError(t, err)
	var dlvs []string
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT array_agg(id) FROM webhook_deliveries WHERE webhook_id = $1`,
		id).Scan(&dlvs))

	const passes, retriers = 3, 2
	var passing atomic.Int32
	passing.Store(passes)
	errs := make([]error, passes)
	var mu sync.Mutex
	var noneLeft []string // deliveries a retry answered pending with no attempt left
	apitest.StartTogether(passes+retriers, func(i int) {
		if i < passes {
			// Passes again until every last attempt went out (a claim
			// passes over the rows a retry holds), while the retries go on.
			defer passing.Add(-1)
			for range 50 {
				if _, errs[i] = envs[i].App.Server.Webhooks.Deliver(ctx, clk.Now()); errs[i] != nil ||
					lastAttempts.Load() == int32(len(evs)) {
					return
				}
			}
			return
		}
		for n := 0; passing.Load() > 0 && n < 1000; n++ {
			r := retry(envs[i%len(envs)], ws.Key, id, dlvs...)
			var out webhooks.Retried
			if r.Status != http.StatusOK || json.Unmarshal(r.Body, &out) != nil {
				t.Errorf("retry: %d %s", r.Status, r.Body)
				return
			}
			retried.Ping()
			mu.Lock()
			for _, d := range out.Deliveries {
				if d.State == "pending" && d.Attempts >= webhooks.MaxAttempts {
					noneLeft = append(noneLeft, d.ID)
				}
			}
			mu.Unlock()
		}
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	retried.Ping()
	require.EqualValues(t, len(evs), lastAttempts.Load(), "every last attempt sent while retries raced it")
	_, err = env.App.Server.Webhooks.Deliver(ctx, clk.Now()) // what the last retries made pending
	require.NoError(t, err)

	require.Empty(t, noneLeft, "answered pending with no attempt left")
	require.Empty(t, rcv.overlapping, "sent while a send of it was in flight")
	sent := rcv.sends("/retried", false)
	for ev, d := range deliveriesOf(t, env, id) {
		require.Equal(t, "delivered", d.State, "%s (sent %d times)", ev, sent[ev])
		require.LessOrEqual(t, d.Attempts, webhooks.MaxAttempts, ev)
		require.GreaterOrEqual(t, sent[ev], 2, "%s: its last attempt refused, then sent again", ev)
	}
	require.Len(t, sent, len(evs))
}

// A surge burst of new keys from two instances, racing the sweepers of
// three, trips the breaker once: one circuit.tripped, fanned out into one
// delivery per subscription to it, each sent once.
func TestASurgeBurstSendsOneCircuitTrippedPerSubscription(t *testing.T) {
	env, clk := start(t, true)
	envs := instances(t, env, clk, 3)
	ws := hammered(t, env)
	rcv := newTally(t, always(http.StatusOK))
	paths := []string{"/t1", "/t2", "/t3"}
	hooks := make([]string, len(paths))
	for i, path := range paths {
		hooks[i] = env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key, map[string]any{"url": rcv.URL + path,
			"events": []string{events.CircuitTripped}}).JSON()["id"].(string)
	}
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/sms.send", ws.Key,
		map[string]any{"surge_per_hour": 10, "surge_action": "deny"})

	const begins, passes = 40, 4
	statuses := make([]int, begins)
	results := make([]sweep.Result, passes)
	apitest.StartTogether(begins+passes, func(i int) {
		if i >= begins {
			results[i-begins] = envs[i%len(envs)].App.Sweeper.RunOnce(context.Background())
			return
		}
		statuses[i] = envs[i%2].Do("POST", "/api/v1/effects/begin", ws.Key, map[string]any{"effect_type": "sms.send",
			"idempotency_key": fmt.Sprintf("burst-%d", i), "payload": map[string]any{"n": i}}).Status
	})
	for i, r := range results {
		require.Empty(t, r.Errors, "pass %d", i)
	}
	passesTogether(t, envs, 3) // the events recorded after the passes' fan-outs
	var tripped []string
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(id), '{}') FROM events
		WHERE workspace_id = $1 AND type = $2`, ws.ID, events.CircuitTripped).Scan(&tripped))
	require.Len(t, tripped, 1, "one trip (begins answered %v)", statuses)
	for i, path := range paths {
		require.Empty(t, miscounted(map[string]int{tripped[0]: 1}, rcv.sends(path, false)), "sends to %s", path)
		require.Equal(t, map[string]deliveryRow{tripped[0]: {State: "delivered", Attempts: 1}},
			deliveriesOf(t, env, hooks[i]))
	}
}

// Rotations of a subscription's secret (replacing the previous one, which
// signs on beside the new one or stops at once) and PATCHes of its URL,
// each released together with three instances' passes that send its
// deliveries: every send is signed as of the subscription's state before
// the change or after it, never a mixture (the current secret's v1 first,
// then the previous one's while it signs, at most two), and goes to the URL
// before or after; every pass started once both changes answered sends to
// the new URL only, signed as the rotation's answer says (its secret, and
// the one it replaced while that signs). Each event is sent once. (The
// passes' fan-out runs before: their claims then meet the changes.)
func TestRotationsAndURLChangesRacingPassesSignAsAnswered(t *testing.T) {
	env, clk := start(t, true)
	envs := instances(t, env, clk, 3)
	ws := hammered(t, env)
	rcv := newTally(t, always(http.StatusOK))
	created := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": rcv.URL + "/u0", "events": []string{events.RunFinished}}).JSON()
	id := created["id"].(string)
	// signers is the subscription's state: the secrets that sign, in order.
	type state struct {
		path    string
		signers []string
	}
	now := clk.Now()
	// check requires each send to be one of states' (path and signature).
	check := func(sends []tallySend, states ...state) map[string]int {
		t.Helper()
		got := map[string]int{}
		for _, s := range sends {
			var ev struct{ ID string }
			require.NoError(t, json.Unmarshal(s.body, &ev))
			got[ev.ID]++
			ok := false
			for _, st := range states {
				ok = ok || (s.path == st.path && s.signature == webhooks.Sign(now, s.body, st.signers...))
			}
			require.True(t, ok, "send of %s to %s signed %q: none of %v", ev.ID, s.path, s.signature, states)
		}
		return got
	}
	sent := map[string]int{}
	add := func(got map[string]int) {
		for ev, n := range got {
			sent[ev] += n
		}
	}
	var recorded []string
	was := state{path: "/u0", signers: []string{created["secret"].(string)}}
	for round := 1; round <= 6; round++ {
		recorded = append(recorded, recordMany(t, env, clk, ws.ID, events.RunFinished, 40)...)
		dispatchAll(t, env, now)
		ttl := []int{0, 3600}[round%2]
		path := fmt.Sprintf("/u%d", round)
		var rotated, patched *apitest.Response
		apitest.StartTogether(5, func(i int) {
			switch i {
			case 3:
				rotated = env.Do("POST", "/api/v1/webhooks/"+id+"/rotate-secret", ws.Key,
					map[string]any{"previous_secret_expires_in_seconds": ttl, "replace_previous": true})
			case 4:
				patched = env.Do("PATCH", "/api/v1/webhooks/"+id, ws.Key, map[string]any{"url": rcv.URL + path})
			default: // the passes' delivery, fanned out before
				deliverAt(t, envs[i], now)
			}
		})
		require.Equal(t, http.StatusOK, rotated.Status, "%s", rotated.Body)
		require.Equal(t, http.StatusOK, patched.Status, "%s", patched.Body)
		is := state{path: path, signers: []string{rotated.JSON()["secret"].(string)}}
		if ttl > 0 {
			is.signers = append(is.signers, was.signers[0])
		}
		// Racing the changes: as before either, or after it (one may
		// have committed before a claim, the other after it).
		mixed := []state{was, is, {path: path, signers: was.signers}, {path: was.path, signers: is.signers}}
		add(check(rcv.take(), mixed...))
		// Once both answered: as they say.
		recorded = append(recorded, recordMany(t, env, clk, ws.ID, events.RunFinished, 5)...)
		dispatchAll(t, env, now)
		apitest.StartTogether(len(envs), func(i int) { deliverAt(t, envs[i], now) })
		add(check(rcv.take(), is))
		was = is
	}
	require.Empty(t, miscounted(each(1, recorded), sent), "each event sent once")
	require.Empty(t, rcv.overlapping)
}

// deliverAt runs env's delivery pass at now (from any goroutine).
func deliverAt(t *testing.T, env *apitest.Env, now time.Time) {
	if _, err := env.App.Server.Webhooks.Deliver(context.Background(), now); err != nil {
		t.Errorf("delivery pass: %v", err)
	}
}

// A flaky receiver, hammered by three sweepers whose passes are released
// together each time its retries fall due: each event's first sends fail
// (0 to 3 of them, by event), in turn a 500, a hang-up without an answer
// and a redirect to a path of its own, which is never followed; the next is
// answered 204. Each event is sent exactly as often as that takes (no
// attempt sent twice, or twice at once, none lost, whatever the failures
// recorded together), its delivery ends delivered with as many attempts,
// and every send, whichever sweeper made it, verifies with the Go SDK
// (VerifyWebhookAt) over the bytes received: the server's signature and
// the SDK's check agree on every live body, not just the shared vectors.
func TestSweepersAgainstAFlakyReceiverSendEachAttemptOnce(t *testing.T) {
	env, clk := start(t, true)
	envs := instances(t, env, clk, 3)
	ws := hammered(t, env)
	ctx := context.Background()
	failures := func(ev string) int {
		h := fnv.New32a()
		h.Write([]byte(ev))
		return int(h.Sum32() % 4)
	}
	rcv := newTally(t, func(_ *http.Request, ev string, n int) int {
		if n > failures(ev) {
			return http.StatusNoContent
		}
		return []int{http.StatusInternalServerError, hangUp, http.StatusFound}[(n-1)%3]
	})
	rcv.redirect = rcv.URL + "/followed"
	created := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": rcv.URL + "/flaky", "events": []string{events.RunFinished}}).JSON()
	id, secret := created["id"].(string), created["secret"].(string)
	evs := recordMany(t, env, clk, ws.ID, events.RunFinished, 60)
	_, err := env.App.Server.Webhooks.Dispatch(ctx, clk.Now())
	require.NoError(t, err)
	want, most := map[string]int{}, 0
	for _, ev := range evs {
		want[ev] = failures(ev) + 1
		most = max(most, want[ev])
	}
	require.Equal(t, 4, most, "some event fails each way")

	for range most + 1 {
		errs := make([]error, len(envs))
		apitest.StartTogether(len(envs), func(i int) { _, errs[i] = envs[i].App.Server.Webhooks.Deliver(ctx, clk.Now()) })
		for _, err := range errs {
			require.NoError(t, err)
		}
		// The retries made due by moving their time, not the clock, so
		// that other tests' deliveries left in the outbox do not fall due.
		_, err := env.App.Pool.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = $2
			WHERE webhook_id = $1 AND state = 'pending'`, id, clk.Now())
		require.NoError(t, err)
	}
	require.Empty(t, miscounted(want, rcv.sends("/flaky", false)))
	require.Empty(t, rcv.sends("/followed", false), "a redirect followed")
	require.Empty(t, rcv.overlapping)
	got := deliveriesOf(t, env, id)
	require.Len(t, got, len(evs))
	for ev, d := range got {
		require.Equal(t, deliveryRow{State: "delivered", Attempts: want[ev]}, d, ev)
	}
	sends := rcv.take()
	require.NotEmpty(t, sends)
	for _, s := range sends {
		if s.path != "/flaky" {
			continue
		}
		_, err := ratchet.VerifyWebhookAt(secret, s.signature, s.body, 0, clk.Now())
		require.NoError(t, err, "%s: %s", s.signature, s.body)
	}
}

// Rotations of one subscription under way together, as clients retrying
// under keys of their own may send them: without replace_previous one
// rotates and every other is refused (409 invalid_state, naming until when
// the winner's previous secret signs), so no secret an answer showed is
// lost; the next delivery is signed with the winner's secret, then the
// first. With replace_previous each rotates in turn: the delivery is
// signed with two of the secrets they answered (the last to commit, then
// the one before it), never with the first, which the second replaced.
func TestRotationsRacingEachOtherLoseNoAnsweredSecret(t *testing.T) {
	env, clk := start(t, true)
	ws := env.Signup()
	rcv := newReceiver(t)
	id, first := subscribe(t, env, ws.Key, rcv.URL)
	// Each rotation is sent while a transaction holds the subscription's
	// row, and waits for it, so that all of them are under way together
	// (as of one snapshot) when it ends.
	const racers = 6
	race := func(body any) []*apitest.Response {
		ctx := context.Background()
		tx, err := env.App.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var held int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT FROM webhooks WHERE id = $1 FOR UPDATE) x`,
			id).Scan(&held))
		require.Equal(t, 1, held, "the subscription's row held")
		waits := apitest.NewLockWaits(t, env.App.Pool, apitest.BackendPID(t, tx))
		out := make([]*apitest.Response, racers)
		dones := make([]chan struct{}, racers)
		for i := range racers {
			dones[i] = make(chan struct{})
			go func() {
				defer close(dones[i])
				out[i] = env.Do("POST", "/api/v1/webhooks/"+id+"/rotate-secret", ws.Key, body)
			}()
			waits.Waiting(dones[i], "a rotation waits for the row")
		}
		require.NoError(t, tx.Rollback(ctx))
		for _, done := range dones {
			<-done
		}
		return out
	}

	var winner, until string
	var refused []*apitest.Response
	for _, r := range race(nil) {
		switch r.Status {
		case http.StatusOK:
			require.Empty(t, winner, "a second rotation answered: %s", r.Body)
			winner, until = r.JSON()["secret"].(string), r.JSON()["previous_secret_expires_at"].(string)
		case http.StatusConflict:
			require.Equal(t, "invalid_state", r.ErrorCode(), "%s", r.Body)
			refused = append(refused, r)
		default:
			t.Fatalf("rotation: %d %s", r.Status, r.Body)
		}
	}
	require.NotEmpty(t, winner, "one rotation answered")
	require.Len(t, refused, racers-1)
	for _, r := range refused {
		require.Equal(t, until, r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["previous_secret_expires_at"])
	}
	sig, body := sendOne(t, env, clk, ws.ID, rcv)
	require.Equal(t, []string{winner, first}, signedWith(t, sig, body, winner, first))

	var answered []string
	for _, r := range race(map[string]any{"replace_previous": true}) {
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		answered = append(answered, r.JSON()["secret"].(string))
	}
	sig, body = sendOne(t, env, clk, ws.ID, rcv)
	signers := signedWith(t, sig, body, append([]string{first, winner}, answered...)...)
	require.Len(t, signers, 2, sig)
	for _, s := range signers {
		require.Contains(t, answered, s, "signed by a secret this race answered")
	}
	require.NotEqual(t, signers[0], signers[1])
}

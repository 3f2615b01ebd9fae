package webhooks_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// inFlightReceiver holds every request until release, counting each
// webhook's (its path) and each workspace's requests in flight as they
// arrive and end. over is closed, and why set, the first time a count
// passes its bound; reached(n) is closed once n requests arrived in all.
type inFlightReceiver struct {
	srv     *httptest.Server
	release func()
	over    chan struct{}

	mu        sync.Mutex
	why       string
	workspace map[string]string // path → workspace
	hooks     map[string]int
	spaces    map[string]int
	arrived   int
	waits     map[int]chan struct{}
}

func newInFlightReceiver(t *testing.T, perWebhook, perWorkspace int) *inFlightReceiver {
	held := make(chan struct{})
	var once sync.Once
	r := &inFlightReceiver{release: func() { once.Do(func() { close(held) }) }, over: make(chan struct{}),
		workspace: map[string]string{}, hooks: map[string]int{}, spaces: map[string]int{}, waits: map[int]chan struct{}{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		hook, ws := req.URL.Path, r.workspace[req.URL.Path]
		r.hooks[hook]++
		r.spaces[ws]++
		r.arrived++
		if r.why == "" && (r.hooks[hook] > perWebhook || r.spaces[ws] > perWorkspace) {
			r.why = fmt.Sprintf("%d sends of webhook %s and %d of its workspace in flight", r.hooks[hook], hook, r.spaces[ws])
			close(r.over)
		}
		if c, ok := r.waits[r.arrived]; ok {
			close(c)
			delete(r.waits, r.arrived)
		}
		r.mu.Unlock()
		<-held
		r.mu.Lock()
		r.hooks[hook]--
		r.spaces[ws]--
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.release) // runs first: the handlers return before the server closes
	return r
}

// url names a webhook of workspace ws on the receiver.
func (r *inFlightReceiver) url(ws string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	path := fmt.Sprintf("/hook%d", len(r.workspace))
	r.workspace[path] = ws
	return r.srv.URL + path
}

func (r *inFlightReceiver) reached(n int) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := make(chan struct{})
	if r.arrived >= n {
		close(c)
	} else {
		r.waits[n] = c
	}
	return c
}

func (r *inFlightReceiver) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.arrived
}

func (r *inFlightReceiver) reason() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.why
}

// A webhook's sends in flight are bounded at 20, and a workspace's at 40,
// across every pass and instance, not in each pass alone: a claimed
// delivery read pending, due a minute later like a scheduled retry, so
// each pass counted only its own sends (review: the local server's 8
// detached passes had up to 160 sends of one slow receiver in flight, one
// workspace 320). Two passes run at once against receivers that hold every
// send: one workspace's single webhook gets 20 of its 30 due deliveries
// sent, another workspace's three webhooks 40 of their 90, whichever pass
// claimed them; a third pass then finds every share taken and sends
// nothing. Once the receivers answer, the holds end with their records
// and the passes send the rest, never over the bounds.
func TestPassesTogetherKeepAWebhooksAndAWorkspacesSendsInFlightBounded(t *testing.T) {
	env, clk := start(t, true)
	ctx := context.Background()
	dispatchAll(t, env, clk.Now())
	svc := env.App.Server.Webhooks
	webhooks.SetSendTimeout(svc, time.Hour) // held for as long as the test takes, never cut at 10 s
	r := newInFlightReceiver(t, 20, 40)
	one, many := env.Signup(), env.Signup()
	hook := func(ws apitest.Workspace) {
		env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
			map[string]any{"url": r.url(ws.ID), "events": []string{events.StepExhausted}})
	}
	hook(one)
	for range 3 {
		hook(many)
	}
	for range 30 {
		record(t, env, one.ID, events.StepExhausted, clk.Now())
		record(t, env, many.ID, events.StepExhausted, clk.Now())
	}
	dispatchAll(t, env, clk.Now())

	mine := []string{one.ID, many.ID}
	// claimed counts this test's deliveries claimed so far, and those
	// delivered (a pass sends other tests' due deliveries too: the
	// package's database is shared).
	claimed := func() (n, delivered int) {
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE claims > 0),
			count(*) FILTER (WHERE state = 'delivered' AND held_until IS NULL)
			FROM webhook_deliveries WHERE workspace_id = ANY($1)`, mine).Scan(&n, &delivered))
		return n, delivered
	}
	done := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := svc.Deliver(ctx, clk.Now())
			done <- err
		}()
	}
	select {
	case <-r.reached(60):
	case <-r.over:
		t.Fatal(r.reason())
	}
	// A third pass ends at once, having claimed none of them; one that
	// claimed some would wait for its held sends.
	third := make(chan error, 1)
	go func() {
		_, err := svc.Deliver(ctx, clk.Now())
		third <- err
	}()
	select {
	case err := <-third:
		require.NoError(t, err)
	case <-r.over:
		t.Fatal(r.reason())
	}
	n, _ := claimed()
	require.Equal(t, 60, n, "every share is in flight: the third pass claims none of them")
	require.Equal(t, 60, r.total())

	r.release()
	for range 2 {
		require.NoError(t, <-done)
	}
	require.Empty(t, r.reason())
	_, delivered := claimed()
	require.Equal(t, 120, delivered,
		"the passes sent the rest once the sends ended (their holds ended with their records), each once")
	require.Equal(t, 120, r.total())
}

// A hold past its time is a stopped sweeper's (a crash between the claim
// and the record): it counts as no send in flight, so the webhook's share
// is free again and its deliveries are claimed, those the stopped sweeper
// held included. While the holds are live, another pass sends none of the
// webhook's other due deliveries.
func TestAHoldPastItsTimeIsClaimableAgain(t *testing.T) {
	env, clk := start(t, true)
	ctx := context.Background()
	dispatchAll(t, env, clk.Now())
	rcv := newReceiver(t)
	ws := env.Signup()
	env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": rcv.URL, "events": []string{events.StepExhausted}})
	for range 25 {
		record(t, env, ws.ID, events.StepExhausted, clk.Now())
	}
	dispatchAll(t, env, clk.Now())
	// 20 claimed by a sweeper that stopped before sending them, as its
	// claim left them: due and held a minute on.
	tag, err := env.App.Pool.Exec(ctx, `UPDATE webhook_deliveries SET attempts = 1, claims = 1,
		next_attempt_at = $2::timestamptz + interval '1 minute', held_until = $2::timestamptz + interval '1 minute'
		WHERE id IN (SELECT id FROM webhook_deliveries WHERE workspace_id = $1 ORDER BY id LIMIT 20)`, ws.ID, clk.Now())
	require.NoError(t, err)
	require.EqualValues(t, 20, tag.RowsAffected())

	_, err = env.App.Server.Webhooks.Deliver(ctx, clk.Now())
	require.NoError(t, err)
	require.Zero(t, rcv.count(), "the webhook's 20 sends in flight (held) take its whole share")

	clk.Add(time.Minute + time.Second)
	_, err = env.App.Server.Webhooks.Deliver(ctx, clk.Now())
	require.NoError(t, err)
	require.Equal(t, 25, rcv.count(), "the holds past their time count as none: all 25 sent")
	var again, once int
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE attempts = 2), count(*) FILTER (WHERE attempts = 1)
		FROM webhook_deliveries WHERE workspace_id = $1 AND state = 'delivered' AND held_until IS NULL`, ws.ID).Scan(&again, &once))
	require.Equal(t, []int{20, 5}, []int{again, once},
		"each recorded, its hold ended; the stopped sweeper's claims counted an attempt each")
}

// The claim's count of the sends in flight reads the held deliveries
// alone, whichever way it is planned: among about 66,000 pending ones not
// held (retries scheduled) and 133,000 delivered, 30 held of which 20
// live. With "held_until > $1" as its condition, a generic plan read
// every pending delivery (webhook_deliveries_due_idx), at every claim.
func TestCountingSendsInFlightReadsTheHeldDeliveries(t *testing.T) {
	env, _ := start(t, true)
	ctx := context.Background()
	tx := testpg.Scratch(ctx, t, env.App.Pool, "webhook_deliveries")
	now := time.Now()
	_, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event_id, event_type, state,
		attempts, next_attempt_at, created_at, held_until)
	SELECT 'dlv_' || g, 'whk_' || g % 50, 'ws_' || g % 10, 'evt_' || g, 'run.finished',
		CASE WHEN g % 3 = 0 OR g <= 30 THEN 'pending' ELSE 'delivered' END, 1,
		$1::timestamptz + interval '1 hour', $1::timestamptz,
		CASE WHEN g <= 20 THEN $1::timestamptz + interval '1 minute' WHEN g <= 30 THEN $1::timestamptz - interval '1 hour' END
	FROM generate_series(1, 200000) g`, now)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `ANALYZE webhook_deliveries`)
	require.NoError(t, err)
	for _, mode := range testpg.PlanCacheModes {
		read, nodes, err := testpg.RowsRead(ctx, tx, mode, webhooks.SQLHeldSends, now)
		require.NoError(t, err)
		require.LessOrEqual(t, read["webhook_deliveries"], 30, "%s: %v", mode, nodes)
	}
	var live int
	require.NoError(t, tx.QueryRow(ctx, `SELECT sum(n) FROM (`+webhooks.SQLHeldSends+`) h`, now).Scan(&live))
	require.Equal(t, 20, live, "the live holds counted, not those past their time")
}

// A claim's hold, and the due time it sets, are the database's time, not
// the claiming instance's: with one instance's clock 90 s behind and
// another's 90 s ahead, the second's pass does not send the delivery the
// first holds while its send is in flight. Timed by each instance's own
// clock, the first's minute-long hold had lapsed 30 s before it began by
// the second's, which sent the delivery again beside the first send (db.Clock
// corrects each instance's clock by the database's).
func TestAHoldHoldsWhateverTheInstancesClocksSay(t *testing.T) {
	skewed := func(d time.Duration) *apitest.Env {
		return apitest.Start(t, apitest.WithWall(func() time.Time { return time.Now().Add(d) }),
			apitest.WithConfig(func(cfg *config.Config) { cfg.WebhookAllowPrivateNetworks = true }))
	}
	behind, ahead := skewed(-90*time.Second), skewed(90*time.Second)
	ctx := context.Background()
	srv, hits, unblock := newBlockingReceiver(t)
	ws := behind.Signup()
	id, _ := subscribe(t, behind, ws.Key, srv.URL)
	record(t, behind, ws.ID, events.RunFinished, time.Now())
	first := make(chan struct{})
	go func() {
		defer close(first)
		behind.App.Sweeper.RunOnce(ctx)
	}()
	<-hits.reached(1)

	second := make(chan struct{})
	go func() {
		defer close(second)
		ahead.App.Sweeper.RunOnce(ctx)
	}()
	select {
	case <-second:
	case <-hits.reached(2):
		t.Fatal("sent again by the instance ahead while the first send was in flight")
	}
	unblock()
	<-first
	got := deliveries(t, behind, ws.Key, id)
	require.Len(t, got, 1)
	require.Equal(t, "delivered", got[0]["state"])
	require.EqualValues(t, 1, got[0]["attempts"])
	require.EqualValues(t, 1, hits.Load())
}

package webhooks_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// countUpdates counts, from now on, the statements that update deliveries
// of webhook hook (a statement trigger, dropped when the test ends), and
// answers a read of the count and of the rows they updated.
func countUpdates(t *testing.T, env *apitest.Env, hook string) func() (statements, rows int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, apitest.DatabaseURL(t))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := conn.Exec(context.Background(), `
			DROP TRIGGER IF EXISTS count_delivery_updates ON webhook_deliveries;
			DROP FUNCTION IF EXISTS count_delivery_updates();
			DROP TABLE IF EXISTS counted_delivery_updates;`)
		require.NoError(t, err)
		conn.Close(context.Background())
	})
	_, err = conn.Exec(ctx, `
		CREATE TABLE counted_delivery_updates (rows int NOT NULL);
		CREATE FUNCTION count_delivery_updates() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		    INSERT INTO counted_delivery_updates
		    SELECT count(*) FROM updated WHERE webhook_id = TG_ARGV[0] HAVING count(*) > 0;
		    RETURN NULL;
		END $$;
		CREATE TRIGGER count_delivery_updates AFTER UPDATE ON webhook_deliveries
		    REFERENCING NEW TABLE AS updated FOR EACH STATEMENT
		    EXECUTE FUNCTION count_delivery_updates('`+hook+`');`)
	require.NoError(t, err)
	return func() (statements, rows int) {
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(rows), 0)
			FROM counted_delivery_updates`).Scan(&statements, &rows))
		return statements, rows
	}
}

// deliverAside runs a delivery pass at at, aside: the channel answers its
// error once it ends.
func deliverAside(env *apitest.Env, at time.Time) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := env.App.Server.Webhooks.Deliver(context.Background(), at)
		done <- err
	}()
	return done
}

// sendsInFlight subscribes url (its receiver counting requests in hits)
// in a new workspace to n run.finished events recorded for it, and runs a
// pass aside that sends them, once all n are in flight.
func sendsInFlight(t *testing.T, env *apitest.Env, clk *apitest.Clock, url string, hits *atomic.Int32,
	n int) (hook string, done <-chan error) {
	t.Helper()
	dispatchAll(t, env, clk.Now())
	ws := env.Signup()
	hook, _ = subscribe(t, env, ws.Key, url)
	for range n {
		record(t, env, ws.ID, events.RunFinished, clk.Now())
	}
	dispatchAll(t, env, clk.Now())
	done = deliverAside(env, clk.Now())
	require.Eventually(t, func() bool { return hits.Load() == int32(n) }, 30*time.Second, 10*time.Millisecond,
		"every send is in flight")
	return hook, done
}

// A round's sends that end together are recorded together: one statement
// (and one turn on the pass's share of the pool) for their outcomes, not
// one each (a round of 100 failing sends took 100 statements and
// connection checkouts). The outcomes wait for every send of the pass here
// (an hour's recordWait), so the count does not hang on timing: 20 sends
// (a webhook's share of a round), one statement.
func TestARoundsOutcomesAreRecordedInOneStatement(t *testing.T) {
	const sends = 20
	env, clk := start(t, true)
	webhooks.SetRecordWait(env.App.Server.Webhooks, time.Hour)
	ctx := context.Background()
	srv, _, hits, release := newHeldReceiver(t, http.StatusInternalServerError)
	hook, done := sendsInFlight(t, env, clk, srv.URL, hits, sends)
	counted := countUpdates(t, env, hook) // the claim is done: what updates them from now on records them
	release()
	require.NoError(t, <-done)
	statements, rows := counted()
	require.Equal(t, []int{1, sends}, []int{statements, rows}, "the outcomes are recorded in one statement")
	var recorded int
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries
		WHERE webhook_id = $1 AND state = 'pending' AND attempts = 1 AND last_status_code = 500
		  AND last_error = 'non-2xx response' AND next_attempt_at > $2`, hook, clk.Now()).Scan(&recorded))
	require.Equal(t, sends, recorded, "each one as its own statement recorded it")
}

// An outcome waits for the pass's other sends at most recordWait: a send
// to a receiver that answers at once is recorded while another receiver
// still holds its own send (it would have waited for that send to end,
// up to 10 s, and held the round's next claims back).
func TestAnOutcomeIsNotHeldBackByASlowSend(t *testing.T) {
	env, clk := start(t, true)
	dispatchAll(t, env, clk.Now())
	ws := env.Signup()
	slow, arrived, _, release := newHeldReceiver(t, http.StatusOK)
	fast := newReceiver(t, http.StatusInternalServerError)
	slowHook, _ := subscribe(t, env, ws.Key, slow.URL)
	fastHook, _ := subscribe(t, env, ws.Key, fast.URL)
	record(t, env, ws.ID, events.RunFinished, clk.Now())
	dispatchAll(t, env, clk.Now())

	done := deliverAside(env, clk.Now())
	<-arrived
	require.Eventually(t, func() bool {
		got := deliveries(t, env, ws.Key, fastHook)
		return len(got) == 1 && got[0]["last_status_code"] != nil
	}, 30*time.Second, 10*time.Millisecond, "the fast send is recorded while the slow one is in flight")
	slowOne := deliveries(t, env, ws.Key, slowHook)[0]
	require.Equal(t, []any{"pending", nil}, []any{slowOne["state"], slowOne["last_error"]},
		"the slow send is still in flight, not timed out")
	release()
	require.NoError(t, <-done)
	requireDeliveredOK(t, env, ws.Key, slowHook)
}

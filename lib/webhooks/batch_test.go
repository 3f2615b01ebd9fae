package webhooks_test

import (
	"context"
	"net/http"
	"net/http/httptest"
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
	createDropped(t, `
		DROP TRIGGER IF EXISTS count_delivery_updates ON webhook_deliveries;
		DROP FUNCTION IF EXISTS count_delivery_updates();
		DROP TABLE IF EXISTS counted_delivery_updates;`, `
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

// roundSends is a webhook's share of a round (perWebhook).
const roundSends = 20

// heldRound is a pass running aside (done answers its error once it ends)
// whose round of roundSends sends to webhook hook its receiver holds, all
// in flight, until release; their outcomes wait for every send of the
// pass (an hour's recordWait), so they are recorded in one statement
// whatever their timing.
type heldRound struct {
	env     *apitest.Env
	clk     *apitest.Clock
	hook    string
	hits    *atomic.Int32
	release func()
	done    <-chan error
}

// holdRound starts an instance and a heldRound whose receiver answers
// status once released.
func holdRound(t *testing.T, status int) heldRound {
	t.Helper()
	r := heldRound{}
	r.env, r.clk = start(t, true)
	webhooks.SetRecordWait(r.env.App.Server.Webhooks, time.Hour)
	var srv *httptest.Server
	srv, _, r.hits, r.release = newHeldReceiver(t, status)
	r.hook, r.done = sendsInFlight(t, r.env, r.clk, srv.URL, r.hits, roundSends)
	return r
}

// A round's sends that end together are recorded together: one statement
// (and one turn on the pass's share of the pool) for their outcomes, not
// one each (a round of 100 failing sends took 100 statements and
// connection checkouts). The outcomes wait for every send of the pass here
// (an hour's recordWait), so the count does not hang on timing: 20 sends
// (a webhook's share of a round), one statement.
func TestARoundsOutcomesAreRecordedInOneStatement(t *testing.T) {
	const sends = roundSends
	r := holdRound(t, http.StatusInternalServerError)
	env, clk, hook := r.env, r.clk, r.hook
	ctx := context.Background()
	counted := countUpdates(t, env, hook) // the claim is done: what updates them from now on records them
	r.release()
	require.NoError(t, <-r.done)
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

// failRecordOnce makes the first statement that updates deliveries of
// webhook hook from now on fail (a row trigger, dropped when the test
// ends; a sequence counts its calls, which the failed statement's
// rollback does not undo), and lets every later one through.
func failRecordOnce(t *testing.T, hook string) {
	t.Helper()
	createDropped(t, `
		DROP TRIGGER IF EXISTS fail_delivery_record ON webhook_deliveries;
		DROP FUNCTION IF EXISTS fail_delivery_record();
		DROP SEQUENCE IF EXISTS fail_delivery_record_calls;`, `
		CREATE SEQUENCE fail_delivery_record_calls;
		CREATE FUNCTION fail_delivery_record() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		    IF nextval('fail_delivery_record_calls') = 1 THEN
		        RAISE EXCEPTION 'fail_delivery_record: the test fails this record';
		    END IF;
		    RETURN NEW;
		END $$;
		CREATE TRIGGER fail_delivery_record BEFORE UPDATE ON webhook_deliveries
		    FOR EACH ROW WHEN (OLD.webhook_id = '`+hook+`')
		    EXECUTE FUNCTION fail_delivery_record();`)
}

// createDropped runs create (a trigger and what it needs) on a connection
// of the test's own, and drop on it when the test ends.
func createDropped(t *testing.T, drop, create string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, apitest.DatabaseURL(t))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := conn.Exec(context.Background(), drop)
		require.NoError(t, err)
		conn.Close(context.Background())
	})
	_, err = conn.Exec(ctx, create)
	require.NoError(t, err)
}

// A round's outcomes recorded in one statement are lost together when
// that statement fails (README: an outcome not recorded is treated as
// one whose sweeper stopped): the pass answers the error, and each
// delivery stays as its claim left it (pending, its attempt counted, no
// status, due when the claim's minute ends), none recorded alone nor by
// the statement tried again. No pass sends them before that minute ends;
// the first after it sends each once more and records it once, delivered
// on its second attempt. The outcomes wait for every send of the pass (an
// hour's recordWait), so all 20 are in the one statement that fails.
func TestARoundsOutcomesAreLostTogetherWhenTheirRecordFails(t *testing.T) {
	const sends = roundSends
	r := holdRound(t, http.StatusOK)
	env, clk, hook, hits := r.env, r.clk, r.hook, r.hits
	ctx := context.Background()
	claimedAt := clk.Now()
	failRecordOnce(t, hook) // the claim is done: the next update of its deliveries is their record
	r.release()
	select {
	case err := <-r.done:
		require.ErrorContains(t, err, "fail_delivery_record", "the pass answers its record's failure")
	case <-time.After(time.Minute): // a guard: the pass ends once its sends' record returned
		t.Fatal("the pass did not end")
	}
	state := func() (n int) {
		t.Helper()
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries
			WHERE webhook_id = $1 AND state = 'pending' AND attempts = 1 AND claims = 1 AND last_status_code IS NULL
			  AND last_error IS NULL AND delivered_at IS NULL AND next_attempt_at = $2`,
			hook, claimedAt.Add(time.Minute)).Scan(&n))
		return n
	}
	require.Equal(t, sends, state(), "each delivery is as its claim left it: no outcome recorded")

	// (A pass's count holds other tests' deliveries: the receiver's hits
	// and the rows are this test's.)
	clk.Add(time.Minute - time.Second)
	_, err := env.App.Server.Webhooks.Deliver(ctx, clk.Now())
	require.NoError(t, err)
	require.EqualValues(t, sends, hits.Load(), "the claim's minute holds them")
	require.Equal(t, sends, state())

	clk.Add(time.Second)
	_, err = env.App.Server.Webhooks.Deliver(ctx, clk.Now())
	require.NoError(t, err)
	require.EqualValues(t, 2*sends, hits.Load(), "each is sent once more once its claim's minute ended")
	var delivered int
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries
		WHERE webhook_id = $1 AND state = 'delivered' AND attempts = 2 AND claims = 2 AND last_status_code = 200
		  AND last_error IS NULL AND delivered_at = $2`, hook, clk.Now()).Scan(&delivered))
	require.Equal(t, sends, delivered, "each recorded once, delivered on its second attempt")
}

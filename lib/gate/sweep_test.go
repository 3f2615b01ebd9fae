package gate_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/migrations"
)

// TestSweeperAndLapseRaces, the retention tests (in 1980, 1985 and 1990,
// leaving no lease behind) and TestCeilingsSetDuringLapsesAndReconciliationsAgree
// are the only tests that sweep, and none of them is parallel. A sweep
// acts on every workspace of the package database, so its clocks live in
// 1995, long before any other test's leases (which follow the wall clock)
// could lapse; its parts run in sequence for the same reason.
func TestSweeperAndLapseRaces(t *testing.T) {
	era := time.Date(1995, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rand.IntN(1e6)) * time.Second)
	ctx := context.Background()

	t.Run("sweeper makes lapses durable once", func(t *testing.T) {
		c := apitest.NewClock(era)
		b := &bundle{t: t, clock: c, env: apitest.Start(t, apitest.WithNow(c.Now))}
		b.ws = b.env.Signup()
		pool := b.env.App.Pool
		var ids, tokens []string
		for i := 0; i < 3; i++ {
			d := b.mustBegin("execute", email(key("sweep")))
			ids, tokens = append(ids, str(d["effect_id"])), append(tokens, str(d["lease_token"]))
		}
		done := b.mustBegin("execute", email(key("done")))
		require.Equal(t, http.StatusOK, b.report(str(done["effect_id"]), str(done["lease_token"]), "succeeded", nil).Status)
		c.Add(61 * time.Second)
		// One lapse is made durable inline by a late report, before the sweeper.
		errCode(t, b.report(ids[2], tokens[2], "succeeded", nil), http.StatusConflict, "lease_expired")
		storedState := func(id string) (state string) {
			require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM effects WHERE id = $1`, id).Scan(&state))
			return
		}
		require.Equal(t, "leased", storedState(ids[0]))
		require.Equal(t, "indeterminate", b.get(ids[0])["state"]) // reads as indeterminate already

		sweep := func() map[string]any {
			r := b.env.Do("GET", "/api/cron/sweep", "test-cron-secret", nil)
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			return r.JSON()["changed"].(map[string]any)
		}
		require.EqualValues(t, 2, sweep()["effects.lapsed_leases"])
		require.EqualValues(t, 0, sweep()["effects.lapsed_leases"])
		for _, id := range ids {
			require.Equal(t, "indeterminate", storedState(id))
			var outcome string
			require.NoError(t, pool.QueryRow(ctx, `SELECT outcome FROM effect_attempts WHERE effect_id = $1`, id).Scan(&outcome))
			require.Equal(t, "indeterminate", outcome)
		}
		rows, err := pool.Query(ctx, `SELECT subject_id, dedupe_key, data->>'effect_type' FROM events
			WHERE workspace_id = $1 AND type = 'effect.indeterminate' ORDER BY subject_id`, b.ws.ID)
		require.NoError(t, err)
		var got []string
		for rows.Next() {
			var subject, dedupe, typ string
			require.NoError(t, rows.Scan(&subject, &dedupe, &typ))
			require.Equal(t, "1", dedupe)
			require.Equal(t, "email.send", typ)
			got = append(got, subject)
		}
		require.NoError(t, rows.Err())
		require.ElementsMatch(t, ids, got)

		// Lapsed before the sweep or after, a report is lease_expired.
		errCode(t, b.report(ids[0], tokens[0], "succeeded", nil), http.StatusConflict, "lease_expired")
		errCode(t, b.report(ids[0], "not-the-token", "succeeded", nil), http.StatusConflict, "lease_lost")
		require.Len(t, b.env.Must(http.StatusOK, "GET", "/api/v1/effects?state=indeterminate", b.ws.Key, nil).JSON()["data"], 3)
	})

	t.Run("report racing expiry is accepted or lease_expired, never both", func(t *testing.T) {
		// live answers from just before the lease lapses, late from just after.
		live := apitest.NewClock(era.Add(time.Hour))
		late := apitest.NewClock(era.Add(time.Hour + 60*time.Second))
		envLive := apitest.Start(t, apitest.WithNow(live.Now))
		envLate := apitest.Start(t, apitest.WithNow(late.Now))
		ws := envLive.Signup()
		// The outbox feeds webhooks: a subscriber gets every effect.indeterminate.
		hook := envLive.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
			map[string]any{"url": "https://hooks.example.com/ratchet", "events": []string{"effect.indeterminate"}}).JSON()
		live.Add(-time.Millisecond)
		outcomes := map[string]int{}
		for i := 0; i < 30; i++ {
			// Begin at the lease's start, then report from both sides of its end at once.
			live.Add(-59 * time.Second)
			d := envLive.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, email(key("edge"))).JSON()
			live.Add(59 * time.Second)
			require.Equal(t, "execute", d["decision"])
			id, token := str(d["effect_id"]), str(d["lease_token"])
			body := map[string]any{"lease_token": token, "outcome": "succeeded"}

			var (
				wg               sync.WaitGroup
				liveCode, lateCd int
				liveErr, lateErr error
				sweptN           int
				sweepErr         error
			)
			wg.Add(3)
			go func() {
				defer wg.Done()
				liveCode, _, liveErr = post(envLive, "/api/v1/effects/"+id+"/report", ws.Key, body)
			}()
			go func() {
				defer wg.Done()
				lateCd, _, lateErr = post(envLate, "/api/v1/effects/"+id+"/report", ws.Key, body)
			}()
			go func() {
				defer wg.Done()
				sweptN, sweepErr = envLate.App.Server.Gate.SweepLapsed(ctx, late.Now(), 500)
			}()
			wg.Wait()
			require.NoError(t, liveErr)
			require.NoError(t, lateErr)
			require.NoError(t, sweepErr)
			require.LessOrEqual(t, sweptN, 1)

			var state, outcome string
			var events int
			require.NoError(t, envLive.App.Pool.QueryRow(ctx, `SELECT e.state, a.outcome,
				(SELECT count(*) FROM events WHERE subject_id = e.id AND type = 'effect.indeterminate')
				FROM effects e JOIN effect_attempts a ON a.effect_id = e.id WHERE e.id = $1`, id).
				Scan(&state, &outcome, &events))
			require.Equal(t, state, outcome)
			switch state {
			case "succeeded": // accepted: the late side saw a repeated report
				require.Equal(t, 200, liveCode)
				require.Equal(t, 200, lateCd)
				require.Equal(t, 0, events)
			case "indeterminate": // expired first: nobody's report counted
				require.Equal(t, 409, liveCode)
				require.Equal(t, 409, lateCd)
				require.Equal(t, 1, events)
			default:
				t.Fatalf("unexpected state %s", state)
			}
			outcomes[state]++
			// Move both clocks on so the next lease starts fresh.
			live.Add(2 * time.Minute)
			late.Add(2 * time.Minute)
		}
		t.Logf("outcomes over 30 races: %v", outcomes)

		_, err := envLate.App.Server.Webhooks.Dispatch(ctx, late.Now())
		require.NoError(t, err)
		var deliveries int
		require.NoError(t, envLive.App.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries
			WHERE webhook_id = $1 AND event_type = 'effect.indeterminate'`, hook["id"]).Scan(&deliveries))
		require.Equal(t, outcomes["indeterminate"], deliveries)
	})
}

// The sweeper's batch of lapsed leases takes turns among workspaces: a
// workspace with a backlog of lapses older than another's takes one place
// of the batch a turn, not all of them, and the other's lapse (and its
// effect.indeterminate) is made durable in the first pass (multi-tenant
// QA: ordered by expiry alone, 100,000 lapses of one workspace held
// another's back for 200 passes, over three hours on the cron). A batch of
// 2 stands for the pass's 500. Not parallel, in its own era (1931): the
// sweep acts on every workspace of the package database.
func TestSweptLapsesTakeTurnsAmongWorkspaces(t *testing.T) {
	noisy, _ := inEra(t, 1931)
	c, ctx, env := noisy.clock, context.Background(), noisy.env
	quiet := &bundle{t: t, clock: c, env: env, ws: env.Signup()}
	var backlog []string
	for range 5 {
		backlog = append(backlog, str(noisy.mustBegin("execute", email(key("backlog")))["effect_id"]))
		c.Add(time.Millisecond) // lapsing one after the other
	}
	c.Add(time.Second) // the quiet workspace's lease lapses after the whole backlog's
	late := str(quiet.mustBegin("execute", email(key("late")))["effect_id"])
	c.Add(61 * time.Second)
	durable := func(ids ...string) (n int) {
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM effects
			WHERE id = ANY($1) AND state = 'indeterminate'`, ids).Scan(&n))
		return n
	}

	batch := func() (int, error) { return env.App.Server.Gate.SweepLapsed(ctx, c.Now(), 2) }
	passes(t, batch, 2)
	require.Equal(t, 1, durable(late), "the quiet workspace's lapse is in the first batch")
	require.Equal(t, 1, durable(backlog...), "the backlog took one place of it, its oldest")
	require.Equal(t, 1, durable(backlog[0]))
	var recorded int
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM events
		WHERE workspace_id = $1 AND type = 'effect.indeterminate' AND subject_id = $2`, quiet.ws.ID, late).Scan(&recorded))
	require.Equal(t, 1, recorded)

	// Alone, the backlog fills each batch, and nothing of this era is left
	// for the later eras' sweeps to count.
	passes(t, batch, 2, 2, 0)
	require.Equal(t, 5, durable(backlog...))
}

// The sweeper checks unwinding rollbacks taking turns among workspaces: a
// workspace that leaves many rollbacks unwinding (their compensations
// never run) takes one place of a batch a turn, and another workspace's
// rollback, whose compensations all ended behind a request's back, is
// settled in the first pass (multi-tenant QA: least recently checked
// first across every workspace, a rollback checked once went behind all
// of them, a thousand passes for 100,000). A batch of 2 stands for the
// pass's 100. Not parallel, in its own era (1933): the sweep settles every
// workspace's rollbacks.
func TestSweptRollbacksTakeTurnsAmongWorkspaces(t *testing.T) {
	noisy, _ := inEra(t, 1933)
	c, ctx, env := noisy.clock, context.Background(), noisy.env
	quiet := env.Signup()
	// What other tests left unwinding is settled or checked now, after
	// this test's rollbacks in their turn.
	_, err := env.App.Server.Gate.SweepGroups(ctx, c.Now(), 100_000)
	require.NoError(t, err)
	unwinding := func(ws string, swept *time.Time) string {
		id := ids.NewAt(ids.Group, c.Now())
		_, err := env.App.Pool.Exec(ctx, `INSERT INTO effect_groups (id, workspace_id, name, state, created_by_key_id,
			created_at, updated_at, unwind_started_at, swept_at) VALUES ($1, $2, 'order', 'unwinding', 'key_x', $3, $3, $3, $4)`,
			id, ws, c.Now(), swept)
		require.NoError(t, err)
		return id
	}
	var backlog []string
	for range 4 {
		backlog = append(backlog, unwinding(noisy.ws.ID, nil)) // never checked
	}
	checked := c.Now().Add(-time.Minute)
	late := unwinding(quiet.ID, &checked) // checked once, a minute ago
	states := func(ids ...string) (n map[string]int) {
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT jsonb_object_agg(state, n) FROM (
			SELECT state, count(*) AS n FROM effect_groups WHERE id = ANY($1) GROUP BY state) s`, ids).Scan(&n))
		return n
	}

	batch := func() (int, error) { return env.App.Server.Gate.SweepGroups(ctx, c.Now(), 2) }
	passes(t, batch, 2)
	require.Equal(t, map[string]int{"unwound": 1}, states(late), "the quiet workspace's rollback is settled in the first pass")
	require.Equal(t, map[string]int{"unwound": 1, "unwinding": 3}, states(backlog...))
	passes(t, batch, 2, 1, 0)
	require.Equal(t, map[string]int{"unwound": 4}, states(backlog...))
}

// Reconciliation reminders are recorded taking turns among workspaces: a
// workspace with many types overdue takes one place of a pass a turn, and
// another's reminder, due later, goes out in the first (multi-tenant QA:
// in due order alone, a workspace with 100,000 types to reconcile held
// another's reminder back for 200 passes). A batch of 2 stands for the
// pass's 500. Not parallel, in its own era (1935): the sweep reminds every
// workspace.
func TestReconciliationRemindersTakeTurnsAmongWorkspaces(t *testing.T) {
	noisy, _ := inEra(t, 1935)
	c, ctx, env := noisy.clock, context.Background(), noisy.env
	quiet := &bundle{t: t, clock: c, env: env, ws: env.Signup()}
	for i := range 4 {
		noisy.putPolicy(fmt.Sprintf("charge.%d", i), map[string]any{"reconcile_every_hours": 1})
	}
	c.Add(10 * time.Minute) // the quiet workspace's type falls due after the others
	quiet.putPolicy("refund.issue", map[string]any{"reconcile_every_hours": 1})
	c.Add(time.Hour)
	reminded := func(ws string) (n int) {
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM events
			WHERE workspace_id = $1 AND type = 'reconciliation.due'`, ws).Scan(&n))
		return n
	}

	batch := func() (int, error) { return env.App.Server.Gate.SweepReconcileDue(ctx, c.Now(), 2) }
	passes(t, batch, 2)
	require.Equal(t, 1, reminded(quiet.ws.ID), "the quiet workspace's reminder went out in the first pass")
	require.Equal(t, 1, reminded(noisy.ws.ID))
	passes(t, batch, 2, 1, 0)
	require.Equal(t, 4, reminded(noisy.ws.ID))
}

// Two sweeps overlapping a policy write that changes the period record
// one reminder: each reads its own period, with its own dedupe key, but
// the second waits for the first's row of reconciliation_reminders and,
// the type reminded since its period fell due, records none (review: each
// found no reminder in its snapshot and recorded one). Not parallel, in
// its own era (1947): the sweep reminds every workspace.
func TestOverlappingSweepsRemindOnceAcrossAPeriodChange(t *testing.T) {
	b, _ := inEra(t, 1947)
	c, ctx, env := b.clock, context.Background(), b.env
	const typ = "payment.charge"
	on := c.Now()
	b.putPolicy(typ, map[string]any{"reconcile_every_hours": 5})
	c.Add(26 * time.Hour) // the period due at 25 h
	reminders := func(q interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	}) []time.Time {
		rows, err := q.Query(ctx, `SELECT (data->>'due_at')::timestamptz FROM events
			WHERE workspace_id = $1 AND type = 'reconciliation.due' AND subject_id = $2 ORDER BY id`, b.ws.ID, typ)
		require.NoError(t, err)
		due, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
		require.NoError(t, err)
		return due
	}

	// The first sweep, held open (500 a pass reaches every type the
	// package's other tests left with reminders on).
	first, err := env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = first.Rollback(ctx) }()
	var n int
	require.NoError(t, first.QueryRow(ctx, gate.SQLReconcileDue, c.Now(), 500, gate.EventIDsAt(c.Now(), 500)).Scan(&n))
	require.Len(t, reminders(first), 1, "the period due at 25 h")
	pid := apitest.BackendPID(t, first)

	b.putPolicy(typ, map[string]any{"reconcile_every_hours": 24}) // due at 24 h, not reminded in the second's snapshot
	done := make(chan struct{})
	var second error
	go func() {
		defer close(done)
		_, second = env.App.Server.Gate.SweepReconcileDue(ctx, c.Now(), 500)
	}()
	apitest.WaitDoneOrBlockedBy(t, env.App.Pool, pid, done, "the second sweep answered or waits for the first")
	require.NoError(t, first.Commit(ctx))
	<-done
	require.NoError(t, second)
	got := reminders(env.App.Pool)
	require.Len(t, got, 1, "one reminder: %v", got)
	require.True(t, got[0].Equal(on.Add(25*time.Hour)), "%s", got[0])

	// The 24-hour calendar goes on from there: its next period is due at 48 h.
	c.Add(21 * time.Hour) // 47 h
	_, err = env.App.Server.Gate.SweepReconcileDue(ctx, c.Now(), 500)
	require.NoError(t, err)
	require.Len(t, reminders(env.App.Pool), 1)
	c.Add(2 * time.Hour) // 49 h
	_, err = env.App.Server.Gate.SweepReconcileDue(ctx, c.Now(), 500)
	require.NoError(t, err)
	got = reminders(env.App.Pool)
	require.Len(t, got, 2)
	require.True(t, got[1].Equal(on.Add(48*time.Hour)), "%s", got[1])
}

// Migration 0086 records when each type was last reminded from the
// reminders recorded before it, so no type is reminded twice across the
// upgrade: here one the previous release reminded for its current period
// (no reconciliation_reminders row) whose period then changed, which its
// new period's dedupe key alone would remind again. Not parallel, in its
// own era (1951): the sweep reminds every workspace.
func TestReconciliationRemindersAcrossTheUpgradeTo0086(t *testing.T) {
	b, _ := inEra(t, 1951)
	c, ctx, env := b.clock, context.Background(), b.env
	const typ = "payment.charge"
	sweep := func() {
		_, err := env.App.Server.Gate.SweepReconcileDue(ctx, c.Now(), 500)
		require.NoError(t, err)
	}
	reminded := func() (n int) {
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM events
			WHERE workspace_id = $1 AND type = 'reconciliation.due' AND subject_id = $2`, b.ws.ID, typ).Scan(&n))
		return n
	}
	b.putPolicy(typ, map[string]any{"reconcile_every_hours": 24})
	c.Add(26 * time.Hour)
	sweep()
	require.Equal(t, 1, reminded(), "the period due at 24 h")
	// As the previous release recorded it, and upgraded.
	_, err := env.App.Pool.Exec(ctx, `DELETE FROM reconciliation_reminders WHERE workspace_id = $1`, b.ws.ID)
	require.NoError(t, err)
	upgrade, err := migrations.FS.ReadFile("0086_reconciliation_reminders.sql")
	require.NoError(t, err)
	_, err = env.App.Pool.Exec(ctx, string(upgrade))
	require.NoError(t, err)

	b.putPolicy(typ, map[string]any{"reconcile_every_hours": 5}) // due at 25 h, a period reminded at 26 h
	sweep()
	require.Equal(t, 1, reminded())
	c.Add(4 * time.Hour) // 30 h
	sweep()
	require.Equal(t, 2, reminded())
}

// Cooled breakers are closed taking turns among workspaces: another
// workspace's circuit.closed goes out in the first pass whatever one
// workspace's number of breakers that cooled before it (multi-tenant QA).
// A batch of 2 stands for the pass's 500. Not parallel, in its own era
// (1937): SweepCircuits closes every workspace's lapsed breakers.
func TestCooledBreakersCloseTakingTurnsAmongWorkspaces(t *testing.T) {
	noisy, _ := inEra(t, 1937)
	c, ctx, env := noisy.clock, context.Background(), noisy.env
	quiet := env.Signup()
	open := func(ws, typ string, cooled time.Duration) {
		_, err := env.App.Pool.Exec(ctx, `INSERT INTO gate_circuits (workspace_id, effect_type, state, opened_by, action,
			opened_at, closes_at, updated_at) VALUES ($1, $2, 'open', 'surge', 'require_approval', $3, $4, $3)`,
			ws, typ, c.Now().Add(-2*time.Hour), c.Now().Add(-cooled))
		require.NoError(t, err)
	}
	for i := range 4 {
		open(noisy.ws.ID, fmt.Sprintf("sms.%d", i), time.Hour-time.Duration(i)*time.Minute)
	}
	open(quiet.ID, "email.send", time.Minute) // cooled after all of them
	closed := func(ws string) (n int) {
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM gate_circuits
			WHERE workspace_id = $1 AND state = 'closed'`, ws).Scan(&n))
		return n
	}

	batch := func() (int, error) { return env.App.Server.Gate.SweepCircuits(ctx, c.Now(), 2) }
	passes(t, batch, 2)
	require.Equal(t, 1, closed(quiet.ID), "the quiet workspace's breaker closed in the first pass")
	require.Equal(t, 1, closed(noisy.ws.ID))
	passes(t, batch, 2, 1, 0)
}

// passes runs batch once for each count of want, requiring it to change
// that many rows.
func passes(t *testing.T, batch func() (int, error), want ...int) {
	t.Helper()
	for _, w := range want {
		n, err := batch()
		require.NoError(t, err)
		require.Equal(t, w, n)
	}
}

// A rollback whose settling fails on every pass holds none checked after
// it: each is settled, and the failure answered (sweeper review: the
// first failure ended the pass, and with fewer rollbacks than a batch,
// all checked alike each pass and read in the same order, those after it
// stayed unwinding for good). Not parallel, in its own era (1949): the
// sweep settles every workspace's rollbacks, and the trigger that fails
// one is on the package database.
func TestSweptRollbacksGoOnPastOneThatFails(t *testing.T) {
	b, _ := inEra(t, 1949)
	c, ctx, env := b.clock, context.Background(), b.env
	// What other tests left unwinding is settled or checked now.
	_, err := env.App.Server.Gate.SweepGroups(ctx, c.Now(), 100_000)
	require.NoError(t, err)
	unwinding := func() string {
		c.Add(time.Second) // ids follow the clock: read in creation order
		id := ids.NewAt(ids.Group, c.Now())
		_, err := env.App.Pool.Exec(ctx, `INSERT INTO effect_groups (id, workspace_id, name, state, created_by_key_id,
			created_at, updated_at, unwind_started_at) VALUES ($1, $2, 'order', 'unwinding', 'key_x', $3, $3, $3)`,
			id, b.ws.ID, c.Now())
		require.NoError(t, err)
		return id
	}
	failing := unwinding()
	rest := []string{unwinding(), unwinding()}
	allow := apitest.Refuse(t, "BEFORE UPDATE ON effect_groups",
		"OLD.id = '"+failing+"' AND NEW.state IS DISTINCT FROM OLD.state")
	state := func(id string) (s string) {
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT state FROM effect_groups WHERE id = $1`, id).Scan(&s))
		return s
	}

	for range 2 { // every pass alike
		n, err := env.App.Server.Gate.SweepGroups(ctx, c.Now(), 100)
		require.ErrorContains(t, err, "test_refuse")
		require.Equal(t, "unwinding", state(failing))
		if n > 0 {
			require.Equal(t, len(rest), n)
		}
	}
	for _, id := range rest {
		require.Equal(t, "unwound", state(id), "settled behind the rollback that fails")
	}
	// Leave nothing unwinding for the other eras' sweeps.
	allow()
	_, err = env.App.Server.Gate.SweepGroups(ctx, c.Now(), 100)
	require.NoError(t, err)
	require.Equal(t, "unwound", state(failing))
}

// The lapse, moot-approval and spend sweeps each take a batch in one
// statement, read in the same order every pass, so a row that made the
// statement fail would hold every row behind it back for good. None can:
// their tables have no trigger, their updates change no key and set only
// values their checks admit, and each insert of an event passes over one
// recorded already (ON CONFLICT DO NOTHING). This pins the rows closest
// to failing (sweeper review): a lapse whose attempt row is gone (an older
// release's retention), one whose effect.indeterminate is recorded already,
// a moot approval announced already and resolved by a key that no longer
// exists, a counter at the bounds of its columns. Not parallel, in its own
// era (1921): the sweeps act on every workspace of the package database.
func TestSweepsGoOnPastTheRowsClosestToFailing(t *testing.T) {
	b, _ := inEra(t, 1921)
	c, ctx, env := b.clock, context.Background(), b.env
	pool := env.App.Pool
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	announce := func(typ, subject, dedupe string) {
		exec(`INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
			VALUES ($1, $2, $3, $4, '{}', $5, $6)`, ids.NewAt(ids.Event, c.Now()), b.ws.ID, typ, subject, c.Now(), dedupe)
	}
	noAttempt := str(b.mustBegin("execute", email(key("gone")))["effect_id"])
	announced := str(b.mustBegin("execute", email(key("announced")))["effect_id"])
	plain := str(b.mustBegin("execute", email(key("plain")))["effect_id"])
	exec(`DELETE FROM effect_attempts WHERE effect_id = $1`, noAttempt)
	announce("effect.indeterminate", announced, "1")
	c.Add(2 * time.Hour)

	_, err := env.App.Server.Gate.SweepLapsed(ctx, c.Now(), 500)
	require.NoError(t, err)
	var durable int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE id = ANY($1) AND state = 'indeterminate'`,
		[]string{noAttempt, announced, plain}).Scan(&durable))
	require.Equal(t, 3, durable)

	// plain, settled succeeded with its retry's approval left pending,
	// announced already and resolved by a key since deleted.
	approval := ids.NewAt(ids.Approval, c.Now())
	exec(`INSERT INTO approvals (id, workspace_id, effect_id, effect_type, state, reason, created_at)
		VALUES ($1, $2, $3, 'email.send', 'pending', 'indeterminate_retry', $4)`, approval, b.ws.ID, plain, c.Now())
	exec(`UPDATE effects SET state = 'succeeded', approval_id = $2, approval_state = 'pending' WHERE id = $1`, plain, approval)
	exec(`UPDATE effect_attempts SET outcome = 'succeeded', resolved_by_key_id = 'key_gone', resolved_at = $2
		WHERE effect_id = $1`, plain, c.Now())
	announce("approval.decided", approval, "")
	_, err = env.App.Server.Gate.SweepMootApprovals(ctx, c.Now(), 500)
	require.NoError(t, err)
	var state string
	require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM approvals WHERE id = $1`, approval).Scan(&state))
	require.Equal(t, "rejected", state)

	old := c.Now().AddDate(0, 0, -10).Format(time.DateOnly)
	exec(`INSERT INTO gate_spend (workspace_id, scope, day, micros, count, cap_micros, cap_count)
		VALUES ($1, 'type:email.send', $2::date, 9223372036854775807, 9223372036854775807, 0, 0)`, b.ws.ID, old)
	_, err = env.App.Server.Gate.SweepSpend(ctx, c.Now(), 500)
	require.NoError(t, err)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM gate_spend WHERE workspace_id = $1 AND day = $2::date`,
		b.ws.ID, old).Scan(&left))
	require.Equal(t, 0, left)
}

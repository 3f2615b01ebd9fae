package gate_test

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
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

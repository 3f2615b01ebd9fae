package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// lease is the api.call lease of the skewed instances' workspace.
const lease = 30 * time.Second

// skewedInstances starts two instances with clocks of their own, both at
// t0 (today at noon), and signs up a workspace whose api.call policy has
// the lease and the other fields of policy: a test sets one clock a
// microsecond before a lease's end and the other at it.
func skewedInstances(t *testing.T, policy map[string]any) (t0 time.Time, live, late *apitest.Clock,
	envLive, envLate *apitest.Env, ws apitest.Workspace) {
	t.Helper()
	t0 = newClock().Now()
	live, late = apitest.NewClock(t0), apitest.NewClock(t0)
	envLive = apitest.Start(t, apitest.WithNow(live.Now))
	envLate = apitest.Start(t, apitest.WithNow(late.Now))
	ws = envLive.Signup()
	policy["lease_seconds"] = int(lease.Seconds())
	envLive.Must(http.StatusOK, "PUT", "/api/v1/policies/api.call", ws.Key, policy)
	return t0, live, late, envLive, envLate, ws
}

// Heartbeats from an instance whose clock reads a microsecond before the
// lease's end race heartbeats and reports of the same token from one whose
// clock reads its end. Exactly one side wins, under the effect's row lock:
// either a heartbeat extended the lease first (then the late side finds it
// live, its reports record succeeded, and nothing reads indeterminate), or
// the lapse was recorded first (then no heartbeat is answered 200, every
// report is lease_expired, the lease keeps its end, and one
// effect.indeterminate is recorded). A heartbeat answered 200 on an effect
// whose lapse was recorded would tell its holder to go on acting on an
// attempt everyone else reads as of unknown outcome.
func TestHeartbeatsRacingTheLeasesEnd(t *testing.T) {
	t.Parallel()
	t0, live, late, envLive, envLate, ws := skewedInstances(t, map[string]any{})
	won := map[string]int{}
	for round := 0; round < 20; round++ {
		// The sides take turns at outnumbering the other, so both win.
		liveBeats, lateBeats, lateReports := 8, 2, 2
		if round%2 == 1 {
			liveBeats, lateBeats, lateReports = 1, 6, 3
		}
		begun := t0.Add(time.Duration(round) * time.Hour)
		live.Set(begun)
		d := envLive.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, charge(key("beat"), 0)).JSON()
		require.Equal(t, "execute", d["decision"])
		id, token := str(d["effect_id"]), d["lease_token"]
		end := begun.Add(lease)
		live.Set(end.Add(-time.Microsecond))
		late.Set(end)

		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			start  = make(chan struct{})
			codes  = map[string]int{}
			extend []time.Time
		)
		call := func(side string, env *apitest.Env, verb string, body map[string]any) {
			defer wg.Done()
			<-start
			status, out, err := post(env, "/api/v1/effects/"+id+"/"+verb, ws.Key, body)
			mu.Lock()
			defer mu.Unlock()
			code := fmt.Sprint(status)
			if err != nil {
				code = err.Error()
			} else if e, ok := out["error"].(map[string]any); ok {
				code = str(e["code"])
			} else if verb == "heartbeat" {
				at, perr := time.Parse(time.RFC3339Nano, str(out["lease_expires_at"]))
				require.NoError(t, perr)
				extend = append(extend, at)
			}
			codes[side+" "+verb+" "+code]++
		}
		beat := map[string]any{"lease_token": token}
		report := map[string]any{"lease_token": token, "outcome": "succeeded"}
		for i := 0; i < liveBeats; i++ {
			wg.Add(1)
			go call("live", envLive, "heartbeat", beat)
		}
		for i := 0; i < lateBeats; i++ {
			wg.Add(1)
			go call("late", envLate, "heartbeat", beat)
		}
		for i := 0; i < lateReports; i++ {
			wg.Add(1)
			go call("late", envLate, "report", report)
		}
		close(start)
		wg.Wait()

		var (
			state     string
			storedEnd time.Time
			events    int
		)
		require.NoError(t, envLive.App.Pool.QueryRow(context.Background(), `SELECT e.state, a.lease_expires_at,
			(SELECT count(*) FROM events WHERE subject_id = e.id AND type = 'effect.indeterminate')
			FROM effects e JOIN effect_attempts a ON a.effect_id = e.id AND a.attempt = e.attempt
			WHERE e.id = $1`, id).Scan(&state, &storedEnd, &events))
		won[state]++
		switch state {
		case "succeeded": // a live heartbeat extended the lease before any late call
			require.Zero(t, events, "round %d: %v", round, codes)
			require.Equal(t, lateReports, codes["late report 200"], "round %d: %v", round, codes)
			require.Equal(t, lateBeats, codes["late heartbeat 200"]+codes["late heartbeat invalid_state"], "round %d: %v", round, codes)
			require.Equal(t, liveBeats, codes["live heartbeat 200"]+codes["live heartbeat invalid_state"], "round %d: %v", round, codes)
			require.Positive(t, codes["live heartbeat 200"], "round %d: %v", round, codes)
			for _, at := range extend {
				require.False(t, at.After(storedEnd), "round %d: an answered lease end the attempt does not hold", round)
			}
		case "indeterminate": // a late call recorded the lapse before any live heartbeat
			require.Equal(t, 1, events, "round %d: %v", round, codes)
			require.Equal(t, map[string]int{"live heartbeat lease_expired": liveBeats,
				"late heartbeat lease_expired": lateBeats, "late report lease_expired": lateReports}, codes, "round %d", round)
			require.True(t, storedEnd.Equal(end), "round %d: the lapsed lease kept its end, not %s", round, storedEnd)
		default:
			t.Fatalf("round %d: state %s: %v", round, state, codes)
		}
	}
	t.Logf("winners over 20 rounds: %v", won)
}

// Under on_indeterminate retry, the holder's heartbeats a microsecond
// before its lease's end race begins of the key from an instance whose
// clock reads the end: either a heartbeat kept the lease (every begin
// in_flight) or a begin took the key's next attempt (every later heartbeat
// of the old token refused), never both, so at most one caller holds a
// live lease for the key (API.md §2.1).
func TestHeartbeatsRacingARetryOfTheKey(t *testing.T) {
	t.Parallel()
	t0, live, late, envLive, envLate, ws := skewedInstances(t,
		map[string]any{"on_indeterminate": "retry", "max_attempts": 50})
	won := map[string]int{}
	for round := 0; round < 20; round++ {
		beats, begins := 8, 2
		if round%2 == 1 {
			beats, begins = 1, 8
		}
		begun := t0.Add(time.Duration(round) * time.Hour)
		live.Set(begun)
		body := charge(key("held"), 0)
		d := envLive.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, body).JSON()
		require.Equal(t, "execute", d["decision"])
		id := str(d["effect_id"])
		live.Set(begun.Add(lease - time.Microsecond))
		late.Set(begun.Add(lease))

		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			start = make(chan struct{})
			codes = map[string]int{}
		)
		note := func(what string, status int, out map[string]any, err error) {
			mu.Lock()
			defer mu.Unlock()
			switch e, _ := out["error"].(map[string]any); {
			case err != nil:
				codes[what+" "+err.Error()]++
			case e != nil:
				codes[what+" "+str(e["code"])]++
			case what == "begin":
				codes[what+" "+str(out["decision"])]++
			default:
				codes[fmt.Sprint(what, " ", status)]++
			}
		}
		for i := 0; i < beats; i++ {
			wg.Go(func() {
				<-start
				status, out, err := post(envLive, "/api/v1/effects/"+id+"/heartbeat", ws.Key,
					map[string]any{"lease_token": d["lease_token"]})
				note("heartbeat", status, out, err)
			})
		}
		for i := 0; i < begins; i++ {
			wg.Go(func() {
				<-start
				status, out, err := postBegin(envLate, ws.Key, body)
				note("begin", status, out, err)
			})
		}
		close(start)
		wg.Wait()

		var attempts int
		require.NoError(t, envLive.App.Pool.QueryRow(context.Background(),
			`SELECT attempt FROM effects WHERE id = $1`, id).Scan(&attempts))
		if codes["begin execute"] == 0 { // a heartbeat kept the lease
			require.Equal(t, map[string]int{"heartbeat 200": beats, "begin in_flight": begins}, codes, "round %d", round)
			require.Equal(t, 1, attempts, "round %d", round)
			won["heartbeat"]++
			continue
		}
		require.Equal(t, 1, codes["begin execute"], "round %d: %v", round, codes)
		require.Zero(t, codes["heartbeat 200"], "round %d: two holders: %v", round, codes)
		require.Equal(t, begins, codes["begin execute"]+codes["begin in_flight"], "round %d: %v", round, codes)
		require.Equal(t, 2, attempts, "round %d", round)
		won["retry"]++
	}
	t.Logf("winners over 20 rounds: %v", won)
}

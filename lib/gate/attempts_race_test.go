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

// max_attempts counts every execute grant (API.md §2.1): a key whose
// lease lapsed, or whose attempt was reported failed, begun by many callers
// at once from two instances is granted exactly one new attempt each time,
// and never more than max_attempts in all (a probe counts as one); every
// begin after that is refused max_attempts_exceeded, however many race it.
func TestConcurrentBeginsAfterLapsesNeverPassMaxAttempts(t *testing.T) {
	for _, onIndeterminate := range []string{"retry", "probe"} {
		t.Run(onIndeterminate, func(t *testing.T) {
			t.Parallel()
			beginsAfterLapses(t, onIndeterminate)
		})
	}
}

// beginsAfterLapses hammers one key whose lapses the policy answers with
// onIndeterminate (retry, or probe: an execute with probe true).
func beginsAfterLapses(t *testing.T, onIndeterminate string) {
	c, env1, env2, ws := twoInstances(t)
	const maxAttempts, racers = 3, 100
	env1.Must(http.StatusOK, "PUT", "/api/v1/policies/api.call", ws.Key,
		map[string]any{"on_indeterminate": onIndeterminate, "max_attempts": maxAttempts, "lease_seconds": 5})
	body := charge(key("attempts"), 0)
	var effectID string
	for round := 1; round <= maxAttempts+2; round++ {
		counts, execs := raceBegins(t, racers, ws.Key, body, env1, env2)
		if round > maxAttempts {
			require.Equal(t, map[string]int{"403:max_attempts_exceeded": racers}, counts, "round %d", round)
			continue
		}
		require.Equal(t, map[string]int{"execute": 1, "in_flight": racers - 1}, counts, "round %d", round)
		require.EqualValues(t, round, execs[0]["attempt"], "round %d", round)
		// Only the attempt after a lapse probes (a failure is known).
		require.Equal(t, onIndeterminate == "probe" && round%2 == 1 && round > 1, execs[0]["probe"], "round %d", round)
		effectID = str(execs[0]["effect_id"])
		if round%2 == 1 {
			// A known failure frees the key at once.
			r := env2.Do("POST", "/api/v1/effects/"+effectID+"/report", ws.Key,
				map[string]any{"lease_token": execs[0]["lease_token"], "outcome": "failed"})
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			continue
		}
		c.Add(6 * time.Second) // the lease lapses unreported
	}
	var attempts, grants int
	require.NoError(t, env1.App.Pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM effect_attempts WHERE effect_id = $1), attempt FROM effects WHERE id = $1`,
		effectID).Scan(&attempts, &grants))
	require.Equal(t, []int{maxAttempts, maxAttempts}, []int{attempts, grants})
}

// An operator's resolve of a blocked key racing many begins of it from two
// instances: before the resolve commits every begin is blocked; after a
// resolve to failed exactly one begin in all is granted the next attempt
// (the others in_flight); after a resolve to succeeded none is, and the
// begins answer duplicate. No begin acts on the key while its outcome is
// unknown.
func TestBeginsRacingAResolveOfABlockedKey(t *testing.T) {
	t.Parallel()
	c, env1, env2, ws := twoInstances(t)
	env1.Must(http.StatusOK, "PUT", "/api/v1/policies/api.call", ws.Key,
		map[string]any{"on_indeterminate": "block", "lease_seconds": 5})
	const racers = 40
	for round := 0; round < 8; round++ {
		outcome := []string{"failed", "succeeded"}[round%2]
		body := charge(key("blocked"), 0)
		d := env1.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, body).JSON()
		require.Equal(t, "execute", d["decision"])
		id := str(d["effect_id"])
		c.Add(6 * time.Second) // lapsed unreported: indeterminate, blocked

		decisions, resolve := resolveRacingBegins(t, racers, ws.Key, id, outcome, body, env1, env2)
		require.Equal(t, http.StatusOK, resolve, "round %d: %v", round, decisions)

		after := env1.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, body).JSON()["decision"]
		blocked := decisions["200 blocked <nil>"]
		if outcome == "succeeded" {
			require.Equal(t, racers, blocked+decisions["200 duplicate <nil>"], "round %d: %v", round, decisions)
			require.Equal(t, "duplicate", after, "round %d", round)
		} else {
			executed := decisions["200 execute <nil>"]
			require.LessOrEqual(t, executed, 1, "round %d: %v", round, decisions)
			require.Equal(t, racers, blocked+executed+decisions["200 in_flight <nil>"], "round %d: %v", round, decisions)
			require.Equal(t, map[int]string{0: "execute", 1: "in_flight"}[executed], after, "round %d: %v", round, decisions)
		}
		var attempts, unknown int
		require.NoError(t, env1.App.Pool.QueryRow(context.Background(), `SELECT count(*),
			count(*) FILTER (WHERE outcome = 'indeterminate') FROM effect_attempts WHERE effect_id = $1`, id).
			Scan(&attempts, &unknown))
		require.Equal(t, map[string]int{"failed": 2, "succeeded": 1}[outcome], attempts, "round %d", round)
		require.Zero(t, unknown, "round %d: the resolve settled the unknown attempt", round)
		t.Logf("round %d (%s): %v", round, outcome, decisions)
	}
}

// resolveRacingBegins resolves effect id to outcome while racers begin
// its key at once, over envs; it answers the begins' answers by status,
// decision and error, and the resolve's status.
func resolveRacingBegins(t *testing.T, racers int, apiKey, id, outcome string, body map[string]any,
	envs ...*apitest.Env) (map[string]int, int) {
	t.Helper()
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		start     = make(chan struct{})
		decisions = map[string]int{}
		resolve   int
	)
	for i := 0; i < racers; i++ {
		env := envs[i%len(envs)]
		wg.Go(func() {
			<-start
			status, out, err := postBegin(env, apiKey, body)
			mu.Lock()
			defer mu.Unlock()
			decisions[fmt.Sprintf("%d %v %v", status, out["decision"], err)]++
		})
	}
	wg.Go(func() {
		<-start
		status, _, err := post(envs[len(envs)-1], "/api/v1/effects/"+id+"/resolve", apiKey, map[string]any{"outcome": outcome})
		mu.Lock()
		defer mu.Unlock()
		resolve = status
		if err != nil {
			decisions["resolve "+err.Error()]++
		}
	})
	close(start)
	wg.Wait()
	return decisions, resolve
}

// Under retry and probe an indeterminate key is begun again at once: an
// operator's resolve racing many such begins from two instances either
// lands first (to succeeded: every begin answers duplicate, none acts; to
// failed: one begin is granted the next attempt) or finds the key leased
// again by the one begin granted, and is refused invalid_state, the
// unknown attempt left for that begin's holder (a probe) to settle. Never
// both: a resolve to succeeded that lands never sits beside an execute,
// and exactly one begin in all is granted the key's next attempt.
func TestRetriesRacingAResolveOfTheirKey(t *testing.T) {
	t.Parallel()
	c, env1, env2, ws := twoInstances(t)
	const racers = 40
	landed := map[string]int{}
	for round := 0; round < 12; round++ {
		policy := []string{"retry", "probe"}[round%2]
		outcome := []string{"succeeded", "succeeded", "failed", "failed"}[round%4]
		env1.Must(http.StatusOK, "PUT", "/api/v1/policies/api.call", ws.Key,
			map[string]any{"on_indeterminate": policy, "lease_seconds": 5})
		body := charge(key("retried"), 0)
		d := env1.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, body).JSON()
		require.Equal(t, "execute", d["decision"])
		id := str(d["effect_id"])
		c.Add(6 * time.Second) // lapsed unreported: indeterminate

		decisions, resolve := resolveRacingBegins(t, racers, ws.Key, id, outcome, body, env1, env2)
		msg := fmt.Sprintf("round %d (%s, resolve %s %d): %v", round, policy, outcome, resolve, decisions)
		executed := decisions["200 execute <nil>"]
		var attempts, unknown int
		require.NoError(t, env1.App.Pool.QueryRow(context.Background(), `SELECT count(*),
			count(*) FILTER (WHERE outcome = 'indeterminate') FROM effect_attempts WHERE effect_id = $1`, id).
			Scan(&attempts, &unknown))
		switch {
		case resolve == http.StatusOK && outcome == "succeeded":
			require.Equal(t, map[string]int{"200 duplicate <nil>": racers}, decisions, msg)
			require.Equal(t, []int{1, 0}, []int{attempts, unknown}, msg)
		case resolve == http.StatusOK: // to failed: the key is free again
			require.Equal(t, 1, executed, msg)
			require.Equal(t, racers, executed+decisions["200 in_flight <nil>"], msg)
			require.Equal(t, []int{2, 0}, []int{attempts, unknown}, msg)
		case resolve == http.StatusConflict: // a begin leased the key first
			require.Equal(t, 1, executed, msg)
			require.Equal(t, racers, executed+decisions["200 in_flight <nil>"], msg)
			require.Equal(t, []int{2, 1}, []int{attempts, unknown}, msg)
		default:
			t.Fatal(msg)
		}
		landed[fmt.Sprintf("%s resolve %d", outcome, resolve)]++
	}
	t.Logf("%v", landed)
}

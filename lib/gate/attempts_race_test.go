package gate_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// max_attempts counts every execute grant (API.md §2.1): a key whose
// lease lapsed, or whose attempt was reported failed, begun by many callers
// at once from two instances is granted exactly one new attempt each time,
// and never more than max_attempts in all; every begin after that is
// refused max_attempts_exceeded, however many race it.
func TestConcurrentBeginsAfterLapsesNeverPassMaxAttempts(t *testing.T) {
	t.Parallel()
	c := newClock()
	env1 := apitest.Start(t, apitest.WithNow(c.Now))
	env2 := apitest.Start(t, apitest.WithNow(c.Now))
	ws := env1.Signup()
	const maxAttempts, racers = 3, 100
	env1.Must(http.StatusOK, "PUT", "/api/v1/policies/api.call", ws.Key,
		map[string]any{"on_indeterminate": "retry", "max_attempts": maxAttempts, "lease_seconds": 5})
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

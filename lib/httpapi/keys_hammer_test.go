package httpapi_test

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
)

// keyCall is one request a hammered key sends, by racer and round;
// cached, a read that another instance than the revoking one may still
// answer from its cache for up to KEY_CACHE_TTL after the revocation.
type keyCall struct {
	method, path string
	body         func(racer, round int) any
	cached       bool
}

// revokedKeyCalls are calls that change something (or read the calling key
// from the database) which README promises refuse a revoked key on every
// instance once the revocation has committed, whatever the cache (begin and
// enqueue check the key in their own statements, the others read it
// afresh), and a read the revoking instance refuses at once.
func revokedKeyCalls(runID string) []keyCall {
	return []keyCall{
		{"POST", "/api/v1/effects/begin", func(racer, round int) any {
			return map[string]any{"effect_type": "email.send", "idempotency_key": fmt.Sprintf("r%d-%d", racer, round),
				"payload": map[string]any{}}
		}, false},
		{"POST", "/api/v1/runs/" + runID + "/steps", func(racer, round int) any {
			return map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"racer": racer, "round": round}}
		}, false},
		{"POST", "/api/v1/runs", func(int, int) any { return map[string]any{"name": "hammered"} }, false},
		{"PUT", "/api/v1/policies/hammer.type", func(_, round int) any { return map[string]any{"max_attempts": 1 + round%9} }, false},
		{"POST", "/api/v1/keys", func(int, int) any { return map[string]any{"name": "child", "preset": "AGENT"} }, false},
		{"POST", "/api/v1/circuits/hammer.type/open", func(int, int) any { return map[string]any{"action": "deny"} }, false},
		{"GET", "/api/v1/keys/current", func(int, int) any { return nil }, false},
		{"GET", "/api/v1/policies", func(int, int) any { return nil }, true},
	}
}

// keyAnswer is one answer to a hammered key, the instance that gave it
// and whether its request was sent once the revocation had answered.
type keyAnswer struct {
	call         keyCall
	instance     int
	afterRevoked bool
	r            *apitest.Response
}

// Racers on two instances, each caching the key for KEY_CACHE_TTL, send
// calls that change something with one OPERATOR key while the first
// instance revokes it: none sent once the revoke has answered succeeds
// (each is 401), on either instance, though the cache would still serve
// the key, and before the revoke they acted. A read the revoking instance
// answers is 401 from then on too; the other may answer reads from its
// cache, until KEY_CACHE_TTL after the revocation.
func TestARevokeRacingItsKeysCallsOnTwoInstances(t *testing.T) {
	t.Parallel()
	const ttl = time.Minute
	cacheFor := apitest.WithConfig(func(c *config.Config) { c.KeyCacheTTL = ttl })
	e := newJobsEnvWith(t, []apitest.Option{cacheFor})
	instances := e.twoInstances(cacheFor)
	other := instances[1]
	created := e.Must(http.StatusCreated, "POST", "/api/v1/keys", e.ws.Key, map[string]any{"name": "hammered", "preset": "OPERATOR"}).JSON()
	secret, id := created["secret"].(string), created["id"].(string)
	calls := revokedKeyCalls(e.run())
	const racers, roundsAfter = 8, 3
	answers := make([][]keyAnswer, racers)
	var revoked atomic.Bool
	var warm sync.WaitGroup // each racer has had an answer on its instance
	warm.Add(racers)
	revoker := racers
	apitest.StartTogether(racers+1, func(i int) {
		if i == revoker {
			warm.Wait()
			e.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+id, e.ws.Key, nil)
			revoked.Store(true)
			return
		}
		env, after := instances[i%2], 0
		for round := 0; after < roundsAfter; round++ {
			call := calls[(i+round)%len(calls)]
			sentAfter := revoked.Load()
			r := env.Do(call.method, call.path, secret, call.body(i, round))
			answers[i] = append(answers[i], keyAnswer{call, i % 2, sentAfter, r})
			if round == 0 {
				warm.Done()
			}
			if sentAfter {
				after++
			}
		}
	})
	acted := 0
	for i, racer := range answers {
		for _, a := range racer {
			if a.afterRevoked && (!a.call.cached || a.instance == 0) {
				require.Equal(t, http.StatusUnauthorized, a.r.Status, "racer %d: %s %s sent after the revoke: %s",
					i, a.call.method, a.call.path, a.r.Body)
			} else if a.r.Status < 300 {
				acted++
			}
		}
	}
	require.NotZero(t, acted, "the key acted before its revoke")
	require.Equal(t, http.StatusOK, other.Do("GET", "/api/v1/policies", secret, nil).Status,
		"the other instance's cache still serves the key: the refusals above were the database's")
	e.clock.Add(ttl + time.Second)
	for _, env := range instances {
		require.Equal(t, http.StatusUnauthorized, env.Do("GET", "/api/v1/policies", secret, nil).Status, "past KEY_CACHE_TTL")
	}
}

// A burst of one rate-limited key's requests released together on two
// instances admits exactly its rate_limit_per_minute in the window, first
// while neither instance has the key cached (each request authenticates and
// counts in one statement) and then while both have (the count alone); the
// rest are 429 rate_limited with a retry_after_seconds.
func TestARateLimitHoldsUnderABurstOnTwoInstances(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	instances := e.twoInstances()
	const limit, racers = 7, 30
	for _, warm := range []bool{false, true} {
		limited := e.Key(e.ws, map[string]any{"name": "limited", "preset": "OPERATOR", "rate_limit_per_minute": limit})
		admitted := 0
		if warm {
			for _, env := range instances {
				env.Must(http.StatusOK, "GET", "/api/v1/policies", limited, nil)
				admitted++
			}
		}
		answers := make([]*apitest.Response, racers)
		apitest.StartTogether(racers, func(i int) {
			answers[i] = instances[i%2].Do("GET", "/api/v1/policies", limited, nil)
		})
		require.Equal(t, limit, admitted+countAdmitted(t, answers, http.StatusOK), "warm %v", warm)
	}
}

// twoInstances is e's instance and another over the same database and
// clock, started with opts.
func (e *jobsEnv) twoInstances(opts ...apitest.Option) []*apitest.Env {
	e.T.Helper()
	return []*apitest.Env{e.Env, apitest.Start(e.T, append([]apitest.Option{apitest.WithNow(e.clock.Now)}, opts...)...)}
}

// countAdmitted counts the answers of a rate-limited burst with the status
// of an admitted request, requiring every other to be 429 rate_limited
// with a retry_after_seconds.
func countAdmitted(t *testing.T, answers []*apitest.Response, admittedStatus int) int {
	t.Helper()
	admitted := 0
	for i, r := range answers {
		switch r.Status {
		case admittedStatus:
			admitted++
		case http.StatusTooManyRequests:
			require.Equal(t, "rate_limited", r.ErrorCode(), "racer %d", i)
			require.Positive(t, r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["retry_after_seconds"])
		default:
			t.Fatalf("racer %d answered %d: %s", i, r.Status, r.Body)
		}
	}
	return admitted
}

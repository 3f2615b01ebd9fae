package httpapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idempotency"
)

func idemKey(k string) http.Header { return http.Header{"Idempotency-Key": {k}} }

// countKeys is how many keys the workspace of key lists.
func countKeys(t *testing.T, env *apitest.Env, key string) int {
	t.Helper()
	return len(env.Must(http.StatusOK, "GET", "/api/v1/keys?limit=200", key, nil).JSON()["data"].([]any))
}

// A create sent again under its Idempotency-Key answers what the first
// answered, the new key's secret included, and mints nothing more; the
// header was ignored before, so a client that lost the answer made a second
// key. The key is the caller's own: another API key acts under the same
// value, and another request under it is refused.
func TestIdempotencyKeyAnswersARetriedCreateOnce(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	body := map[string]any{"name": "agent", "preset": "AGENT"}
	first := env.DoWith("POST", "/api/v1/keys", ws.Key, idemKey("mint-agent"), body)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	require.Empty(t, first.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, 2, countKeys(t, env, ws.Key))

	again := env.DoWith("POST", "/api/v1/keys", ws.Key, idemKey("mint-agent"), body)
	require.Equal(t, http.StatusCreated, again.Status)
	require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, first.Header.Get("X-Request-Id"), again.Header.Get(httpapi.OriginalRequestHeader))
	require.NotEqual(t, first.Header.Get("X-Request-Id"), again.Header.Get("X-Request-Id"))
	require.Equal(t, string(first.Body), string(again.Body))
	require.Equal(t, 2, countKeys(t, env, ws.Key), "nothing more minted")

	// Another body is another request, even one a lenient reader takes for
	// the same: the route would refuse a repeated field (QA).
	for _, other := range []any{map[string]any{"name": "other"}, `{"name":"x","name":"agent","preset":"AGENT"}`} {
		r := env.DoWith("POST", "/api/v1/keys", ws.Key, idemKey("mint-agent"), other)
		require.Equal(t, http.StatusConflict, r.Status)
		require.Equal(t, "idempotency_key_reuse", r.ErrorCode())
	}
	route := env.DoWith("POST", "/api/v1/webhooks", ws.Key, idemKey("mint-agent"),
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}})
	require.Equal(t, "idempotency_key_reuse", route.ErrorCode(), "another route is another request")
	require.Equal(t, 2, countKeys(t, env, ws.Key))

	operator2 := env.Key(ws, map[string]any{"name": "second operator", "preset": "OPERATOR"})
	theirs := env.DoWith("POST", "/api/v1/keys", operator2, idemKey("mint-agent"), body)
	require.Equal(t, http.StatusCreated, theirs.Status)
	require.Empty(t, theirs.Header.Get(httpapi.ReplayedHeader))
	require.NotEqual(t, first.JSON()["id"], theirs.JSON()["id"])
	require.Equal(t, 4, countKeys(t, env, ws.Key))

	// Without the header, every create acts.
	env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, body)
	env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, body)
	require.Equal(t, 6, countKeys(t, env, ws.Key))
}

// A refused request records nothing, so the corrected request may use its
// key; a malformed or repeated header is refused before anything acts.
func TestIdempotencyKeyOfARefusedCreateIsFree(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	bad := env.DoWith("POST", "/api/v1/keys", ws.Key, idemKey("k"), map[string]any{"name": "x", "scopes": []string{"no:such"}})
	require.Equal(t, http.StatusBadRequest, bad.Status)
	fixed := env.DoWith("POST", "/api/v1/keys", ws.Key, idemKey("k"), map[string]any{"name": "x", "preset": "AGENT"})
	require.Equal(t, http.StatusCreated, fixed.Status, "%s", fixed.Body)
	require.Empty(t, fixed.Header.Get(httpapi.ReplayedHeader))

	body := map[string]any{"name": "y", "preset": "AGENT"}
	for name, values := range map[string][]string{
		"empty":    {""},
		"too long": {strings.Repeat("x", 256)},
		"control":  {"a\tb"},
		"twice":    {"a", "a"},
	} {
		r := env.DoWith("POST", "/api/v1/keys", ws.Key, http.Header{"Idempotency-Key": values}, body)
		require.Equal(t, http.StatusBadRequest, r.Status, name)
		require.Contains(t, string(r.Body), `"field":"Idempotency-Key"`, name)
	}
	require.Equal(t, 2, countKeys(t, env, ws.Key))
}

// Thirty clients sending one webhook create under one key at once make one
// webhook: each is answered its secret, or told the first is still acting.
func TestConcurrentIdempotentCreatesMakeOneWebhook(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	body := map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}}
	const clients = 30
	answers := make([]*apitest.Response, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() { answers[i] = env.DoWith("POST", "/api/v1/webhooks", ws.Key, idemKey("hook-1"), body) })
	}
	wg.Wait()
	var created []string
	for _, a := range answers {
		switch a.Status {
		case http.StatusCreated:
			created = append(created, string(a.Body))
		case http.StatusConflict:
			require.Equal(t, "retry_request", a.ErrorCode(), "%s", a.Body)
		default:
			t.Fatalf("answered %d: %s", a.Status, a.Body)
		}
	}
	require.NotEmpty(t, created)
	for _, c := range created {
		require.Equal(t, created[0], c)
	}
	hooks := env.Must(http.StatusOK, "GET", "/api/v1/webhooks", ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, hooks, 1)
	again := env.DoWith("POST", "/api/v1/webhooks", ws.Key, idemKey("hook-1"), body)
	require.Equal(t, created[0], string(again.Body))
}

// Every create without a key of its own takes the header; the tool test
// (a synthetic run each time) answers the same run again.
func TestToolTestUnderAnIdempotencyKeyRunsOnce(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	body := map[string]any{"version": "1", "input": map[string]any{"to": "a"}}
	first := env.DoWith("POST", "/api/v1/tools/send/test", ws.Key, idemKey("t1"), body)
	require.Equal(t, http.StatusOK, first.Status, "%s", first.Body)
	again := env.DoWith("POST", "/api/v1/tools/send/test", ws.Key, idemKey("t1"), body)
	require.Equal(t, string(first.Body), string(again.Body))
	other := env.DoWith("POST", "/api/v1/tools/mail/test", ws.Key, idemKey("t1"), body)
	require.Equal(t, "idempotency_key_reuse", other.ErrorCode(), "another tool's path is another request")

}

// The routes that take the header are the creates without a key of their
// own; each answers JSON (what is kept and given again), and acts within
// idempotency.ActingTime (its time and the answer's recording), which a
// claim outlives, so it lapses only when its request is gone.
func TestIdempotentRoutes(t *testing.T) {
	t.Parallel()
	var idempotent []string
	for _, r := range httpapi.Routes() {
		if !r.Idempotent {
			continue
		}
		idempotent = append(idempotent, r.Name)
		require.Empty(t, r.ContentType, r.Name)
		timeout := r.Timeout
		if timeout == 0 {
			timeout = httpapi.DefaultTimeout
		}
		require.LessOrEqual(t, timeout+idempotency.StoreTimeout, idempotency.ActingTime, r.Name)
	}
	require.Less(t, idempotency.ActingTime, idempotency.ClaimTTL)
	require.ElementsMatch(t, []string{"keys.create", "webhooks.create", "contracts.publish", "tools.test",
		"workers.register", "steps.replay"}, idempotent)
}

// A request that may have acted (its database lost mid-statement, a 500)
// keeps the key until its claim lapses: a retry is told to wait, not to act
// again while the first may have committed (QA: a retry after a 503 with an
// unknown outcome made a second resource). One refused before it acted, or
// whose database was never reached, frees it at once.
func TestIdempotencyKeyOfARequestThatMayHaveActedIsHeld(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	var calls atomic.Int32
	failures := map[string]error{
		"lost":        apierr.DatabaseLost(errors.New("connection closed")),
		"raw":         errors.New("something broke after the commit"),
		"not-applied": apierr.DatabaseUnavailable(errors.New("connection refused")),
		"refused":     apierr.InvalidField("name", "is taken"),
	}
	srv := httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{{
		Method: "POST", Pattern: "/api/v1/test/{outcome}", Name: "test.create", Status: 201, Idempotent: true,
		Scopes: []string{auth.ScopeKeysWrite},
		Handle: func(ctx context.Context, c *httpapi.Call) (any, error) {
			if calls.Add(1) == 1 {
				return nil, failures[c.R.PathValue("outcome")]
			}
			return map[string]any{"ok": true}, nil
		},
	}})
	do := func(outcome string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/api/v1/test/"+outcome, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+ws.Key)
		req.Header.Set(idempotency.Header, "create-"+outcome)
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		return rec
	}
	for outcome, held := range map[string]bool{"lost": true, "raw": true, "not-applied": false, "refused": false} {
		calls.Store(0)
		first := do(outcome)
		require.GreaterOrEqual(t, first.Code, 400, outcome)
		retry := do(outcome)
		if held {
			require.Equal(t, http.StatusConflict, retry.Code, outcome)
			require.Contains(t, retry.Body.String(), `"code":"retry_request"`, outcome)
			require.Equal(t, "1", retry.Header().Get("Retry-After"), outcome)
			require.EqualValues(t, 1, calls.Load(), outcome)
		} else {
			require.Equal(t, http.StatusCreated, retry.Code, "%s: %s", outcome, retry.Body)
			require.EqualValues(t, 2, calls.Load(), outcome)
		}
	}
}

package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/schematags"
	"github.com/getratchet/ratchet/lib/sweep"
	"github.com/getratchet/ratchet/lib/toolname"
)

func readAll(t *testing.T, res *http.Response) string {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return string(b)
}

func TestBadKeysAre401WithoutEcho(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	revoked := env.Key(ws, map[string]any{"name": "r", "preset": "AGENT"})
	var revokedID string
	for _, k := range env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil).JSON()["data"].([]any) {
		if k.(map[string]any)["name"] == "r" {
			revokedID = k.(map[string]any)["id"].(string)
		}
	}
	r := env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+revokedID, ws.Key, nil)
	require.NotNil(t, r.JSON()["revoked_at"])
	// Revoking again answers the same key.
	again := env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+revokedID, ws.Key, nil)
	require.Equal(t, r.JSON()["revoked_at"], again.JSON()["revoked_at"])

	wrong := ws.Key[:len(ws.Key)-1] + "0"
	if wrong == ws.Key {
		wrong = ws.Key[:len(ws.Key)-1] + "1"
	}
	cases := map[string]string{
		"missing":   "",
		"malformed": "not-a-key",
		"wrong":     wrong,
		"revoked":   revoked,
		"unknown":   "rk_00000000000000000000000000_" + strings.Repeat("a", 64),
	}
	for name, key := range cases {
		res := env.Do("GET", "/api/v1/keys", key, nil)
		require.Equal(t, http.StatusUnauthorized, res.Status, name)
		require.Equal(t, "unauthorized", res.ErrorCode(), name)
		// RFC 9110 §15.5.2: a 401 names the scheme that would answer it.
		require.Equal(t, `Bearer realm="ratchet"`, res.Header.Get("WWW-Authenticate"), name)
		if key != "" {
			require.NotContains(t, string(res.Body), key, name)
		}
	}
	// A non-Bearer scheme is no key at all.
	req, _ := http.NewRequest("GET", env.Server.URL+"/api/v1/keys", nil)
	req.Header.Set("Authorization", "Basic "+ws.Key)
	res, err := env.Client.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	res.Body.Close()
}

func TestScopeMatrix(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	keys := map[string]string{
		"OPERATOR": ws.Key,
		"AGENT":    env.Key(ws, map[string]any{"name": "a", "preset": "AGENT"}),
		"INGEST":   env.Key(ws, map[string]any{"name": "i", "preset": "INGEST"}),
		"WORKER":   env.Key(ws, map[string]any{"name": "w", "preset": "WORKER", "tools": []string{"send@1"}}),
	}
	// Every authenticated route answers 403 forbidden naming the missing
	// scopes when the key lacks them, before touching anything else.
	checked := 0
	for _, route := range httpapi.Routes() {
		if route.Auth != httpapi.AuthKey || len(route.Scopes) == 0 {
			continue
		}
		path := pathFor(route.Pattern)
		for preset, key := range keys {
			res := env.Do(route.Method, path, key, "{}")
			if hasAll(preset, route.Scopes) {
				if res.Status == http.StatusForbidden && res.ErrorCode() == "forbidden" {
					require.False(t, containsAny(requiredOf(res), route.Scopes), "%s %s as %s: %s", route.Method, path, preset, res.Body)
				}
				continue
			}
			checked++
			require.Equal(t, http.StatusForbidden, res.Status, "%s %s as %s: %s", route.Method, path, preset, res.Body)
			require.Equal(t, "forbidden", res.ErrorCode())
			require.ElementsMatch(t, missing(preset, route.Scopes), requiredOf(res))
		}
	}
	require.Positive(t, checked)
}

// A route that any one of several scopes opens (AnyScopes) refuses a key
// holding none of them with detail.required naming the first, as every
// route does, and detail.any_of naming each alternative; a key holding any
// one of them passes.
func TestScopeMatrixAnyOf(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	checked := 0
	for _, route := range httpapi.Routes() {
		if route.Auth != httpapi.AuthKey || len(route.AnyScopes) == 0 {
			continue
		}
		path := pathFor(route.Pattern)
		for _, scope := range route.AnyScopes {
			key := env.Key(ws, map[string]any{"name": "one", "scopes": append([]string{scope}, route.Scopes...)})
			res := env.Do(route.Method, path, key, "{}")
			require.NotEqual(t, http.StatusForbidden, res.Status, "%s %s with %s: %s", route.Method, path, scope, res.Body)
		}
		key := env.Key(ws, map[string]any{"name": "none", "scopes": append([]string{"webhooks:write"}, route.Scopes...)})
		res := env.Do(route.Method, path, key, "{}")
		require.Equal(t, http.StatusForbidden, res.Status, "%s %s: %s", route.Method, path, res.Body)
		detail := res.JSON()["error"].(map[string]any)["detail"].(map[string]any)
		require.Equal(t, []any{route.AnyScopes[0]}, detail["required"])
		anyOf := make([]any, len(route.AnyScopes))
		for i, s := range route.AnyScopes {
			anyOf[i] = s
		}
		require.Equal(t, anyOf, detail["any_of"])
		checked++
	}
	require.Positive(t, checked)
}

var presetScopes = map[string][]string{
	"AGENT":  {"effects:begin", "effects:report"},
	"INGEST": {"runs:write", "runs:read"},
	"WORKER": {"jobs:work"},
}

func hasAll(preset string, scopes []string) bool { return len(missing(preset, scopes)) == 0 }

func missing(preset string, scopes []string) []string {
	if preset == "OPERATOR" {
		return nil
	}
	var out []string
	for _, s := range scopes {
		found := false
		for _, h := range presetScopes[preset] {
			found = found || h == s
		}
		if !found {
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

func requiredOf(r *apitest.Response) []string {
	e, _ := r.JSON()["error"].(map[string]any)
	d, _ := e["detail"].(map[string]any)
	raw, _ := d["required"].([]any)
	var out []string
	for _, v := range raw {
		out = append(out, v.(string))
	}
	return out
}

func containsAny(have, want []string) bool {
	for _, h := range have {
		for _, w := range want {
			if h == w {
				return true
			}
		}
	}
	return false
}

// pathFor fills path parameters with well-formed but unknown ids.
func pathFor(pattern string) string {
	out := pattern
	for {
		i := strings.Index(out, "{")
		if i < 0 {
			return out
		}
		j := strings.Index(out[i:], "}")
		out = out[:i] + "x_00000000000000000000000000" + out[i+j+1:]
	}
}

func TestKeysCannotMintWiderScopes(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	minter := env.Key(ws, map[string]any{"name": "m", "scopes": []string{"keys:write", "effects:begin"}})
	r := env.Must(http.StatusForbidden, "POST", "/api/v1/keys", minter, map[string]any{"name": "x", "preset": "AGENT"})
	require.Equal(t, []string{"effects:report"}, requiredOf(r))
	env.Must(http.StatusCreated, "POST", "/api/v1/keys", minter, map[string]any{"name": "x", "scopes": []string{"effects:begin"}})

	// A tools-restricted worker minter cannot widen the tools list either.
	wm := env.Key(ws, map[string]any{"name": "wm", "scopes": []string{"keys:write", "jobs:work"}, "tools": []string{"a@1"}})
	r = env.Must(http.StatusForbidden, "POST", "/api/v1/keys", wm, map[string]any{"name": "x", "preset": "WORKER", "tools": []string{"a@1", "b@2"}})
	require.Equal(t, []string{"tool:b@2"}, requiredOf(r))
	r = env.Must(http.StatusCreated, "POST", "/api/v1/keys", wm, map[string]any{"name": "x", "scopes": []string{"jobs:work"}})
	require.Equal(t, []any{"a@1"}, r.JSON()["tools"], "an unlisted child inherits its creator's tools")
}

// A key revokes only keys whose scopes it holds: one with keys:write alone
// cannot lock the workspace's operators out by revoking their key.
func TestKeysCannotRevokeWiderKeys(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	minter := env.Key(ws, map[string]any{"name": "m", "scopes": []string{"keys:write", "effects:begin"}})
	keys := env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil).JSON()["data"].([]any)
	operatorID := keys[0].(map[string]any)["id"].(string)
	r := env.Must(http.StatusForbidden, "DELETE", "/api/v1/keys/"+operatorID, minter, nil)
	require.Contains(t, requiredOf(r), "policies:write")
	env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil) // the operator key still works

	child := env.Must(http.StatusCreated, "POST", "/api/v1/keys", minter,
		map[string]any{"name": "c", "scopes": []string{"effects:begin"}}).JSON()["id"].(string)
	require.NotNil(t, env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+child, minter, nil).JSON()["revoked_at"])
}

// A key with a spend ceiling or a rate limit cannot create keys: each key
// has counters of its own, so its children would together spend and call
// past its caps (inheriting the caps, three children of a key capped at 100
// micros spent 400). An uncapped key mints capped ones.
func TestCappedKeysCannotMintKeys(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for _, caps := range []map[string]any{{"daily_spend_ceiling_micros": 1000}, {"rate_limit_per_minute": 10}} {
		body := map[string]any{"name": "capped", "scopes": []string{"keys:write", "effects:begin"}}
		for k, v := range caps {
			body[k] = v
		}
		capped := env.Key(ws, body)
		for _, child := range []map[string]any{
			{"name": "c", "scopes": []string{"effects:begin"}},
			{"name": "c", "scopes": []string{"effects:begin"}, "daily_spend_ceiling_micros": 1, "rate_limit_per_minute": 1},
		} {
			r := env.Do("POST", "/api/v1/keys", capped, child)
			require.Equal(t, http.StatusForbidden, r.Status, "%v %v", caps, child)
			require.Equal(t, "forbidden", r.ErrorCode())
			// Every forbidden carries detail.required; nothing is missing
			// here: no scope would help, and detail.reason says why.
			require.Equal(t, map[string]any{"required": []any{}, "reason": "capped_key"},
				r.JSON()["error"].(map[string]any)["detail"])
		}
		// It still reads the keys.
		env.Must(http.StatusOK, "GET", "/api/v1/keys", capped, nil)
	}
	// An uncapped creator mints what it is asked for, capped or not.
	capped := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, map[string]any{"name": "a", "preset": "AGENT",
		"daily_spend_ceiling_micros": 500, "rate_limit_per_minute": 5}).JSON()
	require.EqualValues(t, 500, capped["daily_spend_ceiling_micros"])
	free := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key,
		map[string]any{"name": "f", "preset": "AGENT"}).JSON()
	require.Nil(t, free["daily_spend_ceiling_micros"])
}

func TestKeyValidation(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cases := map[string]struct {
		body  map[string]any
		field string
	}{
		"no name":        {map[string]any{"preset": "AGENT"}, "name"},
		"unknown preset": {map[string]any{"name": "a", "preset": "ROOT"}, "preset"},
		// An empty preset is no preset of the four, not an omitted one
		// (conformance QA: "" was read as absent, so it minted a key from
		// the scopes beside it, or asked for scopes), as every other
		// empty enum string is refused at its field.
		"empty preset":            {map[string]any{"name": "a", "preset": ""}, "preset"},
		"empty preset and scopes": {map[string]any{"name": "a", "preset": "", "scopes": []string{"effects:read"}}, "preset"},
		"null preset":             {map[string]any{"name": "a", "preset": nil, "scopes": []string{"effects:read"}}, "preset"},
		"preset and scopes":       {map[string]any{"name": "a", "preset": "AGENT", "scopes": []string{"effects:begin"}}, "preset"},
		"no scopes":               {map[string]any{"name": "a"}, "scopes"},
		"unknown scope":           {map[string]any{"name": "a", "scopes": []string{"root"}}, "scopes.0"},
		"worker no tools":         {map[string]any{"name": "a", "preset": "WORKER"}, "tools"},
		"bad tool ref":            {map[string]any{"name": "a", "preset": "WORKER", "tools": []string{"send"}}, "tools.0"},
		"negative ceiling":        {map[string]any{"name": "a", "preset": "AGENT", "daily_spend_ceiling_micros": -1}, "daily_spend_ceiling_micros"},
		"zero rate":               {map[string]any{"name": "a", "preset": "AGENT", "rate_limit_per_minute": 0}, "rate_limit_per_minute"},
	}
	for name, tc := range cases {
		r := env.Do("POST", "/api/v1/keys", ws.Key, tc.body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", name, r.Body)
		fields := []string{}
		for _, v := range r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["validation"].([]any) {
			fields = append(fields, v.(map[string]any)["field"].(string))
		}
		require.Contains(t, fields, tc.field, name)
	}
	// Nothing was created by any of them.
	require.Len(t, env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil).JSON()["data"], 1)

	// A tools list is taken on any key, as API.md §1's body shows it (contract
	// QA: an AGENT key sent with "tools": [] was a 400); it restricts only
	// jobs:work, and which keys the key may mint and revoke.
	for _, tools := range [][]string{{}, {"send_welcome_email@1"}} {
		r := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, map[string]any{"name": "agent",
			"scopes": []string{"effects:begin", "effects:report"}, "tools": tools,
			"daily_spend_ceiling_micros": nil, "rate_limit_per_minute": nil}).JSON()
		require.Len(t, r["tools"], len(tools))
		require.Equal(t, []any{"effects:begin", "effects:report"}, r["scopes"])
	}
}

func TestCrossTenantIsNotFound(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	a, b := env.Signup(), env.Signup()
	r := env.Must(http.StatusCreated, "POST", "/api/v1/keys", a.Key, map[string]any{"name": "a", "preset": "AGENT"})
	id := r.JSON()["id"].(string)
	res := env.Must(http.StatusNotFound, "DELETE", "/api/v1/keys/"+id, b.Key, nil)
	require.Equal(t, "not_found", res.ErrorCode())
	env.Must(http.StatusNotFound, "DELETE", "/api/v1/keys/not-an-id", b.Key, nil)
	// And b's listing never shows a's keys.
	require.NotContains(t, string(env.Must(http.StatusOK, "GET", "/api/v1/keys", b.Key, nil).Body), id)
}

func TestRateLimitHoldsAcrossInstancesAndCountsRefusals(t *testing.T) {
	t.Parallel()
	// Freeze the clock mid-minute so the window cannot roll during the test.
	now := time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC)
	clock := apitest.WithNow(func() time.Time { return now })
	a := apitest.Start(t, clock)
	b := apitest.Start(t, clock)
	ws := a.Signup()
	limited := a.Key(ws, map[string]any{"name": "l", "preset": "OPERATOR", "rate_limit_per_minute": 3})
	require.Equal(t, http.StatusOK, a.Do("GET", "/api/v1/keys", limited, nil).Status)
	require.Equal(t, http.StatusOK, b.Do("GET", "/api/v1/keys", limited, nil).Status)
	require.Equal(t, http.StatusOK, a.Do("GET", "/api/v1/keys", limited, nil).Status)
	r := b.Do("GET", "/api/v1/keys", limited, nil)
	require.Equal(t, http.StatusTooManyRequests, r.Status)
	require.Equal(t, "rate_limited", r.ErrorCode())
	detail := r.JSON()["error"].(map[string]any)["detail"].(map[string]any)
	require.Equal(t, float64(30), detail["retry_after_seconds"])
	require.Equal(t, "30", r.Header.Get("Retry-After"))
	// Unlimited keys in the same workspace are unaffected.
	require.Equal(t, http.StatusOK, a.Do("GET", "/api/v1/keys", ws.Key, nil).Status)
	// The next window admits again.
	now = now.Add(time.Minute)
	require.Equal(t, http.StatusOK, a.Do("GET", "/api/v1/keys", limited, nil).Status)
}

// A burst against a rate limit admits exactly the limit, on a cold key
// (its first request authenticates it) and on a cached one alike. (The
// window was spread over rows whose sum each request read from its own
// snapshot: 50 at once against 10 let about 20 through.)
func TestRateLimitIsExactUnderABurst(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC)
	env := apitest.Start(t, apitest.WithNow(func() time.Time { return now }))
	ws := env.Signup()
	for _, warm := range []bool{false, true} {
		limited := env.Key(ws, map[string]any{"name": "l", "preset": "OPERATOR", "rate_limit_per_minute": 10})
		admitted := 0
		if warm {
			require.Equal(t, http.StatusOK, env.Do("GET", "/api/v1/policies", limited, nil).Status)
			admitted++
		}
		statuses := make([]int, 50)
		var wg sync.WaitGroup
		for i := range statuses {
			wg.Add(1)
			go func() {
				defer wg.Done()
				statuses[i] = env.Do("GET", "/api/v1/policies", limited, nil).Status
			}()
		}
		wg.Wait()
		for _, st := range statuses {
			if st == http.StatusOK {
				admitted++
			} else {
				require.Equal(t, http.StatusTooManyRequests, st)
			}
		}
		require.Equal(t, 10, admitted, "warm %v", warm)
	}
}

func TestRevocationReachesOtherInstancesWithinCacheTTL(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := apitest.WithNow(func() time.Time { return now })
	a := apitest.Start(t, clock)
	b := apitest.Start(t, clock, apitest.WithConfig(func(c *config.Config) { c.KeyCacheTTL = 5 * time.Second }))
	ws := a.Signup()
	r := a.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, map[string]any{"name": "x", "preset": "OPERATOR"})
	secret, id := r.JSON()["secret"].(string), r.JSON()["id"].(string)
	require.Equal(t, http.StatusOK, b.Do("GET", "/api/v1/keys", secret, nil).Status) // b caches it
	a.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+id, ws.Key, nil)
	require.Equal(t, http.StatusUnauthorized, a.Do("GET", "/api/v1/keys", secret, nil).Status, "the revoking instance forgets at once")
	require.Equal(t, http.StatusOK, b.Do("GET", "/api/v1/keys", secret, nil).Status, "within the documented bound")
	now = now.Add(6 * time.Second)
	require.Equal(t, http.StatusUnauthorized, b.Do("GET", "/api/v1/keys", secret, nil).Status, "after KEY_CACHE_TTL")
}

// cachingInstanceAndAKey starts two instances over one database, b caching
// keys for an hour, and answers a workspace and an OPERATOR key minted in
// it (its secret and id), which is not its last root key: to be revoked
// on a while b may still hold it.
func cachingInstanceAndAKey(t *testing.T) (a, b *apitest.Env, ws apitest.Workspace, secret, id string) {
	t.Helper()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := apitest.WithNow(func() time.Time { return now })
	a = apitest.Start(t, clock)
	b = apitest.Start(t, clock, apitest.WithConfig(func(c *config.Config) { c.KeyCacheTTL = time.Hour }))
	ws = a.Signup()
	r := a.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, map[string]any{"name": "x", "preset": "OPERATOR"})
	return a, b, ws, r.JSON()["secret"].(string), r.JSON()["id"].(string)
}

// A call that changes something and does not check the key in its own
// statements (a policy, a webhook, a run, a circuit...) reads the key
// afresh: a key revoked on one instance changes nothing on another whose
// cache still holds it. Reads still pass there within KEY_CACHE_TTL. Every
// such route of the table is tried, so a new one is covered as it lands.
func TestARevokedKeyChangesNothingOnAnotherInstance(t *testing.T) {
	t.Parallel()
	a, b, ws, secret, id := cachingInstanceAndAKey(t)
	b.Must(http.StatusOK, "GET", "/api/v1/keys", secret, nil) // b caches it

	var changing []httpapi.Route
	var checking []string
	for _, rt := range httpapi.Routes() {
		if rt.ChecksKey {
			checking = append(checking, rt.Name)
		}
		if rt.Method != http.MethodGet && rt.Auth == httpapi.AuthKey && !rt.Settles && !rt.ChecksKey && rt.Raw == nil {
			changing = append(changing, rt)
		}
	}
	// The routes trusted to check the key themselves are exactly those with
	// a revocation test of their own (this test leaves them out): the
	// benchmarked begin, enqueue and claim (checkedInTheirStatement), and
	// the replay, the mint and the revoke, which lock the key's row
	// (TestAKeyRevokedAsItWritesWritesNothing sends them too).
	require.ElementsMatch(t, []string{"effects.begin", "runs.enqueue", "workers.claim", "steps.replay", "keys.create",
		"keys.revoke"}, checking)
	var names []string
	for _, rt := range changing {
		names = append(names, rt.Name)
	}
	require.Subset(t, names, []string{"policies.put", "webhooks.create", "runs.create", "circuits.stop",
		"endpoints.policy.put", "workers.register", "effects.resolve", "approvals.approve", "tools.test"})
	path := func(rt httpapi.Route) string {
		p := rt.Pattern
		for _, param := range rt.PathParams() {
			p = strings.ReplaceAll(p, "{"+param+"}", "nothing")
		}
		return p
	}
	for _, rt := range changing {
		// While the key is live, each route gets past its authentication
		// (to whatever its empty body earns).
		require.NotEqual(t, http.StatusUnauthorized, b.Do(rt.Method, path(rt), secret, map[string]any{}).Status, rt.Name)
	}

	a.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+id, ws.Key, nil)
	for _, rt := range changing {
		got := b.Do(rt.Method, path(rt), secret, map[string]any{})
		require.Equal(t, http.StatusUnauthorized, got.Status, "%s: %s", rt.Name, got.Body)
	}
	created := b.Do("POST", "/api/v1/keys", secret, map[string]any{"name": "escape", "preset": "OPERATOR"})
	require.Equal(t, http.StatusUnauthorized, created.Status, "a revoked key mints no key to outlive it")
	var keys int
	require.NoError(t, a.App.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM api_keys WHERE workspace_id = $1 AND name = 'escape'`, ws.ID).Scan(&keys))
	require.Zero(t, keys)
	require.Equal(t, http.StatusUnauthorized, b.Do("DELETE", "/api/v1/keys/"+
		a.Must(http.StatusOK, "GET", "/api/v1/keys/current", ws.Key, nil).JSON()["id"].(string), secret, nil).Status,
		"a revoked key revokes nothing, its key read from b's cache")
	require.Equal(t, http.StatusOK, b.Do("GET", "/api/v1/keys", secret, nil).Status, "reads: within the documented bound")

	// A request whose read of the key came before the revocation mints
	// nothing either: the creator's row is checked as the key is minted.
	_, err := b.App.Server.Auth.CreateKey(context.Background(),
		&auth.Principal{KeyID: id, WorkspaceID: ws.ID, Scopes: auth.Presets["OPERATOR"]},
		auth.CreateKeyRequest{Name: "escape", Preset: jsonx.Optional[string]{Set: true, Value: "AGENT"}})
	var refused *apierr.Error
	require.ErrorAs(t, err, &refused)
	require.Equal(t, http.StatusUnauthorized, refused.Status)
}

// The answer kept for a mint's Idempotency-Key holds the minted key's
// secret, and a mint may take its key from the instance's cache (it checks
// the key as it mints): given again, it is given only to a live key. A
// minting key revoked on another instance was handed, within
// KEY_CACHE_TTL, the secret of the live key it had minted (security QA).
func TestAKeptAnswerIsNotGivenToARevokedKey(t *testing.T) {
	t.Parallel()
	a, b, ws, minter, minterID := cachingInstanceAndAKey(t)

	body := map[string]any{"name": "child", "preset": "AGENT"}
	first := b.DoWith("POST", "/api/v1/keys", minter, idemKey("mint-child"), body) // b caches the minter
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	child := first.JSON()["secret"].(string)
	again := b.DoWith("POST", "/api/v1/keys", minter, idemKey("mint-child"), body)
	require.Equal(t, http.StatusCreated, again.Status, "a live key is answered again")
	require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader))

	a.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+minterID, ws.Key, nil) // the child stays live
	require.Equal(t, http.StatusOK, b.Do("GET", "/api/v1/keys/current", child, nil).Status)
	require.Equal(t, http.StatusOK, b.Do("GET", "/api/v1/keys", minter, nil).Status, "b still holds the minter")
	revoked := b.DoWith("POST", "/api/v1/keys", minter, idemKey("mint-child"), body)
	require.Equal(t, http.StatusUnauthorized, revoked.Status, "%s", revoked.Body)
	require.Equal(t, "unauthorized", revoked.ErrorCode())
	require.NotContains(t, string(revoked.Body), child)
	require.Empty(t, revoked.Header.Get(httpapi.ReplayedHeader))

	// Its answer erased with the child's revoke, it is still 401, not the
	// 404 that tells a live key its create acted.
	a.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+first.JSON()["id"].(string), ws.Key, nil)
	erased := b.DoWith("POST", "/api/v1/keys", minter, idemKey("mint-child"), body)
	require.Equal(t, http.StatusUnauthorized, erased.Status, "%s", erased.Body)
	require.Empty(t, erased.Header.Get(httpapi.ReplayedHeader))
}

func TestSignupModes(t *testing.T) {
	t.Parallel()
	closed := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.SignupMode = "closed" }))
	r := closed.Must(http.StatusForbidden, "POST", "/api/v1/workspaces", "", map[string]any{"name": "a"})
	require.Equal(t, "forbidden", r.ErrorCode())
	require.Equal(t, map[string]any{"required": []any{}, "reason": "signup_closed"}, r.JSON()["error"].(map[string]any)["detail"],
		"no scope opens it; the reason says what is closed")
	// Refused before its body is read, as a keyed route refuses a key
	// first (QA: a bad body answered 400, as if signup were open).
	for _, body := range []any{map[string]any{"name": "a", "surprise": 1}, map[string]any{"name": 7}} {
		closed.Must(http.StatusForbidden, "POST", "/api/v1/workspaces", "", body)
	}

	// An hour of its own, apart from other tests' wrong tokens and from
	// this test's earlier runs (go test -count): they count against
	// auth.SignupTokenMissesPerHour, across the package's database.
	tokenHour := time.Date(2030, 1, 1, 0, 30, 0, 0, time.UTC).Add(time.Duration(rand.N(1_000_000)) * time.Hour)
	// Set with the newline an env file or a pasted secret brings, which no
	// header carries (QA: every signup was refused 401).
	token := apitest.Start(t, apitest.WithNow(func() time.Time { return tokenHour }),
		apitest.WithConfig(func(c *config.Config) { c.SignupMode = "token"; c.SignupToken = " let-me-in\n" }))
	token.Must(http.StatusUnauthorized, "POST", "/api/v1/workspaces", "", map[string]any{"name": "a"})
	token.Must(http.StatusUnauthorized, "POST", "/api/v1/workspaces", "", map[string]any{"name": "a", "surprise": 1})
	req, _ := http.NewRequest("POST", token.Server.URL+"/api/v1/workspaces", strings.NewReader(`{"name":"a"}`))
	req.Header.Set("Ratchet-Signup-Token", "let-me-in")
	res, err := token.Client.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.StatusCode)
	res.Body.Close()
	// Sent twice, in either order, it is no token (QA: the first counted).
	for _, pair := range [][2]string{{"let-me-in", "bad"}, {"bad", "let-me-in"}, {"let-me-in", "let-me-in"}} {
		req, _ := http.NewRequest("POST", token.Server.URL+"/api/v1/workspaces", strings.NewReader(`{"name":"a"}`))
		req.Header.Add("Ratchet-Signup-Token", pair[0])
		req.Header.Add("Ratchet-Signup-Token", pair[1])
		res, err := token.Client.Do(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusUnauthorized, res.StatusCode, "%v", pair)
		res.Body.Close()
	}

	// A unique rate keeps this test's bucket apart from parallel tests, and
	// an hour of its own apart from this test's earlier runs (go test -count).
	now := time.Date(2030, 1, 1, 0, 30, 0, 0, time.UTC).Add(time.Duration(rand.N(1_000_000)) * time.Hour)
	limited := apitest.Start(t, apitest.WithNow(func() time.Time { return now }),
		apitest.WithConfig(func(c *config.Config) { c.SignupRatePerHour = 2 }))
	limited.Must(http.StatusCreated, "POST", "/api/v1/workspaces", "", map[string]any{"name": "a"})
	// A malformed request spends none of the rate, whatever is wrong with it.
	limited.Must(http.StatusBadRequest, "POST", "/api/v1/workspaces", "", map[string]any{"name": "a", "surprise": 1})
	limited.Must(http.StatusBadRequest, "POST", "/api/v1/workspaces", "", map[string]any{"name": " "})
	limited.Must(http.StatusCreated, "POST", "/api/v1/workspaces", "", map[string]any{"name": "a"})
	r = limited.Must(http.StatusTooManyRequests, "POST", "/api/v1/workspaces", "", map[string]any{"name": "a"})
	require.Equal(t, "rate_limited", r.ErrorCode())
	require.NotContains(t, r.JSON()["error"].(map[string]any)["message"], "key", "signup takes no key")
}

// Guesses at SIGNUP_TOKEN are bounded: every instance together answers at
// most auth.SignupTokenMissesPerHour wrong tokens an hour, exactly under a
// concurrent burst, and then refuses every token, the right one too, 429
// until the hour ends (security QA: guesses were answered 401 without any
// limit, one at a time, as fast as they came). The right token and a
// request without one count nothing.
func TestSignupTokenGuessesAreThrottled(t *testing.T) {
	t.Parallel()
	var now atomic.Pointer[time.Time]
	hour := time.Date(2031, 1, 1, 0, 40, 0, 0, time.UTC).Add(time.Duration(rand.N(1_000_000)) * time.Hour)
	now.Store(&hour)
	var instances [2]*apitest.Env
	for i := range instances {
		instances[i] = apitest.Start(t, apitest.WithNow(func() time.Time { return *now.Load() }),
			apitest.WithConfig(func(c *config.Config) { c.SignupMode = "token"; c.SignupToken = "let-me-in" }))
	}
	signup := func(env *apitest.Env, token string) *apitest.Response {
		header := http.Header{}
		if token != "" {
			header.Set("Ratchet-Signup-Token", token)
		}
		return env.DoWith("POST", "/api/v1/workspaces", "", header, map[string]any{"name": "guessed"})
	}
	for i := range 3 {
		require.Equal(t, http.StatusCreated, signup(instances[i%2], "let-me-in").Status)
		require.Equal(t, http.StatusUnauthorized, signup(instances[i%2], "").Status)
	}

	guesses := auth.SignupTokenMissesPerHour + 10
	answers := make([]*apitest.Response, guesses)
	apitest.StartTogether(guesses, func(i int) {
		answers[i] = signup(instances[i%2], fmt.Sprintf("guess-%d", i))
	})
	refused := 0
	for i, r := range answers {
		switch r.Status {
		case http.StatusUnauthorized:
			refused++
		case http.StatusTooManyRequests:
			require.Equal(t, "rate_limited", r.ErrorCode(), "guess %d", i)
		default:
			t.Fatalf("guess %d answered %d: %s", i, r.Status, r.Body)
		}
	}
	require.Equal(t, auth.SignupTokenMissesPerHour, refused, "wrong tokens answered, across instances")

	for _, env := range instances {
		r := signup(env, "let-me-in")
		require.Equal(t, http.StatusTooManyRequests, r.Status, "the right token is not told apart: %s", r.Body)
		require.Equal(t, "rate_limited", r.ErrorCode())
		retry := r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["retry_after_seconds"]
		require.EqualValues(t, 20*60, retry, "until the hour ends")
		require.Equal(t, "1200", r.Header.Get("Retry-After"))
		require.NotContains(t, r.JSON()["error"].(map[string]any)["message"], "key", "signup takes no key")
	}

	next := hour.Add(time.Hour)
	now.Store(&next)
	require.Equal(t, http.StatusCreated, signup(instances[0], "let-me-in").Status, "the next hour")
	require.Equal(t, http.StatusUnauthorized, signup(instances[1], "guess").Status)
}

// Not parallel: the sweep acts on every workspace of the package database,
// at this instance's wall clock, a day or more after the fixed clocks of the
// other tests (newClock, 2026-11-29 12:00): run beside them it made their
// live leases lapse (an effect between two begins read "blocked", not
// "in_flight") and could end their RUNNING jobs.
func TestCronSweepNeedsSecret(t *testing.T) {
	env := apitest.Start(t)
	for _, key := range []string{"", "wrong"} {
		r := env.Do("GET", "/api/cron/sweep", key, nil)
		require.Equal(t, http.StatusUnauthorized, r.Status)
		require.Equal(t, "unauthorized", r.ErrorCode())
	}
	r := env.Must(http.StatusOK, "POST", "/api/cron/sweep", "test-cron-secret", nil)
	require.Contains(t, r.JSON(), "changed")
	require.Empty(t, r.JSON()["errors"])
	// It takes no body: an unknown field is refused, as on every route.
	r = env.Do("POST", "/api/cron/sweep", "test-cron-secret", map[string]any{"x": 1})
	require.Equal(t, http.StatusBadRequest, r.Status)
	require.Equal(t, "invalid_request", r.ErrorCode())

	// Unset, every call is refused, and the log says why: on Vercel the
	// schedule is the only sweeper (deployment review: nothing said so).
	var logs apitest.LockedBuffer
	unset := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.CronSecret = "" }),
		apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.Equal(t, http.StatusUnauthorized, unset.Do("GET", "/api/cron/sweep", "", nil).Status)
	require.Contains(t, logs.String(), "CRON_SECRET is not set")
	// Once per instance: the route is public, and a line per call let
	// anyone fill the log with errors (deploy review).
	for range 3 {
		require.Equal(t, http.StatusUnauthorized, unset.Do("POST", "/api/cron/sweep", "x", nil).Status)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "CRON_SECRET is not set"))
	// A warning: on Lambda the sweeper function sweeps, and a call to the
	// route on the public Function URL is someone else's (AL review: it
	// logged an error). Vercel's schedule, the only sweeper there, that
	// never sweeps is an error, once too.
	require.Contains(t, logs.String(), "level=WARN")
	require.NotContains(t, logs.String(), "level=ERROR")
	vercel := http.Header{"User-Agent": {"vercel-cron/1.0"}}
	for range 2 {
		require.Equal(t, http.StatusUnauthorized, unset.DoWith("GET", "/api/cron/sweep", "", vercel, nil).Status)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "level=ERROR"), logs.String())
	require.Contains(t, logs.String(), "Vercel's schedule never sweeps")
	require.Equal(t, 2, strings.Count(logs.String(), "CRON_SECRET is not set"))
}

// HEAD is answered elsewhere as GET without its body; on the cron sweep,
// whose GET does work, it ran a whole pass for a request meant to change
// nothing (ops QA). It is an unknown route there, as any other method the
// path does not take, and the sweep does not run.
func TestCronSweepHeadDoesNotSweep(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	var passes atomic.Int32
	env.App.Server.Sweeper = sweep.New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)),
		sweep.Task{Name: "jobs.lapsed_leases", Run: func(context.Context, time.Time) (int, error) {
			passes.Add(1)
			return 0, nil
		}})
	r := env.Do("HEAD", "/api/cron/sweep", "test-cron-secret", nil)
	require.Equal(t, http.StatusNotFound, r.Status)
	require.Equal(t, "GET, POST", r.Header.Get("Allow"))
	require.Zero(t, passes.Load(), "HEAD ran the sweep")
	env.Must(http.StatusOK, "GET", "/api/cron/sweep", "test-cron-secret", nil)
	require.Equal(t, int32(1), passes.Load(), "GET sweeps")
}

// A CRON_SECRET set with whitespace around it (a newline pasted with it)
// is the secret without it: no Authorization header carries the
// whitespace, and the route refused every sweep, Vercel's own included,
// logging nothing (review). One of whitespace alone is not set: refused,
// and logged as such.
func TestCronSecretIsReadWithoutSurroundingWhitespace(t *testing.T) {
	t.Parallel()
	stub := func(env *apitest.Env) *atomic.Int32 {
		var passes atomic.Int32
		env.App.Server.Sweeper = sweep.New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)),
			sweep.Task{Name: "jobs.lapsed_leases", Run: func(context.Context, time.Time) (int, error) {
				passes.Add(1)
				return 0, nil
			}})
		return &passes
	}
	padded := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.CronSecret = " padded-cron-secret\n" }))
	passes := stub(padded)
	padded.Must(http.StatusOK, "GET", "/api/cron/sweep", "padded-cron-secret", nil)
	require.Equal(t, int32(1), passes.Load())
	require.Equal(t, http.StatusUnauthorized, padded.Do("GET", "/api/cron/sweep", "padded-cron-secre", nil).Status)

	var logs apitest.LockedBuffer
	blank := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.CronSecret = " \t " }),
		apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	passes = stub(blank)
	require.Equal(t, http.StatusUnauthorized, blank.Do("GET", "/api/cron/sweep", "", nil).Status)
	require.Zero(t, passes.Load())
	require.Contains(t, logs.String(), "CRON_SECRET is not set")
}

// A pass that could not reach the database answers 503 beside its result,
// so a scheduler or monitor reading only the status sees the outage (QA: it
// answered 200 with every task failed).
func TestCronSweepAnswers503WhenTheDatabaseIsAway(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	env.App.Server.Sweeper = sweep.New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)),
		sweep.Task{Name: "jobs.lapsed_leases", Run: func(context.Context, time.Time) (int, error) {
			return 0, fmt.Errorf("lapse: %w", io.ErrUnexpectedEOF)
		}})
	r := env.Do("POST", "/api/cron/sweep", "test-cron-secret", nil)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	require.Equal(t, "database_unavailable", r.ErrorCode())
	require.Equal(t, map[string]any{"jobs.lapsed_leases": "failed"}, r.JSON()["errors"])
}

// The workspace's last root key (every scope, no tools list, no ceiling or
// rate limit) cannot be revoked: only a root mints a root, so the workspace
// would lose keys for good (QA; the review found a capped or keys:write-only
// key let the root go). Two concurrent revokes of the last two roots leave
// one.
func TestTheLastRootKeyCannotBeRevoked(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	keyID := func(secret string) string {
		for _, k := range env.Must(http.StatusOK, "GET", "/api/v1/keys", secret, nil).JSON()["data"].([]any) {
			m := k.(map[string]any)
			if strings.HasPrefix(secret, "rk_"+strings.TrimPrefix(m["id"].(string), "key_")) {
				return m["id"].(string)
			}
		}
		t.Fatalf("no key for the secret")
		return ""
	}
	own := keyID(ws.Key)
	last := env.Do("DELETE", "/api/v1/keys/"+own, ws.Key, nil)
	require.Equal(t, http.StatusConflict, last.Status, "%s", last.Body)
	require.Equal(t, "invalid_state", last.ErrorCode())
	require.Contains(t, string(last.Body), "last key with every scope")
	env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil) // still works
	// Keys that cannot mint every other do not count as another root.
	env.Key(ws, map[string]any{"name": "capped operator", "preset": "OPERATOR", "rate_limit_per_minute": 100})
	env.Key(ws, map[string]any{"name": "key manager", "scopes": []string{"keys:write"}})
	require.Equal(t, http.StatusConflict, env.Do("DELETE", "/api/v1/keys/"+own, ws.Key, nil).Status)

	second := env.Key(ws, map[string]any{"name": "second operator", "preset": "OPERATOR"})
	secondID := keyID(second)
	var wg sync.WaitGroup
	statuses := make([]int, 2)
	for i, pair := range [][2]string{{ws.Key, secondID}, {second, own}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = env.Do("DELETE", "/api/v1/keys/"+pair[1], pair[0], nil).Status
		}()
	}
	wg.Wait()
	sort.Ints(statuses)
	require.Contains(t, [][]int{{http.StatusOK, http.StatusConflict}, {http.StatusOK, http.StatusUnauthorized}},
		statuses, "one revoke wins; the other is refused as the last, or its own key is gone")
	alive := 0
	for _, secret := range []string{ws.Key, second} {
		if env.Do("GET", "/api/v1/keys", secret, nil).Status == http.StatusOK {
			alive++
		}
	}
	require.Equal(t, 1, alive, "one key that can manage keys is left")
}

// A key restricted to some tools revokes a jobs:work key only within them, as it mints
// only such keys (QA: a key for a@1 revoked a WORKER key for b@1).
func TestARestrictedKeyRevokesOnlyKeysWithinItsTools(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	restricted := env.Key(ws, map[string]any{"name": "a only", "scopes": []string{"keys:write", "jobs:work"},
		"tools": []string{"a@1"}})
	idOf := func(name string) string {
		for _, k := range env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil).JSON()["data"].([]any) {
			if m := k.(map[string]any); m["name"] == name {
				return m["id"].(string)
			}
		}
		t.Fatalf("no key %s", name)
		return ""
	}
	env.Key(ws, map[string]any{"name": "worker b", "preset": "WORKER", "tools": []string{"b@1"}})
	env.Key(ws, map[string]any{"name": "worker any", "scopes": []string{"jobs:work"}})
	env.Must(http.StatusCreated, "POST", "/api/v1/keys", restricted,
		map[string]any{"name": "worker a", "preset": "WORKER", "tools": []string{"a@1"}})

	r := env.Do("DELETE", "/api/v1/keys/"+idOf("worker b"), restricted, nil)
	require.Equal(t, http.StatusForbidden, r.Status, "%s", r.Body)
	require.Contains(t, string(r.Body), "tool:b@1")
	r = env.Do("DELETE", "/api/v1/keys/"+idOf("worker any"), restricted, nil)
	require.Equal(t, http.StatusForbidden, r.Status, "%s", r.Body)
	require.Contains(t, string(r.Body), "tool:*")
	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+idOf("worker a"), restricted, nil)
	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+idOf("worker b"), ws.Key, nil)

	// Its tools hold it only for keys with jobs:work (README, Keys; the tools
	// field's schema): one without it, no tools list, it mints and revokes as
	// its scopes allow, as it could not lend that key any tool.
	admin := env.Must(http.StatusCreated, "POST", "/api/v1/keys", restricted,
		map[string]any{"name": "key admin", "scopes": []string{"keys:write"}}).JSON()
	require.Nil(t, admin["tools"])
	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+admin["id"].(string), restricted, nil)
}

// Reports and heartbeats settle what a counted call began, so they are
// counted in a bucket of their own, ten times the key's limit and at least
// 600 a minute, not against the limit (QA: a refused report turned the
// outcome its holder knew into an unknown one, and a refused job heartbeat
// lapses its lease); the calls that begin work stay limited, and a flood of
// settling calls is still bounded (review).
func TestSettlingCallsAreNotRateLimited(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC)
	env := apitest.Start(t, apitest.WithNow(func() time.Time { return now }))
	ws := env.Signup()
	limited := env.Key(ws, map[string]any{"name": "l", "preset": "OPERATOR", "rate_limit_per_minute": 3})

	begun := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", limited,
		map[string]any{"effect_type": "email.send", "idempotency_key": "settle-1"}).JSON()
	require.Equal(t, "execute", begun["decision"])
	run := env.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key, map[string]any{"name": "r"}).JSON()["id"].(string)
	env.Must(http.StatusCreated, "POST", "/api/v1/runs/"+run+"/steps", ws.Key,
		map[string]any{"name": "send", "version": "1", "input": map[string]any{}})
	worker := env.Must(http.StatusCreated, "POST", "/api/v1/workers/register", limited,
		map[string]any{"tools": []map[string]string{{"name": "send", "version": "1"}}}).JSON()["workerId"].(string)
	var claimed struct {
		Jobs []map[string]any `json:"jobs"`
	}
	env.Must(http.StatusOK, "POST", "/api/v1/workers/"+worker+"/claim", limited, map[string]any{"limit": 1}).
		Decode(t, &claimed)
	require.Len(t, claimed.Jobs, 1)
	job := claimed.Jobs[0]
	// The window is spent: beginning more is refused.
	r := env.Do("POST", "/api/v1/effects/begin", limited, map[string]any{"effect_type": "email.send", "idempotency_key": "settle-2"})
	require.Equal(t, "rate_limited", r.ErrorCode())

	effect := "/api/v1/effects/" + begun["effect_id"].(string)
	token := begun["lease_token"]
	env.Must(http.StatusOK, "POST", effect+"/heartbeat", limited, map[string]any{"lease_token": token})
	env.Must(http.StatusOK, "POST", "/api/v1/jobs/"+job["jobId"].(string)+"/heartbeat", limited,
		map[string]any{"leaseToken": job["leaseToken"]})
	reported := env.Must(http.StatusOK, "POST", effect+"/report", limited,
		map[string]any{"lease_token": token, "outcome": "succeeded"}).JSON()
	require.Equal(t, "succeeded", reported["state"])
	batch := env.Must(http.StatusOK, "POST", "/api/v1/jobs/report", limited, map[string]any{"reports": []any{
		map[string]any{"jobId": job["jobId"], "leaseToken": job["leaseToken"], "status": "SUCCEEDED"}}}).JSON()
	require.Equal(t, "SUCCEEDED", batch["results"].([]any)[0].(map[string]any)["status"], "%v", batch)
	env.Must(http.StatusOK, "POST", "/api/v1/jobs/"+job["jobId"].(string)+"/report", limited,
		map[string]any{"leaseToken": job["leaseToken"], "status": "SUCCEEDED"})
	// They were not counted against the limit: the window is as spent as before.
	r = env.Do("GET", "/api/v1/keys", limited, nil)
	require.Equal(t, "rate_limited", r.ErrorCode())
	require.Equal(t, "30", r.Header.Get("Retry-After"))
	// Their own bucket is bounded: 600 this minute (ten times 3 is less),
	// five of which the calls above used.
	heartbeat := map[string]any{"leaseToken": job["leaseToken"]}
	for range 595 { // refused as ended (409), counted all the same
		r := env.Do("POST", "/api/v1/jobs/"+job["jobId"].(string)+"/heartbeat", limited, heartbeat)
		require.Equal(t, "invalid_state", r.ErrorCode())
	}
	r = env.Do("POST", "/api/v1/jobs/"+job["jobId"].(string)+"/heartbeat", limited, heartbeat)
	require.Equal(t, "rate_limited", r.ErrorCode())

	// The OpenAPI document says which.
	paths := env.Must(http.StatusOK, "GET", "/api/v1/openapi.json", "", nil).JSON()["paths"].(map[string]any)
	op := func(path string) map[string]any { return paths[path].(map[string]any)["post"].(map[string]any) }
	for _, path := range []string{"/api/v1/effects/{id}/report", "/api/v1/effects/{id}/heartbeat",
		"/api/v1/jobs/{id}/report", "/api/v1/jobs/{id}/heartbeat", "/api/v1/jobs/report"} {
		require.Equal(t, "settling", op(path)["x-rate-limit"], path)
	}
	require.NotContains(t, op("/api/v1/effects/begin"), "x-rate-limit")
	require.Contains(t, op("/api/v1/effects/begin")["responses"], "429")
}

// A query parameter a route does not take, or one given twice, is refused
// like an unknown body field, never ignored (QA: ?status= on effects, a typo
// of state, listed every effect).
func TestUnknownQueryParametersAreRefused(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for path, fields := range map[string][]string{
		"/api/v1/effects?status=indeterminate":               {"status"},
		"/api/v1/effects?state=denied&state=leased":          {"state"},
		"/api/v1/effects?limit=2&limit=3&Cursor=x&zz=1":      {"Cursor", "limit", "zz"},
		"/api/v1/keys?state=pending":                         {"state"},
		"/api/v1/effects/eff_01m8kjt9g002extbwvcndh4bkd?x=1": {"x"},
		// One that cannot be decoded is refused, not left out (contract
		// QA: ?limit=%zz listed a default page).
		"/api/v1/effects?limit=%zz":                          {"limit"},
		"/api/v1/effects?state=leased&cursor=%":              {"cursor"},
		"/api/v1/keys?limit=1;x":                             {"limit"},
		"/api/v1/approvals?%zz=1":                            {"query"},
		"/api/v1/runs?a;b=1":                                 {"query"},
		"/api/v1/runs/run_01m8kjt9g002extbwvcndh4bkd?id=%zz": {"id"},
	} {
		r := env.Do("GET", path, ws.Key, nil)
		require.Equal(t, fields, validationFields(t, r), path)
	}
	env.Must(http.StatusOK, "GET", "/api/v1/effects?state=indeterminate&effect_type=a.b&limit=2", ws.Key, nil)
	env.Must(http.StatusOK, "GET", "/api/v1/effects?effect_type=a%2Eb&limit=%32&&", ws.Key, nil)
	// A path parameter in the query may only repeat the path's own value
	// (Vercel's rewrites pass it so); another would name something else.
	run := "/api/v1/runs/run_01m8kjt9g002extbwvcndh4bkd"
	require.Equal(t, []string{"id"}, validationFields(t, env.Do("GET", run+"?id=run_01m8kjt9g002extbwvcndh4bke", ws.Key, nil)))
	require.Equal(t, "not_found", env.Do("GET", run+"?id=run_01m8kjt9g002extbwvcndh4bkd", ws.Key, nil).ErrorCode())
	// Public routes take any: a cache-busting parameter asks for nothing.
	env.Must(http.StatusOK, "GET", "/api/v1/health?nocache=1", "", nil)
	// Authentication still comes first.
	require.Equal(t, http.StatusUnauthorized, env.Do("GET", "/api/v1/effects?status=x", "", nil).Status)
}

// Any valid key reads itself, whatever its scopes (an agent, or the console,
// learns what it may do before it is refused), never its secret; a revoked
// key reads nothing; the path is no key id to revoke.
func TestAKeyReadsItself(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	created := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, map[string]any{"name": "agent", "preset": "AGENT",
		"daily_spend_ceiling_micros": 500, "rate_limit_per_minute": 30}).JSON()
	agent := created["secret"].(string)
	me := env.Must(http.StatusOK, "GET", "/api/v1/keys/current", agent, nil).JSON()
	delete(created, "secret")
	require.Equal(t, created, me, "the key as created, without its secret")
	require.ElementsMatch(t, []any{"effects:begin", "effects:report"}, me["scopes"])
	root := env.Must(http.StatusOK, "GET", "/api/v1/keys/current", ws.Key, nil).JSON()
	require.NotEqual(t, me["id"], root["id"])
	require.NotContains(t, root, "secret")

	require.Equal(t, "not_found", env.Do("DELETE", "/api/v1/keys/current", ws.Key, nil).ErrorCode())
	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+me["id"].(string), ws.Key, nil)
	require.Equal(t, "unauthorized", env.Do("GET", "/api/v1/keys/current", agent, nil).ErrorCode())
	require.Equal(t, "unauthorized", env.Do("GET", "/api/v1/keys/current", "", nil).ErrorCode())

	// Read from the database, not the cache: another instance, which
	// authenticated the key before its revocation, refuses it too (review:
	// it answered 200, revoked_at set).
	other := apitest.Start(t)
	second := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, map[string]any{"name": "b", "preset": "AGENT"}).JSON()
	other.Must(http.StatusOK, "GET", "/api/v1/keys/current", second["secret"].(string), nil)
	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+second["id"].(string), ws.Key, nil)
	require.Equal(t, "unauthorized", other.Do("GET", "/api/v1/keys/current", second["secret"].(string), nil).ErrorCode())
}

// A read-only key (policies:read) reads the circuits and the emergency stop,
// as it reads the policies (the scope covers "policies and circuits"), and
// changes none of them (console QA: it needed policies:write to read them).
func TestPoliciesReadReadsCircuitsAndChangesNone(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	reader := env.Key(ws, map[string]any{"name": "reader", "scopes": []string{"policies:read"}})
	require.Equal(t, http.StatusOK, env.Do("GET", "/api/v1/circuits", reader, nil).Status)
	require.Equal(t, http.StatusOK, env.Do("GET", "/api/v1/circuits/stop", reader, nil).Status)
	for _, path := range []string{"/api/v1/circuits/email.send/open", "/api/v1/circuits/email.send/close",
		"/api/v1/circuits/stop", "/api/v1/circuits/release"} {
		res := env.Do("POST", path, reader, map[string]any{})
		require.Equal(t, http.StatusForbidden, res.Status, "%s: %s", path, res.Body)
		require.Equal(t, []string{"policies:write"}, requiredOf(res), path)
	}
}

// Every answer that shows a key names the key that minted it
// (created_by_key_id; null for signup's), and ?created_by= lists the keys
// one key minted, in its workspace only, paged as the whole list is: a key
// found compromised is revoked, and the keys it minted, which its revoke
// leaves live (security review), are found and revoked each.
func TestAKeyNamesItsMinterAndTheKeysItMintedAreListed(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	signup := env.Must(http.StatusCreated, "POST", "/api/v1/workspaces", "", map[string]any{"name": "lineage"}).JSON()
	signupKey := signup["key"].(map[string]any)
	require.Contains(t, signupKey, "created_by_key_id")
	require.Nil(t, signupKey["created_by_key_id"], "signup's key was minted by no key")
	ws := apitest.Workspace{ID: signup["workspace_id"].(string), Key: signupKey["secret"].(string)}
	operatorID := signupKey["id"].(string)
	current := env.Must(http.StatusOK, "GET", "/api/v1/keys/current", ws.Key, nil).JSON()
	require.Contains(t, current, "created_by_key_id")
	require.Nil(t, current["created_by_key_id"])

	mint := func(by, name string) map[string]any {
		t.Helper()
		return env.Must(http.StatusCreated, "POST", "/api/v1/keys", by,
			map[string]any{"name": name, "scopes": []string{"effects:begin"}}).JSON()
	}
	minterKey := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key,
		map[string]any{"name": "minter", "scopes": []string{"keys:write", "effects:begin"}}).JSON()
	require.Equal(t, operatorID, minterKey["created_by_key_id"], "POST /keys")
	minterID, minter := minterKey["id"].(string), minterKey["secret"].(string)
	var (
		children []string
		c1       string // c1's secret
	)
	for _, name := range []string{"c1", "c2", "c3"} {
		c := mint(minter, name)
		require.Equal(t, minterID, c["created_by_key_id"], "POST /keys")
		children = append(children, c["id"].(string))
		if name == "c1" {
			c1 = c["secret"].(string)
			own := env.Must(http.StatusOK, "GET", "/api/v1/keys/current", c1, nil).JSON()
			require.Equal(t, minterID, own["created_by_key_id"], "GET /keys/current")
		}
	}
	mint(ws.Key, "sibling") // the operator's, not the minter's

	listed := func(key, query string) ([]string, any) {
		t.Helper()
		page := env.Must(http.StatusOK, "GET", "/api/v1/keys?"+query, key, nil).JSON()
		var out []string
		for _, k := range page["data"].([]any) {
			k := k.(map[string]any)
			out = append(out, k["id"].(string))
			if strings.Contains(query, "created_by="+minterID) {
				require.Equal(t, minterID, k["created_by_key_id"], query)
			}
		}
		return out, page["next_cursor"]
	}
	got, next := listed(ws.Key, "created_by="+minterID)
	require.Equal(t, children, got, "the minter's own, oldest first")
	require.Nil(t, next)
	got, next = listed(ws.Key, "created_by="+minterID+"&limit=2")
	require.Equal(t, children[:2], got)
	require.Equal(t, children[1], next)
	got, next = listed(ws.Key, "created_by="+minterID+"&limit=2&cursor="+children[1])
	require.Equal(t, children[2:], got)
	require.Nil(t, next)
	got, _ = listed(ws.Key, "created_by="+operatorID)
	require.Len(t, got, 2, "minter and sibling: %v", got)
	require.Equal(t, minterID, got[0])
	got, _ = listed(ws.Key, "created_by="+children[0])
	require.Empty(t, got, "a key that minted none")

	// The whole list shows each key's minter too.
	page := env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil).JSON()["data"].([]any)
	minters := map[string]any{}
	for _, k := range page {
		k := k.(map[string]any)
		require.Contains(t, k, "created_by_key_id")
		minters[k["id"].(string)] = k["created_by_key_id"]
	}
	require.Nil(t, minters[operatorID])
	require.Equal(t, operatorID, minters[minterID])
	require.Equal(t, minterID, minters[children[2]])

	// Another workspace lists nothing of this one's, nor this one of its.
	other := env.Signup()
	got, _ = listed(other.Key, "created_by="+minterID)
	require.Empty(t, got, "another workspace's key")
	otherID := env.Must(http.StatusOK, "GET", "/api/v1/keys/current", other.Key, nil).JSON()["id"].(string)
	mint(other.Key, "theirs")
	got, _ = listed(ws.Key, "created_by="+otherID)
	require.Empty(t, got, "another workspace's key")
	got, _ = listed(ws.Key, "created_by=key_"+strings.Repeat("0", 26))
	require.Empty(t, got, "no key")

	for _, bad := range []string{"", "nope", "eff_" + strings.Repeat("0", 26), strings.ToUpper(minterID), minterID + "0"} {
		r := env.Do("GET", "/api/v1/keys?created_by="+bad, ws.Key, nil)
		require.Equal(t, []string{"created_by"}, validationFields(t, r), "created_by=%q", bad)
	}

	// Revoking the minter leaves its keys live (as it always did), and
	// they are still listed by it, to be revoked each.
	revoked := env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+minterID, ws.Key, nil).JSON()
	require.NotNil(t, revoked["revoked_at"])
	require.Equal(t, operatorID, revoked["created_by_key_id"], "DELETE /keys/{id}")
	env.Must(http.StatusOK, "GET", "/api/v1/keys/current", c1, nil)
	got, _ = listed(ws.Key, "created_by="+minterID)
	require.Equal(t, children, got)
	for _, id := range children {
		k := env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+id, ws.Key, nil).JSON()
		require.Equal(t, minterID, k["created_by_key_id"], "DELETE /keys/{id}")
	}
}

// A key's tools list states in the document the shape of each pair its
// handler checks, name@version within toolname's lengths (the document
// stated only how many pairs: a client generated from it sent "send_email",
// or a pair of 400 characters, and learnt of the rule from a 400). Every
// pair the tags refuse is refused; the longest pairs taken are tagged.
func TestAKeysToolsTagsAgreeWithTheHandler(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	f, ok := reflect.TypeFor[auth.CreateKeyRequest]().FieldByName("Tools")
	require.True(t, ok)
	rules := schematags.Rules(f)
	most, err := strconv.Atoi(rules["itemMaxLength"])
	require.NoError(t, err, "tools states each pair's length: %v", rules)
	require.NotEmpty(t, rules["itemPattern"], "tools states each pair's shape")
	pattern := regexp.MustCompile(rules["itemPattern"])
	tagged := func(ref string) bool { return pattern.MatchString(ref) && utf8.RuneCountInString(ref) <= most }
	accepted := func(ref string) bool {
		r := env.Do("POST", "/api/v1/keys", ws.Key, map[string]any{"name": "tools", "preset": "WORKER",
			"tools": []string{ref}})
		if r.Status == http.StatusCreated {
			return true
		}
		require.Equal(t, http.StatusBadRequest, r.Status, "%q: %s", ref, r.Body)
		require.Contains(t, string(r.Body), `"field":"tools.0"`, "%q", ref)
		return false
	}
	longest := strings.Repeat("é", toolname.MaxName) + "@" + strings.Repeat("é", toolname.MaxVersion)
	for _, ref := range []string{"send_email", "@1", "send_email@", "a@b@c", "@", "", "a@" + longest,
		longest + "é", "é" + longest} {
		require.False(t, tagged(ref), "%q: the tags take it", ref)
		require.False(t, accepted(ref), "%q: the tags refuse it", ref)
	}
	for _, ref := range []string{"send_email@1", longest} {
		require.True(t, tagged(ref), "%q", ref)
		require.True(t, accepted(ref), "%q", ref)
	}
}

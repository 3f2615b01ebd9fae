package gate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// post sends a request without touching testing.T, for use from goroutines.
func post(env *apitest.Env, path, key string, body any) (int, map[string]any, error) {
	return send(env, "POST", path, key, body)
}

// put is post's PUT.
func put(env *apitest.Env, path, key string, body any) (int, map[string]any, error) {
	return send(env, "PUT", path, key, body)
}

func send(env *apitest.Env, method, path, key string, body any) (int, map[string]any, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequest(method, env.Server.URL+path, bytes.NewReader(raw))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := env.Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		return res.StatusCode, nil, fmt.Errorf("decode %q: %w", b, err)
	}
	return res.StatusCode, out, nil
}

// raceBegins fires n begins at once, spread over envs, and counts decisions.
func raceBegins(t *testing.T, n int, key string, body map[string]any, envs ...*apitest.Env) (map[string]int, []map[string]any) {
	t.Helper()
	return raceBodies(t, n, key, func(int) map[string]any { return body }, envs...)
}

// raceBodies is raceBegins with a body per racer; a denial counts by its code.
func raceBodies(t *testing.T, n int, key string, bodyOf func(i int) map[string]any, envs ...*apitest.Env) (map[string]int, []map[string]any) {
	t.Helper()
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		mu     sync.Mutex
		counts = map[string]int{}
		execs  []map[string]any
		errs   []error
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		env, body := envs[i%len(envs)], bodyOf(i)
		go func() {
			defer wg.Done()
			<-start
			status, out, err := postBegin(env, key, body)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			d, _ := out["decision"].(string)
			if d == "" || d == "denied" {
				e, _ := out["error"].(map[string]any)
				d = fmt.Sprintf("%d:%v", status, e["code"])
			}
			counts[d]++
			if d == "execute" {
				execs = append(execs, out)
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Empty(t, errs)
	return counts, execs
}

// postBegin is post of a begin that a racer sends again, up to three
// times, when it ran out of its time (outOfTime), as a client does
// (README): many racers queued for one key's row or wallet on a loaded
// machine are answered 503 database_unavailable past their route's time
// (15 s), or 408 request_timeout if their body came too late (flake hunt:
// 36 of TestConcurrentBeginsAfterLapseUnderRetryExecuteOnce's 200, and
// TestRunWalletHoldsUnderConcurrentBegins's, TestOneKeyAtTheCeilingIsChargedOnce's,
// TestRunWalletUnderFailuresAndRetries's, with the package run under
// load). A retry answers as the first would have: a begin that ran out of
// its time changed nothing, unless its answer was lost after it took the
// key, which its retry then reads (in_flight) and the test counts as
// such. For goroutines: it does not touch testing.T.
func postBegin(env *apitest.Env, apiKey string, body any) (int, map[string]any, error) {
	status, out, err := post(env, "/api/v1/effects/begin", apiKey, body)
	for tries := 0; err == nil && tries < 3 && outOfTime(status, out); tries++ {
		status, out, err = post(env, "/api/v1/effects/begin", apiKey, body)
	}
	return status, out, err
}

// outOfTime says whether an answer is 503 database_unavailable or 408
// request_timeout: the request ran out of its time.
func outOfTime(status int, out map[string]any) bool {
	e, _ := out["error"].(map[string]any)
	return status == http.StatusServiceUnavailable && e["code"] == "database_unavailable" ||
		status == http.StatusRequestTimeout && e["code"] == "request_timeout"
}

func TestConcurrentBeginsOnNewKeyExecuteOnce(t *testing.T) {
	t.Parallel()
	c := newClock()
	env1 := apitest.Start(t, apitest.WithNow(c.Now))
	env2 := apitest.Start(t, apitest.WithNow(c.Now))
	ws := env1.Signup()
	const n = 200
	counts, execs := raceBegins(t, n, ws.Key, email(key("race")), env1, env2)
	require.Equal(t, map[string]int{"execute": 1, "in_flight": n - 1}, counts)
	require.EqualValues(t, 1, execs[0]["attempt"])

	var effects, attempts int
	require.NoError(t, env1.App.Pool.QueryRow(context.Background(),
		`SELECT count(*), (SELECT count(*) FROM effect_attempts WHERE workspace_id = $1) FROM effects WHERE workspace_id = $1`,
		ws.ID).Scan(&effects, &attempts))
	require.Equal(t, 1, effects)
	require.Equal(t, 1, attempts)
}

func TestConcurrentBeginsAfterLapseUnderRetryExecuteOnce(t *testing.T) {
	t.Parallel()
	c := newClock()
	env1 := apitest.Start(t, apitest.WithNow(c.Now))
	env2 := apitest.Start(t, apitest.WithNow(c.Now))
	ws := env1.Signup()
	env1.Must(http.StatusOK, "PUT", "/api/v1/policies/email.send", ws.Key, map[string]any{"on_indeterminate": "retry"})
	body := email(key("lapse-race"))
	first := env2.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, body).JSON()
	require.Equal(t, "execute", first["decision"])
	c.Add(61 * time.Second)

	const n = 200
	counts, execs := raceBegins(t, n, ws.Key, body, env1, env2)
	require.Equal(t, map[string]int{"execute": 1, "in_flight": n - 1}, counts)
	require.EqualValues(t, 2, execs[0]["attempt"])

	e := env1.Must(http.StatusOK, "GET", "/api/v1/effects/"+str(first["effect_id"]), ws.Key, nil).JSON()
	attempts := e["attempts"].([]any)
	require.Len(t, attempts, 2)
	require.Equal(t, "indeterminate", attempts[0].(map[string]any)["outcome"])
	var events int
	require.NoError(t, env1.App.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM events WHERE workspace_id = $1 AND type = 'effect.indeterminate'`, ws.ID).Scan(&events))
	require.Equal(t, 1, events)
}

func TestTwoInstancesAgree(t *testing.T) {
	t.Parallel()
	c := newClock()
	env1 := apitest.Start(t, apitest.WithNow(c.Now))
	env2 := apitest.Start(t, apitest.WithNow(c.Now))
	ws := env1.Signup()
	env2.Must(http.StatusOK, "PUT", "/api/v1/policies/email.send", ws.Key, map[string]any{"max_cost_micros": 10})
	over := email(key("over"))
	over["cost_micros"] = 11
	require.Equal(t, http.StatusForbidden, env1.Do("POST", "/api/v1/effects/begin", ws.Key, over).Status)

	body := email(key("two"))
	d := env1.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, body).JSON()
	require.Equal(t, "execute", d["decision"])
	require.Equal(t, "in_flight", env2.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, body).JSON()["decision"])
	env2.Must(http.StatusOK, "POST", "/api/v1/effects/"+str(d["effect_id"])+"/report", ws.Key,
		map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded", "result": map[string]any{"id": 7}})
	dup := env1.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, body).JSON()
	require.Equal(t, "duplicate", dup["decision"])
	require.Equal(t, map[string]any{"id": 7.0}, dup["result"])
	require.Equal(t, "succeeded", env2.Must(http.StatusOK, "GET", "/api/v1/effects/"+str(d["effect_id"]), ws.Key, nil).JSON()["state"])
}

func TestConcurrentReportsAgree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env2 := apitest.Start(t, apitest.WithNow(b.clock.Now))
	const n = 40
	for _, mixed := range []bool{false, true} {
		d := b.mustBegin("execute", email(key("reports")))
		id := str(d["effect_id"])
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			codes = map[string]int{}
			start = make(chan struct{})
		)
		for i := 0; i < n; i++ {
			outcome := "succeeded"
			if mixed && i%2 == 1 {
				outcome = "failed"
			}
			env := b.env
			if i%3 == 0 {
				env = env2
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				status, out, err := post(env, "/api/v1/effects/"+id+"/report", b.ws.Key,
					map[string]any{"lease_token": d["lease_token"], "outcome": outcome})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					codes["error"]++
					return
				}
				if status == http.StatusOK {
					codes[outcome+":200:"+str(out["state"])]++
				} else {
					codes[outcome+":"+str(out["error"].(map[string]any)["code"])]++
				}
			}()
		}
		close(start)
		wg.Wait()
		state := str(b.get(id)["state"])
		if !mixed {
			require.Equal(t, map[string]int{"succeeded:200:succeeded": n}, codes)
			continue
		}
		// One outcome won; every report of it is answered 200, the other outcome 409.
		other := map[string]string{"succeeded": "failed", "failed": "succeeded"}[state]
		require.Equal(t, map[string]int{state + ":200:" + state: n / 2, other + ":invalid_state": n / 2}, codes)
	}
}

func TestConcurrentBeginsAfterApprovalExecuteOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval"})
	body := wire(key("approved-race"))
	a := b.mustBegin("approval_required", body)
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(a["approval_id"])+"/approve", b.ws.Key, nil)
	counts, execs := raceBegins(t, 100, b.ws.Key, body, b.env)
	require.Equal(t, map[string]int{"execute": 1, "in_flight": 99}, counts)
	require.EqualValues(t, 1, execs[0]["attempt"])
}

// Many concurrent begins on an indeterminate key whose retry needs an
// approval yield exactly one pending approval; once approved, exactly one
// execute.
func TestConcurrentBeginsOnAnIndeterminateKeyAwaitingApproval(t *testing.T) {
	for _, grouped := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "grouped"}[grouped], func(t *testing.T) {
			t.Parallel()
			concurrentAwaiting(t, grouped)
		})
	}
}

func concurrentAwaiting(t *testing.T, grouped bool) {
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "probe"})
	k := key("conc")
	email := email
	if grouped {
		group := b.newGroup("g", "")
		plain := email
		email = func(k string) map[string]any { return groupStep(group, plain(k), nil) }
	}
	d := b.mustBegin("execute", email(k))
	id := str(d["effect_id"])
	b.clock.Add(2 * time.Minute)
	b.putPolicy("email.send", map[string]any{"mode": "require_approval", "on_indeterminate": "probe"})

	const n = 24
	run := func() []map[string]any {
		out := make([]map[string]any, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				r := b.env.Do("POST", "/api/v1/effects/begin", b.ws.Key, email(k))
				out[i] = r.JSON()
				out[i]["_status"] = r.Status
			})
		}
		wg.Wait()
		return out
	}
	first := run()
	approvals := map[string]int{}
	for _, r := range first {
		require.Equal(t, "approval_required", r["decision"], "%v", r)
		require.Equal(t, "indeterminate", r["state"], "%v", r)
		approvals[str(r["approval_id"])]++
	}
	require.Len(t, approvals, 1, "one approval for every begin")
	pending := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", b.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, pending, 1)
	var approvalID string
	for a := range approvals {
		approvalID = a
	}
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+approvalID+"/approve", b.ws.Key, nil)

	second := run()
	decisions := map[string]int{}
	for _, r := range second {
		decisions[str(r["decision"])]++
	}
	require.Equal(t, 1, decisions["execute"], "%v", decisions)
	require.Equal(t, n-1, decisions["in_flight"], "%v", decisions)
	require.Equal(t, "leased", b.get(id)["state"])
}

// A key revoked on one instance begins nothing more on another, though that
// instance authenticated it from its cache for up to KEY_CACHE_TTL (race
// QA: about 390 begins executed in that window): a new key and a new
// attempt of a key it began before are refused 401, as any revoked key is,
// and nothing is written for them.
func TestARevokedKeyBeginsNothingOnAnotherInstance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env2 := apitest.Start(t, apitest.WithNow(b.clock.Now))
	agent := b.agent()
	began := env2.Must(http.StatusOK, "POST", "/api/v1/effects/begin", agent, email(key("before"))).JSON()
	require.Equal(t, "execute", began["decision"])
	env2.Must(http.StatusOK, "POST", "/api/v1/effects/"+str(began["effect_id"])+"/report", agent,
		map[string]any{"lease_token": began["lease_token"], "outcome": "failed"})
	b.env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+keyID(agent), b.ws.Key, nil)

	fresh := email(key("after"))
	errCode(t, env2.Do("POST", "/api/v1/effects/begin", agent, fresh), http.StatusUnauthorized, "unauthorized")
	retried := email(str(began["idempotency_key"]))
	errCode(t, env2.Do("POST", "/api/v1/effects/begin", agent, retried), http.StatusUnauthorized, "unauthorized")

	var effects, attempts int
	require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM effects WHERE workspace_id = $1 AND idempotency_key = $2),
		(SELECT count(*) FROM effect_attempts WHERE effect_id = $3)`,
		b.ws.ID, fresh["idempotency_key"], began["effect_id"]).Scan(&effects, &attempts))
	require.Zero(t, effects, "the new key was not begun")
	require.Equal(t, 1, attempts, "no new attempt of the failed key")
	// The workspace's other keys begin as before.
	b.mustBegin("execute", retried)
}

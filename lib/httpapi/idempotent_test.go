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
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/getratchet/ratchet/lib/webhooks"
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
// own or with an optional one and the actions a repeat of which would undo another actor's change;
// each answers JSON (what is kept and given again), and acts within
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
		"workers.register", "steps.replay", "webhooks.deliveries.retry", "webhooks.rotate_secret", "reconcile",
		// The creates whose body key is optional: the header keeps their
		// answer without one (TestIdempotencyKeyAnswersARetriedRunOrGroupCreateOnce).
		"runs.create", "groups.create",
		// The actions whose repeat would undo another actor's change
		// (TestARetriedActionUndoesNoChangeMadeSince).
		"circuits.open", "circuits.close", "circuits.stop", "circuits.release", "steps.cancel",
		"endpoints.pause", "endpoints.resume", "endpoints.circuit.close", "webhooks.update", "policies.put"}, idempotent)
}

// A route that takes an Idempotency-Key declares the body the key is
// compared over: one that declared none would have each request's body
// decoded (nothing, or {}) before the key was claimed, and hashed as empty
// (hygiene QA, latent: each of the nine declares one). The server refuses
// such a table at start, as it refuses a protocol endpoint (Raw) marked
// Idempotent, whose requests never reach the key.
func TestAnIdempotentRouteDeclaresItsBody(t *testing.T) {
	t.Parallel()
	for _, r := range httpapi.Routes() {
		if r.Idempotent {
			require.NotNil(t, r.Request, "%s takes an Idempotency-Key: it declares its body", r.Name)
			require.Nil(t, r.Raw, r.Name)
		}
	}
	handle := func(context.Context, *httpapi.Call) (any, error) { return map[string]any{}, nil }
	for name, rt := range map[string]httpapi.Route{
		"bodiless": {Method: "POST", Pattern: "/api/v1/test/bodiless", Name: "test.bodiless", Status: 201,
			Idempotent: true, Handle: handle},
		"raw": {Method: "POST", Pattern: "/api/v1/test/raw", Name: "test.raw", Status: 200, Idempotent: true,
			Request: struct{}{}, Raw: http.NotFoundHandler()},
	} {
		require.PanicsWithValue(t, "httpapi: route "+rt.Name+" (POST "+rt.Pattern+") takes an Idempotency-Key "+
			"but declares no request body to compare it over: set Request (struct{}{} for a body of none), or "+
			"drop Idempotent", func() { httpapi.NewWithExtraRoutes(httpapi.Deps{}, []httpapi.Route{rt}) }, name)
	}
	declared := httpapi.Route{Method: "POST", Pattern: "/api/v1/test/declared", Name: "test.declared", Status: 201,
		Idempotent: true, Request: struct{}{}, Handle: handle}
	require.NotPanics(t, func() { httpapi.NewWithExtraRoutes(httpapi.Deps{}, []httpapi.Route{declared}) })
}

// keyedServer is env's server with a test route, POST
// /api/v1/test/{outcome}, that takes an Idempotency-Key and runs handle.
func keyedServer(env *apitest.Env, handle func(ctx context.Context, c *httpapi.Call) (any, error)) *httpapi.Server {
	return httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{{
		Method: "POST", Pattern: "/api/v1/test/{outcome}", Name: "test.create", Status: 201, Idempotent: true,
		Request: struct{}{}, Scopes: []string{auth.ScopeKeysWrite}, Handle: handle,
	}})
}

// sendKeyed sends POST /api/v1/test/{outcome} under the key "create-<outcome>".
func sendKeyed(srv *httpapi.Server, key, outcome string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", "/api/v1/test/"+outcome, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set(idempotency.Header, "create-"+outcome)
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	return rec
}

// hookBody is a webhook create of the test routes.
var hookBody = webhooks.CreateRequest{URL: "https://example.com/hook", Events: []string{"run.finished"}}

// webhookCount is how many webhooks the workspace of key holds.
func webhookCount(t *testing.T, env *apitest.Env, key string) int {
	t.Helper()
	return len(env.Must(http.StatusOK, "GET", "/api/v1/webhooks", key, nil).JSON()["data"].([]any))
}

// A request under an Idempotency-Key acts in one transaction with the
// recording of its answer, so one that failed, whatever the failure,
// changed nothing (a webhook it created is gone with it) and frees its key:
// the retry acts. A database lost mid-request is answered not_applied.
func TestIdempotencyKeyOfAFailedRequestIsFree(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	var calls atomic.Int32
	failures := map[string]error{
		"lost":        apierr.DatabaseLost(errors.New("connection closed")),
		"raw":         errors.New("something broke after the write"),
		"deadline":    context.DeadlineExceeded,
		"not-applied": apierr.DatabaseUnavailable(errors.New("connection refused")),
		"refused":     apierr.InvalidField("name", "is taken"),
	}
	srv := keyedServer(env, func(ctx context.Context, c *httpapi.Call) (any, error) {
		hook, err := env.App.Server.Webhooks.Create(ctx, c.Principal.WorkspaceID, hookBody)
		if err != nil {
			return nil, err
		}
		if calls.Add(1) == 1 {
			return nil, failures[c.R.PathValue("outcome")]
		}
		return hook, nil
	})
	for outcome, err := range failures {
		calls.Store(0)
		before := webhookCount(t, env, ws.Key)
		first := sendKeyed(srv, ws.Key, outcome)
		require.GreaterOrEqual(t, first.Code, 400, outcome)
		require.Equal(t, before, webhookCount(t, env, ws.Key), "%s: the webhook rolled back with the request", outcome)
		if e, ok := apierr.As(err); (ok && e.Code == apierr.CodeDatabaseUnavailable) || outcome == "deadline" {
			require.Equal(t, http.StatusServiceUnavailable, first.Code, outcome)
			require.Contains(t, first.Body.String(), `"outcome":"not_applied"`, outcome)
		}
		retry := sendKeyed(srv, ws.Key, outcome)
		require.Equal(t, http.StatusCreated, retry.Code, "%s: %s", outcome, retry.Body)
		require.EqualValues(t, 2, calls.Load(), outcome)
		require.Equal(t, before+1, webhookCount(t, env, ws.Key), outcome)
	}
}

// A request whose connection ends during COMMIT finds out whether the
// commit landed, on another connection, and answers so: here it did not
// (the connection ended before the commit), so the answer is not_applied
// and the key is free, and the retry acts at once and makes the one
// webhook. Before, the key was held until its claim lapsed, and the retry
// was told to wait 30 s (chaos QA: a worker's registration waited that
// long); a request that cannot find out still holds it
// (lib/idempotency's Settle test).
func TestIdempotencyKeyOfACommitThatDidNotLandIsFreedAtOnce(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	var calls atomic.Int32
	srv := keyedServer(env, func(ctx context.Context, c *httpapi.Call) (any, error) {
		hook, err := env.App.Server.Webhooks.Create(ctx, c.Principal.WorkspaceID, hookBody)
		if err != nil || calls.Add(1) > 1 {
			return hook, err
		}
		// The request's transaction ends its own connection at COMMIT.
		_, err = db.Conn(ctx, env.App.Pool).Exec(ctx, testpg.EndConnectionAtCommit)
		return hook, err
	})
	first := sendKeyed(srv, ws.Key, "commit")
	require.Equal(t, http.StatusServiceUnavailable, first.Code, "%s", first.Body)
	require.Contains(t, first.Body.String(), `"outcome":"not_applied"`)
	require.Zero(t, webhookCount(t, env, ws.Key))

	retry := sendKeyed(srv, ws.Key, "commit")
	require.Equal(t, http.StatusCreated, retry.Code, "%s", retry.Body)
	require.EqualValues(t, 2, calls.Load())
	require.Equal(t, 1, webhookCount(t, env, ws.Key))
	again := sendKeyed(srv, ws.Key, "commit")
	require.Equal(t, retry.Body.String(), again.Body.String())
	require.Equal(t, "true", again.Header().Get(httpapi.ReplayedHeader))
	require.Equal(t, 1, webhookCount(t, env, ws.Key))
}

// A request whose COMMIT landed but whose answer was lost with its
// connection (cut while the commit ran) finds the commit on another
// connection and answers what it did: 201, which the retry is given again.
// Before, it answered 503 outcome unknown and held the key until its claim
// lapsed, though everything it did was recorded (chaos QA).
func TestIdempotentRequestWhoseCommitLandedUnansweredAnswersIt(t *testing.T) {
	t.Parallel()
	env := startCut(t)
	// pgx asks the server to cancel what a connection it lost ran, which
	// would cancel the COMMIT: on a network path that died it is lost too.
	env.proxy.DropCancelRequests()
	ws := env.Signup()
	var calls atomic.Int32
	cut := make(chan struct{})
	srv := keyedServer(env.Env, func(ctx context.Context, c *httpapi.Call) (any, error) {
		hook, err := env.App.Server.Webhooks.Create(ctx, c.Principal.WorkspaceID, hookBody)
		if err != nil || calls.Add(1) > 1 {
			return hook, err
		}
		// COMMIT takes half a second; the connection is cut meanwhile, and
		// the commit lands all the same, its answer lost.
		_, err = db.Conn(ctx, env.App.Pool).Exec(ctx, testpg.AtCommit(`PERFORM pg_sleep(0.5);`))
		go func() {
			defer close(cut)
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				var committing bool
				if err := env.watch.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event = 'PgSleep' AND lower(query) = 'commit')`).
					Scan(&committing); err != nil || committing {
					break
				}
			}
			env.proxy.Cut()
		}()
		return hook, err
	})
	first := sendKeyed(srv, ws.Key, "landed")
	<-cut
	require.Equal(t, http.StatusCreated, first.Code, "%s", first.Body)
	require.Equal(t, 1, webhookCount(t, env.Env, ws.Key))
	again := sendKeyed(srv, ws.Key, "landed")
	require.Equal(t, first.Body.String(), again.Body.String())
	require.Equal(t, "true", again.Header().Get(httpapi.ReplayedHeader))
	require.EqualValues(t, 1, calls.Load())
	require.Equal(t, 1, webhookCount(t, env.Env, ws.Key))
}

// A request that outlived its claim, whose key another request took over
// meanwhile, rolls its work back for the other's and says to retry: only
// one of the two acts (before, both did).
func TestIdempotentRequestOutlivingItsClaimRollsBack(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	srv := keyedServer(env, func(ctx context.Context, c *httpapi.Call) (any, error) {
		// What a retry after the lapse does: take the key over (committed,
		// on a connection of its own).
		_, err := env.App.Pool.Exec(context.Background(), `UPDATE idempotent_requests SET request_id = 'req_other'
			WHERE key_id = $1 AND idempotency_key = 'create-late'`, c.Principal.KeyID)
		if err != nil {
			return nil, err
		}
		return env.App.Server.Webhooks.Create(ctx, c.Principal.WorkspaceID, hookBody)
	})
	late := sendKeyed(srv, ws.Key, "late")
	require.Equal(t, http.StatusConflict, late.Code, "%s", late.Body)
	require.Contains(t, late.Body.String(), `"code":"retry_request"`)
	require.Zero(t, webhookCount(t, env, ws.Key), "rolled back")
	var requestID string
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT request_id FROM idempotent_requests
		WHERE idempotency_key = 'create-late'`).Scan(&requestID))
	require.Equal(t, "req_other", requestID, "the key stays its new holder's")
}

// Every route that takes an Idempotency-Key sends all its statements in the
// request's transaction (db.Conn, db.Tx), so that they commit with its
// answer. On a pool of one connection, which that transaction holds, a
// statement sent beside it would wait out the route's time and fail.
func TestIdempotentRoutesActInTheRequestTransaction(t *testing.T) {
	t.Parallel()
	e := newJobsEnvWith(t, []apitest.Option{apitest.WithConfig(func(c *config.Config) { c.DBMaxConns = 1 })})
	wid := e.register("send_email@1")
	calls := idempotentCalls(e, wid)
	var names []string
	methods := idempotentMethods()
	for _, r := range httpapi.Routes() {
		if r.Idempotent {
			names = append(names, r.Name)
		}
	}
	require.Len(t, calls, len(names))
	for _, name := range names {
		call, ok := calls[name]
		require.True(t, ok, "a call of %s", name)
		r := e.DoWith(methods[name], call.path, call.key, idemKey("one-connection:"+name), call.body)
		require.Less(t, r.Status, 300, "%s: %s", name, r.Body)
	}
	// The tool test and the replay each queued a job, claimable now.
	require.Len(t, e.claim(wid, 10), 2)
}

// Recording and committing get their own time once the route has run: a
// keyed route slower than idempotency.StoreTimeout, within its own
// timeout, commits (review: the store's time ran from before the route, so
// it rolled back and answered 503).
func TestIdempotentRouteSlowerThanTheStoreTimeCommits(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	srv := keyedServer(env, func(ctx context.Context, c *httpapi.Call) (any, error) {
		hook, err := env.App.Server.Webhooks.Create(ctx, c.Principal.WorkspaceID, hookBody)
		time.Sleep(idempotency.StoreTimeout + 500*time.Millisecond)
		return hook, err
	})
	slow := sendKeyed(srv, ws.Key, "slow")
	require.Equal(t, http.StatusCreated, slow.Code, "%s", slow.Body)
	require.Equal(t, 1, webhookCount(t, env, ws.Key))
}

// A route that panics changed nothing and frees its key: the retry acts at
// once instead of waiting 30 s for the claim to lapse (review).
func TestIdempotencyKeyOfARouteThatPanickedIsFree(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	var calls atomic.Int32
	srv := keyedServer(env, func(ctx context.Context, c *httpapi.Call) (any, error) {
		hook, err := env.App.Server.Webhooks.Create(ctx, c.Principal.WorkspaceID, hookBody)
		if calls.Add(1) == 1 {
			panic("a bug")
		}
		return hook, err
	})
	first := sendKeyed(srv, ws.Key, "panic")
	require.Equal(t, http.StatusInternalServerError, first.Code, "%s", first.Body)
	requireRetryActs(t, env, srv, ws.Key, "panic")
}

// requireRetryActs checks that the first request under the key of outcome
// left no webhook, and that the retry acts at once (not told to wait for a
// claim to lapse) and makes the one webhook.
func requireRetryActs(t *testing.T, env *apitest.Env, srv *httpapi.Server, key, outcome string) {
	t.Helper()
	require.Zero(t, webhookCount(t, env, key), "the webhook rolled back with its request")
	retry := sendKeyed(srv, key, outcome)
	require.Equal(t, http.StatusCreated, retry.Code, "%s", retry.Body)
	require.Empty(t, retry.Header().Get(httpapi.ReplayedHeader))
	require.Equal(t, 1, webhookCount(t, env, key))
}

// A keyed replay of a step whose last lease lapsed ends the lapsed job on
// its own, as a read would, before its own transaction: in the request's
// transaction that held the run's settle lock until the replay took the
// run's lock, against the order of a report settling the run, and the two
// deadlocked (review).
func TestKeyedReplayOfALapsedStepTakesTheRunLocksInOrder(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	wid := e.register("send_email@1")
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": 1}, "maxAttempts": 1})
	stepID := e.claim(wid, 1)[0]["stepId"].(string)
	e.clock.Add(time.Hour) // the last attempt's lease lapsed

	ctx := context.Background()
	report, err := e.App.Pool.Begin(ctx) // a report on another step: the run's shared lock first
	require.NoError(t, err)
	defer func() { _ = report.Rollback(ctx) }()
	_, err = report.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(hashtextextended($1::text, 0))`, runID)
	require.NoError(t, err)
	replayed := make(chan *apitest.Response, 1)
	go func() {
		replayed <- e.DoWith("POST", "/api/v1/steps/"+stepID+"/replay", e.ws.Key, idemKey("replay:"+stepID),
			map[string]any{"acknowledgeDuplicateRisk": true})
	}()
	require.NoError(t, lockWaiter(e.App.Pool)) // the replay waits for the run's lock,
	// then the report asks for its settle lock, which the replay must not be holding.
	_, err = report.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 1))`, runID)
	require.NoError(t, err)
	require.NoError(t, report.Commit(ctx))
	r := <-replayed
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, "QUEUED", r.JSON()["status"])
}

// keyedCall is a request of a route that takes an Idempotency-Key.
// idempotentMethods is the method of each route that takes an
// Idempotency-Key, by route name (a webhook's update is a PATCH).
func idempotentMethods() map[string]string {
	methods := map[string]string{}
	for _, r := range httpapi.Routes() {
		if r.Idempotent {
			methods[r.Name] = r.Method
		}
	}
	return methods
}

type keyedCall struct {
	path, key string
	body      any
}

// idempotentCalls is a request of each route that takes an Idempotency-Key,
// by route name, each of which acts once sent (worker wid is registered
// for send_email@1).
func idempotentCalls(e *jobsEnv, wid string) map[string]keyedCall {
	e.T.Helper()
	_, stepID := e.exhausted(wid, map[string]any{"n": 1}, 1)
	hook := e.Must(http.StatusCreated, "POST", "/api/v1/webhooks", e.ws.Key, hookBody).JSON()["id"].(string)
	ctx := context.Background()
	require.NoError(e.T, events.Record(ctx, e.App.Pool, events.Event{WorkspaceID: e.ws.ID, Type: events.RunFinished,
		SubjectID: ids.New(ids.Run), Data: map[string]any{}, At: e.clock.Now()}))
	_, err := e.App.Server.Webhooks.Dispatch(ctx, e.clock.Now())
	require.NoError(e.T, err)
	var deliveries struct {
		Data []struct{ ID string } `json:"data"`
	}
	e.Must(http.StatusOK, "GET", "/api/v1/webhooks/"+hook+"/deliveries", e.ws.Key, nil).Decode(e.T, &deliveries)
	require.NotEmpty(e.T, deliveries.Data)
	ep := e.endpoint("one-connection")["id"].(string)
	queued := e.enqueue(e.run(), map[string]any{"name": "send_email", "version": "1",
		"input": map[string]any{"cancelled": true}})["stepId"].(string)
	return map[string]keyedCall{
		"circuits.stop":           {"/api/v1/circuits/stop", e.ws.Key, map[string]any{"action": "deny"}},
		"circuits.release":        {"/api/v1/circuits/release", e.ws.Key, map[string]any{}},
		"circuits.open":           {"/api/v1/circuits/email.send/open", e.ws.Key, map[string]any{}},
		"circuits.close":          {"/api/v1/circuits/email.send/close", e.ws.Key, map[string]any{}},
		"steps.cancel":            {"/api/v1/steps/" + queued + "/cancel", e.ingest, map[string]any{}},
		"endpoints.pause":         {"/api/v1/endpoints/" + ep + "/pause", e.ws.Key, map[string]any{}},
		"endpoints.resume":        {"/api/v1/endpoints/" + ep + "/resume", e.ws.Key, map[string]any{}},
		"endpoints.circuit.close": {"/api/v1/endpoints/" + ep + "/circuit/close", e.ws.Key, map[string]any{}},
		"webhooks.update":         {"/api/v1/webhooks/" + hook, e.ws.Key, map[string]any{"disabled": false}},
		"policies.put":            {"/api/v1/policies/email.send", e.ws.Key, map[string]any{"retention_days": 30}},
		"keys.create":             {"/api/v1/keys", e.ws.Key, map[string]any{"name": "k", "preset": "AGENT"}},
		"webhooks.create":         {"/api/v1/webhooks", e.ws.Key, hookBody},
		"contracts.publish":       {"/api/v1/tools/mail/contracts", e.ws.Key, map[string]any{"handlerVersion": "1", "inputSchema": map[string]any{}, "outputSchema": map[string]any{}}},
		"tools.test":              {"/api/v1/tools/send_email/test", e.ws.Key, map[string]any{"version": "1", "input": map[string]any{}}},
		"workers.register":        {"/api/v1/workers/register", e.worker, map[string]any{"tools": []any{map[string]any{"name": "send_email", "version": "1"}}}},
		"steps.replay":            {"/api/v1/steps/" + stepID + "/replay", e.ws.Key, map[string]any{"acknowledgeDuplicateRisk": true}},
		"webhooks.deliveries.retry": {"/api/v1/webhooks/" + hook + "/deliveries/retry", e.ws.Key,
			map[string]any{"delivery_ids": []string{deliveries.Data[0].ID}}},
		"webhooks.rotate_secret": {"/api/v1/webhooks/" + hook + "/rotate-secret", e.ws.Key, map[string]any{}},
		// The creates with a key of their own, without one and with one.
		"runs.create":   {"/api/v1/runs", e.ws.Key, map[string]any{"name": "keyed run"}},
		"groups.create": {"/api/v1/groups", e.ws.Key, map[string]any{"name": "keyed group", "idempotency_key": "g"}},
		"reconcile": {"/api/v1/reconcile", e.ws.Key, map[string]any{"effect_type": "payment.charge",
			"from": e.clock.Now().Add(-time.Hour).Format(time.RFC3339), "to": e.clock.Now().Format(time.RFC3339),
			"records": []any{map[string]any{"idempotency_key": "k", "status": "succeeded"}}}},
	}
}

// keyedHookServer is a fresh env, a workspace of it, and keyedServer over
// it whose route creates a webhook in its request's transaction, then
// fails with what then says of the route's nth act (from 1), or answers
// the webhook when it says nil; calls counts the acts.
func keyedHookServer(t *testing.T, then func(ctx context.Context, n int32) error) (
	env *apitest.Env, ws apitest.Workspace, srv *httpapi.Server, calls *atomic.Int32) {
	t.Helper()
	env = apitest.Start(t)
	ws = env.Signup()
	calls = new(atomic.Int32)
	srv = keyedServer(env, func(ctx context.Context, c *httpapi.Call) (any, error) {
		hook, err := env.App.Server.Webhooks.Create(ctx, c.Principal.WorkspaceID, hookBody)
		if err != nil {
			return nil, err
		}
		if err := then(ctx, calls.Add(1)); err != nil {
			return nil, err
		}
		return hook, nil
	})
	return env, ws, srv, calls
}

// Clients hammering one key in rounds while the route refuses its first
// three acts (each after writing, in its request transaction): each refusal
// frees the key and rolls its write back, then exactly one request acts
// and commits; every other answer is the refusal, 409 retry_request, or
// that success given again byte for byte, marked replayed and naming the
// request that acted.
func TestIdempotencyKeyHammeredThroughRefusalsActsOnce(t *testing.T) {
	t.Parallel()
	env, ws, srv, calls := keyedHookServer(t, func(_ context.Context, n int32) error {
		if n <= 3 {
			return apierr.InvalidField("url", "is refused this time")
		}
		return nil
	})
	const clients = 12
	var created, actedBy string
	for round := 0; round < 8; round++ {
		recs := make([]*httptest.ResponseRecorder, clients)
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() { recs[i] = sendKeyed(srv, ws.Key, "hammer") })
		}
		wg.Wait()
		for _, rec := range recs {
			switch rec.Code {
			case http.StatusBadRequest:
				require.Contains(t, rec.Body.String(), "is refused this time")
			case http.StatusConflict:
				require.Contains(t, rec.Body.String(), `"code":"retry_request"`)
			case http.StatusCreated:
				if rec.Header().Get(httpapi.ReplayedHeader) == "" {
					require.Empty(t, created, "a second request acted: %s", rec.Body)
					created, actedBy = rec.Body.String(), rec.Header().Get(httpapi.RequestIDHeader)
				}
			default:
				t.Fatalf("answered %d: %s", rec.Code, rec.Body)
			}
		}
		for _, rec := range recs {
			if rec.Code == http.StatusCreated && rec.Header().Get(httpapi.ReplayedHeader) != "" {
				require.Equal(t, created, rec.Body.String())
				require.Equal(t, actedBy, rec.Header().Get(httpapi.OriginalRequestHeader))
			}
		}
	}
	require.NotEmpty(t, created, "no request acted in eight rounds")
	require.Equal(t, 1, webhookCount(t, env, ws.Key), "the refused acts rolled back, one committed")
	require.GreaterOrEqual(t, calls.Load(), int32(4))
}

// A client that goes away while its request acts under a key: the request
// rolls back and frees the key, and the retry acts at once (not 409
// retry_request for the claim's 30 seconds) and makes the one webhook.
func TestIdempotencyKeyOfARequestWhoseClientLeftIsFree(t *testing.T) {
	t.Parallel()
	acting := make(chan struct{})
	env, ws, srv, _ := keyedHookServer(t, func(ctx context.Context, n int32) error {
		if n > 1 {
			return nil
		}
		close(acting)
		<-ctx.Done() // the client hangs up
		return ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest("POST", "/api/v1/test/left", strings.NewReader(`{}`)).WithContext(ctx)
	req.Header.Set("Authorization", "Bearer "+ws.Key)
	req.Header.Set(idempotency.Header, "create-left")
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeHTTP(httptest.NewRecorder(), req)
	}()
	<-acting
	cancel()
	<-done
	requireRetryActs(t, env, srv, ws.Key, "left")
}

// A large answer (megabytes: a reconciliation's, say) is kept and given
// again byte for byte, as a small one is.
func TestIdempotencyKeyKeepsALargeAnswerWhole(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	var calls atomic.Int32
	blob := strings.Repeat("0123456789abcdef", 1<<18) // 4 MiB
	srv := keyedServer(env, func(context.Context, *httpapi.Call) (any, error) {
		return map[string]any{"n": calls.Add(1), "blob": blob}, nil
	})
	first := sendKeyed(srv, ws.Key, "large")
	require.Equal(t, http.StatusCreated, first.Code)
	require.Greater(t, first.Body.Len(), len(blob))
	again := sendKeyed(srv, ws.Key, "large")
	require.Equal(t, http.StatusCreated, again.Code)
	require.Equal(t, "true", again.Header().Get(httpapi.ReplayedHeader))
	require.Equal(t, first.Body.String(), again.Body.String())
	require.EqualValues(t, 1, calls.Load())
}

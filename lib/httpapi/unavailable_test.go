package httpapi_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/testpg"
)

func TestDatabaseUnreachableIs503FailFast(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) {
		u, _ := url.Parse(c.DatabaseURL)
		u.Host = "127.0.0.1:1"
		c.DatabaseURL = u.String()
		c.DBConnectTimeout = time.Second
	}))
	h := env.Do("GET", "/api/v1/health", "", nil)
	require.Equal(t, http.StatusServiceUnavailable, h.Status)
	require.Equal(t, false, h.JSON()["ok"])

	r := env.Do("POST", "/api/v1/workspaces", "", map[string]any{"name": "a"})
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	require.Equal(t, "database_unavailable", r.ErrorCode())
	require.Equal(t, "not_applied", r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["outcome"],
		"nothing could be sent")

	k := env.Do("GET", "/api/v1/keys", "rk_00000000000000000000000000_0000000000000000000000000000000000000000000000000000000000000000", nil)
	require.Equal(t, http.StatusServiceUnavailable, k.Status, "%s", k.Body)
	require.Equal(t, "not_applied", k.JSON()["error"].(map[string]any)["detail"].(map[string]any)["outcome"])
}

// At a cold start with the database refusing connections, a request
// reaches for it once: the clock's first reading fails to connect, and the
// request's statement then fails as it did instead of dialling again (QA:
// the first request failed after twice DB_CONNECT_TIMEOUT). The server
// hangs up at once, so nothing waits; the test counts dials.
func TestColdStartWithoutTheDatabaseDialsOncePerRequest(t *testing.T) {
	t.Parallel()
	down := testpg.StartHangUp(t)
	env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.DatabaseURL = down.URL }))
	r := env.Do("POST", "/api/v1/workspaces", "", map[string]any{"name": "a"})
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	require.Equal(t, "not_applied", r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["outcome"])
	require.Equal(t, 1, down.Dials(), "the request dialled for the clock, then again for its statement")
}

// cutEnv is a server whose database connections pass a proxy the test
// cuts, and a transaction straight to the database that holds what the
// request under test must wait for.
type cutEnv struct {
	*apitest.Env
	proxy *testpg.CutProxy
	hold  pgx.Tx
	watch *pgx.Conn // straight to the database, for lockWaiter
}

func startCut(t *testing.T, opts ...apitest.Option) *cutEnv {
	t.Helper()
	var e cutEnv
	var direct string
	e.Env = apitest.Start(t, append(opts, apitest.WithConfig(func(c *config.Config) {
		direct = c.DatabaseURL
		p, err := testpg.StartCutProxy(c.DatabaseURL)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		e.proxy = p
		c.DatabaseURL = p.URL
	}))...)
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, direct)
	require.NoError(t, err)
	t.Cleanup(func() { holder.Close(context.Background()) })
	e.hold, err = holder.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.hold.Rollback(context.Background()) })
	e.watch, err = pgx.Connect(ctx, direct)
	require.NoError(t, err)
	t.Cleanup(func() { e.watch.Close(context.Background()) })
	return &e
}

// holding runs sql in the holding transaction.
func (e *cutEnv) holding(sql string, args ...any) {
	e.T.Helper()
	_, err := e.hold.Exec(context.Background(), sql, args...)
	require.NoError(e.T, err)
}

// cutWhileWaiting cuts the server's connections once the request sent next
// is waiting for what the holding transaction holds.
func (e *cutEnv) cutWhileWaiting() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := lockWaiter(e.watch); err != nil {
			e.T.Error(err)
		}
		e.proxy.Cut()
	}()
	// Before the watching connection closes (cleanups run last first), and
	// ordered for the race detector, which sees no order through sockets.
	e.T.Cleanup(func() { <-done })
}

// lockWaiter returns once a backend of q's database waits for a lock: the
// request under test has reached what the test holds (a fixed sleep was a
// guess).
func lockWaiter(q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var waiting int
		if err := q.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			return err
		}
		if waiting > 0 {
			return nil
		}
	}
	return errors.New("no request came to wait for the lock the test holds")
}

// outcome is a database_unavailable answer's detail.outcome.
func outcome(t *testing.T, r *apitest.Response) any {
	t.Helper()
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	require.Equal(t, "database_unavailable", r.ErrorCode())
	return r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["outcome"]
}

// A connection lost while a statement was in flight is a 503 too (it was a
// 500), but one that does not promise nothing changed: the statement may
// have committed, and a retry under the same key or token says what
// happened.
func TestConnectionLostMidRequestIs503OutcomeUnknown(t *testing.T) {
	t.Parallel()
	env := startCut(t)
	ws := env.Signup()
	d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		map[string]any{"effect_type": "email.send", "idempotency_key": "lost"}).JSON()

	// The report's statement waits for the effect's row.
	env.holding(`SELECT 1 FROM effects WHERE id = $1 FOR UPDATE`, d["effect_id"])
	env.cutWhileWaiting()
	r := env.Do("POST", "/api/v1/effects/"+d["effect_id"].(string)+"/report", ws.Key,
		map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded"})
	require.Equal(t, "unknown", outcome(t, r))
	require.NoError(t, env.hold.Rollback(context.Background()))

	// The retry the answer invites settles it: it records the report, or
	// answers the one the lost request committed once the row was free.
	rep := env.Must(http.StatusOK, "POST", "/api/v1/effects/"+d["effect_id"].(string)+"/report", ws.Key,
		map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded"}).JSON()
	require.Equal(t, "succeeded", rep["state"])
}

// A connection lost while the key was being looked up (and its rate
// counted) is not_applied: the route never ran, so the request's action was
// not applied whatever that statement did (chaos QA: it said unknown).
func TestConnectionLostDuringAuthenticationIsNotApplied(t *testing.T) {
	t.Parallel()
	var logs apitest.LockedBuffer
	clock := apitest.NewClock(time.Now())
	env := startCut(t, apitest.WithNow(clock.Now), apitest.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ws := env.Signup()
	created := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key,
		map[string]any{"name": "limited", "preset": "OPERATOR", "rate_limit_per_minute": 1000}).JSON()

	// The look-up waits for the key's rate counter of this minute.
	env.holding(`INSERT INTO rate_counters (bucket, window_start, shard, count) VALUES ($1, $2, 0, 0)`,
		"key:"+created["id"].(string), clock.Now().UTC().Truncate(time.Minute))
	env.cutWhileWaiting()
	r := env.Do("POST", "/api/v1/webhooks", created["secret"].(string),
		map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}})
	require.Equal(t, "not_applied", outcome(t, r))
	require.Contains(t, logs.String(), `msg="database unavailable"`, "an outage is logged (review)")
}

// A request whose time runs out waiting for the database is told so, not
// that the database is unavailable (chaos QA), with the outcome as before:
// unknown for a statement in flight, not_applied for a keyed request (its
// transaction never committed).
func TestADatabaseTooSlowIsSaidSo(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	srv := httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{{
		Method: "POST", Pattern: "/api/v1/test/{outcome}", Name: "test.slow", Status: 201, Idempotent: true,
		Request: struct{}{}, Timeout: 2 * time.Second, Scopes: []string{auth.ScopeKeysWrite},
		Handle: func(ctx context.Context, c *httpapi.Call) (any, error) {
			_, err := db.Conn(ctx, env.App.Pool).Exec(ctx, `SELECT pg_sleep(5)`)
			return nil, err
		},
	}})
	for _, keyed := range []bool{false, true} {
		req := httptest.NewRequest("POST", "/api/v1/test/slow", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+ws.Key)
		want := "unknown"
		if keyed {
			req.Header.Set(idempotency.Header, "slow")
			want = "not_applied"
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		require.Equal(t, http.StatusServiceUnavailable, rec.Code, "%s", rec.Body)
		require.Contains(t, rec.Body.String(), `"outcome":"`+want+`"`)
		require.Contains(t, rec.Body.String(), "did not answer in time")
	}
}

// A connection lost while the request's Idempotency-Key was being claimed
// is not_applied: the route never ran. The claim may have landed, so the
// key may be held until it lapses; a retry is told to wait, or acts.
func TestConnectionLostWhileClaimingAKeyIsNotApplied(t *testing.T) {
	t.Parallel()
	env := startCut(t)
	ws := env.Signup()
	created := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key,
		map[string]any{"name": "creator", "preset": "OPERATOR"}).JSON()
	creator := created["secret"].(string)
	env.Must(http.StatusOK, "GET", "/api/v1/keys", creator, nil) // its look-up is cached now

	// The claim waits for the key's row of idempotent_requests.
	env.holding(`INSERT INTO idempotent_requests (key_id, idempotency_key, request_hash, request_id,
		claimed_until, created_at) VALUES ($1, 'cut', '\x00', 'req_holder', now(), now())`, created["id"])
	env.cutWhileWaiting()
	body := map[string]any{"url": "https://example.com/hook", "events": []string{"run.finished"}}
	r := env.DoWith("POST", "/api/v1/webhooks", creator, http.Header{"Idempotency-Key": {"cut"}}, body)
	require.Equal(t, "not_applied", outcome(t, r))
	require.NoError(t, env.hold.Rollback(context.Background()))
	require.Empty(t, env.Must(http.StatusOK, "GET", "/api/v1/webhooks", creator, nil).JSON()["data"])
}

// A request that finds every connection of the instance's pool in use
// waits for one until its deadline, or DB_ACQUIRE_TIMEOUT when set, then is
// answered 503 not_applied and told why (pool QA: four requests waiting on
// one locked row took a pool of 4, and a begin behind them waited out its
// 15 s deadline to be answered "may have been applied", though it never
// reached the database).
func TestARequestThatGetsNoPooledConnectionIsNotApplied(t *testing.T) {
	t.Parallel()
	for _, bound := range []time.Duration{0, time.Second} {
		env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) {
			c.DBMaxConns = 2
			c.DBAcquireTimeout = bound
		}))
		ws := env.Signup()
		env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
			map[string]any{"effect_type": "email.send", "idempotency_key": "first"}) // the key is cached now
		srv := httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{{
			Method: "POST", Pattern: "/api/v1/test/write", Name: "test.write", Status: 201,
			Timeout: 2 * time.Second, Scopes: []string{auth.ScopeKeysWrite}, ChecksKey: true, // the key from the cache
			Handle: func(ctx context.Context, c *httpapi.Call) (any, error) {
				_, err := env.App.Pool.Exec(ctx, `SELECT 1`)
				return map[string]any{}, err
			},
		}})

		var held []*pgxpool.Conn
		for range 2 {
			c, err := env.App.Pool.Acquire(context.Background())
			require.NoError(t, err)
			held = append(held, c)
		}
		answers := []*httptest.ResponseRecorder{httptest.NewRecorder(), httptest.NewRecorder()}
		req := httptest.NewRequest("POST", "/api/v1/test/write", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+ws.Key)
		srv.ServeHTTP(answers[0], req)
		keyed := httptest.NewRequest("POST", "/api/v1/effects/begin",
			strings.NewReader(`{"effect_type": "email.send", "idempotency_key": "behind"}`))
		keyed.Header.Set("Authorization", "Bearer "+ws.Key)
		if bound > 0 { // a begin's own deadline is 15 s
			srv.ServeHTTP(answers[1], keyed)
		} else {
			answers = answers[:1]
		}
		for _, c := range held {
			c.Release()
		}
		for _, rec := range answers {
			require.Equal(t, http.StatusServiceUnavailable, rec.Code, "bound %v: %s", bound, rec.Body)
			require.Contains(t, rec.Body.String(), `"outcome":"not_applied"`, "bound %v", bound)
			require.Contains(t, rec.Body.String(), "connection of this instance stayed in use", "bound %v", bound)
		}
	}
}

// While the database cannot be reached (its host takes connections and
// never answers), a route that needs no database answers without reaching
// for it, and health within its own 2 s: neither waits for the database's
// clock to time a request it does not decide by (clock QA: every request
// read it first, so at a cold start the OpenAPI document waited out
// DB_CONNECT_TIMEOUT, and health that and its own 2 s). DB_CONNECT_TIMEOUT
// is an hour: a route that read the clock hangs.
func TestRoutesWithoutTheDatabaseDoNotWaitForItsClock(t *testing.T) {
	t.Parallel()
	silent := testpg.StartSilent(t) // accepts, never answers
	env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) {
		c.DatabaseURL = silent.URL
		c.DBConnectTimeout = time.Hour
	}))
	var r, h *apitest.Response
	apitest.Returns(t, "the OpenAPI document waited for DB_CONNECT_TIMEOUT", func() {
		r = env.Do("GET", "/api/v1/openapi.json", "", nil)
	})
	require.Equal(t, http.StatusOK, r.Status)
	require.Zero(t, silent.Dials(), "the OpenAPI document reached for the database")

	apitest.Returns(t, "health waited for DB_CONNECT_TIMEOUT, not its own 2 s", func() {
		h = env.Do("GET", "/api/v1/health", "", nil)
	})
	require.Equal(t, http.StatusServiceUnavailable, h.Status)
}

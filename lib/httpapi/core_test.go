package httpapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/httpapi"
)

func TestSignupReturnsOperatorKeyOnce(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	r := env.Must(http.StatusCreated, "POST", "/api/v1/workspaces", "", map[string]any{"name": "acme"})
	body := r.JSON()
	require.True(t, strings.HasPrefix(body["workspace_id"].(string), "ws_"))
	key := body["key"].(map[string]any)
	require.True(t, strings.HasPrefix(key["secret"].(string), "rk_"))
	require.Contains(t, key["scopes"], "policies:write")
	require.NotEmpty(t, r.Header.Get("X-Request-Id"))

	list := env.Must(http.StatusOK, "GET", "/api/v1/keys", key["secret"].(string), nil)
	require.NotContains(t, string(list.Body), key["secret"].(string))
	require.NotContains(t, string(list.Body), "secret")

	// Its scopes read as an OPERATOR key's minted later do, in one order
	// (QA: signup's came in another).
	minted := env.Must(http.StatusCreated, "POST", "/api/v1/keys", key["secret"].(string),
		map[string]any{"name": "op", "preset": "OPERATOR"}).JSON()
	require.Equal(t, minted["scopes"], key["scopes"])
	require.True(t, slices.IsSorted(toStrings(key["scopes"].([]any))))
	for _, k := range list.JSON()["data"].([]any) {
		require.Equal(t, minted["scopes"], k.(map[string]any)["scopes"], "listed")
	}
}

// A workspace name is 1 to 100 characters as sent, as the OpenAPI
// document's maxLength reads it, and not blank; it is stored trimmed.
func TestSignupNameIsBoundAsSent(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	for _, name := range []string{" " + strings.Repeat("n", 100) + " ", strings.Repeat("é", 101), " \t", ""} {
		r := env.Do("POST", "/api/v1/workspaces", "", map[string]any{"name": name})
		require.Equal(t, http.StatusBadRequest, r.Status, "%q", name)
		require.Contains(t, string(r.Body), "must be 1-100 characters")
	}
	r := env.Must(http.StatusCreated, "POST", "/api/v1/workspaces", "", map[string]any{"name": " " + strings.Repeat("é", 98) + " "})
	require.Equal(t, strings.Repeat("é", 98), r.JSON()["name"], "stored trimmed")
}

func toStrings(xs []any) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.(string)
	}
	return out
}

func TestHealth(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	r := env.Must(http.StatusOK, "GET", "/api/v1/health", "", nil)
	require.Equal(t, true, r.JSON()["ok"])
}

// An instance whose every pooled connection stays in use is not healthy,
// but health says so rather than "database unavailable": the database was
// never asked.
func TestHealthSaysWhenEveryConnectionIsInUse(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.DBMaxConns = 1 }))
	held, err := env.App.Pool.Acquire(context.Background())
	require.NoError(t, err)
	defer held.Release()
	r := env.Do("GET", "/api/v1/health", "", nil)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	require.Equal(t, false, r.JSON()["ok"])
	failure, _ := r.JSON()["error"].(map[string]any)
	require.Equal(t, "database_unavailable", failure["code"])
	require.Contains(t, failure["message"], "stayed in use")
}

// A pooled connection the server ended is not an outage: health answers
// from a fresh connection (QA: it flapped to 503 after pg_terminate_backend
// while the database answered).
//
// The health check runs over a pool of its own that never pings: pgxpool
// pings a connection idle for over a second before handing it out and
// quietly replaces a dead one, so over the app's pool this test could pass
// without the dead connection ever reaching the health check (a slow run,
// a busy machine). Here the dead connection is always the one it gets.
func TestHealthOutlivesAnEndedConnection(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ctx := context.Background()
	var dead uint32 // the ended backend; ShouldPing runs in this goroutine
	metDead := false
	pc := env.App.Pool.Config() // the app's settings, as lib/db builds them
	pc.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
		metDead = metDead || p.Conn.PgConn().PID() == dead
		return false
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer pool.Close()
	deps := env.App.Server.Deps
	deps.Pool = pool // health uses only the pool
	srv := httpapi.New(deps)

	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	var pid int32
	require.NoError(t, c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	dead = uint32(pid)
	c.Release() // the pool's only connection, handed out next
	admin, err := pgx.Connect(ctx, env.App.Config.DatabaseURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	var ended bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ended))
	require.True(t, ended)
	require.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n)
		return err == nil && n == 0
	}, 5*time.Second, 5*time.Millisecond)

	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", "/api/v1/health", nil))
	require.True(t, metDead, "the health check was handed the ended connection")
	require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
}

// A health check its caller gave up on is not an outage: it is not logged
// as "database unavailable" (soak QA: every reader cut at the end of a run
// logged one, with "context canceled").
func TestHealthCutByItsCallerIsNotAnOutage(t *testing.T) {
	t.Parallel()
	var logged apitest.LockedBuffer
	env := apitest.Start(t, apitest.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	env.App.Server.ServeHTTP(rec, httptest.NewRequest("GET", "/api/v1/health", nil).WithContext(ctx))
	require.NotContains(t, logged.String(), "database unavailable")
	require.NotEqual(t, http.StatusOK, rec.Code, "%s", rec.Body)
}

// Answers are JSON, never HTML: <, > and & are written as they are. A
// claim's size is bounded by its stored inputs, and escaping made each such
// character six bytes, past the platforms' answer limits (review).
func TestAnswersAreNotHTMLEscaped(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	r := env.Must(http.StatusCreated, "POST", "/api/v1/groups", ws.Key, map[string]any{"name": "<b>&"})
	require.Contains(t, string(r.Body), `"name":"<b>&"`)
	require.True(t, strings.HasSuffix(string(r.Body), "}\n"))
}

// A request with two Authorization headers names no one caller: it is
// refused, not served as the first's (fuzz QA).
func TestTwoAuthorizationHeadersAreRefused(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	r := env.DoWith("GET", "/api/v1/keys", "", http.Header{"Authorization": {"Bearer " + ws.Key, "Bearer junk"}}, nil)
	require.Equal(t, http.StatusUnauthorized, r.Status, "%s", r.Body)
	env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil)
}

// The Bearer scheme is read as RFC 9110 has it (its name in any case, one
// or more spaces before the credential), and anything else is refused as
// any bad key is: 401 in the envelope with a request id, the credential
// never echoed, and one answer whatever was wrong, so that nothing tells a
// revoked key, a wrong secret and an unknown key apart (security QA:
// checked, and found so).
func TestTheBearerCredentialIsReadStrictlyAndRefusedAlike(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	send := func(values ...string) *apitest.Response {
		return env.DoWith("GET", "/api/v1/keys/current", "", http.Header{"Authorization": values}, nil)
	}
	for _, h := range []string{"Bearer " + ws.Key, "bearer " + ws.Key, "BEARER " + ws.Key, "Bearer   " + ws.Key,
		"Bearer " + ws.Key + " "} {
		require.Equal(t, http.StatusOK, send(h).Status, "%q", h)
	}

	r := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, map[string]any{"name": "r", "preset": "AGENT"})
	revoked := r.JSON()["secret"].(string)
	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+r.JSON()["id"].(string), ws.Key, nil)
	wrong := ws.Key[:len(ws.Key)-1] + "0"
	if wrong == ws.Key {
		wrong = ws.Key[:len(ws.Key)-1] + "1"
	}
	unknown := "rk_" + strings.Repeat("0", 26) + "_" + strings.Repeat("a", 64)
	var first string
	for name, values := range map[string][]string{
		"revoked": {"Bearer " + revoked}, "wrong secret": {"Bearer " + wrong}, "unknown": {"Bearer " + unknown},
		"no credential": {"Bearer"}, "empty credential": {"Bearer "}, "empty": {""}, "other scheme": {"Token " + ws.Key},
		"colon": {"Bearer:" + ws.Key}, "two credentials": {"Bearer " + ws.Key + " " + ws.Key},
		"non-ASCII": {"Bearer " + strings.Replace(ws.Key, "_", "é", 1)}, "long": {"Bearer " + strings.Repeat("k", 200_000)},
		"two headers": {"Bearer " + ws.Key, "Bearer " + ws.Key},
	} {
		got := send(values...)
		require.Equal(t, http.StatusUnauthorized, got.Status, "%s: %s", name, got.Body)
		require.Equal(t, "unauthorized", got.ErrorCode(), name)
		require.NotEmpty(t, got.Header.Get(httpapi.RequestIDHeader), name)
		require.Equal(t, `Bearer realm="ratchet"`, got.Header.Get("WWW-Authenticate"), name)
		for _, secret := range []string{ws.Key, revoked, wrong, unknown} {
			require.NotContains(t, string(got.Body), secret, name)
		}
		if first == "" {
			first = string(got.Body)
		}
		require.Equal(t, first, string(got.Body), "%s: one answer for every bad credential", name)
	}
}

package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
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
}

func TestHealth(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	r := env.Must(http.StatusOK, "GET", "/api/v1/health", "", nil)
	require.Equal(t, true, r.JSON()["ok"])
}

// A pooled connection the server ended is not an outage: health answers
// from a fresh connection (QA: it flapped to 503 after pg_terminate_backend
// while the database answered).
func TestHealthOutlivesAnEndedConnection(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ctx := context.Background()
	c, err := env.App.Pool.Acquire(ctx)
	require.NoError(t, err)
	var pid int32
	require.NoError(t, c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	c.Release() // idle in the pool, and recent enough that the pool hands it out unchecked
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
	r := env.Do("GET", "/api/v1/health", "", nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
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

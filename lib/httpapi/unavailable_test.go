package httpapi_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
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

	k := env.Do("GET", "/api/v1/keys", "rk_00000000000000000000000000_"+string(make([]byte, 0))+"0000000000000000000000000000000000000000000000000000000000000000", nil)
	require.Equal(t, http.StatusServiceUnavailable, k.Status, "%s", k.Body)
}

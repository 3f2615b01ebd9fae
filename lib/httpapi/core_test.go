package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

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

package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
)

// TestEveryResponseSaysNoSniff: every answer of the router, JSON or text,
// success or refusal, keyed or public, tells browsers not to guess its type
// (security review: only the console's files said so). Answers echo text
// agents and callers wrote (effect types, idempotency keys, names, field
// names), so a browser that sniffed one as HTML would run it.
func TestEveryResponseSaysNoSniff(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	mcp := http.Header{"Accept": {"application/json"}}
	for _, c := range []struct {
		method, path, key string
		header            http.Header
		body              any
		status            int
	}{
		{"GET", "/api/v1/health", "", nil, nil, http.StatusOK},
		{"GET", "/api/v1/openapi.json", "", nil, nil, http.StatusOK},
		{"GET", "/llms.txt", "", nil, nil, http.StatusOK},
		{"GET", "/.well-known/ratchet.json", "", nil, nil, http.StatusOK},
		{"GET", "/api/v1/nope", "", nil, nil, http.StatusNotFound},
		{"GET", "/api/v1/effects", "", nil, nil, http.StatusUnauthorized},
		{"GET", "/api/cron/sweep", "", nil, nil, http.StatusUnauthorized},
		{"GET", "/api/v1/keys/current", ws.Key, nil, nil, http.StatusOK},
		{"GET", "/v1/keys/current", ws.Key, nil, nil, http.StatusOK},
		{"GET", "/api/v1/effects?x=<script>", ws.Key, nil, nil, http.StatusBadRequest},
		{"POST", "/api/v1/mcp", ws.Key, mcp, map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
			http.StatusOK},
		{"GET", "/api/v1/mcp", ws.Key, nil, nil, http.StatusMethodNotAllowed},
		{"GET", "/console", "", nil, nil, http.StatusOK},
	} {
		res := env.DoWith(c.method, c.path, c.key, c.header, c.body)
		require.Equal(t, c.status, res.Status, "%s %s: %s", c.method, c.path, res.Body)
		require.Equal(t, "nosniff", res.Header.Get("X-Content-Type-Options"), "%s %s", c.method, c.path)
	}

	// An entry point that cannot reach the router answers the same way.
	w := httptest.NewRecorder()
	httpapi.WriteOutsideError(w, apierr.Unauthorized("no"))
	require.Equal(t, "nosniff", w.Header().Get("X-Content-Type-Options"))
}

// TestSecretAnswersAreNotStored: the answers that show a secret once (a
// workspace's key, a minted key, a subscription's signing secret, a
// rotation's, and a rotation given again from its Idempotency-Key) say
// Cache-Control: no-store, so neither a browser showing them in the
// console nor a proxy keeps a copy; so does a refusal. Nothing held this
// header before (console review).
func TestSecretAnswersAreNotStored(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	signup := env.DoWith("POST", "/api/v1/workspaces", "", nil, map[string]any{"name": "no-store"})
	require.Equal(t, http.StatusCreated, signup.Status, "%s", signup.Body)
	key, _ := signup.JSON()["key"].(map[string]any)["secret"].(string)
	minted := env.DoWith("POST", "/api/v1/keys", key, nil, map[string]any{"name": "k", "preset": "AGENT"})
	hook := env.DoWith("POST", "/api/v1/webhooks", key, nil,
		map[string]any{"url": "https://example.com/h", "events": []string{"run.finished"}})
	hookID, _ := hook.JSON()["id"].(string)
	rotate := func() *apitest.Response {
		return env.DoWith("POST", "/api/v1/webhooks/"+hookID+"/rotate-secret", key,
			http.Header{"Idempotency-Key": {"no-store-rotation"}}, map[string]any{})
	}
	rotated, again := rotate(), rotate()
	require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader), "given again from its Idempotency-Key")
	for name, res := range map[string]*apitest.Response{"workspace": signup, "key": minted, "webhook": hook,
		"rotation": rotated, "rotation again": again} {
		require.Less(t, res.Status, 300, "%s: %s", name, res.Body)
		require.Contains(t, string(res.Body), `"secret":"`, name)
		require.Equal(t, "no-store", res.Header.Get("Cache-Control"), name)
	}
	refused := env.DoWith("GET", "/api/v1/keys", "", nil, nil)
	require.Equal(t, http.StatusUnauthorized, refused.Status)
	require.Equal(t, "no-store", refused.Header.Get("Cache-Control"))
}

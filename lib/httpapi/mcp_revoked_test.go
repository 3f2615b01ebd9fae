package httpapi_test

import (
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
)

// A key revoked on one instance calls no MCP tool on another whose cache
// still holds it (README, Key cache and revocation bound): the endpoint
// takes the message as a read, within KEY_CACHE_TTL (a tools/list is
// answered), but each tool call is its REST call, which reads the key
// afresh or checks it in its own statement (a begin, a resolve, an
// approval's decision), so each is the tool's unauthorized, alone or in a
// batch, and nothing changes (the refusal world's digest of every table).
//
// Not parallel: the digest covers the whole database (TestRefusalsChangeNothing).
func TestAKeyRevokedOnAnotherInstanceCallsNoMCPTool(t *testing.T) {
	w := newRefusalWorld(t)
	cached := apitest.Start(t, apitest.WithConfig(func(c *config.Config) { c.KeyCacheTTL = time.Hour }))
	key := w.env.Must(http.StatusCreated, "POST", "/api/v1/keys", w.own.Key, map[string]any{"name": "mcp",
		"scopes": []string{"effects:begin", "effects:report", "effects:resolve", "effects:read", "approvals:write", "policies:read"}}).JSON()
	secret := key["secret"].(string)
	header := http.Header{"Accept": {"application/json, text/event-stream"}}
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	calls := map[string]any{
		"ratchet_begin":           map[string]any{"effect_type": "email.send", "idempotency_key": "revoked"},
		"ratchet_resolve":         w.toolSeed(t, "ratchet_resolve"),
		"ratchet_decide_approval": w.toolSeed(t, "ratchet_decide_approval"),
	}
	var batch []any
	for i, tool := range slices.Sorted(maps.Keys(calls)) {
		batch = append(batch, map[string]any{"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
			"params": map[string]any{"name": tool, "arguments": calls[tool]}})
	}
	// Live, the key is served on the caching instance (its read of the
	// policy, which changes nothing, is cached there).
	require.Equal(t, http.StatusOK, cached.DoWith("POST", "/api/v1/mcp", secret, header, list).Status)
	require.Equal(t, http.StatusOK, cached.Do("GET", "/api/v1/policies/email.send", secret, nil).Status)

	w.env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+key["id"].(string), w.own.Key, nil)
	require.Equal(t, http.StatusOK, cached.Do("GET", "/api/v1/policies/email.send", secret, nil).Status,
		"the instance still caches the key (README: reads pass within KEY_CACHE_TTL)")
	before := w.digest(t)
	res := cached.DoWith("POST", "/api/v1/mcp", secret, header, list)
	require.Equal(t, http.StatusOK, res.Status, "a read, within KEY_CACHE_TTL: %s", res.Body)
	res = cached.DoWith("POST", "/api/v1/mcp", secret, header, mustJSON(batch))
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	var answers []struct {
		ID     int `json:"id"`
		Result struct {
			IsError           bool `json:"isError"`
			StructuredContent struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			} `json:"structuredContent"`
		} `json:"result"`
	}
	res.Decode(t, &answers)
	require.Len(t, answers, len(calls))
	for _, a := range answers {
		require.True(t, a.Result.IsError, "call %d", a.ID)
		require.Equal(t, "unauthorized", a.Result.StructuredContent.Error.Code, "call %d", a.ID)
	}
	require.Equal(t, before, w.digest(t), "nothing changed")
}

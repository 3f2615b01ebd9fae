package mcpserver_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// The transport's refusals are answers an MCP client can read: a message it
// cannot take is a JSON-RPC error response (parse error, invalid request,
// method not found, with the message's id), an oversized body the API's 413
// envelope, a wrong content type the API's 400 envelope. (All were plain
// text.)
func TestTransportRefusalsAreJSON(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	post := func(contentType string, body []byte) (int, map[string]any) {
		req, err := http.NewRequest("POST", env.Server.URL+"/api/v1/mcp", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Accept", "application/json, text/event-stream")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		require.True(t, strings.HasPrefix(res.Header.Get("Content-Type"), "application/json"), res.Header.Get("Content-Type"))
		var out map[string]any
		require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
		return res.StatusCode, out
	}
	for _, c := range []struct {
		body string
		code float64
		id   any
	}{
		{`not json`, -32700, nil},
		{`{"jsonrpc":"1.0","id":1,"method":"tools/list"}`, -32600, 1.0},
		{`{"jsonrpc":"2.0","id":"m7","method":"nope/nope"}`, -32601, "m7"},
	} {
		status, out := post("application/json", []byte(c.body))
		require.Equal(t, http.StatusBadRequest, status, c.body)
		require.Equal(t, "2.0", out["jsonrpc"], c.body)
		require.Equal(t, c.id, out["id"], c.body)
		require.Equal(t, c.code, out["error"].(map[string]any)["code"], "%s: %v", c.body, out)
	}
	big := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_begin","arguments":{"payload":"` +
		strings.Repeat("x", 1<<20) + `"}}}`)
	status, out := post("application/json", big)
	require.Equal(t, http.StatusRequestEntityTooLarge, status)
	require.Equal(t, "payload_too_large", out["error"].(map[string]any)["code"])
	status, out = post("text/plain", []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "invalid_request", out["error"].(map[string]any)["code"])
	// A well-formed message is answered as before.
	status, out = post("application/json", []byte(`{"jsonrpc":"2.0","id":2,"method":"ping"}`))
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.EqualValues(t, 2, out["id"])
}

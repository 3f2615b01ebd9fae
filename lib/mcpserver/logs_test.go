package mcpserver_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// Nothing a caller sends through the MCP endpoint, nor any key or lease
// token, reaches a log line (README: never log payloads, inputs, outputs,
// keys or secrets): every tool's arguments and results, the gate's refusals
// of them, JSON-RPC refusals naming an unknown method, tool or argument, a
// batch, a wrong or revoked key, each holding a marker a log line would show.
func TestNothingSentThroughMCPIsLogged(t *testing.T) {
	t.Parallel()
	var logs apitest.LockedBuffer
	env := apitest.Start(t, apitest.WithLogger(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ws := env.Signup()
	agent := env.Key(ws, map[string]any{"name": "agent", "preset": "AGENT"})
	revoked := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, map[string]any{"name": "gone", "preset": "AGENT"}).JSON()
	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+revoked["id"].(string), ws.Key, nil)
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/logs.wire", ws.Key, map[string]any{"approval_above_micros": 10})
	const m = "zqmarker" // in every value sent
	secrets := []string{ws.Key, agent, revoked["secret"].(string)}
	send := func(key string, msg any) map[int]toolAnswer {
		t.Helper()
		a, err := toolAnswers(context.Background(), env, key, msg)
		require.NoError(t, err)
		return a
	}
	begin := send(agent, rpcCall(1, "ratchet_begin", map[string]any{"effect_type": "logs.send",
		"idempotency_key": m + "-key", "payload": map[string]any{m + "-name": m + "-payload"},
		"dimensions": map[string]any{"to": m + "-to"}, "request_id": m + "-request-0123456789"}))[1].content
	require.Equal(t, "execute", begin["decision"], "%v", begin)
	effect, lease := begin["effect_id"].(string), begin["lease_token"].(string)
	secrets = append(secrets, lease)
	send(agent, []any{
		rpcCall(1, "ratchet_heartbeat", map[string]any{"effect_id": effect, "lease_token": lease}),
		rpcCall(2, "ratchet_report", map[string]any{"effect_id": effect, "lease_token": lease, "outcome": "succeeded",
			"result": map[string]any{"sent": m + "-result"}}),
	})
	send(agent, rpcCall(1, "ratchet_begin", map[string]any{"effect_type": "logs.send", "idempotency_key": m + "-key",
		"payload": map[string]any{m + "-name": m + "-payload"}})) // a duplicate, its result answered
	held := send(ws.Key, rpcCall(1, "ratchet_begin", map[string]any{"effect_type": "logs.wire", "idempotency_key": m + "-wire",
		"cost_micros": 50}))[1].content
	mixed, err := json.Marshal([]any{
		rpcCall(1, "ratchet_decide_approval", map[string]any{"approval_id": held["approval_id"], "decision": "reject",
			"note": m + "-note"}),
		rpcCall(2, "ratchet_get_effect", map[string]any{"effect_id": effect}),
		rpcCall(3, "ratchet_list_effects", map[string]any{"effect_type": "logs.send", "cursor": m + "-cursor"}),
		rpcCall(4, "ratchet_get_policy", map[string]any{"effect_type": m + ".type"}),
		rpcCall(5, "ratchet_list_approvals", map[string]any{"state": m + "-state"}),
		rpcCall(6, "ratchet_resolve", map[string]any{"effect_id": "eff_" + m, "outcome": m + "-outcome", "note": m}),
		rpcCall(7, m+"_tool", map[string]any{"a": m}),
		rpcCall(8, "ratchet_begin", map[string]any{"effect_type": m + " type", "idempotency_key": m + "\x01",
			m + "_unknown": m, "cost_micros": m, "request_id": m}),
		map[string]any{"jsonrpc": "2.0", "id": 9, "method": m + "/method", "params": map[string]any{"a": m}},
	})
	require.NoError(t, err)
	status, answers := postMCP(t, env, ws.Key, string(mixed))
	require.Equal(t, http.StatusOK, status, "%s", answers)
	require.Len(t, rpcAnswers(t, answers), 9)
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":"` + m + `","method":"` + m + `"}`,
		`{"jsonrpc":"` + m + `","id":1,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + m + `","capabilities":{},` +
			`"clientInfo":{"name":"` + m + `","version":"` + m + `"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"` + m + `"}`,
		`not json ` + m,
	} {
		postMCP(t, env, agent, body)
	}
	for _, key := range []string{revoked["secret"].(string), "rk_" + m, m} {
		req := mcpRequest(t, env, key, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	}

	out := logs.String()
	require.Contains(t, out, `"route":"mcp.post"`, "the endpoint's requests are logged")
	require.Contains(t, out, `"route":"effects.begin"`, "the tool calls' REST calls are logged")
	for _, line := range strings.Split(out, "\n") {
		require.NotContains(t, strings.ToLower(line), m, "a value sent")
		for _, s := range secrets {
			require.NotContains(t, line, s, "a key or lease token")
		}
	}
}

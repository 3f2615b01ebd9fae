package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/mcpserver"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

func connect(t *testing.T, srv *mcp.Server) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func callJSON(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (map[string]any, bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	require.Len(t, res.Content, 1)
	var body map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &body))
	return body, res.IsError
}

func TestNineToolsListed(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, ""))
	res, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		require.NotEmpty(t, tl.Description)
		require.NotNil(t, tl.InputSchema)
	}
	require.ElementsMatch(t, mcpserver.ToolNames(), names)
	require.Len(t, names, 9)
}

// TestGateThroughTools drives begin → report → duplicate through the tools,
// in-process and over HTTP (the stdio binary's path), with an AGENT key.
func TestGateThroughTools(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	agent := env.Key(ws, map[string]any{"name": "agent", "preset": "AGENT"})
	for name, caller := range map[string]mcpserver.Caller{
		"in-process": mcpserver.HandlerCaller{Handler: env.App.Server},
		"http":       mcpserver.HTTPCaller{BaseURL: env.Server.URL},
	} {
		t.Run(name, func(t *testing.T) {
			cs := connect(t, mcpserver.New(caller, "Bearer "+agent))
			key := "welcome-email:" + name
			begin := map[string]any{"effect_type": "email.send", "idempotency_key": key, "payload": map[string]any{"to": "u1"}}
			first, isErr := callJSON(t, cs, "ratchet_begin", begin)
			require.False(t, isErr, "%v", first)
			require.Equal(t, "execute", first["decision"])

			rep, isErr := callJSON(t, cs, "ratchet_report", map[string]any{"effect_id": first["effect_id"],
				"lease_token": first["lease_token"], "outcome": "succeeded", "result": map[string]any{"message_id": "m1"}})
			require.False(t, isErr, "%v", rep)
			require.Equal(t, "succeeded", rep["state"])

			dup, isErr := callJSON(t, cs, "ratchet_begin", begin)
			require.False(t, isErr)
			require.Equal(t, "duplicate", dup["decision"])
			require.Equal(t, map[string]any{"message_id": "m1"}, dup["result"])

			// The agent key cannot decide approvals: the REST scope check answers.
			denied, isErr := callJSON(t, cs, "ratchet_decide_approval", map[string]any{
				"approval_id": "apr_00000000000000000000000000", "decision": "approve"})
			require.True(t, isErr)
			require.Equal(t, "forbidden", denied["error"].(map[string]any)["code"])
		})
	}
}

type bearerTransport struct{ key string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.key != "" {
		r.Header.Set("Authorization", "Bearer "+b.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func TestStreamableHTTPEndpointUsesCallersKey(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	agent := env.Key(ws, map[string]any{"name": "agent", "preset": "AGENT"})
	for _, tc := range []struct {
		key      string
		decision string
		code     string
	}{{agent, "execute", ""}, {"", "", "unauthorized"}} {
		ctx := context.Background()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
			Endpoint: env.Server.URL + "/api/v1/mcp", HTTPClient: &http.Client{Transport: bearerTransport{tc.key}},
			DisableStandaloneSSE: true,
		}, nil)
		require.NoError(t, err)
		body, isErr := callJSON(t, cs, "ratchet_begin", map[string]any{"effect_type": "email.send", "idempotency_key": "k-http"})
		if tc.code != "" {
			require.True(t, isErr)
			require.Equal(t, tc.code, body["error"].(map[string]any)["code"])
		} else {
			require.False(t, isErr, "%v", body)
			require.Equal(t, tc.decision, body["decision"])
		}
		require.NoError(t, cs.Close())
	}
}

package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/jsonstrict"
	"github.com/getratchet/ratchet/lib/mcpserver"
	"github.com/getratchet/ratchet/lib/schematags"
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
		require.True(t, strings.HasSuffix(tl.Description,
			"Needs the key's "+mcpserver.ToolScopes()[tl.Name]+" scope."), tl.Description)
		require.NotNil(t, tl.InputSchema)
	}
	require.ElementsMatch(t, mcpserver.ToolNames(), names)
	require.Len(t, names, 9)

	// It offers tools, a fixed list, and nothing a stateless endpoint
	// cannot deliver (log messages, list-changed notifications).
	caps := cs.InitializeResult().Capabilities
	require.NotNil(t, caps.Tools)
	require.False(t, caps.Tools.ListChanged)
	require.Nil(t, caps.Logging)
	require.Nil(t, caps.Resources)
	require.Nil(t, caps.Prompts)
}

// The capability manifest, read without a key, describes each tool as
// tools/list does (seed: "MCP tool schemas" among the machine-readable
// documents; the MCP endpoint needs a key even to list them).
func TestTheManifestDescribesEveryToolAsToolsListDoes(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, ""))
	res, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	var manifest struct {
		MCP struct {
			ToolDefinitions []json.RawMessage `json:"tool_definitions"`
			Instructions    string            `json:"instructions"`
		} `json:"mcp"`
	}
	env.Must(http.StatusOK, "GET", "/.well-known/ratchet.json", "", nil).Decode(t, &manifest)
	require.Len(t, manifest.MCP.ToolDefinitions, len(res.Tools))
	// How to use the gate reaches an agent whose client never shows it
	// initialize's instructions: in the manifest and in ratchet_begin's
	// description, probe included (MCP QA: an agent told only "execute →
	// act" acted again on a probe).
	require.Equal(t, cs.InitializeResult().Instructions, manifest.MCP.Instructions)
	for _, tl := range res.Tools {
		if tl.Name == "ratchet_begin" {
			require.Contains(t, tl.Description, manifest.MCP.Instructions)
		}
	}
	for _, must := range []string{"probe: true", "prior_attempt", "lease_expired", "ratchet_begin again"} {
		require.Contains(t, manifest.MCP.Instructions, must)
	}
	require.NotEmpty(t, res.Tools)
	described := map[string]string{}
	for _, raw := range manifest.MCP.ToolDefinitions {
		var named struct{ Name string }
		require.NoError(t, json.Unmarshal(raw, &named))
		described[named.Name] = string(raw)
	}
	for _, tl := range res.Tools {
		listed, err := json.Marshal(tl)
		require.NoError(t, err)
		require.Contains(t, described, tl.Name)
		require.JSONEq(t, string(listed), described[tl.Name], tl.Name)
	}
}

// toolProperties lists each tool's input schema properties, as tools/list
// answers them.
func toolProperties(t *testing.T, cs *mcp.ClientSession) map[string]map[string]any {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	out := map[string]map[string]any{}
	for _, tl := range res.Tools {
		raw, err := json.Marshal(tl.InputSchema)
		require.NoError(t, err)
		var schema struct {
			Properties map[string]any `json:"properties"`
		}
		require.NoError(t, json.Unmarshal(raw, &schema))
		out[tl.Name] = schema.Properties
	}
	return out
}

// Each gate tool takes what its REST body takes, plus the path's ids (QA:
// ratchet_begin lacked request_id, so an agent could not recover a lost
// answer as the REST API lets it).
func TestToolsTakeTheirRESTBodysFields(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, ""))
	props := map[string][]string{}
	for name, properties := range toolProperties(t, cs) {
		props[name] = slices.Sorted(maps.Keys(properties))
	}
	body := func(v any, path ...string) []string {
		return slices.Sorted(slices.Values(append(slices.Collect(maps.Keys(jsonstrict.ExactFields(reflect.TypeOf(v)))), path...)))
	}
	for name, want := range map[string][]string{
		"ratchet_begin":           body(gate.BeginRequest{}),
		"ratchet_report":          body(gate.ReportRequest{}, "effect_id"),
		"ratchet_heartbeat":       body(gate.HeartbeatRequest{}, "effect_id"),
		"ratchet_resolve":         body(gate.ResolveRequest{}, "effect_id"),
		"ratchet_decide_approval": body(gate.DecideRequest{}, "approval_id", "decision"),
	} {
		require.Equal(t, want, props[name], name)
	}
}

// A tool's schema says what its REST route takes (QA: it was looser): the
// values of an outcome, a state or a decision, a page's limit, and that a
// required string is not empty (an empty effect_id was answered as an
// unknown route). Arguments outside it are invalid_request at their name.
func TestToolSchemasSayWhatTheRoutesTake(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	eff := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		map[string]any{"effect_type": "m.x", "idempotency_key": "schemas"}).JSON()["effect_id"]
	seventeen := map[string]any{}
	for i := range 17 {
		seventeen[fmt.Sprint("d", i)] = "v"
	}
	for _, c := range []struct {
		tool  string
		args  map[string]any
		field string
	}{
		{"ratchet_get_effect", map[string]any{"effect_id": ""}, "effect_id"},
		{"ratchet_report", map[string]any{"effect_id": eff, "lease_token": "t", "outcome": "SUCCEEDED"}, "outcome"},
		{"ratchet_resolve", map[string]any{"effect_id": eff, "outcome": "maybe"}, "outcome"},
		{"ratchet_list_effects", map[string]any{"state": "lost"}, "state"},
		{"ratchet_list_effects", map[string]any{"limit": 201}, "limit"},
		{"ratchet_list_effects", map[string]any{"effect_type": "a b"}, "effect_type"},
		{"ratchet_get_policy", map[string]any{"effect_type": strings.Repeat("t", 101)}, "effect_type"},
		{"ratchet_list_approvals", map[string]any{"limit": 0}, "limit"},
		{"ratchet_decide_approval", map[string]any{"approval_id": "apr_x", "decision": "REJECT"}, "decision"},
		// The bounds of the REST body's openapi tags (session 16's note:
		// the tools' schemas did not carry them).
		{"ratchet_begin", map[string]any{"effect_type": "a b", "idempotency_key": "k"}, "effect_type"},
		{"ratchet_begin", map[string]any{"effect_type": "m.x", "idempotency_key": strings.Repeat("k", 256)}, "idempotency_key"},
		{"ratchet_begin", map[string]any{"effect_type": "m.x", "idempotency_key": "k", "cost_micros": -1}, "cost_micros"},
		{"ratchet_begin", map[string]any{"effect_type": "m.x", "idempotency_key": "k", "lease_seconds": 0}, "lease_seconds"},
		{"ratchet_begin", map[string]any{"effect_type": "m.x", "idempotency_key": "k", "request_id": "short"}, "request_id"},
		// A key's characters too (agent QA: a newline passed the schema).
		{"ratchet_begin", map[string]any{"effect_type": "m.x", "idempotency_key": "a\nb"}, "idempotency_key"},
		{"ratchet_begin", map[string]any{"effect_type": "m.x", "idempotency_key": "k",
			"compensation": map[string]any{"effect_type": "-refund"}}, "compensation.effect_type"},
		{"ratchet_begin", map[string]any{"effect_type": "m.x", "idempotency_key": "k",
			"compensation": map[string]any{}}, "compensation.effect_type"},
		{"ratchet_resolve", map[string]any{"effect_id": eff, "outcome": "failed", "note": strings.Repeat("n", 2001)}, "note"},
		{"ratchet_resolve", map[string]any{"effect_id": eff, "outcome": "failed", "attempt": 0}, "attempt"},
		{"ratchet_resolve", map[string]any{"effect_id": eff, "outcome": "failed", "attempt": 1.5}, "attempt"},
		{"ratchet_begin", map[string]any{"effect_type": "m.x", "idempotency_key": "k",
			"dimensions": map[string]any{"to": strings.Repeat("v", 256)}}, "dimensions.to"},
		{"ratchet_begin", map[string]any{"effect_type": "m.x", "idempotency_key": "k",
			"dimensions": map[string]any{"-to": "v"}}, "dimensions.-to"},
		{"ratchet_begin", map[string]any{"effect_type": "m.x", "idempotency_key": "k",
			"dimensions": seventeen}, "dimensions"},
	} {
		body, isErr := callJSON(t, cs, c.tool, c.args)
		require.True(t, isErr, "%s %v", c.tool, c.args)
		e := body["error"].(map[string]any)
		require.Equal(t, "invalid_request", e["code"], "%s %v: %v", c.tool, c.args, body)
		v := e["detail"].(map[string]any)["validation"].([]any)
		require.Equal(t, c.field, v[0].(map[string]any)["field"], "%s %v", c.tool, c.args)
	}
	body, isErr := callJSON(t, cs, "ratchet_list_effects", map[string]any{"state": nil, "limit": 200})
	require.False(t, isErr, "%v", body)

	schemas := toolProperties(t, cs)
	prop := func(tool, name, key string) any { return schemas[tool][name].(map[string]any)[key] }
	require.Equal(t, []any{"succeeded", "failed"}, prop("ratchet_report", "outcome", "enum"))
	require.Equal(t, []any{"pending", "approved", "rejected", nil}, prop("ratchet_list_approvals", "state", "enum"))
	require.EqualValues(t, 200, prop("ratchet_list_effects", "limit", "maximum"))
	require.EqualValues(t, 1, prop("ratchet_get_effect", "effect_id", "minLength"))
	// They are the REST body's: the tags the OpenAPI document shows.
	for _, c := range []struct {
		tool, arg string
		rest      reflect.Type
		field     string
	}{
		{"ratchet_begin", "effect_type", reflect.TypeFor[gate.BeginRequest](), "EffectType"},
		{"ratchet_begin", "idempotency_key", reflect.TypeFor[gate.BeginRequest](), "IdempotencyKey"},
		{"ratchet_begin", "cost_micros", reflect.TypeFor[gate.BeginRequest](), "CostMicros"},
		{"ratchet_begin", "lease_seconds", reflect.TypeFor[gate.BeginRequest](), "LeaseSeconds"},
		{"ratchet_begin", "request_id", reflect.TypeFor[gate.BeginRequest](), "RequestID"},
		{"ratchet_resolve", "note", reflect.TypeFor[gate.ResolveRequest](), "Note"},
		{"ratchet_resolve", "attempt", reflect.TypeFor[gate.ResolveRequest](), "Attempt"},
		{"ratchet_decide_approval", "note", reflect.TypeFor[gate.DecideRequest](), "Note"}, // MCP QA: unbounded
		// An effect type in the URL is begin's (agent QA: any string, and
		// "a b" was refused).
		{"ratchet_get_policy", "effect_type", reflect.TypeFor[gate.BeginRequest](), "EffectType"},
		{"ratchet_list_effects", "effect_type", reflect.TypeFor[gate.BeginRequest](), "EffectType"},
	} {
		f, ok := c.rest.FieldByName(c.field)
		require.True(t, ok, c.field)
		for rule, val := range schematags.Rules(f) {
			key := map[string]string{"min": "minimum", "max": "maximum", "printable": "pattern"}[rule]
			if key == "" {
				key = rule
			}
			if rule == "printable" {
				val = idemkey.Pattern
			}
			got := fmt.Sprint(prop(c.tool, c.arg, key))
			if n, err := strconv.ParseFloat(val, 64); err == nil {
				val = fmt.Sprint(n)
			}
			require.Equal(t, val, got, "%s.%s %s", c.tool, c.arg, rule)
		}
	}
	// A map's bounds too (MCP QA: the tool took any number of dimensions
	// of any length, which the REST call then refused).
	dims := schemas["ratchet_begin"]["dimensions"].(map[string]any)
	require.EqualValues(t, 16, dims["maxProperties"])
	require.Equal(t, map[string]any{"pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$", "maxLength": 64.0}, dims["propertyNames"])
	require.EqualValues(t, 255, dims["additionalProperties"].(map[string]any)["maxLength"])
	require.Equal(t, "^[A-Za-z0-9][A-Za-z0-9._:-]*$",
		schemas["ratchet_begin"]["compensation"].(map[string]any)["properties"].(map[string]any)["effect_type"].(map[string]any)["pattern"])

	// Every argument has a schema object (some clients refuse the boolean
	// schema true), and a compensation says its shape.
	for tool, props := range schemas {
		for name, p := range props {
			require.IsType(t, map[string]any{}, p, "%s.%s", tool, name)
		}
	}
	comp := schemas["ratchet_begin"]["compensation"].(map[string]any)
	require.ElementsMatch(t, []any{"object", "null"}, comp["type"])
	require.Equal(t, []any{"effect_type"}, comp["required"])
	require.Contains(t, comp["properties"], "payload")
	body, isErr = callJSON(t, cs, "ratchet_begin", map[string]any{"effect_type": "payment.charge",
		"idempotency_key": "c1", "compensation": "refund it"})
	require.True(t, isErr)
	require.Equal(t, "compensation", body["error"].(map[string]any)["detail"].(map[string]any)["validation"].([]any)[0].(map[string]any)["field"])

	// Reads are marked read-only, so a client may run them unasked; no tool
	// destroys a record or reaches past Ratchet.
	res, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	reads := []string{"ratchet_get_effect", "ratchet_list_effects", "ratchet_get_policy", "ratchet_list_approvals"}
	// Settling calls answer their first outcome again: safe to retry. Not
	// ratchet_resolve: without attempt, repeated, it settles a later
	// attempt (TestARepeatedResolveWithoutAttemptSettlesALaterAttempt).
	repeatable := []string{"ratchet_report", "ratchet_heartbeat", "ratchet_decide_approval"}
	for _, tl := range res.Tools {
		require.NotNil(t, tl.Annotations, tl.Name)
		require.Equal(t, slices.Contains(reads, tl.Name), tl.Annotations.ReadOnlyHint, tl.Name)
		require.Equal(t, slices.Contains(repeatable, tl.Name), tl.Annotations.IdempotentHint, tl.Name)
		require.Equal(t, false, *tl.Annotations.DestructiveHint, tl.Name)
		require.Equal(t, false, *tl.Annotations.OpenWorldHint, tl.Name)
	}
}

// A grouped begin through the tool declares its compensation as REST does:
// the unwind plan offers the declared undo.
func TestBeginToolDeclaresCompensation(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	g := env.Must(http.StatusCreated, "POST", "/api/v1/groups", ws.Key, map[string]any{"name": "checkout"}).JSON()["id"].(string)
	d, isErr := callJSON(t, cs, "ratchet_begin", map[string]any{"effect_type": "payment.charge",
		"idempotency_key": "charge-1", "group_id": g, "cost_micros": 500,
		"compensation": map[string]any{"effect_type": "payment.refund", "payload": map[string]any{"amount": 12345678901234567}}})
	require.False(t, isErr, "%v", d)
	r, isErr := callJSON(t, cs, "ratchet_report", map[string]any{"effect_id": d["effect_id"], "lease_token": d["lease_token"],
		"outcome": "succeeded"})
	require.False(t, isErr, "%v", r)
	u := env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", ws.Key, nil)
	require.Contains(t, string(u.Body), `"effect_type":"payment.refund"`)
	require.Contains(t, string(u.Body), `"amount":12345678901234567`, "the payload's numbers as written")
}

// A call the server never answers is the tool's failure with a code and
// whether it may have been applied, like the API's database_unavailable,
// not a protocol error with code 0 (QA).
func TestCallsWithoutAnAnswerSayWhetherTheyMayHaveBeenApplied(t *testing.T) {
	t.Parallel()
	hangUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		require.NoError(t, err)
		_ = conn.Close() // the request arrived; no answer comes back
	}))
	defer hangUp.Close()
	untrusted := httptest.NewTLSServer(http.NotFoundHandler()) // a certificate no client trusts
	defer untrusted.Close()
	for base, outcome := range map[string]string{
		"http://127.0.0.1:1": "not_applied", // nothing listens: no connection was made
		untrusted.URL:        "not_applied", // the handshake failed: nothing was sent
		hangUp.URL:           "unknown",
	} {
		cs := connect(t, mcpserver.New(mcpserver.HTTPCaller{BaseURL: base}, "Bearer rk_test"))
		body, isErr := callJSON(t, cs, "ratchet_begin", map[string]any{"effect_type": "email.send", "idempotency_key": "k"})
		require.True(t, isErr, base)
		e := body["error"].(map[string]any)
		require.Equal(t, mcpserver.CodeServerUnreachable, e["code"], base)
		require.Equal(t, map[string]any{"outcome": outcome}, e["detail"], base)
	}
}

// An answer that is not the API's (a proxy's error page, a gateway's
// timeout, a redirect, a web page at a wrong base URL, a JSON that is no
// answer of it) is the tool's failure with code server_unreachable and
// whether the call may have been applied, never relayed as the tool's
// success (MCP QA: a 200 HTML page was a ratchet_begin without isError and
// without a decision; a 502 page an error with no code or outcome).
func TestAnswersNotFromTheAPIAreUnreachable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status  int
		body    string
		outcome string
	}{
		{http.StatusOK, "<html>Welcome</html>", "unknown"},
		{http.StatusOK, `["not", "an", "answer"]`, "unknown"},
		{http.StatusOK, `{"decision": "execute"`, "unknown"}, // cut short
		{http.StatusBadGateway, "<html>502 Bad Gateway</html>", "unknown"},
		{http.StatusGatewayTimeout, "FUNCTION_INVOCATION_TIMEOUT", "unknown"},
		{http.StatusInternalServerError, `{"message": "upstream failed"}`, "unknown"},
		{http.StatusPermanentRedirect, "Redirecting...", "not_applied"},
		{http.StatusNotFound, "404 page not found", "not_applied"},
		{http.StatusRequestEntityTooLarge, "<html>413 Request Entity Too Large</html>", "not_applied"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c.status/100 == 3 {
				w.Header().Set("Location", "https://example.invalid/")
			}
			w.WriteHeader(c.status)
			_, _ = w.Write([]byte(c.body))
		}))
		cs := connect(t, mcpserver.New(mcpserver.HTTPCaller{BaseURL: srv.URL}, "Bearer rk_test"))
		body, isErr := callJSON(t, cs, "ratchet_begin", map[string]any{"effect_type": "email.send", "idempotency_key": "k"})
		srv.Close()
		require.True(t, isErr, "%d %s", c.status, c.body)
		e := body["error"].(map[string]any)
		require.Equal(t, mcpserver.CodeServerUnreachable, e["code"], c.body)
		require.Equal(t, map[string]any{"outcome": c.outcome, "status": float64(c.status)}, e["detail"], c.body)
		require.NotContains(t, e["message"], c.body)
	}
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
	ctx := context.Background()
	connectHTTP := func(key string) (*mcp.ClientSession, error) {
		return mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
			Endpoint: env.Server.URL + "/api/v1/mcp", HTTPClient: &http.Client{Transport: bearerTransport{key}},
		}, nil)
	}
	cs, err := connectHTTP(agent)
	require.NoError(t, err)
	body, isErr := callJSON(t, cs, "ratchet_begin", map[string]any{"effect_type": "email.send", "idempotency_key": "k-http"})
	require.False(t, isErr, "%v", body)
	require.Equal(t, "execute", body["decision"])
	require.NoError(t, cs.Close())

	// A key that cannot begin opens the endpoint, and the tool call answers
	// with the REST call's own refusal.
	reader := env.Key(ws, map[string]any{"name": "reader", "scopes": []string{"effects:read"}})
	cs, err = connectHTTP(reader)
	require.NoError(t, err)
	body, isErr = callJSON(t, cs, "ratchet_begin", map[string]any{"effect_type": "email.send", "idempotency_key": "k-ro"})
	require.True(t, isErr)
	require.Equal(t, "forbidden", body["error"].(map[string]any)["code"])
	require.NoError(t, cs.Close())

	// Without a valid key the endpoint itself is closed (API.md §0: every
	// route but signup, health and discovery needs one).
	for _, key := range []string{"", "rk_not_a_key"} {
		_, err := connectHTTP(key)
		require.Error(t, err, "key %q", key)
		r := env.Do("POST", "/api/v1/mcp", key, map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
		require.Equal(t, http.StatusUnauthorized, r.Status)
		require.Equal(t, "unauthorized", r.ErrorCode())
		require.Equal(t, `Bearer realm="ratchet"`, r.Header.Get("WWW-Authenticate"))
	}

	// It takes no query parameter, as every keyed route takes only its own
	// (QA: /api/v1/mcp?x=1 was served).
	r := env.Do("POST", "/api/v1/mcp?x=1", agent, map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
	require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
	require.Equal(t, "invalid_request", r.ErrorCode())
}

// The endpoint is stateless: no event stream (GET) and no session to end
// (DELETE), answered 405 in the API's envelope, which MCP clients read as
// "not offered".
func TestStreamableHTTPEndpointRefusesStreamsInTheEnvelope(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	for _, m := range []string{"GET", "DELETE"} {
		r := env.Do(m, "/api/v1/mcp", key, nil)
		require.Equal(t, http.StatusMethodNotAllowed, r.Status, m)
		require.Equal(t, "method_not_allowed", r.ErrorCode(), m)
		require.Equal(t, "POST", r.Header.Get("Allow"), m)
	}
	// Another method is no route; Allow names only the method that works.
	r := env.Do("PUT", "/api/v1/mcp", key, nil)
	require.Equal(t, http.StatusNotFound, r.Status)
	require.Equal(t, "POST", r.Header.Get("Allow"))
}

// A tool call counts once against the key's rate limit: the MCP request
// that carries it is not counted on top of the REST call it makes.
func TestToolCallsCountOnceAgainstTheRateLimit(t *testing.T) {
	t.Parallel()
	clock := apitest.NewClock(time.Now().Truncate(time.Minute)) // one rate window throughout
	env := apitest.Start(t, apitest.WithNow(clock.Now))
	ws := env.Signup()
	agent := env.Key(ws, map[string]any{"name": "agent", "preset": "AGENT", "rate_limit_per_minute": 4})
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: env.Server.URL + "/api/v1/mcp", HTTPClient: &http.Client{Transport: bearerTransport{agent}},
	}, nil)
	require.NoError(t, err)
	defer cs.Close()
	for i := range 4 {
		body, isErr := callJSON(t, cs, "ratchet_begin", map[string]any{"effect_type": "email.send",
			"idempotency_key": fmt.Sprintf("k-%d", i)})
		require.False(t, isErr, "call %d: %v", i, body)
	}
	body, isErr := callJSON(t, cs, "ratchet_begin", map[string]any{"effect_type": "email.send", "idempotency_key": "k-5"})
	require.True(t, isErr)
	require.Equal(t, "rate_limited", body["error"].(map[string]any)["code"])
}

// A tool's optional arguments are nullable in its schema, null meaning "not
// given", though the REST body they form refuses null where its field has
// no "not sent" (jsonstrict): the tool leaves them out.
func TestNullOptionalArgumentsAreNotGiven(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/wire.send", ws.Key, map[string]any{"approval_above_micros": 100})
	d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{"effect_type": "wire.send",
		"idempotency_key": "wire:1", "cost_micros": 500}).JSON()
	require.Equal(t, "approval_required", d["decision"])
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	res, isErr := callJSON(t, cs, "ratchet_decide_approval", map[string]any{"approval_id": d["approval_id"],
		"decision": "approve", "note": nil})
	require.False(t, isErr, "%v", res)
	require.Equal(t, "approved", res["state"])
	list, isErr := callJSON(t, cs, "ratchet_list_effects", map[string]any{"state": nil, "effect_type": nil, "cursor": nil})
	require.False(t, isErr, "%v", list)
	require.Len(t, list["data"], 1)

	// Dropping the nulls re-encodes the arguments: a repeated one beside a
	// null is refused as sent, not hidden by the re-encoding.
	res2, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ratchet_get_effect",
		Arguments: json.RawMessage(`{"effect_id":"eff_a","effect_id":"` + d["effect_id"].(string) + `","x":null}`)})
	require.NoError(t, err)
	require.True(t, res2.IsError)
	require.Contains(t, res2.Content[0].(*mcp.TextContent).Text, "repeated")
}

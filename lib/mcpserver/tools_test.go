package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/mcpserver"
	"github.com/getratchet/ratchet/lib/schematags"
)

// callRaw calls a tool with arguments exactly as written.
func callRaw(t *testing.T, cs *mcp.ClientSession, name, args string) (text string, isErr bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(args)})
	require.NoError(t, err)
	require.Len(t, res.Content, 1)
	return res.Content[0].(*mcp.TextContent).Text, res.IsError
}

// errorCode reads error.code exactly as spelt (a struct would also take
// "Code": encoding/json matches names case-insensitively).
func errorCode(t *testing.T, text string) string {
	t.Helper()
	var body map[string]map[string]any
	require.NoError(t, json.Unmarshal([]byte(text), &body), text)
	code, _ := body["error"]["code"].(string)
	return code
}

// Integers beyond float64's precision reach the API as written: the same
// begin through MCP and through REST is the same operation (one
// fingerprint), and the cost and result are stored as sent.
func TestToolsKeepNumbersAsWritten(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))

	begin := `{"effect_type":"tweet.post","idempotency_key":"tw1","cost_micros":9007199254740993,` +
		`"payload":{"reply_to":1234567890123456789}}`
	text, isErr := callRaw(t, cs, "ratchet_begin", begin)
	require.False(t, isErr, text)
	var d struct {
		Decision   string `json:"decision"`
		EffectID   string `json:"effect_id"`
		LeaseToken string `json:"lease_token"`
	}
	require.NoError(t, json.Unmarshal([]byte(text), &d))
	require.Equal(t, "execute", d.Decision)

	again := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, begin).JSON()
	require.Equal(t, "in_flight", again["decision"], "REST sees the same operation")

	text, isErr = callRaw(t, cs, "ratchet_report", `{"effect_id":"`+d.EffectID+`","lease_token":"`+d.LeaseToken+
		`","outcome":"succeeded","result":{"tweet_id":1234567890123456789}}`)
	require.False(t, isErr, text)
	stored := string(env.Must(http.StatusOK, "GET", "/api/v1/effects/"+d.EffectID, ws.Key, nil).Body)
	require.Contains(t, stored, `"cost_micros":9007199254740993`)
	require.Contains(t, stored, `"tweet_id":1234567890123456789`)
}

// decide_approval takes exactly "approve" or "reject": anything else is
// refused before any call (it once approved on "REJECT"), and ids that are
// path segments of their own ("..") name nothing.
func TestDecideApprovalTakesOnlyItsTwoWords(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/wire.send", ws.Key, map[string]any{"mode": "require_approval"})
	held := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		map[string]any{"effect_type": "wire.send", "idempotency_key": "w1"}).JSON()
	require.Equal(t, "approval_required", held["decision"])
	approval := held["approval_id"].(string)
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))

	for _, word := range []string{"REJECT", "deny", "", "approve/../reject", "sk_live_SECRETVALUE"} {
		text, isErr := callRaw(t, cs, "ratchet_decide_approval", `{"approval_id":"`+approval+`","decision":"`+word+`"}`)
		require.True(t, isErr, "%q: %s", word, text)
		require.Equal(t, "invalid_request", errorCode(t, text), word)
		// The argument is named, its value never repeated (review).
		require.Contains(t, text, `"field":"decision"`, word)
		if word != "" {
			require.NotContains(t, text, word)
		}
	}
	// Missing arguments are named one by one.
	text, isErr := callRaw(t, cs, "ratchet_decide_approval", `{}`)
	require.True(t, isErr, text)
	require.Contains(t, text, `"field":"approval_id"`)
	require.Contains(t, text, `"field":"decision"`)
	for _, id := range []string{".", ".."} {
		text, isErr := callRaw(t, cs, "ratchet_decide_approval", `{"approval_id":"`+id+`","decision":"approve"}`)
		require.True(t, isErr, "%q: %s", id, text)
		require.Equal(t, "not_found", errorCode(t, text), id)
		text, isErr = callRaw(t, cs, "ratchet_get_effect", `{"effect_id":"`+id+`"}`)
		require.True(t, isErr, "%q: %s", id, text)
	}
	approvals := func(state string) (ids []string) {
		for _, a := range env.Must(http.StatusOK, "GET", "/api/v1/approvals?state="+state, ws.Key, nil).JSON()["data"].([]any) {
			ids = append(ids, a.(map[string]any)["id"].(string))
		}
		return ids
	}
	require.Equal(t, []string{approval}, approvals("pending"), "nothing decided it")

	text, isErr = callRaw(t, cs, "ratchet_decide_approval", `{"approval_id":"`+approval+`","decision":"reject"}`)
	require.False(t, isErr, text)
	require.Equal(t, []string{approval}, approvals("rejected"))
}

// Arguments the schema refuses (a missing field, a wrong type, an unknown
// field) are answered like a bad REST body: invalid_request in the envelope.
func TestToolArgumentErrorsUseTheEnvelope(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	for _, args := range []string{
		`{"idempotency_key":"k"}`,
		`{"effect_type":7,"idempotency_key":"k"}`,
		`{"effect_type":"a","idempotency_key":"k","surprise":1}`,
		// A repeated key, as the REST route refuses it.
		`{"effect_type":"m.x","effect_type":"m.y","idempotency_key":"k"}`,
		`{"effect_type":"m.x","idempotency_key":"k","payload":{"a":[{"b":1,"b":2}]}}`,
		`{"effect_type":"m.x","idempotency_key":"k","payload":{"n":1e400}}`,
	} {
		text, isErr := callRaw(t, cs, "ratchet_begin", args)
		require.True(t, isErr, "%s: %s", args, text)
		require.Equal(t, "invalid_request", errorCode(t, text), args)
	}
	// The number is named for what it is, and its value is not echoed.
	text, _ := callRaw(t, cs, "ratchet_begin", `{"effect_type":"m.x","idempotency_key":"k","payload":{"n":1e400}}`)
	require.Contains(t, text, "beyond the range of a 64-bit float")
	require.NotContains(t, text, "1e400")
	// A mistyped argument is named and worded as the REST route names it,
	// never with its value (QA: field "arguments", the SDK's wording, the
	// value repeated).
	text, _ = callRaw(t, cs, "ratchet_begin", `{"effect_type":"m.x","idempotency_key":"k","lease_seconds":"1234567890123456"}`)
	rest := env.Do("POST", "/api/v1/effects/begin", ws.Key,
		map[string]any{"effect_type": "m.x", "idempotency_key": "k", "lease_seconds": "1234567890123456"})
	require.Equal(t, http.StatusBadRequest, rest.Status)
	require.Contains(t, text, `"field":"lease_seconds"`)
	require.Contains(t, text, "must be an integer")
	require.Contains(t, string(rest.Body), `"field":"lease_seconds"`)
	require.NotContains(t, text, "1234567890123456")
	require.Empty(t, env.Must(http.StatusOK, "GET", "/api/v1/effects", ws.Key, nil).JSON()["data"])
}

// An optional argument may be null, as an optional field of a REST body
// may (review: the schema refused "dimensions": null, which REST takes).
func TestToolArgumentsMayBeNullWhereOptional(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	text, isErr := callRaw(t, cs, "ratchet_begin", `{"effect_type":"m.null","idempotency_key":"kn",`+
		`"dimensions":null,"payload":null,"group_id":null,"lease_seconds":null}`)
	require.False(t, isErr, text)
	require.Contains(t, text, `"decision":"execute"`)
	rest := env.Do("POST", "/api/v1/effects/begin", ws.Key, map[string]any{"effect_type": "m.null",
		"idempotency_key": "kr", "dimensions": nil, "payload": nil, "group_id": nil, "lease_seconds": nil})
	require.Equal(t, http.StatusOK, rest.Status, "%s", rest.Body)

	// A required argument given null is refused as missing, as omitting it
	// is, the URL's arguments too (MCP QA: "has the wrong type").
	for _, c := range []struct{ tool, null, omitted string }{
		{"ratchet_get_effect", `{"effect_id":null}`, `{}`},
		{"ratchet_begin", `{"effect_type":null,"idempotency_key":"kq"}`, `{"idempotency_key":"kq"}`},
	} {
		text, isErr := callRaw(t, cs, c.tool, c.null)
		require.True(t, isErr, "%s %s: %s", c.tool, c.null, text)
		omitted, _ := callRaw(t, cs, c.tool, c.omitted)
		require.JSONEq(t, omitted, text, "%s %s", c.tool, c.null)
	}
	text, _ = callRaw(t, cs, "ratchet_get_effect", `{"effect_id":null}`)
	require.Contains(t, text, `"field":"effect_id","message":"is required"`)

	// Arguments themselves may be null where none is required (a REST body
	// may not be: it must be an object).
	text, isErr = callRaw(t, cs, "ratchet_list_effects", `null`)
	require.False(t, isErr, text)
	require.Contains(t, text, `"data":[`)
}

// The list tools page like the API: limit and cursor, and a limit out of
// range is the API's 400 rather than quietly ignored.
func TestListToolsPage(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/wire.send", ws.Key, map[string]any{"mode": "require_approval"})
	for _, k := range []string{"w1", "w2", "w3"} {
		env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, map[string]any{"effect_type": "wire.send", "idempotency_key": k})
	}
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	seen := map[string]bool{}
	cursor := ""
	for range 3 {
		text, isErr := callRaw(t, cs, "ratchet_list_approvals", `{"state":"pending","limit":1,"cursor":"`+cursor+`"}`)
		require.False(t, isErr, text)
		var page struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
			NextCursor *string `json:"next_cursor"`
		}
		require.NoError(t, json.Unmarshal([]byte(text), &page))
		require.Len(t, page.Data, 1)
		seen[page.Data[0].ID] = true
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	require.Len(t, seen, 3)
	for _, tool := range []string{"ratchet_list_approvals", "ratchet_list_effects"} {
		text, isErr := callRaw(t, cs, tool, `{"limit":0}`)
		require.True(t, isErr, "%s: %s", tool, text)
		require.Equal(t, "invalid_request", errorCode(t, text), tool)
	}
	// An empty filter would be dropped on its way to REST and answer every
	// row (MCP QA): refused, as an empty state is.
	for _, args := range []string{`{"effect_type":""}`, `{"state":""}`} {
		text, isErr := callRaw(t, cs, "ratchet_list_effects", args)
		require.True(t, isErr, "%s: %s", args, text)
		require.Equal(t, "invalid_request", errorCode(t, text), args)
	}
}

// A limit that is not an integer of the range is refused in REST's words
// for ?limit=, the same code, field and message: 1.5 was told "must be an
// integer" through MCP, "must be an integer from 1 to 200" through REST
// (QA), and 2^63 the range of Go's int.
func TestAListToolsLimitIsRefusedInRESTsWords(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	rest := env.Do("GET", "/api/v1/effects?limit=1.5", ws.Key, nil)
	require.Equal(t, http.StatusBadRequest, rest.Status)
	want := rest.JSON()["error"].(map[string]any)
	for _, limit := range []string{`1.5`, `"5"`, `9223372036854775808`, `201`, `0`} {
		for _, tool := range []string{"ratchet_list_effects", "ratchet_list_approvals"} {
			body, isErr := callRaw(t, cs, tool, `{"limit":`+limit+`}`)
			require.True(t, isErr, "%s %s: %s", tool, limit, body)
			var got map[string]map[string]any
			require.NoError(t, json.Unmarshal([]byte(body), &got))
			for _, k := range []string{"code", "message", "detail"} {
				require.Equal(t, want[k], got["error"][k], "%s %s: %s", tool, limit, k)
			}
		}
	}
}

// A result within the API's limit through REST is within it through MCP:
// each <, > and & of the arguments reaches the API as one byte, not as a
// six-byte escape (QA: a 44 KB result of '<' was refused payload_too_large,
// after the agent had acted).
func TestToolBodiesAreTheArgumentsSize(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))

	markup := strings.Repeat("<b>&amp;</b>", 100_000/12) // 100 KB, 600 KB escaped
	text, isErr := callRaw(t, cs, "ratchet_begin", `{"effect_type":"page.publish","idempotency_key":"p1",`+
		`"payload":{"html":"`+markup+`"}}`)
	require.False(t, isErr, "%.200s", text)
	var d struct {
		EffectID   string `json:"effect_id"`
		LeaseToken string `json:"lease_token"`
	}
	require.NoError(t, json.Unmarshal([]byte(text), &d))
	text, isErr = callRaw(t, cs, "ratchet_report", `{"effect_id":"`+d.EffectID+`","lease_token":"`+d.LeaseToken+
		`","outcome":"succeeded","result":{"html":"`+markup+`"}}`)
	require.False(t, isErr, "%.200s", text)
	got := env.Must(http.StatusOK, "GET", "/api/v1/effects/"+d.EffectID, ws.Key, nil).JSON()
	require.Equal(t, map[string]any{"html": markup}, got["result"], "stored as sent")
}

// A refusal is named from the schema's own path, never from the value it
// quotes (review: a value holding "validating /properties/…: required:
// missing properties: […]" named its own text as the field).
func TestSchemaRefusalsAreNotReadFromTheValue(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	text, isErr := callRaw(t, cs, "ratchet_begin",
		`{"effect_type":"x validating /properties/sk_live_SECRET: required: missing properties: [sk_live_OTHER]","idempotency_key":"k"}`)
	require.True(t, isErr, text)
	require.Equal(t, "invalid_request", errorCode(t, text))
	require.Contains(t, text, `"field":"effect_type"`)
	require.NotContains(t, text, "sk_live")
}

// Arguments the REST body takes are answered by the REST route, every
// problem of the call listed together as REST lists them (QA: the tool's
// schema named only the first); a path argument the schema refuses (an
// empty id would name another route) is the tool's own answer.
func TestBodyArgumentsAreRefusedAsRESTRefusesThem(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	args := map[string]any{"effect_type": "a b", "lease_seconds": 0}
	body, isErr := callJSON(t, cs, "ratchet_begin", args)
	require.True(t, isErr)
	rest := env.Do("POST", "/api/v1/effects/begin", ws.Key, args)
	require.Equal(t, http.StatusBadRequest, rest.Status)
	require.Equal(t, rest.JSON()["error"], body["error"])
	require.Len(t, body["error"].(map[string]any)["detail"].(map[string]any)["validation"], 3)

	// A URL argument the schema refuses is the tool's answer, whatever else
	// is wrong (review: a missing id beside a bad outcome reached "No such
	// route"; an empty state filter would have listed everything).
	for _, c := range []struct {
		tool string
		args map[string]any
		arg  string
	}{
		{"ratchet_report", map[string]any{"effect_id": "", "outcome": "nope", "lease_token": "t"}, "effect_id"},
		{"ratchet_report", map[string]any{"outcome": "nope", "lease_token": "t"}, "effect_id"},
		{"ratchet_heartbeat", map[string]any{"lease_token": ""}, "effect_id"},
		{"ratchet_resolve", map[string]any{"outcome": "maybe"}, "effect_id"},
		{"ratchet_list_effects", map[string]any{"state": ""}, "state"},
		{"ratchet_decide_approval", map[string]any{"approval_id": "apr_x", "decision": "REJECT", "note": 5}, "note"},
	} {
		for range 5 { // the schema library visits properties in map order
			body, isErr = callJSON(t, cs, c.tool, c.args)
			require.True(t, isErr, "%s %v", c.tool, c.args)
			e := body["error"].(map[string]any)
			require.Equal(t, "invalid_request", e["code"], "%s %v: %v", c.tool, c.args, e)
			var fields []string
			for _, v := range e["detail"].(map[string]any)["validation"].([]any) {
				fields = append(fields, v.(map[string]any)["field"].(string))
			}
			require.Contains(t, fields, c.arg, "%s %v", c.tool, c.args)
		}
	}
}

// A URL argument's value (a list's filters and limit, a policy's effect
// type) is refused by the REST route, in its words, every problem of the
// call listed together, as the same value sent through REST is (MCP review:
// the tool's schema answered "limit is below its minimum" and "state is not
// one of the allowed values", and named only the first of two bad filters).
func TestURLArgumentsAreRefusedAsRESTRefusesThem(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	for _, c := range []struct {
		tool string
		args map[string]any
		path string
	}{
		{"ratchet_list_effects", map[string]any{"limit": 0}, "/api/v1/effects?limit=0"},
		{"ratchet_list_effects", map[string]any{"limit": 201}, "/api/v1/effects?limit=201"},
		{"ratchet_list_effects", map[string]any{"state": "bogus"}, "/api/v1/effects?state=bogus"},
		{"ratchet_list_effects", map[string]any{"effect_type": "a b"}, "/api/v1/effects?effect_type=a+b"},
		{"ratchet_list_effects", map[string]any{"state": "bogus", "effect_type": "a b", "limit": -1},
			"/api/v1/effects?state=bogus&effect_type=a+b&limit=-1"},
		{"ratchet_list_approvals", map[string]any{"state": "bogus", "limit": 500}, "/api/v1/approvals?state=bogus&limit=500"},
		// A limit the decoder refuses is listed with the call's other
		// problems, as REST lists them (MCP review: it was answered alone).
		{"ratchet_list_effects", map[string]any{"state": "bogus", "limit": 1.5}, "/api/v1/effects?state=bogus&limit=1.5"},
		{"ratchet_list_approvals", map[string]any{"cursor": "zzz", "limit": "5"}, "/api/v1/approvals?cursor=zzz&limit=%225%22"},
		{"ratchet_get_policy", map[string]any{"effect_type": "a b"}, "/api/v1/policies/a%20b"},
		{"ratchet_get_policy", map[string]any{"effect_type": strings.Repeat("x", 101)}, "/api/v1/policies/" + strings.Repeat("x", 101)},
		// A dot segment is sent escaped: it would name no route.
		{"ratchet_get_policy", map[string]any{"effect_type": "."}, "/api/v1/policies/%2E"},
		{"ratchet_get_policy", map[string]any{"effect_type": ".."}, "/api/v1/policies/%2E%2E"},
	} {
		body, isErr := callJSON(t, cs, c.tool, c.args)
		require.True(t, isErr, "%s %v", c.tool, c.args)
		rest := env.Do("GET", c.path, ws.Key, nil)
		require.Equal(t, http.StatusBadRequest, rest.Status, "%s: %s", c.path, rest.Body)
		require.Equal(t, rest.JSON()["error"], body["error"], "%s %v", c.tool, c.args)
	}
}

// resolving is a workspace on a clock of its own, and an MCP client of it
// under its key.
func resolving(t *testing.T) (*apitest.Clock, *apitest.Env, apitest.Workspace, *mcp.ClientSession) {
	clock := apitest.NewClock(time.Now().UTC().Truncate(24 * time.Hour).Add(12 * time.Hour))
	env := apitest.Start(t, apitest.WithNow(clock.Now))
	ws := env.Signup()
	return clock, env, ws, connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
}

// ratchet_resolve passes attempt through: a resolve naming another attempt
// than the unknown one is refused, naming that one, and changes nothing;
// naming it, it is recorded (resolve QA: a retried resolve settled a later
// attempt).
func TestResolveToolSendsTheAttempt(t *testing.T) {
	t.Parallel()
	clock, env, ws, cs := resolving(t)
	eff := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		map[string]any{"effect_type": "m.x", "idempotency_key": "resolve-attempt"}).JSON()["effect_id"]
	clock.Add(2 * time.Minute)
	body, isErr := callJSON(t, cs, "ratchet_resolve", map[string]any{"effect_id": eff, "outcome": "failed", "attempt": 2})
	require.True(t, isErr, "%v", body)
	e := body["error"].(map[string]any)
	require.Equal(t, "invalid_state", e["code"])
	require.Equal(t, map[string]any{"state": "indeterminate", "unresolved_attempt": 1.0}, e["detail"])
	body, isErr = callJSON(t, cs, "ratchet_resolve", map[string]any{"effect_id": eff, "outcome": "failed", "attempt": 1})
	require.False(t, isErr, "%v", body)
	require.Equal(t, "failed", body["state"])
}

// ratchet_resolve is not marked idempotent: the same call without attempt,
// repeated once the key's next attempt has lapsed, settles that attempt
// too (here as failed, though it may have happened). A client that retries
// tools marked idempotentHint would have done so on its own after a lost
// answer (MCP review).
func TestARepeatedResolveWithoutAttemptSettlesALaterAttempt(t *testing.T) {
	t.Parallel()
	clock, env, ws, cs := resolving(t)
	begin := map[string]any{"effect_type": "m.x", "idempotency_key": "resolve-again"}
	eff := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, begin).JSON()["effect_id"]
	clock.Add(2 * time.Minute)
	resolve := map[string]any{"effect_id": eff, "outcome": "failed"}
	body, isErr := callJSON(t, cs, "ratchet_resolve", resolve)
	require.False(t, isErr, "%v", body)
	require.EqualValues(t, 1, body["attempt"])

	again := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, begin).JSON()
	require.Equal(t, "execute", again["decision"])
	require.EqualValues(t, 2, again["attempt"])
	clock.Add(2 * time.Minute)
	body, isErr = callJSON(t, cs, "ratchet_resolve", resolve)
	require.False(t, isErr, "%v", body)
	require.EqualValues(t, 2, body["attempt"], "the same call settled the later attempt")

	res, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	for _, tl := range res.Tools {
		if tl.Name == "ratchet_resolve" {
			require.False(t, tl.Annotations.IdempotentHint, "a repeat of it is not safe")
			require.Contains(t, tl.Description, "Send attempt")
			return
		}
	}
	t.Fatal("ratchet_resolve is not listed")
}

// An integer argument the decoder refuses (1.5, 1e0, 2^64) is refused in
// the words REST answers the same body field with, which name the bounds
// its openapi tag gives it: the tool answered "lease_seconds must be an
// integer" (and 2^64 "from -2^63 to 2^63-1") where REST answers "must be
// an integer from 1 to 2^63-1", since the decoder words a refusal from the
// tags of the type it decodes into, and the tool's input lacked them (MCP
// review). Every integer field a tool's input shares with its REST body
// carries the same bounds.
func TestAnIntegerArgumentIsRefusedInRESTsWords(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+ws.Key))
	eff := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		map[string]any{"effect_type": "m.x", "idempotency_key": "integer-words"}).JSON()["effect_id"].(string)
	for _, c := range []struct{ tool, args, path, body string }{
		{"ratchet_begin", `{"effect_type":"m.x","idempotency_key":"k","lease_seconds":1.5}`,
			"/api/v1/effects/begin", `{"effect_type":"m.x","idempotency_key":"k","lease_seconds":1.5}`},
		{"ratchet_begin", `{"effect_type":"m.x","idempotency_key":"k","lease_seconds":1e0}`,
			"/api/v1/effects/begin", `{"effect_type":"m.x","idempotency_key":"k","lease_seconds":1e0}`},
		{"ratchet_begin", `{"effect_type":"m.x","idempotency_key":"k","lease_seconds":18446744073709551616}`,
			"/api/v1/effects/begin", `{"effect_type":"m.x","idempotency_key":"k","lease_seconds":18446744073709551616}`},
		{"ratchet_resolve", `{"effect_id":"` + eff + `","outcome":"failed","attempt":1.5}`,
			"/api/v1/effects/" + eff + "/resolve", `{"outcome":"failed","attempt":1.5}`},
		{"ratchet_resolve", `{"effect_id":"` + eff + `","outcome":"failed","attempt":18446744073709551616}`,
			"/api/v1/effects/" + eff + "/resolve", `{"outcome":"failed","attempt":18446744073709551616}`},
	} {
		refusedAsREST(t, env, cs, ws.Key, c.tool, c.args, c.path, c.body, http.StatusBadRequest)
	}

	for _, pair := range [][2]reflect.Type{
		{reflect.TypeFor[mcpserver.BeginInput](), reflect.TypeFor[gate.BeginRequest]()},
		{reflect.TypeFor[mcpserver.CompensationInput](), reflect.TypeFor[gate.Compensation]()},
		{reflect.TypeFor[mcpserver.ReportInput](), reflect.TypeFor[gate.ReportRequest]()},
		{reflect.TypeFor[mcpserver.HeartbeatInput](), reflect.TypeFor[gate.HeartbeatRequest]()},
		{reflect.TypeFor[mcpserver.ResolveInput](), reflect.TypeFor[gate.ResolveRequest]()},
		{reflect.TypeFor[mcpserver.DecideInput](), reflect.TypeFor[gate.DecideRequest]()},
	} {
		tool, rest := pair[0], pair[1]
		for f := range rest.Fields() {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() < reflect.Int || ft.Kind() > reflect.Uint64 {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			i := slices.IndexFunc(reflect.VisibleFields(tool), func(g reflect.StructField) bool {
				n, _, _ := strings.Cut(g.Tag.Get("json"), ",")
				return n == name
			})
			require.GreaterOrEqual(t, i, 0, "%s.%s", tool, name)
			require.Equal(t, schematags.Rules(f), schematags.Rules(reflect.VisibleFields(tool)[i]), "%s.%s", tool, name)
		}
	}
}

// Arguments the tool refuses as REST refuses the body are answered as REST
// answers the same call, which checks the key's scopes (and an id's form)
// before it reads a body: a key without the route's scope is told
// forbidden with detail.required, not invalid_request (MCP review: an
// AGENT key sending a resolve's attempt "1" was told to fix the argument,
// then, fixed, that it may not resolve). Nothing acts.
func TestARefusedBodyIsAnsweredInRESTsOrder(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	agent := env.Key(ws, map[string]any{"name": "agent", "preset": "AGENT"})
	reader := env.Key(ws, map[string]any{"name": "reader", "scopes": []string{"effects:read"}})
	eff := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		map[string]any{"effect_type": "m.x", "idempotency_key": "refused-order"}).JSON()["effect_id"].(string)
	const approval = "apr_01m98xta8528fpczwrkkvckkbm"
	for _, c := range []struct {
		key, tool, args, path, body string
		status                      int
	}{
		{agent, "ratchet_resolve", `{"effect_id":"` + eff + `","outcome":"failed","attempt":"1"}`,
			"/api/v1/effects/" + eff + "/resolve", `{"outcome":"failed","attempt":"1"}`, http.StatusForbidden},
		{agent, "ratchet_decide_approval", `{"approval_id":"` + approval + `","decision":"approve","note":5}`,
			"/api/v1/approvals/" + approval + "/approve", `{"note":5}`, http.StatusForbidden},
		{reader, "ratchet_begin", `{"effect_type":"m.x","idempotency_key":"k","lease_seconds":"5"}`,
			"/api/v1/effects/begin", `{"effect_type":"m.x","idempotency_key":"k","lease_seconds":"5"}`, http.StatusForbidden},
		{agent, "ratchet_report", `{"effect_id":"eff_x","lease_token":5,"outcome":"failed"}`,
			"/api/v1/effects/eff_x/report", `{"lease_token":5,"outcome":"failed"}`, http.StatusNotFound},
		// A key that may call the route is told what REST tells it of the body.
		{agent, "ratchet_report", `{"effect_id":"` + eff + `","lease_token":5,"outcome":"failed","result":null}`,
			"/api/v1/effects/" + eff + "/report", `{"lease_token":5,"outcome":"failed"}`, http.StatusBadRequest},
	} {
		cs := connect(t, mcpserver.New(mcpserver.HandlerCaller{Handler: env.App.Server}, "Bearer "+c.key))
		refusedAsREST(t, env, cs, c.key, c.tool, c.args, c.path, c.body, c.status)
	}
	effects := env.Must(http.StatusOK, "GET", "/api/v1/effects", ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, effects, 1)
	require.Equal(t, "leased", effects[0].(map[string]any)["state"])
}

// refusedAsREST requires tool, called with args (as written) through cs,
// to be refused with the error POST path answers body under key, which
// answers status.
func refusedAsREST(t *testing.T, env *apitest.Env, cs *mcp.ClientSession, key, tool, args, path, body string, status int) {
	t.Helper()
	text, isErr := callRaw(t, cs, tool, args)
	require.True(t, isErr, "%s %s: %s", tool, args, text)
	rest := env.Do("POST", path, key, body)
	require.Equal(t, status, rest.Status, "%s: %s", path, rest.Body)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(text), &got))
	require.Equal(t, rest.JSON()["error"], got["error"], "%s %s", tool, args)
}

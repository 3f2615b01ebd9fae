package mcpserver_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/mcpserver"
)

// The endpoint answers JSON only, so a client that accepts JSON alone, or
// says nothing of what it accepts, is served (MCP QA: Accept:
// application/json was refused); one that takes no JSON is refused.
func TestAnyClientAcceptingJSONIsServed(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	ping := func(accept ...string) (int, string) {
		req, err := http.NewRequest("POST", env.Server.URL+"/api/v1/mcp",
			strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		for _, a := range accept {
			req.Header.Add("Accept", a)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, accept := range [][]string{nil, {"application/json"}, {"text/html", "application/json;q=0.9"},
		{"*/*"}, {"application/*"}, {"application/json, text/event-stream"}, {"*/*;q=0, application/json"},
		{"application/*;q=0, application/json;q=0.1"}, {"application/json;q=0", "application/json"}} {
		status, body := ping(accept...)
		require.Equal(t, http.StatusOK, status, "%q: %s", accept, body)
		require.JSONEq(t, `{"jsonrpc":"2.0","id":1,"result":{}}`, body, "%q", accept)
	}
	// A q of 0 says "not acceptable" (RFC 9110 12.4.2; QA: it was served
	// JSON as if it had said yes), and the most specific range that covers
	// JSON decides (RFC 9110 12.5.1: a */* beside application/json;q=0 was
	// read as yes).
	for _, accept := range []string{"text/event-stream", "text/html", "application/json;q=0, text/event-stream",
		"*/*; q=0", "application/json; Q=0.000", "application/json;q=0, */*", "application/*;q=0, */*;q=0.5",
		"*/*, application/json;q=0"} {
		status, body := ping(accept)
		require.Equal(t, http.StatusBadRequest, status, "%q: %s", accept, body)
		require.JSONEq(t, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: `+
			`Accept must allow application/json: every answer is JSON (no event stream is offered)"}}`, body, accept)
	}
}

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
		// A request's answer is a 200, as those of the methods not offered
		// (MCP QA: a client may take a 400 for a broken transport).
		{`{"jsonrpc":"2.0","id":"m7","method":"nope/nope"}`, -32601, "m7"},
		// Ids the answer could not carry back unchanged (MCP QA: answered
		// as -9223372036854775808 and 1).
		{`{"jsonrpc":"2.0","id":12345678901234567890,"method":"ping"}`, -32600, nil},
		{`{"jsonrpc":"2.0","id":1.5,"method":"ping"}`, -32600, nil},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2.5,"method":"ping"}]`, -32600, nil},
		// A string id with a lone surrogate (MCP QA: answered "\ufffd").
		{`{"jsonrpc":"2.0","id":"\ud800","method":"ping"}`, -32600, nil},
		// The envelope is checked as a REST body is (MCP QA): a member
		// named twice (the last one ran), text after the message (ignored),
		// a message that is no message (taken for a notification), a
		// string (a parse error), two requests of a batch under one id
		// (one answered, the other dropped), an initialize without its
		// protocol version or inside a batch.
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"ratchet_get_policy","name":"ratchet_begin"}}`, -32600, nil},
		{`{"jsonrpc":"2.0","id":7,"id":8,"method":"ping"}`, -32600, nil},
		{`{"jsonrpc":"2.0","id":7,"method":"ping"} junk`, -32700, nil},
		{`{"jsonrpc":"2.0","id":7,"method":"ping"}{"jsonrpc":"2.0","id":8,"method":"ping"}`, -32700, nil},
		{`{"jsonrpc":"2.0","id":1}`, -32600, nil},
		// A message that is a request and a response at once (a gateway
		// reading it as the response it also is passes it as such, while
		// the server ran it), or a response with a result and an error
		// (MCP QA: the first ran as a ping, or a tool call, the second was
		// taken, 202).
		{`{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}`, -32600, nil},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list","error":{"code":1,"message":"m"}}`, -32600, nil},
		{`{"jsonrpc":"2.0","method":"notifications/initialized","result":{}}`, -32600, nil},
		{`{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}}`, -32600, nil},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping","result":{}}]`, -32600, nil},
		{`"hello"`, -32600, nil},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`, -32600, nil},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":1.0,"method":"tools/list"}]`, -32600, nil},
		{`{"jsonrpc":"2.0","id":"i1","method":"initialize","params":{"capabilities":{}}}`, -32602, "i1"},
		// A tools/call without its params is Invalid params under its id,
		// as one with params of another type is (MCP QA: -32600 with HTTP
		// 400, or, given null, -32600 naming the SDK's handler).
		{`{"jsonrpc":"2.0","id":"c1","method":"tools/call"}`, -32602, "c1"},
		{`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":null}`, -32602, 4.0},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/call"}]`, -32600, nil},
		{`[{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{}}}]`, -32600, nil},
		// An empty batch is an Invalid Request (JSON-RPC 2.0, section 6),
		// not a batch of notifications (QA: answered 202, nothing).
		{`[]`, -32600, nil},
		{` [ ] `, -32600, nil},
	} {
		status, out := post("application/json", []byte(c.body))
		want := http.StatusBadRequest
		if c.id != nil && c.code != -32600 {
			want = http.StatusOK
		}
		require.Equal(t, want, status, c.body)
		require.Equal(t, "2.0", out["jsonrpc"], c.body)
		require.Equal(t, c.id, out["id"], c.body)
		require.Equal(t, c.code, out["error"].(map[string]any)["code"], "%s: %v", c.body, out)
	}
	big := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_begin","arguments":{"payload":"` +
		strings.Repeat("x", 1<<20) + `"}}}`)
	status, out := post("application/json", big)
	require.Equal(t, http.StatusRequestEntityTooLarge, status)
	require.Equal(t, "payload_too_large", out["error"].(map[string]any)["code"])
	// Refused whatever the body holds: notifications no one serves, alone
	// or in a batch, were answered 202 under any Content-Type (MCP QA).
	for _, body := range []string{`{"jsonrpc":"2.0","id":1,"method":"ping"}`, `{"jsonrpc":"2.0","method":"x/unknown"}`,
		`[{"jsonrpc":"2.0","method":"x/unknown"},{"jsonrpc":"2.0","method":"y/unknown"}]`} {
		for _, contentType := range []string{"text/plain", "", "application/json-seq", "application/jsonx"} {
			status, out = post(contentType, []byte(body))
			require.Equal(t, http.StatusBadRequest, status, "%q %s", contentType, body)
			require.Equal(t, "invalid_request", out["error"].(map[string]any)["code"], "%q %s", contentType, body)
		}
	}
	req := mcpRequest(t, env, key, `{"jsonrpc":"2.0","method":"x/unknown"}`)
	req.Header.Set("Content-Type", "Application/JSON; charset=utf-8")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusAccepted, res.StatusCode, "JSON in any spelling")
	// A well-formed message is answered as before.
	status, out = post("application/json", []byte(`{"jsonrpc":"2.0","id":2,"method":"ping"}`))
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.EqualValues(t, 2, out["id"])
	// initialize's params it cannot read are Invalid params, as every other
	// method's are (MCP QA: the SDK left them uncoded, answered -32600).
	for _, params := range []string{`{"protocolVersion":5,"capabilities":{},"clientInfo":{"name":"q","version":"1"}}`,
		`{"protocolVersion":"2025-06-18","capabilities":"x","clientInfo":{"name":"q","version":"1"}}`, `[1]`} {
		status, out = post("application/json", []byte(`{"jsonrpc":"2.0","id":3,"method":"initialize","params":`+params+`}`))
		require.EqualValues(t, -32602, out["error"].(map[string]any)["code"], "%s: %d %v", params, status, out)
		require.EqualValues(t, 3, out["id"])
	}
	status, out = post("application/json", []byte(`{"jsonrpc":"2.0","id":9007199254740991,"method":"ping"}`))
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.EqualValues(t, 9007199254740991, out["id"], "the largest id answered exactly")
}

// A message whose members the SDK cannot decode (a jsonrpc or method of
// another type, an error that is no error object) is refused in the words
// the stdio binary uses, under its id, whatever it holds: the transport's
// message named the SDK's Go types ("Go struct field
// jsonrpc2.wireDecode.jsonrpc of type string", MCP QA).
func TestAMessageTheSDKCannotDecodeIsRefusedInPlainWords(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	for _, body := range []string{`{"jsonrpc":2,"id":1,"method":"ping"}`, `{"jsonrpc":"2.0","id":1,"method":5}`,
		`{"jsonrpc":"1.0","id":1,"method":"ping"}`, `{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}}`,
		`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":5}}`, `{"jsonrpc":"2.0","id":1,"error":5}`,
		// The words of the value sent do not make it another error (MCP
		// QA: "unsupported" in the transport's quote of it was -32601).
		`{"jsonrpc":2,"id":1,"method":"unsupported"}`, `{"jsonrpc":"unsupported","id":1,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":1,"method":["not handled"]}`} {
		status, answer := postMCP(t, env, key, body)
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", body, answer)
		require.JSONEq(t, `{"jsonrpc":"2.0","id":1,"error":{"code":-32600,"message":`+
			strconv.Quote(mcpserver.NotAMessage)+`}}`, string(answer), body)
	}
}

// A JSON-RPC error names what is wrong, never the value sent: the
// transport's messages quoted the tool name, the method or the params whole
// (a payload's secrets included).
func TestTransportErrorsDoNotEchoValues(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	const secret = "sk_live_SECRET"
	for _, c := range []struct {
		body string
		code float64
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_begin","arguments":` +
			`{"payload":{"a":"` + secret + `"}},"_meta":"` + secret + `"}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"` + secret + `"}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + secret + `","arguments":{}}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"` + secret + `"}`, -32601},
		{`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"` + secret + `"},` +
			`{"jsonrpc":"2.0","id":2,"method":"ping"}]`, -32602},
		// Capabilities it does not advertise are methods it does not know.
		{`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///` + secret + `"}}`, -32601},
		{`{"jsonrpc":"2.0","id":1,"method":"resources/list"}`, -32601},
		{`{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"debug"}}`, -32601},
		// Not JSON: the parser's message quoted the rest of the input, unquoted (QA).
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_report","arguments":` +
			`{"lease_token":` + secret + `, "outcome":"succeeded"}}}`, -32700},
		// A single quote in a value closed the span the method's quote
		// opened, and what followed it came back (MCP review).
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":5,"x":"it's ` + secret + `"}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_get_policy","arguments":` +
			`{"effect_type":"it's"},"_meta":"it's ` + secret + `"}}`, -32602},
		{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",` +
			`"clientInfo":{"name":5,"version":"it's ` + secret + `"}}}`, -32602},
	} {
		_, body := postMCP(t, env, key, c.body)
		require.NotContains(t, string(body), secret, c.body)
		var out any
		require.NoError(t, json.Unmarshal(body, &out), "%s", body)
		first, _ := out.(map[string]any)
		if batch, ok := out.([]any); ok { // answered in any order
			require.Len(t, batch, 2, "%s", body)
			a, b := batch[0].(map[string]any), batch[1].(map[string]any)
			if a["error"] == nil {
				a, b = b, a
			}
			first = a
			require.Contains(t, b, "result", "the batch's other answer is untouched")
		}
		e := first["error"].(map[string]any)
		require.Equal(t, c.code, e["code"], "%s", body)
		require.NotEmpty(t, e["message"], "%s", body)
		// Nor the SDK's Go types ("into a *mcp.CallToolParamsRaw").
		require.NotContains(t, e["message"], "Go ", "%s", body)
		require.NotContains(t, e["message"], "mcp.", "%s", body)
	}
}

// rpcAnswer is a JSON-RPC error answer, as the tests read it.
type rpcAnswer struct {
	ID    any `json:"id"`
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// An id that is neither a string nor a number (true, an object, an array)
// is refused as any id the answer cannot carry is, saying what an id may
// be: the SDK's refusal named the Go type it had read ("invalid ID type
// map[string]interface {}", MCP review).
func TestAnIDOfAnotherTypeIsRefusedSayingWhatAnIDIs(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	for _, id := range []string{`true`, `false`, `{}`, `{"a":1}`, `[1]`} {
		status, body := postMCP(t, env, key, `{"jsonrpc":"2.0","id":`+id+`,"method":"ping"}`)
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", id, body)
		var out rpcAnswer
		require.NoError(t, json.Unmarshal(body, &out), "%s", body)
		require.Nil(t, out.ID, id)
		require.Equal(t, -32600, out.Error.Code, id)
		require.Equal(t, mcpserver.BadIDMessage, out.Error.Message, id)
	}
}

// Behind a reverse proxy or a tunnel on the same host, a request reaches
// a loopback address under the public Host; MCP answers it as REST does.
func TestEndpointAnswersUnderAnyHost(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	req := mcpRequest(t, env, key, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	req.Host = "ratchet.example.com"
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
}

// A request whose MCP-Protocol-Version header names a version the server
// does not support is refused -32600 under its id, and the message names
// the header (MCP QA: it read "Unsupported protocol version", as if the
// initialize's protocolVersion were wrong) and the versions supported.
func TestAnUnsupportedProtocolHeaderIsNamed(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	req := mcpRequest(t, env, key, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	req.Header.Set("MCP-Protocol-Version", "1999-01-01")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	var out rpcAnswer
	require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
	require.EqualValues(t, 1, out.ID)
	require.Equal(t, -32600, out.Error.Code)
	require.Contains(t, out.Error.Message, "MCP-Protocol-Version header")
	require.Contains(t, out.Error.Message, "2025-06-18", "the versions supported")
	require.NotContains(t, out.Error.Message, "1999-01-01", "never the value sent")
}

// A version later than the last the server supports is read as a request
// of the 2026-07-28 kind, as README says: -32022 with the versions supported
// (and not the one asked for) when params._meta names it as the header
// does, the negotiation a later client falls back by; -32602 for the
// missing _meta when it names none.
func TestALaterProtocolVersionIsAnsweredWithTheVersionsSupported(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	const meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2099-01-01",` +
		`"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"}}`
	header := http.Header{"Accept": {"application/json, text/event-stream"}, "Mcp-Protocol-Version": {"2099-01-01"},
		"Mcp-Method": {"tools/list"}}
	res := env.DoWith("POST", "/api/v1/mcp", key, header, `{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{`+meta+`}}`)
	require.Equal(t, http.StatusBadRequest, res.Status, "%s", res.Body)
	var out struct {
		ID    any `json:"id"`
		Error struct {
			Code int `json:"code"`
			Data struct {
				Supported []string `json:"supported"`
			} `json:"data"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(res.Body, &out), "%s", res.Body)
	require.EqualValues(t, 5, out.ID)
	require.Equal(t, -32022, out.Error.Code)
	require.Contains(t, out.Error.Data.Supported, "2026-07-28")
	require.Contains(t, out.Error.Data.Supported, "2025-06-18")
	require.NotContains(t, string(res.Body), "2099")

	res = env.DoWith("POST", "/api/v1/mcp", key, header, `{"jsonrpc":"2.0","id":6,"method":"tools/list"}`)
	require.Equal(t, http.StatusBadRequest, res.Status, "%s", res.Body)
	var bare rpcAnswer
	require.NoError(t, json.Unmarshal(res.Body, &bare), "%s", res.Body)
	require.EqualValues(t, 6, bare.ID)
	require.Equal(t, -32602, bare.Error.Code)
	require.Contains(t, bare.Error.Message, "_meta")
}

// MCP's transport must validate Origin against DNS rebinding (MCP QA: any
// was served). A browser's request from a page of another origin is refused
// 403 and not run; a same-origin page's, one through a proxy that rewrote
// Host (the browser says same-origin), and a client sending neither header
// are served.
func TestEndpointRefusesABrowsersCrossOriginRequest(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	begin := func(idemKey string, headers map[string]string) (int, []byte) {
		req := mcpRequest(t, env, key, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_begin",`+
			`"arguments":{"effect_type":"email.send","idempotency_key":"`+idemKey+`"}}}`)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		if h, ok := headers["Host"]; ok {
			req.Host = h
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		out, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, out
	}
	host := strings.TrimPrefix(env.Server.URL, "http://")
	for i, h := range []map[string]string{
		{"Origin": "http://evil.example"},
		{"Origin": "http://evil.example", "Host": "evil.example:80", "Sec-Fetch-Site": "cross-site"},
		{"Origin": "http://" + host, "Sec-Fetch-Site": "same-site"},
	} {
		status, out := begin(fmt.Sprint("refused-", i), h)
		require.Equal(t, http.StatusForbidden, status, "%v: %s", h, out)
		var e struct {
			Error struct {
				Code   string         `json:"code"`
				Detail map[string]any `json:"detail"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(out, &e), "%s", out)
		require.Equal(t, "forbidden", e.Error.Code)
		require.Equal(t, "cross_origin", e.Error.Detail["reason"])
		// Not run: the same key begun from a server executes.
		status, out = begin(fmt.Sprint("refused-", i), nil)
		require.Equal(t, http.StatusOK, status, "%s", out)
		require.Contains(t, string(out), `\"decision\":\"execute\"`, "%s", out)
	}
	for i, h := range []map[string]string{
		nil,
		{"Origin": "http://" + host},
		{"Origin": "https://ratchet.example.com", "Host": "ratchet.example.com", "Sec-Fetch-Site": "same-origin"},
		{"Origin": "https://ratchet.example.com", "Sec-Fetch-Site": "same-origin"}, // Host rewritten by a proxy
	} {
		status, out := begin(fmt.Sprint("served-", i), h)
		require.Equal(t, http.StatusOK, status, "%v: %s", h, out)
		require.Contains(t, string(out), `\"decision\":\"execute\"`, "%s", out)
	}
}

// A batch (before protocol 2025-06-18) holding a method the server does not
// serve answers it -32601 under its id, as a single request is answered,
// and runs and answers the others (MCP QA: the transport refused the whole
// batch, 400 with id null, the begin in it never run); a notification of an
// unknown method has no answer, and a batch of nothing else is a 202.
func TestABatchAnswersAnUnknownMethodInItsPlace(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	post := func(body string) (int, []byte) { return postMCP(t, env, key, body) }
	status, out := post(`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":"u","method":"foo/bar","params":{"x":1}},` +
		`{"jsonrpc":"2.0","method":"notifications/whatever"},{"jsonrpc":"2.0","id":3,"method":"resources/list"}]`)
	require.Equal(t, http.StatusOK, status, "%s", out)
	var answers []map[string]any
	require.NoError(t, json.Unmarshal(out, &answers), "%s", out)
	byID := map[string]map[string]any{}
	for _, a := range answers {
		byID[fmt.Sprint(a["id"])] = a
	}
	require.Len(t, byID, 3, "%s", out)
	require.Contains(t, byID["1"], "result", "the ping ran")
	for _, id := range []string{"u", "3"} {
		require.EqualValues(t, -32601, byID[id]["error"].(map[string]any)["code"], "%s: %s", id, out)
	}

	// Alone or in a batch of nothing else, such a notification is a 202
	// (alone, it was refused 400).
	for _, body := range []string{`[{"jsonrpc":"2.0","method":"notifications/whatever"}]`,
		`{"jsonrpc":"2.0","method":"notifications/whatever"}`, `{"jsonrpc":"2.0","method":"foo/bar","params":{}}`} {
		status, out = post(body)
		require.Equal(t, http.StatusAccepted, status, "%s: %s", body, out)
		require.Empty(t, out, body)
	}
	// A request of it alone is answered -32601 under its id, as before.
	status, out = post(`{"jsonrpc":"2.0","id":9,"method":"foo/bar"}`)
	require.Equal(t, http.StatusOK, status, "%s", out)
	require.Contains(t, string(out), `"code":-32601`)
}

// A batch holds at most mcpserver.MaxBatch messages: one more is refused
// whole (-32600, id null, HTTP 400), none of its calls run (edge QA: a
// 1 MiB batch held 8 000 calls, and 1 500 list calls were answered 57 MB,
// beyond what the platforms deliver, after acting); MaxBatch are served.
func TestABatchHoldsAtMostMaxBatchMessages(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	key := env.Key(ws, map[string]any{"name": "agent", "preset": "AGENT"})
	batch := func(n int, prefix string) string {
		calls := make([]string, n)
		for i := range calls {
			calls[i] = fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"ratchet_begin",`+
				`"arguments":{"effect_type":"email.send","idempotency_key":"%s-%d"}}}`, i, prefix, i)
		}
		return "[" + strings.Join(calls, ",") + "]"
	}
	status, out := postMCP(t, env, key, batch(mcpserver.MaxBatch+1, "over"))
	require.Equal(t, http.StatusBadRequest, status, "%.300s", out)
	var refusal map[string]any
	require.NoError(t, json.Unmarshal(out, &refusal), "%s", out)
	require.Nil(t, refusal["id"])
	require.EqualValues(t, -32600, refusal["error"].(map[string]any)["code"], "%.300s", out)
	effects := env.Must(http.StatusOK, "GET", "/api/v1/effects", ws.Key, nil).JSON()
	require.Empty(t, effects["data"], "no call of the refused batch ran")

	status, out = postMCP(t, env, key, batch(mcpserver.MaxBatch, "at"))
	require.Equal(t, http.StatusOK, status, "%.300s", out)
	var answers []map[string]any
	require.NoError(t, json.Unmarshal(out, &answers), "%.300s", out)
	require.Len(t, answers, mcpserver.MaxBatch)
}

// mcpRequest is a POST of body to the MCP endpoint under key, with the
// headers a client sends.
func mcpRequest(t *testing.T, env *apitest.Env, key, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("POST", env.Server.URL+"/api/v1/mcp", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	return req
}

// postMCP posts body to the MCP endpoint under key, as a client does, and
// answers the status and the body.
func postMCP(t *testing.T, env *apitest.Env, key, body string) (int, []byte) {
	t.Helper()
	res, err := http.DefaultClient.Do(mcpRequest(t, env, key, body))
	require.NoError(t, err)
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, out
}

// A client of protocol 2026-07-28, which has no initialize (each request
// carries its version, capabilities and client in _meta, and its method in
// the Mcp-Method header), lists and calls the tools through the endpoint's
// own checks as an earlier client does (MCP QA took its refusal without the
// _meta for a version the server claims but does not serve).
func TestAStatelessProtocolClientCallsTheTools(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	const meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"}}`
	send := func(method, name, body string) map[string]any {
		t.Helper()
		req := mcpRequest(t, env, key, body)
		req.Header.Set("MCP-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", method)
		if name != "" {
			req.Header.Set("Mcp-Name", name)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
		require.Equal(t, http.StatusOK, res.StatusCode, "%v", out)
		require.Nil(t, out["error"], "%v", out)
		return out["result"].(map[string]any)
	}
	tools := send("tools/list", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{`+meta+`}}`)["tools"].([]any)
	require.Len(t, tools, 9)
	called := send("tools/call", "ratchet_begin", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ratchet_begin",`+
		`"arguments":{"effect_type":"email.send","idempotency_key":"stateless:1","payload":{}},`+meta+`}}`)
	require.Contains(t, called["content"].([]any)[0].(map[string]any)["text"], `"decision":"execute"`)

	// As README says: under 2026-07-28 a method not served, and ping,
	// which that version dropped, are -32601 with HTTP 404, which the
	// OpenAPI document says too (env.DoWith checks the answer against it).
	for _, method := range []string{"resources/list", "ping", "x/unknown"} {
		res := env.DoWith("POST", "/api/v1/mcp", key, http.Header{"Accept": {"application/json, text/event-stream"},
			"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {method}},
			`{"jsonrpc":"2.0","id":3,"method":"`+method+`","params":{`+meta+`}}`)
		var out rpcAnswer
		require.NoError(t, json.Unmarshal(res.Body, &out), "%s", res.Body)
		require.Equal(t, http.StatusNotFound, res.Status, method)
		require.Equal(t, -32601, out.Error.Code, method)
		require.EqualValues(t, 3, out.ID, method)
	}
}

// An answer nests at most MaxAnswerNesting levels, as a request body does:
// one holding a result the gate took through REST 9 999 levels deep as
// structured content, two levels further down, could not be written, and
// the call went unanswered (QA: it hung until the client gave up). It is
// answered with the REST answer as text alone; a shallower one keeps its
// structured content.
func TestAnAnswerTooDeepForStructuredContentComesAsText(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	client := &http.Client{Timeout: 20 * time.Second}
	for i, levels := range []int{9997, 9998, 9999} {
		result := strings.Repeat("[", levels) + strings.Repeat("]", levels)
		begun := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
			fmt.Sprintf(`{"effect_type":"deep.write","idempotency_key":"deep:%d","payload":{}}`, levels)).JSON()
		env.Must(http.StatusOK, "POST", "/api/v1/effects/"+begun["effect_id"].(string)+"/report", ws.Key,
			fmt.Sprintf(`{"lease_token":%q,"outcome":"succeeded","result":%s}`, begun["lease_token"], result))
		rest := env.Must(http.StatusOK, "GET", "/api/v1/effects/"+begun["effect_id"].(string), ws.Key, nil).Body
		res, err := client.Do(mcpRequest(t, env, ws.Key, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call",`+
			`"params":{"name":"ratchet_get_effect","arguments":{"effect_id":%q}}}`, i+1, begun["effect_id"])))
		require.NoError(t, err, "%d levels: the call must be answered", levels)
		out, err := io.ReadAll(res.Body)
		res.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode, "%.300s", out)
		// Read as a client with encoding/json reads it: within its limit.
		var answer struct {
			Result struct {
				Content           []struct{ Text string } `json:"content"`
				StructuredContent json.RawMessage         `json:"structuredContent"`
				IsError           bool                    `json:"isError"`
			} `json:"result"`
		}
		require.NoError(t, json.Unmarshal(out, &answer), "%d levels", levels)
		require.False(t, answer.Result.IsError)
		require.Len(t, answer.Result.Content, 1)
		require.JSONEq(t, string(rest), answer.Result.Content[0].Text)
		require.Equal(t, levels == 9997, answer.Result.StructuredContent != nil, "%d levels", levels)
	}
}

// The OpenAPI document says what the endpoint takes and answers: one
// message or a batch, each answered in its place (QA: it showed one message
// alone, and a batch's answer, an array, did not match it).
func TestTheOpenAPIDocumentTakesAndAnswersABatch(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	batch := `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/call",` +
		`"params":{"name":"ratchet_get_policy","arguments":{"effect_type":"email.send"}}},` +
		`{"jsonrpc":"2.0","method":"notifications/initialized"}]`
	apitest.CheckRequestBody(t, "POST", "/api/v1/mcp", []byte(batch))
	apitest.CheckRequestBody(t, "POST", "/api/v1/mcp", []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	res := env.DoWith("POST", "/api/v1/mcp", key, http.Header{"Accept": {"application/json, text/event-stream"}}, batch)
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	require.Len(t, rpcAnswers(t, res.Body), 2)
}

// Two requests of a batch under ids that the SDK reads as one (0 and -0,
// as 1 and 1.0) are refused whole, none run: the SDK ran one and dropped
// the other, neither run nor answered (MCP QA).
func TestABatchNamingOneIDTwiceRunsNothing(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	begin := func(id, key string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"ratchet_begin",` +
			`"arguments":{"effect_type":"email.send","idempotency_key":"` + key + `"}}}`
	}
	for _, ids := range [][2]string{{"0", "-0"}, {"-0", "0.0"}, {"0e3", "-0.0e-2"}, {"1", "1.0"}} {
		status, out := postMCP(t, env, ws.Key, "["+begin(ids[0], "a:"+ids[0])+","+begin(ids[1], "b:"+ids[1])+"]")
		require.Equal(t, http.StatusBadRequest, status, "%v: %s", ids, out)
		require.JSONEq(t, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,`+
			`"message":"Invalid Request: a batch names each request's id once"}}`, string(out), "%v", ids)
	}
	list := env.Must(http.StatusOK, "GET", "/api/v1/effects", ws.Key, nil).JSON()
	require.Empty(t, list["data"], "no begin ran")
}

// The OpenAPI document takes what the endpoint takes: a client's JSON-RPC
// response (a result or an error under an id, answered 202 with no body),
// alone or in a batch with requests and notifications (QA: the message
// schema required method, so a response matched none of it).
func TestTheOpenAPIDocumentTakesAClientsResponse(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	accept := http.Header{"Accept": {"application/json, text/event-stream"}}
	for _, response := range []string{
		`{"jsonrpc":"2.0","id":"s-1","result":{}}`,
		`{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"Method not found"}}`,
	} {
		apitest.CheckRequestBody(t, "POST", "/api/v1/mcp", []byte(response))
		res := env.DoWith("POST", "/api/v1/mcp", key, accept, response)
		require.Equal(t, http.StatusAccepted, res.Status, "%s", res.Body)
		require.Empty(t, res.Body)
		batch := `[` + response + `,{"jsonrpc":"2.0","id":1,"method":"ping"},` +
			`{"jsonrpc":"2.0","method":"notifications/initialized"}]`
		apitest.CheckRequestBody(t, "POST", "/api/v1/mcp", []byte(batch))
		res = env.DoWith("POST", "/api/v1/mcp", key, accept, batch)
		require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
		require.Len(t, rpcAnswers(t, res.Body), 1)
	}
	// A message of none of them, or of two, is refused (-32600), and the
	// document says so too.
	for _, refusedBody := range []string{`{"jsonrpc":"2.0","id":1}`, `{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}`,
		`{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"m"}}`} {
		refused := &failures{TB: t}
		apitest.CheckRequestBody(refused, "POST", "/api/v1/mcp", []byte(refusedBody))
		require.True(t, refused.failed, "the document takes %s", refusedBody)
		res := env.DoWith("POST", "/api/v1/mcp", key, accept, refusedBody)
		require.Equal(t, http.StatusBadRequest, res.Status, "%s", res.Body)
	}
}

// failures records a check's failure instead of failing the test.
type failures struct {
	testing.TB
	failed bool
}

func (f *failures) Errorf(string, ...any) { f.failed = true }

// A request without an id (none, or null) is refused by the endpoint's
// transport with MissingIDMessage, which the stdio binary answers such a
// line with (MCP review: over stdio it went unanswered); a notification of
// a method no one serves is not a request.
func TestARequestWithoutAnIDIsRefusedAsMissingID(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	key := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	for method, body := range map[string]string{
		"ping":           `{"jsonrpc":"2.0","method":"ping"}`,
		"tools/call":     `{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"ratchet_begin","arguments":{}}}`,
		"tools/list":     `{"jsonrpc":"2.0","id":null,"method":"tools/list"}`,
		"resources/list": `{"jsonrpc":"2.0","id":null,"method":"resources/list"}`,
	} {
		require.True(t, mcpserver.NeedsID(method), method)
		status, out := postMCP(t, env, key, body)
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", body, out)
		require.JSONEq(t, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":`+
			strconv.Quote(mcpserver.MissingIDMessage(method))+`}}`, string(out), body)
	}
	for _, method := range []string{"notifications/initialized", "notifications/cancelled", "x/unknown"} {
		require.False(t, mcpserver.NeedsID(method), method)
	}
}

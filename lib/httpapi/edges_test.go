package httpapi_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/toolname"
)

// A query of more parameters than net/url reads (10 000) is refused at
// "query", as one it cannot decode is: URL.Query answers such a query
// empty, so its filter was left out and its unknown names unseen (edge QA:
// ?state=bogus with 10 000 more parameters listed every effect, and a begin
// sent with them acted). The refused begin changed nothing.
func TestAQueryBeyondWhatGoReadsIsRefused(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	junk := strings.Repeat("&x=1", 10000)
	require.Equal(t, []string{"query"}, validationFields(t, env.Do("GET", "/api/v1/effects?state=bogus"+junk, ws.Key, nil)))
	require.Equal(t, []string{"query"}, validationFields(t, env.Do("GET", "/api/v1/effects?limit=1"+strings.Repeat("&", 10000), ws.Key, nil)))
	begin := map[string]any{"effect_type": "email.send", "idempotency_key": "k1"}
	require.Equal(t, []string{"query"}, validationFields(t, env.Do("POST", "/api/v1/effects/begin?x=1"+junk, ws.Key, begin)))
	list := env.Must(http.StatusOK, "GET", "/api/v1/effects", ws.Key, nil).JSON()
	require.Empty(t, list["data"], "the refused begin began nothing")
	// The MCP endpoint reads its query through the same check.
	r := env.DoWith("POST", "/api/v1/mcp?x=1"+junk, ws.Key, http.Header{"Accept": {"application/json"}},
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	require.Equal(t, []string{"query"}, validationFields(t, r))
	// Up to the limit, each parameter is read (these are unknown, and the
	// state is named with them).
	fields := validationFields(t, env.Do("GET", "/api/v1/effects?state=bogus"+strings.Repeat("&x=1", 9999), ws.Key, nil))
	require.Equal(t, []string{"state", "x"}, fields)
}

// A refusal lists at most apierr.MaxProblems problems, the first found,
// whatever the request holds (edge QA: 5 000 malformed tools were answered
// with 5 000 problems, 800 KB; 9 999 unknown query parameters with 700 KB).
func TestARefusalListsAtMostTwentyProblems(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	many := func(format string) []string {
		out := make([]string, 500)
		for i := range out {
			out[i] = fmt.Sprintf(format, i)
		}
		return out
	}
	var query strings.Builder
	for i := range 500 {
		fmt.Fprintf(&query, "&p%03d=1", i)
	}
	tools := make([]map[string]any, 500)
	for i := range tools {
		tools[i] = map[string]any{"name": fmt.Sprintf("bad name %d", i), "version": ""}
	}
	dims := map[string]any{}
	for _, d := range many("bad dim %03d") {
		dims[d] = ""
	}
	for name, r := range map[string]*apitest.Response{
		"key tools":  env.Do("POST", "/api/v1/keys", ws.Key, map[string]any{"name": "k", "preset": "AGENT", "tools": many("bad tool %d")}),
		"key scopes": env.Do("POST", "/api/v1/keys", ws.Key, map[string]any{"name": "k", "scopes": many("nope:%d")}),
		"policy":     env.Do("PUT", "/api/v1/policies/email.send", ws.Key, map[string]any{"required_dimensions": many("bad dim %d")}),
		"begin":      env.Do("POST", "/api/v1/effects/begin", ws.Key, map[string]any{"effect_type": "email.send", "idempotency_key": "k", "dimensions": dims}),
		"register":   env.Do("POST", "/api/v1/workers/register", ws.Key, map[string]any{"tools": tools}),
		"query":      env.Do("GET", "/api/v1/effects?limit=1"+query.String(), ws.Key, nil),
	} {
		fields := validationFields(t, r)
		require.Len(t, fields, apierr.MaxProblems, name)
	}
	// The first found, in order: the query's unknown names are sorted.
	fields := validationFields(t, env.Do("GET", "/api/v1/effects?limit=1"+query.String(), ws.Key, nil))
	require.Equal(t, "p000", fields[0])
	require.Equal(t, "p019", fields[apierr.MaxProblems-1])
}

// A body whose Content-Length is over the limit is refused 413 before any
// of it is read, on a route and on the MCP endpoint (edge QA: a declared
// 100 GB was waited on, then answered 408 on a route and, after a minute,
// 400 "could not be read" on the MCP endpoint; the test server has no read
// timeout, so there it was never answered). The connection closes after
// the answer, at once: what was sent of the body is never read as a request
// of its own, nor waited on.
func TestABodyDeclaredOverTheLimitIsRefusedUnread(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	inside := fmt.Sprintf("POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
		"Content-Length: 16\r\n\r\n{\"name\":\"smugl\"}", ws.Key)
	for _, path := range []string{"/api/v1/runs", "/api/v1/mcp"} {
		conn, err := net.Dial("tcp", env.Server.Listener.Addr().String())
		require.NoError(t, err)
		// A bound on the wait, so that a server that waits for the body
		// fails the test rather than hanging it.
		require.NoError(t, conn.SetDeadline(time.Now().Add(time.Minute)))
		_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
			"Accept: application/json\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			path, ws.Key, 100<<30, inside)
		require.NoError(t, err)
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, path)
		require.Equal(t, http.StatusRequestEntityTooLarge, res.StatusCode, path)
		var body struct {
			Error struct {
				Code   string         `json:"code"`
				Detail map[string]any `json:"detail"`
			} `json:"error"`
		}
		require.NoError(t, json.NewDecoder(res.Body).Decode(&body), path)
		require.Equal(t, apierr.CodePayloadTooLarge, body.Error.Code, path)
		require.EqualValues(t, httpapi.MaxBodyBytes, body.Error.Detail["limit_bytes"], path)
		require.NotEmpty(t, res.Header.Get(httpapi.RequestIDHeader), path)
		require.True(t, res.Close, "%s: answered with Connection: close", path)
		_ = res.Body.Close()
		_, err = io.Copy(io.Discard, conn) // until the server closes it
		require.NoError(t, err, path)
		_ = conn.Close()
	}
	runs := env.Must(http.StatusOK, "GET", "/api/v1/runs", ws.Key, nil).JSON()
	require.Empty(t, runs["data"], "nothing was created")
}

// A key's tools list names at most toolname.MaxPairs pairs, as one worker
// registers at most (edge QA: a key of 60 000 pairs was accepted, answered
// 650 KB on every read of it, and a key like it minted by it took 3 s); the
// OpenAPI document says so for both.
func TestAKeyListsAtMostMaxPairsTools(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	tools := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("tool_%d@1", i)
		}
		return out
	}
	before := env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil).Body
	over := env.Do("POST", "/api/v1/keys", ws.Key, map[string]any{"name": "w", "preset": "WORKER", "tools": tools(toolname.MaxPairs + 1)})
	require.Equal(t, []string{"tools"}, validationFields(t, over))
	require.JSONEq(t, string(before), string(env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil).Body), "nothing minted")
	env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, map[string]any{"name": "w", "preset": "WORKER", "tools": tools(toolname.MaxPairs)})

	doc := env.Must(http.StatusOK, "GET", "/api/v1/openapi.json", "", nil).JSON()
	body := func(path string) map[string]any {
		op := doc["paths"].(map[string]any)[path].(map[string]any)["post"].(map[string]any)
		return op["requestBody"].(map[string]any)["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)
	}
	for _, path := range []string{"/api/v1/keys", "/api/v1/workers/register"} {
		list := body(path)["properties"].(map[string]any)["tools"].(map[string]any)
		require.EqualValues(t, toolname.MaxPairs, list["maxItems"], path)
	}
}

// A refusal names a key the request holds cut to apierr.MaxFieldBytes, its
// start and end around "…", whatever its length (size QA: an unknown key of
// a megabyte was named whole, in the message and in detail.validation: 2 MB
// for one, which the MCP endpoint carries three times over).
func TestARefusalCutsTheKeysItNames(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	key := "start" + strings.Repeat("k", 1_000_000) + "end"
	body := []byte(`{"effect_type":"qa.key","idempotency_key":"k","` + key + `":1}`)
	r := env.Do("POST", "/api/v1/effects/begin", ws.Key, body)
	require.Equal(t, http.StatusBadRequest, r.Status)
	require.Less(t, len(r.Body), 8<<10, "%d bytes", len(r.Body))
	fields := validationFields(t, r)
	require.Len(t, fields, 1)
	head, tail, ok := strings.Cut(fields[0], "…")
	require.True(t, ok, "cut")
	require.True(t, strings.HasPrefix(head, "startkkk"), "its start")
	require.True(t, strings.HasSuffix(tail, "kkkend"), "its end")
	require.Greater(t, len(tail), 100)
	require.Len(t, fields[0], apierr.MaxFieldBytes)
	require.Contains(t, r.JSON()["error"].(map[string]any)["message"], fields[0])

	require.Equal(t, "a.b", apierr.CutField("a.b"))
	for _, long := range []string{strings.Repeat("é", 300), strings.Repeat("🙂", 300), "x" + strings.Repeat("🙂", 300)} {
		cut := apierr.CutField(long)
		require.LessOrEqual(t, len(cut), apierr.MaxFieldBytes)
		require.True(t, utf8.ValidString(cut), "cut between characters")
	}
}

// A body is read as JSON whatever its Content-Type says, or without one
// (conformance QA: stated nowhere, and held by no test, though README's
// examples depend on it): curl -d sends application/x-www-form-urlencoded,
// and the examples' sign-up, key and begin send nothing else. The MCP
// endpoint alone asks for application/json (the transport's rule).
func TestABodyIsReadAsJSONWhateverItsContentType(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain", "application/xml", ""} {
		header := http.Header{"Content-Type": {ct}}
		if ct == "" {
			header = http.Header{"Content-Type": nil} // none at all
		}
		r := env.DoWith("POST", "/api/v1/workspaces", "", header, `{"name": "acme"}`)
		require.Equal(t, http.StatusCreated, r.Status, "%q: %s", ct, r.Body)
		key := r.JSON()["key"].(map[string]any)["secret"].(string)
		r = env.DoWith("POST", "/api/v1/effects/begin", key, header,
			`{"effect_type": "email.send", "idempotency_key": "welcome-email:user_123"}`)
		require.Equal(t, http.StatusOK, r.Status, "%q: %s", ct, r.Body)
		require.Equal(t, "execute", r.JSON()["decision"], ct)
		// Read as JSON, so still held to JSON's rules: a form body is not one.
		r = env.DoWith("POST", "/api/v1/keys", key, header, "name=agent&preset=AGENT")
		require.Equal(t, http.StatusBadRequest, r.Status, "%q: %s", ct, r.Body)
		require.Equal(t, "invalid_request", r.ErrorCode())
	}
}

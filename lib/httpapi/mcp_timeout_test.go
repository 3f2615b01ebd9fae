package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
)

// mcpRequest is a POST to the MCP endpoint under key, its body read from
// body.
func mcpRequest(key string, body io.Reader) *http.Request {
	r := httptest.NewRequest("POST", "/api/v1/mcp", body)
	r.Header.Set("Authorization", "Bearer "+key)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json")
	return r
}

// The MCP endpoint's body is read within its route's Timeout, as a route's
// is: a body late for it is 408 request_timeout. On the local server it
// was read until the server's own read timeout (a minute), then answered
// 400 (QA); held whole by an adapter, past the Timeout, it was served.
func TestMCPBodyLateForTheRoutesTimeIs408(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	h := httpapi.NewWithMCPTimeout(env.App.Server.Deps, lateRouteTimeout)
	requireLateBodyIs408(t, h, "POST /api/v1/mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+ws.Key+"\r\n"+
		"Content-Type: application/json\r\nAccept: application/json\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\"",
		`{"jsonrpc":"2.0","id":1,"method":"ping"}`, func(body io.Reader) *http.Request { return mcpRequest(ws.Key, body) })

	// In time, it answers.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, mcpRequest(ws.Key, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.JSONEq(t, `{"jsonrpc":"2.0","id":1,"result":{}}`, rec.Body.String())
}

// A tool call still running at the MCP route's Timeout is stopped there,
// as a route's work is, and answered so: a ratchet_begin waiting for its
// policy's turn ran on the local server until its own REST route's time
// (15 s), and a batch of them past the 28 s the endpoint declares (QA).
// It says so (client_closed_request, as a call stopped by Lambda's
// deadline says it: mcpserver.saidStopped) and grants nothing.
func TestMCPToolCallsStopAtTheRoutesTimeout(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	h := httpapi.NewWithMCPTimeout(env.App.Server.Deps, lateRouteTimeout)
	ctx := context.Background()
	pool := env.App.Pool

	// The policy's turn, held as a policy write holds it (gate.sqlLockPolicy).
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back below
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('gate_policy:' || $1::text || '/' || $2::text, 0))`,
		ws.ID, "email.send")
	require.NoError(t, err)

	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, mcpRequest(ws.Key, strings.NewReader(string(mustJSON(map[string]any{
			"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": "ratchet_begin",
				"arguments": map[string]any{"effect_type": "email.send", "idempotency_key": "late:1"}}})))))
		answered <- rec
	}()
	apitest.WaitForLock(t, pool, "%gate_begin_in_turn%", "advisory", "the begin waits for the policy's turn")
	var rec *httptest.ResponseRecorder
	select {
	case rec = <-answered:
	case <-time.After(10 * time.Second): // the begin's own route would stop it at 15 s
		require.FailNow(t, "the tool call was not stopped at the route's Timeout")
	}
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var answer struct {
		Result struct {
			IsError           bool           `json:"isError"`
			StructuredContent map[string]any `json:"structuredContent"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &answer), rec.Body.String())
	require.True(t, answer.Result.IsError, rec.Body.String())
	e := answer.Result.StructuredContent["error"].(map[string]any)
	require.Equal(t, "client_closed_request", e["code"], rec.Body.String())
	require.Contains(t, e["message"], "the HTTP request that carried it reached its deadline", rec.Body.String())

	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, env.Must(http.StatusOK, "GET", "/api/v1/effects", ws.Key, nil).JSON()["data"], "nothing granted")
}

// Behind the Lambda adapter a request's own context ends with the MCP
// route's time (AnswerMargin before the invocation), and the transport
// writes nothing once the context it waits under ends: a batch whose calls
// were stopped at the route's time raced their answers and, losing, was
// answered 200 with no body (AL review follow-up). The transport waits
// under a context that outlives the route's time, until half the
// AnswerMargin past it, and answers.
func TestMCPAnswersOnceTheRequestsOwnTimeHasEnded(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	h := httpapi.NewWithMCPTimeout(env.App.Server.Deps, httpapi.FunctionTimeout-httpapi.AnswerMargin)
	h.WrapMCPHandler(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			bounded, ok := httpapi.RouteTime(r.Context())
			require.True(t, ok)
			<-bounded.Done() // the route's time, the request's own, is over
			require.NoError(t, r.Context().Err(), "the transport can still answer")
			deadline, _ := r.Context().Deadline()
			routeDeadline, _ := bounded.Deadline()
			require.Equal(t, routeDeadline.Add(httpapi.AnswerMargin/2), deadline, "and only for half the margin")
			next.ServeHTTP(w, r)
		})
	})
	// The request's own time ends with the route's, as behind the Lambda
	// adapter.
	ctx, cancel := context.WithTimeout(context.Background(), lateRouteTimeout)
	defer cancel()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, mcpRequest(ws.Key, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)).WithContext(ctx))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.JSONEq(t, `{"jsonrpc":"2.0","id":1,"result":{}}`, rec.Body.String())
}

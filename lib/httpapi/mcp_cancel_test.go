package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
)

// cancelledTooLate is the MCP transport next, but that it never sees a
// notifications/cancelled: each cancellation reaches its request after the
// request was answered, the race a client cancelling a ratchet_begin meets
// when the begin is granted as the cancellation lands, which otherwise the
// SDK decides (it cancels in the background, and does not start a call
// already cancelled). The endpoint still reads the batch as sent.
func cancelledTooLate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var batch []map[string]any
		if raw, err := io.ReadAll(r.Body); err != nil || json.Unmarshal(raw, &batch) != nil {
			http.Error(w, "cancelledTooLate takes a batch", http.StatusTeapot)
			return
		}
		batch = slices.DeleteFunc(batch, func(m map[string]any) bool { return m["method"] == "notifications/cancelled" })
		body := mustJSON(batch)
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// A ratchet_begin without request_id that a notifications/cancelled of its
// batch names, granted as the cancellation landed, is left out of the
// batch's answer (MCP) and its lease given back before the answer is
// written (README, MCP), as the stdio binary gives it back: the key's next
// begin is execute, a new attempt, where it was in_flight until the lease
// lapsed, then blocked (MCP QA). A begin that named its request_id keeps
// its lease for a retry under it.
func TestMCPCancelledBeginGivesBackItsLease(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	env.App.Server.WrapMCPHandler(cancelledTooLate)
	ws := env.Signup()
	agent := env.Key(ws, map[string]any{"name": "agent", "preset": "AGENT"})
	header := http.Header{"Accept": {"application/json, text/event-stream"}}
	begin := func(id int, args map[string]any) map[string]any {
		return map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call",
			"params": map[string]any{"name": "ratchet_begin", "arguments": args}}
	}
	cancel := func(id int) map[string]any {
		return map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": map[string]any{"requestId": id}}
	}
	send := func(batch ...any) *apitest.Response {
		t.Helper()
		return env.DoWith("POST", "/api/v1/mcp", agent, header, mustJSON(batch))
	}
	// decision is the structured content of a begin of args sent alone,
	// and the effect it names.
	decision := func(args map[string]any) (content, effect map[string]any) {
		t.Helper()
		res := send(begin(9, args))
		require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
		var answers []struct {
			Result struct {
				StructuredContent map[string]any `json:"structuredContent"`
			} `json:"result"`
		}
		require.NoError(t, json.Unmarshal(res.Body, &answers), "%s", res.Body)
		require.Len(t, answers, 1, "%s", res.Body)
		content = answers[0].Result.StructuredContent
		id, _ := content["effect_id"].(string)
		require.NotEmpty(t, id, "%v", content)
		return content, env.Must(http.StatusOK, "GET", "/api/v1/effects/"+id, ws.Key, nil).JSON()
	}

	args := map[string]any{"effect_type": "email.send", "idempotency_key": "cancelled:1"}
	res := send(begin(1, args), cancel(1))
	require.Equal(t, http.StatusAccepted, res.Status, "a batch whose only request was cancelled: %s", res.Body)
	require.Empty(t, res.Body)
	again, effect := decision(args)
	require.Equal(t, "execute", again["decision"], "the lease was given back: %v", again)
	require.EqualValues(t, 2, effect["attempt"], "%v", effect)
	first := effect["attempts"].([]any)[0].(map[string]any)
	require.Equal(t, "failed", first["outcome"], "the cancelled begin's attempt was reported failed: %v", effect)

	// Another request of the batch is answered still.
	args = map[string]any{"effect_type": "email.send", "idempotency_key": "cancelled:2"}
	res = send(begin(1, args), map[string]any{"jsonrpc": "2.0", "id": 2, "method": "ping"}, cancel(1))
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	require.JSONEq(t, `[{"jsonrpc":"2.0","id":2,"result":{}}]`, string(res.Body))
	again, effect = decision(args)
	require.Equal(t, "execute", again["decision"], "the lease was given back: %v", again)
	require.EqualValues(t, 2, effect["attempt"], "%v", effect)

	// A begin that named its request_id: a retry under it is given the
	// lease (the recovery of a lost answer), so it is not given back.
	args = map[string]any{"effect_type": "email.send", "idempotency_key": "cancelled:3",
		"request_id": "5f0c7e58-2b7e-4d55-9a43-0c1b8e6f2a17"}
	res = send(begin(1, args), cancel(1))
	require.Equal(t, http.StatusAccepted, res.Status, "%s", res.Body)
	retried, effect := decision(args)
	require.Equal(t, "execute", retried["decision"], "%v", retried)
	require.EqualValues(t, 1, effect["attempt"], "the retry rejoined the lease: %v", effect)
	require.Nil(t, effect["attempts"].([]any)[0].(map[string]any)["outcome"], "%v", effect)
}

// A lease its batch's answer will not tell of is given back only while the
// function can still write that answer: by half the AnswerMargin past the
// route's Timeout, the function stopped as early as AnswerMargin past it.
// A batch that ran to its route's 28 s gave back for up to 5 s more, past
// Lambda's 30 s, and its answer was lost with the function (AL review).
// Past that time the lease is left to lapse, as one that could not be
// given back: the key's next begin is in_flight.
func TestMCPLeaseIsGivenBackOnlyWhileTheAnswerCanBeWritten(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	agent := env.Key(ws, map[string]any{"name": "agent", "preset": "AGENT"})
	h := httpapi.NewWithMCPTimeout(env.App.Server.Deps, lateRouteTimeout)
	h.WrapMCPHandler(func(next http.Handler) http.Handler {
		late := cancelledTooLate(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			late.ServeHTTP(w, r) // the begin is granted, and its cancellation comes too late
			// The batch ends AnswerMargin past its route's Timeout, where
			// the function may be stopped.
			bounded, ok := httpapi.RouteTime(r.Context())
			require.True(t, ok)
			deadline, ok := bounded.Deadline()
			require.True(t, ok)
			stopped, cancel := context.WithDeadline(context.Background(), deadline.Add(httpapi.AnswerMargin))
			defer cancel()
			<-stopped.Done()
		})
	})
	args := map[string]any{"effect_type": "email.send", "idempotency_key": "late-give-back:1"}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, mcpRequest(agent, bytes.NewReader(mustJSON([]any{
		map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
			"params": map[string]any{"name": "ratchet_begin", "arguments": args}},
		map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": map[string]any{"requestId": 1}},
	}))))
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())

	again := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", agent, args).JSON()
	require.Equal(t, "in_flight", again["decision"], "the lease was not given back so late: %v", again)
}

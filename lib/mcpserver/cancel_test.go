package mcpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/mcpserver"
)

// fakeCaller records the calls made through it and answers status.
type fakeCaller struct {
	status int
	err    error
	calls  []string
	bodies []string
}

func (f *fakeCaller) Call(_ context.Context, method, path, auth string, body []byte) (int, []byte, error) {
	f.calls = append(f.calls, method+" "+path+" "+auth)
	f.bodies = append(f.bodies, string(body))
	return f.status, []byte(`{}`), f.err
}

// Only a lease no one saw is given back, reported failed with its token: a
// probe's is left to lapse (reported failed, it would settle the earlier
// attempt whose outcome is unknown as failed, unchecked at the vendor), and
// a result that grants nothing releases nothing. A release that fails says
// so without the token.
func TestReleaseUnseenGivesBackOnlyAnUnseenGrant(t *testing.T) {
	t.Parallel()
	grant := `{"content":[],"structuredContent":{"decision":"execute","effect_id":"eff_1/x","lease_token":"tok_secret","probe":false}}`
	f := &fakeCaller{status: http.StatusOK}
	released, err := mcpserver.ReleaseUnseen(context.Background(), f, "Bearer rk_a", json.RawMessage(grant))
	require.NoError(t, err)
	require.True(t, released)
	require.Equal(t, []string{"POST /api/v1/effects/eff_1%2Fx/report Bearer rk_a"}, f.calls)
	require.JSONEq(t, `{"lease_token":"tok_secret","outcome":"failed"}`, f.bodies[0])

	for _, result := range []string{
		`{"structuredContent":{"decision":"execute","effect_id":"eff_1","lease_token":"tok","probe":true}}`,
		`{"structuredContent":{"decision":"in_flight","effect_id":"eff_1","retry_after_seconds":3}}`,
		`{"structuredContent":{"decision":"duplicate","effect_id":"eff_1","result":{}}}`,
		`{"isError":true,"structuredContent":{"error":{"code":"server_unreachable"}}}`,
		`{"content":[]}`,
		`not json`,
	} {
		f := &fakeCaller{status: http.StatusOK}
		released, err := mcpserver.ReleaseUnseen(context.Background(), f, "Bearer rk_a", json.RawMessage(result))
		require.NoError(t, err, result)
		require.False(t, released, result)
		require.Empty(t, f.calls, result)
	}

	for _, f := range []*fakeCaller{{status: http.StatusConflict}, {err: errors.New("dial tcp: tok_secret")}} {
		released, err := mcpserver.ReleaseUnseen(context.Background(), f, "Bearer rk_a", json.RawMessage(grant))
		require.Error(t, err)
		require.False(t, released)
		require.NotContains(t, err.Error(), "tok_secret")
	}
}

// A lease is given back within the time asked, without the cancellation
// of the request that was granted it, and by the end its request set
// (GiveBackBy) when that comes sooner: past it, the function serving the
// request may be stopped before its answer is written (AL review: a batch
// that ran to its route's 28 s gave back for 5 s more, past Lambda's 30 s).
// A give-back whose time is over sends nothing and says so.
func TestGivingBackEndsByTheEndItsRequestSet(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	end := time.Now().Add(time.Minute)
	ctx, stop := mcpserver.GivingBack(mcpserver.GiveBackBy(cancelled, end), time.Hour)
	defer stop()
	require.NoError(t, ctx.Err(), "the request's cancellation is not the give-back's")
	deadline, ok := ctx.Deadline()
	require.True(t, ok)
	require.Equal(t, end, deadline, "the request's end comes first")

	ctx, stop = mcpserver.GivingBack(mcpserver.GiveBackBy(cancelled, end), time.Second)
	defer stop()
	deadline, _ = ctx.Deadline()
	require.True(t, deadline.Before(end), "the time asked comes first")

	ctx, stop = mcpserver.GivingBack(mcpserver.GiveBackBy(cancelled, time.Now().Add(-time.Second)), time.Hour)
	defer stop()
	f := &fakeCaller{status: http.StatusOK}
	grant := `{"structuredContent":{"decision":"execute","effect_id":"eff_1","lease_token":"tok_secret","probe":false}}`
	released, err := mcpserver.ReleaseUnseen(ctx, f, "Bearer rk_a", json.RawMessage(grant))
	require.Error(t, err)
	require.False(t, released)
	require.Empty(t, f.calls, "nothing is sent once the time to give back is over")
}

// A ratchet_begin sent over HTTP is not abandoned when its request is
// cancelled: it brings back the server's decision, which may grant a lease
// (MCP QA: the call was aborted after the server had granted it, and the
// lease reached no one). Other calls are abandoned, and a begin cancelled
// before it is sent is not sent.
func TestACancelledBeginOverHTTPFinishes(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	answer := make(chan struct{})
	var begins atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/effects/begin" {
			begins.Add(1)
		}
		_, _ = io.Copy(io.Discard, r.Body) // so that the server sees the client leave
		arrived <- struct{}{}
		if r.Method == http.MethodGet {
			<-r.Context().Done() // the client left
			return
		}
		<-answer
		_, _ = w.Write([]byte(`{"decision":"execute"}`))
	}))
	defer srv.Close()
	c := mcpserver.HTTPCaller{BaseURL: srv.URL}

	call := func(method, path string) (status int, body []byte, err error) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			<-arrived
			cancel()
			if method == http.MethodPost {
				close(answer)
			}
		}()
		return c.Call(ctx, method, path, "Bearer rk_a", []byte(`{}`))
	}
	status, body, err := call(http.MethodPost, "/api/v1/effects/begin")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, `{"decision":"execute"}`, string(body))

	_, _, err = call(http.MethodGet, "/api/v1/effects/eff_1")
	require.ErrorIs(t, err, context.Canceled)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err = c.Call(ctx, http.MethodPost, "/api/v1/effects/begin", "Bearer rk_a", []byte(`{}`))
	require.ErrorIs(t, err, context.Canceled)
	require.EqualValues(t, 1, begins.Load(), "a begin cancelled before it was sent was sent")
}

// Only a begin without request_id has its lease in its answer alone.
func TestBeginWithoutRequestID(t *testing.T) {
	t.Parallel()
	for params, want := range map[string]bool{
		`{"name":"ratchet_begin","arguments":{"idempotency_key":"k"}}`:                  true,
		`{"name":"ratchet_begin","arguments":{"request_id":null}}`:                      true,
		`{"name":"ratchet_begin"}`:                                                      true,
		`{"name":"ratchet_begin","arguments":{"request_id":"0b6a1c3d-5e7f-4c55-9d2e"}}`: false,
		`{"name":"ratchet_report","arguments":{}}`:                                      false,
		`{"name":"ratchet_begin","arguments":[]}`:                                       false,
		`null`: false,
	} {
		require.Equal(t, want, mcpserver.BeginWithoutRequestID(json.RawMessage(params)), params)
	}
}

// A request of a batch that a notifications/cancelled of the batch names,
// wherever it sits, is left out of the batch's answer, its id read as the
// SDK reads it (1.0 is 1; "1" is another id); a batch left with no answer
// says so. One message alone, or a batch cancelling nothing of its own, is
// answered as it is. The results left out of ratchet_begin calls without a
// request_id are handed back to be given back (ReleaseUnseen), and only
// theirs: not a begin's that named its request_id, nor another tool's.
func TestLeaveOutCancelledDropsOnlyTheCancelledAnswers(t *testing.T) {
	t.Parallel()
	const (
		call1  = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_begin"}}`
		call2  = `{"jsonrpc":"2.0","id":"1","method":"tools/list"}`
		result = `{"isError":true}`
		answer = `[{"jsonrpc":"2.0","id":1,"result":` + result + `},{"jsonrpc":"2.0","id":"1","result":{"tools":[]}}]`
		kept   = `[{"jsonrpc":"2.0","id":"1","result":{"tools":[]}}]`
	)
	cancel := func(id string) string {
		return `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":` + id + `}}`
	}
	for body, want := range map[string]string{
		"[" + call1 + "," + call2 + "," + cancel("1") + "]":   kept,
		"[" + cancel("1.0") + "," + call1 + "," + call2 + "]": kept,
		"[" + call1 + "," + call2 + "," + cancel("7") + "]":   answer,
		"[" + call1 + "," + call2 + "," + cancel("{}") + "]":  answer,
		"[" + call1 + "," + call2 + "]":                       answer,
		call1:                                                 answer,
	} {
		out, anyLeft, unseen := mcpserver.LeaveOutCancelled([]byte(body), []byte(answer))
		require.True(t, anyLeft, body)
		require.JSONEq(t, want, string(out), body)
		if want == kept {
			require.Len(t, unseen, 1, body)
			require.JSONEq(t, result, string(unseen[0]), body)
		} else {
			require.Empty(t, unseen, body)
		}
	}
	_, anyLeft, unseen := mcpserver.LeaveOutCancelled([]byte("["+call1+","+call2+","+cancel("1")+","+cancel(`"1"`)+"]"),
		[]byte(answer))
	require.False(t, anyLeft, "every request of the batch was cancelled")
	require.Len(t, unseen, 1, "the begin's result, not the tools/list's")

	named := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_begin","arguments":{"request_id":"r-1"}}}`
	out, _, unseen := mcpserver.LeaveOutCancelled([]byte("["+named+","+call2+","+cancel("1")+"]"), []byte(answer))
	require.JSONEq(t, kept, string(out))
	require.Empty(t, unseen, "a begin that named its request_id is left to a retry under it")
}

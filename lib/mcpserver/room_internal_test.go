package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// grantingCaller answers every begin execute with a lease and records the
// calls made, and the deadline each was made within.
type grantingCaller struct {
	mu        sync.Mutex
	calls     []string
	sent      []map[string]any
	deadlines []time.Time
}

func (g *grantingCaller) Call(ctx context.Context, method, path, _ string, body []byte) (int, []byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, method+" "+path)
	deadline, _ := ctx.Deadline()
	g.deadlines = append(g.deadlines, deadline)
	var sent map[string]any
	_ = json.Unmarshal(body, &sent)
	g.sent = append(g.sent, sent)
	if path == beginPath {
		return http.StatusOK, []byte(`{"decision":"execute","effect_id":"eff_01","state":"leased","attempt":1,` +
			`"lease_token":"lt_1","lease_expires_at":"2026-01-01T00:00:00Z"}`), nil
	}
	return http.StatusOK, []byte(`{"id":"eff_01","state":"failed"}`), nil
}

// A ratchet_begin whose result does not fit in what its batch's answer has
// left is answered the JSON-RPC error that says to send it again, and the
// lease it was granted, which only that result would have told of, is
// given back at once (reported failed with its token, as when its request
// is cancelled), so that the request sent again executes; under a
// request_id the lease is left to the request sent again, which is given
// it. A result that fits is answered, and nothing is given back. It is
// given back by the end its request set (GiveBackBy), sooner than
// GiveBackTimeout here.
func TestABeginPastItsBatchsRoomGivesItsLeaseBack(t *testing.T) {
	t.Parallel()
	end := time.Now().Add(GiveBackTimeout / 2)
	within := func(left int) context.Context {
		return GiveBackBy(context.WithValue(context.Background(), roomKey{}, &Room{left: left}), end)
	}
	rid := "req-0123456789abcdef"
	for _, tc := range []struct {
		left      int
		requestID *string
		answered  bool
		given     bool
	}{
		{left: 10, answered: false, given: true},
		{left: 10, requestID: &rid, answered: false, given: false},
		{left: 1 << 20, answered: true, given: false},
	} {
		g := &grantingCaller{}
		ctx := within(tc.left)
		res, err := call(ctx, g, nil, "Bearer rk_x", http.MethodPost, beginPath,
			BeginInput{EffectType: "email.send", IdempotencyKey: "k", RequestID: tc.requestID})
		if tc.answered {
			require.NoError(t, err)
			require.False(t, res.IsError)
			require.Less(t, roomOf(ctx).Left(), 1<<20, "the result took its room")
		} else {
			var rpc *jsonrpc.Error
			require.ErrorAs(t, err, &rpc)
			require.EqualValues(t, jsonrpc.CodeInvalidRequest, rpc.Code)
			require.Nil(t, res)
			require.Equal(t, tc.left, roomOf(ctx).Left(), "a refused result takes nothing")
		}
		if tc.given {
			require.Equal(t, []string{"POST " + beginPath, "POST /api/v1/effects/eff_01/report"}, g.calls)
			require.Equal(t, map[string]any{"lease_token": "lt_1", "outcome": "failed"}, g.sent[1])
			require.Equal(t, end, g.deadlines[1], "given back by its request's end")
		} else {
			require.Equal(t, []string{"POST " + beginPath}, g.calls)
		}
	}
	// A read asks for its page within a third of what is left.
	g := &budgetCaller{}
	_, err := call(within(3_000_000+messageOverhead), g, nil, "", http.MethodGet, "/api/v1/effects", nil)
	require.NoError(t, err)
	require.Equal(t, 1_000_000, g.budget)
}

// budgetCaller records the answer budget its call was made within.
type budgetCaller struct{ budget int }

func (b *budgetCaller) Call(ctx context.Context, _, _, _ string, _ []byte) (int, []byte, error) {
	b.budget = answer.Of(ctx)
	return http.StatusOK, []byte(`{"data":[],"next_cursor":null}`), nil
}

// A ratchet_begin's result is answered whatever the rest of its batch took
// of the answer: room is set aside for each begin of the request, which an
// execute's result always fits, so its lease is never dropped and given
// back (review: reported failed, that attempt counted against max_attempts,
// and under max_attempts 1 the begin sent again, as the error asked, was
// refused max_attempts_exceeded for good, though nothing had acted).
func TestABeginsResultHasRoomSetAsideForIt(t *testing.T) {
	t.Parallel()
	body := []byte(`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_get_effect",` +
		`"arguments":{"effect_id":"eff_01"}}},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":` +
		`{"name":"ratchet_begin","arguments":{"effect_type":"email.send","idempotency_key":"k"}}}]`)
	ctx := WithRoom(context.Background(), body)
	room := roomOf(ctx)
	require.True(t, room.take(room.Left()), "the batch's reads took all that is left")
	g := &grantingCaller{}
	res, err := call(ctx, g, nil, "Bearer rk_x", http.MethodPost, beginPath,
		BeginInput{EffectType: "email.send", IdempotencyKey: "k"})
	require.NoError(t, err, "the begin is answered")
	require.False(t, res.IsError)
	require.Equal(t, "execute", res.StructuredContent.(map[string]any)["decision"])
	require.Equal(t, []string{"POST " + beginPath}, g.calls, "nothing given back")
	require.Equal(t, beginRoom-resultSize(res), room.Left(), "what it did not use goes back to the rest")

	// The room set aside holds the largest execute: a probe's, with its
	// prior attempt, at the fiftieth attempt, as REST writes it.
	at := time.Date(2026, 12, 31, 23, 59, 59, 999999000, time.UTC)
	probe := true
	largest := gate.Decision{Decision: gate.DecisionExecute, EffectID: ids.New(ids.Effect), State: gate.StateLeased,
		Attempt: 50, LeaseToken: strings.Repeat("t", 128), LeaseExpiresAt: &at, Probe: &probe,
		PriorAttempt: &gate.PriorAttempt{Attempt: 49, StartedAt: &at, LeaseExpiredAt: &at}}
	written, err := jsonx.Marshal(largest)
	require.NoError(t, err)
	written = append(written, '\n')
	size := resultSize(&mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(written)}}})
	require.Less(t, 2*size, beginRoom, "with room to spare")
}

// A write that ran (a resolve here) whose result does not fit in what its
// batch's answer has left is not answered the error that says to send it
// again, as if nothing had happened: a resolve without attempt sent again
// settled whatever attempt was unknown then, a later one included, or was
// refused invalid_state (review). It is answered a short result saying it
// ran, and which tool reads its outcome; a decision's is read through the
// approvals. A read, which changed nothing, is still refused with the
// error. Either answer fits in what each message has set aside for it.
func TestAWriteThatRanPastItsBatchsRoomSaysItRan(t *testing.T) {
	t.Parallel()
	within := func() context.Context {
		return context.WithValue(context.Background(), roomKey{}, &Room{left: 10})
	}
	for path, readWith := range map[string]string{
		"/api/v1/effects/eff_01/resolve":  "ratchet_get_effect",
		"/api/v1/effects/eff_01/report":   "ratchet_get_effect",
		"/api/v1/approvals/apr_01/reject": "ratchet_list_approvals",
	} {
		g := &grantingCaller{}
		res, err := call(within(), g, nil, "Bearer rk_x", http.MethodPost, path, map[string]any{"outcome": "failed"})
		require.NoError(t, err, path)
		require.False(t, res.IsError, path)
		require.Equal(t, true, res.StructuredContent.(map[string]any)["applied"], path)
		text := res.Content[0].(*mcp.TextContent).Text
		require.Contains(t, text, "do not send it again: read the outcome with "+readWith, path)
		require.NotContains(t, text, "send this request again", path)
		require.Equal(t, []string{"POST " + path}, g.calls, "nothing is given back")
		require.LessOrEqual(t, answerSize(t, map[string]any{"result": res}), messageOverhead)
	}
	_, err := call(within(), &grantingCaller{}, nil, "", http.MethodGet, "/api/v1/effects/eff_01", nil)
	var rpc *jsonrpc.Error
	require.ErrorAs(t, err, &rpc)
	require.EqualValues(t, jsonrpc.CodeInvalidRequest, rpc.Code)
	require.Contains(t, rpc.Message, "send this request again alone or in a smaller batch")
	require.LessOrEqual(t, answerSize(t, map[string]any{"error": rpc}), messageOverhead)
}

// answerSize is what a JSON-RPC answer with members takes, less its id.
func answerSize(t *testing.T, members map[string]any) int {
	t.Helper()
	members["jsonrpc"], members["id"] = "2.0", nil
	b, err := json.Marshal(members)
	require.NoError(t, err)
	return len(b) + len(",") - len("null")
}

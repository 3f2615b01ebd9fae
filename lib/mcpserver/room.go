package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// Room is what the tool results of one HTTP request to the MCP endpoint
// may still take of its answer, which the platforms deliver only up to
// answer.Budget (Vercel 4.5 MB, Lambda 6 MB): a batch of 100 list calls
// answered about 4 MB, and more with larger values, and each tool result
// carries its REST answer twice (as text, escaped, and as structured
// content). A tool call whose result does not fit in what is left is
// answered a JSON-RPC error instead (tooLarge): send it again alone or in a
// smaller batch; a write that ran (a report, a heartbeat, a resolve, a
// decision) is answered a short result saying so instead (omitted). Its
// members run concurrently, so which of a batch's calls are refused depends
// on which finish first. A list call asks the REST
// route for a page a third of the room left, so that a call alone always
// fits. Each ratchet_begin has beginRoom set aside, which its result takes
// first: a begin is always answered, unless it answers a duplicate's large
// result (which the begin sent again answers the same). The stdio binary,
// which no platform bounds, has no room.
type Room struct {
	mu   sync.Mutex
	left int
	// begins is how many of the request's ratchet_begin calls still have
	// beginRoom set aside, outside left.
	begins int
}

// beginRoom is what is set aside for each ratchet_begin's result: well
// over the largest an execute (or any decision but a duplicate's, which
// carries the effect's result) takes. A begin's execute that did not fit
// would be given back, reported failed (ReleaseUnseen): an attempt spent,
// which under max_attempts 1 refused the begin sent again for good
// (review), though nothing had acted.
const beginRoom = 4 << 10

type roomKey struct{}

// messageOverhead is what each message's answer takes besides its id and
// its tool result's text and structured content: the JSON-RPC envelope,
// the result's members, a comma; or, in place of a result refused room,
// the error (tooLarge) or the short result of a write that ran (omitted).
const messageOverhead = 640

// WithRoom is ctx carrying the room of the answer to body, one JSON-RPC
// message or a batch (CheckEnvelope passed it): answer.Budget less, for
// each message, its id (at most its share of the body) and envelope, and
// for each tools/list what it answers.
func WithRoom(ctx context.Context, body []byte) context.Context {
	var batch []json.RawMessage
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		_ = json.Unmarshal(trimmed, &batch)
	} else {
		batch = []json.RawMessage{trimmed}
	}
	left, begins := answer.Budget-len(body)-len("[]"), 0
	for _, m := range batch {
		var probe struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		_ = json.Unmarshal(m, &probe)
		left -= messageOverhead
		switch {
		case probe.Method == "tools/list":
			left -= toolsListSize()
		case probe.Method == "tools/call" && probe.Params.Name == beginTool:
			left -= beginRoom
			begins++
		}
	}
	return context.WithValue(ctx, roomKey{}, &Room{left: left, begins: begins})
}

// toolsListSize bounds what a tools/list answers (its result, twice over
// for what the SDK adds).
var toolsListSize = sync.OnceValue(func() int {
	b, _ := json.Marshal(&mcp.ListToolsResult{Tools: ToolDefinitions()})
	return 2 * len(b)
})

func roomOf(ctx context.Context) *Room {
	r, _ := ctx.Value(roomKey{}).(*Room)
	return r
}

// take reserves n bytes of the room, if it has them.
func (r *Room) take(n int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n > r.left {
		return false
	}
	r.left -= n
	return true
}

// takeBegin reserves n bytes for a ratchet_begin's result: from the room
// set aside for it, what it does not use going back to the rest, and from
// the rest when the result is larger.
func (r *Room) takeBegin(n int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.begins > 0 {
		r.begins--
		r.left += beginRoom
		if n <= beginRoom {
			r.left -= n
			return true
		}
	}
	if n > r.left {
		return false
	}
	r.left -= n
	return true
}

// Left is what the room still holds.
func (r *Room) Left() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.left
}

// readWithin is ctx for a REST read made for a tool call under room: its
// answer (a list's page) holds at most what the tool result can carry in
// what is left, a third of it (the text, escaped, may be twice the answer,
// and the structured content is the answer again).
func readWithin(ctx context.Context, room *Room) context.Context {
	if room == nil {
		return ctx
	}
	return answer.Within(ctx, (room.Left()-messageOverhead)/3)
}

// resultSize bounds what res takes of its answer (less its id and
// envelope, messageOverhead): its text as a JSON string and its structured
// content, which is that text's JSON again, once the endpoint has written
// its HTML escapes back (jsonx.Unescaped).
func resultSize(res *mcp.CallToolResult) int {
	n := 0
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			n += jsonx.StringLen(t.Text) + len(t.Text)
		}
	}
	return n
}

// fit answers res, the result of a call of tool, when the room (if any)
// holds it. Otherwise, when the call changed something (readWith names
// the tool that reads its outcome), it answers omitted; for any other,
// the error tooLarge, after undo has given back what the call granted
// that only its answer would have told.
func fit(ctx context.Context, tool string, res *mcp.CallToolResult, undo func(context.Context), readWith string) (*mcp.CallToolResult, error) {
	room := roomOf(ctx)
	if room == nil {
		return res, nil
	}
	take := room.take
	if tool == beginTool {
		take = room.takeBegin
	}
	if take(resultSize(res)) {
		return res, nil
	}
	if readWith != "" {
		return omitted(readWith), nil
	}
	if undo != nil {
		uctx, stop := GivingBack(ctx, GiveBackTimeout)
		defer stop()
		undo(uctx)
	}
	return nil, tooLarge()
}

// tooLarge refuses a tool call whose result would take its answer past
// answer.Budget (Room) and that changed nothing, or whose sending again
// answers the same (a read, a begin): it names no value of the call.
func tooLarge() *jsonrpc.Error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: fmt.Sprintf("Invalid Request: the answers "+
		"of this batch would pass %d bytes together, more than one answer may hold; send this request again "+
		"alone or in a smaller batch", answer.Budget)}
}

// omitted answers a write (a report, a heartbeat, a resolve, a decision)
// that ran, and whose result would take its answer past answer.Budget
// (Room): it was answered tooLarge, which said to send it again, as if
// nothing had happened (review). A resolve without attempt sent again
// settles whatever attempt is unknown then, a later one included, or is
// refused invalid_state. The write stands, so this is its tool result, not
// an error: applied, and the tool that reads the outcome (ratchet_get_effect,
// or ratchet_list_approvals for a decision) instead of a resend. It fits in
// messageOverhead, whatever the room has left. It names no value of the call.
func omitted(readWith string) *mcp.CallToolResult {
	text := fmt.Sprintf(`{"applied":true,"answer_omitted":"this call ran and its outcome stands, but its `+
		`answer would take this batch's answer past %d bytes; do not send it again: read the outcome with %s"}`,
		answer.Budget, readWith)
	var structured map[string]any
	_ = json.Unmarshal([]byte(text), &structured)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: structured}
}

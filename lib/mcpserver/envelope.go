package mcpserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// EnvelopeError is the JSON-RPC error that refuses a message (or a batch)
// before the transport reads it. ID is the refused request's id when the
// refusal is a request's answer (an initialize without its protocol
// version); nil answers with a null id (a message whose id cannot be trusted,
// or a batch).
type EnvelopeError struct {
	Code    int64
	Message string
	ID      json.RawMessage
}

// MaxBatch bounds the messages of one JSON-RPC batch, as the REST batch
// report bounds its reports: each message is a call through the router,
// all answered in one reply. Unbounded, a 1 MiB batch held 8 000 tool
// calls; 1 500 list calls (190 KB sent) took 4 s and answered 57 MB, built
// in memory (edge QA: the server's memory rose by 250 MB), far beyond what
// Vercel (4.5 MB) or Lambda (6 MB) deliver, so the calls acted and their
// answers were lost.
const MaxBatch = 100

// CheckEnvelope checks a body of one JSON-RPC message or a batch as the
// API checks a REST body, before the SDK's transport reads it (MCP QA): each
// message's id can be answered exactly (answerableID, else BadIDMessage); the
// body is one JSON value and nothing after it (text after the message, or
// a second message, was ignored and the first served); it is an object or
// an array of them; no member of a message or of its params is named twice
// (parsers disagree on which one counts: a gateway reading the first name
// saw ratchet_get_policy where the last, ratchet_begin, ran); each message is
// a request, a notification or a response, and only one of them (one with an
// id and nothing else was taken for a notification, 202; one with a method
// and a result ran as the request); a batch names each request's id once
// (the SDK answered one of two and dropped the other, unanswered) and holds
// no initialize, which MCP keeps out of batches; and an initialize names its
// protocolVersion, which MCP requires. The tool arguments are the tool
// call's to check (params.arguments is the REST body, refused there with
// REST's wording). A nil answer lets the message through.
func CheckEnvelope(body []byte) *EnvelopeError {
	if !json.Valid(body) {
		return &EnvelopeError{Code: jsonrpc.CodeParseError, Message: ParseErrorMessage}
	}
	body = bytes.TrimSpace(body)
	if body[0] != '[' {
		if body[0] != '{' {
			return invalid("a message is a JSON object")
		}
		return checkMessage(body, false)
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(body, &batch); err != nil {
		return &EnvelopeError{Code: jsonrpc.CodeParseError, Message: ParseErrorMessage}
	}
	if len(batch) == 0 {
		// JSON-RPC 2.0 answers an empty array with one Invalid Request
		// (QA: it was taken for a batch of notifications and answered
		// 202, nothing).
		return invalid("a batch holds at least one message")
	}
	if len(batch) > MaxBatch {
		return invalid(fmt.Sprintf("a batch holds at most %d messages", MaxBatch))
	}
	ids := map[string]bool{}
	for _, m := range batch {
		m = bytes.TrimSpace(m)
		if len(m) == 0 || m[0] != '{' {
			return invalid("each message of a batch is a JSON object")
		}
		if e := checkMessage(m, true); e != nil {
			return e
		}
		var probe struct {
			ID     json.RawMessage `json:"id"`
			Method *string         `json:"method"`
		}
		_ = json.Unmarshal(m, &probe) // valid, and an object: checked above
		if probe.Method == nil || len(probe.ID) == 0 || string(probe.ID) == "null" {
			continue // a notification or a response
		}
		id := canonicalID(probe.ID)
		if ids[id] {
			return invalid("a batch names each request's id once")
		}
		ids[id] = true
	}
	return nil
}

// AcceptRefused refuses a request whose Accept takes no JSON (none listed,
// or only with a q of 0): every answer of this server is JSON, no event
// stream is offered. The transport's own refusal asked for both types where
// JSON alone is served, and read no q values (QA).
func AcceptRefused() *EnvelopeError {
	return invalid("Accept must allow application/json: every answer is JSON (no event stream is offered)")
}

func invalid(why string) *EnvelopeError {
	return &EnvelopeError{Code: jsonrpc.CodeInvalidRequest, Message: "Invalid Request: " + why}
}

// checkMessage checks one message object.
func checkMessage(m []byte, inBatch bool) *EnvelopeError {
	members, err := objectMembers(m)
	if err != nil {
		return invalid(err.Error())
	}
	if !answerableID(members["id"]) {
		return &EnvelopeError{Code: jsonrpc.CodeInvalidRequest, Message: BadIDMessage}
	}
	_, hasMethod := members["method"]
	_, hasResult := members["result"]
	_, hasError := members["error"]
	if !hasMethod && !hasResult && !hasError {
		return invalid("a message is a request, a notification (method) or a response (result or error)")
	}
	// One of them only: a message that is a request and a response at once
	// ran as the request, where a gateway reading it as the response passed
	// it as one (MCP QA), and a response holds its result or its error.
	if (hasMethod && (hasResult || hasError)) || (hasResult && hasError) {
		return invalid("a message is a request or notification (method), or a response (result or error), never two of them")
	}
	params, hasParams := members["params"]
	if hasParams && len(params) > 0 && params[0] == '{' {
		if _, err := objectMembers(params); err != nil {
			return invalid("params: " + err.Error())
		}
	}
	var method string
	_ = json.Unmarshal(members["method"], &method)
	id, isRequest := requestID(members["id"])
	if method == "tools/call" && isRequest && (!hasParams || string(params) == "null") {
		// Invalid params, as tools/call's params of another type are
		// (MCP QA: without them the transport refused it -32600, HTTP 400,
		// and with null answered -32600 naming its handler). A batch is
		// refused whole, as for any message it cannot take.
		if inBatch {
			return invalid("a tools/call of the batch has no params (an object naming the tool)")
		}
		return &EnvelopeError{Code: jsonrpc.CodeInvalidParams, ID: id,
			Message: "Invalid params: tools/call needs params, an object naming the tool"}
	}
	if method != "initialize" {
		return nil
	}
	if inBatch {
		return invalid("initialize cannot be part of a batch")
	}
	var init struct {
		ProtocolVersion *string `json:"protocolVersion"`
	}
	if !hasParams || json.Unmarshal(params, &init) != nil || init.ProtocolVersion == nil {
		return &EnvelopeError{Code: jsonrpc.CodeInvalidParams, Message: "Invalid params: initialize needs protocolVersion, a string",
			ID: id}
	}
	return nil
}

// requestID is a request's id (answerableID let it through: answered as
// sent) and true, or nil and false for a message without one (none, or
// null).
func requestID(id json.RawMessage) (json.RawMessage, bool) {
	if len(id) > 0 && (id[0] == '"' || id[0] == '-' || (id[0] >= '0' && id[0] <= '9')) {
		return id, true
	}
	return nil, false
}

// objectMembers reads the members of the JSON object obj, refusing a name
// given twice.
func objectMembers(obj []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if _, err := dec.Token(); err != nil { // {
		return nil, fmt.Errorf("not an object")
	}
	members := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("not an object")
		}
		name, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil && err != io.EOF {
			return nil, fmt.Errorf("not an object")
		}
		if _, seen := members[name]; seen {
			if protocolNames[name] {
				return nil, fmt.Errorf("%q is named twice", name)
			}
			return nil, fmt.Errorf("a member is named twice in one object") // a name of the caller's: not quoted
		}
		members[name] = v
	}
	return members, nil
}

// protocolNames are the members of a message and of its params that the
// protocol names, which a refusal may quote.
var protocolNames = map[string]bool{"jsonrpc": true, "id": true, "method": true, "params": true, "result": true,
	"error": true, "name": true, "arguments": true, "_meta": true, "protocolVersion": true, "capabilities": true,
	"clientInfo": true, "cursor": true}

// canonicalID spells an id so that 1, 1.0 and 1e0 are one id, as are 0 and
// -0 (as the SDK reads them: answerableID lets only integers through), and
// "1" another.
func canonicalID(id json.RawMessage) string {
	if id[0] == '"' {
		var s string
		_ = json.Unmarshal(id, &s)
		return "s:" + s
	}
	var f float64
	_ = json.Unmarshal(id, &f)
	if f == 0 {
		f = 0 // -0 too, which the SDK reads as 0 (MCP QA: 0 and -0 passed as two ids, and one was dropped)
	}
	return fmt.Sprintf("n:%v", f)
}

// servedMethods are the methods a client may send that the server answers
// itself (tools), or takes as notifications; the methods of capabilities it
// does not offer are answered -32601 by refuseNotOffered.
var servedMethods = map[string]bool{
	"initialize": true, "ping": true, "tools/list": true, "tools/call": true,
	"notifications/initialized": true, "notifications/cancelled": true, "notifications/progress": true,
	"notifications/roots/list_changed": true,
}

// NeedsID reports whether method is one the server answers as a request
// (the tools' own, ping and initialize, and those of the capabilities it
// does not offer), which a message without an id (none, or null) cannot
// be: the HTTP endpoint's transport refuses one (-32600, "missing id"),
// where over stdio the SDK took it for a notification and left it
// unanswered, the client waiting for good (MCP review).
func NeedsID(method string) bool {
	return (servedMethods[method] && !strings.HasPrefix(method, "notifications/")) || notOfferedMethod(method)
}

// MissingIDMessage is the message of the Invalid Request error refusing a
// request of method without an id (NeedsID), as the HTTP endpoint's
// transport words it.
func MissingIDMessage(method string) string {
	return QuietMessage(fmt.Sprintf("invalid request: missing id for %q", method), jsonrpc.CodeInvalidRequest)
}

// AnswerUnknown readies a body CheckEnvelope passed for the SDK's
// transport, which refuses a whole batch holding one method it does not
// know (MCP QA: 400 with id null, the batch's other requests neither run nor
// answered), where a single such request is answered -32601 under its id. A
// request of a method the server does not serve is sent on as one of a
// capability not offered (resources/list, without its params), which
// refuseNotOffered answers -32601 under the request's id; a notification of
// one is left out, alone as in a batch (a notification has no answer: alone,
// the transport refused it 400, a batch of it was a 202). It answers the
// body to send and whether any message is left in it.
func AnswerUnknown(body []byte) ([]byte, bool) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return body, true
	}
	if trimmed[0] != '[' {
		if id, ok := unknownMethod(trimmed); ok && id == nil {
			return nil, false // a notification of a method not served
		}
		return body, true
	}
	var batch []json.RawMessage
	if json.Unmarshal(trimmed, &batch) != nil {
		return body, true // CheckEnvelope refuses it first
	}
	out := make([]json.RawMessage, 0, len(batch))
	for _, m := range batch {
		switch id, ok := unknownMethod(m); {
		case !ok:
			out = append(out, m)
		case id == nil:
			// a notification of a method not served: no answer
		default:
			unknown, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "resources/list"})
			out = append(out, unknown)
		}
	}
	if len(out) == 0 {
		return nil, false
	}
	rewritten, _ := json.Marshal(out)
	return rewritten, true
}

// unknownMethod reports whether message m is a request or notification of
// a method the server neither serves nor refuses as not offered, with its
// id (nil for a notification).
func unknownMethod(m json.RawMessage) (id json.RawMessage, ok bool) {
	var probe struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
	}
	if json.Unmarshal(m, &probe) != nil || probe.Method == nil || servedMethods[*probe.Method] ||
		notOfferedMethod(*probe.Method) {
		return nil, false
	}
	if len(probe.ID) == 0 || string(probe.ID) == "null" {
		return nil, true
	}
	return probe.ID, true
}

// notOfferedMethod reports whether method belongs to a capability the
// server does not offer (refuseNotOffered answers it).
func notOfferedMethod(method string) bool {
	for _, p := range notOffered {
		if strings.HasPrefix(method, p) {
			return true
		}
	}
	return false
}

package mcpserver

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/getratchet/ratchet/lib/jsonx"
)

// rpcMessages says what each of JSON-RPC 2.0's error codes means.
var rpcMessages = map[int64]string{jsonrpc.CodeParseError: "Parse error", jsonrpc.CodeInvalidRequest: "Invalid Request",
	jsonrpc.CodeMethodNotFound: "Method not found", jsonrpc.CodeInvalidParams: "Invalid params",
	jsonrpc.CodeInternalError: "Internal error"}

// QuietMessage is a transport message without the values it quotes: the
// MCP SDK's messages quote what the caller sent (`unknown tool "…"`, `"…"
// unsupported`, `unmarshaling "{…the whole params…}"`, `header value 'x'
// does not match body value '…'`), and an answer names what is wrong, never
// the value (QA: a payload's secrets came back in the error; tool argument
// refusals already follow the rule). Each quoted span, in double quotes or
// in single quotes that open a word, becomes "…" unless it is one of the
// protocol's own words (a member the message says is missing, a method); a
// message that is nothing but a quote says what its code means.
func QuietMessage(msg string, code int64) string {
	if code == jsonrpc.CodeParseError {
		// The parser's message quotes the input from where it stopped,
		// unquoted ("found invalid token: tok_…"): nothing of it comes
		// back (QA: a lease token did).
		return ParseErrorMessage
	}
	if plainMessages[msg] {
		return msg
	}
	if strings.HasPrefix(msg, undecodedMessage) {
		// It named the SDK's Go types ("cannot unmarshal … into Go
		// struct field jsonrpc2.wireDecode.jsonrpc of type string", MCP
		// QA), where the stdio binary said what was wrong.
		return NotAMessage
	}
	if method, rest, ok := handling(msg); ok {
		if plain, ok := paramsRefusal(method, rest); ok {
			return plain
		}
		// The method the SDK names is one it dispatched: the rest is
		// quieted on its own, so that its quote does not open a span
		// running to a single quote inside a value (MCP review: "it's"
		// in params left what followed it in the clear).
		return "handling '" + method + "': " + QuietMessage(rest, code)
	}
	var b strings.Builder
	for {
		start, end, ok := nextQuote(msg)
		if !ok {
			b.WriteString(msg)
			break
		}
		b.WriteString(msg[:start])
		q := msg[start : start+1]
		if span := msg[start+1 : end]; protocolWords[span] {
			b.WriteString(q + span + q)
		} else {
			b.WriteString(q + "…" + q)
		}
		if end == len(msg) {
			break
		}
		msg = msg[end+1:]
	}
	quiet := strings.TrimSpace(b.String())
	if quiet == "" || quiet == `"…"` || quiet == `'…'` {
		if std, ok := rpcMessages[code]; ok {
			return std
		}
		return "Error"
	}
	return quiet
}

// handling splits the SDK's wrapping of a method's error, "handling
// 'tools/list': …", into the method, when it is one the server serves (or
// refuses as not offered), and the error.
func handling(msg string) (method, rest string, ok bool) {
	after, ok := strings.CutPrefix(msg, "handling '")
	if !ok {
		return "", "", false
	}
	method, rest, ok = strings.Cut(after, "': ")
	if !ok || !(servedMethods[method] || notOfferedMethod(method)) {
		return "", "", false
	}
	return method, rest, true
}

// paramsRefusal says in plain words the SDK's refusal of params it could
// not read: "handling 'tools/list': invalid params: unmarshaling
// "{…the params…}" into a *mcp.ListToolsParams: json: cannot unmarshal
// "{…the rest…}" into Go struct field mcp.ListToolsParams.cursor of type
// string" becomes "Invalid params: params.cursor of tools/list must be a
// string", with neither the values (both quoted spans are read exactly, as
// Go quoted them) nor the Go types it named (MCP review). It is given the
// method and what follows it, as handling split them.
func paramsRefusal(method, rest string) (string, bool) {
	rest, ok := strings.CutPrefix(strings.TrimPrefix(rest, "invalid params: "), "unmarshaling ")
	if !ok {
		return "", false
	}
	params, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", false
	}
	rest = rest[len(params):]
	_, rest, ok = strings.Cut(rest, ": json: cannot unmarshal ")
	if !ok {
		return "", false
	}
	value, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", false
	}
	rest = rest[len(value):]
	if strings.HasPrefix(rest, " into Go value of type ") {
		return "Invalid params: the params of " + method + " must be a JSON object", true
	}
	rest, ok = strings.CutPrefix(rest, " into Go struct field ")
	if !ok {
		return "", false
	}
	field, goType, ok := strings.Cut(rest, " of type ")
	if !ok {
		return "", false
	}
	// The field is the Go struct's name, then the JSON names down to the
	// member (mcp.initializeParamsV2mcp.Implementation.clientInfo.name):
	// what follows the last name of a Go type, which starts upper case.
	parts := strings.Split(field, ".")
	from := 0
	for i, p := range parts {
		if p != "" && unicode.IsUpper(rune(p[0])) {
			from = i + 1
		}
	}
	path := "a member of the params"
	if from > 0 && from < len(parts) {
		path = "params." + strings.Join(parts[from:], ".")
	}
	return "Invalid params: " + path + " of " + method + " " + mustBe(goType), true
}

// mustBe says what JSON a Go type takes.
func mustBe(goType string) string {
	switch t := strings.TrimPrefix(goType, "*"); {
	case t == "string":
		return "must be a string"
	case t == "bool":
		return "must be true or false"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"), strings.HasPrefix(t, "float"):
		return "must be a number"
	case strings.HasPrefix(t, "[]"):
		return "must be an array"
	case strings.HasPrefix(t, "map["), strings.HasPrefix(t, "mcp."), strings.HasPrefix(t, "struct"):
		return "must be an object"
	}
	return "has the wrong type"
}

// nextQuote finds the first quoted span of s: the index of its opening
// quote and of its closing one (len(s) when a double quote is not closed).
// A single quote opens a span only at the start of a word (an apostrophe,
// can't, quotes nothing), and the span runs to the message's last single
// quote: the SDK writes values into '%s' unescaped, so a value holding
// "' " would close a shorter span early and leave its rest in the clear
// (review). Words between two quoted values are lost with them.
func nextQuote(s string) (start, end int, ok bool) {
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '"':
			return i, closingQuote(s, i+1), true
		case s[i] == '\'' && (i == 0 || strings.IndexByte(" ([{=:", s[i-1]) >= 0):
			if last := strings.LastIndexByte(s, '\''); last > i {
				return i, last, true
			}
		}
	}
	return 0, 0, false
}

// closingQuote is the index of the double quote ending a quoted span whose
// text starts at i (a backslash escapes the next byte, as %q writes), or
// len(s) when it is not closed.
func closingQuote(s string, i int) int {
	for ; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(s)
}

// undecodedMessage opens the HTTP transport's refusal of a message it could
// not decode: a jsonrpc other than "2.0", a method that is not a string, an
// error that is not an object of an integer code and a string message.
const undecodedMessage = "malformed payload: "

// NotAMessage answers a message the SDK cannot decode (undecodedMessage),
// over HTTP and stdio alike.
const NotAMessage = `Invalid Request: not a JSON-RPC 2.0 message (jsonrpc is "2.0" and method a string; an error ` +
	"is an object with an integer code and a string message)"

// ParseErrorMessage answers a message that is not JSON, over HTTP and
// stdio alike.
const ParseErrorMessage = "Parse error: the message is not JSON"

// plainMessages are the transport's messages that quote only the protocol's
// own values, kept whole (QA: the Accept rule lost both media types, its
// quotes being taken for one span).
var plainMessages = map[string]bool{"Accept must contain both 'application/json' and 'text/event-stream'": true}

// protocolWords are the JSON-RPC and MCP member names a transport message
// may quote and keep: they name what is wrong, and hold no value of the
// caller's.
var protocolWords = map[string]bool{"jsonrpc": true, "id": true, "method": true, "params": true, "name": true,
	"arguments": true, "_meta": true, "protocolVersion": true, "capabilities": true, "clientInfo": true,
	"cursor": true, "uri": true, "2.0": true, "io.modelcontextprotocol/protocolVersion": true,
	"io.modelcontextprotocol/clientCapabilities": true, "io.modelcontextprotocol/clientInfo": true,
	// The methods the server serves, named by a message about their headers
	// or their phase (QA: "missing required Mcp-Name header for method" hid
	// which method needs it).
	"initialize": true, "ping": true, "tools/list": true, "tools/call": true, "notifications/initialized": true}

// quietData is what an error's data may carry back: only members that hold
// no value of the caller's (the protocol versions the server supports); the
// rest quoted a resource's uri or the version asked for (review).
func quietData(data json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if len(data) == 0 || json.Unmarshal(data, &m) != nil {
		return nil
	}
	if supported, ok := m["supported"]; ok {
		out, _ := jsonx.Marshal(map[string]json.RawMessage{"supported": supported})
		return out
	}
	return nil
}

// codeOfUncoded is the code of an error the SDK answered without one: its
// initialize reads its params itself and, unlike every other method's,
// leaves a params it cannot read uncoded (MCP QA: `"protocolVersion": 5`
// answered -32600), so that one is Invalid params; the rest (a call made
// before initialize) Invalid Request.
func codeOfUncoded(message string) int64 {
	if strings.HasPrefix(message, "handling 'initialize': ") &&
		(strings.Contains(message, ": unmarshaling ") || strings.Contains(message, `missing required "params"`)) {
		return jsonrpc.CodeInvalidParams
	}
	return jsonrpc.CodeInvalidRequest
}

// QuietErrors quiets the message of each JSON-RPC error in an answer (one
// response or a batch of them) with QuietMessage, keeps only quietData of
// its data, and gives an error without a code its code (codeOfUncoded). An answer with no
// error, or one that is not JSON-RPC, is returned as it is. Both
// transports write their answers through it.
func QuietErrors(answer []byte) []byte {
	if !bytes.Contains(answer, []byte(`"error"`)) {
		return answer
	}
	var batch []map[string]json.RawMessage
	single := json.Unmarshal(answer, &batch) != nil
	if single {
		var one map[string]json.RawMessage
		if json.Unmarshal(answer, &one) != nil {
			return answer
		}
		batch = []map[string]json.RawMessage{one}
	}
	changed := false
	for _, m := range batch {
		var e struct {
			Code    int64           `json:"code"`
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data,omitempty"`
		}
		if m["error"] == nil || json.Unmarshal(m["error"], &e) != nil {
			continue
		}
		code := e.Code
		if code == 0 {
			// The SDK's bare "context canceled" of a request cancelled
			// before it was handled is never among them: only a
			// notifications/cancelled cancels such a request, and a
			// cancelled request is not answered (LeaveOutCancelled; the
			// stdio binary drops its answer).
			code = codeOfUncoded(e.Message)
		}
		quiet, data := QuietMessage(e.Message, code), quietData(e.Data)
		if code == e.Code && quiet == e.Message && bytes.Equal(data, e.Data) {
			continue
		}
		e.Code, e.Message, e.Data = code, quiet, data
		m["error"], _ = jsonx.Marshal(e)
		changed = true
	}
	if !changed {
		return answer
	}
	var out []byte
	if single {
		out, _ = jsonx.Marshal(batch[0])
	} else {
		out, _ = jsonx.Marshal(batch)
	}
	return out
}

package mcpserver

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/stretchr/testify/require"
)

// The transport's messages keep what they say and lose what the caller sent.
func TestQuietMessageKeepsProtocolWordsOnly(t *testing.T) {
	for msg, want := range map[string]string{
		`unknown tool "sk_live_SECRET"`:                                            `unknown tool "…"`,
		`"sk_live_SECRET" unsupported`:                                             `"…" unsupported`,
		`"sk_live_SECRET"`:                                                         "Invalid params",
		`invalid request: missing required "params"`:                               `invalid request: missing required "params"`,
		`unmarshaling "{\"a\":\"sk_live_SECRET\"}" into a T`:                       `unmarshaling "…" into a T`,
		`unterminated "sk_live_SECRET`:                                             `unterminated "…"`,
		`missing or invalid _meta field "io.modelcontextprotocol/protocolVersion"`: `missing or invalid _meta field "io.modelcontextprotocol/protocolVersion"`,
		// QA: single quotes came back as sent; the protocol's own names were hidden.
		`header mismatch: Mcp-Name header value 'x' does not match body value 'sk_live_SECRET'`: `header mismatch: Mcp-Name header value '…'`,
		// A value holding "' " does not close its span early (review).
		`header value 'x' sk_live_SECRET' does not match body value 'y'`:      `header value '…'`,
		`bad header: 'sk_live_SECRET' (can't be read)`:                        `bad header: '…'t be read)`,
		`the server can't take it, it isn't JSON`:                             `the server can't take it, it isn't JSON`,
		`missing or invalid _meta field "io.modelcontextprotocol/clientInfo"`: `missing or invalid _meta field "io.modelcontextprotocol/clientInfo"`,
		`missing required Mcp-Name header for method "tools/call"`:            `missing required Mcp-Name header for method "tools/call"`,
		`missing required Mcp-Name header for method "sk_live_SECRET"`:        `missing required Mcp-Name header for method "…"`,
		// QA: the rule's media types and the version expected were hidden.
		`Accept must contain both 'application/json' and 'text/event-stream'`: `Accept must contain both 'application/json' and 'text/event-stream'`,
		`invalid message version tag "sk_live_SECRET"; expected "2.0"`:        `invalid message version tag "…"; expected "2.0"`,
	} {
		require.Equal(t, want, QuietMessage(msg, jsonrpc.CodeInvalidParams), msg)
	}
	// The parser quotes the input where it stopped, unquoted (QA).
	require.Equal(t, ParseErrorMessage, QuietMessage(`unmarshaling jsonrpc message: json: expected '…' but found `+
		`invalid token: tok_SECRET, "outcome"`, jsonrpc.CodeParseError))
	require.Equal(t, json.RawMessage(`{"supported":["2025-06-18"]}`),
		quietData(json.RawMessage(`{"supported":["2025-06-18"],"requested":"sk_live_SECRET"}`)))
	require.Nil(t, quietData(json.RawMessage(`{"uri":"file:///sk_live_SECRET"}`)))
}

// The SDK's refusal of params it could not read is said in plain words,
// with neither the params nor the Go types: a single quote inside a value
// ("it's") closed the span that the method's quote opened, and what
// followed it came back in the clear (MCP review).
func TestAParamsRefusalSaysWhichMemberInPlainWords(t *testing.T) {
	const secret = "sk_live_SECRET"
	refusal := func(method, params, rest, tail string) string {
		return "handling '" + method + "': invalid params: unmarshaling " + strconv.Quote(params) +
			" into a *mcp.T: json: cannot unmarshal " + strconv.Quote(rest) + " into Go " + tail
	}
	for msg, want := range map[string]string{
		refusal("tools/list", `{"cursor":5,"x":"it's `+secret+`"}`, `5,"x":"it's `+secret+`"}`,
			"struct field mcp.ListToolsParams.cursor of type string"): "Invalid params: params.cursor of tools/list must be a string",
		refusal("tools/call", `{"name":"a","_meta":"it's `+secret+`"}`, `"it's `+secret+`"}`,
			"struct field mcp.CallToolParamsRaw._meta of type map[string]interface {}"): "Invalid params: params._meta of tools/call must be an object",
		refusal("ping", `"it's `+secret+`"`, `"it's `+secret+`"`,
			"value of type mcp.PingParams"): "Invalid params: the params of ping must be a JSON object",
		"handling 'initialize': unmarshaling " + strconv.Quote(`{"clientInfo":{"name":5},"x":"it's `+secret+`"}`) +
			" into a *mcp.initializeParamsV2: json: cannot unmarshal " + strconv.Quote(`5},"x":"it's `+secret+`"}`) +
			" into Go struct field mcp.initializeParamsV2mcp.Implementation.clientInfo.name of type string": "Invalid params: params.clientInfo.name of initialize must be a string",
		// Another error of a method: quieted after the method, on its own.
		"handling 'tools/call': bad " + strconv.Quote(`it's `+secret): `handling 'tools/call': bad "…"`,
	} {
		got := QuietMessage(msg, jsonrpc.CodeInvalidParams)
		require.Equal(t, want, got, msg)
		require.NotContains(t, got, secret)
	}
}

// A call before initialize is answered by the SDK with code 0, which no
// client reads as an error class: it becomes Invalid Request.
func TestQuietErrorsGivesACodelessErrorOne(t *testing.T) {
	got := QuietErrors([]byte(`{"jsonrpc":"2.0","id":1,"error":{"code":0,"message":"method \"tools/call\" is invalid during session initialization"}}`))
	var out struct {
		Error struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(got, &out), "%s", got)
	require.EqualValues(t, jsonrpc.CodeInvalidRequest, out.Error.Code)
	require.Equal(t, `method "tools/call" is invalid during session initialization`, out.Error.Message, "a method the server serves is named")
	same := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"{\"error\":1}"}]}}`)
	require.Equal(t, same, QuietErrors(same), "a result is written as it is")
}

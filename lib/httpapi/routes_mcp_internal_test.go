package httpapi

import (
	"encoding/json"
	"testing"

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
	} {
		require.Equal(t, want, quietMessage(msg, rpcInvalidParams), msg)
	}
	require.Equal(t, json.RawMessage(`{"supported":["2025-06-18"]}`),
		quietData(json.RawMessage(`{"supported":["2025-06-18"],"requested":"sk_live_SECRET"}`)))
	require.Nil(t, quietData(json.RawMessage(`{"uri":"file:///sk_live_SECRET"}`)))
}

package mcpserver_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/mcpserver"
)

// A message whose id its answer could not carry back exactly is refused
// (BadIDMessage); every other is not refused for its id.
func TestEnvelopeRefusesIDsItCannotAnswer(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]bool{
		`{"jsonrpc":"2.0","id":1,"method":"ping"}`:                                              true,
		`{"jsonrpc":"2.0","id":"12345678901234567890","method":"ping"}`:                         true,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`:                                true,
		`{"jsonrpc":"2.0","id":null,"method":"ping"}`:                                           true, // the SDK's to refuse
		`{"jsonrpc":"2.0","id":9007199254740991,"method":"ping"}`:                               true,
		`{"jsonrpc":"2.0","id":-9007199254740991,"method":"ping"}`:                              true,
		`{"jsonrpc":"2.0","id":9007199254740992,"method":"ping"}`:                               false,
		`{"jsonrpc":"2.0","id":12345678901234567890,"method":"ping"}`:                           false,
		`{"jsonrpc":"2.0","id":1.5,"method":"ping"}`:                                            false,
		`{"jsonrpc":"2.0","id":1e2,"method":"ping"}`:                                            true, // 100, as the SDK answers it
		`{"jsonrpc":"2.0","id":7.0,"method":"ping"}`:                                            true,
		`{"jsonrpc":"2.0","id":10e-1,"method":"ping"}`:                                          true,
		`{"jsonrpc":"2.0","id":-0,"method":"ping"}`:                                             true,
		`{"jsonrpc":"2.0","id":0e999999999999,"method":"ping"}`:                                 true,
		`{"jsonrpc":"2.0","id":1e999999999999,"method":"ping"}`:                                 false,
		`{"jsonrpc":"2.0","id":1e-999999999999,"method":"ping"}`:                                false,
		`{"jsonrpc":"2.0","id":90071992547409.91e2,"method":"ping"}`:                            true,
		`{"jsonrpc":"2.0","id":90071992547409.92e2,"method":"ping"}`:                            false,
		`{"jsonrpc":"2.0","id":7.25e1,"method":"ping"}`:                                         false,
		`{"jsonrpc":"2.0","id":0.5,"method":"ping"}`:                                            false,
		`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}]`:   true,
		`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2.5,"method":"ping"}]`: false,
		`{"jsonrpc":"2.0","id":true,"method":"ping"}`:                                           false,
		`{"jsonrpc":"2.0","id":false,"method":"ping"}`:                                          false,
		`{"jsonrpc":"2.0","id":{},"method":"ping"}`:                                             false,
		`{"jsonrpc":"2.0","id":["1"],"method":"ping"}`:                                          false,
		`[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":{},"method":"ping"}]`:  false,
		`{"jsonrpc":"2.0","ID":7.5,"method":"ping"}`:                                            true, // no id to the SDK: a notification
		`not json`: true, // a parse error
		// A string id is answered as encoding/json reads it: bytes that
		// are not UTF-8 and a lone surrogate escape come back as U+FFFD
		// (MCP QA: "\ud800" was answered "\ufffd"), so they are refused.
		`{"jsonrpc":"2.0","id":"\ud800","method":"ping"}`:                                                   false,
		`{"jsonrpc":"2.0","id":"a\udc00","method":"ping"}`:                                                  false,
		`{"jsonrpc":"2.0","id":"\uD800\u0041","method":"ping"}`:                                             false,
		`{"jsonrpc":"2.0","id":"\udbff\ud800","method":"ping"}`:                                             false,
		"{\"jsonrpc\":\"2.0\",\"id\":\"k\xff\",\"method\":\"ping\"}":                                        false,
		`[{"jsonrpc":"2.0","id":"\ud800","method":"ping"},{"jsonrpc":"2.0","id":"\udbff","method":"ping"}]`: false,
		`{"jsonrpc":"2.0","id":"\ud83d\ude00","method":"ping"}`:                                             true, // a pair: one character
		`{"jsonrpc":"2.0","id":"\uD83D\uDE00x","method":"ping"}`:                                            true,
		`{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}`:                                                  true, // a backslash, then text
		`{"jsonrpc":"2.0","id":"\ufffd é","method":"ping"}`:                                                 true,
		`{"jsonrpc":"2.0","id":"a\u0000b\n","method":"ping"}`:                                               true,
	} {
		e := mcpserver.CheckEnvelope([]byte(body))
		require.Equal(t, !want, e != nil && e.Message == mcpserver.BadIDMessage, "%s: %v", body, e)
	}
}

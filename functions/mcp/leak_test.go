package main

import (
	"fmt"
	"testing"

	"github.com/getratchet/ratchet/lib/apitest"
)

// The stdio binary's stderr, its log, holds nothing a client chose (lib/
// sdktest's TestNothingUserControlledIsLogged, through the binary): a
// marked begin cancelled after it was granted, whose lease the binary
// gives back and says so; a report of a marked result under a token not
// its own; reads, a resolve and a decision of marked ids with marked
// notes; a tool and a method that do not exist, arguments the schema
// refuses, and lines that are not JSON-RPC, all marked.
func TestStdioLogsNothingUserControlled(t *testing.T) {
	b := startStdioBinary(t)
	n := 0
	c := func(label string) string { n++; return apitest.Marked(label, n) }
	grant := b.beginCancelled(c("key"))
	calls := []string{
		`{"name":"ratchet_report","arguments":{"effect_id":%q,"lease_token":%q,"outcome":"succeeded","result":{"id":%q}}}`,
		`{"name":"ratchet_get_effect","arguments":{"effect_id":%q,"x":%q,"y":%q}}`,
		`{"name":"ratchet_resolve","arguments":{"effect_id":%q,"outcome":"succeeded","note":%q,"result":{"r":%q}}}`,
		`{"name":"ratchet_decide_approval","arguments":{"approval_id":%q,"decision":"approve","note":%q,"x":%q}}`,
		`{"name":%q,"arguments":{"x":%q,"y":%q}}`,
	}
	for i, params := range calls {
		id := fmt.Sprint(10 + i)
		b.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":` +
			fmt.Sprintf(params, c("a"), c("b"), c("c")) + `}`)
		b.waitFor(id)
	}
	b.send(`{"jsonrpc":"2.0","id":20,"method":"` + c("method") + `"}`)
	b.waitFor("20")
	b.send(c("notjson"))
	b.send(`{"jsonrpc":"2.0","id":"` + c("id") + `","method":"tools/call","params":"` + c("params") + `"}`)
	b.send(`{"jsonrpc":"2.0","id":21,"method":"ping"}`)
	b.waitFor("21")
	b.end()
	apitest.RequireNoLeak(t, b.stderr.String(), []string{b.agent, b.operator, grant.LeaseToken}, "reported failed")
}

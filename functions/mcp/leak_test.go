package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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

// Against a server that does not answer, each marked call's failure is
// answered to the client, never written to stderr.
func TestStdioLogsNothingUserControlledWhenTheServerIsDown(t *testing.T) {
	n := 0
	c := func(label string) string { n++; return apitest.Marked(label, n) }
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RATCHET_MCP_MAIN=1", "RATCHET_API_KEY=rk_test", "RATCHET_BASE_URL=http://127.0.0.1:1")
	lines := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
	}
	for i, params := range []string{
		`{"name":"ratchet_begin","arguments":{"effect_type":"push.send","idempotency_key":%q,"payload":{"to":%q}}}`,
		`{"name":"ratchet_get_effect","arguments":{"effect_id":%q}}`,
		`{"name":"ratchet_report","arguments":{"effect_id":%q,"lease_token":%q,"outcome":"succeeded"}}`,
	} {
		lines = append(lines, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":`+params+`}`, 10+i,
			c("a"), c("b")))
	}
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s", stderr.String())
	require.Contains(t, string(out), "did not answer", "the calls failed: %s", out)
	require.NotContains(t, strings.ToLower(stderr.String()), apitest.Mark, "%s", stderr.String())
}

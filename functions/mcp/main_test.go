package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if os.Getenv("RATCHET_MCP_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A client that writes its requests and closes stdin gets every answer
// before the server exits (it got none: the SDK's stdio connection closed
// at EOF and dropped them). The tool call's server is unreachable, so its
// answer is an error, but an answer all the same.
func TestStdioAnswersEveryRequestBeforeExitingAtEOF(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "RATCHET_MCP_MAIN=1", "RATCHET_API_KEY=rk_test", "RATCHET_BASE_URL=http://127.0.0.1:1")
	cmd.Stdin = strings.NewReader(strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ratchet_get_effect","arguments":{"effect_id":"eff_01m8pmb3zz6rde8gy8bspp92fs"}}}`,
	}, "\n") + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ratchet-mcp: %v", err)
	}
	ids := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m struct {
			ID json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not JSON-RPC: %s", sc.Text())
		}
		ids[string(m.ID)] = true
	}
	for _, id := range []string{"1", "2", "3"} {
		if !ids[id] {
			t.Errorf("request %s was not answered; got %s", id, out)
		}
	}
}

func TestRequestsAndAnswersAreTracked(t *testing.T) {
	for _, c := range []struct {
		line              string
		requests, answers []string
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, []string{"1"}, nil},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil, nil},
		{`{"jsonrpc":"2.0","ID":7,"method":"tools/list"}`, nil, nil}, // a notification to the SDK
		{`{"jsonrpc":"2.0","id":"a","result":{}}`, nil, []string{`"a"`}},
		{`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}`, nil, nil},
		{`[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"},{"jsonrpc":"2.0","id":2,"method":"c"}]`,
			[]string{"1", "2"}, nil},
		{`not json`, nil, nil},
	} {
		if got := requestIDs([]byte(c.line)); !slices.Equal(got, c.requests) {
			t.Errorf("requestIDs(%s) = %v, want %v", c.line, got, c.requests)
		}
		if got := answerIDs([]byte(c.line)); !slices.Equal(got, c.answers) {
			t.Errorf("answerIDs(%s) = %v, want %v", c.line, got, c.answers)
		}
	}
}

// A last request without its newline is answered too (review: the SDK read
// and handled it, but the drain did not wait for it).
func TestStdioAnswersALastRequestWithoutNewline(t *testing.T) {
	for _, input := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
	} {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "RATCHET_MCP_MAIN=1", "RATCHET_API_KEY=rk_test", "RATCHET_BASE_URL=http://127.0.0.1:1")
		cmd.Stdin = strings.NewReader(input)
		start := time.Now()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("ratchet-mcp: %v", err)
		}
		if !strings.Contains(string(out), `"id":1`) {
			t.Errorf("initialize was not answered: %q", out)
		}
		if waited := time.Since(start); waited > 30*time.Second {
			t.Errorf("exit took %s: it waited for an answer that was not coming", waited)
		}
	}
}

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/mcpserver"
)

func TestMain(m *testing.M) {
	if os.Getenv("RATCHET_MCP_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(apitest.Main(m)) // a real server for the tests that call one
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

// newTestPipes is a drain whose stdout is out; its stdin is fed through
// read.
func newTestPipes(out *bytes.Buffer) *drainingPipes {
	d := newDrainingPipes(nil, nopCloser{out})
	d.timeout = time.Hour
	return d
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// Every line the transport can take is passed on, its request tracked under
// the id the SDK reads; any other line is answered here with a JSON-RPC
// error and never reaches the transport, which would end the connection on
// it (QA: a stray line dropped a begin's answer, and its lease).
func TestLinesAreAdmittedOrRefused(t *testing.T) {
	for _, c := range []struct {
		line    string
		pending []string
		refusal string // the error answer written, when refused
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, []string{"int64:1"}, ""},
		{`{"jsonrpc":"2.0","id":"a\u0062","method":"ping"}`, []string{"string:ab"}, ""},
		{`{"jsonrpc":"2.0","id":1.0,"method":"ping"}`, []string{"int64:1"}, ""},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil, ""},
		// A request without an id, which the SDK took for a notification
		// and left unanswered (MCP review): refused, as the HTTP endpoint
		// refuses it. "ID" is not "id" to the SDK.
		{`{"jsonrpc":"2.0","ID":7,"method":"tools/list"}`, nil,
			`{"error":{"code":-32600,"message":"invalid request: missing id for \"tools/list\""},"id":null,"jsonrpc":"2.0"}`},
		{`{"jsonrpc":"2.0","id":null,"method":"ping"}`, nil,
			`{"error":{"code":-32600,"message":"invalid request: missing id for \"ping\""},"id":null,"jsonrpc":"2.0"}`},
		{`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"ratchet_begin","arguments":{}}}`, nil,
			`{"error":{"code":-32600,"message":"invalid request: missing id for \"tools/call\""},"id":null,"jsonrpc":"2.0"}`},
		{`{"jsonrpc":"2.0","id":null,"method":"resources/list"}`, nil,
			`{"error":{"code":-32600,"message":"invalid request: missing id for \"…\""},"id":null,"jsonrpc":"2.0"}`},
		{`{"jsonrpc":"2.0","id":null,"method":"x/unknown"}`, nil, ""}, // a notification of a method no one serves
		{`{"jsonrpc":"2.0","id":"a","result":{}}`, nil, ""},
		{`{oops`, nil, `{"error":{"code":-32700,"message":"Parse error: the message is not JSON"},"id":null,"jsonrpc":"2.0"}`},
		{`{"jsonrpc":"2.0","id":1}{"jsonrpc":"2.0","id":2}`, nil,
			`{"error":{"code":-32700,"message":"Parse error: the message is not JSON"},"id":null,"jsonrpc":"2.0"}`},
		{`"str"`, nil, `{"error":{"code":-32600,"message":"Invalid Request: a message is a JSON object"},"id":null,"jsonrpc":"2.0"}`},
		{`{"foo":1}`, nil, `{"error":{"code":-32600,"message":"Invalid Request: a message is a request, a notification (method) or a response (result or error)"},"id":null,"jsonrpc":"2.0"}`},
		// The envelope is checked as a REST body is (MCP QA: the last of
		// two names ran; an initialize without its version was taken).
		{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a","name":"b"}}`, nil,
			`{"error":{"code":-32600,"message":"Invalid Request: params: \"name\" is named twice"},"id":null,"jsonrpc":"2.0"}`},
		{`{"jsonrpc":"2.0","id":4,"method":"initialize","params":{}}`, nil,
			`{"error":{"code":-32602,"message":"Invalid params: initialize needs protocolVersion, a string"},"id":4,"jsonrpc":"2.0"}`},
		// A request that is a response too ran as the request (MCP QA); a
		// tools/call without params is Invalid params under its id.
		{`{"jsonrpc":"2.0","id":5,"method":"ping","result":{}}`, nil,
			`{"error":{"code":-32600,"message":"Invalid Request: a message is a request or notification (method), or a response (result or error), never two of them"},"id":null,"jsonrpc":"2.0"}`},
		{`{"jsonrpc":"2.0","id":5,"method":"tools/call"}`, nil,
			`{"error":{"code":-32602,"message":"Invalid params: tools/call needs params, an object naming the tool"},"id":5,"jsonrpc":"2.0"}`},
		{`{"jsonrpc":"1.0","id":6,"method":"ping"}`, nil,
			`{"error":{"code":-32600,"message":` + strconv.Quote(mcpserver.NotAMessage) + `},"id":6,"jsonrpc":"2.0"}`},
		// An id of another type says what an id may be, as over HTTP.
		{`{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, nil,
			`{"error":{"code":-32600,"message":"` + mcpserver.BadIDMessage + `"},"id":null,"jsonrpc":"2.0"}`},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, nil,
			`{"error":{"code":-32600,"message":"Invalid Request: JSON-RPC batches are not supported"},"id":null,"jsonrpc":"2.0"}`},
		{`[]`, nil, `{"error":{"code":-32600,"message":"Invalid Request: JSON-RPC batches are not supported"},"id":null,"jsonrpc":"2.0"}`},
		// The SDK read 7.5 as the 7 still in progress and never answered it (MCP QA).
		{`{"jsonrpc":"2.0","id":7.5,"method":"ping"}`, nil,
			`{"error":{"code":-32600,"message":"` + mcpserver.BadIDMessage + `"},"id":null,"jsonrpc":"2.0"}`},
		{`{"jsonrpc":"2.0","id":12345678901234567890,"method":"ping"}`, nil,
			`{"error":{"code":-32600,"message":"` + mcpserver.BadIDMessage + `"},"id":null,"jsonrpc":"2.0"}`},
	} {
		var out bytes.Buffer
		d := newTestPipes(&out)
		d.read([]byte(c.line+"\n"), false)
		if got := slices.Sorted(maps.Keys(d.pending)); !slices.Equal(got, c.pending) {
			t.Errorf("%s: pending %v, want %v", c.line, got, c.pending)
		}
		if c.refusal == "" {
			if string(d.ready) != c.line+"\n" || out.Len() != 0 {
				t.Errorf("%s: passed on %q, answered %q; want it passed on", c.line, d.ready, out.String())
			}
		} else if len(d.ready) != 0 || out.String() != c.refusal+"\n" {
			t.Errorf("%s: passed on %q, answered %q; want %s", c.line, d.ready, out.String(), c.refusal)
		}
	}
}

// A request under an id still in progress is refused with that id, not
// passed on: the SDK dropped it unanswered, and the client waited for good
// (MCP QA). Once the first is answered, the id may be used again.
func TestAnIDInProgressIsRefused(t *testing.T) {
	var out bytes.Buffer
	d := newTestPipes(&out)
	first := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"ratchet_begin"}}`
	d.read([]byte(first+"\n"+`{"jsonrpc":"2.0","id":5.0,"method":"ping"}`+"\n"), false)
	if string(d.ready) != first+"\n" {
		t.Fatalf("passed on %q; want only the first", d.ready)
	}
	// Under id null: under 5 it would read as the first request's answer.
	want := `{"error":{"code":-32600,"message":"Invalid Request: a request under this id is still in progress"},"id":null,"jsonrpc":"2.0"}` + "\n"
	if out.String() != want {
		t.Fatalf("answered %q; want %q", out.String(), want)
	}
	d.ready = nil
	d.wrote([]byte(`{"jsonrpc":"2.0","id":5,"result":{}}` + "\n"))
	d.read([]byte(`{"jsonrpc":"2.0","id":5,"method":"ping"}`+"\n"), false)
	if len(d.ready) == 0 {
		t.Fatalf("the id answered was refused again: %q", out.String())
	}
}

// An answer settles its request however the client spelt the id: the SDK
// answers "a\u0062" as "ab" and 10e-1 as 1 (QA: such a last request made
// the process wait its 90 s at EOF).
func TestAnswersSettleRequestsWhateverTheIDsSpelling(t *testing.T) {
	for request, answer := range map[string]string{
		`"a\u0062"`: `"ab"`, `1.0`: `1`, `10e-1`: `1`, `-0`: `0`, `"x"`: `"x"`, `42`: `42`,
	} {
		var out bytes.Buffer
		d := newTestPipes(&out)
		d.read([]byte(`{"jsonrpc":"2.0","id":`+request+`,"method":"ping"}`), true) // the last line, without its newline
		if len(d.pending) != 1 {
			t.Fatalf("id %s: pending %v", request, d.pending)
		}
		d.wrote([]byte(`{"jsonrpc":"2.0","id":` + answer + `,"result":{}}` + "\n"))
		if len(d.pending) != 0 {
			t.Errorf("id %s answered as %s: still pending %v", request, answer, d.pending)
		}
	}
}

// A line longer than the limit is refused once and dropped to its end; the
// lines after it are read as usual.
func TestAnOverlongLineIsRefused(t *testing.T) {
	var out bytes.Buffer
	d := newTestPipes(&out)
	d.maxLine = 64
	long := `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"` + strings.Repeat("x", 100) + `"}}`
	d.read([]byte(long[:40]), false)
	d.read([]byte(long[40:80]), false)
	d.read([]byte(long[80:]+"\n"+`{"jsonrpc":"2.0","id":2,"method":"ping"}`+"\n"), false)
	if !strings.Contains(out.String(), `"code":-32600`) || strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("answered %q; want one refusal", out.String())
	}
	// The refusal names the request's id, read from the start of its line
	// (QA: it said null).
	if !strings.Contains(out.String(), `"id":1,`) {
		t.Fatalf("answered %q; want id 1", out.String())
	}
	if string(d.ready) != `{"jsonrpc":"2.0","id":2,"method":"ping"}`+"\n" || d.pending["int64:2"] == nil || len(d.pending) != 1 {
		t.Fatalf("passed on %q, pending %v", d.ready, d.pending)
	}
}

// An id is read from a line's start only when it is there whole: before
// the cut, at the top level, a string or an integer.
func TestLeadingID(t *testing.T) {
	for prefix, want := range map[string]any{
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"a":"xxx`:   int64(7),
		`{"id":"req-1","jsonrpc":"2.0"`:                                      "req-1",
		`{"jsonrpc":"2.0","method":"tools/call","params":{"id":3,"pad":"xx`:  nil, // not top level, and cut
		`{"jsonrpc":"2.0","method":"tools/call","params":{"pad":"xx","id":3`: nil,
		`{"jsonrpc":"2.0","id":12`:                                           nil, // the number may go on
		`{"jsonrpc":"2.0","id":1.5,"method":"x"`:                             nil,
		`{"jsonrpc":"2.0","id":null,"method":"x"`:                            nil,
		`[{"jsonrpc":"2.0","id":1`:                                           nil,
		`{"jsonrpc":"2.0","id":"abc`:                                         nil,
		// Answered under another id: the decoder reads them as U+FFFD.
		`{"jsonrpc":"2.0","id":"\ud800","method":"x"`:            nil,
		"{\"jsonrpc\":\"2.0\",\"id\":\"k\xff\",\"method\":\"x\"": nil,
		`{"jsonrpc":"2.0","id":"\ud83d\ude00","method":"x"`:      "\U0001F600",
	} {
		if got := leadingID([]byte(prefix)); got != want {
			t.Errorf("%s: got %#v, want %#v", prefix, got, want)
		}
	}
}

// The stdio server keeps serving after lines it cannot take, answering
// each with an error, and answers the requests around them.
func TestStdioAnswersAroundMalformedLines(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "RATCHET_MCP_MAIN=1", "RATCHET_API_KEY=rk_test", "RATCHET_BASE_URL=http://127.0.0.1:1")
	cmd.Stdin = strings.NewReader(strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{oops`, `"str"`, `{"foo":1}`, `[{"jsonrpc":"2.0","id":5,"method":"ping"}]`, `{"jsonrpc":"1.0","id":6,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":"a\u0062","method":"ping"}`,
		`{"jsonrpc":"2.0","id":9,"method":"ping"}`,
	}, "\n") + "\n")
	out, answers := stdioAnswers(t, cmd)
	var results, errs []string
	for _, m := range answers {
		if m.Error != nil {
			errs = append(errs, fmt.Sprintf("%s:%d", m.ID, m.Error.Code))
		} else {
			results = append(results, string(m.ID))
		}
	}
	// The transport answers requests concurrently: the two pings' answers
	// come in either order (CI saw both).
	slices.Sort(results)
	if !slices.Equal(results, []string{`"ab"`, "1", "9"}) {
		t.Errorf("results for %v; want 1, \"ab\" and 9 (output %s)", results, out)
	}
	if !slices.Equal(errs, []string{"null:-32700", "null:-32600", "null:-32600", "null:-32600", "6:-32600"}) {
		t.Errorf("errors %v (output %s)", errs, out)
	}
}

// A last request without its newline is answered too (review: the SDK read
// and handled it, but the drain did not wait for it), and the drain gives
// up no request (it once waited its 90 s for one the SDK had answered
// before stdin's EOF was read).
func TestStdioAnswersALastRequestWithoutNewline(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "RATCHET_MCP_MAIN=1", "RATCHET_API_KEY=rk_test", "RATCHET_BASE_URL=http://127.0.0.1:1")
	cmd.Stdin = strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ratchet-mcp: %v (stderr %q)", err, stderr.String())
	}
	if !strings.Contains(string(out), `"id":1`) {
		t.Errorf("initialize was not answered: %q", out)
	}
	if strings.Contains(stderr.String(), "unanswered") {
		t.Errorf("the drain gave up a request: %q", stderr.String())
	}
}

const (
	initializeLine = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}`
	answerLine     = `{"jsonrpc":"2.0","id":1,"result":{}}` + "\n"
)

// Requests are pending from their line until their answer, split writes
// and reads included, and EOF waits for the ones still pending.
func TestDrainWaitsForEveryRequestRead(t *testing.T) {
	d := newDrainingPipes(nil, nil)
	d.timeout = time.Hour
	d.read([]byte(initializeLine[:10]), false)
	d.read([]byte(initializeLine[10:]+"\n"+`{"jsonrpc":"2.0","id":"b","method":"tools/list"}`+"\n"), false)
	if d.pending["int64:1"] == nil || d.pending["string:b"] == nil || len(d.pending) != 2 {
		t.Fatalf("pending %v; want 1 and \"b\"", d.pending)
	}
	d.wrote([]byte(answerLine[:5]))
	d.wrote([]byte(answerLine[5:]))
	done := make(chan struct{})
	go func() {
		d.read(nil, true)
		d.waitAnswered()
		close(done)
	}()
	select { // a wait that ended with "b" unanswered would show here
	case <-done:
		t.Fatal("the wait at EOF ended with a request unanswered")
	case <-time.After(50 * time.Millisecond):
	}
	d.wrote([]byte(`{"jsonrpc":"2.0","id":"b","result":{"tools":[]}}` + "\n"))
	<-done // with an hour's timeout, only the last answer ends the wait
	if len(d.pending) != 0 {
		t.Fatalf("pending %v after every answer", d.pending)
	}
}

// A request never answered is given up after the timeout, and said so.
func TestDrainGivesUpAfterItsTimeout(t *testing.T) {
	var log bytes.Buffer
	d := newDrainingPipes(nil, nil)
	d.timeout, d.log = time.Millisecond, &log
	d.read([]byte(initializeLine+"\n"), true)
	d.waitAnswered()
	if !strings.Contains(log.String(), "1 request(s) still unanswered") {
		t.Fatalf("stderr %q; want the request given up named", log.String())
	}
}

// The SDK's protocol errors are quieted as the HTTP endpoint's: an unknown
// tool or method is named "…", not echoed, and a call before initialize
// gets Invalid Request, not code 0 (newcomer walkthrough).
func TestStdioErrorsDoNotEchoValues(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "RATCHET_MCP_MAIN=1", "RATCHET_API_KEY=rk_test", "RATCHET_BASE_URL=http://127.0.0.1:1")
	cmd.Stdin = strings.NewReader(strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_get_effect","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"sk_live_SECRET","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"secret/sk_live_SECRET"}`,
	}, "\n") + "\n")
	out, answers := stdioAnswers(t, cmd)
	if strings.Contains(out, "sk_live_SECRET") {
		t.Fatalf("a value sent came back: %s", out)
	}
	codes := map[string]int{}
	for _, m := range answers {
		if m.Error != nil {
			codes[string(m.ID)] = m.Error.Code
		}
	}
	if codes["1"] != -32600 || codes["3"] != -32602 || codes["4"] != -32601 {
		t.Errorf("error codes %v; want 1:-32600 3:-32602 4:-32601 (output %s)", codes, out)
	}
}

// rpcAnswer is one JSON-RPC answer line of the stdio server.
type rpcAnswer struct {
	ID    json.RawMessage `json:"id"`
	Error *struct {
		Code int `json:"code"`
	} `json:"error"`
}

// stdioAnswers runs cmd and reads its output as JSON-RPC answers, one a line.
func stdioAnswers(t *testing.T, cmd *exec.Cmd) (string, []rpcAnswer) {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ratchet-mcp: %v (%s)", err, out)
	}
	var answers []rpcAnswer
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m rpcAnswer
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON-RPC: %s", line)
		}
		answers = append(answers, m)
	}
	return string(out), answers
}

// The key and the server are checked at start: a trailing newline is
// trimmed, and a key no server would take or a server that is no URL is
// refused with what to fix, never sent (QA: every call failed as an
// unreachable server, outcome unknown).
func TestSettingsAreCheckedAtStart(t *testing.T) {
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	base, key, err := settings(env(map[string]string{"RATCHET_API_KEY": "rk_abc\n"}))
	require.NoError(t, err)
	require.Equal(t, "http://localhost:8787", base)
	require.Equal(t, "rk_abc", key)
	for _, vars := range []map[string]string{
		{},
		{"RATCHET_API_KEY": " \n"},
		{"RATCHET_API_KEY": "rk_a b"},
		{"RATCHET_API_KEY": "rk_a\x00"},
		{"RATCHET_API_KEY": "rk_é"},
		{"RATCHET_API_KEY": "rk_a", "RATCHET_BASE_URL": "localhost:8787"},
		{"RATCHET_API_KEY": "rk_a", "RATCHET_BASE_URL": "ftp://x"},
		{"RATCHET_API_KEY": "rk_a", "RATCHET_BASE_URL": "http://"},
	} {
		_, _, err := settings(env(vars))
		require.Error(t, err, "%q", vars)
		require.NotContains(t, err.Error(), "rk_a", "the key is not echoed")
	}
}

// clientOut is stdout as a fast client sees it: once the answer to id 7 is
// out, the client sends its next request under id 7 again (legitimate: the
// first is answered). The reader goroutine admits it while drainWriter.Write
// has not yet called wrote.
type clientOut struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	d    *drainingPipes
	done chan struct{}
	once sync.Once
}

func (c *clientOut) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.buf.Write(p)
	c.mu.Unlock()
	if strings.Contains(string(p), `"result"`) {
		c.once.Do(func() {
			go func() {
				c.d.read([]byte(`{"jsonrpc":"2.0","id":7,"method":"ping"}`+"\n"), false)
				close(c.done)
			}()
			time.Sleep(100 * time.Millisecond) // the client is faster than wrote
		})
	}
	return len(p), nil
}
func (c *clientOut) Close() error { return nil }

// A client may send a request under an id again as soon as it reads that
// id's answer: the id left pending before the answer was written (review:
// taken out after, the request could be refused as still in progress).
func TestAnIDMayBeUsedAgainOnceItsAnswerIsOut(t *testing.T) {
	c := &clientOut{done: make(chan struct{})}
	d := newDrainingPipes(nil, c)
	c.d = d
	d.read([]byte(`{"jsonrpc":"2.0","id":7,"method":"ping"}`+"\n"), false)
	d.ready = nil
	// The SDK answers id 7 (it takes 7 out of its own in-flight map before
	// writing, jsonrpc2.processResult).
	if _, err := d.Writer().Write([]byte(`{"jsonrpc":"2.0","id":7,"result":{}}` + "\n")); err != nil {
		t.Fatal(err)
	}
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if strings.Contains(c.buf.String(), "still in progress") || len(d.ready) == 0 {
		t.Fatalf("a request reusing an answered id was refused: out=%q ready=%q", c.buf.String(), d.ready)
	}
}

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// A ratchet_begin cancelled while its HTTP call is in flight, after the
// server granted it: its answer is not written (MCP: a cancelled request is
// not answered; it was answered "context canceled"), its call is not
// abandoned, and the lease it was granted, which no one holds, is reported
// failed, so the key answers execute again at once (MCP QA: the binary
// aborted the call, the key answered in_flight until the lease lapsed, then
// blocked until an operator resolved it). Against a real server whose
// answer to the begin is held back until the cancellation was read.
func TestACancelledBeginIsNotAnsweredAndGivesBackItsLease(t *testing.T) {
	env := apitest.Start(t)
	agent := env.Key(env.Signup(), map[string]any{"name": "agent", "preset": "AGENT"})
	granted := make(chan []byte, 1) // the begin's answer, committed and not yet sent
	answer := make(chan struct{})   // closed: send it
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/effects/begin" {
			env.App.Server.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		env.App.Server.ServeHTTP(rec, r)
		granted <- rec.Body.Bytes()
		<-answer
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	defer proxy.Close()
	defer func() {
		select {
		case <-answer:
		default:
			close(answer)
		}
	}()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RATCHET_MCP_MAIN=1", "RATCHET_API_KEY="+agent, "RATCHET_BASE_URL="+proxy.URL)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var out []string
	waitFor := func(id string) {
		t.Helper()
		for {
			select {
			case line, ok := <-lines:
				require.True(t, ok, "stdout closed before the answer to %s: %v", id, out)
				out = append(out, line)
				var m struct{ ID json.RawMessage }
				require.NoError(t, json.Unmarshal([]byte(line), &m), line)
				if string(m.ID) == id {
					return
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("no answer to %s: %v (stderr %s)", id, out, stderr.String())
			}
		}
	}
	send := func(line string) {
		t.Helper()
		_, err := io.WriteString(stdin, line+"\n")
		require.NoError(t, err)
	}

	key := apitest.Unique("welcome-email:cancelled-")
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	waitFor("1")
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(fmt.Sprintf(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"ratchet_begin",`+
		`"arguments":{"effect_type":"email.send","idempotency_key":%q,"payload":{"to":"u1"}}}}`, key))
	var grant struct {
		Decision   string `json:"decision"`
		LeaseToken string `json:"lease_token"`
	}
	select {
	case body := <-granted:
		require.NoError(t, json.Unmarshal(body, &grant))
	case <-time.After(30 * time.Second):
		t.Fatalf("the begin never reached the server (stderr %s)", stderr.String())
	}
	require.Equal(t, "execute", grant.Decision)
	require.NotEmpty(t, grant.LeaseToken)
	// The cancellation, then a ping: once the ping is answered, the
	// cancellation before it was read.
	send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"user stopped"}}`)
	send(`{"jsonrpc":"2.0","id":6,"method":"ping"}`)
	waitFor("6")
	close(answer)
	require.NoError(t, stdin.Close()) // the drain waits for the begin and its release
	for line := range lines {
		out = append(out, line)
	}
	require.NoError(t, cmd.Wait(), stderr.String())

	for _, line := range out {
		require.NotContains(t, line, `"id":5`, "the cancelled request was answered: %v", out)
	}
	require.NotContains(t, stderr.String(), grant.LeaseToken)
	require.NotContains(t, stderr.String(), key)
	retry := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", agent, map[string]any{
		"effect_type": "email.send", "idempotency_key": key, "payload": map[string]any{"to": "u1"}}).JSON()
	require.Equal(t, "execute", retry["decision"], "%v (stderr %s)", retry, stderr.String())
	require.EqualValues(t, 2, retry["attempt"])
	require.Contains(t, stderr.String(), "reported failed")
}

const (
	beginLine  = `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"ratchet_begin","arguments":{}}}`
	beginGrant = `{"jsonrpc":"2.0","id":5,"result":{"structuredContent":{"decision":"execute","effect_id":"eff_1","lease_token":"tok"}}}` + "\n"
)

const beginWithRequestIDLine = `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"ratchet_begin",` +
	`"arguments":{"request_id":"7f1c1d0e-2a4b-4c55-9d2e-0b6a1c3d5e7f"}}}`

func cancelLine(id string) string {
	return `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":` + id + `}}`
}

// A request cancelled before its answer is written is not answered, however
// the cancellation spells its id; a begin's dropped result goes to release
// unless the begin named its request_id.
// One answered before its cancellation stays answered, and a cancellation
// of an unknown id changes nothing. Every cancellation reaches the SDK,
// which stops the request's handler.
func TestACancelledRequestIsNotAnswered(t *testing.T) {
	var out bytes.Buffer
	d := newTestPipes(&out)
	released := make(chan string, 2)
	d.release = func(result json.RawMessage) { released <- string(result) }
	d.read([]byte(beginLine+"\n"+`{"jsonrpc":"2.0","id":"a","method":"ping"}`+"\n"+
		`{"jsonrpc":"2.0","id":7,"method":"ping"}`+"\n"+beginWithRequestIDLine+"\n"), false)
	d.wrote([]byte(`{"jsonrpc":"2.0","id":7,"result":{}}` + "\n")) // 7 is answered
	d.read([]byte(cancelLine("5.0")+"\n"+cancelLine(`"\u0061"`)+"\n"+cancelLine("7")+"\n"+cancelLine("9")+"\n"+
		cancelLine("8")+"\n"), false)
	require.Equal(t, 5, strings.Count(string(d.ready), "notifications/cancelled"), "passed on: %s", d.ready)

	got := d.wrote([]byte(beginGrant))
	got = append(got, d.wrote([]byte(`{"jsonrpc":"2.0","id":"a","error":{"code":-32600,"message":"context canceled"}}`+"\n"))...)
	// A begin naming its request_id: its retry rejoins the lease.
	got = append(got, d.wrote([]byte(strings.Replace(beginGrant, `"id":5`, `"id":8`, 1)))...)
	require.Empty(t, string(got), "a cancelled request was answered")
	require.Empty(t, d.pending)
	require.JSONEq(t, `{"structuredContent":{"decision":"execute","effect_id":"eff_1","lease_token":"tok"}}`, <-released)
	select {
	case r := <-released:
		t.Fatalf("released another answer: %s", r)
	default:
	}

	// The id may be used again, and its next request is answered.
	d.read([]byte(`{"jsonrpc":"2.0","id":5,"method":"ping"}`+"\n"), false)
	require.Equal(t, `{"jsonrpc":"2.0","id":5,"result":{}}`+"\n", string(d.wrote([]byte(`{"jsonrpc":"2.0","id":5,"result":{}}`+"\n"))))
}

// The drain at stdin's end waits for a cancelled begin's release as for an
// answer, and gives it up after its timeout, said so; a cancelled request's
// dropped answer settles it (nothing waits for an answer never written).
func TestDrainWaitsForACancelledBeginsRelease(t *testing.T) {
	for _, blocked := range []bool{false, true} {
		var out, log bytes.Buffer
		d := newTestPipes(&out)
		d.log = &log
		unblock := make(chan struct{})
		done := false
		d.release = func(json.RawMessage) {
			if blocked {
				<-unblock
			}
			done = true // read after waitAnswered, which waits for it under mu
		}
		if blocked {
			d.timeout = time.Millisecond
		}
		d.read([]byte(beginLine+"\n"+cancelLine("5")+"\n"), true)
		d.wrote([]byte(beginGrant))
		d.waitAnswered()
		if blocked {
			require.Contains(t, log.String(), "1 cancelled begin(s) still giving back their lease")
			close(unblock)
			continue
		}
		require.True(t, done, "the drain ended before the release")
		require.Empty(t, log.String())
		require.Empty(t, out.String())
	}
}

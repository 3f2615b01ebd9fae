package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// drainingPipes hold back the end of stdin until every request read from it
// has been answered on stdout (or drainTimeout passes). The SDK's stdio
// connection closes at stdin's EOF and drops the answers still being made,
// so a client that writes its requests and closes its end (a script, a pipe
// in CI) got nothing back, not even initialize's answer. Requests and
// answers are newline-delimited JSON-RPC messages: a request has an id and
// a method, an answer an id and no method.
type drainingPipes struct {
	in  io.ReadCloser
	out io.WriteCloser

	timeout time.Duration // drainTimeout but in tests
	log     io.Writer     // stderr

	mu      sync.Mutex
	cond    *sync.Cond
	pending map[string]bool // ids of the requests read and not yet answered
	// early holds ids answered before they were pending: a last request
	// without its newline is tracked only at EOF, and the SDK (which
	// decodes it without the newline) may answer it first.
	early   map[string]bool
	inLine  []byte
	outLine []byte
}

// drainTimeout bounds the wait at EOF: a tool call is one HTTP request with
// a 60 s timeout. A client that breaks the protocol (an id reused while its
// request is in flight, which the SDK leaves unanswered) can make the
// process wait this long after stdin closes.
const drainTimeout = 90 * time.Second

func newDrainingPipes(in io.ReadCloser, out io.WriteCloser) *drainingPipes {
	d := &drainingPipes{in: in, out: out, timeout: drainTimeout, log: os.Stderr,
		pending: map[string]bool{}, early: map[string]bool{}}
	d.cond = sync.NewCond(&d.mu)
	return d
}

// Reader is stdin as the transport reads it.
func (d *drainingPipes) Reader() io.ReadCloser { return drainReader{d} }

// Writer is stdout as the transport writes it.
func (d *drainingPipes) Writer() io.WriteCloser { return drainWriter{d} }

type drainReader struct{ d *drainingPipes }

func (r drainReader) Read(p []byte) (int, error) {
	n, err := r.d.in.Read(p)
	r.d.read(p[:n], err == io.EOF)
	if err == io.EOF {
		r.d.waitAnswered()
	}
	return n, err
}

// read tracks the requests among the bytes read from stdin (at eof, the
// last one even without its newline).
func (d *drainingPipes) read(b []byte, eof bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	track := func(msg []byte) {
		for _, id := range requestIDs(msg) {
			if d.early[id] {
				delete(d.early, id) // answered already (see early)
			} else {
				d.pending[id] = true
			}
		}
	}
	d.inLine = scanLines(append(d.inLine, b...), track)
	if eof {
		// The SDK also reads a last message without its newline, and may
		// have answered it already.
		track(bytes.TrimSpace(d.inLine))
		d.inLine = nil
	}
}

func (r drainReader) Close() error { return r.d.in.Close() }

type drainWriter struct{ d *drainingPipes }

func (w drainWriter) Write(p []byte) (int, error) {
	n, err := w.d.out.Write(p)
	w.d.wrote(p[:n])
	return n, err
}

// wrote tracks the answers among the bytes written to stdout.
func (d *drainingPipes) wrote(b []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.outLine = scanLines(append(d.outLine, b...), func(msg []byte) {
		for _, id := range answerIDs(msg) {
			if d.pending[id] {
				delete(d.pending, id)
			} else {
				d.early[id] = true
			}
		}
	})
	d.cond.Broadcast()
}

func (w drainWriter) Close() error { return w.d.out.Close() }

// waitAnswered blocks until no request read is unanswered, or timeout; it
// says on stderr how many were given up, which only a client breaking the
// protocol or a tool call hung past its own timeout should cause.
func (d *drainingPipes) waitAnswered() {
	deadline := time.Now().Add(d.timeout)
	timer := time.AfterFunc(d.timeout, func() {
		d.mu.Lock()
		d.cond.Broadcast()
		d.mu.Unlock()
	})
	defer timer.Stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.pending) > 0 && time.Now().Before(deadline) {
		d.cond.Wait()
	}
	if len(d.pending) > 0 {
		fmt.Fprintf(d.log, "ratchet-mcp: stdin closed; %d request(s) still unanswered after %s\n", len(d.pending), d.timeout)
	}
}

// scanLines calls each for every complete line of buf and returns the rest.
func scanLines(buf []byte, each func([]byte)) []byte {
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			return buf
		}
		if line := bytes.TrimSpace(buf[:i]); len(line) > 0 {
			each(line)
		}
		buf = buf[i+1:]
	}
}

// messages are the JSON-RPC messages of a line (one, or a batch), each as
// its members: names are matched exactly, as the SDK matches them.
func messages(line []byte) []map[string]json.RawMessage {
	if len(line) == 0 {
		return nil
	}
	var one map[string]json.RawMessage
	if err := json.Unmarshal(line, &one); err == nil {
		return []map[string]json.RawMessage{one}
	}
	var batch []map[string]json.RawMessage
	_ = json.Unmarshal(line, &batch)
	return batch
}

// requestIDs are the ids of the messages of line that expect an answer: a
// method and an id that is not null.
func requestIDs(line []byte) []string {
	var ids []string
	for _, m := range messages(line) {
		id, hasID := m["id"]
		if _, hasMethod := m["method"]; hasMethod && hasID && string(id) != "null" {
			ids = append(ids, string(id))
		}
	}
	return ids
}

// answerIDs are the ids the answers among the messages of line answer.
func answerIDs(line []byte) []string {
	var ids []string
	for _, m := range messages(line) {
		id, hasID := m["id"]
		if _, hasMethod := m["method"]; !hasMethod && hasID && string(id) != "null" {
			ids = append(ids, string(id))
		}
	}
	return ids
}

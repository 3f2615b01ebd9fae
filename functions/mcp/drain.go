package main

import (
	"bytes"
	"encoding/json"
	"io"
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
	d := &drainingPipes{in: in, out: out, pending: map[string]bool{}, early: map[string]bool{}}
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
	r.d.mu.Lock()
	track := func(msg []byte) {
		for _, id := range requestIDs(msg) {
			if r.d.early[id] {
				delete(r.d.early, id) // answered already (see early)
			} else {
				r.d.pending[id] = true
			}
		}
	}
	r.d.inLine = scanLines(append(r.d.inLine, p[:n]...), track)
	if err == io.EOF {
		// The SDK also reads a last message without its newline, and may
		// have answered it already.
		track(bytes.TrimSpace(r.d.inLine))
		r.d.inLine = nil
	}
	r.d.mu.Unlock()
	if err == io.EOF {
		r.d.waitAnswered()
	}
	return n, err
}

func (r drainReader) Close() error { return r.d.in.Close() }

type drainWriter struct{ d *drainingPipes }

func (w drainWriter) Write(p []byte) (int, error) {
	n, err := w.d.out.Write(p)
	w.d.mu.Lock()
	w.d.outLine = scanLines(append(w.d.outLine, p[:n]...), func(msg []byte) {
		for _, id := range answerIDs(msg) {
			if w.d.pending[id] {
				delete(w.d.pending, id)
			} else {
				w.d.early[id] = true
			}
		}
	})
	w.d.cond.Broadcast()
	w.d.mu.Unlock()
	return n, err
}

func (w drainWriter) Close() error { return w.d.out.Close() }

// waitAnswered blocks until no request read is unanswered, or drainTimeout.
func (d *drainingPipes) waitAnswered() {
	deadline := time.Now().Add(drainTimeout)
	timer := time.AfterFunc(drainTimeout, func() {
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

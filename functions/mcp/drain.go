package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/getratchet/ratchet/lib/mcpserver"
)

// drainingPipes stand between stdio and the SDK's transport, which reads
// newline-delimited JSON-RPC messages from stdin and writes its answers to
// stdout. They do two things the transport does not:
//
//   - A line the transport cannot take (not JSON, not a JSON-RPC 2.0
//     message, a batch, a line over the transport's length limit) ends its
//     connection, and with it every call in progress: a lease granted to a
//     begin whose answer was not yet written was lost to the client. Such a
//     line is answered here with a JSON-RPC error (-32700 or -32600, as the
//     HTTP endpoint answers it) and never reaches the transport.
//   - The transport closes at stdin's EOF and drops the answers still being
//     made, so a client that writes its requests and closes its end (a
//     script, a pipe in CI) got nothing back. The end of stdin is held back
//     until every request passed on has been answered (or drainTimeout).
//   - The SDK answers a request the client cancelled (notifications/
//     cancelled) anyway, with the error its handler met ("context
//     canceled", -32600 or server_unreachable), where MCP asks that it not
//     be answered. The answer of a request cancelled before its answer is
//     written is dropped here; a ratchet_begin's among them may grant a
//     lease, which no one holds, since the client ignores any answer to
//     what it cancelled (unless the begin named a request_id, whose retry
//     gets the lease back). A begin without one is sent under a request_id
//     of the binary's own (hold.go), so that the client's next begin of the
//     same key rejoins that lease, its attempt not spent; a lease no begin
//     rejoins within the hold is given back by release
//     (mcpserver.ReleaseUnseen), which spends its attempt.
type drainingPipes struct {
	in  io.ReadCloser
	out io.WriteCloser

	timeout time.Duration // drainTimeout but in tests
	log     io.Writer     // stderr
	maxLine int           // maxMessageBytes but in tests

	// release gives back the lease a cancelled ratchet_begin's dropped
	// result may grant (its JSON-RPC result); nil: none is.
	release func(result json.RawMessage)
	// maxHold bounds how long a cancelled begin's lease waits for a begin
	// of the same key to rejoin it (hold.go): maxHold but in tests.
	maxHold time.Duration

	// Read side, used by the transport's one reading goroutine only.
	buf      []byte
	inLine   []byte // the line being read
	skipping bool   // the line being read is over maxLine: dropped up to its end
	ready    []byte // admitted lines not yet handed to the transport
	inErr    error  // stdin's error (io.EOF at its end), once ready is drained

	writeMu sync.Mutex // one whole message at a time on out

	mu        sync.Mutex
	cond      *sync.Cond
	pending   map[string]*request     // by id (idKey): the requests passed on and not yet answered
	releasing int                     // releases under way
	held      map[beginKey]*heldLease // cancelled begins' leases, each waiting for a begin of its key
	ended     bool                    // stdin ended: a lease is given back at once, not held
	outLine   []byte
}

// request is a request passed on to the transport and not yet answered.
type request struct {
	begin     bool       // a ratchet_begin whose lease only its answer holds (mcpserver.BeginWithoutRequestID)
	key       beginKey   // its effect type and idempotency key, when it was sent under requestID
	requestID string     // the request_id it was sent under, the binary's own ("" when none)
	held      *heldLease // its lease, held for a begin of its key once it was cancelled
	rejoins   *heldLease // the held lease it was sent to rejoin (hold.go), if any
	cancelled bool       // the client cancelled it: its answer is not written
}

// maxMessageBytes bounds one line: four times the API's 1 MiB request
// limit, which every tool call's arguments must fit, and well under the
// transport's own limit (mcp.DefaultMaxLineLength), past which it would end
// the connection.
const maxMessageBytes = 4 << 20

// drainTimeout bounds the wait at EOF: a tool call is one HTTP request with
// a 60 s timeout (a cancelled begin's release one more, within
// mcpserver.CancelGrace). (An id reused while its request is in flight, which the
// SDK would leave unanswered, is refused in admit.)
const drainTimeout = 90 * time.Second

func newDrainingPipes(in io.ReadCloser, out io.WriteCloser) *drainingPipes {
	d := &drainingPipes{in: in, out: out, timeout: drainTimeout, log: os.Stderr, maxLine: maxMessageBytes,
		maxHold: maxHold, buf: make([]byte, 32<<10), pending: map[string]*request{}, held: map[beginKey]*heldLease{}}
	d.cond = sync.NewCond(&d.mu)
	return d
}

// Reader is stdin as the transport reads it.
func (d *drainingPipes) Reader() io.ReadCloser { return drainReader{d} }

// Writer is stdout as the transport writes it.
func (d *drainingPipes) Writer() io.WriteCloser { return drainWriter{d} }

type drainReader struct{ d *drainingPipes }

// Read hands the transport the admitted lines; at stdin's end, once every
// request passed on has been answered, its EOF.
func (r drainReader) Read(p []byte) (int, error) {
	d := r.d
	for len(d.ready) == 0 && d.inErr == nil {
		n, err := d.in.Read(d.buf)
		d.read(d.buf[:n], err != nil)
		d.inErr = err
	}
	if len(d.ready) > 0 {
		n := copy(p, d.ready)
		d.ready = d.ready[n:]
		return n, nil
	}
	if d.inErr == io.EOF {
		d.waitAnswered()
	}
	return 0, d.inErr
}

func (r drainReader) Close() error { return r.d.in.Close() }

// read takes bytes from stdin and admits each complete line (at the end,
// the last one even without its newline).
func (d *drainingPipes) read(b []byte, end bool) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		chunk := b
		if i >= 0 {
			chunk = b[:i]
		}
		if !d.skipping {
			d.inLine = append(d.inLine, chunk...)
		}
		if len(d.inLine) > d.maxLine {
			if !d.skipping {
				d.refuseWithID(leadingID(d.inLine), jsonrpc.CodeInvalidRequest,
					fmt.Sprintf("Invalid Request: a message is at most %d bytes", d.maxLine))
			}
			d.skipping, d.inLine = true, d.inLine[:0]
		}
		if i < 0 {
			break
		}
		if !d.skipping {
			d.admit(d.inLine)
		}
		d.skipping, d.inLine = false, d.inLine[:0]
		b = b[i+1:]
	}
	if end && !d.skipping {
		d.admit(d.inLine)
		d.inLine = nil
	}
}

// admit passes a line on to the transport when it can take it, tracking
// the request it makes, and answers it with a JSON-RPC error otherwise.
func (d *drainingPipes) admit(line []byte) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
	switch {
	case !json.Valid(line):
		d.refuse(nil, jsonrpc.CodeParseError, mcpserver.ParseErrorMessage)
		return
	case line[0] == '[':
		// Batches were dropped from MCP in 2025-06-18; the transport
		// ends the connection on one under that version.
		d.refuse(nil, jsonrpc.CodeInvalidRequest, "Invalid Request: JSON-RPC batches are not supported")
		return
	}
	if e := mcpserver.CheckEnvelope(line); e != nil {
		var id any
		if e.ID != nil {
			id = e.ID
		}
		d.refuseWithID(id, e.Code, e.Message)
		return
	}
	msg, err := jsonrpc.DecodeMessage(line)
	if err != nil {
		d.refuse(line, jsonrpc.CodeInvalidRequest, mcpserver.NotAMessage)
		return
	}
	req, _ := msg.(*jsonrpc.Request)
	if req != nil && !req.ID.IsValid() && mcpserver.NeedsID(req.Method) {
		// A request without an id (none, or null): the SDK took it for a
		// notification and left it unanswered, the client waiting for
		// good; refused as the HTTP endpoint refuses it (MCP review).
		d.refuseWithID(nil, jsonrpc.CodeInvalidRequest, mcpserver.MissingIDMessage(req.Method))
		return
	}
	if req != nil && !req.ID.IsValid() && req.Method == "notifications/cancelled" {
		// Marked before the SDK, which cancels the request's handler,
		// reads it: any answer written after this is the cancelled one's.
		d.cancel(req.Params)
	}
	if req != nil && req.ID.IsValid() {
		d.mu.Lock()
		inFlight := d.pending[idKey(req.ID)] != nil
		if !inFlight {
			r := &request{begin: req.Method == "tools/call" && mcpserver.BeginWithoutRequestID(req.Params)}
			if r.begin {
				line = d.underRequestID(line, req.Params, r)
			}
			d.pending[idKey(req.ID)] = r
		}
		d.mu.Unlock()
		if inFlight {
			// The SDK drops a request whose id is still in progress,
			// unanswered, and the client waits for it forever (MCP QA).
			// Refused under id null, as the HTTP endpoint refuses a batch
			// naming an id twice: under its id, a client matching answers
			// by id took the refusal for the first request's answer and
			// dropped that one, a begin's lease with it (MCP QA).
			d.refuseWithID(nil, jsonrpc.CodeInvalidRequest,
				"Invalid Request: a request under this id is still in progress")
			return
		}
	}
	d.ready = append(append(d.ready, line...), '\n')
}

// cancel marks the request a notifications/cancelled names, if it is still
// unanswered: its answer will not be written. One already answered stays
// answered; an unknown or malformed id is ignored, as MCP has it.
func (d *drainingPipes) cancel(params json.RawMessage) {
	id, ok := mcpserver.CancelledRequest(params)
	if !ok {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.pending[idKey(id)]; r != nil {
		r.cancelled = true
		d.holdFrom(r)
	}
}

// refuse answers a line the transport is not given, naming its id when it
// has one JSON-RPC allows (else null, as JSON-RPC has it). Nothing else of
// the line is echoed.
func (d *drainingPipes) refuse(line []byte, code int64, message string) {
	var probe struct {
		ID any `json:"id"`
	}
	id := any(nil)
	if line != nil && json.Unmarshal(line, &probe) == nil {
		id = validID(probe.ID)
	}
	d.refuseWithID(id, code, message)
}

// validID is v as an answer's id when it is a valid JSON-RPC id (a string
// or an integer), else nil.
func validID(v any) any {
	if id, err := jsonrpc.MakeID(v); err == nil && id.IsValid() {
		return id.Raw()
	}
	return nil
}

// leadingID reads the id of a message from the start of its line, which
// may be cut short (a line over the limit is refused as its first maxLine
// bytes arrive): the top-level "id" member if it comes before the cut, so
// that the client can match the refusal to its request (QA: it answered id
// null, and the client waited out its timeout). nil when it cannot tell.
func leadingID(prefix []byte) any {
	dec := json.NewDecoder(bytes.NewReader(prefix))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil // cut short, or malformed, before or within the id
		}
		if key != "id" {
			continue
		}
		return leadingIDValue(raw, dec.InputOffset() < int64(len(prefix)))
	}
	return nil
}

// leadingIDValue is raw, an id read from a line's start, as an answer
// names it: a string answered as sent (mcpserver.ExactStringID: the
// decoder reads a lone surrogate escape as U+FFFD, so "\ud800" was
// answered "\ufffd"), or an integer that ends before the cut (whole: one
// that runs to it may go on past it); nil otherwise.
func leadingIDValue(raw json.RawMessage, whole bool) any {
	var (
		s string
		n json.Number
	)
	switch {
	case raw[0] == '"':
		if mcpserver.ExactStringID(raw) && json.Unmarshal(raw, &s) == nil {
			return s
		}
	case whole && json.Unmarshal(raw, &n) == nil:
		if i, err := n.Int64(); err == nil {
			return i
		}
	}
	return nil
}

// refuseWithID answers a message the transport is not given with a
// JSON-RPC error for id (nil: the message's id is unknown).
func (d *drainingPipes) refuseWithID(id any, code int64, message string) {
	answer, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": code, "message": message}})
	d.writeMu.Lock()
	defer d.writeMu.Unlock()
	_, _ = d.out.Write(append(answer, '\n'))
}

type drainWriter struct{ d *drainingPipes }

// Write passes the SDK's messages on, each a line written whole, with their
// JSON-RPC errors quieted as the HTTP endpoint's are (mcpserver.QuietErrors:
// the SDK's messages quoted the tool name, method or params sent), but for
// the answers of cancelled requests.
func (w drainWriter) Write(p []byte) (int, error) {
	// The answers' ids leave pending before the answers reach the client,
	// which may reuse an id as soon as it reads its answer (JSON-RPC asks
	// ids to be unique among requests in flight only): taken out after,
	// the next request under it could find it still pending and be refused
	// (review). waitAnswered waits for the write under way by writeMu.
	w.d.writeMu.Lock()
	defer w.d.writeMu.Unlock()
	if out := w.d.wrote(p); len(out) > 0 {
		if _, err := w.d.out.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil // all of p went out, if rewritten or dropped
}

// wrote takes the bytes the SDK writes, settles the requests their complete
// lines answer and returns those lines as they are to reach stdout: the
// answers of cancelled requests left out, errors quieted. Whether a
// cancelled request's answer is written is decided here, under mu, as is
// the cancellation (cancel): an answer is written or dropped whole.
func (d *drainingPipes) wrote(b []byte) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []byte
	d.outLine = scanLines(append(d.outLine, b...), func(line []byte) {
		if id, result, ok := answer(line); ok {
			r := d.pending[id]
			delete(d.pending, id)
			if r != nil && r.rejoins != nil {
				d.rejoinAnswered(r, result)
			}
			if r != nil && r.cancelled {
				if r.begin && result != nil {
					d.dropped(r, result)
				}
				return
			}
		}
		if bytes.Contains(line, []byte(`"error"`)) {
			line = mcpserver.QuietErrors(line)
		}
		out = append(append(out, line...), '\n')
	})
	d.cond.Broadcast()
	return out
}

// releaseUnseen gives back, in the background, the lease a cancelled
// ratchet_begin's dropped result may grant; waitAnswered waits for it. mu
// is held.
func (d *drainingPipes) releaseUnseen(result json.RawMessage) {
	if d.release == nil {
		return
	}
	d.releasing++
	go func() {
		d.release(result)
		d.mu.Lock()
		d.releasing--
		d.cond.Broadcast()
		d.mu.Unlock()
	}()
}

func (w drainWriter) Close() error { return w.d.out.Close() }

// waitAnswered blocks until no request passed on is unanswered and no
// cancelled begin's lease is being given back, or timeout;
// it says on stderr how many were given up, which only a client breaking
// the protocol or a tool call hung past its own timeout should cause.
func (d *drainingPipes) waitAnswered() {
	d.mu.Lock()
	d.releaseHeld() // no begin will come to rejoin them
	d.waitFor(d.timeout, func() bool { return len(d.pending) == 0 && d.releasing == 0 })
	left, releasing := len(d.pending), d.releasing
	d.mu.Unlock()
	// The last answer's id left pending just before it was written: wait
	// for that write to end.
	d.writeMu.Lock()
	d.writeMu.Unlock() // a barrier: nothing to do under it
	if left > 0 {
		fmt.Fprintf(d.log, "ratchet-mcp: stdin closed; %d request(s) still unanswered after %s\n", left, d.timeout)
	}
	if releasing > 0 {
		fmt.Fprintf(d.log, "ratchet-mcp: stdin closed; %d cancelled begin(s) still giving back their lease after %s: "+
			"left to lapse\n", releasing, d.timeout)
	}
}

// waitFor waits until done or timeout, with mu held (and released while
// it waits); done is read under mu.
func (d *drainingPipes) waitFor(timeout time.Duration, done func() bool) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		d.mu.Lock()
		d.cond.Broadcast()
		d.mu.Unlock()
	})
	defer timer.Stop()
	for !done() && time.Now().Before(deadline) {
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

// idKey is an id as the SDK reads it: "ab" for "a\u0062", 1 for 1.0 or
// 10e-1, so that a request and the answer the SDK writes for it match
// however the client spelt the id.
func idKey(id jsonrpc.ID) string { return fmt.Sprintf("%T:%v", id.Raw(), id.Raw()) }

// answer reads the answer on line, if it is one: the id (idKey) it answers
// and its result (nil for an error). The transport writes one message a
// line: the batches it would answer in one never reach it (admit).
func answer(line []byte) (id string, result json.RawMessage, ok bool) {
	m, err := jsonrpc.DecodeMessage(line)
	if resp, ok := m.(*jsonrpc.Response); err == nil && ok && resp.ID.IsValid() {
		return idKey(resp.ID), resp.Result, true
	}
	return "", nil, false
}

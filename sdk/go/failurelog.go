package ratchet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"syscall"
	"time"
)

// failureLogEvery is the least time between two lines of a worker's default
// failure log: a server down for hours costs one line a minute, not one a
// failed claim, heartbeat and report. The Python and TypeScript workers use
// the same.
const failureLogEvery = time.Minute

// failureLog is what a worker without OnError does with its notices
// (worker QA: a worker retrying against a dead or misconfigured server was
// silent for ever). It writes to log/slog's default logger, at Warn, a line
// of what failed that holds none of the error's text, which may hold payload
// details (see failureAttrs): the first failure at once, then at most one
// line every failureLogEvery, which counts the failures left out since the
// line before; and, once a registration or claim succeeds after a line told
// of a failed call to the server, one line saying after how many such
// failures it recovered. Its methods run under notices.mu.
type failureLog struct {
	logger *slog.Logger     // nil: slog.Default(), read when a line is written
	now    func() time.Time // the worker's clock

	last     time.Time // when the last failure line was written (zero: none yet)
	left     int       // failures since then that were not logged
	failures int       // failed calls to the server since the last recovery
	outage   bool      // a line told of a failed call, and no recovery line followed
}

// failure is the line to write for err, or nil when it is left out.
func (l *failureLog) failure(err error) *logLine {
	attrs, call := failureAttrs(err)
	if call {
		l.failures++
	}
	now := l.now()
	if !l.last.IsZero() && now.Sub(l.last) < failureLogEvery {
		l.left++
		return nil
	}
	if l.left > 0 {
		attrs = append(attrs, "more_since_last_line", l.left)
	}
	l.last, l.left = now, 0
	l.outage = l.outage || call
	return &logLine{logger: l.logger, msg: "ratchet worker", attrs: attrs}
}

// refusal is the line to write for err, a refusal that stopped the worker
// (Worker.refuse): written whatever the pacing, since it says why the
// worker claims no more, with the count of those left out before it.
func (l *failureLog) refusal(err error) *logLine {
	attrs, call := failureAttrs(err)
	if call {
		l.failures++
	}
	if l.left > 0 {
		attrs = append(attrs, "more_since_last_line", l.left)
	}
	l.last, l.left = l.now(), 0
	return &logLine{logger: l.logger, msg: "ratchet worker refused", attrs: attrs}
}

// stopped is the line to write when the worker stops: the count of the
// problems left out since the last line (worker QA: they were dropped), or
// nil when none was.
func (l *failureLog) stopped() *logLine {
	if l.left == 0 {
		return nil
	}
	n := l.left
	l.left = 0
	return &logLine{logger: l.logger, msg: "ratchet worker stopped", attrs: []any{"more_since_last_line", n}}
}

// recovered is the line to write when a registration or claim succeeded:
// nil unless a line told of a failed call since the last recovery.
func (l *failureLog) recovered() *logLine {
	n := l.failures
	l.failures = 0
	if !l.outage {
		return nil
	}
	l.outage = false
	return &logLine{logger: l.logger, msg: "ratchet worker recovered", attrs: []any{"failures", n}}
}

// logLine is a failureLog line waiting in the notices' queue (hence an
// error), written by the notices' goroutine: a slow log handler holds up no
// work, as a slow OnError does not.
type logLine struct {
	logger *slog.Logger
	msg    string
	attrs  []any
}

// Error implements error.
func (l *logLine) Error() string { return l.msg }

// write writes the line at Warn.
func (l *logLine) write() {
	logger := l.logger
	if logger == nil {
		logger = slog.Default()
	}
	logger.Warn(l.msg, l.attrs...)
}

// noOnErrorHint ends the line of a failure that only OnError may see.
const noOnErrorHint = "set StartOptions.OnError to see it"

// failureAttrs describes err without its text: a report not recorded by
// what became of it, its job id and attempt, then its error as below, and a
// lease lost by lease=lapsed or lost, its job id, attempt and tool
// (name@version), then the heartbeat's refusal as below (neither a failed
// call to the server: the recovery line counts none); an
// API error by its status,
// code and request id (never its message or detail) and the call it
// answered; a network failure by its kind and the call it failed on
// (method, host and path, never the query or a body); anything else (a
// handler or classifier panic, an invalid decision, an output that could
// not be encoded) by its type alone, with a hint to set OnError. call says
// err is a failed call to the server (the first two).
func failureAttrs(err error) (attrs []any, call bool) {
	var report *ReportNotRecordedError
	if errors.As(err, &report) {
		// Not counted as a failed call: the server answered it (or Stop
		// gave it up), and no recovery line is owed for it.
		inner, _ := failureAttrs(report.Err)
		return append([]any{"report", logToken(report.What), "job_id", logToken(report.JobID), "attempt", report.Attempt}, inner...), false
	}
	var lost *LeaseLostError
	if errors.As(err, &lost) {
		// Not counted as a failed call either: the server answered the
		// heartbeat that lost it, or failures counted already lapsed it.
		what, inner := "lapsed", []any(nil)
		if lost.Err != nil {
			what = "lost"
			inner, _ = failureAttrs(lost.Err)
		}
		return append([]any{"lease", what, "job_id", logToken(lost.JobID), "attempt", lost.Attempt,
			"tool", logTokenOf(lost.Tool.Name+"@"+lost.Tool.Version, 200)}, inner...), false
	}
	var apiErr *Error
	if errors.As(err, &apiErr) {
		attrs = []any{"error", "api", "status", apiErr.StatusCode}
		if apiErr.Code != "" {
			attrs = append(attrs, "code", logToken(apiErr.Code))
		}
		if apiErr.RequestID != "" {
			attrs = append(attrs, "request_id", logToken(apiErr.RequestID))
		}
		return append(attrs, apiErr.call.attrs()...), true
	}
	var ua *unreadableAnswer
	if errors.As(err, &ua) {
		// As the Python and TypeScript workers log it (it read as an
		// unknown *ratchet.unconfirmed, with the hint to set OnError).
		return append([]any{"error", "network", "kind", "unreadable answer"}, ua.call.attrs()...), true
	}
	var ne *netError
	if errors.As(err, &ne) {
		return append([]any{"error", "network", "kind", netKind(ne.err)}, ne.call.attrs()...), true
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		attrs = []any{"error", "network", "kind", netKind(ue.Err)}
		if u, perr := url.Parse(ue.URL); perr == nil {
			attrs = append(attrs, callOf(ue.Op, u).attrs()...)
		}
		return attrs, true
	}
	var nerr net.Error
	if errors.As(err, &nerr) {
		return []any{"error", "network", "kind", netKind(nerr)}, true
	}
	return []any{"error", errorType(err), "hint", noOnErrorHint}, false
}

// callInfo is the call an error answered, as the default failure log names
// it: never its query or body.
type callInfo struct{ method, host, path string }

// callOf is the call of method to u.
func callOf(method string, u *url.URL) callInfo {
	return callInfo{method: method, host: u.Host, path: u.Path}
}

// attrs are c's log attributes (none when unknown).
func (c callInfo) attrs() []any {
	if c.method == "" && c.host == "" && c.path == "" {
		return nil
	}
	return []any{"method", c.method, "host", c.host, "path", c.path}
}

// netKind names a transport failure by what it is, never by its text.
func netKind(err error) string {
	var dns *net.DNSError
	var cert *tls.CertificateVerificationError
	var record tls.RecordHeaderError
	var nerr net.Error
	switch {
	case errors.As(err, &dns):
		return "dns"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &nerr) && nerr.Timeout():
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case errors.As(err, &cert), errors.As(err, &record):
		return "tls"
	}
	for next := errors.Unwrap(err); next != nil; next = errors.Unwrap(err) {
		err = next
	}
	return errorType(err)
}

// errorType is the type of err, or of the first error it wraps that is not
// fmt.Errorf's wrapping of another.
func errorType(err error) string {
	for {
		t := fmt.Sprintf("%T", err)
		next := errors.Unwrap(err)
		if next == nil || t != "*fmt.wrapError" {
			return t
		}
		err = next
	}
}

// logToken is s as a log value: an error code or request id, cut to 64
// bytes and to printable ASCII, as a server (or a proxy posing as one) may
// send anything there.
func logToken(s string) string { return logTokenOf(s, 64) }

// logTokenOf is s cut to most bytes and to printable ASCII.
func logTokenOf(s string, most int) string {
	b := []byte(s[:min(len(s), most)])
	for i, c := range b {
		if c <= ' ' || c > '~' {
			b[i] = '?'
		}
	}
	return string(b)
}

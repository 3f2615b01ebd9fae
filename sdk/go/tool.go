package ratchet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"time"
)

// JobContext describes the attempt a handler is running. Pass
// IdempotencyKey to the destination service (as its Idempotency-Key, say):
// execution is at least once, and the key stays the same across attempts,
// so destination-side deduplication is what keeps a retried side effect
// from happening twice.
type JobContext struct {
	JobID   string
	StepID  string
	RunID   string
	Name    string // the tool name
	Version string // the handler version
	Attempt int    // this execution's number, from 1
	// MaxAttempts is the job's ceiling: Attempt == MaxAttempts is the
	// last execution (unless an operator replays the job). 0 from a server
	// that does not say.
	MaxAttempts int
	// IdempotencyKey is the step's key, the same on every attempt.
	IdempotencyKey string
	// Timeout is the attempt's timeout; the handler's context ends then.
	Timeout time.Duration
}

// Decision is a classifier's verdict on a handler error. Its zero value is
// the default for an unknown error, retryable (seed: "Unknown errors default
// to retryable"), so a classifier's fall-through `return Decision{}` never
// exhausts a job by accident (QA: with a Retryable field it did).
// RetryAfter, when positive, is a minimum wait before the next attempt and is
// treated as a RetryableError's is: sent as whole milliseconds clamped to the
// API's range of 1 second to 24 hours, so a provider's "retry in 2 days"
// waits 24 hours and a sub-second hint waits 1 second. A hint is only valid
// on a retryable decision: a positive RetryAfter with NonRetryable is invalid
// and falls back to a plain retryable failure.
type Decision struct {
	NonRetryable bool          // no further attempt may run: the job is EXHAUSTED at once
	RetryAfter   time.Duration // optional minimum wait before the next attempt, clamped to 1 s–24 h
}

// Tool is a handler for one exact name@version. In is decoded from the job's
// JSON input and Out encoded as its output; a decode or encode failure is a
// schema failure and fails the job without retry.
type Tool[In, Out any] struct {
	Name    string // the tool name jobs are enqueued with
	Version string // the exact handler version this code implements
	// Handler runs one attempt. Honour ctx: it ends at the job's timeout
	// (cause ErrTimeout), when the server asks for cancellation
	// (ErrCancelRequested), when the lease is lost (ErrLeaseLost) and when
	// the worker stops (ErrWorkerStopped); see context.Cause. A handler
	// cut short by its ctx must return an error (ctx.Err() will do): a nil
	// error says the work was done, and is reported as a success even then.
	// Return a *RetryableError or *NonRetryableError to decide the retry
	// yourself; any other error goes to ClassifyError, else counts as
	// retryable.
	Handler func(ctx context.Context, in In, job JobContext) (Out, error)
	// ClassifyError decides retryability of errors that are not explicit SDK
	// errors (third-party error types). It never sees successes, schema
	// failures, cancellations or panics. A RetryAfter hint is clamped to
	// 1 s–24 h as a RetryableError's is, and an out-of-range one is told to
	// OnError (an *InvalidDecisionError, Clamped). If it panics or returns an invalid
	// Decision (a hint with NonRetryable) the failure is retryable and the
	// problem goes to OnError. Decision{} leaves an error to the default,
	// retryable.
	ClassifyError func(err error, job JobContext) Decision
}

// registeredTool is a Tool with its types erased.
type registeredTool struct {
	ref      ToolRef
	run      func(ctx context.Context, input json.RawMessage, job JobContext) (json.RawMessage, error)
	classify func(err error, job JobContext) Decision
}

// schemaError marks input that does not decode into the handler's type or
// output that does not encode.
type schemaError struct {
	what string
	err  error
}

// Error implements error.
func (e *schemaError) Error() string { return e.what + ": " + e.err.Error() }

// Unwrap returns the JSON error.
func (e *schemaError) Unwrap() error { return e.err }

// reported is what the API is told about the failure: what failed and, for
// the errors that carry it as data, where and what was expected, never a
// value. Decoders quote the values they refuse (time.Parse, a ,string tag,
// a custom UnmarshalJSON), and an input is a payload: the full error goes
// only to OnError.
func (e *schemaError) reported() string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(e.err, &typeErr) && typeErr.Field != "":
		// "field %q expected", not "field %q: expected": RedactMessage
		// reads `"secret": …` as a secret's value, and the report read
		// `field "secret": [redacted] string` (SDK QA).
		return fmt.Sprintf("%s: field %q expected %s, got a JSON %s", e.what, typeErr.Field, typeErr.Type, typeErr.Value)
	case errors.As(e.err, &typeErr):
		return fmt.Sprintf("%s: expected %s, got a JSON %s", e.what, typeErr.Type, typeErr.Value)
	case errors.As(e.err, &syntaxErr):
		return fmt.Sprintf("%s: invalid JSON at offset %d", e.what, syntaxErr.Offset)
	case errors.Is(e.err, errOutputTooDeep):
		return e.what + ": " + e.err.Error() // a limit, no value
	}
	return e.what
}

// RegisterTool adds a typed handler to w. It must be called before Start;
// registering the same name@version twice is an error.
func RegisterTool[In, Out any](w *Worker, t Tool[In, Out]) error {
	if t.Name == "" || t.Version == "" || t.Handler == nil {
		return errors.New("ratchet: a tool needs a name, a version and a handler")
	}
	rt := &registeredTool{ref: ToolRef{Name: t.Name, Version: t.Version}, classify: t.ClassifyError}
	rt.run = func(ctx context.Context, input json.RawMessage, job JobContext) (json.RawMessage, error) {
		var in In
		if len(input) > 0 {
			if err := json.Unmarshal(input, &in); err != nil {
				return nil, &schemaError{what: "input does not match the handler's input type", err: err}
			}
		}
		out, err := t.Handler(ctx, in, job)
		if err != nil {
			return nil, err
		}
		raw, err := json.Marshal(out)
		if err == nil && len(raw) > 2*maxNesting && !json.Valid(raw) {
			// A Go value nests as deep as it likes, but a report holding
			// one deeper than encoding/json writes cannot be encoded: in a
			// batch, every job in it went unreported and ran again.
			// (Marshal's output is valid JSON but for its depth.)
			err = errOutputTooDeep
		}
		if err != nil {
			return nil, &schemaError{what: "output cannot be encoded as JSON", err: err}
		}
		return raw, nil
	}
	return w.add(rt)
}

// invoke runs the handler, turning a panic into a *PanicError.
func (rt *registeredTool) invoke(ctx context.Context, input json.RawMessage, job JobContext) (out json.RawMessage, err error) {
	defer func() {
		if v := recover(); v != nil {
			out, err = nil, &PanicError{Where: "handler " + rt.ref.Name + "@" + rt.ref.Version, Value: v, Stack: debug.Stack()}
		}
	}()
	return rt.run(ctx, input, job)
}

// Retry hint bounds (API.md §3.1): integer milliseconds 1000–86400000.
const (
	minRetryAfterMs = 1000
	maxRetryAfterMs = 86_400_000
)

// clampRetryAfter turns a RetryableError's or a classifier's hint into whole
// milliseconds within the API's range; a zero or negative hint means none.
func clampRetryAfter(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	ms := min(max(wholeMillis(d), minRetryAfterMs), maxRetryAfterMs)
	return &ms
}

// wholeMillis is d in milliseconds, rounded up: a hint is a minimum wait.
func wholeMillis(d time.Duration) int64 {
	return int64(math.Ceil(float64(d) / float64(time.Millisecond)))
}

// InvalidDecisionError goes to OnError when a classifier returns a Decision
// the API cannot accept as it is: a hint with NonRetryable, reported as
// plainly retryable, or a hint outside the API's 1 s–24 h (Clamped), sent
// clamped into it (seed 000: invalid decisions reach the local onError; QA:
// a provider's "retry in 3 days" became a 24-hour wait without a word).
type InvalidDecisionError struct {
	Tool     ToolRef  // whose classifier
	Decision Decision // what it returned
	Clamped  bool     // the hint was out of range and was sent clamped
}

// Error implements error.
func (e *InvalidDecisionError) Error() string {
	if e.Clamped {
		return fmt.Sprintf("ratchet: classifier for %s@%s returned a retry hint outside 1s-24h (%s); sent as %dms",
			e.Tool.Name, e.Tool.Version, e.Decision.RetryAfter, *clampRetryAfter(e.Decision.RetryAfter))
	}
	return fmt.Sprintf("ratchet: classifier for %s@%s returned an invalid decision (nonRetryable=%v, retryAfter=%s); treated as retryable",
		e.Tool.Name, e.Tool.Version, e.Decision.NonRetryable, e.Decision.RetryAfter)
}

// hintInRange reports whether a positive hint is within the API's range
// once rounded up to whole milliseconds (what clampRetryAfter leaves as is).
func hintInRange(d time.Duration) bool {
	ms := wholeMillis(d)
	return ms >= minRetryAfterMs && ms <= maxRetryAfterMs
}

// unexplainedFailure is reported when a handler's error could not even be
// looked at: its Error or As method (or OnError) panicked.
const unexplainedFailure = "handler failed with an error that panicked when inspected"

// decide maps a failed attempt to the error the API is told. It runs user
// code outside the handler's own recover (the returned error's Error and As
// methods, OnError): a typed nil *MyError returned as error panics there,
// and must cost one retryable failure, not the worker process with every
// other job's unsent report. The panic goes to OnError as a *PanicError.
func (rt *registeredTool) decide(err, cause error, job JobContext, onError func(error)) (je JobError) {
	defer func() {
		if v := recover(); v != nil {
			je = JobError{Message: unexplainedFailure, Retryable: true}
			notifySafely(onError, &PanicError{Where: "error returned by handler " + rt.ref.Name + "@" + rt.ref.Version,
				Value: v, Stack: debug.Stack()})
		}
	}()
	return rt.judge(err, cause, job, onError)
}

// notifySafely passes err to onError, ignoring a panic there: it is called
// after OnError may already have panicked once.
func notifySafely(onError func(error), err error) {
	defer func() { _ = recover() }()
	onError(err)
}

// judge is decide without its recover. cause is context.Cause of the
// handler's context (nil while it was live). Order, per the SDK contract:
// server-requested cancellation; explicit SDK errors; schema failures;
// panics; timeout and worker stop; the tool's classifier; retryable by
// default. Only a redacted message leaves the process.
func (rt *registeredTool) judge(err, cause error, job JobContext, onError func(error)) JobError {
	var (
		re *RetryableError
		ne *NonRetryableError
		se *schemaError
		pe *PanicError
	)
	switch {
	case errors.Is(cause, ErrCancelRequested):
		return JobError{Message: "cancelled at the server's request", Retryable: false}
	case errors.As(err, &re):
		return JobError{Message: RedactMessage(re.Message), Retryable: true, RetryAfterMs: clampRetryAfter(re.RetryAfter)}
	case errors.As(err, &ne):
		return JobError{Message: RedactMessage(ne.Message), Retryable: false}
	case errors.As(err, &se):
		onError(fmt.Errorf("ratchet: job %s attempt %d: %w", job.JobID, job.Attempt, se)) // the full text stays local
		return JobError{Message: RedactMessage(se.reported()), Retryable: false}
	case errors.As(err, &pe):
		onError(pe)
		return JobError{Message: "handler panicked", Retryable: true}
	case errors.Is(cause, ErrTimeout):
		return JobError{Message: fmt.Sprintf("handler timed out after %dms", job.Timeout.Milliseconds()), Retryable: true}
	case errors.Is(cause, ErrWorkerStopped):
		return JobError{Message: "worker stopped before the handler finished", Retryable: true}
	}
	msg := RedactMessage(err.Error())
	if rt.classify == nil {
		return JobError{Message: msg, Retryable: true}
	}
	d, ok := rt.runClassifier(err, job, onError)
	if !ok {
		return JobError{Message: msg, Retryable: true}
	}
	if d.NonRetryable {
		return JobError{Message: msg, Retryable: false}
	}
	return JobError{Message: msg, Retryable: true, RetryAfterMs: clampRetryAfter(d.RetryAfter)}
}

// runClassifier calls the tool's classifier, reporting a panic or an
// invalid decision to onError; ok is false in those cases.
func (rt *registeredTool) runClassifier(err error, job JobContext, onError func(error)) (d Decision, ok bool) {
	defer func() {
		if v := recover(); v != nil {
			onError(&PanicError{Where: "classifier " + rt.ref.Name + "@" + rt.ref.Version, Value: v, Stack: debug.Stack()})
			d, ok = Decision{}, false
		}
	}()
	d = rt.classify(err, job)
	// Only a hint on a non-retryable decision is refused: the API never takes
	// retryAfterMs with retryable false, and guessing which half the
	// classifier meant is worse than the default. An out-of-range hint is
	// clamped by judge, as a RetryableError's is (its "wait at least this"
	// holds as far as the API allows), and told to OnError.
	switch {
	case d.RetryAfter > 0 && d.NonRetryable:
		onError(&InvalidDecisionError{Tool: rt.ref, Decision: d})
		return Decision{}, false
	case d.RetryAfter > 0 && !hintInRange(d.RetryAfter):
		onError(&InvalidDecisionError{Tool: rt.ref, Decision: d, Clamped: true})
	}
	return d, true
}

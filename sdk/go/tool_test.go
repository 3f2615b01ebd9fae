package ratchet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestBlindKey(t *testing.T) {
	t.Parallel()
	// hmac.new(b"YOUR_SECRET", b"refund:order_551:full", sha256).hexdigest()[:32]
	if got := BlindKey("YOUR_SECRET", "refund:order_551:full"); got != "f241db595ef043342a1ce7c8df205f1d" {
		t.Fatalf("BlindKey = %s", got)
	}
	if BlindKey("a", "k") == BlindKey("b", "k") || BlindKey("a", "k") != BlindKey("a", "k") {
		t.Fatal("BlindKey must depend on the secret and be deterministic")
	}
}

func TestClampRetryAfter(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   time.Duration
		want int64 // 0 = omitted
	}{
		{0, 0}, {-time.Second, 0}, {time.Nanosecond, 1000}, {500 * time.Millisecond, 1000},
		{1500*time.Millisecond + time.Microsecond, 1501}, {time.Minute, 60000},
		{24 * time.Hour, 86_400_000}, {48 * time.Hour, 86_400_000},
	}
	for _, c := range cases {
		got := clampRetryAfter(c.in)
		if (got == nil) != (c.want == 0) || (got != nil && *got != c.want) {
			t.Fatalf("clampRetryAfter(%v) = %v, want %d", c.in, got, c.want)
		}
	}
}

type providerError struct{ status int }

func (e *providerError) Error() string { return fmt.Sprintf("provider status %d", e.status) }

// errSink collects OnError calls.
type errSink struct {
	mu   sync.Mutex
	errs []error
}

func (s *errSink) add(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

func (s *errSink) list() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

// delivered is list once w's OnError notices queued so far have been
// delivered (they run on a goroutine of their own).
func (s *errSink) delivered(w *Worker) []error {
	w.mu.Lock()
	n := w.notices
	w.mu.Unlock()
	if n != nil {
		n.flush()
	}
	return s.list()
}

func TestClassifierPrecedence(t *testing.T) {
	t.Parallel()
	ms := func(n int64) *int64 { return &n }
	nonRetryableClassifier := func(error, JobContext) Decision { return Decision{NonRetryable: true} }
	panicking := func(error, JobContext) Decision { panic("classifier bug") }
	cases := []struct {
		name     string
		err      error
		cause    error
		classify func(error, JobContext) Decision
		want     JobError
		onError  bool
	}{
		{name: "unknown error defaults to retryable", err: errors.New("boom"),
			want: JobError{Message: "boom", Retryable: true}},
		{name: "explicit retryable beats classifier", err: Retryable("busy", 2*time.Second), classify: nonRetryableClassifier,
			want: JobError{Message: "busy", Retryable: true, RetryAfterMs: ms(2000)}},
		{name: "wrapped explicit non-retryable beats classifier", err: fmt.Errorf("ctx: %w", NonRetryable("invalid recipient")),
			classify: func(error, JobContext) Decision { return Decision{} },
			want:     JobError{Message: "invalid recipient", Retryable: false}},
		{name: "schema failure is non-retryable before the classifier",
			err:      &schemaError{what: "input does not match the handler's input type", err: errors.New("json: bad")},
			classify: func(error, JobContext) Decision { return Decision{} },
			want:     JobError{Message: "input does not match the handler's input type", Retryable: false}, onError: true},
		{name: "a schema failure names the field, never the value",
			err: &schemaError{what: "input does not match the handler's input type",
				err: &json.UnmarshalTypeError{Value: "string", Type: reflect.TypeFor[int](), Field: "amount"}},
			want: JobError{Message: `input does not match the handler's input type: field "amount" expected int, got a JSON string`,
				Retryable: false}, onError: true},
		// A field named like a secret is named, not redacted (SDK QA: it read
		// `field "secret": [redacted] string`).
		{name: "a schema failure of a field named secret reads whole",
			err: &schemaError{what: "input does not match the handler's input type",
				err: &json.UnmarshalTypeError{Value: "object", Type: reflect.TypeFor[string](), Field: "secret"}},
			want: JobError{Message: `input does not match the handler's input type: field "secret" expected string, got a JSON object`,
				Retryable: false}, onError: true},
		{name: "server cancellation is non-retryable even over explicit retryable", err: Retryable("x", 0), cause: ErrCancelRequested,
			want: JobError{Message: "cancelled at the server's request", Retryable: false}},
		{name: "classifier decides third-party errors", err: &providerError{400}, classify: func(err error, _ JobContext) Decision {
			var pe *providerError
			if errors.As(err, &pe) && pe.status == 400 {
				return Decision{NonRetryable: true}
			}
			return Decision{}
		}, want: JobError{Message: "provider status 400", Retryable: false}},
		{name: "a classifier's zero Decision is the default, retryable", err: &providerError{503},
			classify: func(error, JobContext) Decision { return Decision{} },
			want:     JobError{Message: "provider status 503", Retryable: true}},
		{name: "classifier retry hint", err: &providerError{429},
			classify: func(error, JobContext) Decision { return Decision{RetryAfter: 90 * time.Second} },
			want:     JobError{Message: "provider status 429", Retryable: true, RetryAfterMs: ms(90000)}},
		{name: "classifier panic falls back to retryable", err: errors.New("x"), classify: panicking,
			want: JobError{Message: "x", Retryable: true}, onError: true},
		{name: "non-retryable with hint is invalid", err: errors.New("x"),
			classify: func(error, JobContext) Decision { return Decision{NonRetryable: true, RetryAfter: time.Minute} },
			want:     JobError{Message: "x", Retryable: true}, onError: true},
		// A classifier's hint is clamped into the API's range as a
		// RetryableError's is, not refused: both say "wait at least this";
		// the classifier's out-of-range hint is told to OnError too.
		{name: "classifier hint beyond 24h is clamped to 24h", err: errors.New("x"),
			classify: func(error, JobContext) Decision { return Decision{RetryAfter: 25 * time.Hour} },
			want:     JobError{Message: "x", Retryable: true, RetryAfterMs: ms(86_400_000)}, onError: true},
		{name: "classifier hint below 1s is clamped to 1s", err: errors.New("x"),
			classify: func(error, JobContext) Decision { return Decision{RetryAfter: time.Millisecond} },
			want:     JobError{Message: "x", Retryable: true, RetryAfterMs: ms(1000)}, onError: true},
		{name: "classifier hint of exactly 24h is in range", err: errors.New("x"),
			classify: func(error, JobContext) Decision { return Decision{RetryAfter: 24 * time.Hour} },
			want:     JobError{Message: "x", Retryable: true, RetryAfterMs: ms(86_400_000)}},
		{name: "classifier hint rounds up to whole milliseconds", err: errors.New("x"),
			classify: func(error, JobContext) Decision {
				return Decision{RetryAfter: 1500*time.Millisecond + time.Microsecond}
			},
			want: JobError{Message: "x", Retryable: true, RetryAfterMs: ms(1501)}},
		{name: "negative classifier hint means none", err: errors.New("x"),
			classify: func(error, JobContext) Decision { return Decision{RetryAfter: -time.Second} },
			want:     JobError{Message: "x", Retryable: true}},
		{name: "non-retryable with a negative hint (none) is valid", err: errors.New("x"),
			classify: func(error, JobContext) Decision { return Decision{NonRetryable: true, RetryAfter: -time.Second} },
			want:     JobError{Message: "x", Retryable: false}},
		{name: "non-retryable with an out-of-range hint is still invalid", err: errors.New("x"),
			classify: func(error, JobContext) Decision { return Decision{NonRetryable: true, RetryAfter: 48 * time.Hour} },
			want:     JobError{Message: "x", Retryable: true}, onError: true},
		{name: "timeout is retryable without the classifier", err: context.DeadlineExceeded, cause: ErrTimeout, classify: panicking,
			want: JobError{Message: "handler timed out after 1500ms", Retryable: true}},
		{name: "explicit error beats timeout", err: NonRetryable("gave up"), cause: ErrTimeout,
			want: JobError{Message: "gave up", Retryable: false}},
		{name: "handler panic is retryable and skips the classifier", err: &PanicError{Where: "handler", Value: "secret payload"},
			classify: panicking, want: JobError{Message: "handler panicked", Retryable: true}, onError: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sink := &errSink{}
			rt := &registeredTool{ref: ToolRef{Name: "t", Version: "1"}, classify: c.classify}
			got := rt.decide(c.err, c.cause, JobContext{Timeout: 1500 * time.Millisecond}, sink.add)
			if got.Message != c.want.Message || got.Retryable != c.want.Retryable ||
				(got.RetryAfterMs == nil) != (c.want.RetryAfterMs == nil) ||
				(got.RetryAfterMs != nil && *got.RetryAfterMs != *c.want.RetryAfterMs) {
				t.Fatalf("got %+v (retryAfterMs %v), want %+v", got, got.RetryAfterMs, c.want)
			}
			if got.RetryAfterMs != nil && !got.Retryable {
				t.Fatal("retryAfterMs with retryable:false")
			}
			if (len(sink.list()) > 0) != c.onError {
				t.Fatalf("OnError calls %v, want some: %v", sink.list(), c.onError)
			}
		})
	}
}

// TestRedactMessage holds RedactMessage to the vectors the three SDKs
// share (../redaction_vectors.json): credentials, personal data, control
// characters, the byte bound.
func TestRedactMessage(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../redaction_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Vectors []struct{ Name, Input, Output string }
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Vectors) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range file.Vectors {
		if got := RedactMessage(v.Input); got != v.Output {
			t.Errorf("%s: %q → %q, want %q", v.Name, v.Input, got, v.Output)
		}
		if len(v.Output) > MaxErrorMessageBytes {
			t.Errorf("%s: the expected output is over %d bytes", v.Name, MaxErrorMessageBytes)
		}
	}
}

func TestRegisterToolValidates(t *testing.T) {
	t.Parallel()
	c, _ := NewClient(Config{BaseURL: "http://localhost:1", APIKey: "k"})
	w := NewWorker(c)
	h := func(context.Context, struct{}, JobContext) (struct{}, error) { return struct{}{}, nil }
	if err := RegisterTool(w, Tool[struct{}, struct{}]{Name: "a", Handler: h}); err == nil {
		t.Fatal("missing version accepted")
	}
	if err := RegisterTool(w, Tool[struct{}, struct{}]{Name: "a", Version: "1", Handler: h}); err != nil {
		t.Fatal(err)
	}
	if err := RegisterTool(w, Tool[struct{}, struct{}]{Name: "a", Version: "1", Handler: h}); err == nil {
		t.Fatal("duplicate accepted")
	}
}

// panickyAs is an error whose As method panics.
type panickyAs struct{}

func (panickyAs) Error() string { return "fine" }
func (panickyAs) As(any) bool   { panic("As bug") }

// User code that decide runs outside the handler's recover (the returned
// error's Error and As methods, OnError) may panic: the attempt is then a
// fixed retryable failure and the panic goes to OnError, instead of taking
// the worker process down with every other job's report.
func TestDecideSurvivesPanickingErrorCode(t *testing.T) {
	t.Parallel()
	var typedNil *providerError // its Error dereferences nil
	cases := []struct {
		name     string
		err      error
		classify func(error, JobContext) Decision
		onError  func(sink *errSink) func(error)
	}{
		{name: "typed nil error", err: typedNil},
		{name: "typed nil error with a classifier", err: typedNil,
			classify: func(error, JobContext) Decision { return Decision{NonRetryable: true} }},
		{name: "As method panics", err: panickyAs{}},
		{name: "OnError panics", err: &PanicError{Where: "handler", Value: "boom"},
			onError: func(sink *errSink) func(error) {
				return func(err error) { sink.add(err); panic("OnError bug") }
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sink := &errSink{}
			onError := sink.add
			if c.onError != nil {
				onError = c.onError(sink)
			}
			rt := &registeredTool{ref: ToolRef{Name: "t", Version: "1"}, classify: c.classify}
			var got JobError
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Fatalf("decide panicked: %v", v)
					}
				}()
				got = rt.decide(c.err, nil, JobContext{}, onError)
			}()
			if got.Message != unexplainedFailure || !got.Retryable || got.RetryAfterMs != nil {
				t.Fatalf("got %+v", got)
			}
			errs := sink.list()
			var pe *PanicError
			if len(errs) == 0 || !errors.As(errs[len(errs)-1], &pe) || !strings.Contains(pe.Where, "t@1") {
				t.Fatalf("OnError %v", errs)
			}
		})
	}
}

// An out-of-range classifier hint tells OnError what was asked and what
// was sent.
func TestClampedHintIsToldToOnError(t *testing.T) {
	t.Parallel()
	sink := &errSink{}
	rt := &registeredTool{ref: ToolRef{Name: "t", Version: "1"},
		classify: func(error, JobContext) Decision { return Decision{RetryAfter: 72 * time.Hour} }}
	rt.decide(errors.New("x"), nil, JobContext{}, sink.add)
	errs := sink.list()
	if len(errs) != 1 {
		t.Fatalf("OnError calls %v, want one", errs)
	}
	var ide *InvalidDecisionError
	if !errors.As(errs[0], &ide) || !ide.Clamped {
		t.Fatalf("OnError got %#v, want a clamped *InvalidDecisionError", errs[0])
	}
	if want := "returned a retry hint outside 1s-24h (72h0m0s); sent as 86400000ms"; !strings.Contains(ide.Error(), want) {
		t.Fatalf("message %q lacks %q", ide.Error(), want)
	}
}

package ratchet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testClient returns a client for srv whose waits are recorded, not slept.
func testClient(t *testing.T, h http.Handler) (*Client, *sleepLog) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := NewClient(Config{BaseURL: srv.URL, APIKey: "test-key", HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	log := &sleepLog{}
	c.sleep = log.sleep
	c.jitter = func() float64 { return 0.5 }
	return c, log
}

type sleepLog struct {
	mu     sync.Mutex
	sleeps []time.Duration
}

func (l *sleepLog) sleep(ctx context.Context, d time.Duration) error {
	l.mu.Lock()
	l.sleeps = append(l.sleeps, d)
	l.mu.Unlock()
	return ctx.Err()
}

func (l *sleepLog) all() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Duration(nil), l.sleeps...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, status int, code string, detail map[string]any) {
	if detail == nil {
		detail = map[string]any{}
	}
	w.Header().Set("X-Request-Id", "req_1")
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": code, "message": "msg " + code, "detail": detail}})
}

// sequence answers each request with the next responder, counting calls.
type sequence struct {
	calls atomic.Int32
	steps []func(w http.ResponseWriter, r *http.Request)
}

func (s *sequence) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	i := int(s.calls.Add(1)) - 1
	if i >= len(s.steps) {
		i = len(s.steps) - 1
	}
	s.steps[i](w, r)
}

func TestNewClientValidates(t *testing.T) {
	t.Parallel()
	if _, err := NewClient(Config{BaseURL: "http://localhost:8787"}); err == nil {
		t.Fatal("missing key accepted")
	}
	if _, err := NewClient(Config{BaseURL: "localhost:8787", APIKey: "k"}); err == nil {
		t.Fatal("base URL without scheme accepted")
	}
	c, err := NewClient(Config{BaseURL: "http://localhost:8787/api/v1/", APIKey: "k"})
	if err != nil || c.base != "http://localhost:8787/api/v1" {
		t.Fatalf("base = %q, err = %v", c.base, err)
	}
	// A key no header can carry (a secret file read with its line end) is
	// refused here, without the key in the error, as the Python and
	// TypeScript SDKs refuse it: each call failed as a network error,
	// repeated (Python's printed the key). Spaces and tabs around it pass:
	// the server trims them.
	for _, key := range []string{"rk_SECRET\n", "rk_SECRET\r\n", "rk_S\x00ECRET", "rk_SÉCRET", "rk_SECRET\x7f"} {
		if _, err := NewClient(Config{APIKey: key}); err == nil || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("key %q: err = %v, want a refusal without the key", key, err)
		}
	}
	if _, err := NewClient(Config{APIKey: " rk_ok\t"}); err != nil {
		t.Errorf("a key with spaces around it refused: %v", err)
	}
}

// An Idempotency-Key or a User-Agent no header can carry, and an id of "."
// or "..", are refused before anything is sent, without the value in the
// error, as the Python and TypeScript SDKs refuse them: net/http refused
// such a header at each attempt, a network error repeated, and GetRun("..")
// asked GET /api/v1 (a URL resolves a ".." step), another route.
func TestUnsendableHeadersAndDotIdsAreRefusedUnsent(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	c, sleeps := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		writeJSON(w, 200, map[string]any{"id": "run_1"})
	}))
	ctx := context.Background()
	for _, key := range []string{"k_SECRET\n", "k_SECRET\r\nX-Evil: 1", "k_S\x00ECRET", "k_SÉCRET"} {
		err := c.Request(ctx, "POST", "/runs", map[string]any{"name": "n"}, nil, RequestOptions{Safe: true, IdempotencyKey: key})
		if err == nil || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("Idempotency-Key %q: err = %v, want a refusal without the key", key, err)
		}
		if _, err := c.CancelStepWithKey(ctx, "stp_1", key); err == nil || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("CancelStepWithKey %q: err = %v, want a refusal without the key", key, err)
		}
	}
	for _, id := range []string{".", ".."} {
		if _, err := c.GetRun(ctx, id); err == nil {
			t.Errorf("GetRun(%q) sent", id)
		}
		if _, err := c.CancelStep(ctx, id); err == nil {
			t.Errorf("CancelStep(%q) sent", id)
		}
	}
	if n := calls.Load(); n != 0 || len(sleeps.sleeps) != 0 {
		t.Fatalf("%d requests sent, %d retry waits, want none", n, len(sleeps.sleeps))
	}
	// Ids holding dots are ids, sent escaped as ever.
	if _, err := c.GetRun(ctx, "..run"); err != nil || calls.Load() != 1 {
		t.Fatalf("GetRun(\"..run\"): err = %v, %d requests", err, calls.Load())
	}
	for _, ua := range []string{"app\n", "app\r\nX-Evil: 1", "app\x7f", "äpp"} {
		if _, err := NewClient(Config{APIKey: "k", UserAgent: ua}); err == nil || strings.Contains(err.Error(), "app") {
			t.Errorf("UserAgent %q: err = %v, want a refusal without it", ua, err)
		}
	}
	if _, err := NewClient(Config{APIKey: "k", UserAgent: "my-app/1.0 (contact)"}); err != nil {
		t.Errorf("a plain user agent refused: %v", err)
	}
}

func TestRequestShape(t *testing.T) {
	t.Parallel()
	var got *http.Request
	var body map[string]any
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		_ = json.NewDecoder(r.Body).Decode(&body)
		writeJSON(w, 201, map[string]any{"stepId": "stp_1", "jobId": "job_1", "idempotencyKey": "k", "status": "QUEUED", "deduplicated": false})
	}))
	res, err := c.Enqueue(context.Background(), "run_1", map[string]string{"customerId": "cus_1"}, EnqueueOptions{
		Name: "send_welcome_email", Version: "1", Endpoint: "Email service", Timeout: 30 * time.Second,
		MaxAttempts: 5, ContractVersion: 2, AfterStepID: "stp_0", AfterStatus: AfterFailed,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.JobID != "job_1" || res.Deduplicated {
		t.Fatalf("result %+v", res)
	}
	if got.URL.Path != "/api/v1/runs/run_1/steps" || got.Header.Get("Authorization") != "Bearer test-key" {
		t.Fatalf("request %s %v", got.URL.Path, got.Header)
	}
	want := map[string]any{"name": "send_welcome_email", "version": "1", "endpoint": "Email service",
		"timeoutMs": 30000.0, "maxAttempts": 5.0, "contractVersion": 2.0, "afterStepId": "stp_0", "afterStatus": "FAILED",
		"input": map[string]any{"customerId": "cus_1"}}
	if len(body) != len(want) {
		t.Fatalf("body %v", body)
	}
	for k, v := range want {
		if !jsonEqual(body[k], v) {
			t.Fatalf("body[%s] = %v, want %v", k, body[k], v)
		}
	}
}

// A path segment reaches the server percent-encoded but for unreserved
// characters, so a proxy that copies it into a query (Vercel's rewrites)
// neither splits it at & nor reads + as a space.
func TestPathSegmentsEscapeReservedCharacters(t *testing.T) {
	t.Parallel()
	var raw string
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw = r.URL.EscapedPath()
		writeJSON(w, 200, map[string]any{"data": []any{}})
	}))
	if _, err := c.ListContracts(context.Background(), "c++&a=b;x:y/z é~", ListQuery{}); err != nil {
		t.Fatal(err)
	}
	want := "/api/v1/tools/c%2B%2B%26a%3Db%3Bx%3Ay%2Fz%20%C3%A9~/contracts"
	if raw != want {
		t.Fatalf("path %s, want %s", raw, want)
	}
	if got, err := url.PathUnescape(strings.TrimSuffix(strings.TrimPrefix(raw, "/api/v1/tools/"), "/contracts")); err != nil || got != "c++&a=b;x:y/z é~" {
		t.Fatalf("segment decodes to %q (%v)", got, err)
	}
}

func TestEnqueueOmitsKeyForServerToGenerate(t *testing.T) {
	t.Parallel()
	var body map[string]any
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&body)
		writeJSON(w, 201, map[string]any{"idempotencyKey": "generated"})
	}))
	res, err := c.Enqueue(context.Background(), "run_1", nil, EnqueueOptions{Name: "t", Version: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, sent := body["idempotencyKey"]; sent || res.IdempotencyKey != "generated" {
		t.Fatalf("body %v result %+v", body, res)
	}
}

func jsonEqual(a, b any) bool {
	ra, _ := json.Marshal(a)
	rb, _ := json.Marshal(b)
	return string(ra) == string(rb)
}

func TestErrorDecoding(t *testing.T) {
	t.Parallel()
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		apiError(w, 400, CodeInvalidRequest, map[string]any{"validation": []any{map[string]any{"field": "maxAttempts", "message": "must be 1–10"}}})
	}))
	_, err := c.Enqueue(context.Background(), "run_1", 1, EnqueueOptions{Name: "t", Version: "1", MaxAttempts: 11})
	var apiErr *Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("err %T %v", err, err)
	}
	if apiErr.StatusCode != 400 || apiErr.Code != CodeInvalidRequest || apiErr.RequestID != "req_1" {
		t.Fatalf("decoded %+v", apiErr)
	}
	if v := apiErr.Validation(); len(v) != 1 || v[0].Field != "maxAttempts" {
		t.Fatalf("validation %+v", v)
	}
	if ErrorCode(err) != CodeInvalidRequest || !IsCode(err, CodeInvalidRequest) {
		t.Fatal("ErrorCode")
	}
}

func TestNonEnvelopeError(t *testing.T) {
	t.Parallel()
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(418)
		_, _ = io.WriteString(w, "<html>teapot</html>")
	}))
	_, err := c.GetRun(context.Background(), "run_1")
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Code != "" || apiErr.StatusCode != 418 {
		t.Fatalf("err %v", err)
	}
}

func TestRateLimitedWaitsRetryAfter(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) {
			apiError(w, 429, CodeRateLimited, map[string]any{"retry_after_seconds": 7})
		},
		func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 201, map[string]any{"id": "run_1"}) },
	}}
	c, log := testClient(t, seq)
	// A 429 was refused before acting: repeated for any call.
	run, err := c.StartRun(context.Background(), "x")
	if err != nil || run.ID != "run_1" {
		t.Fatalf("run %+v err %v", run, err)
	}
	// Seven seconds and a tenth of them more: the jitter drawn (0.5) of
	// the fifth the wait may be lengthened by.
	if got := log.all(); len(got) != 1 || got[0] != 7700*time.Millisecond {
		t.Fatalf("sleeps %v, want 7.7s", got)
	}
}

// A 429's wait is the server's and up to a fifth more, drawn at random, never
// less: every client the limiter refused in one window is told to come back
// at its end, and waiting exactly that long brought them all back at the
// same instant, most to be refused again (sdk QA).
func TestRateLimitWaitIsSpreadNeverShortened(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		secs   int
		jitter float64
		want   time.Duration
	}{
		{7, 0, 7 * time.Second},
		{7, 0.25, 7350 * time.Millisecond},
		{10, 0.999, 11998 * time.Millisecond},
		{1, 0.5, 1100 * time.Millisecond},
		{3600, 0.5, 66 * time.Second}, // the minute's cap, then the spread
	} {
		seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
			func(w http.ResponseWriter, r *http.Request) {
				apiError(w, 429, CodeRateLimited, map[string]any{"retry_after_seconds": tc.secs})
			},
			func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, map[string]any{"id": "run_1"}) },
		}}
		c, log := testClient(t, seq)
		c.jitter = func() float64 { return tc.jitter }
		if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
			t.Fatal(err)
		}
		if got := log.all(); len(got) != 1 || got[0] != tc.want {
			t.Errorf("retry_after_seconds %d, jitter %v: sleeps %v, want %v", tc.secs, tc.jitter, got, tc.want)
		}
	}
}

// A 503's Retry-After (a proxy's maintenance page, a host shedding load),
// heeded up to the backoff's cap, is spread as a 429's is: waited exactly,
// it brought every client it turned away back at one instant.
func TestServiceUnavailableRetryAfterIsSpreadNeverShortened(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		detail bool // in the envelope's detail, not (a proxy's bare 503) the header
		secs   int
		jitter float64
		want   time.Duration
	}{
		{true, 5, 0, 5 * time.Second},
		{true, 5, 0.5, 5500 * time.Millisecond},
		{false, 5, 0.999, 5999 * time.Millisecond},
		{false, 3600, 0.5, 8800 * time.Millisecond}, // the backoff's cap, then the spread
	} {
		seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
			func(w http.ResponseWriter, r *http.Request) {
				if tc.detail {
					apiError(w, http.StatusServiceUnavailable, "unavailable", map[string]any{"retry_after_seconds": tc.secs})
					return
				}
				w.Header().Set("Retry-After", fmt.Sprint(tc.secs))
				w.WriteHeader(http.StatusServiceUnavailable)
			},
			func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, map[string]any{"id": "run_1"}) },
		}}
		c, log := testClient(t, seq)
		c.jitter = func() float64 { return tc.jitter } // the backoff's draw too: at most 0.5 s, below the Retry-After
		if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
			t.Fatal(err)
		}
		if got := log.all(); len(got) != 1 || got[0] != tc.want {
			t.Errorf("Retry-After %d (detail %v), jitter %v: sleeps %v, want %v", tc.secs, tc.detail, tc.jitter, got, tc.want)
		}
	}
}

func TestRateLimitedRetryAfterHeader(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "3")
			apiError(w, 429, CodeRateLimited, nil)
		},
		func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, map[string]any{"id": "run_1"}) },
	}}
	c, log := testClient(t, seq)
	if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
		t.Fatal(err)
	}
	if got := log.all(); len(got) != 1 || got[0] != 3300*time.Millisecond {
		t.Fatalf("sleeps %v, want 3.3s", got)
	}
}

// Retry-After may be an HTTP date (RFC 9110), and a 503 may carry one too
// (a proxy or host shedding load): an idempotent call waits it out.
func TestRetryAfterDateAndServiceUnavailable(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", time.Now().Add(5*time.Second).UTC().Format(http.TimeFormat))
			apiError(w, 429, CodeRateLimited, nil)
		},
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "6")
			w.WriteHeader(http.StatusServiceUnavailable)
		},
		func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, map[string]any{"id": "run_1"}) },
	}}
	c, log := testClient(t, seq)
	if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
		t.Fatal(err)
	}
	got := log.all()
	// The 503's 6 s and half its fifth (the test client draws 0.5).
	if len(got) != 2 || got[0] < 4400*time.Millisecond || got[0] > 6600*time.Millisecond || got[1] != 6600*time.Millisecond {
		t.Fatalf("sleeps %v, want about 5.5s then 6.6s", got)
	}
}

// A 408 request_timeout (the body arrived too late, nothing done) is sent
// again, even for a call that is not idempotent.
func TestRequestTimeoutIsSentAgain(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) {
			apiError(w, http.StatusRequestTimeout, CodeRequestTimeout, nil)
		},
		func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 201, map[string]any{"id": "run_1", "name": "x", "status": "RUNNING"})
		},
	}}
	c, log := testClient(t, seq)
	run, err := c.StartRun(context.Background(), "x")
	if err != nil || run.ID != "run_1" {
		t.Fatalf("StartRun = %+v, %v", run, err)
	}
	if got := log.all(); len(got) != 1 {
		t.Fatalf("sleeps %v, want one backoff", got)
	}
}

// A 503's Retry-After is heeded up to the backoff's cap (a heartbeat that
// slept a maintenance page's two minutes would lose its lease), then spread
// (TestServiceUnavailableRetryAfterIsSpreadNeverShortened), and a call that
// is not idempotent is not repeated after a 503 whatever it says.
func TestServiceUnavailableRetryAfterIsCapped(t *testing.T) {
	t.Parallel()
	unavailable := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){unavailable,
		func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, map[string]any{"id": "run_1"}) },
	}}
	c, log := testClient(t, seq)
	if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
		t.Fatal(err)
	}
	if got, want := log.all(), backoffCap+backoffCap/10; len(got) != 1 || got[0] != want { // half the spread drawn
		t.Fatalf("sleeps %v, want %v", got, want)
	}
	once := &sequence{steps: []func(http.ResponseWriter, *http.Request){unavailable}}
	c, log = testClient(t, once)
	if _, err := updatePolicy(c); err == nil || once.calls.Load() != 1 || len(log.all()) != 0 {
		t.Fatalf("err %v calls %d sleeps %v", err, once.calls.Load(), log.all())
	}
}

// A 429's wait is cut to the API's one-minute windows (a proxy asking for
// an hour, or for more seconds than a Duration holds, would otherwise stall
// a heartbeat past its lease or overflow into no wait at all).
func TestRateLimitWaitIsCappedAtAMinute(t *testing.T) {
	t.Parallel()
	for _, secs := range []any{3600, 1e12} {
		seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
			func(w http.ResponseWriter, r *http.Request) {
				apiError(w, 429, CodeRateLimited, map[string]any{"retry_after_seconds": secs})
			},
			func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, map[string]any{"id": "run_1"}) },
		}}
		c, log := testClient(t, seq)
		if _, err := c.GetRun(context.Background(), "run_1"); err != nil {
			t.Fatal(err)
		}
		if got := log.all(); len(got) != 1 || got[0] != 66*time.Second { // a minute, and its spread drawn (0.5)
			t.Fatalf("retry_after_seconds %v: sleeps %v", secs, got)
		}
	}
}

func TestRetryAfterHeaderForms(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	for v, want := range map[string]int{"": 0, "7": 7, " 7 ": 7, "-3": 0, "soon": 0,
		now.Add(90 * time.Second).Format(http.TimeFormat): 90, now.Add(-time.Minute).Format(http.TimeFormat): 0} {
		if got := retryAfterHeader(v, now); got != want {
			t.Errorf("retryAfterHeader(%q) = %d, want %d", v, got, want)
		}
	}
}

func TestRateLimitBeyondDeadlineReturnsAtOnce(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) {
			apiError(w, 429, CodeRateLimited, map[string]any{"retry_after_seconds": 3600})
		},
	}}
	c, log := testClient(t, seq)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.GetRun(ctx, "run_1")
	if !IsCode(err, CodeRateLimited) || len(log.all()) != 0 || seq.calls.Load() != 1 {
		t.Fatalf("err %v sleeps %v calls %d", err, log.all(), seq.calls.Load())
	}
}

func TestServerErrorsRetriedWithCappedBackoff(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) { apiError(w, 500, CodeInternal, nil) },
	}}
	c, log := testClient(t, seq)
	c.maxRetries = 8
	_, err := c.GetRun(context.Background(), "run_1")
	if !IsCode(err, CodeInternal) || seq.calls.Load() != 9 {
		t.Fatalf("err %v calls %d", err, seq.calls.Load())
	}
	sleeps := log.all()
	if len(sleeps) != 8 {
		t.Fatalf("sleeps %v", sleeps)
	}
	for i, d := range sleeps {
		step := min(backoffBase<<i, backoffCap)
		if d < step/2 || d > step {
			t.Fatalf("sleep %d = %v, outside [%v, %v]", i, d, step/2, step)
		}
	}
	if sleeps[7] > backoffCap {
		t.Fatalf("not capped: %v", sleeps)
	}
}

func TestNonIdempotentCallsNotRetriedOnAmbiguousFailure(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) { apiError(w, 500, CodeInternal, nil) },
		func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 201, map[string]any{"id": "run_2"}) },
	}}
	c, _ := testClient(t, seq)
	if _, err := updatePolicy(c); !IsCode(err, CodeInternal) {
		t.Fatalf("err %v", err)
	}
	if _, err := updatePolicy(c); err != nil {
		t.Fatalf("second call answered by the next step: %v", err)
	}
	if seq.calls.Load() != 2 {
		t.Fatalf("calls %d", seq.calls.Load())
	}
}

// A replay whose answer was lost is asked again under the same
// Idempotency-Key, which the server answers with the replay it made (it
// commits the replay and its answer together); another call has its own.
func TestReplayRepeatedUnderOneIdempotencyKey(t *testing.T) {
	t.Parallel()
	var keys []string
	record := func(r *http.Request) { keys = append(keys, r.Header.Get(IdempotencyKeyHeader)) }
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) { record(r); apiError(w, 502, CodeInternal, nil) },
		func(w http.ResponseWriter, r *http.Request) {
			record(r)
			writeJSON(w, 200, map[string]any{"stepId": "stp_1", "status": "QUEUED"})
		},
		func(w http.ResponseWriter, r *http.Request) {
			record(r)
			writeJSON(w, 200, map[string]any{"stepId": "stp_2", "status": "QUEUED"})
		},
	}}
	c, _ := testClient(t, seq)
	res, err := c.Replay(context.Background(), "stp_1", ReplayOptions{AcknowledgeDuplicateRisk: true})
	if err != nil || res.StepID != "stp_1" {
		t.Fatalf("replay %+v, %v", res, err)
	}
	if _, err := c.Replay(context.Background(), "stp_2", ReplayOptions{AcknowledgeDuplicateRisk: true}); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 || keys[0] == "" || keys[1] != keys[0] || keys[2] == keys[0] {
		t.Fatalf("keys %q: one per call, the same on its repeat", keys)
	}
}

func TestClientErrorsNotRetried(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) { apiError(w, 409, CodeLeaseLost, nil) },
	}}
	c, _ := testClient(t, seq)
	_, err := c.ReportJob(context.Background(), "job_1", JobReport{LeaseToken: "t", Status: ReportSucceeded})
	if !IsCode(err, CodeLeaseLost) || seq.calls.Load() != 1 {
		t.Fatalf("err %v calls %d", err, seq.calls.Load())
	}
}

func TestRetryRequestRetriedAtOnce(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) { apiError(w, 409, CodeRetryRequest, nil) },
		func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 200, map[string]any{"decision": "duplicate", "effect_id": "eff_1", "result": map[string]any{"ok": true}})
		},
	}}
	c, log := testClient(t, seq)
	b, err := c.Begin(context.Background(), BeginRequest{EffectType: "email.send", IdempotencyKey: "k"})
	if err != nil || b.Decision != DecisionDuplicate {
		t.Fatalf("begin %+v err %v", b, err)
	}
	if got := log.all(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("sleeps %v", got)
	}
}

// failingTransport fails the first n requests with a network error.
type failingTransport struct {
	n     atomic.Int32
	calls atomic.Int32
	next  http.RoundTripper
}

func (f *failingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	f.calls.Add(1)
	if f.n.Add(-1) >= 0 {
		return nil, errors.New("connection reset by peer")
	}
	return f.next.RoundTrip(r)
}

func TestNetworkErrorsRetriedForIdempotentCalls(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"leaseExpiresAt": time.Now().Add(time.Minute), "cancelRequested": false})
	}))
	defer srv.Close()
	ft := &failingTransport{next: srv.Client().Transport}
	ft.n.Store(2)
	c, err := NewClient(Config{BaseURL: srv.URL, APIKey: "k", HTTPClient: &http.Client{Transport: ft}})
	if err != nil {
		t.Fatal(err)
	}
	log := &sleepLog{}
	c.sleep = log.sleep
	if _, err := c.HeartbeatJob(context.Background(), "job_1", "tok"); err != nil {
		t.Fatal(err)
	}
	if ft.calls.Load() != 3 || len(log.all()) != 2 {
		t.Fatalf("calls %d sleeps %v", ft.calls.Load(), log.all())
	}
	// A non-idempotent call surfaces the network error instead.
	ft.n.Store(1)
	if _, err := updatePolicy(c); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("err %v", err)
	}
}

// An http.Client Timeout's error matches context.DeadlineExceeded, yet the
// caller's context is live: the answer was lost, so an idempotent call is
// asked again (QA: a begin whose answer came after the client's timeout was
// given up at once), and a call that is not ends with an error saying it may
// have been applied.
func TestClientTimeoutIsALostAnswer(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			time.Sleep(300 * time.Millisecond)
		}
		writeJSON(w, 200, map[string]any{"leaseExpiresAt": time.Now().Add(time.Minute), "cancelRequested": false})
	}))
	defer srv.Close()
	c, err := NewClient(Config{BaseURL: srv.URL, APIKey: "k", HTTPClient: &http.Client{Timeout: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	log := &sleepLog{}
	c.sleep = log.sleep
	if _, err := c.HeartbeatJob(context.Background(), "job_1", "tok"); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	if calls.Load() != 2 || len(log.all()) != 1 {
		t.Fatalf("calls %d sleeps %v", calls.Load(), log.all())
	}
	calls.Store(0)
	_, err = updatePolicy(c)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !mayHaveApplied(err) || calls.Load() != 1 {
		t.Fatalf("update policy: err %v (may have applied %v) calls %d", err, mayHaveApplied(err), calls.Load())
	}
}

func TestMayHaveApplied(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{&Error{StatusCode: 400, Code: CodeInvalidRequest}, false},
		{&Error{StatusCode: 409, Code: CodeInvalidState}, false},
		{&Error{StatusCode: 503, Code: CodeDatabaseUnavailable, Detail: map[string]any{"outcome": "not_applied"}}, false},
		{&Error{StatusCode: 503, Code: CodeDatabaseUnavailable, Detail: map[string]any{"outcome": "unknown"}}, true},
		{&Error{StatusCode: 500, Code: CodeInternal}, true},
		{&netError{err: errors.New("connection reset")}, true},
		{context.Canceled, true},
		{fmt.Errorf("start run: %w", &unconfirmed{err: &Error{StatusCode: 409, Code: CodeInvalidState}}), true},
		{&BlockedError{EffectID: "eff_1"}, false},
		{&ApprovalRequiredError{EffectID: "eff_1"}, false},
		{&DeniedError{Code: "policy_denied"}, false}, // a nil Err, as a test builds it
		{&DeniedError{Code: "policy_denied", Err: &Error{StatusCode: 403, Code: "policy_denied"}}, false},
		{&InFlightError{Err: context.DeadlineExceeded}, false},
		{errors.New("ratchet: something of the process"), true},
	} {
		if got := MayHaveApplied(c.err); got != c.want {
			t.Errorf("MayHaveApplied(%v) = %v, want %v", c.err, got, c.want)
		}
		_ = ErrorCode(c.err) // never panics, a DeniedError without its Err included
	}
}

func TestContextCancelStopsRetries(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) { apiError(w, 500, CodeInternal, nil) },
	}}
	c, _ := testClient(t, seq)
	ctx, cancel := context.WithCancel(context.Background())
	c.sleep = func(context.Context, time.Duration) error { cancel(); return context.Canceled }
	if _, err := c.GetRun(ctx, "run_1"); !IsCode(err, CodeInternal) {
		t.Fatalf("err %v", err)
	}
	if seq.calls.Load() != 1 {
		t.Fatalf("calls %d", seq.calls.Load())
	}
}

// A database_unavailable that changed nothing (detail.outcome
// "not_applied") is repeated for any call, StartRun included.
func TestDatabaseUnavailableRetriedForAnyCall(t *testing.T) {
	t.Parallel()
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) {
			apiError(w, 503, "database_unavailable", map[string]any{"outcome": "not_applied"})
		},
		func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 201, map[string]any{"id": "run_2"}) },
	}}
	c, log := testClient(t, seq)
	run, err := c.StartRun(context.Background(), "x")
	if err != nil || run.ID != "run_2" || len(log.all()) != 1 {
		t.Fatalf("run %+v err %v sleeps %v", run, err, log.all())
	}
}

// A database_unavailable whose outcome is unknown (the call reached the
// database before it failed) is not repeated for a call without a key or
// token: a policy update would meet its own write. An idempotent call is.
func TestDatabaseUnavailableWithUnknownOutcomeRetriedOnlyWhenSafe(t *testing.T) {
	t.Parallel()
	unknown := func(w http.ResponseWriter, r *http.Request) {
		apiError(w, 503, "database_unavailable", map[string]any{"outcome": "unknown"})
	}
	// Nor one that does not say (an older server): it may have been applied.
	silent := func(w http.ResponseWriter, r *http.Request) { apiError(w, 503, "database_unavailable", nil) }
	for _, first := range []func(http.ResponseWriter, *http.Request){unknown, silent} {
		seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){first,
			func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 201, map[string]any{"id": "run_2"}) },
		}}
		c, _ := testClient(t, seq)
		if _, err := updatePolicy(c); !IsCode(err, "database_unavailable") || seq.calls.Load() != 1 {
			t.Fatalf("err %v after %d calls", err, seq.calls.Load())
		}
	}
	seq := &sequence{steps: []func(http.ResponseWriter, *http.Request){unknown,
		func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 200, map[string]any{"decision": "in_flight", "effect_id": "eff_1", "state": "leased", "attempt": 1})
		},
	}}
	c, _ := testClient(t, seq)
	if _, err := c.Begin(context.Background(), BeginRequest{EffectType: "email.send", IdempotencyKey: "k"}); err != nil ||
		seq.calls.Load() != 2 {
		t.Fatalf("err %v after %d calls", err, seq.calls.Load())
	}
}

// The default client keeps a connection per concurrent caller: with
// net/http's default of 2 idle connections per host, 16 goroutines enqueuing
// in turn opened a new connection (a TLS handshake, over HTTPS) for most of
// their requests.
func TestDefaultClientReusesConnections(t *testing.T) {
	t.Parallel()
	var opened atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		writeJSON(w, 201, map[string]any{"idempotencyKey": "k"})
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := NewClient(Config{BaseURL: srv.URL, APIKey: "test-key"})
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 16, 25
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if _, err := c.Enqueue(context.Background(), "run_1", nil, EnqueueOptions{Name: "t", Version: "1"}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// One per goroutine, and some slack: a request that finds no idle
	// connection dials one, and keeps it even when another came free first.
	if n := opened.Load(); n > 2*goroutines {
		t.Fatalf("%d connections opened for %d requests from %d goroutines; want about one per goroutine", n, goroutines*each, goroutines)
	}
}

func TestKeepAliveRaisesIdleLimitsOnACopy(t *testing.T) {
	t.Parallel()
	base := &http.Transport{MaxIdleConns: 10, MaxIdleConnsPerHost: 2}
	got, ok := keepAlive(base).(*http.Transport)
	if !ok || got == base {
		t.Fatalf("keepAlive returned %T %p, want a copy of %p", got, got, base)
	}
	if got.MaxIdleConnsPerHost != idleConnsPerHost || got.MaxIdleConns != idleConnsPerHost {
		t.Fatalf("copy keeps %d per host, %d in all; want %d and %d", got.MaxIdleConnsPerHost, got.MaxIdleConns,
			idleConnsPerHost, idleConnsPerHost)
	}
	if base.MaxIdleConnsPerHost != 2 || base.MaxIdleConns != 10 {
		t.Fatal("keepAlive changed the transport it was given")
	}
	unlimited := keepAlive(&http.Transport{}).(*http.Transport)
	if unlimited.MaxIdleConns != 0 {
		t.Fatalf("an unlimited pool (0) became %d", unlimited.MaxIdleConns)
	}
	// A replaced DefaultTransport that is not an *http.Transport is kept.
	custom := &failingTransport{}
	if keepAlive(custom) != custom {
		t.Fatal("a custom RoundTripper was replaced")
	}
}

// StartRun sends a wallet only when asked to, and reads it back.
func TestStartRunBudget(t *testing.T) {
	t.Parallel()
	var bodies []map[string]any
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		bodies = append(bodies, body)
		out := map[string]any{"id": "run_1", "name": body["name"], "budgetMicros": body["budgetMicros"]}
		if body["budgetMicros"] != nil {
			out["spentMicros"] = 0
		}
		writeJSON(w, 201, out)
	})
	c, _ := testClient(t, h)
	plain, err := c.StartRun(context.Background(), "plain")
	if err != nil || plain.BudgetMicros != nil || plain.SpentMicros != nil {
		t.Fatalf("run %+v err %v", plain, err)
	}
	walleted, err := c.StartRun(context.Background(), "agent", WithBudgetMicros(5_000_000))
	if err != nil || walleted.BudgetMicros == nil || *walleted.BudgetMicros != 5_000_000 ||
		walleted.SpentMicros == nil || *walleted.SpentMicros != 0 {
		t.Fatalf("run %+v err %v", walleted, err)
	}
	if _, sent := bodies[0]["budgetMicros"]; sent || len(bodies[0]) != 1 {
		t.Fatalf("plain run sent %v", bodies[0])
	}
	if bodies[1]["budgetMicros"] != float64(5_000_000) {
		t.Fatalf("wallet run sent %v", bodies[1])
	}
}

// A refused report in a batch carries the error's detail, as ReportJob's
// error does (e.g. the tool a restricted key is missing).
func TestReportJobsKeepsErrorDetail(t *testing.T) {
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"results": []any{
			map[string]any{"jobId": "job_1", "error": map[string]any{"code": CodeForbidden, "message": "no",
				"detail": map[string]any{"required": []string{"tool:charge@1"}}}},
		}})
	}))
	res, err := c.ReportJobs(context.Background(), []BatchJobReport{{JobID: "job_1",
		JobReport: JobReport{LeaseToken: "t", Status: ReportSucceeded}}})
	if err != nil {
		t.Fatal(err)
	}
	if e := res[0].Err; e == nil || e.Code != CodeForbidden || e.StatusCode != http.StatusForbidden ||
		!jsonEqual(e.Detail["required"], []any{"tool:charge@1"}) {
		t.Fatalf("batch error: %+v", res[0].Err)
	}
}

// A refused report in a batch carries the batch response's request id, as
// ReportJob's refusal carries its own response's (SDK QA: it had none).
func TestReportJobsErrorsCarryTheBatchRequestID(t *testing.T) {
	t.Parallel()
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req_batch")
		writeJSON(w, 200, map[string]any{"results": []any{
			map[string]any{"jobId": "job_1", "error": map[string]any{"code": CodeLeaseLost, "message": "no"}},
			map[string]any{"jobId": "job_2", "status": "SUCCEEDED", "attempt": 1},
		}})
	}))
	res, err := c.ReportJobs(context.Background(), []BatchJobReport{
		{JobID: "job_1", JobReport: JobReport{LeaseToken: "t1", Status: ReportSucceeded}},
		{JobID: "job_2", JobReport: JobReport{LeaseToken: "t2", Status: ReportSucceeded}}})
	if err != nil {
		t.Fatal(err)
	}
	if e := res[0].Err; e == nil || e.RequestID != "req_batch" || !strings.Contains(e.Error(), "(request req_batch)") {
		t.Fatalf("batch error: %v", res[0].Err)
	}
	if res[1].Err != nil {
		t.Fatalf("recorded report: %v", res[1].Err)
	}
}

// A batch answer whose result in a slot names another job than the report
// sent there cannot be matched to the reports, not even those whose slots
// agree: it is an answer lost, and the batch, safe to repeat, is asked
// again, as the Python and TypeScript SDKs do (SDK QA: Go failed the call
// with an error no retry logic took for a lost answer).
func TestReportJobsAsksAgainAfterAMismatchedAnswer(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first, second := "job_1", "job_2"
		if calls.Add(1) == 1 {
			first, second = "job_2", "job_1"
		}
		writeJSON(w, 200, map[string]any{"results": []any{
			map[string]any{"jobId": first, "status": "SUCCEEDED", "attempt": 1},
			map[string]any{"jobId": second, "status": "SUCCEEDED", "attempt": 1},
		}})
	}))
	res, err := c.ReportJobs(context.Background(), []BatchJobReport{
		{JobID: "job_1", JobReport: JobReport{LeaseToken: "t1", Status: ReportSucceeded}},
		{JobID: "job_2", JobReport: JobReport{LeaseToken: "t2", Status: ReportSucceeded}}})
	if err != nil || calls.Load() != 2 || res[0].JobID != "job_1" || res[1].JobID != "job_2" {
		t.Fatalf("results %+v, err %v after %d calls", res, err, calls.Load())
	}
	c.maxRetries = 0
	calls.Store(0)
	_, err = c.ReportJobs(context.Background(), []BatchJobReport{
		{JobID: "job_1", JobReport: JobReport{LeaseToken: "t1", Status: ReportSucceeded}},
		{JobID: "job_2", JobReport: JobReport{LeaseToken: "t2", Status: ReportSucceeded}}})
	if _, retry := c.retryDelay(err, 0, idempotent); err == nil || !retry {
		t.Fatalf("without retries: %v, taken for a lost answer: %v", err, retry)
	}
}

// A 403's error names what the key lacks, as the server's detail does.
func TestForbiddenErrorNamesWhatIsRequired(t *testing.T) {
	t.Parallel()
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		apiError(w, 403, CodeForbidden, map[string]any{"required": []any{"effects:begin"}})
	}))
	_, err := c.StartRun(context.Background(), "r")
	var apiErr *Error
	if !errors.As(err, &apiErr) || !slices.Equal(apiErr.Required(), []string{"effects:begin"}) {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(err.Error(), "(requires effects:begin)") {
		t.Fatalf("message %q", err.Error())
	}
}

// A route any one of several scopes opens says so: the message names the
// alternatives, not only the first.
func TestForbiddenErrorNamesItsAlternatives(t *testing.T) {
	t.Parallel()
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		apiError(w, 403, CodeForbidden, map[string]any{"required": []any{"effects:read"},
			"any_of": []any{"effects:read", "effects:begin"}})
	}))
	_, err := c.StartRun(context.Background(), "r")
	var apiErr *Error
	if !errors.As(err, &apiErr) || !slices.Equal(apiErr.AnyOf(), []string{"effects:read", "effects:begin"}) ||
		!slices.Equal(apiErr.Required(), []string{"effects:read"}) {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(err.Error(), "(requires one of effects:read, effects:begin)") {
		t.Fatalf("message %q", err.Error())
	}
}

// RegisterWorker sends one Idempotency-Key with every attempt, so a repeat
// after a lost answer gets the worker id the first registered; each call
// has its own key. While the server holds the key for the first attempt
// (409 retry_request with retry_after_seconds) the call waits as asked,
// longer than MaxRetries allows retries (review: it failed in 3 s while the
// key was held 60).
func TestRegisterWorkerRetriesUnderOneIdempotencyKey(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var keys []string
	calls := 0
	c, log := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get(IdempotencyKeyHeader))
		calls++
		switch {
		case calls == 1:
			apiError(w, 503, CodeDatabaseUnavailable, map[string]any{"outcome": "unknown"})
		case calls <= 7:
			apiError(w, 409, CodeRetryRequest, map[string]any{"retry_after_seconds": 5})
		default:
			writeJSON(w, 201, map[string]any{"workerId": "wkr_1"})
		}
	}))
	id, err := c.RegisterWorker(context.Background(), []ToolRef{{Name: "send", Version: "1"}})
	if err != nil || id != "wkr_1" {
		t.Fatalf("id %q err %v", id, err)
	}
	if len(keys) != 8 || keys[0] == "" {
		t.Fatalf("keys %q", keys)
	}
	for _, k := range keys {
		if k != keys[0] {
			t.Fatalf("keys %q", keys)
		}
	}
	if got := log.all(); len(got) != 7 || got[1] != 5*time.Second || got[6] != 5*time.Second {
		t.Fatalf("sleeps %v", got)
	}
	if _, err := c.RegisterWorker(context.Background(), []ToolRef{{Name: "send", Version: "1"}}); err != nil {
		t.Fatal(err)
	}
	if keys[8] == keys[0] {
		t.Fatal("a second registration reused the first one's key")
	}

	// A held key asking for no pause is still asked again a second later.
	var held atomic.Bool
	c2, log2 := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !held.Swap(true) {
			apiError(w, 409, CodeRetryRequest, nil)
			return
		}
		writeJSON(w, 201, map[string]any{"workerId": "wkr_2"})
	}))
	if id, err := c2.RegisterWorker(context.Background(), []ToolRef{{Name: "send", Version: "1"}}); err != nil || id != "wkr_2" {
		t.Fatalf("id %q err %v", id, err)
	}
	if got := log2.all(); len(got) != 1 || got[0] != time.Second {
		t.Fatalf("sleeps %v", got)
	}

	// A key held past every wait is answered as it is.
	mu.Lock()
	calls = -1000
	mu.Unlock()
	if _, err := c.RegisterWorker(context.Background(), []ToolRef{{Name: "send", Version: "1"}}); !IsCode(err, CodeRetryRequest) {
		t.Fatalf("err %v", err)
	}
}

// MaxRetries < 0 disables a keyed call's waits for its held key too.
func TestNegativeMaxRetriesWaitsForNoHeldKey(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		apiError(w, 409, CodeRetryRequest, map[string]any{"retry_after_seconds": 1})
	}))
	defer srv.Close()
	c, err := NewClient(Config{BaseURL: srv.URL, APIKey: "k", HTTPClient: srv.Client(), MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	c.sleep = (&sleepLog{}).sleep
	if _, err := c.RegisterWorker(context.Background(), []ToolRef{{Name: "send", Version: "1"}}); !IsCode(err, CodeRetryRequest) {
		t.Fatalf("err %v", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("calls %d", calls.Load())
	}
}

// A 2xx whose body cannot be read (cut short by a proxy, say) lost the
// answer of a call the server applied: a call safe to repeat is asked again
// for it, and decodes into a clean value (not over what the unreadable one
// half filled in); one that is not says it may have been applied.
func TestAnUnreadableAnswerIsAskedForAgainWhereSafe(t *testing.T) {
	t.Parallel()
	answer := func(body string) func(http.ResponseWriter, *http.Request) {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, body)
		}
	}
	hb := &sequence{steps: []func(http.ResponseWriter, *http.Request){
		answer(`{"cancelRequested":true,"leaseExpiresAt":5}`), // a type error, after cancelRequested was set
		answer(`{"leaseExpiresAt":"2026-12-02T10:01:00Z"}`),
	}}
	c, _ := testClient(t, hb)
	got, err := c.HeartbeatJob(context.Background(), "job_1", "tok")
	if err != nil {
		t.Fatal(err)
	}
	if hb.calls.Load() != 2 || got.CancelRequested || !got.LeaseExpiresAt.Equal(time.Date(2026, 12, 2, 10, 1, 0, 0, time.UTC)) {
		t.Fatalf("calls %d, answer %+v", hb.calls.Load(), got)
	}

	run := &sequence{steps: []func(http.ResponseWriter, *http.Request){answer(`{"id":"run_1","na`)}}
	c, _ = testClient(t, run)
	if _, err := updatePolicy(c); err == nil || !MayHaveApplied(err) || run.calls.Load() != 1 {
		t.Fatalf("err %v (may have applied: %v), calls %d", err, MayHaveApplied(err), run.calls.Load())
	}
}

// A 2xx whose body is not a JSON object (empty: a proxy's, or a head cut
// after its status line; or another JSON value) is an answer lost, as an
// unreadable one: it was decoded as the zero answer, so a claim read as no
// jobs, its jobs left leased to nobody.
func TestA2xxWithoutAnObjectIsALostAnswer(t *testing.T) {
	t.Parallel()
	for _, body := range []string{"", " ", "null", "[]", `"x"`} {
		run := &sequence{steps: []func(http.ResponseWriter, *http.Request){func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, body)
		}}}
		c, _ := testClient(t, run)
		if _, err := updatePolicy(c); err == nil || !MayHaveApplied(err) || run.calls.Load() != 1 {
			t.Fatalf("body %q: err %v (may have applied: %v), calls %d", body, err, MayHaveApplied(err), run.calls.Load())
		}
	}
}

// Reconcile sends one Idempotency-Key with every attempt, so a retry after
// a lost answer is answered the first call's resolutions, not a second
// comparison that reads them as matched.
func TestReconcileRetriesUnderOneIdempotencyKey(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var keys []string
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get(IdempotencyKeyHeader))
		if len(keys) == 1 {
			apiError(w, 503, CodeDatabaseUnavailable, map[string]any{"outcome": "unknown"})
			return
		}
		writeJSON(w, 200, map[string]any{"effect_type": "payment.charge", "resolved": []any{}})
	}))
	if _, err := c.Reconcile(context.Background(), ReconcileRequest{EffectType: "payment.charge"}); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("keys %q", keys)
	}
}

// Every create the server keys takes an Idempotency-Key of the caller's, as
// the Python and TypeScript SDKs' do, sent on each of the call's attempts
// and never in the body; an empty one is replaced by a fresh key (parity
// QA: Reconcile, PublishContract, TestTool, RotateWebhookSecret and
// RetryWebhookDeliveries took none, so a caller whose retries ran out
// could not ask again for the first answer; CreateKeyWithKey with "" was
// retried without any key, and could mint a second key).
func TestKeyedCreatesTakeTheCallersIdempotencyKey(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	calls := map[string]func(c *Client, key string) error{
		"POST /api/v1/reconcile": func(c *Client, key string) error {
			_, err := c.Reconcile(context.Background(), ReconcileRequest{EffectType: "payment.charge", From: from,
				To: from.Add(time.Hour), IdempotencyKey: key})
			return err
		},
		"POST /api/v1/tools/t/contracts": func(c *Client, key string) error {
			_, err := c.PublishContract(context.Background(), "t", ContractSpec{HandlerVersion: "1",
				InputSchema: json.RawMessage(`{}`), IdempotencyKey: key})
			return err
		},
		"POST /api/v1/tools/t/test": func(c *Client, key string) error {
			_, err := c.TestToolWithKey(context.Background(), "t", "1", map[string]int{"a": 1}, key)
			return err
		},
		"POST /api/v1/webhooks/whk_1/rotate-secret": func(c *Client, key string) error {
			_, err := c.RotateWebhookSecret(context.Background(), "whk_1", RotateSecretOptions{IdempotencyKey: key})
			return err
		},
		"POST /api/v1/webhooks/whk_1/deliveries/retry": func(c *Client, key string) error {
			_, err := c.RetryWebhookDeliveriesWithKey(context.Background(), "whk_1", []string{"d1"}, key)
			return err
		},
		"POST /api/v1/keys": func(c *Client, key string) error {
			_, err := c.CreateKeyWithKey(context.Background(), KeySpec{Name: "k", Preset: "AGENT"}, key)
			return err
		},
		"POST /api/v1/webhooks": func(c *Client, key string) error {
			_, err := c.CreateWebhookWithKey(context.Background(), "https://x.test/h", []string{"run.finished"}, key)
			return err
		},
	}
	// The actions keyed for their repeat's sake take the caller's too, so
	// that a retry from another process can reuse the first call's key
	// (each sent a fresh key of its own, and took none).
	maps.Copy(calls, keyedActionsWithKey())
	for route, call := range calls {
		for _, given := range []string{"ops:" + route, ""} {
			var mu sync.Mutex
			var keys []string
			c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				mu.Lock()
				defer mu.Unlock()
				if got := r.Method + " " + r.URL.EscapedPath(); got != route {
					t.Errorf("%s: called %s", route, got)
				}
				if bytes.Contains(bytes.ToLower(body), []byte("ops:")) || bytes.Contains(body, []byte("IdempotencyKey")) {
					t.Errorf("%s: the key went in the body: %s", route, body)
				}
				keys = append(keys, r.Header.Get(IdempotencyKeyHeader))
				if len(keys) == 1 {
					apiError(w, 500, CodeInternal, nil)
					return
				}
				writeJSON(w, 200, map[string]any{})
			}))
			if err := call(c, given); err != nil {
				t.Fatalf("%s: %v", route, err)
			}
			if len(keys) != 2 || keys[0] != keys[1] || keys[0] == "" || (given != "" && keys[0] != given) {
				t.Fatalf("%s given %q: keys %q", route, given, keys)
			}
		}
	}
}

// keyedActionsWithKey calls each action's XWithKey variant under key, by
// route.
func keyedActionsWithKey() map[string]func(c *Client, key string) error {
	ctx := context.Background()
	on := true
	return map[string]func(c *Client, key string) error{
		"POST /api/v1/circuits/t/open": func(c *Client, key string) error {
			_, err := c.OpenCircuitWithKey(ctx, "t", BreakerDeny, "incident", key)
			return err
		},
		"POST /api/v1/circuits/t/close": func(c *Client, key string) error {
			_, err := c.CloseCircuitWithKey(ctx, "t", key)
			return err
		},
		"POST /api/v1/circuits/stop": func(c *Client, key string) error {
			_, err := c.EmergencyStopWithKey(ctx, "", "incident", key)
			return err
		},
		"POST /api/v1/circuits/release": func(c *Client, key string) error {
			_, err := c.ReleaseEmergencyStopWithKey(ctx, key)
			return err
		},
		"POST /api/v1/steps/stp_1/cancel": func(c *Client, key string) error {
			_, err := c.CancelStepWithKey(ctx, "stp_1", key)
			return err
		},
		"POST /api/v1/endpoints/end_1/pause": func(c *Client, key string) error {
			_, err := c.PauseEndpointWithKey(ctx, "end_1", key)
			return err
		},
		"POST /api/v1/endpoints/end_1/resume": func(c *Client, key string) error {
			_, err := c.ResumeEndpointWithKey(ctx, "end_1", key)
			return err
		},
		"POST /api/v1/endpoints/end_1/circuit/close": func(c *Client, key string) error {
			_, err := c.CloseEndpointCircuitWithKey(ctx, "end_1", key)
			return err
		},
		"PATCH /api/v1/webhooks/whk_1": func(c *Client, key string) error {
			_, err := c.UpdateWebhookWithKey(ctx, "whk_1", WebhookUpdate{Disabled: &on}, key)
			return err
		},
		"PUT /api/v1/policies/t": func(c *Client, key string) error {
			_, err := c.UpdateEffectPolicyWithKey(ctx, "t", nil, PolicyUpdate{"mode": "deny"}, key)
			return err
		},
	}
}

// Every action the server takes an Idempotency-Key on because its repeat
// would undo another actor's change (a breaker's open or close, the stop
// and its release, a step's cancel, an endpoint's pause, resume or circuit
// close, a webhook's update) is sent under a key of the call's own, the
// same on each of its retries and another on the next call: retried
// without one, a close whose answer was lost closed a breaker that had
// tripped again since, a cancel cancelled a replay made since.
func TestActionsAreRetriedUnderAnIdempotencyKeyOfTheirOwn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	off := false
	calls := map[string]func(c *Client) error{
		"POST /api/v1/circuits/email.send/open": func(c *Client) error {
			_, err := c.OpenCircuit(ctx, "email.send", BreakerDeny, "incident")
			return err
		},
		"POST /api/v1/circuits/email.send/close": func(c *Client) error {
			_, err := c.CloseCircuit(ctx, "email.send")
			return err
		},
		"POST /api/v1/circuits/stop": func(c *Client) error {
			_, err := c.EmergencyStop(ctx, "", "incident")
			return err
		},
		"POST /api/v1/circuits/release": func(c *Client) error {
			_, err := c.ReleaseEmergencyStop(ctx)
			return err
		},
		"POST /api/v1/steps/stp_1/cancel": func(c *Client) error {
			_, err := c.CancelStep(ctx, "stp_1")
			return err
		},
		"POST /api/v1/endpoints/end_1/pause": func(c *Client) error {
			_, err := c.PauseEndpoint(ctx, "end_1")
			return err
		},
		"POST /api/v1/endpoints/end_1/resume": func(c *Client) error {
			_, err := c.ResumeEndpoint(ctx, "end_1")
			return err
		},
		"POST /api/v1/endpoints/end_1/circuit/close": func(c *Client) error {
			_, err := c.CloseEndpointCircuit(ctx, "end_1")
			return err
		},
		"PATCH /api/v1/webhooks/whk_1": func(c *Client) error {
			_, err := c.UpdateWebhook(ctx, "whk_1", WebhookUpdate{Disabled: &off})
			return err
		},
		// An update without expectedVersion retried after another
		// operator's wrote over theirs; with it, it met its own version.
		"PUT /api/v1/policies/a%2Fb": func(c *Client) error {
			_, err := c.UpdateEffectPolicy(ctx, "a/b", nil, PolicyUpdate{"mode": "deny"})
			return err
		},
	}
	for route, call := range calls {
		var mu sync.Mutex
		var keys []string
		c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if got := r.Method + " " + r.URL.EscapedPath(); got != route {
				t.Errorf("%s: called %s", route, got)
			}
			keys = append(keys, r.Header.Get(IdempotencyKeyHeader))
			if len(keys) == 1 {
				apiError(w, 502, CodeInternal, nil) // its answer lost
				return
			}
			writeJSON(w, 200, map[string]any{})
		}))
		for range 2 {
			if err := call(c); err != nil {
				t.Fatalf("%s: %v", route, err)
			}
		}
		if len(keys) != 3 || keys[0] == "" || keys[1] != keys[0] || keys[2] == "" || keys[2] == keys[0] {
			t.Fatalf("%s: keys %q: one per call, the same on its retry", route, keys)
		}
	}
}

// Printing a Config or a *Client (a startup log of the settings, a debug
// print) wrote the bearer secret: %+v showed every field.
func TestPrintedConfigAndClientHideTheKey(t *testing.T) {
	const secret = "rk_live_0123456789abcdef"
	cfg := Config{BaseURL: "http://localhost:8787", APIKey: secret}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("starting", "config", cfg, "client", c)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("starting", "config", cfg, "client", c)
	printed := fmt.Sprintf("%v %+v %#v %v %+v %#v %v", cfg, cfg, cfg, c, c, c, &cfg) + logged.String()
	if strings.Contains(printed, secret) || strings.Contains(printed, "rk_live") {
		t.Fatalf("the key was printed: %s", printed)
	}
	if !strings.Contains(printed, "[redacted]") || !strings.Contains(printed, "localhost:8787") {
		t.Fatalf("printed without the masked key or the origin: %s", printed)
	}
}

// A base URL holding a user and password (the API key is the credential)
// is refused by NewClient, as the TypeScript and Python SDKs refuse it
// (the client ignored them: Bearer won), and printed without them by a
// Config and by every refusal alike (they were printed whole).
func TestPrintedConfigAndClientHideTheBaseURLsUserinfo(t *testing.T) {
	cfg := Config{BaseURL: "https://deploy:s3cret@ratchet.example/base", APIKey: "rk_test"}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("starting", "config", cfg)
	_, credentials := NewClient(cfg)
	_, refused := NewClient(Config{BaseURL: "ftp://deploy:s3cret@ratchet.example", APIKey: "rk_test"})
	_, unparsed := NewClient(Config{BaseURL: "https://deploy:s3cret@ratchet.example:port", APIKey: "rk_test"})
	_, userOnly := NewClient(Config{BaseURL: "https://deploy@ratchet.example", APIKey: "rk_test"})
	if credentials == nil || refused == nil || unparsed == nil || userOnly == nil {
		t.Fatalf("refused %v, %v, %v, %v", credentials, refused, unparsed, userOnly)
	}
	if !strings.Contains(credentials.Error(), "must not hold credentials") {
		t.Fatalf("refused for another reason: %v", credentials)
	}
	printed := fmt.Sprintf("%v %+v %#v", cfg, cfg, &cfg) + logged.String() + credentials.Error() +
		refused.Error() + unparsed.Error() + userOnly.Error()
	if strings.Contains(printed, "s3cret") || strings.Contains(printed, "deploy") {
		t.Fatalf("the base URL's user or password was printed: %s", printed)
	}
	if !strings.Contains(printed, "https://ratchet.example/base") {
		t.Fatalf("printed without the origin: %s", printed)
	}
}

// ListKeysMintedBy sends the key id as created_by beside the page, and an
// empty one too (the server refuses it) rather than leaving it out, which
// would list every key as the ones a compromised key minted; the answer's
// keys name their minter.
func TestListKeysMintedBySendsTheKeyID(t *testing.T) {
	t.Parallel()
	c, seen := recordingClient(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"data": []any{map[string]any{"id": "key_2", "created_by_key_id": "key_1"},
			map[string]any{"id": "key_3", "created_by_key_id": nil}}, "next_cursor": nil})
	})
	ctx := context.Background()
	page, err := c.ListKeysMintedBy(ctx, "key_1", ListQuery{Limit: 2, Cursor: "key_0"})
	if err != nil || len(page.Data) != 2 || page.Data[0].CreatedByKeyID == nil || *page.Data[0].CreatedByKeyID != "key_1" ||
		page.Data[1].CreatedByKeyID != nil {
		t.Fatalf("page %+v, %v", page, err)
	}
	for _, call := range []func() error{
		func() error { _, err := c.ListKeysMintedBy(ctx, "", ListQuery{}); return err },
		func() error { _, err := c.ListKeys(ctx, ListQuery{}); return err },
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"GET /api/v1/keys?created_by=key_1&cursor=key_0&limit=2", "GET /api/v1/keys?created_by=",
		"GET /api/v1/keys"}
	if got := seen(); !slices.Equal(got, want) {
		t.Fatalf("requests %q, want %q", got, want)
	}
}

// recordingClient is a test client of a server answering with h that
// records each request's method and URI, read with seen.
func recordingClient(t *testing.T, h http.HandlerFunc) (c *Client, seen func() []string) {
	t.Helper()
	var (
		mu       sync.Mutex
		requests []string
	)
	c, _ = testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.Method+" "+r.URL.RequestURI())
		mu.Unlock()
		h(w, r)
	}))
	return c, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(requests)
	}
}

// RevokeKeyWithMinted sends include_minted=true (RevokeKey sends nothing
// more) and reads the ids revoked with the key; a refusal's detail names
// the key of the tree that refused it.
func TestRevokeKeyWithMintedSendsIncludeMinted(t *testing.T) {
	t.Parallel()
	c, seen := recordingClient(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/key_refused"):
			writeJSON(w, 403, map[string]any{"error": map[string]any{"code": "forbidden", "message": "no",
				"detail": map[string]any{"required": []string{"policies:write"}, "key_id": "key_3"}}})
		case r.URL.Query().Get("include_minted") == "true":
			writeJSON(w, 200, map[string]any{"id": "key_1", "revoked_at": "2030-01-01T00:00:00Z",
				"minted_revoked": []string{"key_2", "key_3"}})
		default:
			writeJSON(w, 200, map[string]any{"id": "key_1", "revoked_at": "2030-01-01T00:00:00Z"})
		}
	})
	ctx := context.Background()
	k, err := c.RevokeKeyWithMinted(ctx, "key_1")
	if err != nil || k.ID != "key_1" || k.RevokedAt == nil || !slices.Equal(k.MintedRevoked, []string{"key_2", "key_3"}) {
		t.Fatalf("revoked %+v, %v", k, err)
	}
	if k, err := c.RevokeKey(ctx, "key_1"); err != nil || k.ID != "key_1" {
		t.Fatalf("revoked %+v, %v", k, err)
	}
	_, err = c.RevokeKeyWithMinted(ctx, "key_refused")
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Code != "forbidden" || apiErr.Detail["key_id"] != "key_3" {
		t.Fatalf("refusal %#v", err)
	}
	want := []string{"DELETE /api/v1/keys/key_1?include_minted=true", "DELETE /api/v1/keys/key_1",
		"DELETE /api/v1/keys/key_refused?include_minted=true"}
	if got := seen(); !slices.Equal(got, want) {
		t.Fatalf("requests %q, want %q", got, want)
	}
}

// A group and a step say when their lists were cut to fit one answer
// (steps_truncated; attemptsTruncated, replaysTruncated), and the routes that
// page those lists whole are read through the SDK, repeated after a lost
// answer as any read (size QA: the flags were dropped unread, so a cut list
// read as the whole, and nothing paged the rest).
func TestCutListsAreSaidAndPagedWhole(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seen []string
		lost = map[string]bool{}
	)
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.RequestURI())
		first := !lost[r.URL.Path]
		lost[r.URL.Path] = true
		mu.Unlock()
		if first && r.URL.Path != "/api/v1/groups/grp_1" && r.URL.Path != "/api/v1/steps/stp_1" {
			apiError(w, 500, "internal_error", nil)
			return
		}
		switch r.URL.Path {
		case "/api/v1/groups/grp_1":
			writeJSON(w, 200, map[string]any{"id": "grp_1", "steps": []any{map[string]any{"effect_id": "eff_1"}},
				"steps_truncated": true})
		case "/api/v1/groups/grp_1/steps":
			writeJSON(w, 200, map[string]any{"data": []any{map[string]any{"effect_id": "eff_2", "has_compensation": true}},
				"next_cursor": "eff_2"})
		case "/api/v1/steps/stp_1":
			writeJSON(w, 200, map[string]any{"id": "stp_1", "durableJob": map[string]any{
				"attempts": []any{map[string]any{"attempt": 51}}, "attemptsTruncated": true,
				"replays": []any{}, "replaysTruncated": true}})
		case "/api/v1/steps/stp_1/attempts":
			writeJSON(w, 200, map[string]any{"data": []any{map[string]any{"attempt": 1}}, "nextCursor": "1"})
		case "/api/v1/steps/stp_1/replays":
			writeJSON(w, 200, map[string]any{"data": []any{map[string]any{"id": "rpl_1", "priorAttempt": 1}},
				"nextCursor": nil})
		default:
			apiError(w, 404, "not_found", nil)
		}
	}))
	ctx := context.Background()
	g, err := c.GetGroup(ctx, "grp_1")
	if err != nil || !g.StepsTruncated || len(g.Steps) != 1 {
		t.Fatalf("group %+v, %v", g, err)
	}
	steps, err := c.ListGroupSteps(ctx, "grp_1", ListQuery{Limit: 200, Cursor: g.Steps[0].EffectID})
	if err != nil || len(steps.Data) != 1 || !steps.Data[0].HasCompensation || steps.NextCursor == nil || *steps.NextCursor != "eff_2" {
		t.Fatalf("group steps %+v, %v", steps, err)
	}
	st, err := c.GetStep(ctx, "stp_1")
	if err != nil || !st.DurableJob.AttemptsTruncated || !st.DurableJob.ReplaysTruncated {
		t.Fatalf("step %+v, %v", st, err)
	}
	attempts, err := c.ListStepAttempts(ctx, "stp_1", ListQuery{Limit: 40})
	if err != nil || len(attempts.Data) != 1 || attempts.Data[0].Attempt != 1 || *attempts.NextCursor != "1" {
		t.Fatalf("attempts %+v, %v", attempts, err)
	}
	replays, err := c.ListStepReplays(ctx, "stp_1", ListQuery{Cursor: "rpl_0"})
	if err != nil || len(replays.Data) != 1 || replays.Data[0].PriorAttempt != 1 || replays.NextCursor != nil {
		t.Fatalf("replays %+v, %v", replays, err)
	}
	want := []string{
		"/api/v1/groups/grp_1",
		"/api/v1/groups/grp_1/steps?cursor=eff_1&limit=200", "/api/v1/groups/grp_1/steps?cursor=eff_1&limit=200",
		"/api/v1/steps/stp_1",
		"/api/v1/steps/stp_1/attempts?limit=40", "/api/v1/steps/stp_1/attempts?limit=40",
		"/api/v1/steps/stp_1/replays?cursor=rpl_0", "/api/v1/steps/stp_1/replays?cursor=rpl_0",
	}
	if !slices.Equal(seen, want) {
		t.Fatalf("requests %q, want %q", seen, want)
	}
}

// Request calls any route with the client's key, retries and errors, as the
// Python and TypeScript SDKs' request (parity QA: Go had no such call, so a
// route without a method of its own could not be reached through the SDK).
func TestRequestCallsAnyRoute(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []string
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get(IdempotencyKeyHeader)+" "+
			r.Header.Get("Authorization")+" "+string(body))
		n := len(seen)
		mu.Unlock()
		if n%2 == 1 {
			apiError(w, 500, CodeInternal, nil)
			return
		}
		writeJSON(w, 200, map[string]any{"ok": true})
	}))
	var out struct{ OK bool }
	err := c.Request(context.Background(), "POST", "/things?x=1", map[string]int{"a": 1}, &out,
		RequestOptions{Safe: true, IdempotencyKey: "k1"})
	if err != nil || !out.OK {
		t.Fatalf("err %v, out %+v", err, out)
	}
	want := `POST /api/v1/things?x=1 k1 Bearer test-key {"a":1}`
	if len(seen) != 2 || seen[0] != want || seen[1] != want {
		t.Fatalf("seen %q", seen)
	}
	// Not safe: a 500 is not repeated, and answers an *Error.
	var apiErr *Error
	if err := c.Request(context.Background(), "GET", "/other", nil, nil, RequestOptions{}); !errors.As(err, &apiErr) ||
		apiErr.Code != CodeInternal || len(seen) != 3 || seen[2] != "GET /api/v1/other  Bearer test-key " {
		t.Fatalf("err %v, seen %q", err, seen)
	}
}

// updatePolicy is a call that is not repeated after an ambiguous failure
// (the repeat of an update that was applied would meet the new version):
// what these tests send where a repeat could act twice.
func updatePolicy(c *Client) (*Endpoint, error) {
	return c.UpdateEndpointPolicy(context.Background(), "end_1", 1, PolicyUpdate{})
}

// StartRun and CreateGroup are retried after an ambiguous failure under an
// Idempotency-Key of their own, made once per call (they were not retried
// without a body key, and a caller's retry after a lost answer started a
// second run); a body key of the caller's goes in the body beside it.
func TestStartRunAndCreateGroupRetryUnderAnIdempotencyKeyOfTheirOwn(t *testing.T) {
	t.Parallel()
	for name, call := range map[string]func(*Client) (string, error){
		"StartRun": func(c *Client) (string, error) {
			r, err := c.StartRun(context.Background(), "r")
			return r.ID, err
		},
		"StartRun with a body key": func(c *Client) (string, error) {
			r, err := c.StartRun(context.Background(), "r", WithIdempotencyKey("onboard:1"))
			return r.ID, err
		},
		"CreateGroup": func(c *Client) (string, error) {
			g, err := c.CreateGroup(context.Background(), "g")
			return g.ID, err
		},
		"CreateGroupWithKey": func(c *Client) (string, error) {
			g, err := c.CreateGroupWithKey(context.Background(), "g", "checkout:1")
			return g.ID, err
		},
	} {
		var mu sync.Mutex
		var keys, bodies []string
		c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			b, _ := io.ReadAll(r.Body)
			keys, bodies = append(keys, r.Header.Get(IdempotencyKeyHeader)), append(bodies, string(b))
			if len(keys)%2 == 1 {
				apiError(w, 500, CodeInternal, nil)
				return
			}
			writeJSON(w, 201, map[string]any{"id": "x_1"})
		}))
		for range 2 {
			if id, err := call(c); err != nil || id != "x_1" {
				t.Fatalf("%s: %q, %v", name, id, err)
			}
		}
		if len(keys) != 4 || keys[0] == "" || keys[0] != keys[1] || keys[2] != keys[3] || keys[1] == keys[2] {
			t.Fatalf("%s: keys %q", name, keys)
		}
		if bodies[0] != bodies[1] || bodies[0] != bodies[3] || strings.Contains(bodies[0], keys[0]) {
			t.Fatalf("%s: bodies %q", name, bodies)
		}
	}
}

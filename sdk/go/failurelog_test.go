package ratchet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// secret stands for what the default failure log must never write: a key,
// an error message or detail, a payload.
const secret = "s3cr3t-do-not-log"

// lockedBuffer is a log handler's output, written by the notices' goroutine
// and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines are the lines written so far.
func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSpace(l.b.String()), "\n")
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// await waits until the log holds s, for up to 10 s.
func (l *lockedBuffer) await(s string) {
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(l.String(), s) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// loggingWorker is a worker of one tool over c whose default failure log
// writes to the buffer it returns, its clock at start, its jitter drawn
// whole.
func loggingWorker(t *testing.T, c *Client, clk *fakeClock, handler func(context.Context, welcomeIn, JobContext) (welcomeOut, error)) (*Worker, *lockedBuffer) {
	t.Helper()
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1", Handler: handler}))
	buf := &lockedBuffer{}
	w.log = slog.New(slog.NewTextHandler(buf, nil))
	if clk != nil {
		w.clock = clk
	}
	w.jitter = func() float64 { return 1 }
	return w, buf
}

func noWork(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }

// refusedURL is the address of a port nothing listens on.
func refusedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	must(t, l.Close())
	return addr
}

// A worker without OnError whose server cannot be reached says so in the
// default log (worker QA: it retried in silence for ever): the first failure
// at once, then one line a minute counting those left out, naming what
// failed and where, never the key. Nine registrations fail over 183 s (waits
// of 1, 2, 4 ... 32 s, then a minute): lines at 0 s, 63 s (five left out),
// 123 s and 183 s.
func TestWorkerWithoutOnErrorLogsAnUnreachableServer(t *testing.T) {
	t.Parallel()
	addr := refusedURL(t)
	c, err := NewClient(Config{BaseURL: "http://" + addr + "/prefix", APIKey: "rk_" + secret})
	must(t, err)
	c.sleep = func(ctx context.Context, _ time.Duration) error { return ctx.Err() }
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	waiting := make(chan struct{})
	fired := 0
	clk := &fakeClock{now: start, end: start.Add(24 * time.Hour), done: make(chan struct{}),
		fires: func(time.Duration) bool { // under clk.mu
			if fired++; fired > 8 {
				if fired == 9 {
					close(waiting)
				}
				return false
			}
			return true
		}}
	w, buf := loggingWorker(t, c, clk, noWork)
	started := make(chan error, 1)
	go func() { started <- w.Start(context.Background(), StartOptions{PollInterval: time.Second}) }()
	select {
	case <-waiting:
	case err := <-started:
		t.Fatalf("Start = %v, want it to wait for the server", err)
	}
	must(t, stopWithin(t, w, context.Background()))
	if err := awaitWithin(t, started, "Start"); !errors.Is(err, ErrWorkerStopped) {
		t.Fatalf("Start = %v", err)
	}
	lines := buf.lines()
	where := `error=network kind="connection refused" method=POST host=` + addr + ` path=/prefix/api/v1/workers/register`
	if len(lines) != 4 || !strings.Contains(lines[0], `level=WARN msg="ratchet worker" `+where) ||
		strings.Contains(lines[0], "more_since_last_line") || !strings.HasSuffix(lines[1], where+" more_since_last_line=5") ||
		!strings.HasSuffix(lines[2], where) || !strings.HasSuffix(lines[3], where) {
		t.Fatalf("log:\n%s\nwant four lines of %s, the second with more_since_last_line=5", buf, where)
	}
	if strings.Contains(buf.String(), secret) {
		t.Fatalf("the log holds the key:\n%s", buf)
	}
}

// An API error is logged by its status, code and request id, never its
// message or detail; a registration that succeeds after it is logged once as
// a recovery, and the claims after it log nothing. At the stop, the two
// failures left out are counted in a last line (worker QA: their count was
// dropped).
func TestWorkerWithoutOnErrorLogsNoErrorTextAndItsRecovery(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	var mu sync.Mutex
	registrations := 0
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/register") {
			mu.Lock()
			registrations++
			n := registrations
			mu.Unlock()
			if n <= 12 { // three calls of four attempts each (MaxRetries 3)
				w.Header().Set("X-Request-Id", "req_logged")
				writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": map[string]any{
					"code": "service_unavailable", "message": "down: " + secret, "detail": map[string]any{"input": secret}}})
				return
			}
		}
		f.ServeHTTP(w, r)
	}))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{now: start, end: start.Add(time.Hour), done: make(chan struct{})}
	w, buf := loggingWorker(t, c, clk, noWork)
	must(t, w.Start(context.Background(), StartOptions{PollInterval: time.Second}))
	<-clk.done // an hour of idle claims
	must(t, stopWithin(t, w, context.Background()))
	lines := buf.lines()
	if len(lines) != 3 ||
		!strings.Contains(lines[0], `msg="ratchet worker" error=api status=503 code=service_unavailable request_id=req_logged method=POST host=`) ||
		!strings.HasSuffix(lines[0], " path=/api/v1/workers/register") ||
		!strings.HasSuffix(lines[1], `level=WARN msg="ratchet worker recovered" failures=3`) ||
		!strings.HasSuffix(lines[2], `level=WARN msg="ratchet worker stopped" more_since_last_line=2`) {
		t.Fatalf("log:\n%s\nwant the first failed registration, the recovery after 3 and at the stop the 2 left out", buf)
	}
	if strings.Contains(buf.String(), secret) || strings.Contains(buf.String(), "down") {
		t.Fatalf("the log holds the error's text:\n%s", buf)
	}
}

// A handler's panic is logged by its type alone, with a hint to set OnError:
// its value may hold the payload.
func TestWorkerWithoutOnErrorLogsAPanicByItsType(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("t", "1", welcomeIn{CustomerID: secret}, 60000)
	c, _ := testClient(t, f)
	w, buf := loggingWorker(t, c, nil, func(_ context.Context, in welcomeIn, _ JobContext) (welcomeOut, error) {
		panic("customer " + in.CustomerID)
	})
	must(t, w.Start(context.Background(), StartOptions{PollInterval: 20 * time.Millisecond}))
	f.waitReport(t, id)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	must(t, stopWithin(t, w, ctx))
	lines := buf.lines()
	if len(lines) != 1 || !strings.HasSuffix(lines[0],
		`level=WARN msg="ratchet worker" error=*ratchet.PanicError hint="set StartOptions.OnError to see it"`) {
		t.Fatalf("log:\n%s\nwant one line naming the panic's type", buf)
	}
	if strings.Contains(buf.String(), secret) {
		t.Fatalf("the log holds the panic's value:\n%s", buf)
	}
}

// A report the server did not record is logged by what became of it, its
// job and attempt, and its refusal's status, code and request id and call,
// never its message, in the shape the Python and TypeScript workers log it
// (sdk QA: they logged only the notice's class).
func TestWorkerWithoutOnErrorLogsAReportNotRecorded(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("t", "1", welcomeIn{CustomerID: secret}, 60000)
	f.refuse = map[string]string{id: CodeInvalidState}
	f.refuseDetail = map[string]map[string]any{id: {"leaseLapsed": true}}
	c, _ := testClient(t, f)
	w, buf := loggingWorker(t, c, nil, noWork)
	must(t, w.Start(context.Background(), StartOptions{PollInterval: 20 * time.Millisecond}))
	buf.await("report=")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := stopWithin(t, w, ctx); !errors.Is(err, ErrReportsNotRecorded) {
		t.Fatalf("Stop = %v; log:\n%s", err, buf)
	}
	lines := buf.lines()
	want := `level=WARN msg="ratchet worker" report=not_recorded job_id=` + id + ` attempt=1 error=api status=409 ` +
		`code=invalid_state request_id=req_1 method=POST host=`
	if len(lines) != 1 || !strings.Contains(lines[0], want) || !strings.HasSuffix(lines[0], " path=/api/v1/jobs/"+id+"/report") {
		t.Fatalf("log:\n%s\nwant one line holding %s", buf, want)
	}
	if strings.Contains(buf.String(), secret) || strings.Contains(buf.String(), "msg invalid_state") {
		t.Fatalf("the log holds the report's or the refusal's text:\n%s", buf)
	}
}

// A lease lost while the handler ran is logged by what became of it, its
// job, attempt and tool, and the heartbeat's refusal (status, code, request
// id and call, never its message), as the Python and TypeScript workers log
// it (sdk QA: Go logged the lapse by its error type alone).
func TestWorkerWithoutOnErrorLogsALostLease(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseMs = 3000 // a heartbeat a second in
	f.heartbeat = func(string) (int, string) { return http.StatusConflict, CodeLeaseLost }
	id := f.add("t", "1", welcomeIn{CustomerID: secret}, 60000)
	c, _ := testClient(t, f)
	w, buf := loggingWorker(t, c, nil, func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
		<-ctx.Done()
		return welcomeOut{}, ctx.Err()
	})
	must(t, w.Start(context.Background(), StartOptions{PollInterval: 20 * time.Millisecond}))
	buf.await("lease=")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	must(t, stopWithin(t, w, ctx))
	lines := buf.lines()
	want := `level=WARN msg="ratchet worker" lease=lost job_id=` + id + ` attempt=1 tool=t@1 error=api status=409 ` +
		`code=lease_lost request_id=req_1 method=POST host=`
	if len(lines) != 1 || !strings.Contains(lines[0], want) || !strings.HasSuffix(lines[0], " path=/api/v1/jobs/"+id+"/heartbeat") {
		t.Fatalf("log:\n%s\nwant one line holding %s", buf, want)
	}
	if strings.Contains(buf.String(), secret) {
		t.Fatalf("the log holds the job's input:\n%s", buf)
	}
}

// A lease that lapsed while heartbeats failed is logged by its job, attempt
// and tool (sdk QA: Go logged it as *errors.errorString).
func TestFailureAttrsNameALapsedLease(t *testing.T) {
	t.Parallel()
	attrs, call := failureAttrs(&LeaseLostError{JobID: "job_1", Attempt: 2, Tool: ToolRef{Name: "send email", Version: "1"}})
	want := []any{"lease", "lapsed", "job_id", "job_1", "attempt", 2, "tool", "send?email@1"}
	if call || !equalAttrs(attrs, want) {
		t.Fatalf("attrs %v, want %v", attrs, want)
	}
}

// The refusal that stops the worker is logged at once, whatever the pacing
// (here a second after the line of a failed claim): it says why the worker
// claims no more.
func TestWorkerWithoutOnErrorLogsItsRefusalAtOnce(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.claimError = func() (int, string, map[string]any) { // under f.mu
		if f.claims < 4 { // one claim and the client's 3 retries
			return http.StatusServiceUnavailable, "service_unavailable", nil
		}
		return http.StatusUnauthorized, CodeUnauthorized, nil
	}
	c, _ := testClient(t, f)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{now: start, end: start.Add(time.Hour), done: make(chan struct{})}
	w, buf := loggingWorker(t, c, clk, noWork)
	must(t, w.Start(context.Background(), StartOptions{PollInterval: time.Second}))
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker went on after a 401")
	}
	if err := stopWithin(t, w, context.Background()); !IsCode(err, CodeUnauthorized) {
		t.Fatalf("Stop = %v", err)
	}
	lines := buf.lines()
	if len(lines) != 2 || !strings.Contains(lines[0], `msg="ratchet worker" error=api status=503`) ||
		!strings.Contains(lines[1], `msg="ratchet worker refused" error=api status=401 code=unauthorized request_id=req_1 method=POST`) ||
		!strings.HasSuffix(lines[1], "path=/api/v1/workers/wkr_1/claim") {
		t.Fatalf("log:\n%s\nwant the failed claim's line and the refusal's", buf)
	}
}

// OnError replaces the default log entirely.
func TestWorkerWithOnErrorLogsNothing(t *testing.T) {
	t.Parallel()
	addr := refusedURL(t)
	c, err := NewClient(Config{BaseURL: "http://" + addr, APIKey: "rk_test"})
	must(t, err)
	c.sleep = func(ctx context.Context, _ time.Duration) error { return ctx.Err() }
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{now: start, end: start.Add(time.Hour), done: make(chan struct{})}
	w, buf := loggingWorker(t, c, clk, noWork)
	sink := &errSink{}
	started := make(chan error, 1)
	go func() {
		started <- w.Start(context.Background(), StartOptions{PollInterval: time.Second, OnError: sink.add})
	}()
	<-clk.done // an hour of failed registrations
	must(t, stopWithin(t, w, context.Background()))
	awaitWithin(t, started, "Start")
	if n := len(sink.delivered(w)); n < 60 {
		t.Fatalf("OnError heard of %d failed registrations", n)
	}
	if s := buf.String(); s != "" {
		t.Fatalf("logged with OnError set:\n%s", s)
	}
}

// The attributes of a failure hold no query, message or detail, and a code
// or request id that is not a token is cut to printable ASCII.
func TestFailureAttrsHoldNoText(t *testing.T) {
	t.Parallel()
	ue := &url.Error{Op: "Post", URL: "https://api.example:8443/base/api/v1/jobs/claim?token=" + secret,
		Err: &net.OpError{Op: "dial", Err: errors.New("lookup " + secret)}}
	attrs, call := failureAttrs(&netError{err: ue})
	want := []any{"error", "network", "kind", "*errors.errorString"}
	if !call || !equalAttrs(attrs, want) {
		t.Fatalf("attrs %v, want %v", attrs, want)
	}
	attrs, call = failureAttrs(ue)
	want = []any{"error", "network", "kind", "*errors.errorString", "method", "Post", "host", "api.example:8443", "path", "/base/api/v1/jobs/claim"}
	if !call || !equalAttrs(attrs, want) {
		t.Fatalf("attrs %v, want %v", attrs, want)
	}
	// An answer that is not JSON, by its kind and call as the other SDKs log it.
	unreadable := &unconfirmed{err: &unreadableAnswer{err: errors.New(secret),
		call: callInfo{method: "POST", host: "api.example", path: "/api/v1/workers/wkr_1/claim"}}}
	attrs, call = failureAttrs(unreadable)
	want = []any{"error", "network", "kind", "unreadable answer", "method", "POST", "host", "api.example",
		"path", "/api/v1/workers/wkr_1/claim"}
	if !call || !equalAttrs(attrs, want) {
		t.Fatalf("attrs %v, want %v", attrs, want)
	}
	apiErr := &Error{StatusCode: 502, Code: "bad\ncode\x00", Message: secret, Detail: map[string]any{"x": secret}}
	attrs, _ = failureAttrs(apiErr)
	want = []any{"error", "api", "status", 502, "code", "bad?code?"}
	if !equalAttrs(attrs, want) {
		t.Fatalf("attrs %v, want %v", attrs, want)
	}
	attrs, call = failureAttrs(&InvalidDecisionError{Tool: ToolRef{Name: secret}})
	want = []any{"error", "*ratchet.InvalidDecisionError", "hint", noOnErrorHint}
	if call || !equalAttrs(attrs, want) {
		t.Fatalf("attrs %v, want %v", attrs, want)
	}
}

func equalAttrs(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Without OnError, the problems left out since the last line are counted
// when the worker stops with nobody calling Stop, as the Python and
// TypeScript workers count them: when Start gives up (its context ended
// while it waited out an outage) and when Start's context ends a running
// worker (review: Go counted them only in Stop).
func TestWorkerWithoutOnErrorCountsWhatItLeftOutWhenItStopsOnItsOwn(t *testing.T) {
	t.Parallel()
	for name, running := range map[string]bool{"starting": false, "running": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := newFakeJobs()
			var mu sync.Mutex
			failed := 0
			c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasSuffix(r.URL.Path, "/register") == !running {
					mu.Lock()
					failed++
					if failed == 16 { // four calls of four attempts: one logged, two left out
						cancel()
					}
					mu.Unlock()
					apiError(w, http.StatusServiceUnavailable, "service_unavailable", nil)
					return
				}
				f.ServeHTTP(w, r)
			}))
			w, buf := loggingWorker(t, c, nil, noWork)
			err := w.Start(ctx, StartOptions{PollInterval: time.Millisecond})
			if running {
				must(t, err)
				awaitWithin(t, w.Done(), "the worker")
			} else if !errors.Is(err, context.Canceled) {
				t.Fatalf("Start = %v, want its context's end", err)
			}
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(buf.String(), "ratchet worker stopped"); {
				if time.Now().After(deadline) {
					t.Fatalf("log:\n%s\nwant the problems left out counted, with no Stop", buf)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// Without OnError, a worker that stops on its own (a refused claim) counts
// the problems it left out once, after the reports of the handlers it
// cancelled were sent, as the Python and TypeScript workers count them
// (closing note 48: the count was written when the reports were queued, and
// a report that failed after it got a second "ratchet worker stopped" line
// at Stop). Here the cancelled handler panics and its report is refused:
// both left out, within a minute of the refusal's line.
func TestWorkerWithoutOnErrorCountsOnceWhenItStopsOnItsOwn(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.add("t", "1", welcomeIn{}, 60000)
	f.claimError = func() (int, string, map[string]any) {
		if f.claims == 0 {
			return 0, "", nil // the first claim takes the job
		}
		return http.StatusForbidden, CodeForbidden, nil
	}
	var buf *lockedBuffer
	f.reportError = func(json.RawMessage) (int, string) {
		// The report is answered once the worker has counted what it left
		// out, or 2 s on, whichever comes first: before the fix, the count
		// came first and the report's refusal got a line of its own.
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) &&
			!strings.Contains(buf.String(), "ratchet worker stopped"); {
			time.Sleep(5 * time.Millisecond)
		}
		return http.StatusBadRequest, CodeInvalidRequest
	}
	c, _ := testClient(t, f)
	w, logged := loggingWorker(t, c, nil, func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
		<-ctx.Done()
		panic("cancelled: " + secret)
	})
	buf = logged
	must(t, w.Start(context.Background(), StartOptions{Concurrency: 2, PollInterval: time.Millisecond}))
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker went on claiming")
	}
	if err := stopWithin(t, w, context.Background()); !IsCode(err, CodeForbidden) {
		t.Fatalf("Stop = %v, want the refusal", err)
	}
	var stopped []string
	for _, line := range buf.lines() {
		if strings.Contains(line, `msg="ratchet worker stopped"`) {
			stopped = append(stopped, line)
		}
	}
	if len(stopped) != 1 || !strings.HasSuffix(stopped[0], "more_since_last_line=2") {
		t.Fatalf("log:\n%s\nwant one line counting the panic and the report refused", buf)
	}
}

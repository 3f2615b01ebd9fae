package ratchet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeJobs speaks the worker half of API.md §3.1 from memory.
type fakeJobs struct {
	mu            sync.Mutex
	queue         []ClaimedJob
	claims        int
	claimIDs      []string // each claim request's claimId, refused ones included
	limits        []int
	waits         []int // each claim's waitSeconds
	heartbeats    int
	registrations int
	claimedJobs   int
	cancel        map[string]bool
	heartbeat     func(jobID string) (status int, code string) // optional failure (status -1: the connection drops)
	heartbeatWait int                                          // the failure's detail.retry_after_seconds, when set
	leaseFor      time.Duration
	leaseMs       int64         // the claim's leaseMs (0: not said, as an older server)
	dateSkew      time.Duration // the server's clock ahead of ours, in its answers' Date (0: no skew)
	reports       map[string]json.RawMessage
	reported      chan string
	onClaim       func(limit, got int)                                    // called inside the lock
	batches       []int                                                   // sizes of the batch reports received
	refuse        map[string]string                                       // job id → error code a batch answers for it
	refuseDetail  map[string]map[string]any                               // job id → that refusal's detail
	noBatch       bool                                                    // answer the batch route 404, as an older server would
	refuseOutput  map[string]bool                                         // job id → its success is refused invalid_request at output.n (both routes)
	claimError    func() (status int, code string, detail map[string]any) // optional refusal of a claim
	// reportError optionally refuses a report request (single or batch)
	// as a whole before looking at it.
	reportError func(body json.RawMessage) (status int, code string)
	// registerError optionally refuses the nth registration (from 1).
	registerError func(n int) (status int, code string)
}

func newFakeJobs() *fakeJobs {
	return &fakeJobs{cancel: map[string]bool{}, reports: map[string]json.RawMessage{},
		reported: make(chan string, 100), leaseFor: 10 * time.Minute}
}

// claimed counts the jobs handed out so far.
func (f *fakeJobs) claimed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.claimedJobs
}

func (f *fakeJobs) add(name, version string, input any, timeoutMs int64) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	raw, _ := json.Marshal(input)
	id := fmt.Sprintf("job_%d", len(f.queue)+len(f.reports)+f.claims*1000)
	f.queue = append(f.queue, ClaimedJob{JobID: id, StepID: "stp_" + id, RunID: "run_1", Name: name, Version: version,
		Attempt: 1, LeaseToken: "tok_" + id, LeaseExpiresAt: time.Now().Add(f.leaseFor), LeaseMs: f.leaseMs, TimeoutMs: timeoutMs,
		IdempotencyKey: "key_" + id, Input: raw})
	return id
}

// refusal answers a refusal in Ratchet's error envelope, or without a code
// as a proxy does: its own page, no envelope.
func refusal(w http.ResponseWriter, status int, code string, detail map[string]any) {
	if code == "" {
		http.Error(w, http.StatusText(status), status)
		return
	}
	apiError(w, status, code, detail)
}

func (f *fakeJobs) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimPrefix(r.URL.Path, "/api/v1")
	var body map[string]any
	raw := json.RawMessage{}
	_ = json.NewDecoder(r.Body).Decode(&raw)
	_ = json.Unmarshal(raw, &body)
	if f.dateSkew != 0 {
		w.Header().Set("Date", time.Now().Add(f.dateSkew).UTC().Format(http.TimeFormat))
	}
	switch {
	case p == "/workers/register":
		f.mu.Lock()
		f.registrations++
		n, refuse := f.registrations, f.registerError
		f.mu.Unlock()
		if refuse != nil {
			if status, code := refuse(n); status != 0 {
				refusal(w, status, code, nil)
				return
			}
		}
		writeJSON(w, 201, map[string]any{"workerId": "wkr_1"})
	case p == "/workers/wkr_1/claim":
		f.mu.Lock()
		id, _ := body["claimId"].(string)
		f.claimIDs = append(f.claimIDs, id)
		if f.claimError != nil {
			if status, code, detail := f.claimError(); status != 0 {
				f.claims++
				f.mu.Unlock()
				refusal(w, status, code, detail)
				return
			}
		}
		limit := int(body["limit"].(float64))
		f.claims++
		f.limits = append(f.limits, limit)
		wait, _ := body["waitSeconds"].(float64)
		f.waits = append(f.waits, int(wait))
		n := min(limit, len(f.queue))
		jobs := append([]ClaimedJob{}, f.queue[:n]...)
		f.claimedJobs += n
		f.queue = f.queue[n:]
		if f.onClaim != nil {
			f.onClaim(limit, n)
		}
		f.mu.Unlock()
		writeJSON(w, 200, map[string]any{"jobs": jobs})
	case strings.HasSuffix(p, "/heartbeat"):
		id := strings.Split(p, "/")[2]
		f.mu.Lock()
		f.heartbeats++
		cancel := f.cancel[id]
		hb, wait := f.heartbeat, f.heartbeatWait
		f.mu.Unlock()
		if hb != nil {
			if status, code := hb(id); status < 0 { // the answer lost: the connection dropped
				conn, _, _ := w.(http.Hijacker).Hijack()
				conn.Close()
				return
			} else if status != 0 {
				var detail map[string]any
				if wait > 0 {
					detail = map[string]any{"retry_after_seconds": wait}
				}
				apiError(w, status, code, detail)
				return
			}
		}
		writeJSON(w, 200, map[string]any{"leaseExpiresAt": time.Now().Add(f.leaseFor), "cancelRequested": cancel})
	case strings.HasSuffix(p, "/report") && f.reportError != nil && reportRefused(w, f, raw):
	case p == "/jobs/report" && f.noBatch:
		apiError(w, 404, CodeNotFound, nil)
	case p == "/jobs/report":
		f.batchReport(w, raw)
	case strings.HasSuffix(p, "/report"):
		id := strings.Split(p, "/")[2]
		f.mu.Lock()
		if f.refuseOutput[id] && body["status"] == ReportSucceeded {
			f.mu.Unlock()
			apiError(w, 400, CodeInvalidRequest, outputRefusal)
			return
		}
		if code := f.refuse[id]; code != "" {
			detail := f.refuseDetail[id]
			f.mu.Unlock()
			apiError(w, map[string]int{CodeLeaseLost: 409, CodeInvalidState: 409, CodeNotFound: 404,
				CodeUnauthorized: 401}[code], code, detail)
			return
		}
		f.reports[id] = raw
		f.mu.Unlock()
		f.reported <- id
		writeJSON(w, 200, map[string]any{"jobId": id, "status": "SUCCEEDED", "attempt": 1})
	default:
		apiError(w, 404, CodeNotFound, nil)
	}
}

// outputRefusal is the detail of a report refused for its output (a NUL in
// a string at output.n, say), on either route.
var outputRefusal = map[string]any{"validation": []any{map[string]any{"field": "output.n", "message": "must not hold NUL"}}}

// batchReport serves POST /jobs/report: each report stored like a single
// one (without jobId), answered in its slot; refused ones are not stored.
func (f *fakeJobs) batchReport(w http.ResponseWriter, raw json.RawMessage) {
	var body struct {
		Reports []map[string]json.RawMessage `json:"reports"`
	}
	_ = json.Unmarshal(raw, &body)
	var results []map[string]any
	var stored []string
	f.mu.Lock()
	f.batches = append(f.batches, len(body.Reports))
	for _, r := range body.Reports {
		var id string
		_ = json.Unmarshal(r["jobId"], &id)
		if f.refuseOutput[id] && string(r["status"]) == `"`+ReportSucceeded+`"` {
			results = append(results, map[string]any{"jobId": id, "error": map[string]any{"code": CodeInvalidRequest,
				"message": "invalid request", "detail": outputRefusal}})
			continue
		}
		if code := f.refuse[id]; code != "" {
			results = append(results, map[string]any{"jobId": id, "error": map[string]any{"code": code, "message": "refused",
				"detail": f.refuseDetail[id]}})
			continue
		}
		delete(r, "jobId")
		one, _ := json.Marshal(r)
		f.reports[id] = one
		stored = append(stored, id)
		results = append(results, map[string]any{"jobId": id, "status": "SUCCEEDED", "attempt": 1})
	}
	f.mu.Unlock()
	for _, id := range stored {
		f.reported <- id
	}
	writeJSON(w, 200, map[string]any{"results": results})
}

func (f *fakeJobs) report(t *testing.T, id string) map[string]any {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	var m map[string]any
	if err := json.Unmarshal(f.reports[id], &m); err != nil {
		t.Fatalf("report of %s: %v (%s)", id, err, f.reports[id])
	}
	return m
}

func (f *fakeJobs) waitReport(t *testing.T, id string) map[string]any {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		f.mu.Lock()
		_, ok := f.reports[id]
		f.mu.Unlock()
		if ok {
			return f.report(t, id)
		}
		select {
		case <-f.reported:
		case <-timeout:
			t.Fatalf("job %s never reported", id)
		}
	}
}

type welcomeIn struct {
	CustomerID string `json:"customerId"`
}

type welcomeOut struct {
	Sent bool   `json:"sent"`
	Key  string `json:"key"`
}

func startWorker(t *testing.T, f *fakeJobs, register func(w *Worker), opts StartOptions) (*Worker, *errSink) {
	t.Helper()
	c, _ := testClient(t, f)
	w := NewWorker(c)
	register(w)
	sink := &errSink{}
	if opts.OnError == nil {
		opts.OnError = sink.add
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 20 * time.Millisecond
	}
	if err := w.Start(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopWithin(t, w, ctx)
	})
	return w, sink
}

// hangGuard is how long a test waits for what must end (a Stop, a
// reporter's close) before it fails: a far bound, so that a regression fails
// the test instead of hanging the suite, never a timing assertion.
const hangGuard = time.Minute

// awaitWithin receives from ch, failing t if nothing comes within
// hangGuard; what names what ch waits for.
func awaitWithin[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangGuard):
		t.Fatalf("hang guard: %s did not end within %v", what, hangGuard)
		var zero T
		return zero
	}
}

// stopWithin is w.Stop(ctx), failing t if Stop has not returned within
// hangGuard.
func stopWithin(t testing.TB, w *Worker, ctx context.Context) error {
	t.Helper()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	return awaitWithin(t, stopped, "Stop")
}

// closeWithin is r.close(ctx), failing t if close has not returned within
// hangGuard.
func closeWithin(t testing.TB, r *reporter, ctx context.Context) bool {
	t.Helper()
	closed := make(chan bool, 1)
	go func() { closed <- r.close(ctx) }()
	return awaitWithin(t, closed, "the reporter's close")
}

// The worker measures a lease by its length from when it sent the claim,
// not by the server's expiry read with its own clock: here the server's
// clock runs an hour ahead, and the report still goes out before the lease
// (6 s) is within the margin of lapsing, though the batch would otherwise
// wait its (hour-long) linger. Without leaseMs the lease is its expiry less
// the answer's Date, as the gate's leases are read: the lease of 8 s read
// against this process's clock lasted an hour, and the report waited its
// linger.
func TestWorkerMeasuresTheLeaseByItsLength(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		leaseMs  int64
		leaseFor time.Duration // the expiry from now by the server's clock, an hour ahead
		dateSkew time.Duration // in its answers' Date
	}{{"by leaseMs", 6_000, time.Hour, 0}, {"by the server's Date", 0, time.Hour + 8*time.Second, time.Hour}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeJobs()
			f.leaseFor, f.leaseMs, f.dateSkew = c.leaseFor, c.leaseMs, c.dateSkew
			id := f.add("send_welcome_email", "1", welcomeIn{CustomerID: "cus_1"}, 1_000)
			startWorker(t, f, func(w *Worker) {
				w.reportLinger = time.Hour
				must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "send_welcome_email", Version: "1",
					Handler: func(ctx context.Context, in welcomeIn, job JobContext) (welcomeOut, error) {
						return welcomeOut{Sent: true}, nil
					}}))
			}, StartOptions{})
			if rep := f.waitReport(t, id); rep["status"] != "SUCCEEDED" {
				t.Fatalf("report %v", rep)
			}
		})
	}
}

// A long-polling claim is answered when a job becomes due, up to
// WaitSeconds after it was sent, and the job's lease runs from then: a lease
// shorter than the claim's wait (a 1 s timeout and the server's 10 s grace,
// under WaitSeconds 20) read from the claim's sending looks lapsed before
// the handler starts. A heartbeat is tried before the worker takes the
// lease for lost, as DoEffect tries one: the job was cancelled as its lease
// lost a second in, never heartbeated, its outcome dropped and the job run
// again once its real lease lapsed (review). Here the claim is answered
// 700 ms after it was sent, with a lease of 500 ms.
func TestWorkerHeartbeatsALeaseThatALongPollMadeLookLapsed(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseMs = 500                                // shorter than the wait
	id := f.add("quick", "1", welcomeIn{}, 60_000) // a timeout well past the first heartbeat
	beat := make(chan struct{})
	var once sync.Once
	f.heartbeat = func(string) (int, string) {
		once.Do(func() { close(beat) })
		return 0, ""
	}
	var held atomic.Bool
	slowFirstClaim := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/claim") && held.CompareAndSwap(false, true) {
			time.Sleep(700 * time.Millisecond) // the long poll waited; not a timing assertion
		}
		f.ServeHTTP(w, r)
	})
	c, _ := testClient(t, slowFirstClaim)
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1",
		Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
			select {
			case <-beat: // the server extended the lease
				return welcomeOut{Sent: true}, nil
			case <-ctx.Done():
				return welcomeOut{}, context.Cause(ctx)
			}
		}}))
	sink := &errSink{}
	must(t, w.Start(context.Background(), StartOptions{PollInterval: 20 * time.Millisecond, WaitSeconds: 20, OnError: sink.add}))
	t.Cleanup(func() { _ = stopWithin(t, w, context.Background()) })
	if rep := f.waitReport(t, id); rep["status"] != ReportSucceeded {
		t.Fatalf("report %v", rep)
	}
	for _, err := range sink.delivered(w) {
		var lost *LeaseLostError
		if errors.As(err, &lost) {
			t.Fatalf("OnError was told %v", err)
		}
	}
}

// A long-polling worker claims nothing while a report not yet recorded
// holds a lease that lapses within the margin and the claim's wait, as the
// Python and TypeScript workers hold theirs: the lease could lapse while the
// claim waits, and the claim hand the worker back the job whose outcome it
// is still reporting, to run it again (review: Go looked only as far as the
// margin). Here the lease is 10 s, past the 5 s margin but within it and
// WaitSeconds 20: the report is held by the server until a claim arrives
// (the defect), or for 2 s; no claim may come while it is held.
func TestALongPollingWorkerHoldsItsClaimsForAReportWhoseLeaseLapsesWithinTheWait(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseMs = 10_000
	id := f.add("quick", "1", welcomeIn{}, 60_000)
	claimed := make(chan struct{}, 100) // a claim arrived
	f.onClaim = func(int, int) {
		select {
		case claimed <- struct{}{}:
		default: // already told
		}
	}
	var during atomic.Int64 // claims that arrived while the report was held
	f.reportError = func(json.RawMessage) (int, string) {
		for len(claimed) > 0 { // those before the report
			<-claimed
		}
		select {
		case <-claimed:
			during.Add(1)
		case <-time.After(2 * time.Second): // the server is slow; not a timing assertion
		}
		return 0, ""
	}
	startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1", Handler: noWork}))
	}, StartOptions{Concurrency: 1, WaitSeconds: 20})
	if rep := f.waitReport(t, id); rep["status"] != ReportSucceeded {
		t.Fatalf("report %v", rep)
	}
	if n := during.Load(); n != 0 {
		t.Fatalf("%d claim(s) sent while the report of a lease lapsing within the wait was unanswered", n)
	}
}

// A heartbeat's expiry is read by its answer's Date too: a server an hour
// ahead extends the lease by 30 s, not by an hour and 30 s.
func TestAHeartbeatsExpiryIsReadByItsDate(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.dateSkew, f.leaseFor = time.Hour, time.Hour+30*time.Second
	c, _ := testClient(t, f)
	sent := time.Now()
	hb, date, err := c.heartbeatJob(context.Background(), "job_1", "tok_job_1")
	must(t, err)
	end := leaseEndFrom(sent, ClaimedJob{}, hb.LeaseExpiresAt, date)
	if left := time.Until(end); left > 30*time.Second || left < 20*time.Second {
		t.Fatalf("the lease read as %v left, want about 29 s", left)
	}
}

// A server that says neither the lease's length nor its expiry leases for
// the timeout plus its default grace, as the Python and TypeScript workers
// take it: the zero expiry read as lapsed, and the handler was cancelled as
// its lease lost at its first heartbeat, a second in.
func TestALeaseOfNeitherLengthNorExpiryIsTheTimeoutAndTheGrace(t *testing.T) {
	t.Parallel()
	sent := time.Now()
	j := ClaimedJob{TimeoutMs: 60_000}
	end := leaseEndFrom(sent, j, time.Time{}, time.Time{}) // a claim's or a heartbeat's answer
	if want := sent.Add(70 * time.Second); !end.Equal(want) {
		t.Fatalf("the lease ends %v after it was sent, want 70 s", end.Sub(sent))
	}
	w := &Worker{clock: realClock{}}
	if every := w.heartbeatEvery(end, j); every < 19*time.Second || every > 20*time.Second {
		t.Fatalf("a heartbeat every %v, want about 20 s (a third of the timeout)", every)
	}
}

func TestWorkerRunsHandlerAndReportsSuccess(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("send_welcome_email", "1", welcomeIn{CustomerID: "cus_1"}, 30000)
	var seen JobContext
	startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "send_welcome_email", Version: "1",
			Handler: func(ctx context.Context, in welcomeIn, job JobContext) (welcomeOut, error) {
				seen = job
				return welcomeOut{Sent: in.CustomerID == "cus_1", Key: job.IdempotencyKey}, nil
			}}))
	}, StartOptions{})
	rep := f.waitReport(t, id)
	if rep["status"] != "SUCCEEDED" || rep["leaseToken"] != "tok_"+id || rep["error"] != nil {
		t.Fatalf("report %v", rep)
	}
	if out := rep["output"].(map[string]any); out["sent"] != true || out["key"] != "key_"+id {
		t.Fatalf("output %v", out)
	}
	if seen.JobID != id || seen.StepID != "stp_"+id || seen.RunID != "run_1" || seen.Attempt != 1 || seen.Timeout != 30*time.Second {
		t.Fatalf("job context %+v", seen)
	}
}

func TestWorkerFailureReports(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	panicky := f.add("panic", "1", welcomeIn{CustomerID: "cus_secret_payload"}, 0)
	leaky := f.add("leaky", "1", welcomeIn{}, 0)
	schema := f.add("typed", "1", map[string]any{"customerId": 42}, 0)
	hinted := f.add("hinted", "1", welcomeIn{}, 0)
	worker, sink := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "panic", Version: "1",
			Handler: func(_ context.Context, in welcomeIn, _ JobContext) (welcomeOut, error) { panic(in.CustomerID) }}))
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "leaky", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
				return welcomeOut{}, errors.New("send to bob@example.com failed: api_key=sk_abc123")
			}}))
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "typed", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
				t.Error("handler ran on input of the wrong shape")
				return welcomeOut{}, nil
			}}))
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "hinted", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
				return welcomeOut{}, Retryable("provider rate limited", 1500*time.Millisecond)
			}}))
	}, StartOptions{Concurrency: 4})

	rep := f.waitReport(t, panicky)
	e := rep["error"].(map[string]any)
	if rep["status"] != "FAILED" || e["retryable"] != true || e["message"] != "handler panicked" {
		t.Fatalf("panic report %v", rep)
	}
	if raw := string(mustJSON(t, rep)); strings.Contains(raw, "cus_secret_payload") || strings.Contains(raw, "goroutine") {
		t.Fatalf("panic value or stack left the process: %s", raw)
	}
	var pe *PanicError
	if errs := sink.delivered(worker); !slices.ContainsFunc(errs, func(err error) bool { return errors.As(err, &pe) && len(pe.Stack) > 0 }) {
		t.Fatalf("OnError %v", errs)
	}

	e = f.waitReport(t, leaky)["error"].(map[string]any)
	if msg := e["message"].(string); strings.Contains(msg, "bob@example.com") || strings.Contains(msg, "sk_abc123") || e["retryable"] != true {
		t.Fatalf("leaky report %v", e)
	}
	if _, ok := e["retryAfterMs"]; ok {
		t.Fatalf("retryAfterMs without a hint: %v", e)
	}

	e = f.waitReport(t, schema)["error"].(map[string]any)
	if e["retryable"] != false || !strings.Contains(e["message"].(string), "input") {
		t.Fatalf("schema report %v", e)
	}
	if _, ok := e["retryAfterMs"]; ok {
		t.Fatal("retryAfterMs with retryable:false")
	}

	e = f.waitReport(t, hinted)["error"].(map[string]any)
	if e["retryable"] != true || e["retryAfterMs"] != 1500.0 {
		t.Fatalf("hinted report %v", e)
	}
}

func TestWorkerTimeoutCancelsHandler(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("slow", "1", welcomeIn{}, 50)
	causes := make(chan error, 1)
	startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "slow", Version: "1",
			Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
				<-ctx.Done()
				causes <- context.Cause(ctx)
				return welcomeOut{}, ctx.Err()
			}}))
	}, StartOptions{})
	if cause := <-causes; !errors.Is(cause, ErrTimeout) {
		t.Fatalf("cause %v", cause)
	}
	e := f.waitReport(t, id)["error"].(map[string]any)
	if e["retryable"] != true || !strings.Contains(e["message"].(string), "timed out") {
		t.Fatalf("report %v", e)
	}
}

// A handler that ignores its timeout does not hold its job: the worker
// records the timeout a grace period after it (no more heartbeats), and what
// the handler returns later is dropped.
func TestWorkerRecordsTimeoutOfHandlerThatIgnoresIt(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseFor = 3 * time.Second // a heartbeat a second would keep the lease forever
	id := f.add("stuck", "1", welcomeIn{}, 50)
	release := make(chan struct{})
	returned := make(chan struct{})
	w, _ := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "stuck", Version: "1",
			Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
				defer close(returned)
				<-release // ignores ctx
				return welcomeOut{Sent: true}, nil
			}}))
	}, StartOptions{})
	e := f.waitReport(t, id)["error"].(map[string]any)
	if e["retryable"] != true || !strings.Contains(e["message"].(string), "timed out") {
		t.Fatalf("report %v", e)
	}
	select {
	case <-returned:
		t.Fatal("the timeout was recorded only after the handler returned")
	default:
	}
	if n := w.free(); n != w.opts.Concurrency-1 {
		t.Fatalf("free slots %d while the handler still runs, want %d", n, w.opts.Concurrency-1)
	}
	close(release)
	// Stop waits for the handler and flushes every queued report.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := stopWithin(t, w, ctx); err != nil {
		t.Fatal(err)
	}
	<-returned
	if r := f.report(t, id); r["status"] != ReportFailed {
		t.Fatalf("the late result replaced the timeout: %v", r)
	}
}

func TestWorkerHeartbeatCancelRequested(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseFor = 3 * time.Second // heartbeat after a second
	id := f.add("long", "1", welcomeIn{}, 60000)
	f.cancel[id] = true
	causes := make(chan error, 1)
	startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "long", Version: "1",
			Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
				<-ctx.Done()
				causes <- context.Cause(ctx)
				return welcomeOut{}, Retryable("interrupted", 0)
			}}))
	}, StartOptions{})
	if cause := <-causes; !errors.Is(cause, ErrCancelRequested) {
		t.Fatalf("cause %v", cause)
	}
	e := f.waitReport(t, id)["error"].(map[string]any)
	if e["retryable"] != false {
		t.Fatalf("report %v", e)
	}
}

// A heartbeat's refusal cancels the handler. Its failure is not reported
// (the job runs again either way); its success is after a lease_lost,
// since the server records a lapsed attempt's outcome while no newer claim
// holds the job (QA: the SDK dropped a result the server would have taken,
// and the job ran twice), but not after an invalid_state (the job ended:
// the server would refuse it, and Stop would count it lost; review).
//
// A 404 (the job is gone) and a 403 (the key may not work the job's tool:
// it was cancelled and replayed onto a version the key does not list) end
// the attempt the same way, as in the Python and TypeScript workers (sdk
// QA: the Go worker took a 403 for a failed heartbeat and heartbeated on).
func TestWorkerLeaseLostReportsOnlyASuccess(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status  int
		refusal string
		succeed bool
	}{{409, CodeLeaseLost, false}, {409, CodeLeaseLost, true}, {409, CodeInvalidState, true},
		{404, CodeNotFound, true}, {403, CodeForbidden, true}} {
		succeed := c.succeed
		f := newFakeJobs()
		f.leaseFor = 3 * time.Second
		f.heartbeat = func(string) (int, string) { return c.status, c.refusal }
		id := f.add("long", "1", welcomeIn{}, 60000)
		canary := make(chan error, 1)
		w, sink := startWorker(t, f, func(w *Worker) {
			must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "long", Version: "1",
				Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
					<-ctx.Done()
					canary <- context.Cause(ctx)
					if succeed {
						return welcomeOut{Key: "done"}, nil
					}
					return welcomeOut{}, ctx.Err()
				}}))
		}, StartOptions{})
		select {
		case cause := <-canary:
			if !errors.Is(cause, ErrLeaseLost) {
				t.Fatalf("%s: cause %v", c.refusal, cause)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the handler was not cancelled", c.refusal)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := stopWithin(t, w, ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		if len(sink.list()) == 0 || !IsCode(sink.list()[0], c.refusal) {
			t.Fatalf("OnError %v", sink.list())
		}
		f.mu.Lock()
		got := len(f.reports)
		f.mu.Unlock()
		if !succeed || c.refusal != CodeLeaseLost {
			if got != 0 {
				t.Fatalf("a failure reported after losing the lease: %d", got)
			}
			continue
		}
		r := f.report(t, id)
		if r["status"] != "SUCCEEDED" || r["output"].(map[string]any)["key"] != "done" {
			t.Fatalf("report %v", r)
		}
	}
}

// Heartbeats that keep failing (here a 429 asking for a minute, longer
// than the lease) do not keep the handler running past the lease's end by
// the worker's clock: it is cancelled with ErrLeaseLost, as in the Python
// and TypeScript workers, since another worker may reclaim the job from
// then on, and a success it still returns is reported (the server records
// it while no newer claim holds the job). sdk QA: the Go worker waited out
// the 429 inside the heartbeat and never cancelled the handler.
func TestWorkerCancelsAHandlerWhoseLeaseLapsesWhileHeartbeatsFail(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseMs = 3000
	f.heartbeat = func(string) (int, string) { return 429, CodeRateLimited }
	f.heartbeatWait = 60
	id := f.add("long", "1", welcomeIn{}, 60000)
	canary := make(chan error, 1)
	c, _ := testClient(t, f)
	c.sleep = sleepCtx // the 429's minute is waited for real, unless cut
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "long", Version: "1",
		Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
			<-ctx.Done()
			canary <- context.Cause(ctx)
			return welcomeOut{Key: "done"}, nil
		}}))
	sink := &errSink{}
	must(t, w.Start(context.Background(), StartOptions{PollInterval: 20 * time.Millisecond, OnError: sink.add}))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopWithin(t, w, ctx)
	})
	select {
	case cause := <-canary:
		if !errors.Is(cause, ErrLeaseLost) {
			t.Fatalf("cause %v", cause)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the handler ran on past its lease")
	}
	if r := f.waitReport(t, id); r["status"] != "SUCCEEDED" {
		t.Fatalf("report %v", r)
	}
	// OnError reads the lapse with errors.As: the job, its attempt and tool.
	// The notice is queued before the report, and delivered on a goroutine
	// of its own: delivered waits for it (list alone failed under load).
	if !slices.ContainsFunc(sink.delivered(w), func(err error) bool {
		var lost *LeaseLostError
		return errors.As(err, &lost) && lost.JobID == id && lost.Attempt == 1 && lost.Tool == ToolRef{Name: "long", Version: "1"} &&
			lost.Err == nil && errors.Is(err, ErrLeaseLost) && strings.Contains(err.Error(), "before it lapsed")
	}) {
		t.Fatalf("OnError %v", sink.list())
	}
}

func TestWorkerGracefulStop(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("gated", "1", welcomeIn{}, 60000)
	started, release := make(chan struct{}), make(chan struct{})
	w, _ := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "gated", Version: "1",
			Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
				close(started)
				<-release
				return welcomeOut{Sent: true}, ctx.Err()
			}}))
	}, StartOptions{})
	<-started
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- w.Stop(ctx)
	}()
	awaitWithin(t, w.loopDone, "the poll loop") // polling has ended while the handler still runs
	f.mu.Lock()
	claims := f.claims
	f.mu.Unlock()
	late := f.add("gated", "1", welcomeIn{}, 60000)
	close(release)
	if err := awaitWithin(t, stopped, "Stop"); err != nil {
		t.Fatal(err)
	}
	if rep := f.report(t, id); rep["status"] != "SUCCEEDED" {
		t.Fatalf("report %v", rep)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.claims != claims || len(f.queue) != 1 || f.queue[0].JobID != late {
		t.Fatalf("claimed after Stop: claims %d→%d, queue %v", claims, f.claims, f.queue)
	}
}

func TestWorkerStopDeadlineCancelsHandlers(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("stubborn", "1", welcomeIn{}, 60000)
	started := make(chan struct{})
	w, _ := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "stubborn", Version: "1",
			Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
				close(started)
				<-ctx.Done()
				return welcomeOut{}, ctx.Err()
			}}))
	}, StartOptions{})
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no patience at all
	if err := stopWithin(t, w, ctx); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "1 handler(s) cancelled") ||
		strings.Contains(err.Error(), "abandoned") { // its one slot was busy: no claim was in flight
		t.Fatalf("Stop = %v", err)
	}
	e := f.report(t, id)["error"].(map[string]any)
	if e["retryable"] != true || !strings.Contains(e["message"].(string), "worker stopped") {
		t.Fatalf("report %v", e)
	}
}

// A handler that ignores the cancellation of a stopping worker does not
// keep its job: after the stop grace its heartbeats end and it is left
// unreported, so its lease lapses for another worker.
func TestWorkerStopLetsAnIgnoringHandlersLeaseLapse(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseFor = 3 * time.Second // a heartbeat about every second
	id := f.add("stuck", "1", welcomeIn{}, 60000)
	started, release := make(chan struct{}), make(chan struct{})
	w, _ := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "stuck", Version: "1",
			Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
				close(started)
				<-release // ignores ctx
				return welcomeOut{Sent: true}, nil
			}}))
	}, StartOptions{StopGrace: 200 * time.Millisecond})
	defer close(release)
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := stopWithin(t, w, ctx); err == nil || !strings.Contains(err.Error(), "left unreported") {
		t.Fatalf("Stop = %v", err)
	}
	time.Sleep(300 * time.Millisecond) // the handler's own grace has passed too
	f.mu.Lock()
	before := f.heartbeats
	f.mu.Unlock()
	time.Sleep(2500 * time.Millisecond)
	f.mu.Lock()
	after := f.heartbeats
	_, reported := f.reports[id]
	f.mu.Unlock()
	if after != before || reported {
		t.Fatalf("heartbeats %d → %d after the grace, reported %v: the lease is still held", before, after, reported)
	}
}

// A handler that outlasts the stop grace is left unreported, its job run
// again elsewhere once its lease lapses: OnError is told so once per job,
// naming the job and never its input, whether Stop's deadline or the end of
// Start's context (an immediate stop) cut the handlers off (QA: only Stop's
// count said so, and nothing when Start's context ended; the Python SDK
// told only a second interrupt's jobs).
func TestWorkerTellsOnErrorOfEachJobLeftUnreported(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"Stop", "Start's context"} {
		t.Run(by, func(t *testing.T) {
			t.Parallel()
			f := newFakeJobs()
			ids := map[string]bool{}
			for range 2 {
				ids[f.add("stuck", "1", welcomeIn{CustomerID: "cus_input_not_for_logs"}, 60000)] = true
			}
			started, release := make(chan struct{}, 2), make(chan struct{})
			defer close(release)
			c, _ := testClient(t, f)
			w := NewWorker(c)
			must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "stuck", Version: "1",
				Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
					started <- struct{}{}
					<-release // ignores ctx
					return welcomeOut{Sent: true}, nil
				}}))
			sink := &errSink{}
			startCtx, cancelStart := context.WithCancel(context.Background())
			defer cancelStart()
			must(t, w.Start(startCtx, StartOptions{Concurrency: 2, PollInterval: 20 * time.Millisecond, OnError: sink.add,
				StopGrace: 100 * time.Millisecond}))
			for range 2 {
				select {
				case <-started:
				case <-time.After(hangGuard):
					t.Fatal("hang guard: the handlers never started")
				}
			}
			var notices []*ReportNotRecordedError
			told := func() []*ReportNotRecordedError {
				notices = nil
				for _, err := range sink.delivered(w) {
					var n *ReportNotRecordedError
					if errors.As(err, &n) {
						notices = append(notices, n)
					}
				}
				return notices
			}
			if by == "Stop" {
				ctx, cancel := context.WithCancel(context.Background())
				cancel() // the deadline has passed: the handlers are cut off at once
				if err := stopWithin(t, w, ctx); err == nil || !strings.Contains(err.Error(), "2 handler(s) ignored cancellation") {
					t.Fatalf("Stop = %v", err)
				}
				told()
			} else {
				cancelStart()
				// Nobody calls Stop: the notices come on their own, once the
				// handlers' grace has passed.
				guard := time.After(hangGuard)
				for len(told()) < 2 {
					select {
					case <-guard:
						t.Fatalf("hang guard: OnError was told %v", sink.list())
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
			if len(notices) != 2 {
				t.Fatalf("OnError was told %v, want one notice per job left unreported", sink.list())
			}
			for _, n := range notices {
				if !ids[n.JobID] || n.Attempt != 1 || n.What != "not_recorded" || !errors.Is(n, ErrWorkerStopped) ||
					!strings.Contains(n.Error(), "left unreported") || strings.Contains(n.Error(), "cus_input_not_for_logs") {
					t.Fatalf("notice %+v: %v", n, n)
				}
				delete(ids, n.JobID) // once per job
			}
		})
	}
}

// A handler cancelled at Stop's deadline has the stop grace to return and
// be reported: DefaultStopGrace, 10 s, unless StartOptions.StopGrace says
// otherwise, as the Python and TypeScript workers' start options (sdk QA:
// theirs was a fixed second, Go's a fixed 10 s); one that outlasts it is
// left unreported. Nothing waits the grace out: the worker's clock fires
// timers of exactly the grace's length only when the test says, so a grace
// of any other length never begins (the test fails at its hang guard), and
// the handler is given up only once the grace fires.
func TestWorkerStopGraceIsTenSecondsUnlessSet(t *testing.T) {
	t.Parallel()
	if DefaultStopGrace != 10*time.Second {
		t.Fatalf("DefaultStopGrace = %v", DefaultStopGrace)
	}
	for _, c := range []struct {
		set, grace time.Duration
	}{{0, 10 * time.Second}, {500 * time.Millisecond, 500 * time.Millisecond}} {
		for _, returns := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v returns %v", c.grace, returns), func(t *testing.T) {
				t.Parallel()
				f := newFakeJobs()
				id := f.add("slow", "1", welcomeIn{}, 60000)
				started, release := make(chan struct{}), make(chan struct{})
				defer close(release)
				cw, _ := testClient(t, f)
				w := NewWorker(cw)
				clk := &gatedClock{gated: c.grace, open: make(chan struct{}), asked: make(chan struct{}, 8)}
				w.clock = clk
				must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "slow", Version: "1",
					Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
						close(started)
						<-ctx.Done()
						<-release // a call it was in ends first
						return welcomeOut{Sent: true}, nil
					}}))
				must(t, w.Start(context.Background(), StartOptions{PollInterval: 20 * time.Millisecond, OnError: (&errSink{}).add,
					StopGrace: c.set}))
				awaitWithin(t, started, "the handler's start")
				ctx, cancel := context.WithCancel(context.Background())
				cancel() // the deadline has passed: the handler is cancelled at once
				stopped := make(chan error, 1)
				go func() { stopped <- w.Stop(ctx) }()
				// The grace begins: Stop's wait for the handlers and the
				// handler's own, each a timer of exactly the grace.
				awaitWithin(t, clk.asked, "Stop's grace")
				awaitWithin(t, clk.asked, "the handler's grace")
				want := "ignored cancellation and were left unreported"
				if returns {
					release <- struct{}{}
					want = "1 handler(s) cancelled and reported as they returned"
				} else {
					close(clk.open)
				}
				err := awaitWithin(t, stopped, "Stop")
				f.mu.Lock()
				_, reported := f.reports[id]
				f.mu.Unlock()
				if reported != returns || err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("reported %v, Stop = %v", reported, err)
				}
			})
		}
	}
}

// Stop does not wait out a rate limit on a claim: the claim's retry wait
// ends with Stop, and nothing is claimed after it.
func TestWorkerStopCutsAClaimsRetryWait(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	limited := make(chan struct{}, 1)
	f.claimError = func() (int, string, map[string]any) {
		select {
		case limited <- struct{}{}:
		default:
		}
		return 429, "rate_limited", map[string]any{"retry_after_seconds": 60}
	}
	w, _ := startWorker(t, f, func(w *Worker) {
		w.c.sleep = sleepCtx // really wait out the Retry-After
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "any", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	}, StartOptions{})
	<-limited // the claim is waiting out its 60 s
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Stop is waiting out the claim's Retry-After")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.claims != 1 {
		t.Fatalf("%d claims, want the one refused", f.claims)
	}
}

// reportRefused answers a report request with f.reportError's refusal, if any.
func reportRefused(w http.ResponseWriter, f *fakeJobs, raw json.RawMessage) bool {
	status, code := f.reportError(raw)
	if status == 0 {
		return false
	}
	apiError(w, status, code, nil)
	return true
}

// Stop sends every report until its deadline plus twice StopGrace, whenever
// its handler returned, as the Python and TypeScript workers do; so does a
// worker whose Start's context ended, from that end: here the server takes
// reports only from one and a half graces past the deadline. Stop gave the
// reports of handlers that had all returned (before the deadline, or at once
// when cancelled at it) one grace past the later of the two, as did the end
// of Start's context, and lost them.
func TestStopSendsEveryReportUntilTwiceTheGracePastItsDeadline(t *testing.T) {
	t.Parallel()
	const grace = 2 * time.Second
	for _, c := range []struct {
		name      string
		cancelled bool // the handler runs until the deadline cancels it
		byStart   bool // Start's context ends at the deadline, and no Stop is called by then
	}{{"returned before the deadline", false, false}, {"cancelled at the deadline", true, false},
		{"Start's context ended", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeJobs()
			f.leaseFor = time.Hour
			var takeFrom atomic.Int64 // unix nanoseconds from which reports are taken (0: none yet)
			failing := make(chan struct{}, 1)
			f.reportError = func(json.RawMessage) (int, string) {
				if from := takeFrom.Load(); from != 0 && time.Now().UnixNano() >= from {
					return 0, ""
				}
				select {
				case failing <- struct{}{}:
				default:
				}
				time.Sleep(10 * time.Millisecond) // paces the worker's retries, whose waits are not slept
				return 503, "database_unavailable"
			}
			id := f.add("quick", "1", welcomeIn{}, 60_000)
			started := make(chan struct{})
			cl, _ := testClient(t, f)
			w := NewWorker(cl)
			must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1",
				Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
					close(started)
					if c.cancelled {
						<-ctx.Done()
					}
					return welcomeOut{Sent: true}, nil
				}}))
			startCtx, endStart := context.WithCancel(context.Background())
			defer endStart()
			must(t, w.Start(startCtx, StartOptions{PollInterval: 20 * time.Millisecond, OnError: (&errSink{}).add, StopGrace: grace}))
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = stopWithin(t, w, ctx)
			})
			<-started
			if !c.cancelled {
				<-failing // the handler returned: its report is being refused
			}
			deadline := time.Now().Add(100 * time.Millisecond)
			takeFrom.Store(deadline.Add(grace * 3 / 2).UnixNano())
			if c.byStart {
				time.AfterFunc(time.Until(deadline), endStart)
				f.waitReport(t, id) // given up, it never comes
				return
			}
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			err := stopWithin(t, w, ctx)
			f.mu.Lock()
			_, recorded := f.reports[id]
			f.mu.Unlock()
			if !recorded {
				t.Fatalf("the report was given up before the deadline plus twice the grace: Stop = %v", err)
			}
			if c.cancelled {
				if err == nil || errors.Is(err, ErrReportsNotRecorded) {
					t.Fatalf("Stop = %v, want the deadline's error with the report recorded", err)
				}
			} else if err != nil {
				t.Fatalf("Stop = %v", err)
			}
		})
	}
}

// A refusal stops the worker as a stop whose deadline is the refusal: the
// reports of the handlers it cancelled are sent until twice StopGrace past
// it, then given up (OnError told), whether or not Stop is called, as the
// Python and TypeScript workers give them up. They were sent until Stop's
// deadline: without a Stop, for ever while the server failed them.
func TestARefusedWorkerGivesItsReportsUpWithoutAStop(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseFor = time.Hour
	id := f.add("quick", "1", welcomeIn{}, 60_000)
	f.onClaim = func(_, got int) {
		if got > 0 { // the job is leased: every later claim is forbidden
			f.claimError = func() (int, string, map[string]any) { return 403, CodeForbidden, nil }
		}
	}
	f.reportError = func(json.RawMessage) (int, string) {
		time.Sleep(10 * time.Millisecond) // paces the worker's retries, whose waits are not slept
		return 503, "database_unavailable"
	}
	givenUp := make(chan error, 1)
	_, _ = startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1",
			Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
				<-ctx.Done() // cancelled by the refusal
				return welcomeOut{}, ctx.Err()
			}}))
	}, StartOptions{Concurrency: 2, StopGrace: 100 * time.Millisecond, OnError: func(err error) {
		var lost *ReportNotRecordedError
		if errors.As(err, &lost) && lost.JobID == id {
			select {
			case givenUp <- err:
			default:
			}
		}
	}})
	select {
	case <-givenUp:
	case <-time.After(30 * time.Second): // hang guard: twice the grace is 200 ms
		t.Fatal("the refused worker's report was never given up")
	}
}

// A refusal during a Stop (a heartbeat's 401 while Stop waits for the
// handlers) is a stop whose deadline is the refusal too: the reports are
// given up twice StopGrace past it, not at Stop's own deadline (five
// minutes here, past the hang guard), as the Python and TypeScript workers
// give them up.
func TestARefusalDuringAStopGivesTheReportsUpTwiceTheGracePastIt(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseFor = 3 * time.Second // a heartbeat about every second
	var refuse atomic.Bool
	f.heartbeat = func(string) (int, string) {
		if refuse.Load() {
			return 401, CodeUnauthorized
		}
		return 0, ""
	}
	f.reportError = func(json.RawMessage) (int, string) {
		time.Sleep(10 * time.Millisecond) // paces the worker's retries, whose waits are not slept
		return 503, "database_unavailable"
	}
	f.add("stuck", "1", welcomeIn{}, 60_000)
	started := make(chan struct{})
	w, _ := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "stuck", Version: "1",
			Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
				close(started)
				<-ctx.Done() // cancelled by the refusal
				return welcomeOut{}, ctx.Err()
			}}))
	}, StartOptions{StopGrace: 100 * time.Millisecond})
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	<-w.Done() // Stop ended the polling: the refusal comes during it
	refuse.Store(true)
	err := awaitWithin(t, stopped, "Stop")
	if !IsCode(err, CodeUnauthorized) || !errors.Is(err, ErrReportsNotRecorded) {
		t.Fatalf("Stop = %v, want the refusal and the report not recorded", err)
	}
}

// A report the server cannot take for a while (503s beyond the client's own
// retries) is sent again until it is recorded, while its lease stands: a
// dropped report would let the job run again.
func TestWorkerReportOutlastsAnOutage(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseFor = time.Minute
	var refused atomic.Int32
	f.reportError = func(json.RawMessage) (int, string) {
		if refused.Add(1) <= 8 {
			return 503, "database_unavailable"
		}
		return 0, ""
	}
	id := f.add("quick", "1", welcomeIn{}, 30000)
	worker, sink := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{Sent: true}, nil }}))
	}, StartOptions{})
	if rep := f.waitReport(t, id); rep["status"] != "SUCCEEDED" {
		t.Fatalf("report %v", rep)
	}
	if errs := sink.delivered(worker); len(errs) != 0 {
		t.Fatalf("errors reported: %v", errs)
	}
}

// A report the server keeps failing while it records others does not hold
// the claims: the worker claims again once it is found failing on its own
// (the reporter's markFailing). Nothing woke the claim loop then: waiting
// for a report to settle, it claimed nothing until another did (never,
// with no other job running).
func TestWorkerClaimsAgainOnceAReportFailsOnItsOwn(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	bad := f.add("t", "1", welcomeIn{}, 30000)
	good := f.add("t", "1", welcomeIn{}, 30000)
	var release atomic.Bool
	f.reportError = func(body json.RawMessage) (int, string) {
		if release.Load() || !strings.Contains(string(body), `"tok_`+bad+`"`) {
			return 0, ""
		}
		time.Sleep(5 * time.Millisecond) // a slow answer: testClient's retries are not slept
		return 500, CodeInternal
	}
	var worker *Worker
	startWorker(t, f, func(w *Worker) {
		worker = w
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
			Handler: func(_ context.Context, _ welcomeIn, jc JobContext) (welcomeOut, error) {
				// good is reported once bad's report, failing, holds the claims.
				for deadline := time.Now().Add(10 * time.Second); jc.JobID == good && !worker.reporter.holding(time.Now()); {
					if time.Now().After(deadline) {
						return welcomeOut{}, errors.New("bad's report never held the claims")
					}
					time.Sleep(time.Millisecond)
				}
				return welcomeOut{Sent: true}, nil
			}}))
	}, StartOptions{Concurrency: 2})
	if rep := f.waitReport(t, good); rep["status"] != "SUCCEEDED" {
		t.Fatalf("report %v", rep)
	}
	f.mu.Lock()
	before := f.claims
	f.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		claims := f.claims
		f.mu.Unlock()
		if claims > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no claim once the failing report was found failing on its own")
		}
		time.Sleep(10 * time.Millisecond)
	}
	release.Store(true)
	f.waitReport(t, bad)
}

// A success whose output the server refuses as too large is reported as a
// non-retryable failure, so the job ends once instead of running again at
// every lapse.
func TestWorkerReportsAnOversizedOutputAsAFailure(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.reportError = func(body json.RawMessage) (int, string) {
		if strings.Contains(string(body), `"SUCCEEDED"`) {
			return 413, "payload_too_large"
		}
		return 0, ""
	}
	id := f.add("big", "1", welcomeIn{}, 30000)
	startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "big", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{Sent: true}, nil }}))
	}, StartOptions{})
	rep := f.waitReport(t, id)
	e, _ := rep["error"].(map[string]any)
	if rep["status"] != ReportFailed || e == nil || e["retryable"] != false {
		t.Fatalf("report %v", rep)
	}
}

// OnError reads a report the server did not record with errors.As: the
// job, the attempt, what became of it and the call's error, as the Python
// and TypeScript workers' notices carry them (sdk QA: Go's type was
// unexported, so only its text said which job).
func TestOnErrorReadsAReportNotRecorded(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.refuse = map[string]string{}
	f.reportError = func(body json.RawMessage) (int, string) {
		if strings.Contains(string(body), `"SUCCEEDED"`) && strings.Contains(string(body), `"big"`) {
			return 413, CodePayloadTooLarge
		}
		return 0, ""
	}
	refused := f.add("t", "1", welcomeIn{CustomerID: "refused"}, 30000)
	big := f.add("t", "1", welcomeIn{CustomerID: "big"}, 30000)
	f.refuse[refused] = CodeInvalidState
	notices := make(chan *ReportNotRecordedError, 10)
	startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
			Handler: func(_ context.Context, in welcomeIn, _ JobContext) (welcomeOut, error) {
				return welcomeOut{Sent: true, Key: in.CustomerID}, nil
			}}))
	}, StartOptions{OnError: func(err error) {
		var notice *ReportNotRecordedError
		if errors.As(err, &notice) {
			notices <- notice
		}
	}})
	got := map[string]*ReportNotRecordedError{}
	for len(got) < 2 {
		select {
		case n := <-notices:
			got[n.JobID] = n
		case <-time.After(30 * time.Second):
			t.Fatalf("OnError was told %v", got)
		}
	}
	if n := got[refused]; n.What != "not_recorded" || n.Attempt != 1 || !IsCode(n, CodeInvalidState) ||
		!IsCode(n.Err, CodeInvalidState) || !strings.Contains(n.Error(), refused) {
		t.Fatalf("the refused report's notice %+v", n)
	}
	if n := got[big]; n.What != "output_refused" || n.Attempt != 1 || !IsCode(errors.Unwrap(n), CodePayloadTooLarge) {
		t.Fatalf("the refused output's notice %+v", n)
	}
}

// fakeClock fires every timer at once and advances time by its duration,
// except timers whose duration fails fires (those never fire). After limit
// it stops firing and closes done.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	end    time.Time
	fires  func(time.Duration) bool
	done   chan struct{}
	once   sync.Once
	waits  []time.Duration
	onWait func()
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Timer(d time.Duration) (<-chan time.Time, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if c.fires != nil && !c.fires(d) {
		return ch, func() {}
	}
	if !c.now.Add(d).Before(c.end) {
		c.once.Do(func() { close(c.done) })
		return ch, func() {}
	}
	c.waits = append(c.waits, d)
	if c.onWait != nil {
		c.onWait()
	}
	c.now = c.now.Add(d)
	ch <- c.now
	return ch, func() {}
}

func TestIdleWorkerPollPacing(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	c, _ := testClient(t, f)
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{now: start, end: start.Add(10 * time.Minute), done: make(chan struct{})}
	w.clock = clk // real jitter: the pacing must hold whatever it draws
	if err := w.Start(context.Background(), StartOptions{Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	<-clk.done
	must(t, stopWithin(t, w, context.Background()))
	f.mu.Lock()
	claims := f.claims
	f.mu.Unlock()
	// Default 30 s ± 10 %: 10 minutes hold 18–23 claims (one at start).
	if claims < 18 || claims > 23 {
		t.Fatalf("%d claims in 10 idle minutes (waits %v)", claims, clk.waits)
	}
	for _, d := range clk.waits {
		if d < 27*time.Second || d > 33*time.Second {
			t.Fatalf("idle wait %v outside 30s ± 10%%", d)
		}
	}
}

func TestFullBatchClaimsAgainAtOnce(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	for range 10 {
		f.add("t", "1", welcomeIn{}, 0)
	}
	c, _ := testClient(t, f)
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	var (
		mu  sync.Mutex
		log []string // "full", "partial", "wait" in order
	)
	f.onClaim = func(limit, got int) {
		mu.Lock()
		defer mu.Unlock()
		if got == limit {
			log = append(log, "full")
		} else {
			log = append(log, "partial")
		}
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Only poll waits fire (heartbeats at a 10 minute lease wait 60 s; the
	// claim cooldown never ends, so a busy worker waits for a full claim).
	clk := &fakeClock{now: start, end: start.Add(5 * time.Minute), done: make(chan struct{}),
		fires: func(d time.Duration) bool { return d != maxHeartbeat && d != claimCooldown },
		onWait: func() {
			mu.Lock()
			log = append(log, "wait")
			mu.Unlock()
		}}
	w.clock = clk
	if err := w.Start(context.Background(), StartOptions{Concurrency: 4}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		select {
		case <-f.reported:
		case <-time.After(30 * time.Second):
			t.Fatal("jobs not all reported")
		}
	}
	<-clk.done
	must(t, stopWithin(t, w, context.Background()))
	f.mu.Lock()
	for i, l := range f.limits {
		if l < 1 || l > 4 {
			t.Fatalf("claim %d asked for %d jobs with concurrency 4", i, l)
		}
	}
	f.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	// Every idle wait follows a partial batch; a full one is followed by
	// another claim at once (or by waiting for a free slot).
	last := ""
	for i, e := range log {
		if e == "wait" && last != "partial" {
			t.Fatalf("idle wait after a %q claim at %d: %v", last, i, log)
		}
		if e != "wait" {
			last = e
		}
	}
	if log[0] != "full" {
		t.Fatalf("log %v", log)
	}
}

// After a full claim a busy worker claims again only once a full claim's
// worth of slots is free (here the cooldown never ends), not slot by slot:
// handlers finish one at a time, yet every claim asks for all four slots.
func TestBusyWorkerGathersAFullClaim(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	const jobs = 12
	for range jobs {
		f.add("t", "1", welcomeIn{}, 0)
	}
	c, _ := testClient(t, f)
	w := NewWorker(c)
	release := make(chan struct{})
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { <-release; return welcomeOut{}, nil }}))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w.clock = &fakeClock{now: start, end: start.Add(time.Hour), done: make(chan struct{}),
		fires: func(d time.Duration) bool { return d != maxHeartbeat && d != claimCooldown }}
	must(t, w.Start(context.Background(), StartOptions{Concurrency: 4}))
	for range jobs {
		release <- struct{}{} // one handler finishes
		select {
		case <-f.reported:
		case <-time.After(30 * time.Second):
			t.Fatal("a finished job was not reported")
		}
	}
	must(t, stopWithin(t, w, context.Background()))
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.limits) < jobs/4 {
		t.Fatalf("claims %v", f.limits)
	}
	for i, l := range f.limits[:jobs/4] {
		if l != 4 {
			t.Fatalf("claim %d asked for %d slots, want a full claim of 4: %v", i, l, f.limits)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	must(t, err)
	return b
}

func TestWorkerStartContextCancelStopsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("long", "1", welcomeIn{}, 60000)
	c, _ := testClient(t, f)
	w := NewWorker(c)
	started, causes := make(chan struct{}), make(chan error, 1)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "long", Version: "1",
		Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
			close(started)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return welcomeOut{}, ctx.Err()
		}}))
	ctx, cancel := context.WithCancel(context.Background())
	must(t, w.Start(ctx, StartOptions{PollInterval: 10 * time.Millisecond}))
	<-started
	cancel()
	if cause := <-causes; !errors.Is(cause, ErrWorkerStopped) {
		t.Fatalf("cause %v", cause)
	}
	e := f.waitReport(t, id)["error"].(map[string]any)
	if e["retryable"] != true {
		t.Fatalf("report %v", e)
	}
	// Stop says that the handler was cut off, not that all went well (QA).
	if err := stopWithin(t, w, context.Background()); !errors.Is(err, ErrWorkerStopped) ||
		!strings.Contains(err.Error(), "1 handler(s) were cancelled when Start's context ended") {
		t.Fatalf("Stop: %v", err)
	}
}

func TestWorkerStartErrors(t *testing.T) {
	t.Parallel()
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		apiError(w, 403, CodeForbidden, map[string]any{"required": []string{"tool:t@2"}})
	}))
	w := NewWorker(c)
	if err := w.Start(context.Background(), StartOptions{}); err == nil {
		t.Fatal("started without tools")
	}
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "2",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	if err := w.Start(context.Background(), StartOptions{}); !IsCode(err, CodeForbidden) {
		t.Fatalf("err %v", err)
	}
	must(t, stopWithin(t, w, context.Background())) // never started: nothing to do
}

func TestHeartbeatEvery(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := &Worker{clock: &fakeClock{now: now}}
	cases := []struct {
		left      time.Duration
		timeoutMs int64
		leaseMs   int64
		want      time.Duration
	}{
		{40 * time.Second, 30_000, 0, 10 * time.Second}, // the timeout bounds a lease skewed long
		{12 * time.Second, 30_000, 0, 4 * time.Second},  // a third of what is left
		{time.Hour, 0, 0, time.Minute},                  // at most a minute
		{-time.Second, 30_000, 0, time.Second},          // already lapsed: at least a second
		// The lease's length, when the server says it, whatever its clock:
		// here the lease has just been granted or extended.
		{-time.Hour, 60_000, 45_000, 15 * time.Second},
		{time.Hour, 60_000, 45_000, 15 * time.Second},
		{0, 0, 600_000, time.Minute},
		// The timeout bounds it too, so a cancellation reaches the handler
		// within a third of its timeout (SDK QA: a 5 s job, its lease 15 s,
		// was first heartbeated at its timeout).
		{time.Hour, 30_000, 45_000, 10 * time.Second},
		{time.Hour, 5_000, 15_000, 5 * time.Second / 3},
	}
	for _, c := range cases {
		j := ClaimedJob{TimeoutMs: c.timeoutMs, LeaseMs: c.leaseMs}
		end := now.Add(c.left) // the server's expiry, against the worker's clock
		if c.leaseMs > 0 {
			end = time.Now().Add(time.Duration(c.leaseMs)*time.Millisecond + time.Minute) // this process's clock
		}
		if got := w.heartbeatEvery(end, j); got != c.want {
			t.Fatalf("heartbeatEvery(%v left, timeout %d ms, lease %d ms) = %v, want %v", c.left, c.timeoutMs,
				c.leaseMs, got, c.want)
		}
	}
	// Heartbeats that failed leave less of the lease by this process's
	// clock: the next try comes at a third of what is left.
	j := ClaimedJob{TimeoutMs: 60_000, LeaseMs: 15_000}
	if got := w.heartbeatEvery(time.Now().Add(6*time.Second), j); got < time.Second || got > 2*time.Second {
		t.Fatalf("with 6 s of a 15 s lease left: every %v, want about 2 s", got)
	}
	if got := w.heartbeatEvery(time.Now().Add(-time.Second), j); got != time.Second {
		t.Fatalf("with the lease lapsed: every %v, want 1 s", got)
	}
}

// With WaitSeconds, an empty claim's long poll counts towards the poll
// interval: an idle worker makes no more claim calls than without it.
func TestLongPollKeepsIdleClaimBudget(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	var waits []int
	cnt := &countingWaits{next: f, waits: &waits}
	c, _ := testClient(t, cnt)
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{now: start, end: start.Add(10 * time.Minute), done: make(chan struct{})}
	w.clock = clk
	f.onClaim = func(limit, got int) {
		// The fake answers at once; advance the clock as a server holding
		// an empty long poll for waitSeconds would.
		clk.mu.Lock()
		clk.now = clk.now.Add(20 * time.Second)
		clk.mu.Unlock()
	}
	must(t, w.Start(context.Background(), StartOptions{WaitSeconds: 20}))
	<-clk.done
	must(t, stopWithin(t, w, context.Background()))
	f.mu.Lock()
	claims := f.claims
	f.mu.Unlock()
	if claims < 18 || claims > 23 {
		t.Fatalf("%d claims in 10 idle minutes with long polls (waits %v)", claims, clk.waits)
	}
	cnt.mu.Lock()
	defer cnt.mu.Unlock()
	for _, ws := range waits {
		if ws != 20 {
			t.Fatalf("claim sent waitSeconds %d, want 20", ws)
		}
	}
	for _, d := range clk.waits {
		if d > 13*time.Second {
			t.Fatalf("idle wait %v after a 20 s long poll; the interval is 30 s ± 10 %%", d)
		}
	}
}

// countingWaits records each claim's waitSeconds on the way to next.
type countingWaits struct {
	mu    sync.Mutex
	next  http.Handler
	waits *[]int
}

func (c *countingWaits) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/claim") {
		var body struct {
			WaitSeconds int `json:"waitSeconds"`
		}
		raw, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(raw, &body)
		c.mu.Lock()
		*c.waits = append(*c.waits, body.WaitSeconds)
		c.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(raw))
	}
	c.next.ServeHTTP(w, r)
}

// A claim whose answer may have been lost (here a 500 after every retry)
// leaves its claim id to the worker's next claim, so that the server can
// answer what the lost one leased; a claim answered, or refused before the
// server acted (a 4xx), does not.
func TestWorkerAsksAgainUnderALostClaimsID(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	answers := []int{500, 500, 500, 500, 500, 500, 500, 500, 500, 500, 0, 404, 0}
	f.claimError = func() (int, string, map[string]any) {
		if len(f.claimIDs) > len(answers) {
			return 0, "", nil
		}
		switch answers[len(f.claimIDs)-1] {
		case 500:
			return 500, "internal", nil
		case 404: // refused (the worker is registered again)
			return 404, CodeNotFound, nil
		}
		return 0, "", nil
	}
	startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "any", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	}, StartOptions{PollInterval: time.Millisecond})
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		n := len(f.claimIDs)
		ids := append([]string(nil), f.claimIDs...)
		f.mu.Unlock()
		if n > len(answers) {
			for i, id := range ids[:11] {
				if id == "" || id != ids[0] {
					t.Fatalf("claim %d under %q, want the lost claims' %q (all: %q)", i, id, ids[0], ids)
				}
			}
			if ids[11] == ids[10] || ids[12] == ids[11] {
				t.Fatalf("a claim answered or refused left its id to the next: %q", ids)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d claims after 10 s: %q", n, ids)
		}
		time.Sleep(time.Millisecond)
	}
}

// A claim whose answer was lost (its retries too) is asked again under its
// id after a backoff, not after a whole poll interval, which would outlast
// a short lease (Go SDK QA: jobs with a 15 s lease lapsed unseen while the
// worker waited its 30 s).
func TestWorkerAsksAgainForALostClaimWithoutWaitingItsPollInterval(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("quick", "1", welcomeIn{}, 30000)
	var claims atomic.Int32
	f.claimError = func() (int, string, map[string]any) {
		if claims.Add(1) <= 4 { // the claim and the client's three retries
			return 500, "internal", nil
		}
		return 0, "", nil
	}
	startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{Sent: true}, nil }}))
	}, StartOptions{PollInterval: time.Hour})
	if rep := f.waitReport(t, id); rep["status"] != "SUCCEEDED" {
		t.Fatalf("report %v", rep)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.claimIDs[:5] { // the lost claim's four, and the one answered
		if c != f.claimIDs[0] {
			t.Fatalf("claims under %q: the lost claim's id was not kept", f.claimIDs)
		}
	}
}

// A Stop that comes while a claim whose answer was lost waits to be asked
// again does not end it: the claim is asked again under its id, and the
// jobs it leased run and are reported within the stop's time (Go SDK QA:
// the stop ended the wait, nothing was asked again, the jobs lapsed unseen
// and Stop said nothing).
func TestWorkerStopAsksAgainUnderALostClaimsID(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("quick", "1", welcomeIn{}, 30000)
	var answering atomic.Bool
	var claims atomic.Int32
	f.claimError = func() (int, string, map[string]any) {
		claims.Add(1)
		if !answering.Load() {
			return 500, "internal", nil
		}
		return 0, "", nil
	}
	w, sink := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{Sent: true}, nil }}))
	}, StartOptions{PollInterval: time.Hour})
	if !eventually(func() bool { return claims.Load() >= 4 }) { // the claim and its retries: lost
		t.Fatal("no claim")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	if !eventually(func() bool { w.mu.Lock(); defer w.mu.Unlock(); return closed(w.stopping) }) {
		t.Fatal("not stopping")
	}
	answering.Store(true)
	if err := awaitWithin(t, stopped, "Stop"); err != nil {
		t.Fatal(err)
	}
	if rep := f.waitReport(t, id); rep["status"] != "SUCCEEDED" {
		t.Fatalf("report %v", rep)
	}
	for _, err := range sink.delivered(w) { // at most the lost claim's, when it was told before the stop
		if !strings.Contains(err.Error(), "ratchet: claim: ") {
			t.Fatalf("OnError %v", err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.claimIDs {
		if c != f.claimIDs[0] {
			t.Fatalf("claims under %q: the lost claim's id was not kept", f.claimIDs)
		}
	}
}

// A claim names its claimId on every request, and a refusal of it stands:
// it is never made again without one, which would leave the jobs a lost
// answer leased to nobody (every supported server takes the field; sdk QA:
// the Go SDK alone claimed again without it).
func TestClaimAlwaysSendsItsClaimID(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.claimError = func() (int, string, map[string]any) {
		if f.claimIDs[len(f.claimIDs)-1] != "" {
			return 400, CodeInvalidRequest, map[string]any{"validation": []map[string]any{
				{"field": "claimId", "message": "is not a known field"}}}
		}
		return 0, "", nil
	}
	f.add("send_welcome_email", "1", welcomeIn{CustomerID: "cus_1"}, 30000)
	c, _ := testClient(t, f)
	if _, err := c.Claim(context.Background(), "wkr_1", 5, 0); !IsCode(err, CodeInvalidRequest) {
		t.Fatalf("err %v", err)
	}
	if len(f.claimIDs) != 1 || f.claimIDs[0] == "" {
		t.Fatalf("claim ids %q, want one, refused", f.claimIDs)
	}
}

// A server that no longer knows the worker (it deletes registrations long
// unseen) answers its claim 404: the worker registers again and claims on.
func TestWorkerRegistersAgainWhenForgotten(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	forgotten := true
	f.claimError = func() (int, string, map[string]any) {
		if forgotten {
			forgotten = false
			return http.StatusNotFound, CodeNotFound, nil
		}
		return 0, "", nil
	}
	id := f.add("send_welcome_email", "1", welcomeIn{CustomerID: "cus_1"}, 30000)
	startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "send_welcome_email", Version: "1",
			Handler: func(ctx context.Context, in welcomeIn, job JobContext) (welcomeOut, error) {
				return welcomeOut{Sent: true}, nil
			}}))
	}, StartOptions{PollInterval: time.Millisecond})
	if rep := f.waitReport(t, id); rep["status"] != "SUCCEEDED" {
		t.Fatalf("report %v", rep)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.registrations != 2 {
		t.Fatalf("registrations %d, want 2", f.registrations)
	}
}

// A registration that fails for a reason that may pass when the worker
// registers again is reported to OnError, and the worker keeps claiming: the
// next 404 registers again.
func TestWorkerRegistersAgainAfterAFailedRegistration(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	var forgotten atomic.Bool
	forgotten.Store(true)
	f.claimError = func() (int, string, map[string]any) {
		if forgotten.Load() {
			return http.StatusNotFound, CodeNotFound, nil
		}
		return 0, "", nil
	}
	f.registerError = func(n int) (int, string) {
		switch {
		case n >= 2 && n <= 5: // the first registration again, with the client's 3 retries
			return http.StatusServiceUnavailable, "service_unavailable"
		case n == 6:
			forgotten.Store(false)
		}
		return 0, ""
	}
	id := f.add("send_welcome_email", "1", welcomeIn{CustomerID: "cus_1"}, 30000)
	worker, sink := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "send_welcome_email", Version: "1",
			Handler: func(ctx context.Context, in welcomeIn, job JobContext) (welcomeOut, error) {
				return welcomeOut{Sent: true}, nil
			}}))
	}, StartOptions{PollInterval: time.Millisecond})
	if rep := f.waitReport(t, id); rep["status"] != "SUCCEEDED" {
		t.Fatalf("report %v", rep)
	}
	f.mu.Lock()
	registrations := f.registrations
	f.mu.Unlock()
	if registrations != 6 {
		t.Fatalf("registrations %d, want 6", registrations)
	}
	var seen bool
	for _, err := range sink.delivered(worker) {
		seen = seen || strings.Contains(err.Error(), "register again")
	}
	if !seen {
		t.Fatalf("OnError never heard of the failed registration: %v", sink.list())
	}
}

// Decoders quote the values they refuse (a ,string tag, time.Parse, a custom
// UnmarshalJSON); an input is a payload, so a schema failure's report names
// where and what was expected, never a value, and the full error stays local.
func TestSchemaFailureReportsNoInputValue(t *testing.T) {
	t.Parallel()
	type amounts struct {
		Amount int       `json:"amount,string"`
		When   time.Time `json:"when"`
		Count  int       `json:"count"`
	}
	f := newFakeJobs()
	quoted := f.add("typed", "1", map[string]any{"amount": "salary 98000 for Jane Roe"}, 0)
	parsed := f.add("typed", "1", map[string]any{"when": "Customer Jane Roe DOB"}, 0)
	typed := f.add("typed", "1", map[string]any{"count": "Jane Roe"}, 0)
	worker, sink := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[amounts, welcomeOut]{Name: "typed", Version: "1",
			Handler: func(context.Context, amounts, JobContext) (welcomeOut, error) {
				t.Error("handler ran on input of the wrong shape")
				return welcomeOut{}, nil
			}}))
	}, StartOptions{Concurrency: 3})
	for _, id := range []string{quoted, parsed} {
		e := f.waitReport(t, id)["error"].(map[string]any)
		if e["message"] != "input does not match the handler's input type" || e["retryable"] != false {
			t.Fatalf("report %v", e)
		}
	}
	e := f.waitReport(t, typed)["error"].(map[string]any)
	if e["message"] != `input does not match the handler's input type: field "count" expected int, got a JSON string` {
		t.Fatalf("report %v", e)
	}
	if errs := sink.delivered(worker); !slices.ContainsFunc(errs, func(err error) bool { return strings.Contains(err.Error(), "Jane Roe") }) {
		t.Fatalf("the full error should reach OnError: %v", errs)
	}
}

// A server that takes no reports does not hold Stop past its deadline and
// graces: handlers that returned but whose reports could not be queued (the
// queue full behind batches the server keeps refusing) are given up, and
// Stop's error says reports went undelivered, not that handlers ignored
// cancellation.
func TestStopKeepsItsDeadlineWhenNoReportIsTaken(t *testing.T) {
	t.Parallel()
	w, _ := fullReportQueue(t, context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	// The reports would be retried for their 10-minute leases: a Stop
	// that waited for them past its deadline and graces does not return
	// before the hang guard.
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	var err error
	select {
	case err = <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("Stop outlived its 300 ms deadline and 200 ms graces: it waited for reports the server refuses")
	}
	if err == nil || strings.Contains(err.Error(), "ignored cancellation") || !strings.Contains(err.Error(), "OnError") ||
		!errors.Is(err, ErrReportsNotRecorded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v", err)
	}
	// Every report was given up, those that waited for room included.
	if want := fmt.Sprintf("%d report(s) were not recorded", fullQueueJobs); !strings.Contains(err.Error(), want) {
		t.Fatalf("Stop: %v; want %q", err, want)
	}
}

// A worker ended by Start's context while its report queue is full (the
// server refusing reports as hundreds of handlers return) gives its last
// reports up after the grace all the same: the reports waiting for room in
// the queue go to OnError with the others, and the reporter ends (review:
// the grace began only once every report was queued, which those waiting
// for room never were until the reporter gave up, so with nobody calling
// Stop the reports were retried for the life of the process).
func TestWorkerStartContextCancelGivesUpAFullReportQueue(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	w, sink := fullReportQueue(t, ctx)
	cancel()
	select {
	case <-w.reporter.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the last reports were still being retried 30 s after the grace")
	}
	if n := w.reporter.lostReports(); n != fullQueueJobs {
		t.Fatalf("lost %d of %d reports; OnError got %d notices", n, fullQueueJobs, len(sink.delivered(w)))
	}
}

// fullQueueJobs is how many jobs fullReportQueue runs: more reports than
// the reporter holds (reportInFlight batches in flight, one gathering and
// the queue behind it, reportBatchMax each), so that some wait for room.
const fullQueueJobs = 700

// fullReportQueue starts a worker under ctx (stop grace 200 ms) whose
// fullQueueJobs handlers have all returned while the server refuses every
// report with a 503: the reports fill the reporter's queue, and those that
// find no room wait in enqueue. It returns once every report is queued or
// waiting.
func fullReportQueue(t *testing.T, ctx context.Context) (*Worker, *errSink) {
	t.Helper()
	f := newFakeJobs()
	f.leaseFor = 10 * time.Minute // reports would be retried for that long
	f.reportError = func(json.RawMessage) (int, string) { return 503, "database_unavailable" }
	for i := range fullQueueJobs {
		f.add("quick", "1", welcomeIn{CustomerID: fmt.Sprint(i)}, 600_000)
	}
	c, _ := testClient(t, f)
	w := NewWorker(c)
	// The handlers return once all are claimed: a worker whose reports
	// fail claims no more, so they must not fail before.
	release := make(chan struct{})
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
			<-release
			return welcomeOut{Sent: true}, nil
		}}))
	sink := &errSink{}
	if err := w.Start(ctx, StartOptions{Concurrency: fullQueueJobs, OnError: sink.add, StopGrace: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for f.claimed() < fullQueueJobs {
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	// Every handler returned and its report is queued, or waits for room
	// in the full queue (a fixed 50 ms could end first on a loaded machine).
	for queued := 0; queued < fullQueueJobs; time.Sleep(5 * time.Millisecond) {
		w.reporter.pmu.Lock()
		queued = len(w.reporter.pending)
		w.reporter.pmu.Unlock()
	}
	return w, sink
}

// hangingClient is a client of f whose requests to paths ending in suffix
// signal arrived (once) and are held until the client gives up on them or
// the test ends.
func hangingClient(t *testing.T, f http.Handler, suffix string) (c *Client, arrived <-chan struct{}) {
	ch, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c, _ = testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, suffix) {
			f.ServeHTTP(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body) // so that the server notices the client hanging up
		once.Do(func() { close(ch) })
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release) }) // before the server closes
	return c, ch
}

// Stop keeps its deadline while a claim is in flight that nobody answers
// (a half-open connection, a client without a timeout): the claim is
// abandoned at the deadline, and the error does not pretend handlers were
// cancelled.
func TestWorkerStopAbandonsAnUnansweredClaimAtItsDeadline(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	c, claiming := hangingClient(t, f, "/claim") // an http.Client without a timeout
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	must(t, w.Start(context.Background(), StartOptions{}))
	<-claiming
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	select {
	case err := <-stopped:
		if !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "handler(s) cancelled") ||
			!strings.Contains(err.Error(), "claim in flight was abandoned") {
			t.Fatalf("Stop = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop is outwaiting an unanswered claim past its deadline")
	}
}

// A handler error whose Error method panics (a typed nil *MyError returned
// as error) costs one retryable failure, not the worker process.
func TestWorkerSurvivesAHandlerErrorThatPanics(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("nilerr", "1", welcomeIn{}, 60000)
	worker, sink := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "nilerr", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
				var pe *providerError
				return welcomeOut{}, pe
			}}))
	}, StartOptions{})
	e := f.waitReport(t, id)["error"].(map[string]any)
	if e["retryable"] != true || e["message"] != unexplainedFailure {
		t.Fatalf("report %v", e)
	}
	var pe *PanicError
	if errs := sink.delivered(worker); len(errs) == 0 || !errors.As(errs[0], &pe) {
		t.Fatalf("OnError %v", errs)
	}
}

// A handler that ends its goroutine with runtime.Goexit (t.FailNow, t.Fatal
// or t.SkipNow called in a handler under test) is reported as a panicking
// one is, a retryable failure with OnError told, and its slot is freed: its
// result was waited for with no bound, so the job, heartbeated on, was
// never reported, and with Concurrency 1 the worker ran nothing more
// (review).
func TestWorkerReportsAHandlerThatCallsGoexit(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	exits := f.add("exits", "1", welcomeIn{}, 0)
	next := f.add("exits", "1", welcomeIn{CustomerID: "ok"}, 0)
	worker, sink := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "exits", Version: "1",
			Handler: func(_ context.Context, in welcomeIn, _ JobContext) (welcomeOut, error) {
				if in.CustomerID == "" {
					runtime.Goexit()
				}
				return welcomeOut{Sent: true}, nil
			}}))
	}, StartOptions{Concurrency: 1})
	e := f.waitReport(t, exits)["error"].(map[string]any)
	if e["retryable"] != true || e["message"] != "handler panicked" {
		t.Fatalf("report %v", e)
	}
	if r := f.waitReport(t, next); r["status"] != ReportSucceeded {
		t.Fatalf("the next job's report %v", r)
	}
	var pe *PanicError
	if errs := sink.delivered(worker); len(errs) == 0 || !errors.As(errs[0], &pe) || !strings.Contains(pe.Error(), "Goexit") {
		t.Fatalf("OnError %v", errs)
	}
}

// stopRequested reports whether Stop has closed the worker's stopping
// channel.
func stopRequested(w *Worker) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopping != nil && closed(w.stopping)
}

// Stop called while Start is still registering is not lost: Start gives up
// without polling, and Stop returns once it has.
func TestWorkerStopDuringStartIsNotLost(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	registering, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releaseRegistration := func() { releaseOnce.Do(func() { close(release) }) }
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/register") {
			close(registering)
			<-release
		}
		f.ServeHTTP(w, r)
	}))
	t.Cleanup(releaseRegistration)
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	started := make(chan error, 1)
	go func() { started <- w.Start(context.Background(), StartOptions{PollInterval: 10 * time.Millisecond}) }()
	<-registering
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- w.Stop(ctx)
	}()
	for !stopRequested(w) {
		select {
		case err := <-stopped:
			t.Fatalf("Stop returned %v while Start was still registering", err)
		case <-time.After(time.Millisecond):
		}
	}
	releaseRegistration()
	if err := awaitWithin(t, started, "Start"); !errors.Is(err, ErrWorkerStopped) {
		t.Fatalf("Start = %v", err)
	}
	if err := awaitWithin(t, stopped, "Stop"); err != nil {
		t.Fatalf("Stop = %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.claims != 0 {
		t.Fatalf("%d claims after Stop", f.claims)
	}
}

// A Stop during a registration nobody answers cuts it off at its deadline.
func TestWorkerStopDuringAHungRegistrationKeepsItsDeadline(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	c, registering := hangingClient(t, f, "/register")
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	started := make(chan error, 1)
	go func() { started <- w.Start(context.Background(), StartOptions{}) }()
	<-registering
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Stop = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop is outwaiting a hung registration past its deadline")
	}
	select {
	case err := <-started:
		if !errors.Is(err, ErrWorkerStopped) {
			t.Fatalf("Start = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start is still registering after Stop returned")
	}
}

// reporterClosed reports whether Stop has begun sending the last reports.
func reporterClosed(w *Worker) bool {
	w.mu.Lock()
	r := w.reporter
	w.mu.Unlock()
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.closed
}

// A handler that finished before Stop's deadline has its report sent with
// the same grace as one cancelled at the deadline: a report in flight when
// the deadline passes is not abandoned.
func TestWorkerStopGivesFinishedReportsTheGrace(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("quick", "1", welcomeIn{}, 60000)
	arrived, answer := make(chan struct{}), make(chan struct{})
	var arrivedOnce sync.Once
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/report") {
			body, _ := io.ReadAll(r.Body) // so that the server notices the client hanging up
			r.Body = io.NopCloser(bytes.NewReader(body))
			arrivedOnce.Do(func() { close(arrived) })
			select {
			case <-answer:
			case <-r.Context().Done():
				return // abandoned by the client
			}
		}
		f.ServeHTTP(w, r)
	}))
	var answerOnce sync.Once
	answerReport := func() { answerOnce.Do(func() { close(answer) }) }
	t.Cleanup(answerReport)
	w := NewWorker(c)
	started, finish := make(chan struct{}), make(chan struct{})
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
			close(started)
			<-finish
			return welcomeOut{Sent: true}, nil
		}}))
	must(t, w.Start(context.Background(), StartOptions{PollInterval: 10 * time.Millisecond}))
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	awaitWithin(t, w.loopDone, "the poll loop")
	close(finish) // the handler finishes before the deadline
	<-arrived
	if !eventually(func() bool { return reporterClosed(w) }) { // Stop is sending the last reports
		t.Fatal("hang guard: Stop never began sending the last reports")
	}
	cancel() // the deadline passes with the report in flight
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v, abandoning the report in flight within its grace", err)
	case <-time.After(500 * time.Millisecond):
	}
	answerReport()
	if err := awaitWithin(t, stopped, "Stop"); err != nil {
		t.Fatalf("Stop = %v", err)
	}
	if rep := f.report(t, id); rep["status"] != "SUCCEEDED" {
		t.Fatalf("report %v", rep)
	}
}

// A worker ended by Start's context sends its last reports for at most the
// stop grace: with a server that takes none, they go to OnError and the
// sending ends (review: it retried for the life of the process).
func TestWorkerStartContextCancelGivesUpReportsAfterTheGrace(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseFor = 10 * time.Minute // reports would be retried for that long
	f.reportError = func(json.RawMessage) (int, string) { return 503, "database_unavailable" }
	f.add("long", "1", welcomeIn{}, 600_000)
	w, sink := cancelStartWhileRunning(t, f)
	w.mu.Lock()
	r := w.reporter
	w.mu.Unlock()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the last reports were still being retried 10 s after the grace")
	}
	if r.lostReports() != 1 {
		t.Fatalf("lost %d, OnError %v", r.lostReports(), sink.list())
	}
}

// Start's context cancelled, then Stop with a longer deadline (the usual
// signal.NotifyContext and Stop(shutdownCtx)): Stop's deadline decides how
// long the last reports are tried, not the grace of a worker nobody stops
// (review: the report was given up after the grace, with the server back
// well within Stop's deadline).
func TestStopAfterStartContextCancelKeepsItsOwnDeadline(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	down := f.reportsDown()
	id := f.add("long", "1", welcomeIn{}, 600_000)
	w, sink := cancelStartWhileRunning(t, f)
	time.AfterFunc(time.Second, func() { down.Store(false) })
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopCancel()
	if err := stopWithin(t, w, stopCtx); !errors.Is(err, ErrWorkerStopped) || strings.Contains(err.Error(), "not recorded") {
		t.Fatalf("Stop: %v; OnError %v", err, sink.list())
	}
	if e := f.report(t, id)["error"].(map[string]any); e["retryable"] != true {
		t.Fatalf("report %v", e)
	}
}

// After an immediate stop (Start's context ended, or the key refused 401)
// a handler that ignores its cancellation past the stop grace is left
// unreported (OnError is told, naming its job); a Stop without a deadline
// called then returns, saying so, instead of waiting for that handler for
// ever (review: it never returned, waiting for a handler already given up).
// The handler stays blocked on a channel until the test ends.
func TestStopWithoutADeadlineAfterAnImmediateStopReturns(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"Start's context", "a refusal"} {
		t.Run(by, func(t *testing.T) {
			t.Parallel()
			f := newFakeJobs()
			if by == "a refusal" {
				f.leaseFor = 3 * time.Second // a heartbeat after a second
				f.heartbeat = func(string) (int, string) { return http.StatusUnauthorized, CodeUnauthorized }
			}
			id := f.add("stuck", "1", welcomeIn{}, 0)
			c, _ := testClient(t, f)
			w := NewWorker(c)
			started, release := make(chan struct{}), make(chan struct{})
			t.Cleanup(func() { close(release) })
			must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "stuck", Version: "1",
				Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
					close(started)
					<-release // ignores its cancellation
					return welcomeOut{Sent: true}, nil
				}}))
			sink := &errSink{}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			must(t, w.Start(ctx, StartOptions{PollInterval: 10 * time.Millisecond, OnError: sink.add,
				StopGrace: 20 * time.Millisecond}))
			awaitWithin(t, started, "the handler's start")
			if by == "Start's context" {
				cancel()
			}
			guard := time.After(hangGuard)
			for told := false; !told; {
				for _, err := range sink.delivered(w) {
					var n *ReportNotRecordedError
					told = told || errors.As(err, &n) && n.JobID == id && errors.Is(n, ErrWorkerStopped)
				}
				select {
				case <-guard:
					t.Fatalf("hang guard: OnError was told %v", sink.list())
				case <-time.After(10 * time.Millisecond):
				}
			}
			err := stopWithin(t, w, context.Background())
			if !errors.Is(err, ErrWorkerStopped) || !strings.Contains(err.Error(), "1 handler(s) ignored cancellation") {
				t.Fatalf("Stop = %v", err)
			}
			if by == "a refusal" && !IsCode(err, CodeUnauthorized) {
				t.Fatalf("Stop = %v, not the refusal", err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.reports) != 0 {
				t.Fatalf("reported %v", f.reports)
			}
		})
	}
}

// cancelStartWhileRunning starts a worker (stop grace 200 ms) for f's
// "long"@"1" jobs, whose handler runs until its context ends, and cancels
// Start's context once a handler runs.
func cancelStartWhileRunning(t *testing.T, f *fakeJobs) (*Worker, *errSink) {
	t.Helper()
	c, _ := testClient(t, f)
	w := NewWorker(c)
	started := make(chan struct{})
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "long", Version: "1",
		Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
			close(started)
			<-ctx.Done()
			return welcomeOut{}, ctx.Err()
		}}))
	sink := &errSink{}
	ctx, cancel := context.WithCancel(context.Background())
	must(t, w.Start(ctx, StartOptions{PollInterval: 10 * time.Millisecond, OnError: sink.add, StopGrace: 200 * time.Millisecond}))
	<-started
	cancel()
	return w, sink
}

// reportsDown makes f refuse every report with a 503 until the flag it
// returns (set) is cleared.
func (f *fakeJobs) reportsDown() *atomic.Bool {
	down := &atomic.Bool{}
	down.Store(true)
	f.reportError = func(json.RawMessage) (int, string) {
		if down.Load() {
			return 503, "database_unavailable"
		}
		return 0, ""
	}
	return down
}

// Stop may be called from OnError (a worker stopping itself on a refused
// claim or report): OnError runs on goroutines of its own, so Stop does not
// wait for the call it is made from (QA: the poll loop, and the reporter,
// waited in OnError for a Stop that waited for them, and it never returned).
func TestStopFromOnErrorReturns(t *testing.T) {
	t.Parallel()
	for _, refused := range []string{"claim", "report"} {
		t.Run(refused, func(t *testing.T) {
			t.Parallel()
			f := newFakeJobs()
			if refused == "claim" {
				f.claimError = func() (int, string, map[string]any) { return 401, "unauthorized", nil }
			} else {
				f.reportError = func(json.RawMessage) (int, string) { return 400, "invalid_request" }
				f.add("welcome", "1", welcomeIn{CustomerID: "cus_1"}, 60000)
			}
			c, _ := testClient(t, f)
			w := NewWorker(c)
			must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "welcome", Version: "1",
				Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
					return welcomeOut{Sent: true}, nil
				}}))
			stopped := make(chan error, 1)
			var once sync.Once
			onError := func(error) {
				once.Do(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					defer cancel()
					stopped <- w.Stop(ctx)
				})
			}
			must(t, w.Start(context.Background(), StartOptions{PollInterval: 10 * time.Millisecond, OnError: onError}))
			select {
			case err := <-stopped:
				if refused == "claim" && !IsCode(err, CodeUnauthorized) {
					t.Fatalf("Stop = %v", err)
				}
				if refused == "report" && (!errors.Is(err, ErrReportsNotRecorded) ||
					!strings.Contains(err.Error(), "1 report(s) were not recorded")) {
					t.Fatalf("Stop = %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Stop called from OnError has not returned")
			}
		})
	}
}

// A claim refused 401 (the worker's key was revoked) stops the worker
// claiming: Done closes, no claim follows, the running handler still
// finishes and is reported, and Stop says the key was refused (QA: the
// worker polled on for ever, each claim refused, and Stop answered nil).
func TestRevokedKeyStopsClaiming(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.add("welcome", "1", welcomeIn{CustomerID: "cus_1"}, 60000)
	f.claimError = func() (int, string, map[string]any) {
		if f.claims == 0 {
			return 0, "", nil // the first claim leases the job
		}
		return 401, CodeUnauthorized, nil
	}
	c, _ := testClient(t, f)
	w := NewWorker(c)
	release, running := make(chan struct{}), make(chan struct{})
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "welcome", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
			close(running)
			<-release
			return welcomeOut{Sent: true}, nil
		}}))
	var mu sync.Mutex
	var notices []error
	must(t, w.Start(context.Background(), StartOptions{Concurrency: 2, PollInterval: 10 * time.Millisecond,
		OnError: func(err error) { mu.Lock(); notices = append(notices, err); mu.Unlock() }}))
	<-running
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker went on claiming after a 401")
	}
	f.mu.Lock()
	claims := f.claims
	f.mu.Unlock()
	if claims != 2 {
		t.Fatalf("claims = %d, want 2 (one leasing the job, one refused)", claims)
	}
	close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := stopWithin(t, w, ctx)
	if !IsCode(err, CodeUnauthorized) || !strings.Contains(err.Error(), "the server refused its key") ||
		errors.Is(err, ErrReportsNotRecorded) {
		t.Fatalf("Stop = %v", err)
	}
	f.mu.Lock()
	_, reported := f.reports["job_0"]
	claims = f.claims
	f.mu.Unlock()
	if !reported || claims != 2 {
		t.Fatalf("reported = %v, claims = %d", reported, claims)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(notices) != 1 || !IsCode(notices[0], CodeUnauthorized) {
		t.Fatalf("OnError got %v, want the one refused claim", notices)
	}
}

// A long-polling claim leaves 5 s of the HTTP client's timeout for its
// answer (QA: with a client timeout under WaitSeconds every idle claim
// timed out and went to OnError).
func TestClaimWaitFitsTheHTTPClientTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		timeout time.Duration
		want    int
	}{{0, 20}, {60 * time.Second, 20}, {8 * time.Second, 3}, {3 * time.Second, 0}} {
		f := newFakeJobs()
		cl, _ := testClient(t, f)
		cl.hc.Timeout = c.timeout
		w := NewWorker(cl)
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "welcome", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
		must(t, w.Start(context.Background(), StartOptions{WaitSeconds: 20, PollInterval: time.Hour}))
		var got int
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			f.mu.Lock()
			claimed := len(f.waits) > 0
			if claimed {
				got = f.waits[0]
			}
			f.mu.Unlock()
			if claimed || time.Now().After(deadline) {
				break
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		must(t, stopWithin(t, w, ctx))
		cancel()
		if got != c.want {
			t.Errorf("client timeout %v: WaitSeconds %d, want %d", c.timeout, got, c.want)
		}
	}
}

// A report the server recorded but whose answer was cut short is sent
// again for its answer (reports are safe to repeat), not counted lost: Stop
// said reports were not recorded although they were.
func TestWorkerAsksAgainForAnUnreadableReportAnswer(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("send_welcome_email", "1", welcomeIn{CustomerID: "cus_1"}, 30000)
	var cut atomic.Bool
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/report") && cut.CompareAndSwap(false, true) {
			rec := httptest.NewRecorder()
			f.ServeHTTP(rec, r) // recorded
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(rec.Body.Bytes()[:rec.Body.Len()/2])
			return
		}
		f.ServeHTTP(w, r)
	}))
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "send_welcome_email", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{Sent: true}, nil }}))
	sink := &errSink{}
	must(t, w.Start(context.Background(), StartOptions{PollInterval: 20 * time.Millisecond, OnError: sink.add}))
	f.waitReport(t, id)
	if !cut.Load() {
		t.Fatal("the report's answer was not cut")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := stopWithin(t, w, ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for _, err := range sink.list() {
		if strings.Contains(err.Error(), "report job") {
			t.Fatalf("a report was given up: %v", err)
		}
	}
}

// Start waits out a server that is down or failing, as a River or Temporal
// worker does: each failure past the client's retries goes to OnError and
// is tried again, under the same Idempotency-Key, after a backoff that
// doubles from the poll interval (worker QA: Start gave up after
// MaxRetries, and a process that logged the error ran no worker at all).
func TestWorkerStartWaitsOutAnOutage(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.registerError = func(n int) (int, string) {
		if n <= 12 { // three calls of four attempts each (MaxRetries 3)
			return http.StatusServiceUnavailable, ""
		}
		return 0, ""
	}
	var keys []string
	var mu sync.Mutex
	c, _ := testClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/register") {
			mu.Lock()
			keys = append(keys, r.Header.Get(IdempotencyKeyHeader))
			mu.Unlock()
		}
		f.ServeHTTP(w, r)
	}))
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{now: start, end: start.Add(time.Hour), done: make(chan struct{}),
		// The idle wait after the first claim (2 s + 10 %) never ends.
		fires: func(d time.Duration) bool { return d != 2200*time.Millisecond }}
	w.clock, w.jitter = clk, func() float64 { return 1 }
	sink := &errSink{}
	started := make(chan error, 1)
	go func() {
		started <- w.Start(context.Background(), StartOptions{PollInterval: 2 * time.Second, OnError: sink.add})
	}()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("Start = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Start never returned")
	}
	t.Cleanup(func() { _ = stopWithin(t, w, context.Background()) })
	if w.ID() != "wkr_1" {
		t.Fatalf("ID = %q", w.ID())
	}
	clk.mu.Lock()
	waits := append([]time.Duration(nil), clk.waits...)
	clk.mu.Unlock()
	if len(waits) < 3 || !slices.Equal(waits[:3], []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second}) {
		t.Fatalf("waits between registrations %v, want 2s, 4s, 8s", waits)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 13 || slices.ContainsFunc(keys, func(k string) bool { return k != keys[0] || k == "" }) {
		t.Fatalf("Idempotency-Keys %q, want one key on 13 attempts", keys)
	}
	errs := sink.delivered(w)
	var apiErr *Error
	if len(errs) != 3 || !strings.Contains(errs[0].Error(), "register (the worker tries again)") ||
		!errors.As(errs[2], &apiErr) || apiErr.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("OnError got %v, want the three failed registrations", errs)
	}
}

// A Stop while Start waits to register again ends the wait: Start returns
// ErrWorkerStopped, and the worker never claims.
func TestWorkerStopEndsStartsWaitToRegisterAgain(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.registerError = func(int) (int, string) { return http.StatusBadGateway, "" }
	c, _ := testClient(t, f)
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	waiting := make(chan struct{})
	var once sync.Once
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w.clock = &fakeClock{now: start, end: start.Add(time.Hour), done: make(chan struct{}),
		fires: func(time.Duration) bool { once.Do(func() { close(waiting) }); return false }}
	started := make(chan error, 1)
	go func() { started <- w.Start(context.Background(), StartOptions{}) }()
	select {
	case <-waiting:
	case err := <-started:
		t.Fatalf("Start = %v, want it to wait for the server", err)
	}
	if err := stopWithin(t, w, context.Background()); err != nil {
		t.Fatalf("Stop = %v", err)
	}
	if err := awaitWithin(t, started, "Start"); !errors.Is(err, ErrWorkerStopped) {
		t.Fatalf("Start = %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.claims != 0 {
		t.Fatalf("%d claims", f.claims)
	}
}

// Claims that keep failing are asked again for as long as the worker runs,
// after a backoff that doubles from the poll interval up to a minute, never
// shorter than the server's Retry-After (worker QA: a failed claim was
// followed by one poll interval, however long the failures lasted, and a
// 429's Retry-After was heeded only within MaxRetries).
func TestWorkerBacksOffClaimsThatKeepFailing(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	var limited atomic.Bool
	f.claimError = func() (int, string, map[string]any) {
		if limited.Load() {
			return http.StatusTooManyRequests, CodeRateLimited, map[string]any{"retry_after_seconds": 40}
		}
		// Nothing was applied: the claim id is not kept (not a lost answer).
		return http.StatusServiceUnavailable, CodeDatabaseUnavailable, map[string]any{"outcome": "not_applied"}
	}
	c, _ := testClient(t, f)
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{now: start, end: start.Add(time.Hour), done: make(chan struct{})}
	clk.onWait = func() { // under clk.mu
		if len(clk.waits) == 8 {
			limited.Store(true)
		}
	}
	w.clock, w.jitter = clk, func() float64 { return 1 }
	sink := &errSink{}
	must(t, w.Start(context.Background(), StartOptions{PollInterval: time.Second, OnError: sink.add}))
	<-clk.done
	err := stopWithin(t, w, context.Background())
	if err != nil {
		t.Fatalf("Stop = %v", err)
	}
	clk.mu.Lock()
	waits := append([]time.Duration(nil), clk.waits...)
	clk.mu.Unlock()
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		32 * time.Second, time.Minute, time.Minute, time.Minute}
	if len(waits) < 60 || !slices.Equal(waits[:len(want)], want) {
		t.Fatalf("%d waits, from %v; want %v and on until the hour is out", len(waits), waits[:min(len(waits), 12)], want)
	}
	// Half of each wait is drawn: never below half the step.
	w.jitter = func() float64 { return 0 }
	if d := failureWait(time.Second, 3, errors.New("x"), w.jitter); d != 2*time.Second {
		t.Fatalf("failureWait with no jitter drawn = %v, want 2s", d)
	}
	// The server's Retry-After is the least wait, within the same cap.
	for _, c := range []struct {
		secs any
		want time.Duration
	}{{40, 40 * time.Second}, {600, time.Minute}} {
		err := &Error{StatusCode: 429, Code: CodeRateLimited, Detail: map[string]any{"retry_after_seconds": c.secs}}
		if d := failureWait(time.Second, 1, err, w.jitter); d != c.want {
			t.Fatalf("failureWait after Retry-After %v = %v, want %v", c.secs, d, c.want)
		}
	}
	if n := len(sink.delivered(w)); n < 60 {
		t.Fatalf("OnError heard of %d failed claims", n)
	}
}

// A claim whose answer may have been lost is asked again after the client's
// backoff, but not before the server's Retry-After.
func TestWorkerAsksAgainForALostClaimAfterItsRetryAfter(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.claimError = func() (int, string, map[string]any) {
		if f.claims == 0 { // may have leased jobs: the claim id is kept
			return http.StatusInternalServerError, CodeInternal, nil
		}
		return http.StatusTooManyRequests, CodeRateLimited, map[string]any{"retry_after_seconds": 30}
	}
	c, _ := testClient(t, f)
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &fakeClock{now: start, end: start.Add(34 * time.Second), done: make(chan struct{})}
	w.clock = clk
	w.jitter = func() float64 { return 0.5 }
	must(t, w.Start(context.Background(), StartOptions{PollInterval: time.Minute, OnError: func(error) {}}))
	<-clk.done
	_ = stopWithin(t, w, context.Background())
	clk.mu.Lock()
	defer clk.mu.Unlock()
	// The Retry-After's 30 s and the spread drawn: half of a fifth more.
	if len(clk.waits) != 1 || clk.waits[0] != 33*time.Second {
		t.Fatalf("waits %v, want the Retry-After's 30s and 3s of spread", clk.waits)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.claimIDs) < 5 || f.claimIDs[4] != f.claimIDs[0] {
		t.Fatalf("claim ids %q: the lost claim was not asked again under its id", f.claimIDs)
	}
}

// A claim refused 403 stops the worker as a 401 does: the key may not claim
// (or not these tools), which asking again never mends; so does a 403 when
// the worker registers again after a claim answered 404.
func TestForbiddenWorkerStopsClaiming(t *testing.T) {
	t.Parallel()
	for _, reregister := range []bool{false, true} {
		f := newFakeJobs()
		f.claimError = func() (int, string, map[string]any) {
			if reregister {
				return http.StatusNotFound, CodeNotFound, nil
			}
			return http.StatusForbidden, CodeForbidden, map[string]any{"required": []any{"jobs:work"}}
		}
		f.registerError = func(n int) (int, string) {
			if n > 1 {
				return http.StatusForbidden, CodeForbidden
			}
			return 0, ""
		}
		c, _ := testClient(t, f)
		w := NewWorker(c)
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
		sink := &errSink{}
		must(t, w.Start(context.Background(), StartOptions{PollInterval: time.Millisecond, OnError: sink.add}))
		select {
		case <-w.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("reregister %v: the worker went on claiming after a 403", reregister)
		}
		err := stopWithin(t, w, context.Background())
		if !IsCode(err, CodeForbidden) || !strings.Contains(err.Error(), "the worker stopped claiming") {
			t.Fatalf("reregister %v: Stop = %v", reregister, err)
		}
		f.mu.Lock()
		claims := f.claims
		f.mu.Unlock()
		if claims != 1 {
			t.Fatalf("reregister %v: %d claims, want 1", reregister, claims)
		}
		if errs := sink.delivered(w); !IsCode(errs[len(errs)-1], CodeForbidden) {
			t.Fatalf("reregister %v: OnError got %v", reregister, errs)
		}
	}
}

// A heartbeat answered 429 is tried again after the server's Retry-After
// when that comes before the next heartbeat would, and at the usual third
// of the lease left when it would not: the rate limit is honoured, but
// never so long that the lease lapses. The Python and TypeScript workers
// pace it the same (sdk QA: Go waited out the whole Retry-After inside the
// call, they retried at a third of the lease whatever it said).
func TestWorkerHeartbeatHonoursRetryAfterWithinTheLease(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseMs = 70000 // with the 60 s timeout: a heartbeat every 20 s
	id := f.add("long", "1", welcomeIn{}, 60000)
	beats := 0
	f.heartbeatWait = 5
	f.heartbeat = func(string) (int, string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		beats++
		switch beats {
		case 1:
			f.heartbeatWait = 50 // for the second
			return http.StatusTooManyRequests, CodeRateLimited
		case 2:
			return http.StatusTooManyRequests, CodeRateLimited
		}
		return 0, ""
	}
	waits := heartbeatWaits(t, f, id, func(beats, _ int) bool { return beats >= 4 })
	// The first Retry-After's 5 s and half of its fifth drawn as spread.
	want := []time.Duration{20 * time.Second, 5500 * time.Millisecond, 20 * time.Second, 20 * time.Second}
	if len(waits) < len(want) || !slices.Equal(waits[:len(want)], want) {
		t.Fatalf("heartbeat waits %v, want %v first", waits, want)
	}
}

// heartbeatWaits runs f's job id (long@1) on a worker whose clock fires each
// wait at once and whose jitter draws half, its handler returning once
// enough(heartbeats served, waits so far) holds, and returns the heartbeats'
// waits.
func heartbeatWaits(t *testing.T, f *fakeJobs, id string, enough func(beats, waits int) bool) []time.Duration {
	t.Helper()
	c, _ := testClient(t, f)
	w := NewWorker(c)
	w.jitter = func() float64 { return 0.5 } // a backoff of d waits 3/4 d
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	var waits []time.Duration // the heartbeats' waits
	w.clock = &fakeClock{now: start, end: start.Add(1000 * time.Hour), done: make(chan struct{}),
		fires: func(d time.Duration) bool {
			if d >= time.Hour { // the idle poll: never
				return false
			}
			if d != claimCooldown {
				mu.Lock()
				waits = append(waits, d)
				mu.Unlock()
			}
			return true
		}}
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "long", Version: "1",
		Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
			for {
				f.mu.Lock()
				beats := f.heartbeats
				f.mu.Unlock()
				mu.Lock()
				n := len(waits)
				mu.Unlock()
				if enough(beats, n) {
					return welcomeOut{Sent: true}, nil
				}
				time.Sleep(time.Millisecond)
			}
		}}))
	must(t, w.Start(context.Background(), StartOptions{PollInterval: 2 * time.Hour, OnError: func(error) {}}))
	f.waitReport(t, id)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	must(t, stopWithin(t, w, ctx))
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(waits)
}

// A heartbeat that fails (a 5xx, a lost answer) is tried again after a
// backoff from a second, doubled at each failure in a row (1, 2, 4 s), half
// of it drawn by the worker's jitter as after failed claims (here half of
// that half: 0.75, 1.5, 3 s), and after one that worked at the usual third
// of the lease left, each try one call, not the client's own retries: the
// Python and TypeScript workers pace theirs alike (sdk QA: Go retried inside
// its client, 0.5-8 s apart, then waited a third of the lease left, while
// they waited that at once; every worker tried again at the same marks).
func TestWorkerHeartbeatBacksOffWithinTheLease(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.leaseMs = 70000 // with the 60 s timeout: a heartbeat every 20 s
	id := f.add("long", "1", welcomeIn{}, 60000)
	f.heartbeat = func(string) (int, string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch f.heartbeats { // counting this one
		case 1:
			return http.StatusInternalServerError, CodeInternal
		case 2:
			return -1, ""
		case 3:
			return http.StatusServiceUnavailable, "service_unavailable"
		case 5:
			return http.StatusBadGateway, "bad_gateway"
		}
		return 0, ""
	}
	waits := heartbeatWaits(t, f, id, func(_, waits int) bool { return waits >= 6 })
	want := []time.Duration{20 * time.Second, 750 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second, 20 * time.Second, 750 * time.Millisecond}
	if len(waits) < len(want) || !slices.Equal(waits[:len(want)], want) {
		t.Fatalf("heartbeat waits %v, want %v first", waits, want)
	}
}

// The backoff after failed heartbeats is drawn between half and all of 1,
// 2, 4, 8 s... by the jitter, as failed claims' (sdk QA: every worker tried
// again at the same marks after an outage), and never waits past a third
// of the lease left (every), so two more tries fit before it lapses; nor
// does a Retry-After, which it honours within that.
func TestHeartbeatWait(t *testing.T) {
	t.Parallel()
	down := &Error{StatusCode: http.StatusServiceUnavailable, Code: "service_unavailable"}
	limited := &Error{StatusCode: http.StatusTooManyRequests, Code: CodeRateLimited,
		Detail: map[string]any{"retry_after_seconds": 30}}
	unavailable := &Error{StatusCode: http.StatusServiceUnavailable, // a proxy's Retry-After
		Detail: map[string]any{"retry_after_seconds": 30}}
	lost := &netError{err: io.ErrUnexpectedEOF}
	cases := []struct {
		every    time.Duration
		failed   error
		failures int
		drawn    float64
		want     time.Duration
	}{
		{20 * time.Second, nil, 0, 0, 20 * time.Second},
		{20 * time.Second, down, 1, 1, time.Second},
		{20 * time.Second, down, 1, 0, 500 * time.Millisecond},
		{20 * time.Second, lost, 2, 1, 2 * time.Second},
		{20 * time.Second, lost, 2, 0.5, 1500 * time.Millisecond},
		{20 * time.Second, down, 4, 0, 4 * time.Second},
		{10 * time.Second, down, 5, 1, 10 * time.Second}, // 16 s would outwait every
		{3 * time.Second, down, 3, 1, 3 * time.Second},   // 4 s would outwait a third of 9 s left
		{time.Minute, down, 60, 1, time.Minute},          // no overflow
		{20 * time.Second, limited, 1, 0, 20 * time.Second},
		{time.Minute, limited, 1, 0, 30 * time.Second},
		{time.Minute, limited, 1, 0.5, 33 * time.Second}, // and up to a fifth more, drawn
		{20 * time.Second, limited, 1, 1, 20 * time.Second},
		{time.Minute, unavailable, 1, 0, 30 * time.Second},
		{time.Minute, unavailable, 1, 0.5, 33 * time.Second}, // a 503's spread alike
	}
	for _, c := range cases {
		if got := heartbeatWait(c.every, c.failed, c.failures, func() float64 { return c.drawn }); got != c.want {
			t.Errorf("heartbeatWait(%v, %v, %d) drawing %v = %v, want %v", c.every, c.failed, c.failures, c.drawn, got, c.want)
		}
	}
}

// One heartbeat is cut off at a third of the lease left, at least a second:
// a hung call leaves two thirds of the lease for the tries after it, as in
// the Python and TypeScript workers (sdk QA: Go let it run to the lease's
// end, they to 10 s, past the end of a short lease).
func TestHeartbeatCutoff(t *testing.T) {
	t.Parallel()
	cases := map[time.Duration]time.Duration{
		60 * time.Second:       20 * time.Second,
		9 * time.Second:        3 * time.Second,
		2 * time.Second:        time.Second,
		100 * time.Millisecond: time.Second,
	}
	for left, want := range cases {
		if got := heartbeatCutoff(left); got != want {
			t.Errorf("heartbeatCutoff(%v) = %v, want %v", left, got, want)
		}
	}
}

// A revoked key stops the worker whichever call meets the 401 first, as a
// claim's does: a heartbeat's or a report's 401 too (sdk QA: the worker
// heartbeated on until the lease lapsed, and claimed on until a claim was
// refused). It stops as at a Stop whose deadline has passed: no more claims,
// and the handlers still running are cancelled at once (ErrWorkerStopped),
// since nothing they do can be recorded any more. The Python and
// TypeScript workers stop the same way.
func TestRevokedKeyStopsTheWorkerWhicheverCallMeetsIt(t *testing.T) {
	t.Parallel()
	for _, call := range []string{"heartbeat", "report"} {
		t.Run(call, func(t *testing.T) {
			t.Parallel()
			f := newFakeJobs()
			f.refuse = map[string]string{}
			if call == "heartbeat" {
				f.leaseFor = 3 * time.Second // a heartbeat after a second
				f.heartbeat = func(string) (int, string) { return http.StatusUnauthorized, CodeUnauthorized }
			} else {
				f.refuse[f.add("quick", "1", welcomeIn{}, 60000)] = CodeUnauthorized
			}
			f.add("long", "1", welcomeIn{}, 60000)
			c, _ := testClient(t, f)
			// Claims are counted as the worker sends them, not as the
			// fake serves them: one the stop cut short may reach the fake
			// after Done on a loaded machine (CI: "87, then 88").
			sent := &claimsSent{next: c.hc.Transport}
			c.hc = &http.Client{Transport: sent}
			w := NewWorker(c)
			causes := make(chan error, 1)
			must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1",
				Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) { return welcomeOut{}, nil }}))
			must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "long", Version: "1",
				Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
					<-ctx.Done()
					causes <- context.Cause(ctx)
					return welcomeOut{}, ctx.Err()
				}}))
			sink := &errSink{}
			must(t, w.Start(context.Background(), StartOptions{Concurrency: 2, PollInterval: 10 * time.Millisecond,
				OnError: sink.add}))
			select {
			case <-w.Done():
			case <-time.After(20 * time.Second):
				t.Fatalf("the worker went on after a %s refused 401", call)
			}
			select {
			case cause := <-causes:
				if !errors.Is(cause, ErrWorkerStopped) {
					t.Fatalf("the running handler's cause = %v, want ErrWorkerStopped", cause)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the running handler was not cancelled")
			}
			claims := sent.n.Load()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := stopWithin(t, w, ctx)
			if !IsCode(err, CodeUnauthorized) || !strings.Contains(err.Error(), "the server refused its key") {
				t.Fatalf("Stop = %v", err)
			}
			if now := sent.n.Load(); now != claims {
				t.Fatalf("claims went on after the stop: %d, then %d", claims, now)
			}
			if errs := sink.delivered(w); len(errs) == 0 || !IsCode(errs[0], CodeUnauthorized) ||
				!strings.Contains(errs[0].Error(), call) {
				t.Fatalf("OnError got %v, want the %s's 401 first", errs, call)
			}
		})
	}
}

// claimsSent counts the claims a client sends, as it sends them.
type claimsSent struct {
	n    atomic.Int64
	next http.RoundTripper
}

func (c *claimsSent) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/claim") {
		c.n.Add(1)
	}
	return c.next.RoundTrip(r)
}

// A claim refused for a reason no retry mends stops the worker with that
// error rather than asking for ever (sdk QA: a 400, a 409 or a 422 was asked
// again at every backoff for as long as the worker ran): the claim's body is
// the worker's own, so every claim would be refused alike. A claim answered
// 404 not_found (the server forgot the worker) registers again, once: a
// claim under the new id answered 404 again, or a registration refused,
// stops it too. The Python and TypeScript workers decide the same.
// stoppedOnItsOwn starts a worker of one tool against f, telling sink its
// failures, and answers it and Stop's error once it has stopped on its own.
func stoppedOnItsOwn(t *testing.T, f *fakeJobs, sink *errSink) (*Worker, error) {
	t.Helper()
	cl, _ := testClient(t, f)
	w := NewWorker(cl)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1", Handler: noWork}))
	must(t, w.Start(context.Background(), StartOptions{PollInterval: time.Millisecond, OnError: sink.add}))
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker went on claiming")
	}
	return w, stopWithin(t, w, context.Background())
}

func TestWorkerStopsOnAClaimNoRetryMends(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name                  string
		status                int
		code                  string
		registerAgain         int // the status of the registration made again (0: it succeeds)
		claims, registrations int
	}{
		{"400", http.StatusBadRequest, CodeInvalidRequest, 0, 1, 1},
		{"409", http.StatusConflict, CodeInvalidState, 0, 1, 1},
		{"422", http.StatusUnprocessableEntity, CodeInvalidRequest, 0, 1, 1},
		{"404 twice", http.StatusNotFound, CodeNotFound, 0, 2, 2},
		{"404, registration refused", http.StatusNotFound, CodeNotFound, http.StatusBadRequest, 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeJobs()
			f.claimError = func() (int, string, map[string]any) { return c.status, c.code, nil }
			f.registerError = func(n int) (int, string) {
				if n > 1 && c.registerAgain != 0 {
					return c.registerAgain, CodeInvalidRequest
				}
				return 0, ""
			}
			_, err := stoppedOnItsOwn(t, f, &errSink{})
			want := c.status
			if c.registerAgain != 0 {
				want = c.registerAgain
			}
			var apiErr *Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != want || !strings.Contains(err.Error(), "the worker stopped claiming") {
				t.Fatalf("Stop = %v, want the %d", err, want)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.claims != c.claims || f.registrations != c.registrations {
				t.Fatalf("%d claims and %d registrations, want %d and %d", f.claims, f.registrations, c.claims, c.registrations)
			}
		})
	}
}

// An answer that is not Ratchet's own (no error envelope: a proxy, a load
// balancer or a platform answering during a deploy or a misroute) never
// stops the worker, whatever its status: a bare 404 (it does not register
// again either), 408, 400 or 401 to a claim, or a registration made again
// answered a bare 400, are failures that may pass, and the worker claims
// again after backoff; Ratchet's own refusal still stops it (review: any
// uncoded 4xx stopped the worker for good).
func TestWorkerClaimsOnAfterAnAnswerThatIsNotRatchets(t *testing.T) {
	t.Parallel()
	answers := []struct {
		status int
		code   string
	}{
		{http.StatusNotFound, ""},
		{http.StatusRequestTimeout, ""},
		{http.StatusBadRequest, ""},
		{http.StatusUnauthorized, ""},
		{http.StatusNotFound, CodeNotFound}, // registers again: answered a bare 400
		{http.StatusConflict, CodeInvalidState},
	}
	f := newFakeJobs()
	f.claimError = func() (int, string, map[string]any) { // called under f.mu
		a := answers[min(f.claims, len(answers)-1)]
		return a.status, a.code, nil
	}
	f.registerError = func(n int) (int, string) {
		if n == 2 {
			return http.StatusBadRequest, ""
		}
		return 0, ""
	}
	sink := &errSink{}
	w, err := stoppedOnItsOwn(t, f, sink)
	if !IsCode(err, CodeInvalidState) || !strings.Contains(err.Error(), "the worker stopped claiming") {
		t.Fatalf("Stop = %v, want the 409 invalid_state", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.claims != len(answers) || f.registrations != 2 {
		t.Fatalf("%d claims and %d registrations, want %d and 2", f.claims, f.registrations, len(answers))
	}
	var told []int
	for _, e := range sink.delivered(w) {
		var apiErr *Error
		if errors.As(e, &apiErr) {
			told = append(told, apiErr.StatusCode)
		}
	}
	if want := []int{404, 408, 400, 401, 404, 400, 409}; !slices.Equal(told, want) {
		t.Fatalf("OnError told %v, want %v", told, want)
	}
}

// A 401 without Ratchet's error envelope, to a heartbeat or a report, is not
// a revoked key; Ratchet's own is.
func TestKeyRefusedOnlyByRatchetsOwn401(t *testing.T) {
	if keyRefused(&Error{StatusCode: http.StatusUnauthorized, Message: "Unauthorized"}) {
		t.Fatal("a proxy's bare 401 read as a revoked key")
	}
	if !keyRefused(&Error{StatusCode: http.StatusUnauthorized, Code: CodeUnauthorized}) {
		t.Fatal("Ratchet's 401 unauthorized not read as a revoked key")
	}
}

// Start waits out answers to its registration that are not Ratchet's own (a
// proxy's bare 400, 401 or 404 during a deploy), each told to OnError,
// as a running worker does (review: Start failed at once on them).
func TestWorkerStartWaitsOutAnswersThatAreNotRatchets(t *testing.T) {
	t.Parallel()
	bare := []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusNotFound}
	f := newFakeJobs()
	f.registerError = func(n int) (int, string) {
		if n <= len(bare) {
			return bare[n-1], ""
		}
		return 0, ""
	}
	cl, _ := testClient(t, f)
	w := NewWorker(cl)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1", Handler: noWork}))
	sink := &errSink{}
	must(t, w.Start(context.Background(), StartOptions{PollInterval: time.Millisecond, OnError: sink.add}))
	t.Cleanup(func() { _ = stopWithin(t, w, context.Background()) })
	var told []int
	for _, e := range sink.delivered(w) {
		var apiErr *Error
		if errors.As(e, &apiErr) && strings.Contains(e.Error(), "register (the worker tries again)") {
			told = append(told, apiErr.StatusCode)
		}
	}
	if !slices.Equal(told, bare) {
		t.Fatalf("OnError told %v, want the registrations answered %v", told, bare)
	}
}

// gatedClock runs every timer on the real clock except those of duration
// gated, which fire only once open is closed: a test decides when the stop
// grace ends.
type gatedClock struct {
	gated time.Duration
	open  chan struct{}
	asked chan struct{} // when set, sent to as each gated timer is made
}

func (c *gatedClock) Now() time.Time { return time.Now() }

func (c *gatedClock) Timer(d time.Duration) (<-chan time.Time, func()) {
	if d != c.gated {
		return realClock{}.Timer(d)
	}
	ch := make(chan time.Time, 1)
	go func() { <-c.open; ch <- time.Now() }()
	if c.asked != nil {
		c.asked <- struct{}{}
	}
	return ch, func() {}
}

// A handler that ignores a cancellation other than the stop's, a lost lease
// (told to OnError as a *LeaseLostError) or the server's cancel request (the
// job is cancelled: it runs no more), whether it came before Stop's deadline
// or during the stop grace, is waited for the stop grace at most, like one
// the stop cancelled, and counted apart in Stop's error as still running;
// OnError is not told its job was left unreported to run again (a newer
// attempt holds it, or the job is cancelled). sdk QA: Go waited for such a
// handler with no bound in its own goroutine (Stop then waited out a second
// grace for its report and closed the reporter with nothing left of it),
// counted it as left unreported by the stop, and told a lease lost during
// the grace "the job runs again".
func TestWorkerStopLeavesAHandlerIgnoringALostLeaseOrACancelRunning(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, cancelledBy string }{
		{"lease lost before the stop", "lease_lost"}, {"cancel requested before the stop", "cancelRequested"},
		{"lease lost during the grace", "lease_lost"}, {"lease lost, then Start's context ends", "lease_lost"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			duringGrace := strings.HasSuffix(c.name, "during the grace")
			j := newSettledJob(t, c.cancelledBy, !duringGrace)
			id, w, sink, started, causes := j.id, j.w, j.sink, j.started, j.causes
			clk := &gatedClock{gated: time.Hour, open: make(chan struct{})}
			w.clock = clk
			startCtx, cancelStart := context.WithCancel(context.Background())
			defer cancelStart()
			must(t, w.Start(startCtx, StartOptions{PollInterval: 20 * time.Millisecond, OnError: sink.add,
				StopGrace: time.Hour}))
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // the deadline has passed
			stopped := make(chan error, 1)
			awaitWithin(t, started, "the handler's start")
			if duringGrace {
				go func() { stopped <- w.Stop(ctx) }()
				if cause := awaitWithin(t, causes, "the handler's cancellation"); !errors.Is(cause, ErrWorkerStopped) {
					t.Fatalf("cause %v", cause)
				}
				j.loseLease()
			} else {
				want := ErrLeaseLost
				if c.cancelledBy == "cancelRequested" {
					want = ErrCancelRequested
				}
				if cause := awaitWithin(t, causes, "the handler's cancellation"); !errors.Is(cause, want) {
					t.Fatalf("cause %v", cause)
				}
			}
			if c.cancelledBy == "lease_lost" {
				guard := time.After(hangGuard)
				for lost := false; !lost; {
					for _, err := range sink.list() {
						var l *LeaseLostError
						lost = lost || errors.As(err, &l) && l.JobID == id
					}
					select {
					case <-guard:
						t.Fatalf("hang guard: OnError was told %v", sink.list())
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
			if strings.HasSuffix(c.name, "Start's context ends") {
				// Nobody calls Stop: once the grace has passed the reports
				// are closed (they never were: the handler was waited for).
				cancelStart()
				close(clk.open)
				w.mu.Lock()
				r := w.reporter
				w.mu.Unlock()
				awaitWithin(t, r.done, "the reporter's close")
			} else {
				if !duringGrace {
					go func() { stopped <- w.Stop(ctx) }()
				}
				close(clk.open) // the stop grace ends
				j.assertLeftRunning(t, awaitWithin(t, stopped, "Stop"))
			}
			j.assertNotToldLeftUnreported(t)
		})
	}
}

// settledJob is a worker (not started) whose one job's handler ignores its
// cancellation, a lost lease's or the server's cancel request's, until the
// test ends: the stop tests' setup.
type settledJob struct {
	f       *fakeJobs
	id      string
	w       *Worker
	sink    *errSink      // OnError, for Start
	started chan struct{} // closed once the handler runs
	causes  chan error    // its context's cause once cancelled
	refuse  chan struct{} // closed: the heartbeats answer lease_lost
}

// newSettledJob sets one up: the server asks for the job's cancellation
// (cancelledBy "cancelRequested"), or answers its heartbeats lease_lost at
// once (lostAtOnce) or from loseLease on.
func newSettledJob(t *testing.T, cancelledBy string, lostAtOnce bool) *settledJob {
	t.Helper()
	j := &settledJob{f: newFakeJobs(), sink: &errSink{}, started: make(chan struct{}), causes: make(chan error, 1),
		refuse: make(chan struct{})}
	j.f.leaseFor = 3 * time.Second // a heartbeat a second
	j.id = j.f.add("stuck", "1", welcomeIn{}, 0)
	j.f.heartbeat = func(string) (int, string) {
		select {
		case <-j.refuse:
			return 409, CodeLeaseLost
		default:
			return 0, ""
		}
	}
	if cancelledBy == "cancelRequested" {
		j.f.cancel[j.id] = true
	} else if lostAtOnce {
		j.loseLease()
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	cw, _ := testClient(t, j.f)
	j.w = NewWorker(cw)
	must(t, RegisterTool(j.w, Tool[welcomeIn, welcomeOut]{Name: "stuck", Version: "1",
		Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
			close(j.started)
			<-ctx.Done()
			j.causes <- context.Cause(ctx)
			<-release // ignores its cancellation
			return welcomeOut{Sent: true}, nil
		}}))
	return j
}

// loseLease has the job's heartbeats answered lease_lost from now on.
func (j *settledJob) loseLease() { close(j.refuse) }

// assertLeftRunning checks Stop's error: it counts the handler as still
// running after its lease was lost or its job cancelled, not as left
// unreported, and no report as lost.
func (j *settledJob) assertLeftRunning(t *testing.T, err error) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), "1 handler(s) still running after their lease was lost or their job was cancelled") ||
		strings.Contains(err.Error(), "left unreported") || errors.Is(err, ErrReportsNotRecorded) {
		t.Fatalf("Stop = %v", err)
	}
}

// assertNotToldLeftUnreported checks that OnError was told of no job left
// unreported to run again.
func (j *settledJob) assertNotToldLeftUnreported(t *testing.T) {
	t.Helper()
	for _, err := range j.sink.delivered(j.w) {
		var n *ReportNotRecordedError
		if errors.As(err, &n) {
			t.Fatalf("OnError was told %v", err)
		}
	}
}

// A Stop with no deadline of its own (a graceful stop, waiting for the
// handlers to finish) gives a handler that ignores a lost lease or the
// server's cancel request, cancelled before the Stop or while it waits, the
// stop grace at most, as the TypeScript worker does, then returns, counting
// it as still running (nothing to report: a newer attempt holds its job, or
// the job runs no more) and telling OnError nothing of it. sdk QA: such a
// Stop waited for the handler with no bound. The handler stays blocked on
// a channel until the test ends: a goroutine cannot be killed.
func TestWorkerStopWithoutADeadlineGivesUpAHandlerIgnoringALostLeaseOrACancel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, cancelledBy string }{
		{"lease lost before the stop", "lease_lost"}, {"cancel requested before the stop", "cancelRequested"},
		{"lease lost while the stop waits", "lease_lost"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			duringStop := strings.HasSuffix(c.name, "while the stop waits")
			j := newSettledJob(t, c.cancelledBy, !duringStop)
			w := j.w
			must(t, w.Start(context.Background(), StartOptions{PollInterval: 20 * time.Millisecond, OnError: j.sink.add,
				StopGrace: 20 * time.Millisecond}))
			awaitWithin(t, j.started, "the handler's start")
			stopped := make(chan error, 1)
			if duringStop {
				go func() { stopped <- w.Stop(context.Background()) }()
				for !closed(w.stopping) {
					runtime.Gosched()
				}
				j.loseLease()
			}
			want := ErrLeaseLost
			if c.cancelledBy == "cancelRequested" {
				want = ErrCancelRequested
			}
			if cause := awaitWithin(t, j.causes, "the handler's cancellation"); !errors.Is(cause, want) {
				t.Fatalf("cause %v", cause)
			}
			if !duringStop {
				go func() { stopped <- w.Stop(context.Background()) }()
			}
			err := awaitWithin(t, stopped, "Stop")
			j.assertLeftRunning(t, err)
			if !errors.Is(err, ErrWorkerStopped) {
				t.Fatalf("Stop = %v, not matching ErrWorkerStopped", err)
			}
			j.assertNotToldLeftUnreported(t)
			j.f.mu.Lock()
			defer j.f.mu.Unlock()
			if len(j.f.reports) != 0 {
				t.Fatalf("reported %v", j.f.reports)
			}
		})
	}
}

// A Stop with a deadline waits for a handler that ignores a lost lease or
// the server's cancel request, cancelled before the Stop, as for any other
// handler: until the deadline, and only then the stop grace, as the
// TypeScript and Python workers give it (their grace starts at the stop's
// deadline). sdk QA: Go began that grace at Stop's call, so that such a
// handler was given up well before the deadline a handler Stop cancels
// gets. Every timer of the grace's length (the handler's own and Stop's
// wait for the handlers) must be asked for once the deadline has passed;
// the gated clock then decides when the grace ends.
func TestWorkerStopWithADeadlineGivesAHandlerIgnoringALostLeaseOrACancelTheDeadlineThenTheGrace(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, cancelledBy string }{
		{"lease lost before the stop", "lease_lost"}, {"cancel requested before the stop", "cancelRequested"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			j := newSettledJob(t, c.cancelledBy, true)
			w := j.w
			clk := &gatedClock{gated: time.Hour, open: make(chan struct{}), asked: make(chan struct{}, 8)}
			var stopCtx atomic.Pointer[context.Context] // Stop's, once called
			var early atomic.Int32                      // grace timers asked for before its deadline
			w.clock = &deadlineClock{gatedClock: clk, before: func() {
				if ctx := stopCtx.Load(); ctx == nil || (*ctx).Err() == nil {
					early.Add(1)
				}
			}}
			must(t, w.Start(context.Background(), StartOptions{PollInterval: 20 * time.Millisecond, OnError: j.sink.add,
				StopGrace: time.Hour}))
			awaitWithin(t, j.started, "the handler's start")
			want := ErrLeaseLost
			if c.cancelledBy == "cancelRequested" {
				want = ErrCancelRequested
			}
			if cause := awaitWithin(t, j.causes, "the handler's cancellation"); !errors.Is(cause, want) {
				t.Fatalf("cause %v", cause)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second) // Stop's deadline
			defer cancel()
			stopCtx.Store(&ctx)
			stopped := make(chan error, 1)
			go func() { stopped <- w.Stop(ctx) }()
			awaitWithin(t, clk.asked, "a grace")
			awaitWithin(t, clk.asked, "the other grace")
			if n := early.Load(); n != 0 {
				t.Fatalf("%d stop grace(s) began before Stop's deadline", n)
			}
			close(clk.open) // the stop grace ends
			j.assertLeftRunning(t, awaitWithin(t, stopped, "Stop"))
			j.assertNotToldLeftUnreported(t)
		})
	}
}

// deadlineClock is a gatedClock that calls before as each gated timer is
// asked for.
type deadlineClock struct {
	*gatedClock
	before func()
}

func (c *deadlineClock) Timer(d time.Duration) (<-chan time.Time, func()) {
	if d == c.gated {
		c.before()
	}
	return c.gatedClock.Timer(d)
}

// A heartbeat answered 403, 404 or 409 without Ratchet's error envelope (a
// proxy's or a load balancer's bare answer during a deploy or a misroute)
// says nothing of the job's lease: it is a heartbeat that failed, tried
// again, and the handler runs on, as a claim's or a registration's bare 4xx
// is waited out (review: it cancelled the handler as lease lost and dropped
// its failure, so a proxy's blip cut every running side effect short and
// left it to run again once its lease lapsed).
func TestWorkerHeartbeatBareRefusalIsAFailureThatMayPass(t *testing.T) {
	t.Parallel()
	for _, status := range []int{403, 404, 409} {
		t.Run(fmt.Sprint(status), func(t *testing.T) { bareHeartbeatRefusal(t, status) })
	}
}

func bareHeartbeatRefusal(t *testing.T, status int) {
	t.Parallel()
	f := newFakeJobs()
	// Heartbeats 4 s apart, the two failed ones at most a second apart:
	// the lease (12 s) leaves a loaded machine room before it lapses.
	f.leaseFor, f.leaseMs = time.Hour, 12_000
	var bare atomic.Int32
	f.heartbeat = func(string) (int, string) {
		if bare.Add(1) <= 2 {
			return status, "" // no error code: not Ratchet's answer
		}
		return 0, ""
	}
	id := f.add("long", "1", welcomeIn{}, 60000)
	w, sink := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "long", Version: "1",
			Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
				for bare.Load() < 3 && ctx.Err() == nil { // until a heartbeat got through
					time.Sleep(10 * time.Millisecond)
				}
				if ctx.Err() != nil {
					return welcomeOut{}, context.Cause(ctx)
				}
				return welcomeOut{Key: "done"}, nil
			}}))
	}, StartOptions{})
	if r := f.waitReport(t, id); r["status"] != "SUCCEEDED" {
		t.Fatalf("%d: report %v", status, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := stopWithin(t, w, ctx); err != nil {
		t.Fatalf("%d: %v", status, err)
	}
	cancel()
	for _, err := range sink.list() {
		if errors.Is(err, ErrLeaseLost) {
			t.Fatalf("%d: OnError %v", status, err)
		}
	}
}

// Why a handler was cancelled is read as it returns: a stop landing after
// it returned an ordinary error (here Start's context ending before the
// worker judged the result) leaves that error as reported, as in the
// TypeScript and Python workers (sdk QA: Go read the cause once it had
// awaited the handler, and reported "worker stopped before the handler
// finished" for an error the handler returned on its own).
func TestWorkerJudgesAResultByWhyItWasCancelledAsItReturned(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	id := f.add("quick", "1", welcomeIn{}, 60000)
	c, _ := testClient(t, f)
	w := NewWorker(c)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "quick", Version: "1",
		Handler: func(ctx context.Context, _ welcomeIn, _ JobContext) (welcomeOut, error) {
			return welcomeOut{}, errors.New("card declined")
		}}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.afterReturn = func(hctx context.Context) {
		cancel() // Start's context ends: the handlers' contexts end with ErrWorkerStopped
		<-hctx.Done()
	}
	must(t, w.Start(ctx, StartOptions{PollInterval: 10 * time.Millisecond, OnError: func(error) {}}))
	e := f.waitReport(t, id)["error"].(map[string]any)
	if e["message"] != "card declined" || e["retryable"] != true {
		t.Fatalf("report %v", e)
	}
	if err := stopWithin(t, w, context.Background()); err != nil {
		t.Fatalf("Stop: %v", err) // no handler was cut off
	}
}

// A PollInterval near time.Duration's limit is waited as a year: jittered
// up, it overflowed to a negative wait, and the worker claimed again at
// once, for ever.
func TestAHugePollIntervalIsWaitedNotOverflowed(t *testing.T) {
	t.Parallel()
	var waits []time.Duration
	clk := &fakeClock{now: time.Now(), end: time.Now().Add(time.Hour), done: make(chan struct{}),
		fires: func(d time.Duration) bool { waits = append(waits, d); return false }}
	w := &Worker{clock: clk, jitter: func() float64 { return 1 }, opts: StartOptions{PollInterval: time.Duration(1<<63 - 1)}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the wait begins, and ends at once
	w.idle(ctx, 0)
	if len(waits) != 1 || waits[0] < maxPollInterval {
		t.Fatalf("waits %v, want one of at least a year", waits)
	}
}

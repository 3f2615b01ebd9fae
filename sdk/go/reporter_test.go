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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// queueReports queues n successful reports of fresh jobs (leases 10 minutes
// out) and returns their ids.
func queueReports(r *reporter, n int, expires time.Time) []string {
	var ids []string
	for i := range n {
		id := fmt.Sprintf("job_r%d", i)
		ids = append(ids, id)
		r.enqueue(newQueuedReport(ClaimedJob{JobID: id, Attempt: 1, LeaseToken: "tok_" + id},
			JobReport{Status: ReportSucceeded, Output: []byte(`{"n":1}`)}, expires))
	}
	return ids
}

// A batch that never fills is still sent: here its lease forces it out long
// before the (hour-long) linger would.
func TestReportSentBeforeLeaseWithoutFilling(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	c, _ := testClient(t, f)
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, time.Hour)
	ids := queueReports(r, 3, time.Now().Add(reportLeaseMargin+50*time.Millisecond))
	for _, id := range ids {
		if rep := f.waitReport(t, id); rep["status"] != "SUCCEEDED" || rep["leaseToken"] != "tok_"+id {
			t.Fatalf("report %v", rep)
		}
	}
	closeWithin(t, r, context.Background())
	if errs := sink.list(); len(errs) != 0 {
		t.Fatalf("OnError %v", errs)
	}
}

// The default linger sends a batch that never fills, too.
func TestReportSentAfterLinger(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	c, _ := testClient(t, f)
	r := newReporter(context.Background(), c, func(err error) { t.Error(err) }, 0)
	defer closeWithin(t, r, context.Background())
	for _, id := range queueReports(r, 5, time.Now().Add(10*time.Minute)) {
		f.waitReport(t, id)
	}
}

// close sends everything queued at once, however long the linger, and
// reports queued after it are still sent (on their own).
func TestReporterCloseFlushesEverything(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.reported = make(chan string, 1000)
	c, _ := testClient(t, f)
	r := newReporter(context.Background(), c, func(err error) { t.Error(err) }, time.Hour)
	ids := queueReports(r, 150, time.Now().Add(10*time.Minute))
	closeWithin(t, r, context.Background())
	f.mu.Lock()
	got, batches := len(f.reports), append([]int(nil), f.batches...)
	f.mu.Unlock()
	if got != len(ids) {
		t.Fatalf("%d of %d reports sent by close", got, len(ids))
	}
	sum := 0
	for _, n := range batches {
		if n > reportBatchMax {
			t.Fatalf("batch of %d", n)
		}
		sum += n
	}
	if sum != len(ids) || len(batches) != 2 {
		t.Fatalf("batches %v", batches)
	}
	late := newQueuedReport(ClaimedJob{JobID: "job_late", Attempt: 1, LeaseToken: "tok_job_late"},
		JobReport{Status: ReportSucceeded}, time.Now().Add(time.Minute))
	r.enqueue(late)
	if rep := f.report(t, "job_late"); rep["status"] != "SUCCEEDED" {
		t.Fatalf("late report %v", rep)
	}
}

// A report the batch refuses (lease_lost) is that job's alone: the others
// are recorded and OnError names only the refused job.
func TestBatchLeaseLostAffectsOnlyThatJob(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.refuse = map[string]string{"job_r1": CodeLeaseLost}
	c, _ := testClient(t, f)
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, time.Hour)
	queueReports(r, 3, time.Now().Add(10*time.Minute))
	closeWithin(t, r, context.Background())
	f.mu.Lock()
	_, lost := f.reports["job_r1"]
	_, a := f.reports["job_r0"]
	_, b := f.reports["job_r2"]
	batches := append([]int(nil), f.batches...)
	f.mu.Unlock()
	if lost || !a || !b || len(batches) != 1 || batches[0] != 3 {
		t.Fatalf("recorded r0 %v r1 %v r2 %v, batches %v", a, lost, b, batches)
	}
	errs := sink.list()
	if len(errs) != 1 || !IsCode(errs[0], CodeLeaseLost) || !strings.Contains(errs[0].Error(), "job_r1") {
		t.Fatalf("OnError %v", errs)
	}
}

// A success a batch answers invalid_request at its output (the server can
// never record it) is reported as a non-retryable failure instead, as a
// single report's such refusal is, and as the Python and TypeScript workers
// read one in a batch (sdk QA: the Go reporter gave it up, and the job ran
// again at every lapse of its lease); the other reports of the batch are
// recorded as they were.
func TestBatchOutputRefusalIsReportedAsAFailure(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.refuseOutput = map[string]bool{"job_r1": true}
	c, _ := testClient(t, f)
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, time.Hour)
	ids := queueReports(r, 3, time.Now().Add(10*time.Minute))
	if !closeWithin(t, r, context.Background()) {
		t.Fatal("close gave up")
	}
	f.mu.Lock()
	batches := append([]int(nil), f.batches...)
	f.mu.Unlock()
	if len(batches) != 1 || batches[0] != 3 {
		t.Fatalf("batches %v", batches)
	}
	for _, id := range []string{ids[0], ids[2]} {
		if rep := f.report(t, id); rep["status"] != "SUCCEEDED" {
			t.Fatalf("report of %s %v", id, rep)
		}
	}
	rep := f.report(t, ids[1])
	if e, _ := rep["error"].(map[string]any); rep["status"] != "FAILED" || e["retryable"] != false ||
		e["message"] != "handler output refused by the server at output.n" {
		t.Fatalf("report %v", rep)
	}
	var refused *ReportNotRecordedError
	if errs := sink.list(); len(errs) != 1 || !errors.As(errs[0], &refused) || refused.What != "output_refused" ||
		refused.JobID != ids[1] {
		t.Fatalf("OnError %v", errs)
	}
	if r.lostReports() != 0 {
		t.Fatalf("%d counted lost", r.lostReports())
	}
}

// A server without the batch route still gets every report, one by one.
func TestBatchRefusedFallsBackToSingleReports(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.noBatch = true
	c, _ := testClient(t, f)
	r := newReporter(context.Background(), c, func(err error) { t.Error(err) }, time.Hour)
	ids := queueReports(r, 4, time.Now().Add(10*time.Minute))
	closeWithin(t, r, context.Background())
	for _, id := range ids {
		if rep := f.report(t, id); rep["status"] != "SUCCEEDED" {
			t.Fatalf("report %v", rep)
		}
	}
}

// The single reports a refused batch falls back to are retried like any
// report: each meets a few 503s beyond the client's own retries and is
// still recorded, and nothing is reported as lost.
func TestBatchFallbackRetriesEachSingleReport(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.noBatch = true
	var mu sync.Mutex
	refusals := map[string]int{}
	f.reportError = func(body json.RawMessage) (int, string) {
		var single struct {
			LeaseToken string `json:"leaseToken"`
		}
		if json.Unmarshal(body, &single) != nil || single.LeaseToken == "" {
			return 0, "" // the batch: refused by noBatch
		}
		mu.Lock()
		defer mu.Unlock()
		if refusals[single.LeaseToken]++; refusals[single.LeaseToken] <= 8 {
			return 503, "database_unavailable"
		}
		return 0, ""
	}
	c, _ := testClient(t, f)
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, time.Hour)
	ids := queueReports(r, 4, time.Now().Add(10*time.Minute))
	closeWithin(t, r, context.Background())
	for _, id := range ids {
		if rep := f.report(t, id); rep["status"] != "SUCCEEDED" {
			t.Fatalf("report %v", rep)
		}
	}
	if errs := sink.list(); len(errs) != 0 {
		t.Fatalf("OnError %v", errs)
	}
}

// Stop sends the reports of every finished handler, however long the
// linger: nothing finished is left unreported.
func TestWorkerStopFlushesReports(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	var ids []string
	for range 5 {
		ids = append(ids, f.add("t", "1", welcomeIn{}, 60000))
	}
	c, _ := testClient(t, f)
	w := NewWorker(c)
	w.reportLinger = time.Hour
	ran := make(chan struct{}, 5)
	must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
		Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
			ran <- struct{}{}
			return welcomeOut{Sent: true}, nil
		}}))
	must(t, w.Start(context.Background(), StartOptions{Concurrency: 5, OnError: func(err error) { t.Error(err) }}))
	for range 5 {
		<-ran
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must(t, stopWithin(t, w, ctx))
	for _, id := range ids {
		if rep := f.report(t, id); rep["status"] != "SUCCEEDED" {
			t.Fatalf("report %v", rep)
		}
	}
}

// Stop keeps its deadline (and the stop grace after it) while reports cannot
// be delivered: it returns then, with an error, and the undelivered report
// goes to OnError (its lease lapses and the job runs again). It waited out
// the whole lease.
func TestWorkerStopKeepsItsDeadlineWhileReportsFail(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.reportError = func(json.RawMessage) (int, string) { return 503, "database_unavailable" }
	f.add("t", "1", welcomeIn{}, 600000) // a ten-minute lease
	ran := make(chan struct{}, 1)
	w, sink := startWorker(t, f, func(w *Worker) {
		must(t, RegisterTool(w, Tool[welcomeIn, welcomeOut]{Name: "t", Version: "1",
			Handler: func(context.Context, welcomeIn, JobContext) (welcomeOut, error) {
				ran <- struct{}{}
				return welcomeOut{Sent: true}, nil
			}}))
	}, StartOptions{StopGrace: 200 * time.Millisecond})
	<-ran
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	select {
	case err := <-stopped:
		if err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop answered %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop outlived its deadline")
	}
	if errs := sink.list(); len(errs) == 0 || !strings.Contains(errs[len(errs)-1].Error(), "report job") {
		t.Fatalf("OnError %v", errs)
	}
}

// Reports not recorded are counted for Stop's error, except refusals that
// settle the job elsewhere (lease_lost: a newer claim holds it;
// invalid_state: it ended otherwise). A job that ended because this very
// attempt, its last, lapsed before the report arrived (invalid_state with
// detail.leaseLapsed, SDK QA: an outage past the lease) lost the handler's
// outcome: that is counted.
func TestReporterCountsLostReportsButNotSettledRefusals(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.refuse = map[string]string{"job_r0": CodeLeaseLost, "job_r1": CodeUnauthorized, "job_r2": CodeInvalidState,
		"job_r3": CodeInvalidState, "job_r4": CodeInvalidState}
	f.refuseDetail = map[string]map[string]any{"job_r2": {"status": "EXHAUSTED", "leaseLapsed": true},
		"job_r3": {"status": "EXHAUSTED", "leaseLapsed": false}}
	c, _ := testClient(t, f)
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, time.Hour)
	queueReports(r, 6, time.Now().Add(10*time.Minute))
	if !closeWithin(t, r, context.Background()) {
		t.Fatal("close gave up")
	}
	if n := r.lostReports(); n != 2 {
		t.Fatalf("%d reports counted lost, want 2 (the 401 and the lapsed last attempt); OnError %v", n, sink.list())
	}
}

// A report refused lease_lost whose detail.reportedOutcome is the outcome
// it reports was recorded: its first send landed, its answer was lost, and
// a newer claim came before the retry. Nothing goes to OnError for it, on
// the single route or in a batch, as in the Python and TypeScript workers
// (sdk QA: Go's told OnError the report was refused); another outcome
// recorded is still a refusal.
func TestReporterTakesALandedReportRefusedLeaseLostAsRecorded(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2} { // one report takes the single route; two, a batch
		f := newFakeJobs()
		f.refuse = map[string]string{"job_r0": CodeLeaseLost, "job_r1": CodeLeaseLost}
		f.refuseDetail = map[string]map[string]any{"job_r0": {"attempt": 2, "reportedOutcome": "SUCCEEDED"},
			"job_r1": {"attempt": 2, "reportedOutcome": "FAILED"}}
		c, _ := testClient(t, f)
		sink := &errSink{}
		r := newReporter(context.Background(), c, sink.add, time.Hour)
		queueReports(r, n, time.Now().Add(10*time.Minute))
		if !closeWithin(t, r, context.Background()) {
			t.Fatal("close gave up")
		}
		errs := sink.list()
		if len(errs) != n-1 || (n == 2 && !strings.Contains(errs[0].Error(), "job_r1")) {
			t.Fatalf("%d reports: OnError %v", n, errs)
		}
		if r.lostReports() != 0 {
			t.Fatalf("%d reports: %d counted lost", n, r.lostReports())
		}
	}
}

// A report that meets a failure worth a retry is held, so the worker claims
// nothing, until the server answers it; so is one whose lease is about to
// lapse. Nothing is given up meanwhile, however long that takes.
func TestReporterHoldsAFailingReportUntilItIsRecorded(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	down := f.reportsDown()
	c, _ := testClient(t, f)
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, 0)
	defer closeWithin(t, r, context.Background())
	if r.holding(time.Now()) {
		t.Fatal("holding with nothing queued")
	}
	queueReports(r, 1, time.Now().Add(10*time.Minute))
	deadline := time.Now().Add(5 * time.Second)
	for !r.holding(time.Now()) {
		if time.Now().After(deadline) {
			t.Fatal("a failing report is not held")
		}
		time.Sleep(time.Millisecond)
	}
	down.Store(false)
	f.waitReport(t, "job_r0")
	for r.holding(time.Now()) {
		select {
		case <-r.settled:
		case <-time.After(5 * time.Second):
			t.Fatal("still holding a recorded report")
		}
	}
	if errs := sink.list(); len(errs) != 0 || r.lostReports() != 0 {
		t.Fatalf("OnError %v, lost %d", errs, r.lostReports())
	}
	r.pmu.Lock()
	r.pending[99] = &pendingReport{expires: time.Now().Add(reportLeaseMargin / 2)}
	r.pmu.Unlock()
	if !r.holding(time.Now()) {
		t.Fatal("a report whose lease is about to lapse is not held")
	}
}

// When an outage ends, the first report recorded does not release the
// others still waiting out their backoff: the worker holds its claims until
// each is recorded, or fails in a delivery sent after the server recorded
// another (Go SDK QA: they were taken as failing on their own, the worker
// claimed at once and ran again the jobs whose outcomes it still held).
// Found failing on its own, a report says so on settled, as a report that
// settles does: the worker waits on it in awaitReports, and claimed nothing
// until another report settled (never, with no other job running).
func TestReporterHoldsThroughTheEndOfAnOutage(t *testing.T) {
	t.Parallel()
	c, _ := testClient(t, newFakeJobs())
	r := newReporter(context.Background(), c, (&errSink{}).add, 0)
	defer closeWithin(t, r, context.Background())
	far := time.Now().Add(10 * time.Minute)
	a, b := queuedReport{id: 1001, expires: far}, queuedReport{id: 1002, expires: far}
	r.pmu.Lock()
	r.pending[a.id], r.pending[b.id] = &pendingReport{expires: far}, &pendingReport{expires: far}
	r.pmu.Unlock()
	tick := func() time.Time { time.Sleep(time.Millisecond); return time.Now() }
	signalled := func() bool {
		select {
		case <-r.settled:
			return true
		default:
			return false
		}
	}

	r.markFailing([]queuedReport{a}, tick()) // the outage begins
	r.markFailing([]queuedReport{b}, tick())
	r.markFailing([]queuedReport{b}, tick()) // a retry in the outage
	sentBeforeTheRecording := tick()
	r.recorded(a, tick()) // the outage ends: a's retry is recorded
	if !r.holding(tick()) || !signalled() {
		t.Fatal("b, still waiting out its backoff, does not hold the claims, or a's recording is not signalled")
	}
	r.markFailing([]queuedReport{b}, sentBeforeTheRecording) // sent before the server was back
	if !r.holding(tick()) || signalled() {
		t.Fatal("a delivery sent before the recording says something of b")
	}
	r.markFailing([]queuedReport{b}, tick()) // sent after it, and failed: b's own doing
	if r.holding(tick()) {
		t.Fatal("b, failing while the server records reports, still holds the claims")
	}
	if !signalled() {
		t.Fatal("b found failing on its own is not signalled: the worker would go on waiting")
	}
	r.markFailing([]queuedReport{b}, tick()) // failing on its own already: nothing changed
	if signalled() {
		t.Fatal("b still failing on its own is signalled again")
	}
}

// Two attempts' reports of one job never share a batch, which the server
// would refuse the second of (Go SDK QA: the live attempt's report was lost
// so); the second goes in the next batch, and both are delivered.
func TestBatchNeverNamesAJobTwice(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	var mu sync.Mutex
	var bodies []string
	f.reportError = func(body json.RawMessage) (int, string) {
		mu.Lock()
		bodies = append(bodies, string(body))
		mu.Unlock()
		return 0, ""
	}
	c, _ := testClient(t, f)
	r := newReporter(context.Background(), c, (&errSink{}).add, time.Hour)
	far := time.Now().Add(10 * time.Minute)
	for _, j := range []ClaimedJob{{JobID: "job_x", Attempt: 1, LeaseToken: "tok_x1"},
		{JobID: "job_y", Attempt: 1, LeaseToken: "tok_y1"}, {JobID: "job_x", Attempt: 2, LeaseToken: "tok_x2"}} {
		r.enqueue(newQueuedReport(j, JobReport{Status: ReportSucceeded, Output: []byte(`{}`)}, far))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !closeWithin(t, r, ctx) || r.lostReports() != 0 {
		t.Fatalf("lost %d", r.lostReports())
	}
	mu.Lock()
	defer mu.Unlock()
	all := strings.Join(bodies, "\n")
	for _, tok := range []string{"tok_x1", "tok_y1", "tok_x2"} {
		if strings.Count(all, tok) != 1 {
			t.Fatalf("%s delivered %d times: %q", tok, strings.Count(all, tok), bodies)
		}
	}
	for _, b := range bodies {
		if strings.Count(b, `"job_x"`) > 1 {
			t.Fatalf("a batch names job_x twice: %s", b)
		}
	}
}

// A delivery that hangs past its own timeout (a black-holed connection, a
// proxy holding the request) is retried, not given up: only close's
// deadline ends a report's retries (review: it was counted lost at once,
// and the job ran again).
func TestReporterRetriesADeliveryThatHung(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	var calls atomic.Int32
	released := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			// The body is read first: only then does the server notice the
			// client hanging up and end r.Context().
			_, _ = io.Copy(io.Discard, r.Body)
			select { // hangs until the client gives up on it
			case <-r.Context().Done():
			case <-released:
			}
			return
		}
		f.ServeHTTP(w, r)
	}))
	defer srv.Close()
	defer close(released)
	c, err := NewClient(Config{BaseURL: srv.URL, APIKey: "k", HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, 0)
	r.deliveryTimeout = 200 * time.Millisecond
	queueReports(r, 1, time.Now().Add(10*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !closeWithin(t, r, ctx) {
		t.Fatal("close gave up")
	}
	if r.lostReports() != 0 || calls.Load() < 2 {
		t.Fatalf("deliveries %d, lost %d, OnError %v", calls.Load(), r.lostReports(), sink.list())
	}
}

// A batch the server keeps failing on with an error one report could cause
// (a 500) is sent report by report after its second failure running: its
// other reports are recorded, and the report the server chokes on holds
// back only itself — not the batch, and not the worker's claims once the
// server has recorded others since it began failing. It is retried until
// close gives up (review: the whole batch was retried, and held, for as
// long as that report failed).
func TestBatchThatKeepsFailingIsSplit(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	var batches, singles atomic.Int32
	f.reportError = func(body json.RawMessage) (int, string) {
		if bytes.Contains(body, []byte(`"reports"`)) {
			batches.Add(1)
		} else {
			singles.Add(1)
		}
		if bytes.Contains(body, []byte("tok_job_r3")) {
			return 500, "internal_error"
		}
		return 0, ""
	}
	c, _ := testClient(t, f)
	c.maxRetries = 0 // one request a delivery
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, 50*time.Millisecond)
	ids := queueReports(r, 5, time.Now().Add(10*time.Minute))
	for _, id := range ids {
		if id != "job_r3" {
			if rep := f.waitReport(t, id); rep["status"] != "SUCCEEDED" {
				t.Fatalf("report of %s: %v", id, rep)
			}
		}
	}
	if !eventually(func() bool { return !r.holding(time.Now()) && singles.Load() >= 6 }) {
		t.Fatalf("holding %v after %d single deliveries", r.holding(time.Now()), singles.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if closeWithin(t, r, ctx) || r.lostReports() != 1 || batches.Load() != 2 {
		t.Fatalf("lost %d, batch deliveries %d", r.lostReports(), batches.Load())
	}
}

// Reports the server keeps failing on, one in each of more batches than
// may be in flight, hold back no other report: a split batch gives its slot
// up (review: each held one for as long as its bad report was retried, so
// three of them stalled the reporter and, behind it, the worker).
func TestSplitBatchesDoNotHoldTheirSlots(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.reportError = func(body json.RawMessage) (int, string) {
		if bytes.Contains(body, []byte("tok_bad")) {
			return 500, "internal_error"
		}
		return 0, ""
	}
	c, _ := testClient(t, f)
	c.maxRetries = 0
	r := newReporter(context.Background(), c, (&errSink{}).add, 20*time.Millisecond)
	report := func(id string) {
		r.enqueue(newQueuedReport(ClaimedJob{JobID: id, Attempt: 1, LeaseToken: "tok_" + id},
			JobReport{Status: ReportSucceeded, Output: []byte(`{"n":1}`)}, time.Now().Add(10*time.Minute)))
	}
	for i := range reportInFlight + 2 {
		report(fmt.Sprintf("bad_%d", i))
		report(fmt.Sprintf("good_%d", i))
		f.waitReport(t, fmt.Sprintf("good_%d", i)) // recorded once its batch was split
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if closeWithin(t, r, ctx) || r.lostReports() != reportInFlight+2 {
		t.Fatalf("lost %d reports; want the %d bad ones", r.lostReports(), reportInFlight+2)
	}
}

// A batch refused with a 503 (or any failure that says the same of every
// request) is sent again whole, never split: splitting would multiply the
// requests of an outage.
func TestBatchMeetingAnOutageIsNotSplit(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	var batches, singles atomic.Int32
	f.reportError = func(body json.RawMessage) (int, string) {
		if !bytes.Contains(body, []byte(`"reports"`)) {
			singles.Add(1)
			return 0, ""
		}
		if batches.Add(1) <= 3 {
			return 503, "database_unavailable"
		}
		return 0, ""
	}
	c, _ := testClient(t, f)
	c.maxRetries = 0
	r := newReporter(context.Background(), c, (&errSink{}).add, 50*time.Millisecond)
	queueReports(r, 5, time.Now().Add(10*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !closeWithin(t, r, ctx) || r.lostReports() != 0 || batches.Load() != 4 || singles.Load() != 0 {
		t.Fatalf("lost %d, batch deliveries %d, single deliveries %d", r.lostReports(), batches.Load(), singles.Load())
	}
}

// eventually polls cond for up to 10 s.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// A batch answer whose results do not name the reports' jobs in their slots
// is a lost answer for the whole batch: the worker sends the batch again
// (each report is safe to repeat) and counts none lost, rather than giving
// up reports the server may well have recorded (SDK QA: every report of the
// batch was counted lost and its job left to run again).
func TestReporterRetriesABatchWhoseAnswerNamesOtherJobs(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	c, _ := testClient(t, batchAnswers(newFakeJobs(), func(results []any) []any {
		if calls.Add(1) == 1 && len(results) > 1 {
			results[0], results[1] = results[1], results[0]
		}
		return results
	}))
	c.maxRetries = 0 // each delivery one request: the reporter's own retry is tested
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, time.Hour)
	queueReports(r, 3, time.Now().Add(10*time.Minute))
	if !closeWithin(t, r, context.Background()) {
		t.Fatal("close gave up")
	}
	if n := r.lostReports(); n != 0 || len(sink.list()) != 0 || calls.Load() != 2 {
		t.Fatalf("%d reports counted lost after %d deliveries; OnError %v", n, calls.Load(), sink.list())
	}
}

// A server whose batch answers never line up with the reports sent (not one
// result per report, or results naming other jobs: a protocol error, not an
// outage) gets the batch report by report on the single-report route after
// two such answers running, as a batch meeting a 500 twice running does:
// each report is recorded, none is lost, nothing goes to OnError and no
// report holds the claims. It was sent again whole for ever: the worker
// claimed nothing more, and close (Stop) waited its deadline out and gave
// every report up. The reports' order is reversed in one answer and one
// result is left out of the other; close's deadline is far off, and only
// the fallback lets close report every report sent.
func TestReporterSendsABatchWhoseAnswersNeverLineUpReportByReport(t *testing.T) {
	t.Parallel()
	for _, answer := range []string{"reversed", "short"} {
		t.Run(answer, func(t *testing.T) {
			t.Parallel()
			f := newFakeJobs()
			var batches atomic.Int32
			c, _ := testClient(t, batchAnswers(f, func(results []any) []any {
				batches.Add(1)
				if answer == "reversed" {
					slices.Reverse(results)
					return results
				}
				return results[1:]
			}))
			c.maxRetries = 0 // each delivery one request: the reporter's own rule is tested
			sink := &errSink{}
			r := newReporter(context.Background(), c, sink.add, time.Hour)
			ids := queueReports(r, 4, time.Now().Add(10*time.Minute))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if !closeWithin(t, r, ctx) {
				t.Fatalf("close gave up after %d batch deliveries; OnError %v", batches.Load(), sink.list())
			}
			for _, id := range ids {
				if rep := f.report(t, id); rep["status"] != "SUCCEEDED" || rep["leaseToken"] != "tok_"+id {
					t.Fatalf("report of %s: %v", id, rep)
				}
			}
			if n := r.lostReports(); n != 0 || len(sink.list()) != 0 || batches.Load() != 2 || r.holding(time.Now()) {
				t.Fatalf("lost %d after %d batch deliveries, holding %v; OnError %v", n, batches.Load(), r.holding(time.Now()), sink.list())
			}
		})
	}
}

// batchAnswers answers the batch route by recording nothing and answering
// each report a success in its slot, the results passed through garble
// first; f serves every other route.
func batchAnswers(f *fakeJobs, garble func(results []any) []any) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/jobs/report" {
			f.ServeHTTP(w, r)
			return
		}
		var body struct {
			Reports []struct {
				JobID string `json:"jobId"`
			} `json:"reports"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		results := []any{}
		for _, rep := range body.Reports {
			results = append(results, map[string]any{"jobId": rep.JobID, "status": "SUCCEEDED", "attempt": 1})
		}
		writeJSON(w, 200, map[string]any{"results": garble(results)})
	})
}

// A report waiting for room in the full queue is given up when the reporter
// gives up, whatever the batches ahead of it are doing: enqueue returns (a
// handler, and so close and Stop, wait for it), and the report goes to
// OnError as not recorded, is counted lost and holds the claims no more.
// Here the test holds every batch slot, as sends that have not yet ended,
// so that nothing but the give-up can release it. OnError is told while the
// handler still holds the reporter's read lock, which close must take
// before it can end: so close, and Stop's count of reports lost, cannot
// pass a report given up so (failed after the unlock, "698 report(s)" of
// 700 were counted, and the last told to OnError after Stop returned). The
// test's OnError holds the notice until it has seen the lock still held.
func TestReporterGivesUpAReportWaitingForRoom(t *testing.T) {
	t.Parallel()
	c, _ := testClient(t, newFakeJobs())
	sink := &errSink{}
	told, release := make(chan struct{}), make(chan struct{})
	r := newReporter(context.Background(), c, func(err error) {
		sink.add(err)
		var notice *ReportNotRecordedError
		if errors.As(err, &notice) && notice.JobID == "job_waiting" {
			close(told)
			<-release
		}
	}, time.Hour)
	for range reportInFlight {
		r.slots <- struct{}{}
	}
	far := time.Now().Add(10 * time.Minute)
	queueReports(r, 2*reportBatchMax, far) // a full batch waits for a slot, the rest fill the queue
	if len(r.in) != cap(r.in) {
		t.Fatalf("%d of %d queued behind the batch waiting for a slot", len(r.in), cap(r.in))
	}
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		r.enqueue(newQueuedReport(ClaimedJob{JobID: "job_waiting", Attempt: 1, LeaseToken: "tok_waiting"},
			JobReport{Status: ReportSucceeded}, far))
	}()
	r.giveUp()
	select {
	case <-told:
	case <-returned:
		t.Fatalf("the report waiting for room was given up untold: OnError %v", sink.list())
	case <-time.After(30 * time.Second):
		t.Fatal("the report waiting for room was not given up")
	}
	// No other handler is queueing: only the one being told can hold it.
	if r.mu.TryLock() {
		r.mu.Unlock()
		t.Fatal("OnError is told of the report given up outside the read lock: close could end, and Stop count, before it")
	}
	close(release)
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("enqueue did not return once OnError was told")
	}
	var notice *ReportNotRecordedError
	if errs := sink.list(); len(errs) != 1 || !errors.As(errs[0], &notice) || notice.JobID != "job_waiting" ||
		!errors.Is(errs[0], context.Canceled) {
		t.Fatalf("OnError %v", errs)
	}
	r.pmu.Lock()
	pending := len(r.pending)
	r.pmu.Unlock()
	if r.lostReports() != 1 || pending != 2*reportBatchMax {
		t.Fatalf("lost %d, %d pending", r.lostReports(), pending)
	}
	for range reportInFlight {
		<-r.slots // the sends end: the rest are given up too
	}
	closeWithin(t, r, context.Background())
	if r.lostReports() != 2*reportBatchMax+1 || r.holding(time.Now()) {
		t.Fatalf("lost %d, holding %v", r.lostReports(), r.holding(time.Now()))
	}
}

// close's deadline gives up every report still unsent, those queued and
// those of handlers waiting for room in the full queue alike: close returns
// false, not before the reporter has ended (its sends are over), the
// handler waiting is released, and each report goes to OnError once as not
// recorded and is counted lost, holding the claims no more.
func TestReporterCloseGivesUpEveryReportUnsentAtItsDeadline(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.reportsDown()
	c, _ := testClient(t, f)
	c.sleep = sleepCtx // the deliveries back off as in production
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, time.Hour)
	// Batches in flight, one waiting for a slot, the queue, and one more.
	n := (reportInFlight+2)*reportBatchMax + 1
	queued := make(chan []string, 1)
	go func() { queued <- queueReports(r, n, time.Now().Add(10*time.Minute)) }()
	if !eventually(func() bool { r.pmu.Lock(); defer r.pmu.Unlock(); return len(r.pending) == n }) {
		t.Fatal("the reports were not queued")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	closed := make(chan bool, 1)
	go func() { closed <- r.close(ctx) }()
	select {
	case sent := <-closed:
		if sent {
			t.Fatal("close says every report was sent")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("close outlived its deadline")
	}
	select {
	case <-r.done:
	default:
		t.Fatal("close returned before the reporter ended")
	}
	var ids []string
	select {
	case ids = <-queued:
	case <-time.After(30 * time.Second):
		t.Fatal("the report waiting for room was not given up")
	}
	named := map[string]int{}
	for _, err := range sink.list() {
		var notice *ReportNotRecordedError
		if !errors.As(err, &notice) || notice.What != "not_recorded" {
			t.Fatalf("OnError got %v", err)
		}
		named[notice.JobID]++
	}
	for _, id := range ids {
		if named[id] != 1 {
			t.Fatalf("%s given up %d times; %d jobs named", id, named[id], len(named))
		}
	}
	r.pmu.Lock()
	pending := len(r.pending)
	r.pmu.Unlock()
	if r.lostReports() != n || len(named) != n || pending != 0 || r.holding(time.Now()) {
		t.Fatalf("lost %d of %d, %d named, %d pending", r.lostReports(), n, len(named), pending)
	}
}

// A report answered a bare 4xx (a proxy's or a load balancer's, without
// Ratchet's error envelope: a 404 or 408 during a deploy, a misroute) is
// sent again as after a 5xx: the answer says nothing of the report, which
// its lease token makes safe to repeat (review: it was given up, counted
// not recorded, and the job ran again once its lease lapsed). A bare 413
// is the one left given up: that body is refused for good.
func TestReporterRetriesAReportAnsweredABareRefusal(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 401, 403, 404, 408, 409} {
		for _, n := range []int{1, 2} { // one report takes the single route; two, a batch (split on the 4xx)
			f := newFakeJobs()
			var mu sync.Mutex
			refusals := map[string]int{}
			f.reportError = func(json.RawMessage) (int, string) {
				mu.Lock()
				defer mu.Unlock()
				if refusals["all"]++; refusals["all"] <= 3 {
					return status, "" // no error code: not Ratchet's answer
				}
				return 0, ""
			}
			c, _ := testClient(t, f)
			sink := &errSink{}
			r := newReporter(context.Background(), c, sink.add, time.Hour)
			ids := queueReports(r, n, time.Now().Add(10*time.Minute))
			if !closeWithin(t, r, context.Background()) {
				t.Fatalf("%d, %d reports: close gave up", status, n)
			}
			for _, id := range ids {
				if rep := f.report(t, id); rep["status"] != "SUCCEEDED" {
					t.Fatalf("%d, %d reports: report %v", status, n, rep)
				}
			}
			if r.lostReports() != 0 {
				t.Fatalf("%d, %d reports: %d counted lost; OnError %v", status, n, r.lostReports(), sink.list())
			}
		}
	}
}

// A success report answered a bare 413 (a proxy's body limit before the
// server, nginx's 1 MB by default: no error envelope) can never be
// recorded, as after the server's own payload_too_large: it is reported as
// a non-retryable failure instead, so the handler runs once (review: it was
// given up, and the job ran again at every lapse, its side effect each
// time).
func TestReporterReportsAFailureForAnOutputAProxyRefusesForItsSize(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	f.reportError = func(body json.RawMessage) (int, string) {
		if bytes.Contains(body, []byte(`"SUCCEEDED"`)) {
			return http.StatusRequestEntityTooLarge, "" // no error code: the proxy's answer
		}
		return 0, ""
	}
	c, _ := testClient(t, f)
	sink := &errSink{}
	r := newReporter(context.Background(), c, sink.add, time.Hour)
	ids := queueReports(r, 1, time.Now().Add(10*time.Minute))
	if !closeWithin(t, r, context.Background()) {
		t.Fatal("close gave up")
	}
	rep := f.report(t, ids[0])
	if e, _ := rep["error"].(map[string]any); rep["status"] != "FAILED" || e["retryable"] != false ||
		!strings.Contains(e["message"].(string), "request size limit") {
		t.Fatalf("report %v", rep)
	}
	var refused *ReportNotRecordedError
	if errs := sink.list(); len(errs) != 1 || !errors.As(errs[0], &refused) || refused.What != "output_refused" {
		t.Fatalf("OnError %v", errs)
	}
	if r.lostReports() != 0 {
		t.Fatalf("%d counted lost", r.lostReports())
	}
}

// A close whose context had already ended (a refusal's bound that passed
// before Stop was called) with nothing queued has given nothing up: it
// says every report was sent. Both the flusher's end and the context's
// were ready at once, and close answered whichever its select chose (CI:
// a Stop with no report at all said reports had gone to OnError, one run
// in five). Many reporters, so that a random choice cannot pass them all.
func TestReporterCloseWithNothingQueuedAfterItsContextEnded(t *testing.T) {
	t.Parallel()
	f := newFakeJobs()
	c, _ := testClient(t, f)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 100 {
		r := newReporter(context.Background(), c, func(err error) { t.Error(err) }, time.Hour)
		if !closeWithin(t, r, ended) {
			t.Fatalf("close %d: reports not sent, though none was queued", i)
		}
		if n := r.lostReports(); n != 0 {
			t.Fatalf("close %d: %d reports lost", i, n)
		}
	}
}

// Stop's answer when a refusal, not a deadline of its own, ended the last
// reports says so and still matches ErrWorkerStopped, counting the
// handlers left unreported (it said "stop deadline passed" and ended in
// "%!w(<nil>)", Stop's context having no error to wrap).
func TestStopDeadlineErrorWithoutADeadline(t *testing.T) {
	err := stopDeadlineError(stopState{running: 1, left: 1, sent: false, lost: 1}, nil)
	msg := err.Error()
	if strings.Contains(msg, "%!") || strings.Contains(msg, "deadline") {
		t.Fatalf("error %q", msg)
	}
	if !errors.Is(err, ErrWorkerStopped) || !errors.Is(err, ErrReportsNotRecorded) {
		t.Fatalf("error %q matches neither ErrWorkerStopped nor ErrReportsNotRecorded", msg)
	}
	if !strings.Contains(msg, "1 handler(s) ignored cancellation") || !strings.Contains(msg, "1 report(s) were not recorded") {
		t.Fatalf("error %q", msg)
	}
	if err := stopDeadlineError(stopState{sent: true}, context.DeadlineExceeded); !errors.Is(err, context.DeadlineExceeded) ||
		!strings.HasPrefix(err.Error(), "ratchet: stop deadline passed; no handler was running") {
		t.Fatalf("error %q", err)
	}
}

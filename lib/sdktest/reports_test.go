package sdktest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// reportTrouble answers the report routes (single and batch) itself while
// answer is set, without forwarding them: as a network failure when answer
// returns a nil response, else with that response. Every other route is
// forwarded. It counts the report requests it saw.
type reportTrouble struct {
	next    http.RoundTripper
	answer  atomic.Pointer[func(*http.Request) (*http.Response, error)]
	reports atomic.Int32
}

func (rt *reportTrouble) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/report") {
		rt.reports.Add(1)
		if f := rt.answer.Load(); f != nil {
			return (*f)(r)
		}
	}
	return rt.next.RoundTrip(r)
}

// set makes the report routes answer with f (nil: forward again).
func (rt *reportTrouble) set(f func(*http.Request) (*http.Response, error)) {
	if f == nil {
		rt.answer.Store(nil)
		return
	}
	rt.answer.Store(&f)
}

// refused answers the report routes as a server unreachable on them.
func refused(*http.Request) (*http.Response, error) {
	return nil, errors.New("dial tcp: connection refused")
}

// envelope answers with status and the API's error envelope.
func envelope(status int, body string) func(*http.Request) (*http.Response, error) {
	return func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: status, Status: http.StatusText(status), Request: r,
			Header: http.Header{"Content-Type": []string{"application/json"}},
			Body:   io.NopCloser(strings.NewReader(body))}, nil
	}
}

// reportErrors returns the OnError calls that gave a report up.
func (e *errs) reportErrors() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, err := range e.list {
		if s := err.Error(); strings.Contains(s, "report job") && !strings.Contains(s, "still retrying") {
			out = append(out, s)
		}
	}
	return out
}

// The report route is unreachable from the moment a handler finishes (it
// has charged the card) until well after the job's 3 s lease lapsed, while
// claims still get through. The server would still take the report (API.md
// §5: a report with the current token is accepted after its lease lapsed as
// long as no newer claim exists), so the worker must hold it, and must not
// claim meanwhile: its own claim would get the job back and charge again.
func TestWorkerHoldsAFinishedJobsReportThroughAnOutageLongerThanItsLease(t *testing.T) {
	t.Parallel()
	b := setup(t, apitest.WithConfig(func(c *config.Config) { c.JobLeaseGraceMs = 1000 }))
	ctx := context.Background()
	trouble := &reportTrouble{}
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "charge@1"),
		func(rt http.RoundTripper) http.RoundTripper { trouble.next = rt; return trouble }))
	var runs atomic.Int32
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "charge", Version: "1",
		Handler: func(ctx context.Context, in welcomeIn, job ratchet.JobContext) (welcomeOut, error) {
			if runs.Add(1) == 1 {
				trouble.set(refused) // the outage begins as the side effect completes
			}
			return welcomeOut{MessageID: "charged"}, nil
		}}))
	e := start(t, w, 1)
	run, err := b.producer.StartRun(ctx, "report-outage")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{
		Name: "charge", Version: "1", Timeout: 2 * time.Second, MaxAttempts: 3})
	require.NoError(t, err)
	time.Sleep(6 * time.Second) // twice the lease (2 s timeout + 1 s grace)
	require.EqualValues(t, 1, runs.Load(), "the worker claimed and ran again the job whose report it held")
	trouble.set(nil)
	s := stepIs(t, b.producer, run.ID, st.StepID, ratchet.JobSucceeded, ratchet.JobExhausted)
	t.Logf("executions: %v; report requests %d", executions(t, b, s.DurableJob.ID), trouble.reports.Load())
	require.Equal(t, ratchet.JobSucceeded, s.Status)
	require.EqualValues(t, 1, runs.Load(), "the handler ran again after the outage")
	// Stop delivers every OnError call queued before it returns.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, w.Stop(sctx))
	require.Empty(t, e.reportErrors(), "no report may be given up while the server can still take it")
}

// A report the server answers 429 with a Retry-After beyond 30 s is waited
// for, not dropped: the SDK used to give a report up once its next retry
// fell past max(30 s, lease), whereupon the lease lapsed and the worker ran
// the finished job again. Stop, whose deadline then ends the wait, says how
// many reports were not recorded.
func TestWorkerKeepsAReportTheServerAsksToRetryMuchLater(t *testing.T) {
	t.Parallel()
	b := setup(t, apitest.WithConfig(func(c *config.Config) { c.JobLeaseGraceMs = 500 }))
	ctx := context.Background()
	trouble := &reportTrouble{}
	trouble.set(envelope(429, `{"error":{"code":"rate_limited","message":"slow down","detail":{"retry_after_seconds":31}}}`))
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "limited@1"),
		func(rt http.RoundTripper) http.RoundTripper { trouble.next = rt; return trouble }))
	var runs atomic.Int32
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "limited", Version: "1",
		Handler: func(context.Context, welcomeIn, ratchet.JobContext) (welcomeOut, error) {
			runs.Add(1)
			return welcomeOut{MessageID: "sent"}, nil
		}}))
	e := &errs{}
	require.NoError(t, w.Start(ctx, ratchet.StartOptions{Concurrency: 1, PollInterval: 100 * time.Millisecond, OnError: e.add,
		StopGrace: 500 * time.Millisecond}))
	run, err := b.producer.StartRun(ctx, "rate-limited-report")
	require.NoError(t, err)
	_, err = b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{
		Name: "limited", Version: "1", Timeout: time.Second, MaxAttempts: 3})
	require.NoError(t, err)
	time.Sleep(3 * time.Second) // twice the lease (1 s timeout + 0.5 s grace)
	require.EqualValues(t, 1, runs.Load(), "the report was given up and the finished job ran again")
	require.Empty(t, e.reportErrors(), "a report was given up although the server asked only to wait")

	// The report's next try is 31 s away, and every try is answered 429
	// again: a Stop that waited for the report past its deadline and
	// grace would not return (apitest.Returns), and one that waited for
	// the next try would have sent it.
	sent := trouble.reports.Load()
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	var stopErr error
	apitest.Returns(t, "Stop outlived its deadline and grace", func() { stopErr = w.Stop(sctx) })
	t.Logf("Stop: %v", stopErr)
	require.Error(t, stopErr)
	require.Contains(t, stopErr.Error(), "1 report(s) were not recorded")
	require.Equal(t, sent, trouble.reports.Load(), "Stop waited for the report's next try")
	// OnError runs on a goroutine of its own, so the check before Stop could
	// pass with a give-up still queued. Stop delivers every call queued before
	// it returns, its own give-up of the held report included: exactly that
	// one may be there now.
	t.Logf("OnError after Stop: %v", e.reportErrors())
	require.Len(t, e.reportErrors(), 1, "a report was given up before Stop although the server asked only to wait")
}

// A report the server refuses for good, for a reason that does not settle
// the job (here the key was revoked: 401), is not recorded: the job runs
// again once its lease lapses. Stop must not answer nil (a clean shutdown)
// then, even though it met no deadline.
func TestStopSaysHowManyReportsWereNotRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	trouble := &reportTrouble{}
	trouble.set(envelope(401, `{"error":{"code":"unauthorized","message":"key revoked","detail":{}}}`))
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "revoked@1"),
		func(rt http.RoundTripper) http.RoundTripper { trouble.next = rt; return trouble }))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "revoked", Version: "1",
		Handler: func(context.Context, welcomeIn, ratchet.JobContext) (welcomeOut, error) {
			return welcomeOut{MessageID: "sent"}, nil
		}}))
	e := &errs{}
	require.NoError(t, w.Start(ctx, ratchet.StartOptions{Concurrency: 1, PollInterval: 100 * time.Millisecond, OnError: e.add}))
	run, err := b.producer.StartRun(ctx, "refused-report")
	require.NoError(t, err)
	_, err = b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{Name: "revoked", Version: "1"})
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for len(e.reportErrors()) == 0 {
		require.True(t, time.Now().Before(deadline), "the report was never refused")
		time.Sleep(20 * time.Millisecond)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stopErr := w.Stop(sctx)
	t.Logf("Stop: %v; OnError: %v", stopErr, e.reportErrors())
	require.Error(t, stopErr, "Stop reported a clean shutdown although a finished job's report was not recorded")
	require.Contains(t, stopErr.Error(), "1 report(s) were not recorded")
	require.NotContains(t, stopErr.Error(), "deadline", "no deadline passed")
}

// A handler that ignores its 1 s timeout: the worker reports the timeout
// (the attempt is recorded, the job retries later) and the handler goes on
// running. Stopping the worker then must not say it was "left unreported",
// and must not wait out grace periods for it: the grace is an hour, and
// the handler returns only after Stop did.
func TestStopCountsAHandlerWhoseTimeoutWasReportedApart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := ratchet.NewWorker(b.client(t, b.workerKey(t, "stubborn@1"), nil))
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[welcomeIn, welcomeOut]{Name: "stubborn", Version: "1",
		Handler: func(ctx context.Context, in welcomeIn, job ratchet.JobContext) (welcomeOut, error) {
			<-release // ignores ctx
			return welcomeOut{}, nil
		}}))
	require.NoError(t, w.Start(ctx, ratchet.StartOptions{Concurrency: 1, PollInterval: 100 * time.Millisecond,
		StopGrace: time.Hour}))
	run, err := b.producer.StartRun(ctx, "stubborn")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"}, ratchet.EnqueueOptions{Name: "stubborn", Version: "1", Timeout: time.Second})
	require.NoError(t, err)
	s := stepIs(t, b.producer, run.ID, st.StepID, ratchet.JobRetryScheduled)
	t.Logf("executions: %v", executions(t, b, s.DurableJob.ID))
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	var stopErr error
	apitest.Returns(t, "Stop waited for a handler whose attempt was already reported",
		func() { stopErr = w.Stop(sctx) })
	t.Logf("Stop: %v", stopErr)
	require.Error(t, stopErr)
	require.NotContains(t, stopErr.Error(), "left unreported", "its attempt was reported (timeout) before Stop")
	require.Contains(t, stopErr.Error(), "1 handler(s) still running after their timeout was reported")
}

// executions reads a job's executions from the database as
// "attempt:outcome:reported:warning".
func executions(t *testing.T, b *bundle, jobID string) []string {
	t.Helper()
	rows, err := b.env.App.Pool.Query(context.Background(), `SELECT attempt::text || ':' || coalesce(outcome,'-') || ':' ||
		(reported_at IS NOT NULL)::text || ':' || coalesce(warning,'')
		FROM job_executions WHERE job_id = $1 ORDER BY attempt`, jobID)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

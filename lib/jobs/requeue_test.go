package jobs_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// The sweeper's requeue of a long-lapsed lease (sqlRequeueLapsed) and what
// the old token may do after it. Not parallel: the sweeps are global and
// these clocks move minutes past other tests' lapses.

// limitedRequeued claims a job on an endpoint with a concurrency limit,
// lets its lease lapse past RequeueLapsedAfter and sweeps: the job is
// requeued, and the stalled attempt's claim is returned.
func (b *bundle) limitedRequeued(t *testing.T) (jobs.EnqueueResult, jobs.ClaimedJob) {
	t.Helper()
	b.createEndpoint(t, "mailer", jobs.PolicyFields{MaxConcurrent: opt[int64](2)})
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000)})
	stale := b.claimOne(t, b.register(t))
	b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter + time.Second)
	b.sweep(t)
	require.Equal(t, "QUEUED", b.step(t, st.StepID).Status)
	return st, stale
}

// Cancelled and replayed after the requeue, the job is a new attempt's:
// the stalled attempt's heartbeat and report are superseded, as after any
// replay (they took the replayed job back, and its report ended it).
func TestRequeuedCancelledAndReplayedSupersedesTheOldToken(t *testing.T) {
	b := setup(t)
	st, stale := b.limitedRequeued(t)
	_, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	_, err = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)

	_, err = b.svc.Heartbeat(ctx, b.worker, stale.JobID, jobs.HeartbeatRequest{LeaseToken: stale.LeaseToken})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	_, err = b.svc.Report(ctx, b.worker, stale.JobID, jobs.ReportRequest{LeaseToken: stale.LeaseToken, Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	require.Equal(t, "QUEUED", b.step(t, st.StepID).Status)
}

// A late report on the requeued job is recorded; the heartbeat that comes
// after it (here, after a replay) does not reopen the reported attempt: it
// is told the attempt ended (no claim superseded it, so not lease_lost).
func TestReviveNeverReopensAReportedAttempt(t *testing.T) {
	b := setup(t)
	st, stale := b.limitedRequeued(t)
	require.Equal(t, "EXHAUSTED", b.fail(t, stale, &jobs.ReportError{Message: "bad input", Retryable: ptr(false)}).Status)
	_, err := b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)
	_, err = b.svc.Heartbeat(ctx, b.worker, stale.JobID, jobs.HeartbeatRequest{LeaseToken: stale.LeaseToken})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	xs := b.executions(t, stale.JobID)
	require.Equal(t, "FAILED", *xs[0].Outcome, "the reported outcome stands")
	require.True(t, xs[0].Reported)
	// Repeating the report answers what was recorded.
	r, err := b.svc.Report(ctx, b.worker, stale.JobID, jobs.ReportRequest{LeaseToken: stale.LeaseToken, Status: "FAILED",
		Error: &jobs.ReportError{Message: "bad input", Retryable: ptr(false)}})
	require.NoError(t, err)
	require.Equal(t, "EXHAUSTED", r.Status)
}

// A late report that waits for the job's row while the requeue commits is
// recorded: the requeue is read after the lock (it was read from the
// report statement's earlier snapshot, and such reports were refused).
func TestReportRacingTheRequeueIsRecorded(t *testing.T) {
	b := setup(t)
	b.createEndpoint(t, "mailer", jobs.PolicyFields{MaxConcurrent: opt[int64](2)})
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000)})
	stale := b.claimOne(t, b.register(t))

	// The requeue's change to the job, held open while the report comes.
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE jobs SET status = 'QUEUED', lease_token = NULL, ready_at = lease_expires_at,
		due_at = lease_expires_at WHERE id = $1`, stale.JobID)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE job_executions SET outcome = 'FAILED', warning = $2, ended_at = now()
		WHERE job_id = $1`, stale.JobID, jobs.LapseWarning)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE job_endpoints SET running_count = running_count - 1 WHERE workspace_id = $1`, b.ws)
	require.NoError(t, err)

	type answer struct {
		r   jobs.ReportResult
		err error
	}
	got := make(chan answer, 1)
	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, tx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		r, err := b.svc.Report(ctx, b.worker, stale.JobID, jobs.ReportRequest{LeaseToken: stale.LeaseToken, Status: "SUCCEEDED"})
		got <- answer{r, err}
	}()
	waits.Waiting(done, "the report waits for the job's row")
	require.NoError(t, tx.Commit(ctx))
	a := <-got
	require.NoError(t, a.err)
	require.Equal(t, "SUCCEEDED", a.r.Status)
	require.Equal(t, "SUCCEEDED", b.step(t, st.StepID).Status)
	require.Zero(t, b.count(t, `SELECT running_count FROM job_endpoints WHERE workspace_id = $1 AND name = 'mailer'`, b.ws))
}

// Late reports sent while the sweeper requeues their jobs are all recorded
// (no newer claim exists for any), and the endpoint's count ends right.
func TestLateReportsRacingTheSweeperAreAllRecorded(t *testing.T) {
	b := setup(t)
	b.createEndpoint(t, "mailer", jobs.PolicyFields{MaxConcurrent: opt[int64](1000)})
	runID := b.run(t)
	const n = 200
	for i := range n {
		b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000),
			Input: json.RawMessage(fmt.Sprint(i))})
	}
	w := b.register(t)
	var held []jobs.ClaimedJob
	for len(held) < n {
		held = append(held, b.claim(t, w, 100)...)
	}
	b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter + time.Second)

	var wg sync.WaitGroup
	start := make(chan struct{})
	wg.Go(func() { <-start; b.env.App.Sweeper.RunOnce(ctx) })
	errs := make(chan error, n)
	for i := range 16 {
		wg.Go(func() {
			<-start
			for k := i; k < n; k += 16 {
				_, err := b.svc.Report(ctx, b.worker, held[k].JobID,
					jobs.ReportRequest{LeaseToken: held[k].LeaseToken, Status: "SUCCEEDED"})
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM jobs WHERE run_id = $1 AND status = 'SUCCEEDED'`, runID))
	require.Zero(t, b.count(t, `SELECT running_count FROM job_endpoints WHERE workspace_id = $1 AND name = 'mailer'`, b.ws))
}

// requeuedOn enqueues a job on endpoint ep, claims it, lapses it past
// RequeueLapsedAfter and sweeps: the job is requeued; the stalled claim is
// returned.
func (b *bundle) requeuedOn(t *testing.T, runID, ep string, wid string) (jobs.EnqueueResult, jobs.ClaimedJob) {
	t.Helper()
	st := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(ep), TimeoutMs: ptr[int64](1_000),
		Input: json.RawMessage(fmt.Sprint(time.Now().UnixNano()))})
	c := b.claimOne(t, wid)
	require.Equal(t, st.JobID, c.JobID)
	b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter + time.Second)
	b.sweep(t)
	require.Equal(t, "QUEUED", b.step(t, st.StepID).Status)
	return st, c
}

func (b *bundle) limitedEndpoint(t *testing.T, name string, max int64) jobs.Endpoint {
	t.Helper()
	e, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: name,
		PolicyFields: jobs.PolicyFields{MaxConcurrent: opt[int64](max)}})
	require.NoError(t, err)
	return e
}

// A batch carrying a late report on a requeued job takes its endpoints in
// id order, as every batch and claim does: it locked the requeued job's
// endpoint first, and against another batch one of them deadlocked (500).
// The endpoint row held below only lines up the two batches' waits; the
// retry of a deadlock's victim is off, so that a deadlock fails a batch.
func TestLateReportBatchesLockEndpointsInOrder(t *testing.T) {
	b := setup(t, "send_email@1", "send_email@2")
	jobs.SetDeadlockRetry(b.svc, false)
	e1, e2 := b.limitedEndpoint(t, "a", 10), b.limitedEndpoint(t, "b", 10)
	lo, hi := e1, e2
	if lo.ID > hi.ID {
		lo, hi = hi, lo
	}
	runID := b.run(t)
	w := b.register(t)
	_, late := b.requeuedOn(t, runID, hi.Name, w) // requeued, on the higher endpoint
	w2 := b.register(t, jobs.Tool{Name: "send_email", Version: "2"})
	enq := func(ep string) jobs.ClaimedJob {
		st := b.enqueue(t, runID, jobs.EnqueueRequest{Name: "send_email", Version: "2", Endpoint: ptr(ep),
			Input: json.RawMessage(fmt.Sprint(time.Now().UnixNano()))})
		c := b.claimOne(t, w2)
		require.Equal(t, st.JobID, c.JobID)
		return c
	}
	loA, loB, hiB := enq(lo.Name), enq(lo.Name), enq(hi.Name)

	// A claim-like holder of the lower endpoint's row, only to order the
	// two batches' waits (any claim on it holds it the same way).
	x, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = x.Rollback(ctx) }()
	_, err = x.Exec(ctx, `SELECT 1 FROM job_endpoints WHERE id = $1 FOR UPDATE`, lo.ID)
	require.NoError(t, err)

	item := func(c jobs.ClaimedJob) jobs.BatchReportItem {
		return jobs.BatchReportItem{JobID: c.JobID, LeaseToken: c.LeaseToken, Status: "SUCCEEDED"}
	}
	errs := make(chan error, 2)
	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, x))
	batch := func(what string, items ...jobs.BatchReportItem) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, err := b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: items})
			errs <- err
		}()
		waits.Waiting(done, what+" waits for the lower endpoint's row")
	}
	batch("the normal batch", item(loB), item(hiB)) // apply locks lo, then hi
	batch("the late batch", item(late), item(loA))  // rehold of hi, then lo: in id order, lo first
	require.NoError(t, x.Commit(ctx))
	e1r, e2r := <-errs, <-errs
	require.NoError(t, e1r)
	require.NoError(t, e2r)
}

// Two heartbeats with the same token on a requeued job (a client's retry):
// one takes the job back and the other extends it; the second answered
// lease_lost though the job was RUNNING under that very token.
func TestConcurrentRevivesOfOneTokenBothSucceed(t *testing.T) {
	b := setup(t)
	b.limitedEndpoint(t, "mailer", 2)
	runID := b.run(t)
	w := b.register(t)
	st, stale := b.requeuedOn(t, runID, "mailer", w)

	x, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = x.Rollback(ctx) }()
	_, err = x.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, stale.JobID)
	require.NoError(t, err)
	errs := make(chan error, 2)
	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, x))
	for range 2 { // both wait for the job's row, so they take it one after the other
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, err := b.svc.Heartbeat(ctx, b.worker, stale.JobID, jobs.HeartbeatRequest{LeaseToken: stale.LeaseToken})
			errs <- err
		}()
		waits.Waiting(done, "the heartbeat waits for the job's row")
	}
	require.NoError(t, x.Rollback(ctx))
	e1, e2 := <-errs, <-errs
	require.Equal(t, "RUNNING", b.step(t, st.StepID).Status)
	var tok string
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT lease_token FROM jobs WHERE id = $1`, stale.JobID).Scan(&tok))
	require.Equal(t, storedForm(stale.LeaseToken), tok, "the job is RUNNING under the heartbeat's token")
	require.NoError(t, e1)
	require.NoError(t, e2)
}

// A heartbeat that finds its job requeued, and then waits to take it back
// while the late report of its attempt commits, is told the attempt ended
// (409 invalid_state), as a heartbeat after that report is: not lease_lost
// saying the slot went to another job, which nothing took (hammer QA:
// TestALateReportHeartbeatAndClaimsRacingOverRequeuedJobs). The report's
// change to the job is made by hand, held open while the heartbeat waits
// for the job's row. Not parallel: the sweep is global, and it watches
// pg_stat_activity.
func TestAHeartbeatTakingBackAJobReportedMeanwhileIsToldTheAttemptEnded(t *testing.T) {
	b := setup(t)
	b.limitedEndpoint(t, "mailer", 2)
	st, stale := b.requeuedOn(t, b.run(t), "mailer", b.register(t))

	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', finished_at = now(), updated_at = now() WHERE id = $1`,
		stale.JobID)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE job_executions SET outcome = 'SUCCEEDED', warning = NULL, reported_at = now(),
		ended_at = now(), result_status = 'SUCCEEDED' WHERE job_id = $1`, stale.JobID)
	require.NoError(t, err)

	beat := make(chan error, 1)
	go func() {
		_, err := b.svc.Heartbeat(ctx, b.worker, stale.JobID, jobs.HeartbeatRequest{LeaseToken: stale.LeaseToken})
		beat <- err
	}()
	waitForLock(t, b.env.App.Pool, `%WITH j0 AS%`, "the heartbeat found the job requeued and waits to take it back")
	require.NoError(t, tx.Commit(ctx))
	err = <-beat
	require.Equal(t, apierr.CodeInvalidState, code(t, err), "%v", err)
	require.Equal(t, "This attempt already ended; the job is SUCCEEDED.", err.(*apierr.Error).Message)
	require.Equal(t, "SUCCEEDED", b.step(t, st.StepID).Status)
	require.Zero(t, b.runningCount(t, "mailer"))
}

// Cancelled after the sweeper requeued it, with no claim or replay since,
// the job's stalled attempt is still its latest and unreported: its report
// is recorded, and its heartbeat says stop (cancelRequested, the lease not
// extended and no slot taken), as for any cancelled attempt not yet
// reported. It answered lease_lost, "a later attempt does", which none did
// (hammer QA).
func TestACancelledRequeuedJobsHeartbeatSaysStop(t *testing.T) {
	b := setup(t)
	b.limitedEndpoint(t, "mailer", 2)
	st, stale := b.requeuedOn(t, b.run(t), "mailer", b.register(t))
	_, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)

	hb, err := b.svc.Heartbeat(ctx, b.worker, stale.JobID, jobs.HeartbeatRequest{LeaseToken: stale.LeaseToken})
	require.NoError(t, err)
	require.True(t, hb.CancelRequested)
	require.Equal(t, stale.LeaseExpiresAt, *hb.LeaseExpiresAt, "the lapsed lease, not extended")
	require.Zero(t, b.runningCount(t, "mailer"), "no slot taken back")
	r, err := b.svc.Report(ctx, b.worker, stale.JobID, jobs.ReportRequest{LeaseToken: stale.LeaseToken, Status: "SUCCEEDED"})
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCancelled, r.Status)
	_, err = b.svc.Heartbeat(ctx, b.worker, stale.JobID, jobs.HeartbeatRequest{LeaseToken: stale.LeaseToken})
	require.Equal(t, apierr.CodeInvalidState, code(t, err), "reported: the attempt ended")
	require.Zero(t, b.runningCount(t, "mailer"))
}

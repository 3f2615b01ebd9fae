package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jobs"
)

// fill enqueues one job through the API path and clones it to n jobs.
func (b *bundle) fill(t testing.TB, runID string, n int) {
	t.Helper()
	ctx := context.Background()
	res, err := b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
		Input: json.RawMessage(`{"n":0}`)})
	require.NoError(t, err)
	if n > 1 {
		tag := ids.Random(3) // hex is within the id alphabet
		got, err := b.svc.CloneQueued(ctx, res.JobID, tag, n-1)
		require.NoError(t, err)
		require.EqualValues(t, n-1, got)
	}
}

// drain runs claimers concurrently until the queue is empty and returns
// every job id each claimer received.
func (b *bundle) drain(t testing.TB, claimers, limit int) [][]string {
	t.Helper()
	ctx := context.Background()
	got := make([][]string, claimers)
	var wg sync.WaitGroup
	errs := make(chan error, claimers)
	for i := range claimers {
		wid := b.register(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{Limit: &limit})
				if err != nil {
					errs <- err
					return
				}
				if len(c.Jobs) == 0 {
					return
				}
				for _, j := range c.Jobs {
					got[i] = append(got[i], j.JobID)
					if _, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
						Status: jobs.StatusSucceeded, Output: json.RawMessage(`{"ok":true}`)}); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return got
}

func TestTenThousandJobsEightClaimersEachSucceedsOnce(t *testing.T) {
	t.Parallel()
	const n = 10_000
	b := setup(t)
	runID := b.run(t)
	b.fill(t, runID, n)

	got := b.drain(t, 8, 10)
	seen := map[string]int{}
	for _, ids := range got {
		for _, id := range ids {
			seen[id]++
		}
	}
	require.Len(t, seen, n)
	for id, c := range seen {
		require.Equal(t, 1, c, "job %s claimed %d times", id, c)
	}

	var jobsN, succeededN, execN, execJobs, maxPerJob int
	require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM jobs WHERE run_id = $1),
		       (SELECT count(*) FROM jobs WHERE run_id = $1 AND status = 'SUCCEEDED'),
		       count(*) FILTER (WHERE x.outcome = 'SUCCEEDED'), count(DISTINCT x.job_id),
		       coalesce(max(c.per), 0)
		FROM job_executions x
		JOIN jobs j ON j.id = x.job_id AND j.run_id = $1
		CROSS JOIN LATERAL (SELECT count(*) AS per FROM job_executions y WHERE y.job_id = x.job_id) c`,
		runID).Scan(&jobsN, &succeededN, &execN, &execJobs, &maxPerJob))
	require.Equal(t, n, jobsN)
	require.Equal(t, n, succeededN)
	require.Equal(t, n, execN, "one SUCCEEDED execution per job")
	require.Equal(t, n, execJobs)
	require.Equal(t, 1, maxPerJob, "no job was executed twice")
}

func TestTwoConcurrentClaimersNeverShareAJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	b.fill(t, runID, 300)
	ctx := context.Background()
	w1, w2 := b.register(t), b.register(t)
	var a, c []jobs.ClaimedJob
	var wg sync.WaitGroup
	for _, x := range []struct {
		wid string
		out *[]jobs.ClaimedJob
	}{{w1, &a}, {w2, &c}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				r, err := b.svc.Claim(ctx, b.worker, x.wid, jobs.ClaimRequest{Limit: ptr(10)})
				if err != nil || len(r.Jobs) == 0 {
					return
				}
				*x.out = append(*x.out, r.Jobs...)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 300, len(a)+len(c))
	mine := map[string]bool{}
	for _, j := range a {
		mine[j.JobID] = true
	}
	for _, j := range c {
		require.False(t, mine[j.JobID], "job %s claimed by both workers", j.JobID)
	}
}

// After finish, concurrent workers finishing the last steps complete the run
// inline (no sweeper pass), exactly once.
func TestConcurrentLastStepsCompleteTheRunInline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 3 {
		runID := b.run(t)
		b.fill(t, runID, 40)
		_, err := b.svc.FinishRun(context.Background(), b.ws, runID)
		require.NoError(t, err)
		b.drain(t, 8, 1)
		var status string
		var events int
		require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), `SELECT status,
			(SELECT count(*) FROM events WHERE subject_id = $1 AND type = 'run.finished') FROM job_runs WHERE id = $1`,
			runID).Scan(&status, &events))
		require.Equal(t, "SUCCEEDED", status)
		require.Equal(t, 1, events)
	}
}

// Concurrent batch reports over two gated endpoints: every job succeeds once
// (a retryable failure first for some), no batch deadlocks on the endpoint
// rows, no claim ever exceeds maxConcurrent, and the running counts return
// to zero.
func TestConcurrentBatchReportsKeepEndpointGates(t *testing.T) {
	t.Parallel()
	const perTool, limit, claimers, maxConc = 300, 10, 6, 8
	b := setup(t, "send_email@1", "send_sms@1")
	ctx := context.Background()
	tools := []jobs.Tool{{Name: "send_email", Version: "1"}, {Name: "send_sms", Version: "1"}}
	var endpointIDs []string
	for _, tool := range tools {
		ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: tool.Name,
			PolicyFields: jobs.PolicyFields{Preset: opt("CUSTOM"), MaxConcurrent: opt[int64](maxConc), MaxAttempts: opt[int64](3),
				InitialDelayMs: opt[int64](1000), Multiplier: opt[float64](1), MaxDelayMs: opt[int64](1000), JitterPercent: opt[float64](0), DefaultTimeoutMs: opt[int64](3_600_000)}})
		require.NoError(t, err)
		endpointIDs = append(endpointIDs, ep.ID)
	}
	runID := b.run(t)
	for _, tool := range tools {
		res, err := b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: tool.Name, Version: tool.Version,
			Input: json.RawMessage(`{"n":0}`)})
		require.NoError(t, err)
		_, err = b.svc.CloneQueued(ctx, res.JobID, ids.Random(3), perTool-1)
		require.NoError(t, err)
	}

	var (
		mu        sync.Mutex
		inFlight  = map[string]int{} // tool name → claimed, not yet reported (a lower bound of RUNNING)
		peak      int
		succeeded = map[string]int{}
		failedYet = map[string]bool{}
	)
	var wg sync.WaitGroup
	errs := make(chan error, claimers)
	for range claimers {
		wid := b.register(t, tools...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for empty := 0; empty < 3; {
				c, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{Limit: ptr(limit)})
				if err != nil {
					errs <- err
					return
				}
				if len(c.Jobs) == 0 {
					// The gates or a retry's due time hold the rest back; a
					// second is the retry delay, far from the hour's lease.
					empty++
					b.clock.Add(time.Second)
					continue
				}
				empty = 0
				var batch jobs.BatchReportRequest
				mu.Lock()
				for _, j := range c.Jobs {
					inFlight[j.Name]++
					peak = max(peak, inFlight[j.Name])
				}
				// Reported in reverse claim order: the server must lock in id order itself.
				for i := len(c.Jobs) - 1; i >= 0; i-- {
					j := c.Jobs[i]
					item := jobs.BatchReportItem{JobID: j.JobID, LeaseToken: j.LeaseToken, Status: jobs.StatusSucceeded,
						Output: json.RawMessage(`{"ok":true}`)}
					if i%3 == 0 && !failedYet[j.JobID] {
						failedYet[j.JobID] = true
						item.Status, item.Output = "FAILED", nil
						item.Error = &jobs.ReportError{Message: "try again"}
					}
					batch.Reports = append(batch.Reports, item)
					inFlight[j.Name]--
				}
				mu.Unlock()
				res, err := b.svc.ReportBatch(ctx, b.worker, batch)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for i, r := range res.Results {
					if r.Error != nil {
						mu.Unlock()
						errs <- fmt.Errorf("report %s: %s", r.JobID, r.Error.Code)
						return
					}
					if batch.Reports[i].Status == jobs.StatusSucceeded {
						require.Equal(t, jobs.StatusSucceeded, r.Status)
						succeeded[r.JobID]++
					} else {
						require.Equal(t, jobs.StatusRetryScheduled, r.Status)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.LessOrEqual(t, peak, maxConc)
	require.Len(t, succeeded, 2*perTool)
	for id, n := range succeeded {
		require.Equal(t, 1, n, id)
	}
	var running, notSucceeded int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT
		(SELECT coalesce(sum(running_count), 0) FROM job_endpoints WHERE id = ANY($1)),
		(SELECT count(*) FROM jobs WHERE run_id = $2 AND status <> 'SUCCEEDED')`, endpointIDs, runID).
		Scan(&running, &notSucceeded))
	require.Zero(t, running)
	require.Zero(t, notSucceeded)
}

// A clone tag outside the id alphabet would make jobs the API cannot name.
func TestCloneQueuedRefusesTagsOutsideTheIDAlphabet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	res, err := b.svc.Enqueue(context.Background(), b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
		Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	for _, tag := range []string{"", "cq1ix", "UPPER", "0123456789abcdefghjkm"} {
		_, err := b.svc.CloneQueued(context.Background(), res.JobID, tag, 1)
		require.Error(t, err, tag)
	}
	// A tag of its own per run: go test -count reruns this in the same database.
	n, err := b.svc.CloneQueued(context.Background(), res.JobID, ids.Random(4)+"x", 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
}

// A report and its retry racing each other (a client that timed out and
// sent it again) both answer the same result: the one that waited for the
// job's lock reads the other's record instead of calling the job ended.
func TestRepeatedReportRacingItsOriginal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	runID := b.run(t)
	const n = 60
	b.fill(t, runID, n)
	claimed := b.claim(t, b.register(t), n)
	require.Len(t, claimed, n)
	var reports []func() error
	for i, j := range claimed {
		req := jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: jobs.StatusSucceeded}
		if i%2 == 1 {
			req = jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED", Error: &jobs.ReportError{Message: "try again"}}
		}
		report := func() error {
			r, err := b.svc.Report(ctx, b.worker, j.JobID, req)
			if err == nil && r.Attempt != 1 {
				err = fmt.Errorf("job %s answered attempt %d", j.JobID, r.Attempt)
			}
			return err
		}
		reports = append(reports, report, report)
	}
	race(t, reports)
	for _, j := range claimed {
		require.Len(t, b.executions(t, j.JobID), 1)
	}
}

// A finish racing the report that ends the run's last step completes the
// run at once, whichever commits first: neither leaves it to the sweeper.
func TestFinishRacingTheLastReportCompletesTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := b.register(t)
	const runs = 60
	type pending struct {
		runID string
		job   jobs.ClaimedJob
	}
	var all []pending
	for i := range runs {
		runID := b.run(t)
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))})
		all = append(all, pending{runID, b.claimOne(t, w)})
	}
	var calls []func() error
	for _, p := range all {
		calls = append(calls, func() error {
			_, err := b.svc.FinishRun(ctx, b.ws, p.runID)
			return err
		}, func() error {
			_, err := b.svc.Report(ctx, b.worker, p.job.JobID, jobs.ReportRequest{LeaseToken: p.job.LeaseToken,
				Status: jobs.StatusSucceeded})
			return err
		})
	}
	race(t, calls)
	for _, p := range all {
		var status string
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT status FROM job_runs WHERE id = $1`, p.runID).Scan(&status))
		require.Equal(t, "SUCCEEDED", status, "run %s", p.runID)
	}
}

// race starts every call at the same moment and requires each to succeed.
func race(t *testing.T, calls []func() error) {
	t.Helper()
	start := make(chan struct{})
	errs := make(chan error, len(calls))
	var wg sync.WaitGroup
	for _, call := range calls {
		wg.Go(func() {
			<-start
			errs <- call()
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// An endpoint's running_count equals its RUNNING jobs and held cancelled
// attempts after every round of claims, reclaims, reports (late ones on
// requeued and cancelled jobs included), heartbeats, cancels, replays and
// two concurrent sweeps, the clock moving minutes a
// round so leases lapse and are requeued. Not parallel: the sweeps are
// global.
func TestRunningCountHoldsUnderRequeueRaces(t *testing.T) {
	b := setup(t, "send_email@1", "send_email@2")
	b.createEndpoint(t, "mailer", jobs.PolicyFields{MaxConcurrent: opt[int64](6)})
	runID := b.run(t)
	var steps []string
	for i := range 60 {
		v := "1"
		if i%3 == 0 {
			v = "2"
		}
		e := b.enqueue(t, runID, jobs.EnqueueRequest{Name: "send_email", Version: v, Endpoint: ptr("mailer"),
			TimeoutMs: ptr[int64](1_000), Input: json.RawMessage(fmt.Sprint(i))})
		steps = append(steps, e.StepID)
	}
	var ws []string
	for i := range 6 {
		v := "1"
		if i%2 == 0 {
			v = "2"
		}
		ws = append(ws, b.register(t, jobs.Tool{Name: "send_email", Version: v}))
	}
	check := func(round int) {
		var rc, actual int
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT e.running_count,
			(SELECT count(*) FROM jobs j WHERE j.endpoint_id = e.id AND j.status = 'RUNNING')
			+ (SELECT count(*) FROM jobs j WHERE j.endpoint_id = e.id AND j.slot_attempt IS NOT NULL)
			FROM job_endpoints e WHERE e.workspace_id = $1 AND e.name = 'mailer'`, b.ws).Scan(&rc, &actual))
		if rc != actual {
			t.Fatalf("round %d: running_count %d, RUNNING jobs and held cancelled attempts %d", round, rc, actual)
		}
	}
	held := map[string]jobs.ClaimedJob{}
	for round := range 40 {
		done := make(chan []jobs.ClaimedJob, len(ws)+4)
		for _, w := range ws {
			go func(w string) {
				lim := 3
				c, err := b.svc.Claim(ctx, b.worker, w, jobs.ClaimRequest{Limit: &lim})
				if err != nil {
					t.Error(err)
				}
				done <- c.Jobs
			}(w)
		}
		// Old holders report / heartbeat concurrently with the sweep.
		olds := make([]jobs.ClaimedJob, 0, len(held))
		for _, j := range held {
			olds = append(olds, j)
		}
		go func() {
			for i, j := range olds {
				switch i % 4 {
				case 0:
					_, _ = b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "SUCCEEDED"})
				case 1:
					_, _ = b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED"})
				case 2:
					_, _ = b.svc.Heartbeat(ctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
				}
			}
			done <- nil
		}()
		go func() { b.env.App.Sweeper.RunOnce(ctx); done <- nil }()
		go func() {
			if round%5 == 0 {
				_, _ = b.svc.CancelStep(ctx, b.ws, steps[round])
			}
			if round%5 == 1 {
				_, _ = b.svc.Replay(ctx, b.worker, steps[round-1], jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
			}
			done <- nil
		}()
		go func() { b.env.App.Sweeper.RunOnce(ctx); done <- nil }()
		held = map[string]jobs.ClaimedJob{}
		for range len(ws) + 4 {
			for _, j := range <-done {
				held[j.JobID] = j
			}
		}
		check(round)
		b.clock.Add(time.Duration(round%4) * 3 * time.Minute)
	}
}

// A report batch and a replay of one of its jobs, at the same moment, both
// answer: the batch locks all its jobs before any run lock, so it never
// holds the run's lock while waiting for a job the replay holds (the replay
// waiting for that run's lock meanwhile: one of them failed, deadlocked).
func TestBatchReportAndReplayDoNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t, "send_email@1", "send_email@2")
	runID := b.run(t)
	w1 := b.register(t)
	w2 := b.register(t, jobs.Tool{Name: "send_email", Version: "2"})
	for i := range 60 {
		// Two jobs of one run, ids ascending: the first RUNNING, the second ended.
		e1 := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))})
		b.clock.Add(time.Millisecond)
		e2 := b.enqueue(t, runID, jobs.EnqueueRequest{Name: "send_email", Version: "2", Input: json.RawMessage(fmt.Sprint(i))})
		c2 := b.claimOne(t, w2)
		b.fail(t, c2, &jobs.ReportError{Message: "no", Retryable: ptr(false)})
		c1 := b.claimOne(t, w1)
		require.Equal(t, e1.JobID, c1.JobID)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var batchErr, replayErr error
		wg.Go(func() {
			<-start
			_, batchErr = b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: []jobs.BatchReportItem{
				{JobID: c1.JobID, LeaseToken: c1.LeaseToken, Status: "SUCCEEDED"},
				{JobID: c2.JobID, LeaseToken: c2.LeaseToken, Status: "FAILED",
					Error: &jobs.ReportError{Message: "no", Retryable: ptr(false)}}}})
		})
		wg.Go(func() {
			<-start
			_, replayErr = b.svc.Replay(ctx, b.worker, e2.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
		})
		close(start)
		wg.Wait()
		require.NoError(t, batchErr, "iteration %d", i)
		if _, refused := apierr.As(replayErr); replayErr != nil && !refused {
			t.Fatalf("iteration %d: replay: %v", i, replayErr)
		}
		if b.step(t, e2.StepID).Status == "QUEUED" { // replayed: end it again
			b.fail(t, b.claimOne(t, w2), &jobs.ReportError{Message: "no", Retryable: ptr(false)})
		}
	}
}

// An enqueue holds its run's row (FOR SHARE) when its foreign-key check
// locks the job's endpoint (KEY SHARE); a report that exhausts a step holds
// endpoint rows (a breaker to count, a concurrency slot to free) when it
// settles the run. Endpoint rows are locked FOR NO KEY UPDATE, which the
// foreign-key check does not wait for, so the two cannot deadlock (review:
// with FOR UPDATE one of them answered 500). Here the enqueue's two locks
// are taken by hand, in its order, around a report waiting for the run.
// Not parallel: it watches pg_stat_activity for the report's wait.
func TestEnqueueAndAnExhaustingReportDoNotDeadlock(t *testing.T) {
	for _, gate := range []string{"circuit", "maxConcurrent"} {
		t.Run(gate, func(t *testing.T) {
			b := setup(t)
			fields := jobs.PolicyFields{MaxConcurrent: opt[int64](5)}
			if gate == "circuit" {
				fields = jobs.PolicyFields{CircuitFailureThreshold: opt[int64](100)}
			}
			ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "send_email",
				PolicyFields: fields})
			require.NoError(t, err)
			runID := b.run(t)
			b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`), MaxAttempts: ptr[int64](1)})
			j := b.claimOne(t, b.register(t))

			pool := b.env.App.Pool
			enq, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = enq.Rollback(ctx) }()
			_, err = enq.Exec(ctx, `SELECT 1 FROM job_runs WHERE id = $1 FOR SHARE`, runID)
			require.NoError(t, err)

			reported := make(chan error, 1)
			go func() {
				_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
					Status: "FAILED", Error: &jobs.ReportError{Message: "503"}})
				reported <- err
			}()
			waitForLock(t, pool, `%UPDATE job_runs r SET%`, "the report settles the run, waiting for the enqueue")
			_, err = enq.Exec(ctx, `SELECT 1 FROM job_endpoints WHERE id = $1 FOR KEY SHARE`, ep.ID)
			require.NoError(t, err, "the foreign-key check does not wait for the report's endpoint lock")
			require.NoError(t, enq.Commit(ctx))
			require.NoError(t, <-reported)
			require.Equal(t, "FAILED", b.getRun(t, runID).Status)
		})
	}
}

// The same race through the service alone: enqueues into a run while its
// step is reported exhausted, on an endpoint whose breaker counts.
func TestEnqueuesRacingAnExhaustingReport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEndpoint(t, "send_email", jobs.PolicyFields{CircuitFailureThreshold: opt[int64](1000), MaxConcurrent: opt[int64](1000)})
	w := b.register(t)
	var (
		mu   sync.Mutex
		errs []error
	)
	keep := func(err error) {
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	for range 30 {
		runID := b.run(t)
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`0`), MaxAttempts: ptr[int64](1)})
		j := b.claimOne(t, w)
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				// Version 2: the same endpoint, never claimed by the v1 worker.
				_, err := b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "2",
					Input: json.RawMessage(fmt.Sprint(i + 1))})
				keep(err)
			}
		}()
		go func() {
			defer wg.Done()
			defer close(done)
			_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
				Status: "FAILED", Error: &jobs.ReportError{Message: "503"}})
			keep(err)
		}()
		wg.Wait()
		require.Equal(t, "FAILED", b.getRun(t, runID).Status)
	}
	require.Empty(t, errs)
}

// A replay unskips the failed step's dependents before it reopens the run:
// job rows before the run's row, the order an enqueue naming one of those
// dependents takes them (its dependency's row, then the run's FOR SHARE).
// The other order deadlocked (review). The enqueue's two locks are taken by
// hand around the replay. Not parallel: it watches pg_stat_activity.
func TestReplayAndAnEnqueueAfterASkippedStepDoNotDeadlock(t *testing.T) {
	b := setup(t)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`), MaxAttempts: ptr[int64](1)})
	s := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"s"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	b.fail(t, b.claimOne(t, b.register(t)), &jobs.ReportError{Message: "boom"})
	require.Equal(t, "FAILED", b.getRun(t, runID).Status)
	require.Equal(t, "SKIPPED", b.step(t, s.StepID).Status)

	pool := b.env.App.Pool
	enq, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = enq.Rollback(ctx) }()
	// jobs_enqueue with afterStepId s: its dependency's row first (0081).
	_, err = enq.Exec(ctx, `SELECT 1 FROM jobs d WHERE d.step_id = $1 FOR NO KEY UPDATE OF d`, s.StepID)
	require.NoError(t, err)
	replayed := make(chan error, 1)
	go func() {
		_, err := b.svc.Replay(ctx, b.worker, a.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
		replayed <- err
	}()
	waitForLock(t, pool, `%SKIPPED%`, "the replay waits to unskip s")
	// Then the run's row: free, since the replay has not reopened it yet.
	_, err = enq.Exec(ctx, `SELECT 1 FROM job_runs r WHERE r.id = $1 FOR SHARE OF r`, runID)
	require.NoError(t, err)
	require.NoError(t, enq.Commit(ctx))
	require.NoError(t, <-replayed)
	require.Equal(t, "RUNNING", b.getRun(t, runID).Status)
	require.Equal(t, "WAITING", b.step(t, s.StepID).Status)
}

// A step enqueued below a step of a skip chain while the chain is being
// decided is decided too: the cascade's one statement cannot see it (the
// enqueue committed after its snapshot), so the newly skipped steps are
// released again (review). The enqueue runs jobs_enqueue by hand and
// commits once the report's cascade waits for it. Not parallel: it watches
// pg_stat_activity.
func TestASkipCascadeDecidesAStepEnqueuedBelowItMeanwhile(t *testing.T) {
	b := setup(t)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`)})
	w := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"w"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("FAILED")})
	j := b.claimOne(t, b.register(t))

	pool := b.env.App.Pool
	enq, x, status := b.enqueueHeld(t, runID, w.StepID)
	require.Equal(t, "WAITING", status)
	reported := make(chan error, 1)
	go func() {
		_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "SUCCEEDED"})
		reported <- err
	}()
	waitForLock(t, pool, `%UPDATE jobs j SET%`, "the cascade waits for the enqueue's lock on w")
	require.NoError(t, enq.Commit(ctx))
	require.NoError(t, <-reported)
	require.Equal(t, "SKIPPED", b.step(t, w.StepID).Status)
	require.Equal(t, "SKIPPED", b.step(t, x).Status, "x waits for w, which was skipped")
	run, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	require.Equal(t, "SUCCEEDED", run.Status)
}

// A step enqueued below a skipped dependent of the replayed step while the
// replay unskips (the enqueue held that dependent's row, found it SKIPPED
// and so skipped the new step, and committed after the unskip's snapshot)
// is put back to WAITING too: the unskip runs again for the steps it put
// back (review: it stayed SKIPPED for good). Not parallel: it watches
// pg_stat_activity.
func TestAReplayUnskipsAStepEnqueuedBelowItMeanwhile(t *testing.T) {
	b := setup(t)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`), MaxAttempts: ptr[int64](1)})
	s := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"s"`), AfterStepID: &a.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	w := b.register(t)
	b.fail(t, b.claimOne(t, w), &jobs.ReportError{Message: "boom"})
	require.Equal(t, "SKIPPED", b.step(t, s.StepID).Status)

	pool := b.env.App.Pool
	enq, x, status := b.enqueueHeld(t, runID, s.StepID)
	require.Equal(t, "SKIPPED", status, "its dependency is skipped")
	replayed := make(chan error, 1)
	go func() {
		_, err := b.svc.Replay(ctx, b.worker, a.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
		replayed <- err
	}()
	waitForLock(t, pool, `%WITH RECURSIVE skipped%`, "the replay waits to unskip s")
	require.NoError(t, enq.Commit(ctx))
	require.NoError(t, <-replayed)
	require.Equal(t, "WAITING", b.step(t, s.StepID).Status)
	require.Equal(t, "WAITING", b.step(t, x).Status, "x waits for s again")
	b.succeed(t, b.claimOne(t, w)) // a
	b.succeed(t, b.claimOne(t, w)) // s
	require.Equal(t, "QUEUED", b.step(t, x).Status, "x runs after s")
}

// enqueueHeld runs jobs_enqueue by hand in a transaction it leaves open (the
// caller commits; the test's end rolls back what it did not): a step of
// runID, waiting for afterStepID to succeed, whose locks a test can hold
// across another request. It answers the transaction, the step's id and
// the status it was given.
func (b *bundle) enqueueHeld(t *testing.T, runID, afterStepID string) (pgx.Tx, string, string) {
	t.Helper()
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	stepID := ids.New(ids.Step)
	var outcome, status string
	require.NoError(t, tx.QueryRow(ctx, `SELECT outcome, status FROM jobs_enqueue($1, $2, $3, '\x00'::bytea,
		'send_email', '1', 'send_email', $4, 'SUCCEEDED', NULL, true, NULL, NULL, $5, $3, '\x00'::bytea, '{}'::jsonb,
		now())`, b.ws, runID, stepID, afterStepID, ids.New(ids.Job)).Scan(&outcome, &status))
	require.Equal(t, "inserted", outcome)
	return tx, stepID, status
}

// waitForLock waits until a statement of this database whose text matches
// like (a LIKE pattern) waits for a lock: the other side of a race a test
// stages by hand has reached it.
func waitForLock(t *testing.T, pool *pgxpool.Pool, like, why string) {
	t.Helper()
	waitForLockEvent(t, pool, like, "%", why)
}

// waitForAdvisoryLock is waitForLock for a wait on an advisory lock (an
// endpoint's gate lock, say).
func waitForAdvisoryLock(t *testing.T, pool *pgxpool.Pool, like, why string) {
	t.Helper()
	waitForLockEvent(t, pool, like, "advisory", why)
}

func waitForLockEvent(t *testing.T, pool *pgxpool.Pool, like, event, why string) {
	t.Helper()
	apitest.WaitForLock(t, pool, like, event, why)
}

// limitedRun creates the endpoint send_email with a concurrency limit and
// a run holding two of its jobs, and answers the endpoint and the run.
func limitedRun(t *testing.T, b *bundle) (jobs.Endpoint, string) {
	t.Helper()
	ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "send_email",
		PolicyFields: jobs.PolicyFields{MaxConcurrent: opt[int64](5)}})
	require.NoError(t, err)
	runID := b.run(t)
	for i := range 2 {
		b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))})
	}
	return ep, runID
}

// olderVersionStaged stages, on endpoint ep, what made claims and reports
// deadlock (concurrency QA; before migration 0047): an enqueue's
// foreign-key check holds KEY SHARE on the endpoint's row, and another
// transaction has updated the row (a newer version) and is still open. A
// statement that begins now reads the row's older version. It answers the
// open update, to commit when the test is ready, and a wait until at least
// n of this database's statements matching a LIKE pattern wait for a lock.
func olderVersionStaged(t *testing.T, b *bundle, ep jobs.Endpoint) (pgx.Tx, func(like string, n int, why string)) {
	t.Helper()
	pool := b.env.App.Pool
	enq, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = enq.Rollback(context.Background()) })
	_, err = enq.Exec(ctx, `SELECT 1 FROM job_endpoints WHERE id = $1 FOR KEY SHARE`, ep.ID)
	require.NoError(t, err)
	upd, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = upd.Rollback(context.Background()) })
	_, err = upd.Exec(ctx, `UPDATE job_endpoints SET updated_at = updated_at WHERE id = $1`, ep.ID)
	require.NoError(t, err)
	waiting := func(like string, n int, why string) {
		t.Helper()
		require.Eventually(t, func() bool {
			var count int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, like).Scan(&count))
			return count >= n
		}, 10*time.Second, 5*time.Millisecond, why)
	}
	return upd, waiting
}

// runningCount reads an endpoint's count of running jobs.
func runningCount(t *testing.T, b *bundle, endpointID string) int {
	t.Helper()
	var n int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT running_count FROM job_endpoints WHERE id = $1`,
		endpointID).Scan(&n))
	return n
}

// meetOnTheOlderVersion stages olderVersionStaged on ep, runs first (a
// report or a sweep) until a statement of it matching like waits for the
// open update, then between, if any, then a claim of want jobs by worker
// until it waits too; it commits the update and requires neither first nor
// the claim to be a deadlock's victim, and the claim to lease want jobs.
func meetOnTheOlderVersion(t *testing.T, b *bundle, ep jobs.Endpoint, like string, first func() error,
	between func(), worker string, want int) {
	t.Helper()
	upd, waiting := olderVersionStaged(t, b, ep)
	done, claimed := make(chan error, 1), make(chan error, 1)
	go func() { done <- first() }()
	waiting(like, 1, "the first waits for the update")
	if between != nil {
		between()
	}
	go func() {
		r, err := b.svc.Claim(ctx, b.worker, worker, jobs.ClaimRequest{Limit: ptr(want)})
		if err == nil && len(r.Jobs) != want {
			err = fmt.Errorf("claimed %d jobs", len(r.Jobs))
		}
		claimed <- err
	}()
	waiting(`%jobs_claim_keyed%`, 1, "the claim waits too")
	require.NoError(t, upd.Commit(ctx))
	require.NoError(t, <-done, "the first is no deadlock's victim")
	require.NoError(t, <-claimed, "nor the claim")
}

// sweepOnce runs the sweeper once, answering its error.
func sweepOnce(b *bundle) func() error {
	return func() error { return b.env.App.Sweeper.RunOnce(ctx).Error() }
}

// Two claims meet the row's older version (olderVersionStaged). Each locks
// the row's newest version; the first must then count its grant on the
// row. Counted in the statement that locked the row, the update read the
// row with that statement's older snapshot and met the older version, which
// (its KEY SHARE still live) it could update only after taking that
// version's tuple lock, held by the second claim while it waited for the
// first: a deadlock, Postgres failing one. Counted in a statement of its
// own, it sees the newest version, and both claims lease. Run without the
// retry a deadlock's victim gets; not parallel: it watches pg_stat_activity.
func TestClaimsMeetingAnEndpointRowsOlderVersionDoNotDeadlock(t *testing.T) {
	b := setup(t)
	jobs.SetDeadlockRetry(b.svc, false)
	ep, _ := limitedRun(t, b)
	w1, w2 := b.register(t), b.register(t)
	upd, waiting := olderVersionStaged(t, b, ep)

	claims := make(chan jobs.ClaimResult, 2)
	errs := make(chan error, 2)
	claim := func(worker string) {
		r, err := b.svc.Claim(ctx, b.worker, worker, jobs.ClaimRequest{})
		claims <- r
		errs <- err
	}
	go claim(w1)
	waiting(`%jobs_claim_keyed%`, 1, "the first claim waits for the update")
	go claim(w2)
	waiting(`%jobs_claim_keyed%`, 2, "the second claim waits too")
	require.NoError(t, upd.Commit(ctx))
	for range 2 {
		require.NoError(t, <-errs, "no claim is a deadlock's victim")
		require.Len(t, (<-claims).Jobs, 1)
	}
	require.Equal(t, 2, runningCount(t, b, ep.ID), "each grant counted once")
}

// A report and a claim meet the row's older version (olderVersionStaged):
// the report frees its job's slot on the row, the claim waits for the
// report on the row's newest version. The report's statement that freed
// the slot locked the row too, and met the older version as the claims
// above did: a deadlock. The report now locks its endpoints' rows in its
// first statement (sqlReportLock), so the statement that frees the slot
// begins after the lock and sees the newest version.
func TestAReportAndAClaimMeetingAnEndpointRowsOlderVersionDoNotDeadlock(t *testing.T) {
	b := setup(t)
	jobs.SetDeadlockRetry(b.svc, false)
	ep, _ := limitedRun(t, b)
	w1, w2 := b.register(t), b.register(t)
	running := b.claimOne(t, w1)
	meetOnTheOlderVersion(t, b, ep, `%jobs_report%`, func() error {
		_, err := b.svc.Report(ctx, b.worker, running.JobID, jobs.ReportRequest{LeaseToken: running.LeaseToken,
			Status: "SUCCEEDED"})
		return err
	}, nil, w2, 1)
	require.Equal(t, 1, runningCount(t, b, ep.ID), "one slot freed, one taken")
}

// A sweep and a claim meet the row's older version (olderVersionStaged):
// the sweep ends a job whose last attempt's lease lapsed, freeing its slot
// on the row, and the claim waits for the sweep on the row's newest
// version. The sweep's statement that frees the slot also locked the row,
// and met the older version as the claims above did: a deadlock. The sweep
// now locks the rows with its gate locks, in the statement before, so the
// statement that frees the slot sees the newest version.
func TestASweepAndAClaimMeetingAnEndpointRowsOlderVersionDoNotDeadlock(t *testing.T) {
	b := setup(t)
	jobs.SetDeadlockRetry(b.svc, false)
	ep := limitedCustom(t, b, "send_email", 1)
	runID := b.run(t)
	lapsing := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("send_email")})
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("send_email"), Input: json.RawMessage(`1`)})
	w1, w2 := b.register(t), b.register(t)
	b.claimOne(t, w1)
	b.clock.Add(time.Minute)
	meetOnTheOlderVersion(t, b, ep, `%lapse gates%`, sweepOnce(b), nil, w2, 1)
	// The claim's scan may hold the lapsing job's row (SKIP LOCKED) as the
	// sweep picks its candidates, which skip it likewise: the next pass ends
	// it (it read RUNNING once in a fresh-clone CI at load 16). What this
	// test is for, no deadlock, is settled above.
	require.NoError(t, sweepOnce(b)())
	require.Equal(t, "EXHAUSTED", b.step(t, lapsing.StepID).Status)
	require.Equal(t, 1, runningCount(t, b, ep.ID), "one slot freed, one taken")
}

// limitedCustom creates endpoint name with a concurrency limit of 5 and a
// CUSTOM policy of maxAttempts attempts, each timing out after a second.
func limitedCustom(t *testing.T, b *bundle, name string, maxAttempts int64) jobs.Endpoint {
	t.Helper()
	ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: name,
		PolicyFields: jobs.PolicyFields{Preset: opt("CUSTOM"), MaxConcurrent: opt[int64](5),
			MaxAttempts: opt(maxAttempts), InitialDelayMs: opt[int64](1000), Multiplier: opt[float64](1),
			MaxDelayMs: opt[int64](1000), JitterPercent: opt[float64](0), DefaultTimeoutMs: opt[int64](1000)}})
	require.NoError(t, err)
	return ep
}

// The requeue of a long-lapsed lease frees its slot as the end of a last
// attempt does (the test above): it too locks the endpoint's row in the
// statement before the one that frees the slot (review: only the exhaust
// path was tested).
func TestARequeueAndAClaimMeetingAnEndpointRowsOlderVersionDoNotDeadlock(t *testing.T) {
	b := setup(t)
	jobs.SetDeadlockRetry(b.svc, false)
	ep := limitedCustom(t, b, "send_email", 3)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("send_email")})
	w1, w2 := b.register(t), b.register(t)
	b.claimOne(t, w1)
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("send_email"), Input: json.RawMessage(`1`)})
	b.clock.Add(jobs.RequeueLapsedAfter + time.Minute)
	meetOnTheOlderVersion(t, b, ep, `%lapse gates%`, sweepOnce(b), nil, w2, 1)
	require.Equal(t, 1, runningCount(t, b, ep.ID), "one slot freed, one taken")
}

// A sweep takes only candidates of the endpoints its first statement locked
// (lapseGates). One that came since on another endpoint (a running job
// cancelled between the sweep's statements, its lease lapsed: its held slot
// is due at once) is left to the next sweep: locked by the freeing
// statement, after the rows the sweep held, its row was taken out of id
// order, and a claim holding it and waiting for one of those deadlocked
// with the sweep (review). Endpoints a < z: the sweep holds z, waiting for
// an open update; a's job is cancelled; a claim locks a and waits for z.
func TestASweepLeavesACandidateOfAnEndpointItDidNotLock(t *testing.T) {
	b := setup(t)
	jobs.SetDeadlockRetry(b.svc, false)
	a, z := limitedCustom(t, b, "ep_a", 3), limitedCustom(t, b, "ep_z", 3)
	if a.ID > z.ID {
		a, z = z, a
	}
	runID := b.run(t)
	onZ := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(z.Name), Input: json.RawMessage(`"z1"`)})
	onA := b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(a.Name), Input: json.RawMessage(`"a1"`)})
	w1, w2 := b.register(t), b.register(t)
	require.Len(t, b.claim(t, w1, 2), 2)
	_, err := b.svc.CancelStep(ctx, b.ws, onZ.StepID)
	require.NoError(t, err)
	b.clock.Add(time.Minute)
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(a.Name), Input: json.RawMessage(`"a2"`)})
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(z.Name), Input: json.RawMessage(`"z2"`)})
	meetOnTheOlderVersion(t, b, z, `%lapse gates%`, sweepOnce(b), func() {
		_, err := b.svc.CancelStep(ctx, b.ws, onA.StepID) // between the sweep's statements
		require.NoError(t, err)
	}, w2, 2)
	// The next sweep frees a's held slot: the count is the claim's job alone.
	b.sweep(t)
	require.Equal(t, 1, runningCount(t, b, a.ID), "a's held slot freed by the next sweep")
}

// A policy write that sets a limit on endpoint a commits while the sweep's
// first statement waits for a's gate lock. That statement's snapshot
// predates the write: locking only the rows of endpoints with a limit, it
// left a's row to the freeing statement, which locked it after z's, out of
// id order, and deadlocked with a claim holding a and waiting for z
// (second review). The first statement now locks every one of its
// endpoints' rows.
func TestASweepLocksTheRowOfAnEndpointLimitedWhileItWaited(t *testing.T) {
	b := setup(t)
	jobs.SetDeadlockRetry(b.svc, false)
	a, z, _, w2 := aLimitAboutToBeSet(t, b, 1, func() {
		b.clock.Add(time.Minute) // both lapsed on their last attempt
	})
	pol := policyWriteHeldOpen(t, b, a.ID, 5)
	meetOnTheOlderVersion(t, b, z, `%lapse gates%`, func() error {
		done := make(chan error, 1)
		go func() { done <- sweepOnce(b)() }()
		waitForAdvisoryLock(t, b.env.App.Pool, `%lapse gates%`, "the sweep's gates wait for the policy write")
		require.NoError(t, pol.Commit(ctx))
		return <-done
	}, nil, w2, 2)
}

// The report's twin of the test above. A policy write that sets a limit on
// endpoint a commits while a report batch's first statement waits for a's
// gate lock. That statement read the endpoints with a snapshot taken before
// the write: it locked z's row, not a's, which the freeing statement then
// locked after z's, out of id order, and deadlocked with a claim holding a
// and waiting for z (sixth review). The first statement now chooses the
// rows to lock after its gate locks (jobs_report_lock_endpoints).
func TestAReportLocksTheRowOfAnEndpointLimitedWhileItWaited(t *testing.T) {
	b := setup(t)
	jobs.SetDeadlockRetry(b.svc, false)
	a, z, running, w2 := aLimitAboutToBeSet(t, b, 3, func() {})
	pol := policyWriteHeldOpen(t, b, a.ID, 5)
	var batch jobs.BatchReportRequest
	for _, j := range running {
		batch.Reports = append(batch.Reports, jobs.BatchReportItem{JobID: j.JobID, LeaseToken: j.LeaseToken,
			Status: jobs.StatusSucceeded})
	}
	meetOnTheOlderVersion(t, b, z, `%jobs_report%`, func() error {
		done := make(chan error, 1)
		go func() {
			res, err := b.svc.ReportBatch(ctx, b.worker, batch)
			for _, r := range res.Results {
				if err == nil && r.Error != nil {
					err = fmt.Errorf("report %s: %s", r.JobID, r.Error.Code)
				}
			}
			done <- err
		}()
		waitForAdvisoryLock(t, b.env.App.Pool, `%jobs_report%`, "the report's gates wait for the policy write")
		require.NoError(t, pol.Commit(ctx))
		return <-done
	}, nil, w2, 2)
	require.Equal(t, 1, runningCount(t, b, a.ID), "a counts the claim's job alone")
}

// aLimitAboutToBeSet stages what the two tests above share: endpoints a < z
// with CUSTOM policies of maxAttempts attempts, z with a concurrency limit
// and a without one (yet), a job of each claimed by one worker (answered),
// then, after between, one more job of each queued. It answers a, z, the
// claimed jobs and a second worker.
func aLimitAboutToBeSet(t *testing.T, b *bundle, maxAttempts int64, between func()) (a, z jobs.Endpoint,
	running []jobs.ClaimedJob, w2 string) {
	t.Helper()
	a, z = limitedCustom(t, b, "ep_a", maxAttempts), limitedCustom(t, b, "ep_z", maxAttempts)
	if a.ID > z.ID {
		a, z = z, a
	}
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE job_endpoints SET max_concurrent = NULL WHERE id = $1`, a.ID)
	require.NoError(t, err)
	runID := b.run(t)
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(a.Name), Input: json.RawMessage(`"a1"`)})
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(z.Name), Input: json.RawMessage(`"z1"`)})
	w1 := b.register(t)
	w2 = b.register(t)
	running = b.claim(t, w1, 2)
	require.Len(t, running, 2)
	between()
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(a.Name), Input: json.RawMessage(`"a2"`)})
	b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr(z.Name), Input: json.RawMessage(`"z2"`)})
	return a, z, running, w2
}

// policyWriteHeldOpen makes, on endpoint endpointID, the policy write that
// sets a concurrency limit as UpdatePolicy makes it (the gate lock, the
// limit, the recount), and answers it open, to commit when the test is ready.
func policyWriteHeldOpen(t *testing.T, b *bundle, endpointID string, limit int) pgx.Tx {
	t.Helper()
	pol, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pol.Rollback(context.Background()) })
	_, err = pol.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`, endpointID)
	require.NoError(t, err)
	_, err = pol.Exec(ctx, `UPDATE job_endpoints SET max_concurrent = $2::int, version = version + 1,
		running_count = (SELECT count(*) FROM jobs WHERE endpoint_id = $1::text AND status = 'RUNNING')
		WHERE id = $1::text`, endpointID, limit)
	require.NoError(t, err)
	return pol
}

// An endpoint with maxConcurrent under chaos: workers claim and work their
// jobs for a while by the test's clock, heartbeating (some too seldom, some
// never) and reporting successes and failures (singly and in batches), or
// abandon them; a chaos loop cancels and replays steps, mostly running
// ones (and cancels some again); a sweeper loop moves the clock, so leases
// lapse, are requeued and reclaimed, and late heartbeats revive some.
// Checked after every claim and by a loop throughout, each in one snapshot:
// the attempts that may be running (the endpoint's executions with no
// outcome whose lease has not expired: RUNNING jobs and cancelled attempts
// holding their slot) never exceed the limit, and running_count always
// equals the RUNNING jobs plus the held slots, and no job ever has two
// attempts open (without an outcome) at once. At quiescence, once every
// lease lapses, the count is zero, and the jobs left are all worked through
// the endpoint (no slot leaked). Few jobs, so that a replayed one is soon
// first in the queue: without migration 0052's wait for a held slot, this
// finds four attempts at a limit of three within seconds. Not parallel: the
// sweeps are global and the clock moves past other tests' leases.
func TestEndpointSlotsHoldUnderCancelAndReplayChaos(t *testing.T) {
	const (
		limit       = 3
		runs, steps = 3, 8 // few: a replayed job is soon the queue's first
		workers     = 10
		chaosOps    = 150
		sweeps      = 150              // the workers work until the chaos and the sweeps are done
		lease       = 11 * time.Second // timeoutMs 1 000 and apitest's 10 s grace
	)
	b := setup(t)
	ep := b.limitedEndpoint(t, "mailer", limit)
	var stepIDs []string
	for r := range runs {
		runID := b.run(t)
		for i := range steps {
			stepIDs = append(stepIDs, b.enqueue(t, runID, jobs.EnqueueRequest{Endpoint: ptr("mailer"),
				TimeoutMs: ptr[int64](1_000), MaxAttempts: ptr[int64](10), Input: json.RawMessage(fmt.Sprint(r*steps + i))}).StepID)
		}
	}

	hctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var fails []string
	failf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(fails) < 20 {
			fails = append(fails, fmt.Sprintf(format, args...))
		}
		cancel()
	}
	// refused is an error the API answers on purpose (a lease lost, a step
	// in another state); anything else (a deadlock, a 500) fails the test.
	refused := func(what string, err error) bool {
		if err == nil {
			return false
		}
		if e, ok := apierr.As(err); ok && e.Code != apierr.CodeInternal && e.Code != apierr.CodeDatabaseUnavailable {
			return true
		}
		if hctx.Err() == nil {
			failf("%s: %v", what, err)
		}
		return true
	}
	check := func(when string) {
		now := b.clock.Now() // read first: the clock only moves on, so no lease is missed
		var count, recount, mayRun, overlapping int
		err := b.env.App.Pool.QueryRow(hctx, `SELECT e.running_count,
			(SELECT count(*) FROM jobs j WHERE j.endpoint_id = e.id AND j.status = 'RUNNING')
			+ (SELECT count(*) FROM jobs j WHERE j.endpoint_id = e.id AND j.slot_attempt IS NOT NULL),
			(SELECT count(*) FROM job_executions x WHERE x.endpoint_id = e.id AND x.outcome IS NULL
			   AND x.lease_expires_at > $2),
			(SELECT count(*) FROM (SELECT x.job_id FROM job_executions x WHERE x.endpoint_id = e.id
			   AND x.outcome IS NULL GROUP BY x.job_id HAVING count(*) > 1) o)
			FROM job_endpoints e WHERE e.id = $1`, ep.ID, now).Scan(&count, &recount, &mayRun, &overlapping)
		switch {
		case err != nil:
			if hctx.Err() == nil {
				failf("%s: check: %v", when, err)
			}
		case mayRun > limit:
			failf("%s: %d attempts may be running on an endpoint limited to %d", when, mayRun, limit)
		case overlapping > 0:
			// A claim supersedes an attempt only once it ended (reported,
			// or failed as lapsed by that claim or the sweeper): never
			// two open attempts of one job (migration 0060).
			failf("%s: %d jobs have two attempts open at once", when, overlapping)
		case count != recount:
			failf("%s: running_count %d, RUNNING jobs and held slots %d", when, count, recount)
		}
	}

	// work is a claimed job as its worker runs it, by the test's clock.
	type work struct {
		jobs.ClaimedJob
		done, nextBeat time.Time
		beat           time.Duration // 0: never
	}
	var claims, reports, beats, lost, cancelsSeen, heldReplays atomic.Int64
	var wg, chaos sync.WaitGroup
	stop := make(chan struct{})
	for w := range workers {
		wid := b.register(t)
		rng := rand.New(rand.NewPCG(uint64(w), 7))
		wg.Go(func() {
			var held []work
			var batch []jobs.BatchReportItem
			report := func(j jobs.ClaimedJob, status string, e *jobs.ReportError) {
				reports.Add(1)
				if rng.IntN(3) == 0 {
					batch = append(batch, jobs.BatchReportItem{JobID: j.JobID, LeaseToken: j.LeaseToken, Status: status,
						Error: e})
					return
				}
				_, err := b.svc.Report(hctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
					Status: status, Error: e})
				refused("report", err)
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				if len(held) < 2 {
					c, err := b.svc.Claim(hctx, b.worker, wid, jobs.ClaimRequest{Limit: ptr(1 + rng.IntN(2))})
					if !refused("claim", err) {
						now := b.clock.Now()
						for _, j := range c.Jobs {
							claims.Add(1)
							if rng.IntN(10) == 0 {
								continue // abandoned: its lease lapses
							}
							beat := []time.Duration{0, 4 * time.Second, 8 * time.Second, 15 * time.Second}[rng.IntN(4)]
							held = append(held, work{ClaimedJob: j, beat: beat, nextBeat: now.Add(beat),
								done: now.Add(time.Duration(rng.IntN(16_000)) * time.Millisecond)})
						}
					}
					check("after a claim")
				}
				now := b.clock.Now()
				var keep []work
				for _, j := range held {
					switch {
					case !now.Before(j.done):
						if rng.IntN(4) == 0 {
							report(j.ClaimedJob, "FAILED", &jobs.ReportError{Message: "try later"})
						} else {
							report(j.ClaimedJob, "SUCCEEDED", nil)
						}
					case j.beat > 0 && !now.Before(j.nextBeat):
						beats.Add(1)
						hb, err := b.svc.Heartbeat(hctx, b.worker, j.JobID, jobs.HeartbeatRequest{LeaseToken: j.LeaseToken})
						switch {
						case refused("heartbeat", err):
							lost.Add(1) // the lease lost or the attempt over: stop
						case hb.CancelRequested:
							cancelsSeen.Add(1)
							report(j.ClaimedJob, "FAILED", &jobs.ReportError{Message: "stopped: cancelled"})
						default:
							j.nextBeat = now.Add(j.beat)
							keep = append(keep, j)
						}
					default:
						keep = append(keep, j)
					}
				}
				held = keep
				if len(batch) > 0 {
					_, err := b.svc.ReportBatch(hctx, b.worker, jobs.BatchReportRequest{Reports: batch})
					refused("batch report", err)
					batch = nil
				}
				time.Sleep(2 * time.Millisecond) // at work while the clock moves
			}
		})
	}
	// cancelOnceClaimed watches a step a while and cancels it once its job
	// is claimed again.
	cancelOnceClaimed := func(st string) {
		for range 20 {
			var status string
			if err := b.env.App.Pool.QueryRow(hctx, `SELECT status FROM jobs WHERE step_id = $1`, st).Scan(&status); err != nil {
				return
			}
			if status == jobs.StatusRunning {
				_, err := b.svc.CancelStep(hctx, b.ws, st)
				refused("cancel once claimed", err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	chaos.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		var replayedHeld []string // steps replayed while their cancelled attempt held its slot
		for range chaosOps {
			if hctx.Err() != nil {
				return
			}
			// A step at work (its attempt holds a slot once cancelled), or
			// one replayed while an attempt held its slot (claimed since,
			// a cancel now would free the new attempt's slot at once:
			// migration 0052), or any step.
			st := stepIDs[rng.IntN(len(stepIDs))]
			switch n := rng.IntN(8); {
			case n < 2 && len(replayedHeld) > 0:
				st = replayedHeld[rng.IntN(len(replayedHeld))]
			case n < 6:
				err := b.env.App.Pool.QueryRow(hctx, `SELECT step_id FROM jobs WHERE endpoint_id = $1 AND status = 'RUNNING'
					ORDER BY id OFFSET $2 LIMIT 1`, ep.ID, rng.IntN(limit)).Scan(&st)
				if err != nil && !errors.Is(err, pgx.ErrNoRows) && hctx.Err() == nil {
					failf("pick a running step: %v", err)
				}
			}
			_, err := b.svc.CancelStep(hctx, b.ws, st)
			refused("cancel", err)
			if rng.IntN(10) < 7 {
				_, err = b.svc.Replay(hctx, b.worker, st, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
				if !refused("replay", err) {
					var held bool
					if err := b.env.App.Pool.QueryRow(hctx, `SELECT slot_attempt IS NOT NULL FROM jobs WHERE step_id = $1`,
						st).Scan(&held); err == nil && held {
						heldReplays.Add(1)
						replayedHeld = append(replayedHeld, st)
						if rng.IntN(2) == 0 {
							cancelOnceClaimed(st)
						}
					}
				}
				if rng.IntN(4) == 0 {
					_, err = b.svc.CancelStep(hctx, b.ws, st)
					refused("cancel again", err)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	chaos.Go(func() { // the sweeper and its clock
		rng := rand.New(rand.NewPCG(3, 4))
		for range sweeps {
			if hctx.Err() != nil {
				return
			}
			b.clock.Add(time.Duration(rng.IntN(int(lease/2/time.Millisecond))) * time.Millisecond)
			if err := b.env.App.Sweeper.RunOnce(hctx).Error(); err != nil && hctx.Err() == nil {
				failf("sweep: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	checking := make(chan struct{})
	var checker sync.WaitGroup
	checker.Go(func() {
		for {
			select {
			case <-checking:
				return
			default:
				check("in the loop")
				time.Sleep(time.Millisecond)
			}
		}
	})
	chaos.Wait()
	close(stop)
	wg.Wait()
	close(checking)
	checker.Wait()
	require.Empty(t, fails)
	t.Logf("%d jobs claimed, %d reports, %d heartbeats (%d lost their lease or attempt, %d told of a cancel), "+
		"%d replays while a cancelled attempt held its slot", claims.Load(), reports.Load(), beats.Load(), lost.Load(),
		cancelsSeen.Load(), heldReplays.Load())

	// Quiescent: the count is exact, and once every lease has lapsed and
	// the sweeper has freed their slots, zero.
	check("at quiescence")
	require.Empty(t, fails)
	b.clock.Add(time.Hour)
	b.sweep(t)
	b.requireRunningCount(t, "mailer", 0)

	// No slot leaked: every job still due is claimed and worked through
	// the endpoint, at most limit at a time.
	wid := b.register(t)
	for range 200 {
		got := b.claim(t, wid, 10)
		require.LessOrEqual(t, len(got), limit)
		if len(got) == 0 {
			b.clock.Add(time.Hour) // retries wait out their backoff
			if got = b.claim(t, wid, 10); len(got) == 0 {
				break
			}
		}
		for _, j := range got {
			b.succeed(t, j)
		}
	}
	b.requireRunningCount(t, "mailer", 0)
	require.Zero(t, b.count(t, `SELECT count(*) FROM jobs WHERE endpoint_id = $1
		AND status IN ('QUEUED', 'RETRY_SCHEDULED', 'RUNNING')`, ep.ID), "every job due was worked")
}

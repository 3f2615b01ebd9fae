package jobs_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// hammer runs f(0..n-1) in n goroutines released together by one start
// gate, and waits for all of them: every call is at its start line before
// any begins, so the calls meet in the database rather than one after the
// other as the goroutines happen to start.
func hammer(n int, f func(i int)) {
	start := make(chan struct{})
	var ready, done sync.WaitGroup
	ready.Add(n)
	for i := range n {
		done.Go(func() {
			ready.Done()
			<-start
			f(i)
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
}

// Enqueues racing under one explicit key with different inputs: one
// operation wins the key, every answer that succeeds names its one step
// (exactly one of them not deduplicated, and only requests of that very
// operation succeed), and every other is 409 idempotency_key_reuse. Half
// the racers send the same input, so the winner may have company.
func TestConcurrentEnqueuesOfOneKeyWithOtherInputsOneWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, b.run(t), jobs.EnqueueRequest{}) // the endpoint exists
	for round := range 5 {
		runID := b.run(t)
		const n = 24
		inputs := make([]string, n)
		res := make([]jobs.EnqueueResult, n)
		errs := make([]error, n)
		for i := range n {
			inputs[i] = `{"shared":true}`
			if i%2 == 1 {
				inputs[i] = fmt.Sprintf(`{"own":%d}`, i)
			}
		}
		key := fmt.Sprintf("hammer-%d", round)
		hammer(n, func(i int) {
			res[i], errs[i] = b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
				IdempotencyKey: ptr(key), Input: json.RawMessage(inputs[i])})
		})
		var jobID, winner string
		created := 0
		for i := range n {
			if errs[i] != nil {
				require.Equal(t, apierr.CodeIdempotencyKeyReuse, code(t, errs[i]), "racer %d", i)
				continue
			}
			if jobID == "" {
				jobID, winner = res[i].JobID, inputs[i]
			}
			require.Equal(t, jobID, res[i].JobID, "racer %d", i)
			require.Equal(t, winner, inputs[i], "racer %d succeeded with another operation", i)
			if !res[i].Deduplicated {
				created++
			}
		}
		require.Equal(t, 1, created, "exactly one answer created the step")
		var steps int
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE run_id = $1`, runID).Scan(&steps))
		require.Equal(t, 1, steps)
	}
}

// claimers runs n workers, each claiming (limit 1 to 5) until a claim
// answers nothing; onClaim sees every job leased and its worker. Any claim
// error fails the test.
func (b *bundle) claimers(t *testing.T, n int, onClaim func(worker int, j jobs.ClaimedJob)) {
	t.Helper()
	wids := make([]string, n)
	for i := range n {
		wids[i] = b.register(t)
	}
	errs := make([]error, n)
	hammer(n, func(i int) {
		limit := 1 + i%5
		for {
			c, err := b.svc.Claim(ctx, b.worker, wids[i], jobs.ClaimRequest{Limit: &limit})
			if err != nil {
				errs[i] = err
				return
			}
			if len(c.Jobs) == 0 {
				return
			}
			for _, j := range c.Jobs {
				onClaim(i, j)
			}
		}
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// Claims racing on an endpoint with rateLimitPerMinute lease exactly that
// many jobs in the minute, however many are due and however the claims
// interleave, and as many again in the next minute.
func TestConcurrentClaimsNeverPassTheRateLimit(t *testing.T) {
	t.Parallel()
	const rate, queued = 7, 200
	b := setup(t)
	b.createEndpoint(t, "send_email", jobs.PolicyFields{RateLimitPerMinute: opt[int64](rate)})
	runID := b.run(t)
	b.fill(t, runID, queued)
	for minute := range 3 {
		var leased atomic.Int64
		b.claimers(t, 8, func(int, jobs.ClaimedJob) { leased.Add(1) })
		require.EqualValues(t, rate, leased.Load(), "minute %d", minute)
		var started int
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM job_executions x JOIN jobs j ON j.id = x.job_id
			WHERE j.run_id = $1`, runID).Scan(&started))
		require.Equal(t, rate*(minute+1), started)
		b.clock.Add(time.Minute)
	}
}

// Claims racing on a paused endpoint lease nothing and consume no attempt;
// claims racing the pause itself lease nothing once the pause has
// answered.
func TestConcurrentClaimsOnAPausedEndpointLeaseNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "send_email"})
	require.NoError(t, err)
	runID := b.run(t)
	b.fill(t, runID, 400)
	_, err = b.svc.SetPaused(ctx, b.ws, ep.ID, true)
	require.NoError(t, err)
	var leasedPaused atomic.Int64
	b.claimers(t, 8, func(int, jobs.ClaimedJob) { leasedPaused.Add(1) })
	require.Zero(t, leasedPaused.Load(), "jobs leased while paused")
	var attempts int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT coalesce(sum(attempt), 0) FROM jobs WHERE run_id = $1`,
		runID).Scan(&attempts))
	require.Zero(t, attempts, "a paused endpoint's jobs consumed attempts")

	_, err = b.svc.SetPaused(ctx, b.ws, ep.ID, false)
	require.NoError(t, err)
	var paused atomic.Bool
	var afterPause atomic.Int64
	wids := make([]string, 8)
	for i := range wids {
		wids[i] = b.register(t)
	}
	errs := make([]error, len(wids)+1)
	hammer(len(wids)+1, func(i int) {
		if i == len(wids) {
			_, errs[i] = b.svc.SetPaused(ctx, b.ws, ep.ID, true)
			paused.Store(true)
			return
		}
		for range 20 {
			pausedBefore := paused.Load()
			c, err := b.svc.Claim(ctx, b.worker, wids[i], jobs.ClaimRequest{Limit: ptr(1)})
			if err != nil {
				errs[i] = err
				return
			}
			if pausedBefore {
				afterPause.Add(int64(len(c.Jobs)))
			}
		}
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.True(t, paused.Load())
	require.Zero(t, afterPause.Load(), "a claim begun after the pause answered leased a job")
}

// Claimers racing while dependencies end never lease a dependent before its
// dependency has ended: when a claim answers a dependent, its dependency's
// ending has committed. Each dependency is reported by the claimer that
// leased it, concurrently with the other claims.
func TestConcurrentClaimsNeverLeaseADependentBeforeItsDependency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	const chains = 40
	dependencyOf := map[string]string{} // dependent's job → dependency's job
	for i := range chains {
		first := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))})
		second := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(-i - 1)),
			AfterStepID: ptr(first.StepID), AfterStatus: ptr("SUCCEEDED")})
		dependencyOf[second.JobID] = first.JobID
	}
	var mu sync.Mutex
	claimed := map[string]int{}
	b.claimers(t, 6, func(_ int, j jobs.ClaimedJob) {
		if dep, ok := dependencyOf[j.JobID]; ok {
			var status string
			if err := b.env.App.Pool.QueryRow(ctx, `SELECT status FROM jobs WHERE id = $1`, dep).Scan(&status); err != nil {
				t.Errorf("read dependency: %v", err)
			}
			if status != jobs.StatusSucceeded {
				t.Errorf("dependent %s leased while its dependency was %s", j.JobID, status)
			}
		}
		mu.Lock()
		claimed[j.JobID]++
		mu.Unlock()
		if _, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
			Status: jobs.StatusSucceeded}); err != nil {
			t.Errorf("report %s: %v", j.JobID, err)
		}
	})
	// A claimer may stop while the last dependents are released by reports
	// still in flight: claim what is left.
	for _, j := range b.claim(t, b.register(t), 100) {
		claimed[j.JobID]++
		require.Contains(t, dependencyOf, j.JobID)
		b.succeed(t, j)
	}
	require.Len(t, claimed, 2*chains)
	for id, n := range claimed {
		require.Equal(t, 1, n, "job %s leased %d times", id, n)
	}
}

package jobs_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

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
					if _, err := b.svc.Report(ctx, b.ws, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
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

package jobs_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/sweep"
)

// The sweeper's job backstops take turns among workspaces: a batch takes
// each workspace's first candidate, then each one's second, and so on, so
// that one workspace's backlog older than another's work (a fleet of
// workers that died at once, a flood of runs to settle) takes one place of
// a batch a turn and the other's work is done in the first pass
// (multi-tenant QA: ordered by due time or id alone across every
// workspace, with 500 a pass, a workspace with 100,000 lapsed leases held
// another's lapsed last attempt, and the dependents and run waiting for
// it, back for 200 passes, over three hours on the cron). A batch of 2
// stands for the pass's 500 (jobs.SetSweepBatch). Not parallel: the sweeps
// act on every workspace of the package database; each test's clock lives
// in an era of its own (1931 and on, before every other test's), so that
// only its own leases have lapsed, and it leaves none behind.

// fairPair is a noisy and a quiet workspace, each its own service
// instance, with clocks set to era.
func fairPair(t *testing.T, era int) (noisy, quiet *bundle) {
	t.Helper()
	at := time.Date(era, 1, 1, 0, 0, 0, 0, time.UTC)
	noisy, quiet = setup(t), setup(t)
	noisy.clock.Set(at)
	quiet.clock.Set(at)
	return noisy, quiet
}

// task runs the named sweep task of b's service once, with batches of n.
func task(t *testing.T, b *bundle, name string, n int) int {
	t.Helper()
	jobs.SetSweepBatch(b.svc, n)
	defer jobs.SetSweepBatch(b.svc, 500)
	for _, tk := range b.svc.SweepTasks() {
		if tk.Name == name {
			changed, err := tk.Run(context.Background(), b.clock.Now())
			require.NoError(t, err)
			return changed
		}
	}
	t.Fatalf("no sweep task %s", name)
	return 0
}

// statuses counts the jobs of steps by status, read from the table (a
// step's read would settle its lapse inline).
func statuses(t *testing.T, b *bundle, steps ...string) (n map[string]int) {
	t.Helper()
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT jsonb_object_agg(status, n) FROM (
		SELECT status, count(*) AS n FROM jobs WHERE step_id = ANY($1) GROUP BY status) s`, steps).Scan(&n))
	return n
}

func TestLapsedLastAttemptsTakeTurnsAmongWorkspaces(t *testing.T) {
	noisy, quiet := fairPair(t, 1931)
	backlog, _ := noisy.lastAttemptsClaimed(t, noisy.run(t), 5)
	quiet.clock.Add(time.Second) // lapsing after the whole backlog
	late, _ := quiet.lastAttemptsClaimed(t, quiet.run(t), 1)
	noisy.clock.Add(time.Minute)
	quiet.clock.Add(time.Minute)

	require.Equal(t, 2, task(t, noisy, "jobs.lapsed_leases", 2))
	require.Equal(t, map[string]int{"EXHAUSTED": 1}, statuses(t, quiet, late...),
		"the quiet workspace's lapse is ended in the first pass")
	require.Equal(t, map[string]int{"EXHAUSTED": 1, "RUNNING": 4}, statuses(t, noisy, backlog...))
	for _, want := range []int{2, 2, 0} {
		require.Equal(t, want, task(t, noisy, "jobs.lapsed_leases", 2), "alone, the backlog fills each batch")
	}
}

func TestRequeuedLeasesTakeTurnsAmongWorkspaces(t *testing.T) {
	noisy, quiet := fairPair(t, 1933)
	claimed := func(b *bundle, n int) []string {
		runID := b.run(t)
		var steps []string
		for i := range n {
			steps = append(steps, b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i)),
				MaxAttempts: ptr[int64](3), TimeoutMs: ptr[int64](1_000)}).StepID)
		}
		require.Len(t, b.claim(t, b.register(t), n), n)
		return steps
	}
	backlog := claimed(noisy, 5)
	quiet.clock.Add(time.Second)
	late := claimed(quiet, 1)
	noisy.clock.Add(jobs.RequeueLapsedAfter + time.Minute)
	quiet.clock.Add(jobs.RequeueLapsedAfter + time.Minute)

	require.Equal(t, 2, task(t, noisy, "jobs.lapsed_leases", 2))
	require.Equal(t, map[string]int{"QUEUED": 1}, statuses(t, quiet, late...),
		"the quiet workspace's lease is requeued in the first pass")
	require.Equal(t, map[string]int{"QUEUED": 1, "RUNNING": 4}, statuses(t, noisy, backlog...))
	for _, want := range []int{2, 2, 0} {
		require.Equal(t, want, task(t, noisy, "jobs.lapsed_leases", 2))
	}
}

// endedBehindTheServicesBack makes n steps of a new run of b, each with a
// WAITING dependent, and ends each dependency behind the service's back
// (as a crash between the report and the release would leave it), a
// second apart, answering the dependents.
func endedBehindTheServicesBack(t *testing.T, b *bundle, n int) []string {
	t.Helper()
	runID := b.run(t)
	var dependents []string
	for i := range n {
		dep := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i))})
		dependents = append(dependents, b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"after"`),
			AfterStepID: &dep.StepID, AfterStatus: ptr("SUCCEEDED")}).StepID)
		b.clock.Add(time.Second)
		_, err := b.env.App.Pool.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', due_at = NULL, ready_at = NULL,
			finished_at = $2 WHERE step_id = $1`, dep.StepID, b.clock.Now())
		require.NoError(t, err)
	}
	return dependents
}

func TestStrandedDependentsTakeTurnsAmongWorkspaces(t *testing.T) {
	noisy, quiet := fairPair(t, 1935)
	require.NoError(t, sweepAll(noisy, "jobs.dependencies"), "what other tests left stranded")
	backlog := endedBehindTheServicesBack(t, noisy, 4)
	quiet.clock.Set(noisy.clock.Now().Add(time.Minute)) // ended after the whole backlog
	late := endedBehindTheServicesBack(t, quiet, 1)

	require.Equal(t, 2, task(t, noisy, "jobs.dependencies", 2))
	require.Equal(t, map[string]int{"QUEUED": 1}, statuses(t, quiet, late...),
		"the quiet workspace's dependent is released in the first pass")
	require.Equal(t, map[string]int{"QUEUED": 1, "WAITING": 3}, statuses(t, noisy, backlog...))
	require.NoError(t, sweepAll(noisy, "jobs.dependencies"))
	require.Equal(t, map[string]int{"QUEUED": 4}, statuses(t, noisy, backlog...))
}

func TestRunsToSettleTakeTurnsAmongWorkspaces(t *testing.T) {
	noisy, quiet := fairPair(t, 1937)
	require.NoError(t, sweepAll(noisy, "jobs.run_completion"), "what other tests left to settle")
	decided := func(b *bundle) string {
		runID := b.run(t)
		st := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"d"`)})
		// Its step ended and its completion was requested behind the
		// service's back, as a crash between the two would leave it.
		_, err := b.env.App.Pool.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', due_at = NULL, ready_at = NULL,
			finished_at = $2 WHERE step_id = $1`, st.StepID, b.clock.Now())
		require.NoError(t, err)
		_, err = b.env.App.Pool.Exec(ctx, `UPDATE job_runs SET completion_requested = true WHERE id = $1`, runID)
		require.NoError(t, err)
		b.clock.Add(time.Second) // ids follow the clock
		return runID
	}
	var backlog []string
	for range 4 {
		backlog = append(backlog, decided(noisy))
	}
	quiet.clock.Set(noisy.clock.Now().Add(time.Minute)) // its run's id sorts after the whole backlog
	late := decided(quiet)
	settled := func(b *bundle, runs ...string) (n int) {
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM job_runs
			WHERE id = ANY($1) AND status = 'SUCCEEDED'`, runs).Scan(&n))
		return n
	}

	require.Equal(t, 2, task(t, noisy, "jobs.run_completion", 2))
	require.Equal(t, 1, settled(quiet, late), "the quiet workspace's run is settled in the first pass")
	require.Equal(t, 1, settled(noisy, backlog...))
	require.NoError(t, sweepAll(noisy, "jobs.run_completion"))
	require.Equal(t, 4, settled(noisy, backlog...))
}

// sweepAll runs the named task until it changes nothing.
func sweepAll(b *bundle, name string) error {
	for _, tk := range b.svc.SweepTasks() {
		if tk.Name != name {
			continue
		}
		for {
			n, err := tk.Run(context.Background(), b.clock.Now())
			if err != nil || n == 0 {
				return err
			}
		}
	}
	return nil
}

// Workspaces share tool names, not work: a worker claims its own
// workspace's jobs only, and an endpoint's limit (an endpoint is a
// workspace's) holds that workspace's jobs alone, so another workspace's
// endpoint of the same name at its limit neither holds nor lends a slot.
func TestAClaimSeesOnlyItsWorkspacesJobsAndEndpoints(t *testing.T) {
	t.Parallel()
	a, b := setup(t), setup(t)
	runA, runB := a.run(t), b.run(t)
	for _, x := range []struct {
		b   *bundle
		run string
	}{{a, runA}, {b, runB}} {
		x.b.createEndpoint(t, "send_email", jobs.PolicyFields{MaxConcurrent: opt[int64](1)})
		for i := range 3 {
			x.b.enqueue(t, x.run, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i))})
		}
	}
	wa, wb := a.register(t), b.register(t)
	first := a.claim(t, wa, 10)
	require.Len(t, first, 1, "a's endpoint allows one at a time")
	require.Empty(t, a.claim(t, wa, 10), "a's endpoint is at its limit")
	got := b.claim(t, wb, 10)
	require.Len(t, got, 1, "b's endpoint of the same name has its own slot")
	owned := func(x *bundle, jobID string) bool {
		var n int
		require.NoError(t, x.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs j JOIN job_endpoints e ON e.id = j.endpoint_id
			WHERE j.id = $1 AND j.workspace_id = $2 AND e.workspace_id = $2`, jobID, x.ws).Scan(&n))
		return n == 1
	}
	require.True(t, owned(a, first[0].JobID))
	require.True(t, owned(b, got[0].JobID))
	a.succeed(t, first[0])
	next := a.claim(t, wa, 10)
	require.Len(t, next, 1)
	require.True(t, owned(a, next[0].JobID), "a's worker never takes b's queued jobs")
}

// A pass with time (the cron route's, the Lambda schedule's) works a
// backlog off batch after batch (sweep.Task.Drains), not a batch a pass:
// five lapsed last attempts with batches of 2 are all ended in one pass.
func TestAPassWithTimeDrainsLapsedJobLeases(t *testing.T) {
	b := setup(t)
	b.clock.Set(time.Date(1939, 1, 1, 0, 0, 0, 0, time.UTC)) // see fairPair
	backlog, _ := b.lastAttemptsClaimed(t, b.run(t), 5)
	b.clock.Add(time.Minute)
	jobs.SetSweepBatch(b.svc, 2)
	defer jobs.SetSweepBatch(b.svc, 500)
	sw := sweep.New(b.clock.Now, slog.New(slog.NewTextHandler(io.Discard, nil)), b.svc.SweepTasks()...)
	pass, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res := sw.RunOnce(pass)
	require.Empty(t, res.Errors)
	require.Equal(t, 5, res.Changed["jobs.lapsed_leases"])
	require.Equal(t, map[string]int{"EXHAUSTED": 5}, statuses(t, b, backlog...))
}

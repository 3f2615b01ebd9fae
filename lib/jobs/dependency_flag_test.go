package jobs_test

import (
	"encoding/json"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// hasDependents reads step stepID's has_dependents flag.
func (b *bundle) hasDependents(t testing.TB, stepID string) bool {
	t.Helper()
	var v bool
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT has_dependents FROM jobs WHERE step_id = $1`,
		stepID).Scan(&v))
	return v
}

// An enqueue naming a dependency sets the dependency's has_dependents only
// once it is accepted (migration 0081): one refused for its key, for an
// input its contract refuses or for its run's completion leaves it unset,
// so that the dependency's endings look for no dependents (task review:
// jobs_enqueue set it before deciding).
func TestARefusedEnqueueLeavesItsDependencyUnflagged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
		HandlerVersion: "2", InputSchema: json.RawMessage(`{"type":"object"}`), OutputSchema: json.RawMessage(`true`)})
	require.NoError(t, err)
	runID := b.run(t)
	a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`)})
	b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`"k"`), IdempotencyKey: ptr("taken")})
	after := func(req jobs.EnqueueRequest) error {
		req.AfterStepID, req.AfterStatus = &a.StepID, ptr("SUCCEEDED")
		if req.Name == "" {
			req.Name, req.Version = "send_email", "1"
		}
		_, err := b.svc.Enqueue(ctx, b.ws, runID, req)
		return err
	}

	err = after(jobs.EnqueueRequest{Input: json.RawMessage(`"other"`), IdempotencyKey: ptr("taken")})
	require.Equal(t, apierr.CodeIdempotencyKeyReuse, code(t, err))
	require.False(t, b.hasDependents(t, a.StepID), "an enqueue refused for its key")

	err = after(jobs.EnqueueRequest{Name: "send_email", Version: "2", Input: json.RawMessage(`[]`)})
	require.Equal(t, apierr.CodeInvalidRequest, code(t, err))
	require.False(t, b.hasDependents(t, a.StepID), "an enqueue whose input its contract refused")

	// Completion requested while a is still queued: the run takes no new step.
	_, err = b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	err = after(jobs.EnqueueRequest{Input: json.RawMessage(`"late"`)})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	require.False(t, b.hasDependents(t, a.StepID), "an enqueue refused for its run's completion")

	// Accepted, in another run: the flag is set, and a repeat of it
	// (deduplicated) leaves it set.
	run2 := b.run(t)
	d := b.enqueue(t, run2, jobs.EnqueueRequest{Input: json.RawMessage(`"d"`)})
	require.False(t, b.hasDependents(t, d.StepID))
	req := jobs.EnqueueRequest{Input: json.RawMessage(`"w"`), AfterStepID: &d.StepID, AfterStatus: ptr("SUCCEEDED")}
	w := b.enqueue(t, run2, req)
	require.Equal(t, "WAITING", w.Status)
	require.True(t, b.hasDependents(t, d.StepID), "an accepted enqueue flags its dependency")
	again := b.enqueue(t, run2, req)
	require.True(t, again.Deduplicated)
	require.True(t, b.hasDependents(t, d.StepID))
	// The flag releases the dependent when d ends.
	for _, j := range b.claim(t, b.register(t), 10) {
		if j.JobID == d.JobID {
			b.succeed(t, j)
		}
	}
	require.Equal(t, "QUEUED", b.step(t, w.StepID).Status)
}

// Enqueues naming a dependency while it ends are each decided: accepted
// before the ending, the step is released by it; after, it is decided at
// once. None is left WAITING for a dependency that ended (no sweep runs
// here to release a stranded one).
func TestEnqueuesRacingTheirDependencysEndingAreNeverStranded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wid := b.register(t)
	const rounds, enqueues = 8, 6
	for round := range rounds {
		runID := b.run(t)
		a := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(round))})
		j := b.claimOne(t, wid)
		require.Equal(t, a.JobID, j.JobID)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			errs    []error
			stepIDs []string
		)
		start := make(chan struct{})
		wg.Add(enqueues + 1)
		go func() {
			defer wg.Done()
			<-start
			_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
				Status: "SUCCEEDED"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
		}()
		for i := range enqueues {
			go func() {
				defer wg.Done()
				<-start
				res, err := b.svc.Enqueue(ctx, b.ws, runID, jobs.EnqueueRequest{Name: "send_email", Version: "1",
					Input: json.RawMessage(`"dependent ` + strconv.Itoa(i) + `"`), AfterStepID: &a.StepID,
					AfterStatus: ptr("SUCCEEDED")})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
					return
				}
				stepIDs = append(stepIDs, res.StepID)
			}()
		}
		close(start)
		wg.Wait()
		require.Empty(t, errs)
		require.Len(t, stepIDs, enqueues)
		for _, id := range stepIDs {
			require.Equal(t, "QUEUED", b.step(t, id).Status, "round %d: a dependent of a step that succeeded", round)
		}
		// Drain the round's dependents, so that the next round's claim
		// takes its own dependency.
		for range enqueues {
			b.succeed(t, b.claimOne(t, wid))
		}
	}
}

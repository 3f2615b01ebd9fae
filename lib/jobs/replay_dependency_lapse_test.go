package jobs_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

// A step cancelled while it waited, whose dependency's last attempt has
// lapsed, is replayable at once: the preview and the replay read the
// dependency ended (EXHAUSTED), as any read of the run would (API.md §5:
// a lease lapse is decided at read, the sweeper is the backstop). They
// read it RUNNING ("has not ended"), and refused the replay until a sweep
// (jobs QA). Not parallel: another test's sweep, at a later fake clock,
// could end the lapsed dependency first.
func TestAStepWhoseDependencyLapsedOnItsLastAttemptIsReplayableAtOnce(t *testing.T) {
	b := setup(t)
	run := b.run(t)
	dep := b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`), MaxAttempts: ptr[int64](1),
		TimeoutMs: ptr[int64](1_000)})
	onFailure := b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`"f"`), AfterStepID: &dep.StepID,
		AfterStatus: ptr("FAILED")})
	_, err := b.svc.CancelStep(ctx, b.ws, onFailure.StepID)
	require.NoError(t, err)
	require.Equal(t, dep.JobID, b.claimOne(t, b.register(t)).JobID) // its worker dies
	b.clock.Add(11500 * time.Millisecond)                           // past the timeout and the grace

	p, err := b.svc.PreviewReplay(ctx, b.ws, onFailure.StepID)
	require.NoError(t, err)
	require.Nil(t, p.IneligibleReason)
	require.True(t, p.Eligible)
	_, err = b.svc.Replay(ctx, b.worker, onFailure.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)
	require.Equal(t, "EXHAUSTED", b.step(t, dep.StepID).Status)
	require.Equal(t, "QUEUED", b.step(t, onFailure.StepID).Status)
}

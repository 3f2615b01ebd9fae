package jobs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// A synthetic tool test has exactly one attempt (seed 000): its ended step
// is not replayed. The preview reads eligible: false, saying so, and a
// replay is refused (409 invalid_state), the step and its run left as they
// were (jobs QA: the replay queued the test's job a second attempt and
// reopened its run). A step of an ordinary run replays as before.
func TestASyntheticToolTestIsNotReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wid := b.register(t)
	test, err := b.svc.TestTool(ctx, b.worker, "send_email", jobs.ToolTestRequest{Version: "1"})
	require.NoError(t, err)
	b.fail(t, b.claimOne(t, wid), &jobs.ReportError{Retryable: ptr(true)})
	require.Equal(t, jobs.StatusExhausted, b.step(t, test.StepID).Status, "its one attempt")
	run, err := b.svc.GetRun(ctx, b.ws, test.RunID)
	require.NoError(t, err)
	require.True(t, run.Synthetic)
	require.Equal(t, "FAILED", run.Status)

	p, err := b.svc.PreviewReplay(ctx, b.ws, test.StepID)
	require.NoError(t, err)
	require.False(t, p.Eligible)
	require.NotNil(t, p.IneligibleReason)
	require.Contains(t, *p.IneligibleReason, "synthetic tool test")

	_, err = b.svc.Replay(ctx, b.worker, test.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.Equal(t, apierr.CodeInvalidState, code(t, err))
	require.Contains(t, err.Error(), "synthetic tool test")
	st := b.step(t, test.StepID)
	require.Equal(t, jobs.StatusExhausted, st.Status, "nothing changed")
	require.Equal(t, 1, st.DurableJob.MaxAttempts)
	run, err = b.svc.GetRun(ctx, b.ws, test.RunID)
	require.NoError(t, err)
	require.Equal(t, "FAILED", run.Status, "the run stays ended")

	// The same job in an ordinary run replays.
	plain := b.enqueue(t, b.run(t), jobs.EnqueueRequest{MaxAttempts: ptr[int64](1)})
	b.fail(t, b.claimOne(t, wid), &jobs.ReportError{Retryable: ptr(false)})
	_, err = b.svc.Replay(ctx, b.worker, plain.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.NoError(t, err)
}

package jobs_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

// A step cancelled while it ran and replayed onto another contract's handler
// version before its attempt ended: the attempt's worker, whose WORKER key
// lists only the version it ran (send_email@1), still heartbeats and reports
// that attempt, as after a same-version replay (its report is recorded and
// frees the replay to run). The key check read the job's new version
// (send_email@2) and answered 403 forbidden, so the worker's outcome was
// lost and the replay waited for the attempt's lease to expire (jobs QA).
func TestAnAttemptReplayedOntoAnotherVersionStillReportsUnderItsOwnVersionsKey(t *testing.T) {
	t.Parallel()
	b := setup(t) // the worker key lists send_email@1 only
	for _, v := range []string{"1", "2"} {
		_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
			HandlerVersion: v, InputSchema: json.RawMessage(`{"type":"object"}`)})
		require.NoError(t, err)
	}
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{Input: json.RawMessage(`{}`)})
	first := b.claimOne(t, b.register(t))
	_, err := b.svc.CancelStep(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	res, err := b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
		TargetContractVersion: ptr[int64](2), ExpectedHandlerVersion: ptr("1"), AcknowledgeVersionChange: ptr(true)})
	require.NoError(t, err)
	require.Equal(t, "2", res.HandlerVersion)

	hb, err := b.svc.Heartbeat(ctx, b.worker, first.JobID, jobs.HeartbeatRequest{LeaseToken: first.LeaseToken})
	require.NoError(t, err, "the attempt ran send_email@1, which the key may work")
	require.True(t, hb.CancelRequested)
	r, err := b.svc.Report(ctx, b.worker, first.JobID, jobs.ReportRequest{LeaseToken: first.LeaseToken,
		Status: "SUCCEEDED", Output: json.RawMessage(`{"sent":true}`)})
	require.NoError(t, err)
	require.Equal(t, "QUEUED", r.Status)
	xs := b.executions(t, st.JobID)
	require.Len(t, xs, 1)
	require.True(t, xs[0].Reported, "the worker's own outcome is recorded")
	require.Equal(t, "SUCCEEDED", *xs[0].Outcome)
	due, _ := b.dueTimes(t, st.StepID)
	require.WithinDuration(t, b.clock.Now(), *due, 0, "the attempt ended: the replay is due now")
}

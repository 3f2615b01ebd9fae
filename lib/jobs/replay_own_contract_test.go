package jobs_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// refusedFields answers the fields a 400 invalid_request names.
func refusedFields(t *testing.T, err error) []string {
	t.Helper()
	var ae *apierr.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, apierr.CodeInvalidRequest, ae.Code, "%v", err)
	var fields []string
	for _, p := range ae.Detail["validation"].([]apierr.FieldError) {
		fields = append(fields, p.Field)
	}
	return fields
}

// A replay whose targetContractVersion is the step's own contract changes
// no version, so it needs neither acknowledgeVersionChange nor
// expectedHandlerVersion: it is a same-version replay (API.md: "a version
// change without acknowledgeVersionChange: true: 400"; it was refused as
// one). Another contract still needs both, and so does the step's own
// when the step moved off it between the replay's first read and its lock
// (here a transaction holding the job's row moves it, as a concurrent
// replay onto another contract would).
func TestAReplayOntoTheStepsOwnContractNeedsNoAcknowledgement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, v := range []string{"1", "2"} {
		_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
			HandlerVersion: v, InputSchema: json.RawMessage(`{"type":"object"}`)})
		require.NoError(t, err)
	}
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{Input: json.RawMessage(`{}`), MaxAttempts: ptr[int64](1)})
	w := b.register(t)
	b.fail(t, b.claimOne(t, w), &jobs.ReportError{Retryable: ptr(false)})
	contract := func() int {
		return b.count(t, `SELECT contract_version FROM jobs WHERE id = $1`, st.JobID)
	}
	require.Equal(t, 1, contract())

	_, err := b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
		TargetContractVersion: ptr[int64](2)})
	require.ElementsMatch(t, []string{"expectedHandlerVersion", "acknowledgeVersionChange"}, refusedFields(t, err))
	_, err = b.svc.Replay(ctx, b.worker, "stp_none", jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
		TargetContractVersion: ptr[int64](1)})
	require.ElementsMatch(t, []string{"expectedHandlerVersion", "acknowledgeVersionChange"}, refusedFields(t, err),
		"a step not found is taken as on another contract")
	require.Equal(t, "EXHAUSTED", b.step(t, st.StepID).Status, "a refused replay changes nothing")

	res, err := b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
		TargetContractVersion: ptr[int64](1)})
	require.NoError(t, err, "the step's own contract: nothing to acknowledge")
	require.Equal(t, "1", res.HandlerVersion)
	require.Equal(t, "QUEUED", res.Status)
	require.Equal(t, 1, contract())

	// Moved off it under the replay's feet: refused under the lock.
	b.fail(t, b.claimOne(t, w), &jobs.ReportError{Retryable: ptr(false)})
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE jobs SET contract_version = 2, version = '2' WHERE id = $1`, st.JobID)
	require.NoError(t, err)
	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, tx))
	got := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
			TargetContractVersion: ptr[int64](1)})
		got <- err
	}()
	waits.Waiting(done, "the replay waits for the job's row")
	require.NoError(t, tx.Commit(ctx))
	err = <-got
	require.ElementsMatch(t, []string{"expectedHandlerVersion", "acknowledgeVersionChange"}, refusedFields(t, err))
	require.Equal(t, "EXHAUSTED", b.step(t, st.StepID).Status)
	require.Equal(t, 2, contract())
}

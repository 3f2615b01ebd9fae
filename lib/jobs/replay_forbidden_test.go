package jobs_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// A step enqueued before its handler version had a contract, replayed once
// every contract of that version is FORBIDDEN: a same-version replay would
// run the forbidden handler, as an enqueue of it no longer may (migration
// 0048), so it is refused (409 invalid_state), the step left as it was;
// replayed onto another version's ACTIVE contract it runs (jobs QA: the
// same-version replay queued the forbidden handler).
func TestASameVersionReplayOfAForbiddenHandlerVersionIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{Input: json.RawMessage(`{}`), MaxAttempts: ptr[int64](1)})
	require.Nil(t, b.step(t, st.StepID).ContractVersion)
	b.fail(t, b.claimOne(t, b.register(t)), &jobs.ReportError{Retryable: ptr(false)})
	require.Equal(t, "EXHAUSTED", b.step(t, st.StepID).Status)

	for _, c := range []struct{ version, status string }{{"1", "FORBIDDEN"}, {"2", "ACTIVE"}} {
		_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
			HandlerVersion: c.version, InputSchema: json.RawMessage(`{"type":"object"}`), Status: &c.status})
		require.NoError(t, err)
	}
	_, err := b.svc.Enqueue(ctx, b.ws, b.run(t), jobs.EnqueueRequest{Name: "send_email", Version: "1"})
	require.Equal(t, apierr.CodeInvalidState, code(t, err), "an enqueue of the forbidden version is refused")

	_, err = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.Equal(t, apierr.CodeInvalidState, code(t, err), "and so is a replay of it")
	require.Contains(t, err.Error(), "FORBIDDEN")
	require.Equal(t, "EXHAUSTED", b.step(t, st.StepID).Status, "nothing changed")

	res, err := b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
		TargetContractVersion: ptr[int64](2), ExpectedHandlerVersion: ptr("1"), AcknowledgeVersionChange: ptr(true)})
	require.NoError(t, err, "an upgrade leaves the forbidden version")
	require.Equal(t, "2", res.HandlerVersion)
	require.Equal(t, "QUEUED", b.step(t, st.StepID).Status)
}

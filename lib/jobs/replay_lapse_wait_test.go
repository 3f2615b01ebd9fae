package jobs_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

// A replay that waits for its step's job while a last attempt's lease
// lapses (the step's own, or that of the step it depends on) finds it
// ended, as a replay that came after the lapse does: the lapse is ended
// EXHAUSTED (its step.exhausted saying leaseLapsed) and the replay goes on.
// QA: its look before the lock saw the lease held, and the replay, granted
// the row after the expiry, was refused as of a RUNNING step (or one whose
// dependency had not ended) that any read then showed EXHAUSTED. Under an
// Idempotency-Key too, where the request's transaction has begun by then.
func TestAReplayWaitingWhileALastLeaseLapsesFindsItEnded(t *testing.T) {
	t.Parallel()
	for _, dependency := range []bool{false, true} {
		for _, keyed := range []bool{false, true} {
			t.Run(fmt.Sprintf("dependency=%t,keyed=%t", dependency, keyed), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				run := b.run(t)
				lapsing := b.enqueue(t, run, jobs.EnqueueRequest{MaxAttempts: ptr[int64](1), TimeoutMs: ptr[int64](1_000)})
				replayed := lapsing
				if dependency {
					replayed = b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`"f"`),
						AfterStepID: &lapsing.StepID, AfterStatus: ptr("FAILED")})
					_, err := b.svc.CancelStep(ctx, b.ws, replayed.StepID)
					require.NoError(t, err)
				}
				require.Equal(t, lapsing.JobID, b.claimOne(t, b.register(t)).JobID) // its worker dies

				got := b.lapseWhileWaiting(t, replayed.JobID, func() string {
					if keyed {
						return answerOf(b.env.DoWith("POST", "/api/v1/steps/"+replayed.StepID+"/replay", b.op,
							http.Header{"Idempotency-Key": {"replay-" + replayed.StepID}},
							map[string]any{"acknowledgeDuplicateRisk": true}))
					}
					r, err := b.svc.Replay(ctx, b.worker, replayed.StepID,
						jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
					if err != nil {
						return err.Error()
					}
					return r.Status
				})
				require.Equal(t, jobs.StatusQueued, got, "the replay finds the lapse ended")
				want := jobs.StatusQueued // replayed
				if dependency {
					want = jobs.StatusExhausted
				}
				require.Equal(t, want, b.storedStatus(t, lapsing.JobID))
				require.Equal(t, "true", b.exhaustedLapsed(t, lapsing.StepID))
			})
		}
	}
}

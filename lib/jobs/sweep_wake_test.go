package jobs_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

// lapsedFor is how far the tests below move the clock past a claim of a
// job with TimeoutMs 1000: past its lease and grace, and past
// RequeueLapsedAfter, so that a sweep requeues it or frees its slot.
const lapsedFor = 11*time.Second + jobs.RequeueLapsedAfter + time.Second

// The sweeper's requeue of a lapsed job and its release of a cancelled
// attempt's held slot wake a parked claim, as an enqueue and a report do:
// the local server runs the sweeper in its own process, and the claims
// parked there slept to their next poll (wake QA). Each claim here parks
// with an hour's poll pause (parkClaim), so it gets the job only if woken.
// Not parallel: the sweep is global and the clock moves minutes past other
// tests' lapses.
func TestASweepThatFreesWorkWakesAParkedClaim(t *testing.T) {
	t.Run("requeued job", func(t *testing.T) {
		// The lapsed job's own version's worker is parked: the requeued
		// job is for it.
		b := setup(t)
		wid := b.register(t)
		st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000)})
		require.Equal(t, st.JobID, b.claimOne(t, wid).JobID) // its worker stalls
		parked := b.parkClaim(t, wid)                        // its first look found the lease live

		b.clock.Add(lapsedFor)
		b.sweep(t)
		require.Equal(t, []string{st.StepID}, claimedSteps(<-parked))
	})
	t.Run("requeue frees a slot", func(t *testing.T) {
		// A retired version's crashed worker held the endpoint's only
		// slot; the claim parked is the new version's, for its job.
		b := setup(t, "send_email@1", "send_email@2")
		b.limitedEndpoint(t, "mailer", 1)
		run := b.run(t)
		late := b.enqueue(t, run, jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000)})
		next := b.enqueue(t, run, jobs.EnqueueRequest{Name: "send_email", Version: "2", Endpoint: ptr("mailer")})
		v1 := b.register(t, jobs.Tool{Name: "send_email", Version: "1"})
		v2 := b.register(t, jobs.Tool{Name: "send_email", Version: "2"})
		require.Equal(t, late.JobID, b.claimOne(t, v1).JobID)
		parked := b.parkClaim(t, v2) // its first look found the only slot taken

		b.clock.Add(lapsedFor)
		b.sweep(t)
		require.Equal(t, "QUEUED", b.step(t, late.StepID).Status)
		require.Equal(t, []string{next.StepID}, claimedSteps(<-parked))
	})
	t.Run("lapsed last attempt ended", func(t *testing.T) {
		// A job on its last attempt whose worker crashed held the
		// endpoint's only slot: the sweep ends it, freeing the slot for
		// the next job.
		b, wid, held, next := slotHeldByAClaim(t, ptr[int64](1))
		parked := b.parkClaim(t, wid) // its first look found the slot taken

		b.clock.Add(lapsedFor)
		b.sweep(t)
		require.Equal(t, "EXHAUSTED", b.step(t, held.StepID).Status)
		require.Equal(t, []string{next.StepID}, claimedSteps(<-parked))
	})
	t.Run("stranded dependent released", func(t *testing.T) {
		// A dependency ended with no request releasing its dependent (the
		// sweeper's backstop): the job it queues wakes a claim of its exact
		// version, not the one of another tool parked longer, which would
		// find nothing and keep the wake.
		b := setup(t, "send_email@1", "send_sms@1")
		run := b.run(t)
		first := b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`"a"`)})
		dep := b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`"d"`), AfterStepID: &first.StepID,
			AfterStatus: ptr("SUCCEEDED")})
		email := b.register(t)
		require.Equal(t, first.JobID, b.claimOne(t, email).JobID)
		sms := b.register(t, jobs.Tool{Name: "send_sms", Version: "1"})
		other := b.parkClaim(t, sms) // parked longest
		parked := b.parkClaim(t, email)
		_, err := b.env.App.Pool.Exec(ctx, `UPDATE jobs SET status = 'SUCCEEDED', due_at = NULL, ready_at = NULL,
			finished_at = $2 WHERE step_id = $1`, first.StepID, b.clock.Now())
		require.NoError(t, err)

		b.sweep(t)
		require.Equal(t, []string{dep.StepID}, claimedSteps(<-parked))
		_ = other // cancelled at cleanup, holding no job
	})
	t.Run("held slot released", func(t *testing.T) {
		// A cancelled attempt whose worker never reported held the
		// endpoint's only slot until its lease expired.
		b, wid, held, next := slotHeldByAClaim(t, nil)
		_, err := b.svc.CancelStep(ctx, b.ws, held.StepID)
		require.NoError(t, err)
		parked := b.parkClaim(t, wid) // its first look found the slot held

		b.clock.Add(lapsedFor)
		b.sweep(t)
		require.Equal(t, []string{next.StepID}, claimedSteps(<-parked))
	})
}

// slotHeldByAClaim is an endpoint with one slot, held by a claim of its
// first job (of maxAttempts, if given, timing out after a second) by wid,
// and a second job queued behind it.
func slotHeldByAClaim(t *testing.T, maxAttempts *int64) (b *bundle, wid string, held, next jobs.EnqueueResult) {
	t.Helper()
	b = setup(t)
	b.limitedEndpoint(t, "mailer", 1)
	wid = b.register(t)
	run := b.run(t)
	held = b.enqueue(t, run, jobs.EnqueueRequest{Endpoint: ptr("mailer"), TimeoutMs: ptr[int64](1_000),
		MaxAttempts: maxAttempts, Input: json.RawMessage(`1`)})
	b.clock.Add(time.Millisecond) // claimed in order
	next = b.enqueue(t, run, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`2`)})
	require.Equal(t, held.JobID, b.claimOne(t, wid).JobID)
	return b, wid, held, next
}

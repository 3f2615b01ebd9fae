package jobs_test

import (
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// claimKeyed claims up to limit jobs for worker wid under claim id.
func (b *bundle) claimKeyed(t testing.TB, wid, id string, limit int) []jobs.ClaimedJob {
	t.Helper()
	c, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{Limit: &limit, ClaimID: &id})
	require.NoError(t, err)
	return c.Jobs
}

// enqueueJobs enqueues n send_email@1 jobs of up to three attempts in run
// runID and returns their step ids.
func (b *bundle) enqueueJobs(t testing.TB, runID string, n int) []string {
	t.Helper()
	steps := make([]string, n)
	for i := range n {
		steps[i] = b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(strconv.Itoa(i)),
			MaxAttempts: ptr[int64](3), TimeoutMs: ptr[int64](5_000)}).StepID
	}
	return steps
}

// A claim whose answer was lost, sent again under its claimId, answers the
// jobs it leased, attempt and lease token alike, and leases nothing more:
// the attempt is not spent on a lapse. Their leases are renewed from the
// answer again, whose leaseMs the worker measures from when it sent it
// (review: answered as the first left them, the worker took them for
// longer than they had left, and its first heartbeat came too late).
func TestAClaimSentAgainAnswersWhatItLeased(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	b.enqueueJobs(t, runID, 3)
	w := b.register(t)

	first := b.claimKeyed(t, w, "claim-1", 2)
	require.Len(t, first, 2)
	b.clock.Add(4 * time.Second)
	again := b.claimKeyed(t, w, "claim-1", 1) // whatever the limit: every job it leased
	require.Len(t, again, 2)
	for i, j := range again {
		require.Equal(t, 1, j.Attempt)
		require.Equal(t, first[i].LeaseMs, j.LeaseMs)
		require.Equal(t, b.clock.Now().Add(time.Duration(j.LeaseMs)*time.Millisecond), j.LeaseExpiresAt,
			"renewed from the answer again")
		j.LeaseExpiresAt = first[i].LeaseExpiresAt
		require.Equal(t, first[i], j, "the same job, attempt and token")
		stored := b.step(t, j.StepID).DurableJob.LeaseExpiresAt
		require.True(t, stored.Equal(j.LeaseExpiresAt.Add(4*time.Second)), "the job's lease is renewed: %v", stored)
	}

	// The third job is still there for another claim.
	other := b.claimKeyed(t, w, "claim-2", 10)
	require.Len(t, other, 1)
	require.NotContains(t, []string{first[0].JobID, first[1].JobID}, other[0].JobID)

	// The answered tokens are the live ones.
	b.succeed(t, again[0])
	// A job reported is no longer answered; the other still is.
	left := b.claimKeyed(t, w, "claim-1", 2)
	require.Len(t, left, 1)
	require.Equal(t, first[1].JobID, left[0].JobID)
	require.Equal(t, first[1].LeaseToken, left[0].LeaseToken)
	b.succeed(t, again[1])
	b.succeed(t, other[0])
	// Once nothing it leased is held, the id claims afresh (nothing is due).
	require.Empty(t, b.claimKeyed(t, w, "claim-1", 2))
}

// Only the worker that made the claim gets its answer again: another worker
// of the same key naming the same claimId leases other jobs.
func TestAClaimIDIsTheWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueJobs(t, b.run(t), 2)
	w1, w2 := b.register(t), b.register(t)
	mine := b.claimKeyed(t, w1, "same-id", 1)
	require.Len(t, mine, 1)
	theirs := b.claimKeyed(t, w2, "same-id", 1)
	require.Len(t, theirs, 1)
	require.NotEqual(t, mine[0].JobID, theirs[0].JobID)
	require.NotEqual(t, mine[0].LeaseToken, theirs[0].LeaseToken)
}

// A lease that lapsed is not answered again: its job is due to any claim
// (the lapse counts as a failed attempt), so the id's claim takes it as a
// new attempt under a new token.
func TestAClaimSentAgainAfterItsLeaseLapsedClaimsAfresh(t *testing.T) {
	t.Parallel()
	b := setup(t)
	steps := b.enqueueJobs(t, b.run(t), 1)
	w := b.register(t)
	first := b.claimKeyed(t, w, "late", 1)
	require.Len(t, first, 1)
	b.clock.Add(time.Minute)
	again := b.claimKeyed(t, w, "late", 1)
	require.Len(t, again, 1)
	require.Equal(t, first[0].JobID, again[0].JobID)
	require.Equal(t, 2, again[0].Attempt)
	require.NotEqual(t, first[0].LeaseToken, again[0].LeaseToken)
	_, err := b.svc.Report(ctx, b.worker, first[0].JobID,
		jobs.ReportRequest{LeaseToken: first[0].LeaseToken, Status: "SUCCEEDED"})
	require.Equal(t, apierr.CodeLeaseLost, code(t, err))
	b.succeed(t, again[0])
	require.Equal(t, "SUCCEEDED", b.step(t, steps[0]).Status)
}

// Claims racing under one claimId (a retry sent while the first is still
// at work) lease one batch between them: each answers it, and every other
// job stays queued.
func TestConcurrentClaimsUnderOneIDLeaseOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runID := b.run(t)
	steps := b.enqueueJobs(t, runID, 10)
	w := b.register(t)
	const racers = 20
	answers := make([][]jobs.ClaimedJob, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = b.claimKeyed(t, w, "raced", 3)
		}()
	}
	close(start)
	wg.Wait()
	require.Len(t, answers[0], 3)
	for i := range answers {
		require.Equal(t, answers[0], answers[i], "racer %d", i)
	}
	queued := 0
	for _, id := range steps {
		if b.step(t, id).Status == "QUEUED" {
			queued++
		}
	}
	require.Equal(t, 7, queued)
}

// A claimId outside its rule is refused, naming the field, and leases
// nothing.
func TestAClaimIDIsChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	steps := b.enqueueJobs(t, b.run(t), 1)
	w := b.register(t)
	for _, id := range []string{"", "has space", "é", string(make([]byte, 65))} {
		_, err := b.svc.Claim(ctx, b.worker, w, jobs.ClaimRequest{ClaimID: &id})
		require.Equal(t, apierr.CodeInvalidRequest, code(t, err), "%q", id)
		require.Contains(t, err.Error(), "claimId", "%q", id)
	}
	require.Equal(t, "QUEUED", b.step(t, steps[0]).Status)
}

// A job cancelled while its claim's answer was lost is not answered again:
// its worker would start what the operator stopped. The other job of the
// claim still is.
func TestAClaimSentAgainLeavesOutACancelledJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	steps := b.enqueueJobs(t, b.run(t), 2)
	w := b.register(t)
	first := b.claimKeyed(t, w, "cancel", 2)
	require.Len(t, first, 2)
	_, err := b.svc.CancelStep(ctx, b.ws, steps[0])
	require.NoError(t, err)
	again := b.claimKeyed(t, w, "cancel", 2)
	require.Len(t, again, 1)
	require.Equal(t, steps[1], again[0].StepID)
}

// ExplainClaim (scripts/jobsbench) plans the claim statement as the service
// sends it, and leases nothing: it rolls back (it once sent a parameter
// short, and failed).
func TestExplainClaimPlansTheClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	steps := b.enqueueJobs(t, b.run(t), 1)
	plan, err := b.svc.ExplainClaim(ctx, b.worker, b.register(t), 10)
	require.NoError(t, err)
	require.Contains(t, plan, "jobs_claim_keyed")
	require.Equal(t, "QUEUED", b.step(t, steps[0]).Status)
}

// A claim sent again never shortens a lease a heartbeat renewed after the
// claim read its clock (it reads it before it waits for the id's turn): here
// the heartbeat's reading is ahead of the repeat's (review).
func TestAClaimSentAgainNeverShortensALease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueJobs(t, b.run(t), 1)
	w := b.register(t)
	t0 := b.clock.Now()
	first := b.claimKeyed(t, w, "late-repeat", 1)
	require.Len(t, first, 1)
	b.clock.Set(t0.Add(10 * time.Second))
	hb, err := b.svc.Heartbeat(ctx, b.worker, first[0].JobID, jobs.HeartbeatRequest{LeaseToken: first[0].LeaseToken})
	require.NoError(t, err)
	b.clock.Set(t0.Add(5 * time.Second)) // the repeat's reading, taken before the heartbeat committed
	again := b.claimKeyed(t, w, "late-repeat", 1)
	require.Len(t, again, 1)
	require.True(t, again[0].LeaseExpiresAt.Equal(*hb.LeaseExpiresAt), "%v, heartbeat %v", again[0].LeaseExpiresAt,
		*hb.LeaseExpiresAt)
}

// A claim is answered again only within one lease's length of the claim
// that leased its jobs: a worker whose answers keep getting lost, asking
// again and again, would otherwise renew the lease for good, and the job
// would never lapse to another worker.
func TestAClaimIsAnsweredAgainWithinOneLeaseOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	steps := b.enqueueJobs(t, b.run(t), 1)
	w := b.register(t)
	first := b.claimKeyed(t, w, "lost-again", 1)
	require.Len(t, first, 1)
	lease := time.Duration(first[0].LeaseMs) * time.Millisecond
	b.clock.Add(lease - time.Second)
	require.Len(t, b.claimKeyed(t, w, "lost-again", 1), 1, "within the first lease: answered again, renewed")
	b.clock.Add(lease - time.Second)
	require.Empty(t, b.claimKeyed(t, w, "lost-again", 1), "past it: not answered again, and still leased")
	b.clock.Add(2 * time.Second) // the renewed lease lapses
	again := b.claimKeyed(t, w, "lost-again", 1)
	require.Len(t, again, 1)
	require.Equal(t, 2, again[0].Attempt, "claimed afresh, the lapse counted")
	require.Equal(t, steps[0], again[0].StepID)
}

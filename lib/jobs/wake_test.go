package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// parkedFor is how long a parked claim (parkClaim) waits for its wake
// before the test cancels it: well within its wait of waitSeconds 20.
const parkedFor = 10 * time.Second

// parkClaim starts a long-polling claim (waitSeconds 20) on a service whose
// poll pause is an hour, and returns once its first look found nothing.
// The claim then looks again only when woken or when its 20 s wait runs
// out, and the test cancels it before that (parkedFor): cancelled, it
// answers no jobs without looking. So a claim that returns a job was woken
// for it, and a test whose wake is gone fails. Its context has no deadline
// on purpose: with one (10 s), the wait ran out just before it
// (answerMargin), and that last look found the job without any wake, so
// every wake test passed with its wake removed, only slower (QA).
func (b *bundle) parkClaim(t *testing.T, wid string) <-chan jobs.ClaimResult {
	t.Helper()
	jobs.SetPolling(b.svc, time.Hour)
	c, cancel := context.WithCancel(ctx)
	stop := time.AfterFunc(parkedFor, cancel)
	out, done := make(chan jobs.ClaimResult, 1), make(chan struct{})
	t.Cleanup(func() { cancel(); <-done }) // a failed test ends its claim before its database
	looked := b.looks.count(wid)
	go func() {
		defer close(done)
		defer stop.Stop()
		res, err := b.svc.Claim(c, b.worker, wid, jobs.ClaimRequest{Limit: ptr(10), WaitSeconds: ptr(20)})
		if err != nil {
			t.Errorf("claim: %v", err)
		}
		out <- res
	}()
	b.waitLook(t, wid, looked)
	return out
}

// waitLook waits until the worker's claims have made a look after the
// first looked (and found nothing: the tests then expect the claim still
// waiting).
func (b *bundle) waitLook(t *testing.T, wid string, looked int) {
	t.Helper()
	require.Eventually(t, func() bool { return b.looks.count(wid) > looked }, 5*time.Second, time.Millisecond)
}

// lookCounter counts each worker's looks (jobs.OnLook).
type lookCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *lookCounter) add(workerID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[workerID]++
}

func (c *lookCounter) count(workerID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[workerID]
}

func claimedSteps(res jobs.ClaimResult) []string {
	var steps []string
	for _, j := range res.Jobs {
		steps = append(steps, j.StepID)
	}
	return steps
}

func TestLongPollClaimIsWokenByAnEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wid := b.register(t)
	run := b.run(t)
	parked := b.parkClaim(t, wid)

	st := b.enqueue(t, run, jobs.EnqueueRequest{})
	require.Equal(t, []string{st.StepID}, claimedSteps(<-parked))
}

func TestLongPollClaimIsWokenWhenADependencyIsReleased(t *testing.T) {
	t.Parallel()
	for name, report := range map[string]func(b *bundle, j jobs.ClaimedJob) error{
		"single": func(b *bundle, j jobs.ClaimedJob) error {
			_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "SUCCEEDED"})
			return err
		},
		"batch": func(b *bundle, j jobs.ClaimedJob) error {
			_, err := b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: []jobs.BatchReportItem{
				{JobID: j.JobID, LeaseToken: j.LeaseToken, Status: "SUCCEEDED"}}})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			wid := b.register(t)
			run := b.run(t)
			first := b.enqueue(t, run, jobs.EnqueueRequest{})
			second := b.enqueue(t, run, jobs.EnqueueRequest{IdempotencyKey: ptr("second"), AfterStepID: &first.StepID,
				AfterStatus: ptr(jobs.StatusSucceeded)})
			require.Equal(t, "WAITING", second.Status)
			j := b.claimOne(t, wid)
			parked := b.parkClaim(t, wid)

			require.NoError(t, report(b, j))
			require.Equal(t, []string{second.StepID}, claimedSteps(<-parked))
		})
	}
}

func TestLongPollClaimIsWokenByAToolTest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wid := b.register(t)
	parked := b.parkClaim(t, wid)

	res, err := b.svc.TestTool(ctx, b.worker, "send_email", jobs.ToolTestRequest{Version: "1"})
	require.NoError(t, err)
	require.Equal(t, []string{res.StepID}, claimedSteps(<-parked))
}

func TestLongPollClaimIsWokenByAResumeAndAReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wid := b.register(t)
	run := b.run(t)
	st := b.enqueue(t, run, jobs.EnqueueRequest{MaxAttempts: ptr(int64(1))})
	b.fail(t, b.claimOne(t, wid), &jobs.ReportError{Message: "down", Retryable: ptr(false)})
	require.Equal(t, jobs.StatusExhausted, b.step(t, st.StepID).Status)
	eps, err := b.svc.ListEndpoints(ctx, b.ws, "", 10)
	require.NoError(t, err)
	_, err = b.svc.SetPaused(ctx, b.ws, eps[0].ID, true)
	require.NoError(t, err)

	// The replay wakes the claim, whose next look finds the endpoint
	// paused; the resume wakes it once more.
	parked := b.parkClaim(t, wid)
	looked := b.looks.count(wid)
	_, err = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
		MaxAttempts: ptr(int64(1))})
	require.NoError(t, err)
	b.waitLook(t, wid, looked)
	_, err = b.svc.SetPaused(ctx, b.ws, eps[0].ID, false)
	require.NoError(t, err)
	require.Equal(t, []string{st.StepID}, claimedSteps(<-parked))
}

// A key has at most so many claims waiting on one instance; one beyond is
// answered at once, as without waitSeconds, and a slot freed is taken again
// (security review: hundreds of one key's waiting claims slowed every other
// workspace's requests).
func TestAKeysWaitingClaimsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs.SetMaxWaitingClaims(b.svc, 2)
	wid := b.register(t)
	run := b.run(t)
	first, second := b.parkClaim(t, wid), b.parkClaim(t, wid)

	over := make(chan jobs.ClaimResult, 1)
	go func() {
		res, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{Limit: ptr(10), WaitSeconds: ptr(20)})
		if err != nil {
			t.Errorf("claim: %v", err)
		}
		over <- res
	}()
	select { // answered at once; waiting, it would take its 20 s (the poll pause is an hour)
	case res := <-over:
		require.Empty(t, res.Jobs)
	case <-time.After(10 * time.Second):
		t.Fatal("a claim beyond the bound waited")
	}

	st := b.enqueue(t, run, jobs.EnqueueRequest{})
	require.Equal(t, []string{st.StepID}, claimedSteps(<-first), "the waiting ones still wait, and are woken")
	third := b.parkClaim(t, wid) // the freed slot is taken again
	for i, waiting := 0, []<-chan jobs.ClaimResult{second, third}; i < 2; i++ {
		st := b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(fmt.Sprint(i))})
		var res jobs.ClaimResult
		select { // one new job wakes one waiting claim
		case res = <-waiting[0]:
			waiting = waiting[1:]
		case res = <-waiting[len(waiting)-1]:
			waiting = waiting[:len(waiting)-1]
		}
		require.Equal(t, []string{st.StepID}, claimedSteps(res))
	}
}

// Closing an open circuit wakes the waiting claims, whatever closes it:
// the jobs it held are claimable at once.
func TestLongPollClaimIsWokenWhenACircuitCloses(t *testing.T) {
	t.Parallel()
	for name, closeIt := range map[string]func(t *testing.T, b *bundle, ep jobs.Endpoint){
		"operator": func(t *testing.T, b *bundle, ep jobs.Endpoint) {
			_, err := b.svc.CloseCircuit(ctx, b.ws, ep.ID)
			require.NoError(t, err)
		},
		"breaker off": func(t *testing.T, b *bundle, ep jobs.Endpoint) {
			_, err := b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{
				ExpectedVersion: opt(b.endpoint(t, ep.ID).Version),
				PolicyFields:    jobs.PolicyFields{CircuitFailureThreshold: null[int64]()}})
			require.NoError(t, err)
		},
		"probe succeeded": nil, // its probe is claimed before the claim parks
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ep := b.circuitEndpoint(t, 1, 3_600_000)
			b.enqueueN(t, 3)
			wid := b.register(t)
			b.fail(t, b.claimOne(t, wid), nil)
			require.Equal(t, jobs.CircuitOpen, b.endpoint(t, ep.ID).Circuit.State)
			var probe jobs.ClaimedJob
			if closeIt == nil {
				b.clock.Add(time.Hour) // the cooldown: the failed job is due again too
				probe = b.claimOne(t, wid)
			}
			parked := b.parkClaim(t, wid)

			if closeIt == nil {
				b.succeed(t, probe)
			} else {
				closeIt(t, b, ep)
			}
			require.Equal(t, jobs.CircuitClosed, b.endpoint(t, ep.ID).Circuit.State)
			require.Len(t, (<-parked).Jobs, 2, "the held jobs")
		})
	}
}

// A long poll answers before its request's deadline, not at it: a platform
// that ends the function at its deadline would lose an answer sent then
// (deployment review), with the leases of a claim made in its last look.
func TestALongPollAnswersBeforeItsDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wid := b.register(t)
	jobs.SetPolling(b.svc, time.Hour)
	c, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	defer cancel()
	res, err := b.svc.Claim(c, b.worker, wid, jobs.ClaimRequest{Limit: ptr(10), WaitSeconds: ptr(20)})
	require.NoError(t, err)
	require.Empty(t, res.Jobs)
	require.NoError(t, c.Err(), "answered with time to spare")
}

// A report that ends an attempt on an endpoint with maxConcurrent frees its
// slot: a claim parked while every slot was taken is woken for the job that
// waited for it (wake QA: it waited for its next poll), whether the report
// came alone, in a batch, or from a cancelled attempt still holding the slot.
func TestLongPollClaimIsWokenWhenASlotIsFreed(t *testing.T) {
	t.Parallel()
	for name, free := range map[string]func(b *bundle, j jobs.ClaimedJob, stepID string) error{
		"report": func(b *bundle, j jobs.ClaimedJob, _ string) error {
			_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "SUCCEEDED"})
			return err
		},
		"batch": func(b *bundle, j jobs.ClaimedJob, _ string) error {
			_, err := b.svc.ReportBatch(ctx, b.worker, jobs.BatchReportRequest{Reports: []jobs.BatchReportItem{
				{JobID: j.JobID, LeaseToken: j.LeaseToken, Status: "FAILED"}}})
			return err
		},
		"cancelled attempt": func(b *bundle, j jobs.ClaimedJob, stepID string) error {
			if _, err := b.svc.CancelStep(ctx, b.ws, stepID); err != nil {
				return err
			}
			_, err := b.svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "SUCCEEDED"})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.limitedEndpoint(t, "mailer", 1)
			wid := b.register(t)
			run := b.run(t)
			first := b.enqueue(t, run, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`1`)})
			b.clock.Add(time.Millisecond) // claimed in order
			second := b.enqueue(t, run, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`2`)})
			j := b.claimOne(t, wid)
			require.Equal(t, first.JobID, j.JobID)
			parked := b.parkClaim(t, wid) // its first look found the only slot taken

			require.NoError(t, free(b, j, first.StepID))
			require.Equal(t, []string{second.StepID}, claimedSteps(<-parked))
		})
	}
}

// An enqueue wakes a claim that can take the job: the longest parked claim
// of the workspace serves another tool, and woken, it found nothing, parked
// again and kept the wake, while the claim of the job's tool slept on to
// its next poll (wake QA: with a worker per tool, most enqueues woke the
// wrong claim).
func TestAnEnqueueWakesAClaimOfItsTool(t *testing.T) {
	t.Parallel()
	b := setup(t, "send_email@1", "send_sms@1")
	other := b.register(t, jobs.Tool{Name: "send_sms", Version: "1"})
	wid := b.register(t)
	run := b.run(t)
	b.parkClaim(t, other) // parked longest; cancelled at the test's end
	parked := b.parkClaim(t, wid)

	st := b.enqueue(t, run, jobs.EnqueueRequest{})
	require.Equal(t, []string{st.StepID}, claimedSteps(<-parked))
}

// A policy write that loosens a limit wakes the waiting claims: the jobs
// the limit held are claimable at once, as after a resume (wake QA: a
// raised maxConcurrent or a raised or removed rateLimitPerMinute left them
// to the claims' next polls).
func TestLongPollClaimIsWokenWhenALimitIsRaised(t *testing.T) {
	t.Parallel()
	for name, raise := range map[string]jobs.PolicyFields{
		"maxConcurrent raised":       {MaxConcurrent: opt[int64](2)},
		"maxConcurrent removed":      {MaxConcurrent: null[int64]()},
		"rateLimitPerMinute raised":  {RateLimitPerMinute: opt[int64](2)},
		"rateLimitPerMinute removed": {RateLimitPerMinute: null[int64]()},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			fields := jobs.PolicyFields{MaxConcurrent: opt[int64](1)}
			if raise.RateLimitPerMinute.Set {
				fields = jobs.PolicyFields{RateLimitPerMinute: opt[int64](1)}
			}
			ep, _, err := b.svc.CreateEndpoint(ctx, b.ws, jobs.CreateEndpointRequest{Name: "mailer", PolicyFields: fields})
			require.NoError(t, err)
			wid := b.register(t)
			run := b.run(t)
			b.enqueue(t, run, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`1`)})
			b.clock.Add(time.Millisecond) // claimed in order
			second := b.enqueue(t, run, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`2`)})
			b.claimOne(t, wid)
			parked := b.parkClaim(t, wid) // its first look found the limit reached

			_, err = b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt(ep.Version),
				PolicyFields: raise})
			require.NoError(t, err)
			require.Equal(t, []string{second.StepID}, claimedSteps(<-parked))
		})
	}
}

// A raised maxConcurrent wakes every waiting claim at once, and together
// they lease exactly the slots it added: the limit holds under the herd.
func TestClaimsWokenByARaisedLimitLeaseOnlyItsNewSlots(t *testing.T) {
	t.Parallel()
	const parkedClaims = 8
	b := setup(t)
	ep := b.limitedEndpoint(t, "mailer", 1)
	run := b.run(t)
	for i := range 10 {
		b.enqueue(t, run, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(fmt.Sprint(i))})
	}
	b.claimOne(t, b.register(t))
	parked := make([]<-chan jobs.ClaimResult, parkedClaims)
	for i := range parked {
		parked[i] = b.parkClaim(t, b.register(t)) // each found the only slot taken
	}

	_, err := b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{ExpectedVersion: opt(ep.Version),
		PolicyFields: jobs.PolicyFields{MaxConcurrent: opt[int64](3)}})
	require.NoError(t, err)
	leased := 0
	for _, p := range parked {
		leased += len((<-p).Jobs)
	}
	require.Equal(t, 2, leased, "the two slots the raise added, and no more")
	require.Equal(t, 3, b.runningCount(t, "mailer"))
}

// A long poll names no worker it may not claim for: an unknown worker and
// another key's are 404 at once, as a claim without waitSeconds answers
// (the poll reads its worker's tools before it parks).
func TestALongPollForAnotherKeysWorkerIsNotFound(t *testing.T) {
	t.Parallel()
	b, other := setup(t), setup(t)
	for _, wid := range []string{other.register(t), "wkr_01m8kjt9g002extbwvcndh4bkd"} {
		for _, wait := range []int{0, 20} {
			_, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{WaitSeconds: ptr(wait)})
			require.Equal(t, apierr.CodeNotFound, code(t, err), "worker %s, waitSeconds %d", wid, wait)
		}
	}
}

// A freed slot wakes a claim of the tool whose attempt freed it before a
// claim of another tool parked longer, which, woken, found nothing and
// kept the wake, while the claim the slot was for slept to its next poll.
// With nothing of that tool queued on the endpoint, that claim finds
// nothing and passes the wake on to the other tool's claim, whose job the
// slot is for (wake QA: that claim slept to its next poll, up to a second).
func TestAFreedSlotWakesAClaimOfItsTool(t *testing.T) {
	t.Parallel()
	for name, next := range map[string]jobs.EnqueueRequest{
		"its tool's job":     {Endpoint: ptr("mailer"), Input: json.RawMessage(`2`)},
		"another tool's job": {Name: "send_sms", Version: "1", Endpoint: ptr("mailer")},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, "send_email@1", "send_sms@1")
			b.limitedEndpoint(t, "mailer", 1)
			other := b.register(t, jobs.Tool{Name: "send_sms", Version: "1"})
			wid := b.register(t)
			run := b.run(t)
			b.enqueue(t, run, jobs.EnqueueRequest{Endpoint: ptr("mailer"), Input: json.RawMessage(`1`)})
			b.clock.Add(time.Millisecond) // claimed in order
			second := b.enqueue(t, run, next)
			j := b.claimOne(t, wid)
			forOther := b.parkClaim(t, other) // parked longest; cancelled at the test's end
			forEmail := b.parkClaim(t, wid)

			b.succeed(t, j)
			parked := forEmail
			if next.Name == "send_sms" {
				parked = forOther
			}
			require.Equal(t, []string{second.StepID}, claimedSteps(<-parked))
		})
	}
}

package jobs_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// A rateLimitPerMinute set mid-minute holds for that whole UTC minute: the
// attempts the endpoint's claims started earlier in it count, though no
// count was kept for them then (without a limit a claim keeps none, unless
// maxConcurrent makes it write the endpoint's row). QA: a limit of 4 set at
// 12:00:30 after 3 claims let 4 more start by 12:01.
func TestARateLimitSetMidMinuteCountsTheMinutesEarlierClaims(t *testing.T) {
	t.Parallel()
	for name, fields := range map[string]jobs.PolicyFields{
		"no limit before":     {},
		"maxConcurrent set":   {MaxConcurrent: opt[int64](10)},
		"another limit first": {RateLimitPerMinute: opt[int64](100)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.createEndpoint(t, "send_email", fields)
			run := b.run(t)
			for i := range 8 {
				b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage([]byte{byte('0' + i)})})
			}
			w := b.register(t)
			b.clock.Add(10 * time.Second) // 12:00:10
			require.Len(t, b.claim(t, w, 3), 3)
			b.clock.Add(20 * time.Second) // 12:00:30
			eps, err := b.svc.ListEndpoints(ctx, b.ws, "", 10)
			require.NoError(t, err)
			_, err = b.svc.UpdatePolicy(ctx, b.ws, eps[0].ID, jobs.UpdatePolicyRequest{
				ExpectedVersion: opt(eps[0].Version), PolicyFields: jobs.PolicyFields{RateLimitPerMinute: opt[int64](4)}})
			require.NoError(t, err)

			require.Len(t, b.claim(t, w, 10), 1, "the minute's 4th attempt")
			require.Empty(t, b.claim(t, w, 10), "the minute's allowance is spent")
			require.Contains(t, b.health(t).RateLimitedEndpoints, "send_email")
			b.clock.Add(30 * time.Second) // 12:01:00
			require.Len(t, b.claim(t, w, 10), 4)
		})
	}
}

// A heartbeat that takes back a job the sweeper requeued after its lease
// lapsed starts no attempt: the attempt it continues was counted against
// the endpoint's rateLimitPerMinute when its claim started it, and its
// worker was at work all along. It is neither counted again nor refused in
// a minute whose allowance is spent (refused, its worker would stop, and a
// claim would start the job again: one more call to the service, which the
// limit is there to spare); a claim of the requeued job starts a new
// attempt and is counted. Not parallel: the sweep moves other tests' jobs.
func TestATakenBackJobIsNotCountedAgainstTheRateLimit(t *testing.T) {
	for _, mode := range []string{"taken back, then the minute's claim", "the minute's claim, then taken back",
		"claimed instead"} {
		t.Run(mode, func(t *testing.T) {
			b := setup(t, "send_email@1", "send_email@2")
			b.createEndpoint(t, "send_email", jobs.PolicyFields{RateLimitPerMinute: opt[int64](1)})
			run := b.run(t)
			st := b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`"stalled"`), TimeoutMs: ptr[int64](1_000)})
			w := b.register(t)
			stale := b.claimOne(t, w) // 12:00's one attempt
			b.clock.Add(11*time.Second + jobs.RequeueLapsedAfter + time.Second)
			b.sweep(t)
			require.Equal(t, jobs.StatusQueued, b.step(t, st.StepID).Status)
			// Another version's job on the same endpoint, which a claim of
			// its own worker may start without the requeued one.
			next := b.enqueue(t, run, jobs.EnqueueRequest{Name: "send_email", Version: "2", Endpoint: ptr("send_email")})
			w2 := b.register(t, jobs.Tool{Name: "send_email", Version: "2"})
			heartbeat := func() error {
				_, err := b.svc.Heartbeat(ctx, b.worker, stale.JobID, jobs.HeartbeatRequest{LeaseToken: stale.LeaseToken})
				return err
			}

			switch mode {
			case "claimed instead":
				require.Equal(t, st.JobID, b.claimOne(t, w).JobID, "the requeued job's claim: this minute's one attempt")
				require.Equal(t, "lease_lost", code(t, heartbeat()), "superseded by the claim")
				require.Empty(t, b.claim(t, w2, 10), "the minute's allowance is spent")
				return
			case "taken back, then the minute's claim":
				require.NoError(t, heartbeat(), "taken back")
				require.Equal(t, next.JobID, b.claimOne(t, w2).JobID, "the minute's one attempt is still to start")
			default:
				require.Equal(t, next.JobID, b.claimOne(t, w2).JobID)
				require.NoError(t, heartbeat(), "taken back in a spent minute")
			}
			require.Equal(t, jobs.StatusRunning, b.step(t, st.StepID).Status)
			b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`"after"`)})
			require.Empty(t, b.claim(t, w, 10), "the minute's allowance is spent")
		})
	}
}

// A limit set across a minute's end holds for the minute it takes effect
// in, not the one its write started in: a write that read its clock at
// 12:00:59 and then waited for the endpoint's gate (a report holding it)
// while a claim started attempts at 12:01:00 counted them into 12:00, and
// 12:01's first claim then started its window afresh, those attempts
// uncounted (review: 2 started at 12:01:00 and a limit of 3 let 3 more
// start in 12:01).
func TestARateLimitSetAcrossAMinutesEndCountsTheNewMinutesClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createEndpoint(t, "send_email", jobs.PolicyFields{})
	run := b.run(t)
	for i := range 6 {
		b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage([]byte{byte('0' + i)})})
	}
	w := b.register(t)
	eps, err := b.svc.ListEndpoints(ctx, b.ws, "", 10)
	require.NoError(t, err)
	ep := eps[0]

	// A report of the endpoint's job in flight holds its gate shared.
	pool := b.env.App.Pool
	report, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = report.Rollback(context.Background()) }()
	_, err = report.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(hashtextextended($1::text, 0))`, ep.ID)
	require.NoError(t, err)
	waits := apitest.NewLockWaits(t, pool, apitest.BackendPID(t, report))

	b.clock.Add(59 * time.Second) // 12:00:59
	var putErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, putErr = b.svc.UpdatePolicy(ctx, b.ws, ep.ID, jobs.UpdatePolicyRequest{
			ExpectedVersion: opt(ep.Version), PolicyFields: jobs.PolicyFields{RateLimitPerMinute: opt[int64](3)}})
	}()
	waits.Waiting(done, "the policy write waits for the endpoint's gate")

	b.clock.Add(time.Second) // 12:01:00
	require.Len(t, b.claim(t, w, 2), 2, "no limit yet: 12:01's first two attempts")
	require.NoError(t, report.Rollback(ctx))
	<-done
	require.NoError(t, putErr)

	require.Len(t, b.claim(t, w, 10), 1, "12:01's third attempt")
	require.Empty(t, b.claim(t, w, 10), "12:01's allowance is spent")
}

package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// Long-polling claims (README "Durable jobs", Work: waitSeconds), beside
// the jobs model (model_test.go), whose claims answer at once: a claim that
// waits takes what becomes claimable during its wait (an enqueue, a due
// time, a lapse, a retry), two waiting claims never share a job, a wait
// keeps to the worker's handlers and the endpoints' gates and ends empty
// when nothing fits, and a claim whose client went away grants nothing, or
// its grant lapses and the job is claimed again: never lost.

// pollPause is the long poll's pause between looks in these tests: short,
// so that a claim sees a clock move (which wakes nobody) at its next look.
const pollPause = 10 * time.Millisecond

// polled is a long poll's answer.
type polled struct {
	res jobs.ClaimResult
	err error
}

// longPoll starts a claim of worker wid (limit, waitSeconds wait) on svc
// with context c and returns once its first look found nothing, as
// parkClaim does; its answer comes on the channel.
func (b *bundle) longPoll(t *testing.T, c context.Context, svc *jobs.Service, wid string, limit, wait int) <-chan polled {
	t.Helper()
	out, done := make(chan polled, 1), make(chan struct{})
	t.Cleanup(func() { <-done }) // every caller's context ends: the claim answers before the database goes
	looked := b.looks.count(wid)
	go func() {
		defer close(done)
		res, err := svc.Claim(c, b.worker, wid, jobs.ClaimRequest{Limit: ptr(limit), WaitSeconds: ptr(wait)})
		out <- polled{res, err}
	}()
	b.waitLook(t, wid, looked)
	return out
}

// answered waits for a long poll's answer: the poll ends by itself (a job,
// or its wait's end) or by its context (parkedFor, a hang guard only).
func answered(t *testing.T, ch <-chan polled) jobs.ClaimResult {
	t.Helper()
	p := <-ch
	require.NoError(t, p.err)
	return p.res
}

// pollContext is a long poll's context, cancelled after parkedFor (a hang
// guard: a poll cancelled so answers no job, and the test fails). Without a
// deadline, as parkClaim's: with one, the poll's last look before it
// (answerMargin) would find the job whether or not its looks meanwhile did.
func pollContext(t *testing.T) context.Context {
	c, cancel := context.WithCancel(ctx)
	stop := time.AfterFunc(parkedFor, cancel)
	t.Cleanup(func() { stop.Stop(); cancel() })
	return c
}

// A long poll answers the job that becomes claimable while it waits,
// whatever makes it so, found at a look after it (a clock move wakes no one).
func TestALongPollTakesAJobThatBecomesClaimableDuringItsWait(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		before func(t *testing.T, b *bundle, run string) (stepID string)
		during func(t *testing.T, b *bundle, run string) (stepID string)
		// attempt is the attempt the long poll is answered.
		attempt int
	}{
		"enqueued": {
			during: func(t *testing.T, b *bundle, run string) string {
				return b.enqueue(t, run, jobs.EnqueueRequest{}).StepID
			},
			attempt: 1,
		},
		"delayed enqueue comes due": {
			before: func(t *testing.T, b *bundle, run string) string {
				return b.enqueue(t, run, jobs.EnqueueRequest{DelayMs: ptr[int64](60_000)}).StepID
			},
			during:  func(t *testing.T, b *bundle, _ string) string { b.clock.Add(time.Minute); return "" },
			attempt: 1,
		},
		"lease lapses": {
			before: func(t *testing.T, b *bundle, run string) string {
				st := b.enqueue(t, run, jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000)})
				b.claimOne(t, b.register(t)) // another worker's, which vanishes
				return st.StepID
			},
			during: func(t *testing.T, b *bundle, _ string) string {
				b.clock.Add(time.Minute) // past its lease (1 s and the grace)
				return ""
			},
			attempt: 2,
		},
		"failure retried (nack)": {
			before: func(t *testing.T, b *bundle, run string) string {
				st := b.enqueue(t, run, jobs.EnqueueRequest{})
				b.fail(t, b.claimOne(t, b.register(t)), &jobs.ReportError{Message: "busy", RetryAfterMs: ptr[int64](60_000)})
				require.Equal(t, jobs.StatusRetryScheduled, b.step(t, st.StepID).Status)
				return st.StepID
			},
			during: func(t *testing.T, b *bundle, _ string) string {
				b.clock.Add(time.Hour) // past its backoff (STANDARD: at most 15 min, and the 60 s floor)
				return ""
			},
			attempt: 2,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			jobs.SetPolling(b.svc, pollPause)
			run := b.run(t)
			var stepID string
			if tc.before != nil {
				stepID = tc.before(t, b, run)
			}
			wid := b.register(t)
			poll := b.longPoll(t, pollContext(t), b.svc, wid, 10, 20) // its first look found nothing
			if s := tc.during(t, b, run); s != "" {
				stepID = s
			}
			res := answered(t, poll)
			require.Equal(t, []string{stepID}, claimedSteps(res))
			require.Equal(t, tc.attempt, res.Jobs[0].Attempt)
		})
	}
}

// A long poll keeps to its worker's handlers and to the endpoints' gates
// while it waits: it leases no job its worker does not serve (exact
// name@version), none of a paused endpoint, one at its maxConcurrent, one
// that has started its rateLimitPerMinute this minute, or one whose circuit
// is open before its probe time; with nothing else due it answers empty at
// its wait's end (having looked again meanwhile), the held job untouched. A
// long poll waiting when the gate opens takes the job (for an open circuit,
// the one probe).
func TestALongPollRespectsHandlersAndGates(t *testing.T) {
	t.Parallel()
	// Each case makes a due job that the worker's claims may not lease now
	// (held, its step), and answers open, which lets the worker lease a
	// job and answers that job's step.
	for name, held := range map[string]func(t *testing.T, b *bundle, run string) (string, func() string){
		"another handler version or tool": func(t *testing.T, b *bundle, run string) (string, func() string) {
			b.enqueue(t, run, jobs.EnqueueRequest{Name: "send_email", Version: "2"})
			st := b.enqueue(t, run, jobs.EnqueueRequest{Name: "charge", Version: "1"})
			return st.StepID, func() string {
				return b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`"served"`)}).StepID
			}
		},
		"paused": func(t *testing.T, b *bundle, run string) (string, func() string) {
			ep := b.limitedEndpoint(t, "send_email", 10)
			_, err := b.svc.SetPaused(ctx, b.ws, ep.ID, true)
			require.NoError(t, err)
			st := b.enqueue(t, run, jobs.EnqueueRequest{})
			return st.StepID, func() string {
				_, err := b.svc.SetPaused(ctx, b.ws, ep.ID, false)
				require.NoError(t, err)
				return st.StepID
			}
		},
		"maxConcurrent": func(t *testing.T, b *bundle, run string) (string, func() string) {
			b.limitedEndpoint(t, "send_email", 1)
			b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
			b.clock.Add(time.Millisecond) // claimed in order
			st := b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`2`)})
			first := b.claimOne(t, b.register(t))
			return st.StepID, func() string { b.succeed(t, first); return st.StepID }
		},
		"rateLimitPerMinute": func(t *testing.T, b *bundle, run string) (string, func() string) {
			b.createEndpoint(t, "send_email", jobs.PolicyFields{RateLimitPerMinute: opt[int64](1)})
			b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`1`)})
			b.clock.Add(time.Millisecond)
			st := b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`2`)})
			b.succeed(t, b.claimOne(t, b.register(t))) // the minute's one claim
			return st.StepID, func() string {
				b.clock.Add(time.Minute) // the next minute's allowance
				return st.StepID
			}
		},
		"circuit open": func(t *testing.T, b *bundle, run string) (string, func() string) {
			b.circuitEndpoint(t, 1, 3_600_000)
			b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`1`), MaxAttempts: ptr[int64](1)})
			b.clock.Add(time.Millisecond)
			st := b.enqueue(t, run, jobs.EnqueueRequest{Input: json.RawMessage(`2`)})
			b.fail(t, b.claimOne(t, b.register(t)), &jobs.ReportError{Message: "down"}) // opens it
			return st.StepID, func() string {
				b.clock.Add(time.Hour) // its probe time
				return st.StepID
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			jobs.SetPolling(b.svc, pollPause)
			run := b.run(t)
			heldStep, open := held(t, b, run)
			wid := b.register(t)

			looked := b.looks.count(wid)
			res, err := b.svc.Claim(pollContext(t), b.worker, wid, jobs.ClaimRequest{Limit: ptr(10), WaitSeconds: ptr(1)})
			require.NoError(t, err)
			require.Empty(t, res.Jobs, "nothing fits: empty at the wait's end")
			require.Greater(t, b.looks.count(wid), looked+1, "it looked again while it waited")
			require.Equal(t, 0, b.step(t, heldStep).DurableJob.Attempt, "the held job untouched")

			poll := b.longPoll(t, pollContext(t), b.svc, wid, 10, 20)
			want := open()
			require.Equal(t, []string{want}, claimedSteps(answered(t, poll)))
		})
	}
}

// Long polls waiting at once, on two instances, with jobs enqueued in
// bursts and workers vanishing with what they claimed (their leases lapse
// and are claimed again), never get the same job: every job's attempts are
// granted once each, numbered 1, 2, … in order, each once the one before
// lapsed (its lease's end, as the server set it, no later than the next
// one's start: no two live leases), no claim answers more than its limit,
// and every job ends claimed and reported, its attempts all answered to a
// claim. Only the workers' handler's jobs are claimed, and no more than 2
// of an endpoint with maxConcurrent 2 are seen leased at once (a lease the
// clock has ended holds no slot).
func TestLongPollsNeverShareAJob(t *testing.T) {
	t.Parallel()
	for _, seed := range apitest.ModelSeeds(t, 2) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { t.Parallel(); runSharedLongPolls(t, seed) })
	}
}

// lpJob is a job's input in runSharedLongPolls: its number and endpoint.
type lpJob struct {
	I        int
	Endpoint string
}

func runSharedLongPolls(t *testing.T, seed uint64) {
	const (
		claimers = 6
		total    = 40
		limited  = "limited" // maxConcurrent 2
	)
	b := setup(t)
	other := apitest.Start(t, apitest.WithNow(b.clock.Now)) // a second instance, on the same clock
	svcs := []*jobs.Service{b.svc, other.App.Server.Jobs}
	jobs.OnLook(svcs[1], b.looks.add)
	for _, s := range svcs {
		jobs.SetPolling(s, pollPause)
	}
	b.limitedEndpoint(t, limited, 2)
	run := b.run(t)
	rng := rand.New(rand.NewPCG(seed, 0))

	var (
		mu      sync.Mutex
		grants  = map[string][]jobs.ClaimedJob{} // by job, in the order answered
		leased  = map[string]time.Time{}         // the limited endpoint's jobs granted and not yet reported, by lease end
		peak    int
		done    = map[string]bool{} // reported
		failed  []string
		workers []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failed = append(failed, fmt.Sprintf(format, args...))
	}
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for w := range claimers {
		wid := b.register(t)
		workers = append(workers, wid)
		wrng := rand.New(rand.NewPCG(seed, uint64(w+1)))
		svc := svcs[w%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for stop.Err() == nil {
				limit := 1 + wrng.IntN(3)
				res, err := svc.Claim(stop, b.worker, wid, jobs.ClaimRequest{Limit: ptr(limit), WaitSeconds: ptr(20)})
				if err != nil {
					if stop.Err() == nil {
						fail("worker %d: claim: %v", w, err)
					}
					return
				}
				if len(res.Jobs) > limit {
					fail("worker %d: %d jobs answered a claim of limit %d", w, len(res.Jobs), limit)
				}
				for _, j := range res.Jobs {
					var in lpJob
					_ = json.Unmarshal(j.Input, &in)
					mu.Lock()
					grants[j.JobID] = append(grants[j.JobID], j)
					if j.Name != "send_email" || j.Version != "1" {
						failed = append(failed, fmt.Sprintf("worker %d: claimed %s@%s", w, j.Name, j.Version))
					}
					if in.Endpoint == limited {
						// A lease ended by the clock (a vanished worker's:
						// the clock moves by minutes) holds no slot: the
						// server frees it at the lapse, before the job is
						// claimed again (a test that counted it until then
						// saw 3 once: the lapsed one and two granted after).
						now := b.clock.Now()
						for id, end := range leased {
							if !end.After(now) {
								delete(leased, id)
							}
						}
						leased[j.JobID] = j.LeaseExpiresAt // granted: its slot is held from before now
						peak = max(peak, len(leased))
					}
					mu.Unlock()
					if j.Attempt <= 2 && wrng.IntN(5) == 0 {
						continue // the worker vanishes with it: its lease lapses
					}
					mu.Lock()
					delete(leased, j.JobID) // before the report frees its slot
					mu.Unlock()
					_, err := svc.Report(ctx, b.worker, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
						Status: jobs.StatusSucceeded})
					mu.Lock()
					switch e, ok := apierr.As(err); {
					case err == nil:
						done[j.JobID] = true
					case !ok || e.Code != apierr.CodeLeaseLost: // lease_lost: lapsed, and claimed again meanwhile
						failed = append(failed, fmt.Sprintf("worker %d: report %s: %v", w, j.JobID, err))
					}
					mu.Unlock()
				}
			}
		}()
	}
	require.Eventually(t, func() bool { // every claimer waits before the first job
		for _, wid := range workers {
			if b.looks.count(wid) == 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond)

	steps := map[string]string{} // by job
	for len(steps) < total {
		for range 1 + rng.IntN(5) {
			in := lpJob{I: len(steps), Endpoint: "send_email"}
			if rng.IntN(3) == 0 {
				in.Endpoint = limited
			}
			raw, err := json.Marshal(in)
			require.NoError(t, err)
			st := b.enqueue(t, run, jobs.EnqueueRequest{Input: raw, Endpoint: ptr(in.Endpoint),
				TimeoutMs: ptr[int64](1_000), MaxAttempts: ptr[int64](10)})
			steps[st.JobID] = st.StepID
			if rng.IntN(4) == 0 { // a handler version no claimer serves
				b.enqueue(t, run, jobs.EnqueueRequest{Name: "send_email", Version: "2", Input: raw})
			}
		}
		if rng.IntN(3) == 0 {
			b.clock.Add(time.Minute) // every lease so far lapses
		}
	}
	// Until every job is reported, leases lapse now and then: a vanished
	// worker's job is claimed again at a look after.
	tick := 0
	require.Eventually(t, func() bool {
		mu.Lock()
		n := len(done)
		mu.Unlock()
		if tick++; n < len(steps) && tick%10 == 0 {
			b.clock.Add(time.Minute)
		}
		return n == len(steps)
	}, 60*time.Second, 20*time.Millisecond, "every job claimed and reported")
	cancel()
	wg.Wait()
	for _, f := range failed {
		t.Error(f)
	}
	require.LessOrEqual(t, peak, 2, "the limited endpoint's jobs seen leased at once")
	n := 0
	for _, gs := range grants {
		n += len(gs)
	}
	t.Logf("%d jobs, %d attempts granted (the others after lapses), at most %d of %s seen leased at once",
		len(steps), n, peak, limited)
	for id, stepID := range steps {
		gs := grants[id]
		slices.SortFunc(gs, func(a, b jobs.ClaimedJob) int { return a.Attempt - b.Attempt })
		for i, g := range gs {
			require.Equal(t, i+1, g.Attempt, "job %s: attempts granted in order, each once", id)
			if i > 0 {
				prev := gs[i-1]
				start := g.LeaseExpiresAt.Add(-time.Duration(g.LeaseMs) * time.Millisecond)
				require.False(t, start.Before(prev.LeaseExpiresAt),
					"job %s: attempt %d began at %v, before attempt %d's lease ended at %v", id, g.Attempt,
					start, prev.Attempt, prev.LeaseExpiresAt)
			}
		}
		st := b.step(t, stepID)
		require.Equal(t, jobs.StatusSucceeded, st.DurableJob.Status, "job %s", id)
		require.Equal(t, len(gs), st.DurableJob.Attempt, "job %s: every attempt granted was answered", id)
	}
}

// A long poll whose client goes away (its request's context ends) answers
// at once and leases nothing: while it waits, and while its look's
// statement runs (here held at the endpoint's row: the statement is
// cancelled and its transaction rolled back). A look that leased jobs and
// committed just before the client went away answers them to no one
// (README: such a claim's jobs stay leased until their leases lapse): the
// job is not lost, another worker's claim takes it once the lease lapsed,
// the unseen attempt failed with the lapse warning.
func TestALongPollWhoseClientWentAwayLosesNoJob(t *testing.T) {
	t.Parallel()
	t.Run("while waiting", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		jobs.SetPolling(b.svc, time.Hour) // it looks again only when woken
		wid := b.register(t)
		c, cancel := context.WithCancel(ctx)
		poll := b.longPoll(t, c, b.svc, wid, 10, 20)
		cancel()
		gone(t, poll)
		b.leasedNothing(t, b.enqueue(t, b.run(t), jobs.EnqueueRequest{}).StepID)
	})
	t.Run("during its look", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		jobs.SetPolling(b.svc, time.Hour)
		ep := b.limitedEndpoint(t, "send_email", 10)
		wid := b.register(t)
		c, cancel := context.WithCancel(ctx)
		poll := b.longPoll(t, c, b.svc, wid, 10, 20)

		// The endpoint's row held as a claim holds it (an enqueue's key
		// share passes): the look the enqueue wakes waits for it.
		tx, err := b.env.App.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SELECT 1 FROM job_endpoints WHERE id = $1 FOR NO KEY UPDATE`, ep.ID)
		require.NoError(t, err)
		st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{})
		pid := apitest.BackendPID(t, tx)
		never := make(chan struct{})
		apitest.WaitDoneOrBlockedBy(t, b.env.App.Pool, pid, never, "the look waits for the endpoint's row")
		cancel()
		gone(t, poll)
		require.NoError(t, tx.Rollback(ctx))
		b.leasedNothing(t, st.StepID)
	})
	t.Run("just after its look leased", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		jobs.SetPolling(b.svc, time.Hour)
		c, cancel := context.WithCancel(ctx)
		wid := b.register(t)
		looked := make(chan struct{}, 1)
		jobs.OnLook(b.svc, func(w string) { // before the service's first claim
			b.looks.add(w)
			if w == wid && b.looks.count(w) == 2 {
				cancel() // the client goes away as the look that leases commits
				looked <- struct{}{}
			}
		})
		poll := b.longPoll(t, c, b.svc, wid, 10, 20)
		st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{TimeoutMs: ptr[int64](1_000)})
		<-looked
		lost := answered(t, poll) // written to no one: the answer is lost
		require.Len(t, lost.Jobs, 1)
		require.Equal(t, jobs.StatusRunning, b.step(t, st.StepID).DurableJob.Status)

		other := b.register(t)
		require.Empty(t, b.claim(t, other, 10), "leased until its lease lapses")
		b.clock.Add(time.Duration(lost.Jobs[0].LeaseMs)*time.Millisecond + time.Millisecond)
		again := b.claimOne(t, other)
		require.Equal(t, st.JobID, again.JobID)
		require.Equal(t, 2, again.Attempt)
		x := b.executions(t, st.JobID)
		require.Len(t, x, 2)
		require.Equal(t, jobs.LapseWarning, *x[0].Warning, "the unseen attempt failed with the lapse warning")
		b.succeed(t, again)
		require.Equal(t, jobs.StatusSucceeded, b.step(t, st.StepID).DurableJob.Status)
	})
}

// gone reads the answer of a long poll whose client went away: no job, and
// no error but the cancellation of a statement it was in (its look's, or
// its worker's look-up after its first look).
func gone(t *testing.T, poll <-chan polled) {
	t.Helper()
	p := <-poll
	require.Empty(t, p.res.Jobs)
	require.True(t, p.err == nil || errors.Is(p.err, context.Canceled), "%v", p.err)
}

// leasedNothing checks that the step's job was never leased: still at
// attempt 0, and another worker's claim takes it as attempt 1, once the
// gone claim's statement has ended (cancelled, its backend may hold the
// job's row a moment longer, and a claim passes over a locked row).
func (b *bundle) leasedNothing(t *testing.T, stepID string) {
	t.Helper()
	require.Equal(t, 0, b.step(t, stepID).DurableJob.Attempt, "the gone claim leased nothing")
	wid := b.register(t)
	var got []jobs.ClaimedJob
	require.Eventually(t, func() bool {
		res, err := b.svc.Claim(ctx, b.worker, wid, jobs.ClaimRequest{Limit: ptr(1)})
		got = res.Jobs
		return err == nil && len(got) > 0
	}, 10*time.Second, 5*time.Millisecond, "claimable once the gone claim's statement ended")
	require.Equal(t, stepID, got[0].StepID)
	require.Equal(t, 1, got[0].Attempt)
}

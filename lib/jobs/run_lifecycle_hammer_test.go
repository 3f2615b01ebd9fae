package jobs_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// runEnd is what a run ended as: its status, its run.finished events'
// statuses in order, its reopen count and its step.exhausted events.
type runEnd struct {
	status    string
	finished  []string
	reopened  int
	exhausted int
}

func (b *bundle) runEnd(t testing.TB, runID string) runEnd {
	t.Helper()
	var e runEnd
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT status, reopened,
		(SELECT count(*) FROM events v JOIN jobs j ON j.step_id = v.subject_id
		 WHERE j.run_id = r.id AND v.type = 'step.exhausted')
		FROM job_runs r WHERE id = $1`, runID).Scan(&e.status, &e.reopened, &e.exhausted))
	// In the order of the run's ends (the fake clock gives them one time).
	rows, err := b.env.App.Pool.Query(ctx, `SELECT data->>'status' FROM events WHERE type = 'run.finished'
		AND subject_id = $1 ORDER BY length(dedupe_key), dedupe_key`, runID)
	require.NoError(t, err)
	e.finished, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return e
}

// requireEndedOnce says run runID ended as want, with one run.finished per
// time it ended (its first end and one per reopen), the last one want.
func (b *bundle) requireEndedOnce(t testing.TB, runID, want string) runEnd {
	t.Helper()
	e := b.runEnd(t, runID)
	require.Equal(t, want, e.status, "run %s: %+v %+v", runID, e, b.getRun(t, runID))
	require.Len(t, e.finished, e.reopened+1, "run %s: one run.finished per end (%v)", runID, e.finished)
	require.Equal(t, want, e.finished[len(e.finished)-1], "run %s", runID)
	return e
}

// reportEnd reports j's attempt, its last: SUCCEEDED, or with fail a
// non-retryable failure that exhausts it.
func (b *bundle) reportEnd(j jobs.ClaimedJob, fail bool) error {
	req := jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: jobs.StatusSucceeded}
	if fail {
		req = jobs.ReportRequest{LeaseToken: j.LeaseToken, Status: "FAILED", Error: notRetryable}
	}
	_, err := b.svc.Report(ctx, b.worker, j.JobID, req)
	return err
}

// distinct makes the n-th enqueue of a test its own step (its own
// generated key).
func distinct(n int) jobs.EnqueueRequest {
	return jobs.EnqueueRequest{Name: "send_email", Version: "1", Input: json.RawMessage(fmt.Sprint(n))}
}

// The two last steps of a run reported at the same moment, on different
// connections, with finish racing them for half the runs: the run ends
// exactly once (FAILED when either failed), one run.finished, and one
// step.exhausted per failed step.
func TestRacingLastStepsAndFinishEndTheRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.register(t)
	const runs = 40
	type pending struct {
		runID  string
		jobs   [2]jobs.ClaimedJob
		fail   [2]bool
		finish bool
	}
	all := make([]pending, runs)
	for i := range all {
		p := &all[i]
		p.runID = b.run(t)
		b.enqueue(t, p.runID, distinct(2*i))
		b.enqueue(t, p.runID, distinct(2*i+1))
		cl := b.claim(t, w, 2)
		require.Len(t, cl, 2)
		p.jobs = [2]jobs.ClaimedJob{cl[0], cl[1]}
		p.fail = [2]bool{i%4 == 1 || i%4 == 3, i%4 == 2 || i%4 == 3}
		p.finish = i%8 < 4
		if !p.finish {
			_, err := b.svc.FinishRun(ctx, b.ws, p.runID)
			require.NoError(t, err)
		}
	}
	var calls []func() error
	for _, p := range all {
		for k, j := range p.jobs {
			calls = append(calls, func() error { return b.reportEnd(j, p.fail[k]) })
		}
		if p.finish {
			calls = append(calls, func() error { _, err := b.svc.FinishRun(ctx, b.ws, p.runID); return err })
		}
	}
	race(t, calls)
	for _, p := range all {
		want, failed := "SUCCEEDED", 0
		for _, f := range p.fail {
			if f {
				want, failed = "FAILED", failed+1
			}
		}
		e := b.requireEndedOnce(t, p.runID, want)
		require.Zero(t, e.reopened)
		require.Equal(t, failed, e.exhausted, "run %s: one step.exhausted per exhausted step", p.runID)
	}
}

// An enqueue racing finish and the report of the run's last step is either
// refused (409 invalid_state, the run ended SUCCEEDED) or keeps the run
// open until its step ends: never a queued step in an ended run.
func TestAnEnqueueRacingFinishAndTheLastReportNeverLandsInAnEndedRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.register(t)
	const runs = 40
	type pending struct {
		runID string
		job   jobs.ClaimedJob
	}
	all := make([]pending, runs)
	for i := range all {
		all[i].runID = b.run(t)
		b.enqueue(t, all[i].runID, distinct(0))
		all[i].job = b.claimOne(t, w)
	}
	added := make([]*jobs.EnqueueResult, runs)
	errs := make([]error, 3*runs)
	apitest.StartTogether(3*runs, func(i int) {
		p := all[i/3]
		switch i % 3 {
		case 0:
			_, errs[i] = b.svc.FinishRun(ctx, b.ws, p.runID)
		case 1:
			errs[i] = b.reportEnd(p.job, false)
		default:
			res, err := b.svc.Enqueue(ctx, b.ws, p.runID, distinct(1))
			if e, ok := apierr.As(err); ok && e.Code == apierr.CodeInvalidState {
				return
			}
			added[i/3], errs[i] = &res, err
		}
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	late := 0
	for i, p := range all {
		if added[i] == nil {
			b.requireEndedOnce(t, p.runID, "SUCCEEDED")
			continue
		}
		late++
		require.Equal(t, "RUNNING", b.runEnd(t, p.runID).status, "run %s ended beside its queued step", p.runID)
		require.Empty(t, b.runFinishedEvents(t, p.runID))
	}
	for range late {
		b.succeed(t, b.claimOne(t, w))
	}
	for i, p := range all {
		if added[i] != nil {
			b.requireEndedOnce(t, p.runID, "SUCCEEDED")
		}
	}
	t.Logf("%d of %d enqueues landed before finish", late, runs)
}

// A replay reopening a FAILED run races the report ending the run's other
// step: whichever commits first, the run ends again once its steps decide
// it, one run.finished per end, never left RUNNING with every step ended.
func TestAReplayReopeningARunRacingItsOtherStepsEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.register(t)
	const runs = 40
	type pending struct {
		runID, replayed string
		other           jobs.ClaimedJob
		otherFails      bool
	}
	all := make([]pending, runs)
	for i := range all {
		p := &all[i]
		p.runID = b.run(t)
		p.replayed = b.enqueue(t, p.runID, distinct(0)).StepID
		b.fail(t, b.claimOne(t, w), notRetryable)
		b.enqueue(t, p.runID, distinct(1))
		p.other = b.claimOne(t, w)
		p.otherFails = i%2 == 1
		_, err := b.svc.FinishRun(ctx, b.ws, p.runID)
		require.NoError(t, err)
		require.Equal(t, "FAILED", b.runEnd(t, p.runID).status)
	}
	errs := make([]error, 2*runs)
	apitest.StartTogether(2*runs, func(i int) {
		p := all[i/2]
		if i%2 == 0 {
			_, errs[i] = b.svc.Replay(ctx, b.worker, p.replayed, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
			return
		}
		errs[i] = b.reportEnd(p.other, p.otherFails)
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	for _, p := range all {
		e := b.runEnd(t, p.runID)
		if p.otherFails {
			// Failed again: reopened or not, the other step decides it.
			b.requireEndedOnce(t, p.runID, "FAILED")
		} else {
			require.Equal(t, "RUNNING", e.status, "run %s: its replayed step is queued", p.runID)
			require.Len(t, e.finished, e.reopened)
		}
	}
	for range runs {
		b.succeed(t, b.claimOne(t, w))
	}
	for _, p := range all {
		want := "SUCCEEDED"
		if p.otherFails {
			want = "FAILED"
		}
		e := b.requireEndedOnce(t, p.runID, want)
		require.Equal(t, 1+btoi(p.otherFails), e.exhausted, "run %s", p.runID)
	}
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

// A cancel of a run's last step races that step's report: either the
// cancel wins (FAILED, the report still recorded on the attempt) or the
// report does (SUCCEEDED, the cancel refused), and the run ends once.
func TestACancelRacingTheLastReportEndsTheRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.register(t)
	const runs = 40
	type pending struct {
		runID, stepID string
		job           jobs.ClaimedJob
	}
	all := make([]pending, runs)
	for i := range all {
		p := &all[i]
		p.runID = b.run(t)
		p.stepID = b.enqueue(t, p.runID, distinct(0)).StepID
		p.job = b.claimOne(t, w)
		_, err := b.svc.FinishRun(ctx, b.ws, p.runID)
		require.NoError(t, err)
	}
	cancelled := make([]bool, runs)
	errs := make([]error, 2*runs)
	apitest.StartTogether(2*runs, func(i int) {
		p := all[i/2]
		if i%2 == 0 {
			_, err := b.svc.CancelStep(ctx, b.ws, p.stepID)
			if e, ok := apierr.As(err); ok && e.Code == apierr.CodeInvalidState {
				return
			}
			cancelled[i/2], errs[i] = err == nil, err
			return
		}
		errs[i] = b.reportEnd(p.job, false)
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	for i, p := range all {
		want := "SUCCEEDED"
		if cancelled[i] {
			want = "FAILED"
		}
		b.requireEndedOnce(t, p.runID, want)
	}
}

// A step's dependents follow each of its endings once, replays included:
// the one waiting for a failure runs after the first exhaustion and never
// again, the one waiting for a success is skipped, put back by the replay,
// and queued once the replay succeeds; step.exhausted goes out once per
// exhaustion, again when a replay exhausts again.
func TestDependentsAndExhaustedEventsFollowEachEndingOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.register(t)
	runID := b.run(t)
	a := b.enqueue(t, runID, distinct(0))
	onSuccess := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`1`), AfterStepID: &a.StepID,
		AfterStatus: ptr("SUCCEEDED")})
	onFailure := b.enqueue(t, runID, jobs.EnqueueRequest{Input: json.RawMessage(`2`), AfterStepID: &a.StepID,
		AfterStatus: ptr("FAILED")})
	replay := func() {
		t.Helper()
		_, err := b.svc.Replay(ctx, b.worker, a.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
		require.NoError(t, err)
	}
	b.fail(t, b.claimOne(t, w), notRetryable)
	require.Equal(t, jobs.StatusSkipped, b.step(t, onSuccess.StepID).Status)
	require.Equal(t, jobs.StatusQueued, b.step(t, onFailure.StepID).Status)
	b.succeed(t, b.claimOne(t, w)) // the compensation
	replay()
	require.Equal(t, jobs.StatusWaiting, b.step(t, onSuccess.StepID).Status)
	b.fail(t, b.claimOne(t, w), notRetryable)
	require.Equal(t, jobs.StatusSkipped, b.step(t, onSuccess.StepID).Status)
	require.Equal(t, jobs.StatusSucceeded, b.step(t, onFailure.StepID).Status, "the compensation ran once")
	require.Equal(t, 2, b.runEnd(t, runID).exhausted, "one step.exhausted per exhaustion")
	replay()
	b.succeed(t, b.claimOne(t, w))
	require.Equal(t, jobs.StatusQueued, b.step(t, onSuccess.StepID).Status)
	b.succeed(t, b.claimOne(t, w))
	require.Empty(t, b.claim(t, w, 10))
	_, err := b.svc.FinishRun(ctx, b.ws, runID)
	require.NoError(t, err)
	e := b.requireEndedOnce(t, runID, "SUCCEEDED")
	require.Equal(t, []string{"FAILED", "FAILED", "SUCCEEDED"}, e.finished)
	require.Equal(t, 2, e.exhausted)
}

// checkEventLedger checks workspace ws's run.finished and step.exhausted
// events against what its runs and steps went through, after a model's
// random sequence: a run ended once more than it was reopened (once, or
// not at all while RUNNING), with one run.finished per end; a step was
// exhausted once per replay that found it EXHAUSTED, and once more if it
// is EXHAUSTED now, with one step.exhausted per exhaustion.
func checkEventLedger(t *testing.T, env *apitest.Env, ws string) {
	t.Helper()
	rows, err := env.App.Pool.Query(ctx, `
		SELECT r.id, r.status, r.reopened + CASE WHEN r.status = 'RUNNING' THEN 0 ELSE 1 END,
		       (SELECT count(*) FROM events e WHERE e.type = 'run.finished' AND e.subject_id = r.id)
		FROM job_runs r WHERE r.workspace_id = $1
		UNION ALL
		SELECT j.step_id, j.status,
		       (SELECT count(*) FROM job_replays p WHERE p.job_id = j.id AND p.prior_status = 'EXHAUSTED')
		         + CASE WHEN j.status = 'EXHAUSTED' THEN 1 ELSE 0 END,
		       (SELECT count(*) FROM events e WHERE e.type = 'step.exhausted' AND e.subject_id = j.step_id)
		FROM jobs j WHERE j.workspace_id = $1`, ws)
	require.NoError(t, err)
	var id, status string
	var ends, events int
	_, err = pgx.ForEachRow(rows, []any{&id, &status, &ends, &events}, func() error {
		if ends != events {
			t.Errorf("%s (%s): ended %d times, %d events", id, status, ends, events)
		}
		return nil
	})
	require.NoError(t, err)
}

// Runs of dependent steps (a root, a step after its success and one after
// its failure, a step after the first, and an unrelated one) under
// concurrent claims and reports of every outcome, cancels, replays and
// finishes, then drained: no step is left waiting for a dependency that
// ended (no sweep ran), every run ends as its steps decide it, and the
// events follow every end (checkEventLedger).
func TestRunsOfDependentStepsUnderChaosEndAsTheirStepsDecide(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const runs = 8
	var runIDs, stepIDs []string
	one := ptr[int64](1)
	for i := range runs {
		runID := b.run(t)
		runIDs = append(runIDs, runID)
		in := func(k int) json.RawMessage { return json.RawMessage(fmt.Sprint(10*i + k)) }
		root := b.enqueue(t, runID, jobs.EnqueueRequest{Input: in(0), MaxAttempts: one}).StepID
		onOK := b.enqueue(t, runID, jobs.EnqueueRequest{Input: in(1), MaxAttempts: one, AfterStepID: &root,
			AfterStatus: ptr("SUCCEEDED")}).StepID
		onFail := b.enqueue(t, runID, jobs.EnqueueRequest{Input: in(2), MaxAttempts: one, AfterStepID: &root,
			AfterStatus: ptr("FAILED")}).StepID
		below := b.enqueue(t, runID, jobs.EnqueueRequest{Input: in(3), MaxAttempts: one, AfterStepID: &onOK,
			AfterStatus: ptr("SUCCEEDED")}).StepID
		apart := b.enqueue(t, runID, jobs.EnqueueRequest{Input: in(4), MaxAttempts: one}).StepID
		stepIDs = append(stepIDs, root, onOK, onFail, below, apart)
	}
	const claimers = 4
	wids := make([]string, claimers)
	for i := range wids {
		wids[i] = b.register(t)
	}
	outcomes := []jobs.ReportRequest{{Status: jobs.StatusSucceeded}, {Status: jobs.StatusSucceeded},
		{Status: "FAILED", Error: notRetryable}, {Status: "FAILED"}}
	errs := make([]error, claimers+2*runs)
	apitest.StartTogether(len(errs), func(g int) {
		switch {
		case g < claimers:
			n := g
			errs[g] = b.claimUntilEmpty(wids[g], 1+g%3, func(js []jobs.ClaimedJob) {
				for _, j := range js {
					n++
					req := outcomes[n%len(outcomes)]
					req.LeaseToken = j.LeaseToken
					if _, err := b.svc.Report(ctx, b.worker, j.JobID, req); err != nil {
						if e, ok := apierr.As(err); !ok || (e.Code != apierr.CodeInvalidState && e.Code != "lease_lost") {
							errs[g] = err
						}
					}
				}
			})
		case g < claimers+runs:
			_, errs[g] = b.svc.FinishRun(ctx, b.ws, runIDs[g-claimers])
		default:
			// A cancel of one step of the run, then replays of its
			// steps over and over (refused while a step has not ended, or
			// its dependency has not), racing the claims and reports.
			k := g - claimers - runs
			steps := stepIDs[5*k : 5*k+5]
			_, err := b.svc.CancelStep(ctx, b.ws, steps[(k+2)%5])
			if e, ok := apierr.As(err); err != nil && (!ok || e.Code != apierr.CodeInvalidState) {
				errs[g] = err
				return
			}
			for i := range 60 {
				_, err = b.svc.Replay(ctx, b.worker, steps[i%5], jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
				if e, ok := apierr.As(err); err != nil && (!ok || e.Code != apierr.CodeInvalidState) {
					errs[g] = err
					return
				}
			}
		}
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	for { // the replays' jobs, and any the claimers missed
		js := b.claim(t, wids[0], 50)
		if len(js) == 0 {
			break
		}
		for _, j := range js {
			b.succeed(t, j)
		}
	}
	for _, runID := range runIDs {
		r := b.getRun(t, runID)
		want := "SUCCEEDED"
		for _, st := range r.Steps {
			require.True(t, st.Status == jobs.StatusSucceeded || st.Status == jobs.StatusExhausted ||
				st.Status == jobs.StatusCancelled || st.Status == jobs.StatusSkipped,
				"run %s: step %s is %s with nothing left to run", runID, st.ID, st.Status)
			if st.Status == jobs.StatusExhausted || st.Status == jobs.StatusCancelled {
				want = "FAILED"
			}
		}
		require.Equal(t, want, r.Status, "run %s", runID)
	}
	checkEventLedger(t, b.env, b.ws)
	var summary string
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT string_agg(s, ', ') FROM (
		SELECT status || ' ' || count(*) AS s FROM jobs WHERE workspace_id = $1 GROUP BY status
		UNION ALL SELECT 'replays ' || count(*) FROM job_replays WHERE workspace_id = $1
		UNION ALL SELECT 'reopens ' || sum(reopened) FROM job_runs WHERE workspace_id = $1) x`, b.ws).Scan(&summary))
	t.Logf("steps and replays: %s", summary)
}

// A read ending a last step whose lease lapsed (GET /runs/{id}, the list of
// runs) races the report of the run's other last step and more reads: the
// run ends FAILED once, with one step.exhausted saying the lease lapsed.
func TestReadsEndingALapsedLastStepRacingTheOtherLastReport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const runs = 30
	type pending struct {
		runID string
		alive jobs.ClaimedJob
	}
	all := make([]pending, runs)
	for i := range all {
		p := &all[i]
		p.runID = b.run(t)
		_, claimed := b.lastAttemptsClaimed(t, p.runID, 2)
		p.alive = claimed[0]
		_, err := b.svc.FinishRun(ctx, b.ws, p.runID)
		require.NoError(t, err)
	}
	b.clock.Add(time.Minute) // both leases lapse; the report of one is still recorded
	errs := make([]error, 4*runs)
	apitest.StartTogether(len(errs), func(i int) {
		p := all[i/4]
		switch i % 4 {
		case 0:
			errs[i] = b.reportEnd(p.alive, false)
			if e, ok := apierr.As(errs[i]); ok && e.Code == apierr.CodeInvalidState {
				errs[i] = nil // a read ended it first, as lapsed
			}
		case 1, 2:
			_, errs[i] = b.svc.GetRun(ctx, b.ws, p.runID)
		default:
			_, errs[i] = b.svc.ListRuns(ctx, b.ws, "", "", 10)
		}
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	for _, p := range all {
		b.getRun(t, p.runID)
		e := b.requireEndedOnce(t, p.runID, "FAILED")
		require.Zero(t, e.reopened)
	}
	checkEventLedger(t, b.env, b.ws)
	var notLapsed int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM events
		WHERE workspace_id = $1 AND type = 'step.exhausted' AND NOT (data->>'leaseLapsed')::bool`, b.ws).Scan(&notLapsed))
	require.Zero(t, notLapsed, "every exhaustion here is a lapse")
}

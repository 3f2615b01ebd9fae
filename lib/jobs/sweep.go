package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/sweep"
)

// sweepBatch bounds each sweeper task's work per pass (Service.sweepBatch).
// A batch takes turns among the workspaces with work due (db.RoundRobin), so
// that one workspace's backlog holds no other's back for passes.
const sweepBatch = 500

// SweepTasks are the durable-job backstops. Each is bounded, idempotent and
// safe to run concurrently with itself and with requests (SKIP LOCKED and
// conditional updates). Each drains (sweep.Task.Drains): a backlog (a fleet
// of workers that died at once, a burst of runs ending) is worked off batch
// after batch while a cron pass has time, not a batch a minute, until a
// batch is short (sweep.Task.Batch).
func (s *Service) SweepTasks() []sweep.Task {
	return []sweep.Task{
		// Its three backstops each run whatever the one before answered,
		// and their errors are answered together: a lapsed last attempt
		// whose ending fails on every pass (a statement timeout over a
		// large backlog, say) must not keep lapsed leases with attempts
		// left from being requeued, nor cancelled attempts' slots from
		// being freed (sweeper review: the first error returned at once,
		// and the other two never ran).
		// They read the pass's clock (now), not their own, as the other
		// tasks do: what lapses while a pass drains waits for the next
		// one (README, "The sweeper across workspaces").
		{Name: "jobs.lapsed_leases", Drains: true, Batch: s.batch, Run: func(ctx context.Context, now time.Time) (int, error) {
			at := func() time.Time { return now }
			ended, errEnd := s.exhaustLapsedIn(ctx, nil, nil, s.sweepBatch, at)
			requeued, errRequeue := s.requeueLapsed(ctx, now, s.sweepBatch)
			freed, errFree := s.releaseHeldSlots(ctx, now, s.sweepBatch)
			return ended + requeued + freed, errors.Join(errEnd, errRequeue, errFree)
		}},
		{Name: "jobs.dependencies", Drains: true, Batch: s.batch, Run: func(ctx context.Context, _ time.Time) (int, error) {
			return s.releaseStranded(ctx, s.sweepBatch)
		}},
		{Name: "jobs.run_completion", Drains: true, Batch: s.batch, Run: func(ctx context.Context, _ time.Time) (int, error) {
			return s.settleRuns(ctx, s.sweepBatch)
		}},
	}
}

// batch is the sweeper tasks' batch (their sweep.Task.Batch).
func (s *Service) batch() int { return s.sweepBatch }

// purgeStepsPerPass bounds the steps one retention pass deletes with their
// runs (a run is never split: one larger than this goes alone).
const purgeStepsPerPass = 5000

// purgeRetryAfter is how long the retention cut-off moves on before a run
// whose purge failed is read again.
const purgeRetryAfter = time.Hour

// PurgeRetired deletes up to limit finished runs whose steps all ended
// before cutoff (and no more than purgeStepsPerPass steps with them), with
// their jobs, executions and replays, and up to limit worker registrations
// not seen since cutoff. It answers how many runs and workers it deleted.
// Once a run is gone its steps' idempotency keys are new again: an enqueue
// with one creates a new step.
//
// A batch whose purge fails is purged again run by run, each in a
// transaction of its own, and a run that fails alone is put off
// (purge_after: purgeRetryAfter past the cut-off) and its error answered:
// the batch reads the oldest runs first, so one failing on every pass (a
// statement timeout over a run of many steps, which goes whole, say) kept
// every run after it for good (sweeper review). Run by run only once a
// batch failed, and the run put off leaves the next batches whole: a
// pass's round trips stay those of one batch but for one pass an hour per
// failing run, and that pass is bounded by its batch. A savepoint per run
// instead would cost two more round trips per run on every pass. Within a
// pass (sweep.PlaceOf), each batch starts after the last run the batch
// before it took: a run kept or passed over is read again by the next
// pass.
func (s *Service) PurgeRetired(ctx context.Context, cutoff time.Time, limit int) (int, error) {
	place := sweep.PlaceOf(ctx)
	after, _ := place.At.(runsPlace)
	runs, candidates, last, err := s.purgeRuns(ctx, sqlRetiredRuns, cutoff, limit, after.finishedAt, after.id)
	if len(candidates) > 0 {
		place.At = last
	}
	if err != nil {
		runs, err = s.purgeApart(ctx, cutoff, candidates, err)
	}
	// Whatever the runs' purge answered: one failing on every pass (a
	// statement timeout over a run of many steps, which goes whole) kept
	// every idle worker registration for good (sweeper review).
	tag, errWorkers := s.pool.Exec(ctx, sqlDeleteIdleWorkers, cutoff, limit)
	if errWorkers != nil {
		return runs, errors.Join(err, fmt.Errorf("purge workers: %w", errWorkers))
	}
	return runs + int(tag.RowsAffected()), err
}

// purgeApart purges the candidates of a batch whose purge failed with
// batchErr one by one, puts off those that fail alone, and answers how
// many it deleted and their errors (batchErr's when none failed alone, so
// that the pass still fails).
func (s *Service) purgeApart(ctx context.Context, cutoff time.Time, candidates []string, batchErr error) (int, error) {
	batchErr = fmt.Errorf("purge runs: %w", batchErr)
	if !sweep.GoOn(ctx, batchErr) {
		return 0, batchErr
	}
	runs := 0
	var errs []error
	for _, id := range candidates {
		err := batchErr
		if len(candidates) > 1 { // one alone failed as the batch
			var n int
			if n, _, _, err = s.purgeRuns(ctx, sqlRetiredRun, cutoff, id); err == nil {
				runs += n
				continue
			}
			err = fmt.Errorf("purge runs: run %s: %w", id, err)
		}
		if errs = append(errs, err); !sweep.GoOn(ctx, err) {
			break // not the run's failure: it is not put off
		}
		if _, errLater := s.pool.Exec(ctx, sqlPurgeLater, id, cutoff.Add(purgeRetryAfter)); errLater != nil {
			errs = append(errs, fmt.Errorf("put off run %s: %w", id, errLater))
		}
	}
	if len(errs) == 0 {
		errs = append(errs, batchErr)
	}
	return runs, errors.Join(errs...)
}

// runsPlace is where PurgeRetired's batches have got to in a pass
// (sweep.Place): the last candidate a batch took.
type runsPlace struct {
	finishedAt time.Time
	id         string
}

// purgeRuns deletes, in a transaction, the runs pick ($1 cutoff, then
// args) reads, within purgeSteps steps, whose jobs it then locks all of.
// It answers how many it deleted, the candidates it read, failing or not,
// and the last of them before the first run read that the steps' bound
// left out (pick's order), where the next batch of the pass starts after.
func (s *Service) purgeRuns(ctx context.Context, pick string, cutoff time.Time, args ...any) (int, []string, runsPlace,
	error) {
	runs := 0
	var (
		candidates []string
		last       runsPlace
	)
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, pick, append([]any{cutoff}, args...)...)
		if err != nil {
			return err
		}
		var (
			id       string
			n, steps int
			finished time.Time
			full     bool
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &n, &finished}, func() error {
			switch {
			case len(candidates) == 0 || steps+n <= s.purgeSteps:
				candidates, steps = append(candidates, id), steps+n
				if !full {
					last = runsPlace{finishedAt: finished, id: id}
				}
			default:
				full = true // the next batch of the pass starts at this run
			}
			return nil
		})
		if err != nil || len(candidates) == 0 {
			return err
		}
		retired, err := db.CollectIDs(tx.Query(ctx, sqlLockRetiredJobs, candidates, cutoff))
		if err != nil || len(retired) == 0 {
			return err
		}
		if _, err := tx.Exec(ctx, sqlDeleteRuns, retired); err != nil {
			return err
		}
		runs = len(retired)
		return nil
	})
	if err != nil {
		return 0, candidates, last, err
	}
	return runs, candidates, last, nil
}

// exhaustLapsed ends jobs whose lease lapsed on their last attempt (a lapsed
// lease with attempts left stays claimable: the next claim takes it at once)
// and makes the transitions that follows from it. runID limits it to one run.
func (s *Service) exhaustLapsed(ctx context.Context, runID *string, limit int) (int, error) {
	return s.exhaustLapsedIn(ctx, runID, nil, limit, s.now)
}

// exhaustLapsedIn is exhaustLapsed limited to a run, a workspace, or (both
// nil) neither, at the time now answers (read once per transaction
// attempt: the service's clock, or the sweeper pass's). Once committed, the parked claims of each workspace whose
// jobs it ended are woken, as a report ending a job wakes them: an ending
// frees its endpoint's slot and may release dependents (the sweeper runs
// in the server's process, so its claims slept to their next poll).
func (s *Service) exhaustLapsedIn(ctx context.Context, runID, workspaceID *string, limit int,
	now func() time.Time) (int, error) {
	n := 0
	var ended []endedStep
	err := s.txRetrying(ctx, func(tx pgx.Tx) error {
		ended = nil // a retried transaction starts over
		now := now()
		gates, args := sqlLapsedGates, []any{now, limit, runID, workspaceID}
		if runID == nil && workspaceID == nil {
			gates, args = sqlLapsedGatesFair, args[:2]
		}
		var endpoints, jobs []string
		if err := tx.QueryRow(ctx, gates, args...).Scan(&endpoints, &jobs); err != nil {
			return fmt.Errorf("exhaust lapsed: %w", err)
		}
		if len(endpoints) == 0 {
			return nil
		}
		rows, err := tx.Query(ctx, sqlExhaustLapsed, now, limit, runID, LapseWarning, workspaceID, endpoints, jobs)
		if err != nil {
			return fmt.Errorf("exhaust lapsed: %w", err)
		}
		done, err := scanEnded(rows)
		if err != nil {
			return fmt.Errorf("exhaust lapsed: %w", err)
		}
		n = len(done)
		if n == 0 {
			return nil
		}
		for i := range done {
			done[i].lapsed = true
		}
		ended = done
		return s.afterEnded(ctx, tx, done)
	})
	if err != nil {
		return n, err
	}
	woken := map[string]bool{}
	for _, e := range ended {
		if !woken[e.workspaceID] {
			woken[e.workspaceID] = true
			s.wake.wakeAll(e.workspaceID)
		}
	}
	return n, nil
}

// RequeueLapsedAfter is how long a lapsed lease on an attempt that was not
// the job's last may wait for a worker of its version to reclaim it before
// the sweeper puts the job back in the queue, failing the lapsed attempt and
// freeing its endpoint slot, if any (sqlRequeueLapsed). Either way a report
// with its token is recorded until a newer claim (API.md §5).
const RequeueLapsedAfter = 5 * time.Minute

// requeueLapsed puts back in the queue jobs whose lease lapsed more than
// RequeueLapsedAfter before now on an attempt that was not their last.
// Once committed, each requeued job wakes a parked claim of its exact
// version, the one that can take it; failing one, a job that freed a slot
// wakes a claim as a report freeing it does (wakeForSlot): with the job
// back in the queue, the slot may go to another job on its endpoint (the
// sweeper runs in the server's process, so its claims wait for its wake;
// wake QA: they waited for their next poll).
func (s *Service) requeueLapsed(ctx context.Context, now time.Time, limit int) (int, error) {
	n, err := s.freeSlots(ctx, now, sqlRequeueGates, sqlRequeueLapsed, limit, func(j sweptJob) {
		if !s.wake.wakeOne(j.workspaceID, toolKey(j.name, j.version)) && j.gated {
			s.wakeForSlot(j.workspaceID, j.name)
		}
	}, RequeueLapsedAfter.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("requeue lapsed: %w", err)
	}
	return n, nil
}

// releaseHeldSlots frees the concurrency slots of up to limit cancelled
// attempts whose lease expired before now without a report (their worker stopped or
// died), failing their executions with LapseWarning. Once committed, each
// freed slot wakes a claim as a report freeing it does (wakeForSlot).
func (s *Service) releaseHeldSlots(ctx context.Context, now time.Time, limit int) (int, error) {
	n, err := s.freeSlots(ctx, now, sqlHeldSlotGates, sqlReleaseHeldSlots, limit, func(j sweptJob) {
		if j.gated {
			s.wakeForSlot(j.workspaceID, j.name)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("release held slots: %w", err)
	}
	return n, nil
}

// freeSlots is one sweep that frees concurrency slots, in a transaction, by
// the gate protocol (sql.go): gates picks up to limit candidates ($1 now,
// the sweeper pass's clock, $2 limit, then extra), takes the shared gate
// locks on their endpoints,
// and the rows of those with a limit, and answers those endpoints and the
// candidates (lapseGates); when there are any, free, a later statement so
// that it reads after the locks, frees those candidates still due (the same
// parameters, then LapseWarning for the executions it fails, then the
// endpoints and the candidates) and answers how many (sweptJobs). Once that
// committed, wake is called for each job it changed.
func (s *Service) freeSlots(ctx context.Context, now time.Time, gates, free string, limit int, wake func(sweptJob),
	extra ...any) (int, error) {
	var (
		n                   int
		ws, names, versions []string
		gated               []bool
	)
	err := s.txRetrying(ctx, func(tx pgx.Tx) error {
		n, ws = 0, nil // a retried transaction starts over
		args := append([]any{now, limit}, extra...)
		var endpoints, jobs []string
		if err := tx.QueryRow(ctx, gates, args...).Scan(&endpoints, &jobs); err != nil {
			return err
		}
		if len(endpoints) == 0 {
			return nil
		}
		return tx.QueryRow(ctx, free, append(args, LapseWarning, endpoints, jobs)...).Scan(&n, &ws, &names,
			&versions, &gated)
	})
	if err != nil {
		return 0, err
	}
	for i := range ws {
		wake(sweptJob{workspaceID: ws[i], name: names[i], version: versions[i], gated: gated[i]})
	}
	return n, nil
}

// sweptJob is a job a sweep that frees slots changed (sweptJobs): its
// workspace, tool and handler version, and whether its endpoint's slot
// was freed.
type sweptJob struct {
	workspaceID, name, version string
	gated                      bool
}

// releaseStranded releases WAITING steps whose dependency ended without a
// request releasing them. It answers how many of the dependencies it read
// had dependents it released itself: a dependency a request or another
// sweeper released while this one waited for its dependents' rows is not
// counted again (sweeper review: the dependencies read were counted, so
// two passes at once counted each release twice). Those it released
// before an error count too.
//
// Once each dependency's release commits, every job it queued wakes a
// parked claim of its exact version, as an enqueue's does: the sweeper runs
// in the local server's process, and its parked claims slept to their next
// poll (jobs QA).
func (s *Service) releaseStranded(ctx context.Context, limit int) (int, error) {
	var woken []queuedJob // the jobs the current dependency's release queued
	return s.eachInTx(ctx, sqlStrandedDependents, limit, "stranded dependents",
		func(tx pgx.Tx, dep string) (bool, error) {
			woken = nil
			// The dependency's run is locked shared before its dependents'
			// rows, as every transaction releasing or unskipping steps
			// takes them (the lock order, see sqlRunLockShared): a replay
			// holds the run's exclusive lock while it puts the dependents
			// back (unskip), and took the rows after the run (sweeper
			// review: this took the rows first, then waited for the run).
			// Its release then reads after a replay of the dependency that
			// committed meanwhile, and finds it QUEUED again: nothing to
			// release. A dependency purged since it was read: nothing.
			var runID string
			err := tx.QueryRow(ctx, sqlStepRunLockShared, dep).Scan(&runID, nil)
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			if err != nil {
				return false, fmt.Errorf("lock run: %w", err)
			}
			// Passing the dependency as an "ended" frontier releases its
			// dependents; its own status is not used. The runs touched
			// are those of the steps it released (its own: a step depends
			// only on a step of its run).
			runs, queued, err := s.release(ctx, tx, []endedStep{{stepID: dep}}, true)
			if err != nil {
				return false, err
			}
			woken = queued
			return len(runs) > 0, s.settleTouched(ctx, tx, runs, map[string]bool{runID: true})
		}, func() {
			for _, q := range woken {
				s.wake.wakeOne(q.workspaceID, q.tool)
			}
		})
}

// settleRuns completes runs whose completion was requested and whose steps
// decided them, for the cases no request settled. It answers how many it
// finished itself, not how many it read: one a request or another sweeper
// finished while this one waited for its lock is not counted again
// (sweeper review).
func (s *Service) settleRuns(ctx context.Context, limit int) (int, error) {
	return s.eachInTx(ctx, sqlRunsToSettle, limit, "runs to settle", func(tx pgx.Tx, id string) (bool, error) {
		if _, err := tx.Exec(ctx, sqlRunLockExclusive, id); err != nil {
			return false, fmt.Errorf("lock run: %w", err)
		}
		return s.settleRun(ctx, tx, id)
	}, nil)
}

// eachInTx reads up to limit ids with pick (what names the read in its
// error) and runs do on each in a transaction of its own, in order. One
// that fails does not stop those after it (sweep.GoOn): the pick reads
// the same ones first on every pass, so a record whose handling fails each
// time kept every one behind it waiting for good (sweeper review). It
// answers how many do changed (true), and the errors of those that
// failed, joined. committed (nil: none) runs after each transaction that
// committed, for wakes that must not come before their data is visible.
//
// The ids that failed of their own are recorded in the pass's
// sweep.Failures, and an earlier run's in the same pass are passed over:
// the pick reads that many more, so that the batch is limit others, and
// the task drains the backlog behind a record that fails every time in
// one pass, not a batch a pass (review).
func (s *Service) eachInTx(ctx context.Context, pick string, limit int, what string,
	do func(tx pgx.Tx, id string) (bool, error), committed func()) (int, error) {
	failures := sweep.FailuresOf(ctx)
	rows, err := s.pool.Query(ctx, pick, limit+failures.Len())
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	picked, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	picked = slices.DeleteFunc(picked, failures.Has)
	picked = picked[:min(len(picked), limit)]
	n := 0
	var errs []error
	for _, id := range picked {
		var changed bool
		err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
			var err error
			changed, err = do(tx, id)
			return err
		})
		if err != nil {
			if errs = append(errs, err); !sweep.GoOn(ctx, err) {
				break
			}
			failures.Add(id)
			continue
		}
		if committed != nil {
			committed()
		}
		if changed {
			n++
		}
	}
	return n, errors.Join(errs...)
}

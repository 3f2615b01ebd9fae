// Package sweep runs the periodic backstop pass: every transition the API
// makes inline when a request can decide it (lapsed leases, due retries,
// dependency releases, run completion, breaker cooldowns, reminders, webhook
// deliveries, retention) is also made here, boundedly, for the cases no
// request touched. Each task must be idempotent and safe to run concurrently
// with itself (row locks with SKIP LOCKED, conditional updates), because
// Vercel cron, the Lambda schedule and the local ticker may overlap.
package sweep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/redact"
)

// Task is one bounded unit of the pass. It returns how many rows it changed.
type Task struct {
	Name string
	Run  func(ctx context.Context, now time.Time) (int, error)
	// Detached marks a task that waits on other parties (webhook receivers):
	// Loop starts it in its own goroutine after each pass's other tasks,
	// without waiting for it, so one slow receiver delays neither the next
	// pass (lapsed leases, due retries) nor other receivers' deliveries,
	// another workspace's included (QA: a 10 s receiver made every pass
	// take 10 s). At most maxDetached runs of it are in flight; a tick that
	// finds them all busy skips it. RunOnce (the cron routes, the Lambda
	// schedule, tests) runs it in line like the others. Its runs, beside
	// each other and the pass, bound their own use of the pool together
	// (webhook delivery: a db.Share), so that they leave requests room.
	Detached bool
	// Needs is the least time a run of it is of use with (webhook delivery:
	// a send and its record). A pass with a deadline keeps it for this
	// task while it runs the tasks before it, as it keeps taskReserve for
	// the others (review: a stuck task left delivery too little time to
	// send anything, silently).
	Needs time.Duration
	// Drains marks a task that works off a backlog a bounded batch at a
	// time (retention). A pass with a deadline (the cron route, the Lambda
	// schedule) runs it again, at the same now, while its last run changed
	// rows and time is left, at most TaskTimeout in all (scale QA: one
	// batch a pass, a pass a minute on cron, deleted at most about 1.4 M
	// rows a day, so a busier workspace's backlog never drained). The local
	// loop, a pass every few seconds, runs it once a pass.
	Drains bool
	// Batch is the most rows one run of a task that Drains changes, when a
	// run that changed fewer has worked its backlog off: the pass then
	// moves on. Rows that keep arriving (events fanned out, leases lapsing
	// on a busy deployment) would otherwise have each run find a few more,
	// and the task run again and again to TaskTimeout every pass, holding
	// back the tasks after it (review). Read at each run (tests lower a
	// batch). nil: again while a run changed any (retention, whose batch is
	// shared among workspaces and may end short with rows left).
	Batch func() int
	// Every is the least time between two runs of the task in the local
	// loop (Loop), read on the sweeper's clock: a pass every few seconds
	// runs it when Every has passed since its last run that did not fail,
	// or the clock has moved back since (reconciliation reminders, an hour
	// at the least apart, whose pass reads every type with reminders on:
	// some 150 ms a pass at 100,000 types, QA). A cadence hint for this
	// process only, never what the task's correctness rests on: the cron
	// route, the Lambda schedule and other processes' loops run it
	// whenever they pass, and a restart forgets it. RunOnce, a pass a
	// minute, runs it each time, and so does Loop a Detached task. 0:
	// every pass.
	Every time.Duration
}

// Place is where a task that Drains has got to in its backlog within one
// pass: runBatches gives all of a task's runs of a pass the same one (in
// their ctx, PlaceOf), and the next pass a new one. A run may note in At
// the last row it looked at, so that the next run of the pass starts after
// it: rows a retention keeps, old ones in front of the order it walks (the
// latest reconciliation.due of each type, a FAILED run with a step that
// never ends), were read again by every batch of the pass (review: 50,000
// events kept, each batch of 1,000 read 102,000). A row passed over so is
// read again by the next pass, which starts from the front.
type Place struct{ At any }

type placeKey struct{}

// PlaceOf is ctx's Place: the pass's for a task's runs in runBatches, a
// new one, at the front, otherwise (the local loop runs a task once a
// pass, tests call it alone).
func PlaceOf(ctx context.Context) *Place {
	if p, ok := ctx.Value(placeKey{}).(*Place); ok {
		return p
	}
	return new(Place)
}

// maxDetached bounds the runs of one detached task in flight at once.
const maxDetached = 8

// CutShort is the errors value of a task that ran out of its time in a
// pass after it changed rows (its failures are "failed"): the next pass
// goes on from where it stopped. It is not among a pass's failures
// (Result.Error).
const CutShort = "cut_short"

// Result reports one pass.
type Result struct {
	Changed map[string]int    `json:"changed"`
	Errors  map[string]string `json:"errors"`
	Ms      int64             `json:"ms"`
	// Unreachable: every task failed because the database could not be
	// reached, so the pass did nothing (the cron route answers 503).
	Unreachable bool `json:"-"`
}

// TaskTimeout bounds one task in one pass, so a stuck task cannot hold the
// scheduled function until its platform kills it.
const TaskTimeout = 20 * time.Second

// Sweeper runs its tasks in order.
type Sweeper struct {
	tasks  []Task
	now    func() time.Time
	logger *slog.Logger

	mu     sync.Mutex
	outage outage
}

// outage is what the sweeper has seen of the database being unreachable
// since it last answered: a pass every 5 s of a dozen tasks would otherwise
// log a dozen warnings every 5 s for as long as it lasts (pooler QA).
type outage struct {
	since       time.Time // zero: the last pass met no outage
	reported    time.Time // when the last warning was written
	interrupted int       // tasks interrupted since since
}

// outageReminder is how often a continuing outage is logged again.
const outageReminder = time.Minute

// taskReserve is the time a pass keeps for each task still to run after
// the one running: a task stuck on a lock (a migration's, say) ends in time
// for the rest, instead of taking the whole invocation's deadline with it
// (QA: on the cron route, one locked table failed all 13 tasks).
const taskReserve = 500 * time.Millisecond

// run runs one task at now until end (its TaskTimeout's), leaving the
// tasks after it their reserve of ctx's deadline (after: what they need in
// all), and reports a failure; interrupted says it was the database's (an
// outage's), not the task's own (review: a task out of its time, stuck on
// a lock, kept an outage from ever being logged as ended). cut says the
// task ran out of its time after it changed rows (progressed: an earlier
// run of the pass did, or this one): it is cut short, not failed, and the
// next pass goes on from where it stopped, so it is logged as a warning
// (review: a drain cut mid-batch was logged at ERROR, and answered
// "failed", as a task that could do nothing). One cut before it changed
// anything (stuck on a lock, say) stays a failure.
func (s *Sweeper) run(ctx context.Context, t Task, after time.Duration, end, now time.Time, progressed bool) (n int,
	interrupted, cut bool, err error) {
	if deadline, ok := ctx.Deadline(); ok {
		if mine := laterOf(deadline.Add(-after), time.Now().Add(taskReserve)); mine.Before(end) {
			end = mine
		}
	}
	taskCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	n, err = t.Run(taskCtx, now)
	switch {
	case err != nil && errors.Is(ctx.Err(), context.Canceled):
		// The pass was stopped (the local server shutting down, a cron
		// caller gone): the task was not let finish, it did not fail, and
		// the next pass does it (QA: each Ctrl-C logged six errors). What
		// the database would have said is unknown, so it ends no outage.
		interrupted = true
	case err != nil && db.IsUnavailable(err) && !errors.Is(err, context.DeadlineExceeded) && taskCtx.Err() == nil &&
		!db.IsCanceled(err):
		// An outage or a restart of the database: the next pass does it
		// (QA: every terminated connection logged an ERROR). A task that
		// ran out of its time, stuck on a lock say, stays an error, and so
		// does one the database cancelled with its own context alive: a
		// statement_timeout (DB_STATEMENT_TIMEOUT) ran out, and the
		// database that said so is up (ops QA: it was logged as an
		// outage).
		s.noteUnavailable(t.Name, err)
		interrupted = true
	case err != nil && taskCtx.Err() != nil && (progressed || n > 0):
		s.logger.Warn("sweep task cut short by its time; the next pass goes on", "task", t.Name, "err", err)
		cut = true
	case err != nil:
		s.logger.Error("sweep task failed", "task", t.Name, "err", err)
	}
	return n, interrupted, cut, err
}

// noteUnavailable logs the start of an outage, then a reminder a minute
// while it lasts, instead of every interrupted task.
func (s *Sweeper) noteUnavailable(task string, err error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	o := &s.outage
	o.interrupted++
	switch {
	case o.since.IsZero():
		o.since = now
		s.logger.Warn("sweep task interrupted: database unavailable; further interruptions are summarised every minute",
			"task", task, "err", err)
	case now.Sub(o.reported) >= outageReminder:
		s.logger.Warn("sweep tasks interrupted: database still unavailable",
			"since", o.since.UTC().Format(time.RFC3339), "interrupted", o.interrupted, "err", err)
	default:
		return
	}
	o.reported = now
}

// noteAvailable ends an outage once a whole pass met none (review: one
// task reaching the database while the others failed ended it and began it
// again every pass): one line says how long it lasted, at the outage's own
// level, so that a log showing warnings only (the local server's) shows its
// end as well as its start.
func (s *Sweeper) noteAvailable() {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := &s.outage
	if o.since.IsZero() {
		return
	}
	s.logger.Warn("sweep: database available again",
		"unavailable_for", s.now().Sub(o.since).Round(time.Second).String(), "interrupted", o.interrupted)
	*o = outage{}
}

// New returns a sweeper over tasks.
func New(now func() time.Time, logger *slog.Logger, tasks ...Task) *Sweeper {
	return &Sweeper{tasks: tasks, now: now, logger: redact.Logger(logger)}
}

// Add appends tasks.
func (s *Sweeper) Add(tasks ...Task) { s.tasks = append(s.tasks, tasks...) }

// Tasks lists the task names.
func (s *Sweeper) Tasks() []string {
	out := make([]string, len(s.tasks))
	for i, t := range s.tasks {
		out[i] = t.Name
	}
	return out
}

// RunOnce runs every task once. One failing task does not stop the others;
// the failure is reported (task name and error text, no data) and the next
// pass retries it.
func (s *Sweeper) RunOnce(ctx context.Context) Result {
	start := time.Now() // a duration: the monotonic clock's, not now's reading
	res := Result{Changed: map[string]int{}, Errors: map[string]string{}}
	unreachable, outage := 0, false
	for i, t := range s.tasks {
		var after time.Duration
		for _, later := range s.tasks[i+1:] {
			after += max(later.Needs, taskReserve)
		}
		n, interrupted, cut, err := s.runBatches(ctx, t, after)
		res.Changed[t.Name] = n
		outage = outage || interrupted
		switch {
		case cut:
			res.Errors[t.Name] = CutShort
		case err != nil:
			res.Errors[t.Name] = "failed"
			if db.IsUnavailable(err) {
				unreachable++
			}
		}
	}
	if !outage {
		s.noteAvailable()
	}
	res.Unreachable = len(s.tasks) > 0 && unreachable == len(s.tasks)
	res.Ms = time.Since(start).Milliseconds()
	return res
}

// runBatches runs t, and a task that Drains again while its last run
// changed rows (a whole Batch, when it has one) and ctx's deadline leaves
// time for another (twice the last run's, beside after for the tasks still
// to run), within TaskTimeout in all: each run ends by then, not
// TaskTimeout after its own start (review: a run stuck on a lock after
// batches that took most of it held the task to nearly twice the bound).
// Its runs share one reading of now: what falls due while they run (an
// answer a day old, an event at its retention: one after another on a busy
// deployment) waits for the next pass, where a run at a later now found a
// few more each time, and the task ran again and again to TaskTimeout
// every pass, effect retention's scan of every workspace's types included,
// holding back the tasks after it (review). It answers the rows changed in
// all, the last run's interruption or error, and whether that error is only
// the task's running out of its time after it changed rows (run's cut; not
// after an earlier run's failure, which is answered with it).
//
// A run that failed on records of its own (GoOn), recorded in its
// Failures, and changed others goes on as one that did not fail: its next
// runs pass those records over, and a run's batch counts them, so that it
// is whole when they and the rows changed fill it (review: a record that
// failed every time was read first again on every run, and the failure
// stopped the task, so a backlog behind it drained a batch a pass). The
// error is answered all the same (each failed run's, joined). A run that
// changed nothing, failing or not, ends the task: a batch made only of
// failing records is not read past in a loop.
func (s *Sweeper) runBatches(ctx context.Context, t Task, after time.Duration) (changed int, interrupted, cut bool,
	err error) {
	began, now := time.Now(), s.now()
	failures := &Failures{}
	ctx = context.WithValue(ctx, failuresKey{}, failures)
	var failed error // the errors of the runs the task went on after
	ctx = context.WithValue(ctx, placeKey{}, new(Place))
	for {
		start := time.Now()
		var n int
		had := failures.Len()
		n, interrupted, cut, err = s.run(ctx, t, after, began.Add(TaskTimeout), now, changed > 0)
		changed += n
		took := time.Since(start)
		read := n + failures.Len() - had
		deadline, ok := ctx.Deadline()
		if err != nil && (interrupted || read == n || !GoOn(ctx, err) || errors.Is(err, context.DeadlineExceeded)) ||
			!t.Drains || n == 0 || t.Batch != nil && read < t.Batch() || !ok ||
			time.Until(deadline)-after < 2*took+taskReserve || time.Since(began)+2*took > TaskTimeout {
			if failed != nil { // a failure of the pass's is not cut short
				err, cut = errors.Join(failed, err), false
			}
			return changed, interrupted, cut, err
		}
		if err != nil {
			failed = errors.Join(failed, err)
		}
	}
}

// Failures is what the runs of one task in one pass (RunOnce) failed to
// handle of their own (GoOn), by record id: a task that Drains and
// reads its records in an order a failure does not change records those it
// failed on (Add), and passes them over in its next runs (Has), so that
// the rows behind them drain in the same pass (see runBatches). Safe for
// concurrent use; a nil *Failures (the local loop's runs, a task run
// alone) records nothing and has nothing.
type Failures struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

type failuresKey struct{}

// FailuresOf is the Failures of the pass ctx runs a task in (nil: none).
func FailuresOf(ctx context.Context) *Failures {
	f, _ := ctx.Value(failuresKey{}).(*Failures)
	return f
}

// Add records that handling id failed.
func (f *Failures) Add(id string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ids == nil {
		f.ids = map[string]struct{}{}
	}
	f.ids[id] = struct{}{}
}

// Has says whether handling id failed in an earlier run of the pass.
func (f *Failures) Has(id string) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.ids[id]
	return ok
}

// Len is how many records failed so far.
func (f *Failures) Len() int {
	if f == nil {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ids)
}

// Loop runs a pass every interval until ctx ends: the tasks in order (one
// with an Every only when that has passed), then the detached ones started
// in the background (see Task.Detached). It
// returns once ctx ended and the detached runs in flight have returned.
func (s *Sweeper) Loop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(map[string]chan struct{})
	for _, task := range s.tasks {
		if task.Detached {
			slots[task.Name] = make(chan struct{}, maxDetached)
		}
	}
	ran := make(map[string]time.Time) // the last run that did not fail of each task with an Every
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		outage := false
		for _, task := range s.tasks {
			if task.Detached {
				continue
			}
			now := s.now()
			if last, ok := ran[task.Name]; ok && task.Every > 0 && !now.Before(last) && now.Sub(last) < task.Every {
				continue
			}
			_, interrupted, _, err := s.run(ctx, task, 0, time.Now().Add(TaskTimeout), now, false) // the loop has no deadline to share
			outage = outage || interrupted
			if task.Every > 0 && err == nil {
				ran[task.Name] = now
			}
		}
		if !outage {
			s.noteAvailable()
		}
		for _, task := range s.tasks {
			if !task.Detached {
				continue
			}
			select {
			case slots[task.Name] <- struct{}{}:
			default:
				continue // every slot busy with a slow peer: the next tick tries again
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots[task.Name] }()
				_, _, _, _ = s.run(ctx, task, 0, time.Now().Add(TaskTimeout), s.now(), false) // the loop has no deadline to share
			}()
		}
	}
}

// laterOf is the later of a and b.
func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// GoOn says whether a task that failed on one record of its batch goes on
// to the next: yes after a failure of the record's own (a statement
// timeout over a large one included), which the same record would meet
// first on every pass and so hold every record after it back for good;
// no once ctx ended or the database is unreachable, when the rest would
// fail alike, each perhaps waiting out a connection's timeout.
func GoOn(ctx context.Context, err error) bool {
	return ctx.Err() == nil && (!db.IsUnavailable(err) || db.IsCanceled(err))
}

// Error is returned when a pass had failures: a task cut short (CutShort)
// is none.
func (r Result) Error() error {
	failed := 0
	for _, e := range r.Errors {
		if e != CutShort {
			failed++
		}
	}
	if failed == 0 {
		return nil
	}
	return fmt.Errorf("sweep: %d task(s) failed", failed)
}

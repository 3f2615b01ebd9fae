package sweep

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestRunOnceRunsEveryTaskDespiteFailures(t *testing.T) {
	t.Parallel()
	var ran []string
	s := New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)),
		Task{Name: "a", Run: func(context.Context, time.Time) (int, error) { ran = append(ran, "a"); return 0, errors.New("boom") }},
		Task{Name: "b", Run: func(context.Context, time.Time) (int, error) { ran = append(ran, "b"); return 3, nil }},
	)
	res := s.RunOnce(context.Background())
	require.Equal(t, []string{"a", "b"}, ran)
	require.Equal(t, 3, res.Changed["b"])
	require.Equal(t, "failed", res.Errors["a"], "no error text leaves the process")
	require.Error(t, res.Error())
	require.Equal(t, []string{"a", "b"}, s.Tasks())
}

// A task that Drains runs again in a pass with a deadline while its runs
// change rows and time is left; without a deadline (the local loop's pace),
// once.
func TestADrainingTaskRunsAgainWhileTimeIsLeft(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	backlog := func(rows int) (*atomic.Int32, Task) {
		var runs atomic.Int32
		left := rows
		return &runs, Task{Name: "retention", Drains: true, Run: func(context.Context, time.Time) (int, error) {
			runs.Add(1)
			n := min(left, 10)
			left -= n
			return n, nil
		}}
	}
	runs, task := backlog(33)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := New(time.Now, logger, task).RunOnce(ctx)
	require.Equal(t, 33, res.Changed["retention"], "the whole backlog in one pass")
	require.EqualValues(t, 5, runs.Load(), "three full batches, the rest, then one that found nothing")

	runs, task = backlog(33)
	res = New(time.Now, logger, task).RunOnce(context.Background())
	require.Equal(t, 10, res.Changed["retention"], "no deadline: one batch")
	require.EqualValues(t, 1, runs.Load())

	// Time that is the later tasks' is not taken.
	runs, task = backlog(33)
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	later := Task{Name: "later", Needs: time.Minute, Run: func(context.Context, time.Time) (int, error) { return 0, nil }}
	res = New(time.Now, logger, task, later).RunOnce(ctx)
	require.EqualValues(t, 1, runs.Load(), "the later task's minute leaves no time for a second batch")
	require.Equal(t, 10, res.Changed["retention"])
}

// A task that Drains with a Batch moves on once a run changed less than a
// batch: its backlog is worked off, and what a further run finds arrived
// since (review: a steady trickle of events had each run find a few, and
// the fan-out ran again and again to TaskTimeout every pass, holding back
// the deliveries after it).
func TestADrainingTaskStopsAtAShortBatch(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var runs atomic.Int32
	left := 23
	task := Task{Name: "webhooks.dispatch", Drains: true, Batch: func() int { return 10 }, Run: func(context.Context, time.Time) (int, error) {
		runs.Add(1)
		n := min(left, 10)
		left -= n
		return n + 1, nil // and one that arrived since the last run, every run
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := New(time.Now, logger, task).RunOnce(ctx)
	require.EqualValues(t, 3, runs.Load(), "two full batches, then the rest with the one new row: short, done")
	require.Equal(t, 3+23, res.Changed["webhooks.dispatch"])
}

// A pass whose every task failed for want of the database did nothing: it
// says so (the cron route answers 503); one task failing otherwise, or one
// succeeding, is a pass with errors.
func TestRunOnceSaysWhenTheDatabaseWasUnreachable(t *testing.T) {
	t.Parallel()
	gone := func(context.Context, time.Time) (int, error) { return 0, fmt.Errorf("x: %w", io.ErrUnexpectedEOF) }
	ok := func(context.Context, time.Time) (int, error) { return 0, nil }
	boom := func(context.Context, time.Time) (int, error) { return 0, errors.New("boom") }
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		runs        []func(context.Context, time.Time) (int, error)
		unreachable bool
	}{{[]func(context.Context, time.Time) (int, error){gone, gone}, true},
		{[]func(context.Context, time.Time) (int, error){gone, ok}, false},
		{[]func(context.Context, time.Time) (int, error){gone, boom}, false},
		{nil, false}} {
		s := New(time.Now, logger)
		for i, run := range c.runs {
			s.Add(Task{Name: fmt.Sprint(i), Run: run})
		}
		require.Equal(t, c.unreachable, s.RunOnce(context.Background()).Unreachable, "%d tasks", len(c.runs))
	}
}

// A task the database failed (an outage, a restart) is a warning, retried
// by the next pass; any other failure is an error.
func TestTaskFailuresAreLoggedByCause(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	s := New(time.Now, slog.New(slog.NewTextHandler(&logs, nil)))
	s.Add(Task{Name: "gone", Run: func(context.Context, time.Time) (int, error) {
		return 0, fmt.Errorf("x: %w", io.ErrUnexpectedEOF)
	}})
	s.Add(Task{Name: "boom", Run: func(context.Context, time.Time) (int, error) { return 0, errors.New("boom") }})
	s.Add(Task{Name: "stuck", Run: func(context.Context, time.Time) (int, error) {
		return 0, fmt.Errorf("x: %w", context.DeadlineExceeded)
	}})
	// The database's own statement_timeout: it answered, so it is up (ops
	// QA: logged as an outage).
	s.Add(Task{Name: "slow", Run: func(context.Context, time.Time) (int, error) {
		return 0, fmt.Errorf("x: %w", &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"})
	}})
	s.RunOnce(context.Background())
	require.Contains(t, logs.String(), `level=WARN msg="sweep task interrupted: database unavailable; further interruptions are summarised every minute" task=gone`)
	require.Contains(t, logs.String(), `level=ERROR msg="sweep task failed" task=boom`)
	require.Contains(t, logs.String(), `level=ERROR msg="sweep task failed" task=stuck`, "out of its time: not an outage")
	require.Contains(t, logs.String(), `level=ERROR msg="sweep task failed" task=slow`, "a statement timeout: not an outage")
	require.NotContains(t, logs.String(), `level=ERROR msg="sweep task failed" task=gone`)
}

// A pass stopped by its caller (a shutdown) logs nothing for the task it
// cut short or the ones after it: none of them failed.
func TestAStoppedPassLogsNoFailure(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	s := New(time.Now, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	s.Add(Task{Name: "cut", Run: func(ctx context.Context, _ time.Time) (int, error) {
		cancel()
		<-ctx.Done()
		return 0, fmt.Errorf("x: %w", ctx.Err())
	}})
	s.Add(Task{Name: "after", Run: func(ctx context.Context, _ time.Time) (int, error) {
		return 0, fmt.Errorf("y: %w", ctx.Err())
	}})
	res := s.RunOnce(ctx)
	require.Len(t, res.Errors, 2, "neither task finished")
	require.Empty(t, logs.String())
	// A task failing on its own is still an error in a pass not stopped.
	s = New(time.Now, slog.New(slog.NewTextHandler(&logs, nil)), Task{Name: "boom",
		Run: func(context.Context, time.Time) (int, error) { return 0, context.Canceled }})
	s.RunOnce(context.Background())
	require.Contains(t, logs.String(), `level=ERROR msg="sweep task failed" task=boom`)
}

// failWhile is a task that fails as a lost connection does while down is
// set, and succeeds otherwise.
func failWhile(down *atomic.Bool) func(context.Context, time.Time) (int, error) {
	return func(context.Context, time.Time) (int, error) {
		if down.Load() {
			return 0, fmt.Errorf("x: %w", io.ErrUnexpectedEOF)
		}
		return 0, nil
	}
}

// An outage is logged when it starts, reminded of once a minute, and its
// end said once, rather than a warning per task per pass (pooler QA: a
// dozen every 5 s while the database was down).
func TestAnOutageIsLoggedOnceAMinute(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	clock := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	var down atomic.Bool
	down.Store(true)
	task := failWhile(&down)
	s := New(func() time.Time { return clock }, slog.New(slog.NewTextHandler(&logs, nil)),
		Task{Name: "a", Run: task}, Task{Name: "b", Run: task}, Task{Name: "c", Run: task})
	lines := func() []string { return strings.Split(strings.TrimSpace(logs.String()), "\n") }

	for range 12 { // a minute of passes every 5 s
		s.RunOnce(context.Background())
		clock = clock.Add(5 * time.Second)
	}
	got := lines()
	require.Len(t, got, 1, "one warning for the first minute's 36 interruptions: %q", got)
	require.Contains(t, got[0], `level=WARN msg="sweep task interrupted: database unavailable; further interruptions are summarised every minute" task=a`)

	s.RunOnce(context.Background())
	got = lines()
	require.Len(t, got, 2, "a minute on, a reminder: %q", got)
	require.Contains(t, got[1], `level=WARN msg="sweep tasks interrupted: database still unavailable" since=2026-12-02T05:00:00Z interrupted=37`)

	clock = clock.Add(5 * time.Second)
	down.Store(false)
	s.RunOnce(context.Background())
	s.RunOnce(context.Background())
	got = lines()
	require.Len(t, got, 3, "the end once: %q", got)
	require.Contains(t, got[2], `level=WARN msg="sweep: database available again" unavailable_for=1m5s interrupted=39`)

	down.Store(true)
	s.RunOnce(context.Background())
	require.Len(t, lines(), 4, "a new outage is logged at once")
}

// A pass in which some tasks reach the database and others do not is part
// of the outage: it ends only with a pass that met none (review: each such
// pass logged an end and a start).
func TestAPartialOutageEndsWithAWholePass(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var down atomic.Bool
	down.Store(true)
	s := New(time.Now, slog.New(slog.NewTextHandler(&logs, nil)),
		Task{Name: "ok", Run: func(context.Context, time.Time) (int, error) { return 0, nil }},
		Task{Name: "flaky", Run: failWhile(&down)})
	for range 5 {
		s.RunOnce(context.Background())
	}
	require.Equal(t, 1, strings.Count(logs.String(), "\n"), "%s", logs.String())
	down.Store(false)
	s.RunOnce(context.Background())
	require.Contains(t, logs.String(), `msg="sweep: database available again"`)
	require.Contains(t, logs.String(), `interrupted=5`)
}

// A task out of its time (stuck on a lock) is its own failure, not the
// database's: it does not keep an outage from ending (review).
func TestAStuckTaskDoesNotProlongAnOutage(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var down atomic.Bool
	down.Store(true)
	s := New(time.Now, slog.New(slog.NewTextHandler(&logs, nil)),
		Task{Name: "stuck", Run: func(context.Context, time.Time) (int, error) {
			return 0, fmt.Errorf("x: %w", context.DeadlineExceeded)
		}},
		Task{Name: "flaky", Run: failWhile(&down)})
	s.RunOnce(context.Background())
	down.Store(false)
	s.RunOnce(context.Background())
	require.Contains(t, logs.String(), `msg="sweep: database available again"`)
}

// Loop does not wait for a detached task: the other tasks run every tick
// while it is blocked, and at most maxDetached runs of it are in flight.
func TestLoopRunsDetachedTasksBesideThePasses(t *testing.T) {
	t.Parallel()
	var inline, running, most atomic.Int32
	release := make(chan struct{})
	s := New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)),
		Task{Name: "send", Detached: true, Run: func(ctx context.Context, _ time.Time) (int, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return 0, nil
		}},
		Task{Name: "lapse", Run: func(context.Context, time.Time) (int, error) { inline.Add(1); return 0, nil }},
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Loop(ctx, time.Millisecond); close(done) }()
	require.Eventually(t, func() bool { return inline.Load() >= 3*maxDetached }, 10*time.Second, time.Millisecond,
		"passes go on while the detached task waits")
	require.Equal(t, int32(maxDetached), most.Load(), "the detached runs in flight are bounded")
	close(release)
	cancel()
	<-done
	require.Zero(t, running.Load(), "Loop returns once its detached runs have")
}

// A task stuck until its limit leaves the tasks after it their reserve of
// the pass's deadline (QA: on the cron route, one task waiting on a locked
// table took the whole deadline, and every task after it failed).
func TestAStuckTaskLeavesTheOthersTheirTime(t *testing.T) {
	t.Parallel()
	quick := func(ctx context.Context, _ time.Time) (int, error) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		return 1, nil
	}
	tasks := []Task{stuckTask()}
	for i := range 5 {
		tasks = append(tasks, Task{Name: fmt.Sprint("t", i), Run: quick})
	}
	s := New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)), tasks...)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	res := s.RunOnce(ctx)
	require.Equal(t, map[string]string{"stuck": "failed"}, res.Errors)
	for i := range 5 {
		require.Equal(t, 1, res.Changed[fmt.Sprint("t", i)])
	}
}

// A task's Needs is kept for it while the tasks before it run: a stuck
// task ahead of it leaves it that much of the pass (review: webhook
// delivery, which needs a send's time, was left too little to send).
func TestATaskGetsWhatItNeedsAfterAStuckOne(t *testing.T) {
	t.Parallel()
	var left time.Duration
	s := New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)),
		stuckTask(), timeLeftTask("needy", 2*time.Second, &left),
		Task{Name: "last", Run: func(ctx context.Context, _ time.Time) (int, error) { return 1, ctx.Err() }},
	)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	res := s.RunOnce(ctx)
	require.Equal(t, map[string]string{"stuck": "failed"}, res.Errors)
	require.GreaterOrEqual(t, left, 1900*time.Millisecond, "needy had %v", left)
	require.Equal(t, 1, res.Changed["last"])
}

// The task right after a stuck one, needing webhook delivery's time, still
// gets a round's time (review: it got 16 s less a few microseconds, under
// what a round needed, and sent nothing).
func TestDeliveryBehindAStuckTaskStillHasARound(t *testing.T) {
	t.Parallel()
	var left time.Duration
	s := New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)),
		stuckTask(), timeLeftTask("deliver", 16*time.Second, &left))
	ctx, cancel := context.WithTimeout(context.Background(), 17500*time.Millisecond)
	defer cancel()
	s.RunOnce(ctx)
	require.Greater(t, left, 15*time.Second, "a round needs more than 15 s left")
}

// stuckTask runs until its limit, as a task waiting on a lock does.
func stuckTask() Task {
	return Task{Name: "stuck", Run: func(ctx context.Context, _ time.Time) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	}}
}

// timeLeftTask needs needs and records in left the time its run was given.
func timeLeftTask(name string, needs time.Duration, left *time.Duration) Task {
	return Task{Name: name, Needs: needs, Run: func(ctx context.Context, _ time.Time) (int, error) {
		deadline, _ := ctx.Deadline()
		*left = time.Until(deadline)
		return 1, nil
	}}
}

// A task that failed on one record goes on to the next after a failure
// of that record's own (any error, a statement timeout included), not once
// its time ended or the database is unreachable, when the rest would fail
// alike.
func TestGoOnPastARecordsOwnFailureOnly(t *testing.T) {
	t.Parallel()
	live := context.Background()
	ended, cancel := context.WithCancel(live)
	cancel()
	timeout := fmt.Errorf("x: %w", &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"})
	for _, c := range []struct {
		ctx  context.Context
		err  error
		goOn bool
	}{
		{live, errors.New("boom"), true},
		{live, timeout, true},
		{live, fmt.Errorf("x: %w", &pgconn.PgError{Code: "23505"}), true},
		{live, fmt.Errorf("x: %w", io.ErrUnexpectedEOF), false},
		{live, fmt.Errorf("x: %w", &pgconn.PgError{Code: "57P01"}), false},
		{ended, errors.New("boom"), false},
		{ended, timeout, false},
	} {
		require.Equal(t, c.goOn, GoOn(c.ctx, c.err), "%v (context ended: %t)", c.err, c.ctx.Err() != nil)
	}
}

// A task that Drains has TaskTimeout in all, every run of it ending by
// then, not TaskTimeout after its own start (review: a run stuck on a lock
// after batches that took most of the task's time held it to nearly twice
// the bound the README gives).
func TestADrainingTaskHasTaskTimeoutInAll(t *testing.T) {
	t.Parallel()
	var deadlines []time.Time
	task := Task{Name: "retention", Drains: true, Run: func(ctx context.Context, _ time.Time) (int, error) {
		deadline, _ := ctx.Deadline()
		deadlines = append(deadlines, deadline)
		if len(deadlines) == 3 {
			return 0, nil
		}
		return 1, nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour) // TaskTimeout binds
	defer cancel()
	res := New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)), task).RunOnce(ctx)
	require.Empty(t, res.Errors)
	require.Len(t, deadlines, 3)
	for i, d := range deadlines[1:] {
		require.True(t, d.Equal(deadlines[0]), "run %d ends %v after the first", i+2, d.Sub(deadlines[0]))
	}
}

// A pass's ms is measured on the monotonic clock, not between two
// readings of now: the database's clock (db.Clock), anchored again
// mid-pass or behind a stepped wall clock, read a pass as negative.
func TestAPassIsTimedOnTheMonotonicClock(t *testing.T) {
	t.Parallel()
	var readings atomic.Int32
	stepped := func() time.Time { // an hour back after the first reading
		if readings.Add(1) == 1 {
			return time.Date(2026, 1, 1, 13, 0, 0, 0, time.UTC)
		}
		return time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	}
	task := Task{Name: "t", Run: func(context.Context, time.Time) (int, error) { return 0, nil }}
	res := New(stepped, slog.New(slog.NewTextHandler(io.Discard, nil)), task).RunOnce(context.Background())
	require.GreaterOrEqual(t, res.Ms, int64(0))
}

// The runs of a task that Drains share one reading of now, so that what
// falls due while they run waits for the next pass (review: each run read
// the clock again, and a steady stream of rows reaching their retention
// had each find a few, the task running to TaskTimeout every pass).
func TestADrainingTasksRunsShareOneNow(t *testing.T) {
	t.Parallel()
	var readings atomic.Int64
	ticking := func() time.Time { // a second on at each reading
		return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(readings.Add(1)) * time.Second)
	}
	var nows []time.Time
	left := 25
	task := Task{Name: "retention", Drains: true, Run: func(_ context.Context, now time.Time) (int, error) {
		nows = append(nows, now)
		n := min(left, 10)
		left -= n
		return n, nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	res := New(ticking, slog.New(slog.NewTextHandler(io.Discard, nil)), task).RunOnce(ctx)
	require.Equal(t, 25, res.Changed["retention"])
	require.Len(t, nows, 4, "two full batches, the rest, then one that found nothing")
	for _, now := range nows[1:] {
		require.Equal(t, nows[0], now)
	}
}

// A draining task's runs within a pass share one Place, where each finds
// what the one before it noted; the next pass's runs start from a new one.
func TestADrainingTasksRunsShareOnePlace(t *testing.T) {
	t.Parallel()
	var seen []any
	left := 0
	task := Task{Name: "retention", Drains: true, Run: func(ctx context.Context, _ time.Time) (int, error) {
		p := PlaceOf(ctx)
		seen = append(seen, p.At)
		if left == 0 {
			return 0, nil
		}
		p.At = left
		left--
		return 1, nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	s := New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)), task)
	left = 2
	s.RunOnce(ctx)
	left = 1
	s.RunOnce(ctx)
	require.Equal(t, []any{nil, 2, 1, nil, 1}, seen)
	require.Nil(t, PlaceOf(context.Background()).At, "no pass: at the front")
}

// The local loop runs a task with an Every once that has passed on the
// sweeper's clock since its last run that did not fail, or the clock moved
// back; the other tasks run every pass. Each pass ends in a task that
// waits for the test, which moves the clock between passes.
func TestLoopRunsATaskWithAnEveryAtThatPace(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	clock := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	move := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); clock = clock.Add(d) }
	var runs, passes atomic.Int32
	var fail atomic.Bool
	passed, next := make(chan struct{}), make(chan struct{})
	s := New(now, slog.New(slog.NewTextHandler(io.Discard, nil)),
		Task{Name: "remind", Every: time.Minute, Run: func(context.Context, time.Time) (int, error) {
			runs.Add(1)
			if fail.Swap(false) {
				return 0, errors.New("boom")
			}
			return 0, nil
		}},
		Task{Name: "last", Run: func(ctx context.Context, _ time.Time) (int, error) {
			passes.Add(1)
			select {
			case passed <- struct{}{}:
				select {
				case <-next:
				case <-ctx.Done():
				}
			case <-ctx.Done():
			}
			return 0, nil
		}},
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Loop(ctx, time.Millisecond); close(done) }()
	for i, step := range []struct {
		runs int32
		then func()
	}{
		{1, func() { move(59 * time.Second) }},              // the first pass runs it
		{1, func() { move(time.Second) }},                   // 59 s on: not yet
		{2, func() { fail.Store(true); move(time.Minute) }}, // a minute on
		{3, func() {}},                   // the run fails...
		{4, func() {}},                   // ...so the next pass runs it again
		{4, func() { move(-time.Hour) }}, // it did not fail: not again
		{5, func() {}},                   // the clock moved back
	} {
		<-passed
		require.Equal(t, int32(i+1), passes.Load())
		require.Equal(t, step.runs, runs.Load(), "pass %d", i+1)
		step.then()
		next <- struct{}{}
	}
	cancel()
	<-done
}

// A task that Drains and fails on records of its own, recorded in the
// pass's Failures, goes on past them in the same pass while it changes
// others, each run passing over those that failed: a backlog behind a
// record that fails every time drains in one pass (review: the failure
// stopped the task, and the record, read first again, held the rest to a
// batch a pass). The failure is still answered. A batch made only of
// failing records ends the task, and so does a failure a run did not
// record (the pick's own, a task that records none).
func TestADrainingTaskGoesOnPastRecordsThatFail(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// backlog is a task over ids read in order, a batch of 3 at a time,
	// whose handling of those in bad fails every time.
	backlog := func(ids []string, bad map[string]bool, record bool) (*atomic.Int32, *[]string, Task) {
		var runs atomic.Int32
		var done []string
		return &runs, &done, Task{Name: "jobs.run_completion", Drains: true, Batch: func() int { return 3 },
			Run: func(ctx context.Context, _ time.Time) (int, error) {
				runs.Add(1)
				failures := FailuresOf(ctx)
				n := 0
				var picked []string
				for _, id := range ids {
					if len(picked) < 3 && !slices.Contains(done, id) && !failures.Has(id) {
						picked = append(picked, id)
					}
				}
				var errs []error
				for _, id := range picked {
					if bad[id] {
						errs = append(errs, fmt.Errorf("record %s: boom", id))
						if record {
							failures.Add(id)
						}
						continue
					}
					n, done = n+1, append(done, id)
				}
				return n, errors.Join(errs...)
			}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	runs, done, task := backlog([]string{"bad", "a", "b", "c", "d", "e", "f", "g"}, map[string]bool{"bad": true}, true)
	res := New(time.Now, logger, task).RunOnce(ctx)
	require.Equal(t, []string{"a", "b", "c", "d", "e", "f", "g"}, *done, "the backlog behind the failing record, in one pass")
	require.Equal(t, 7, res.Changed["jobs.run_completion"])
	require.Equal(t, "failed", res.Errors["jobs.run_completion"], "the failure answered")
	require.EqualValues(t, 3, runs.Load(), "bad a b, then c d e, then f g: short, done")

	runs, done, task = backlog([]string{"x", "y", "z", "a"}, map[string]bool{"x": true, "y": true, "z": true}, true)
	res = New(time.Now, logger, task).RunOnce(ctx)
	require.EqualValues(t, 1, runs.Load(), "a batch of failing records alone ends the task")
	require.Empty(t, *done)
	require.Equal(t, "failed", res.Errors["jobs.run_completion"])

	runs, _, task = backlog([]string{"bad", "a", "b", "c", "d"}, map[string]bool{"bad": true}, false)
	res = New(time.Now, logger, task).RunOnce(ctx)
	require.EqualValues(t, 1, runs.Load(), "a failure not recorded ends the task, as before")
	require.Equal(t, 2, res.Changed["jobs.run_completion"])
}

// A task that runs out of its time after it changed rows in the pass (a
// drain's batch cut mid-way) is cut short, not failed: a warning, answered
// CutShort, and no failure of the pass (the Lambda invocation does not
// fail); the next pass goes on from where it stopped (review: logged at
// ERROR and answered "failed", as a task that could do nothing). One out of
// its time before it changed anything (stuck on a lock) still failed.
func TestATaskCutShortAfterProgressIsNoFailure(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var runs atomic.Int32
	drain := Task{Name: "jobs.run_completion", Drains: true, Batch: func() int { return 10 },
		Run: func(ctx context.Context, _ time.Time) (int, error) {
			if runs.Add(1) == 1 {
				return 10, nil
			}
			<-ctx.Done() // three rows handled, then a statement cut by the task's deadline
			return 3, fmt.Errorf("runs to settle: %w", ctx.Err())
		}}
	stuck := Task{Name: "groups.settle", Run: func(ctx context.Context, _ time.Time) (int, error) {
		<-ctx.Done()
		return 0, fmt.Errorf("sweep groups: %w", ctx.Err())
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // time for a second run
	defer cancel()
	res := New(time.Now, slog.New(slog.NewTextHandler(&logs, nil)), drain).RunOnce(ctx)
	require.EqualValues(t, 2, runs.Load())
	require.Equal(t, 13, res.Changed["jobs.run_completion"])
	require.Equal(t, map[string]string{"jobs.run_completion": CutShort}, res.Errors)
	require.NoError(t, res.Error(), "a task cut short is no failure of the pass")
	require.Contains(t, logs.String(),
		`level=WARN msg="sweep task cut short by its time; the next pass goes on" task=jobs.run_completion`)
	require.NotContains(t, logs.String(), "level=ERROR")

	logs.Reset()
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	res = New(time.Now, slog.New(slog.NewTextHandler(&logs, nil)), stuck).RunOnce(ctx)
	require.Equal(t, map[string]string{"groups.settle": "failed"}, res.Errors, "out of its time with nothing done")
	require.Error(t, res.Error())
	require.Contains(t, logs.String(), `level=ERROR msg="sweep task failed" task=groups.settle`)

	// Cut short after a run that failed on a record: the failure is answered.
	runs.Store(0)
	failing := Task{Name: "jobs.dependencies", Drains: true, Batch: func() int { return 10 },
		Run: func(ctx context.Context, _ time.Time) (int, error) {
			if runs.Add(1) == 1 {
				FailuresOf(ctx).Add("bad")
				return 9, errors.New("stranded dependents: bad: boom")
			}
			<-ctx.Done()
			return 3, fmt.Errorf("stranded dependents: %w", ctx.Err())
		}}
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res = New(time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)), failing).RunOnce(ctx)
	require.EqualValues(t, 2, runs.Load())
	require.Equal(t, 12, res.Changed["jobs.dependencies"])
	require.Equal(t, map[string]string{"jobs.dependencies": "failed"}, res.Errors)
}

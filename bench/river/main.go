// Command river measures River (riverqueue/river), the leading Go job queue
// on Postgres, on the database it is given, so Ratchet's job figures can be
// read as ratios to River's measured in the same run on the same server.
//
//	go run . -database-url postgres://... [-jobs 50000] [-workers 100] [-clients 16] [-rounds 1]
//
// It prints one `name value` line per figure on stdout (medians when
// -rounds > 1; each round is echoed as a `#` comment), and progress on stderr:
//
//	river.work_jobs_per_s            pre-queued jobs drained by one client with -workers workers
//	river.insert_jobs_per_s          one Insert per transaction from -clients goroutines
//	river.insert_and_work_jobs_per_s the same inserts while one client works them
//
// Every figure is wall-clock over the whole batch: from the moment work starts
// until River has reported the last job completed (its completer has written
// the completion), divided into the number of jobs. Nothing is sampled or
// trimmed.
//
// The module lives apart from the product module so that River never becomes
// a dependency of Ratchet. It migrates River's schema into the database itself
// (rivermigrate), seeds completed history and runs ANALYZE before each figure
// (an empty table gives plans that no real queue sees), and removes River's
// schema again at the end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type options struct {
	databaseURL   string
	jobs          int
	insertJobs    int
	workers       int
	clients       int
	rounds        int
	history       int
	fetchCooldown time.Duration
	fetchPoll     time.Duration
	maxConns      int
	keepSchema    bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "river bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("river", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres `URL` (default $DATABASE_URL); River's tables are created in it and dropped at the end")
	fs.IntVar(&o.jobs, "jobs", 50_000, "pre-queued jobs drained by the work figure")
	fs.IntVar(&o.insertJobs, "insert-jobs", 0, "jobs inserted one at a time by the insert figures (default -jobs/5, at least 1000)")
	fs.IntVar(&o.workers, "workers", 100, "River MaxWorkers of the working client")
	fs.IntVar(&o.clients, "clients", 16, "goroutines inserting one job per transaction")
	fs.IntVar(&o.rounds, "rounds", 1, "rounds; each figure is printed as the median over rounds")
	fs.IntVar(&o.history, "history", 100_000, "completed jobs seeded before each figure")
	// River's defaults (100 ms cooldown, 1 s poll) cap one client near
	// MaxWorkers/0.1 s; these are the values River's own benchmark
	// (cmd/river bench) uses to measure its throughput.
	fs.DurationVar(&o.fetchCooldown, "fetch-cooldown", 2*time.Millisecond, "River FetchCooldown")
	fs.DurationVar(&o.fetchPoll, "fetch-poll-interval", 20*time.Millisecond, "River FetchPollInterval")
	fs.IntVar(&o.maxConns, "max-conns", 0, "pgx pool size (default -clients+4)")
	fs.BoolVar(&o.keepSchema, "keep-schema", false, "leave River's tables in place at the end")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.databaseURL == "" {
		return errors.New("-database-url or DATABASE_URL is required")
	}
	if o.insertJobs == 0 {
		o.insertJobs = max(o.jobs/5, 1000)
	}
	if o.maxConns == 0 {
		o.maxConns = o.clients + 4
	}
	if o.jobs < 1 || o.workers < 1 || o.clients < 1 || o.rounds < 1 || o.history < 0 {
		return errors.New("-jobs, -workers, -clients and -rounds must be positive, -history not negative")
	}

	pc, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return fmt.Errorf("parse -database-url: %w", err)
	}
	pc.MaxConns = int32(o.maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()

	b := &bench{o: o, pool: pool, log: stderr}
	if err := b.migrate(ctx, rivermigrate.DirectionUp); err != nil {
		return err
	}
	if !o.keepSchema {
		defer func() {
			// The caller's context may be cancelled by now; cleanup still runs.
			if err := b.migrate(context.Background(), rivermigrate.DirectionDown); err != nil {
				fmt.Fprintln(stderr, "river bench: remove schema:", err)
			}
		}()
	}
	fmt.Fprintf(stdout, "# river v0.51.2 jobs=%d insert_jobs=%d workers=%d clients=%d history=%d fetch_cooldown=%s fetch_poll_interval=%s max_conns=%d\n",
		o.jobs, o.insertJobs, o.workers, o.clients, o.history, o.fetchCooldown, o.fetchPoll, o.maxConns)

	figures := []struct {
		name    string
		measure func(context.Context) (float64, error)
	}{
		{"river.work_jobs_per_s", b.work},
		{"river.insert_jobs_per_s", b.insert},
		{"river.insert_and_work_jobs_per_s", b.insertAndWork},
	}
	values := make([][]float64, len(figures))
	for round := 1; round <= o.rounds; round++ {
		for i, f := range figures {
			if err := b.reset(ctx); err != nil {
				return err
			}
			v, err := f.measure(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", f.name, err)
			}
			values[i] = append(values[i], v)
			if o.rounds > 1 {
				fmt.Fprintf(stdout, "# round %d: %s %.0f\n", round, f.name, v)
			}
		}
	}
	for i, f := range figures {
		fmt.Fprintf(stdout, "%s %.0f\n", f.name, median(values[i]))
	}
	return nil
}

type bench struct {
	o    options
	pool *pgxpool.Pool
	log  io.Writer
}

func (b *bench) migrate(ctx context.Context, dir rivermigrate.Direction) error {
	m, err := rivermigrate.New(riverpgxv5.New(b.pool), &rivermigrate.Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}
	opts := &rivermigrate.MigrateOpts{}
	if dir == rivermigrate.DirectionDown {
		opts.TargetVersion = -1 // every down step: River's schema is gone
	}
	_, err = m.Migrate(ctx, dir, opts)
	return err
}

// reset empties river_job, seeds -history completed jobs finished within the
// last hour (inside River's retention, so its cleaner leaves them alone) and
// refreshes statistics, so every figure starts from the same realistic state.
func (b *bench) reset(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, `TRUNCATE river_job`); err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, `
		INSERT INTO river_job (state, attempt, max_attempts, attempted_at, created_at, finalized_at,
		                       scheduled_at, args, attempted_by, kind, queue)
		SELECT 'completed', 1, 25, t, t, t + interval '5 ms', t, '{"n":0}', '{bench}', 'bench', 'default'
		FROM (SELECT now() - g * interval '30 ms' AS t FROM generate_series(1, $1::int) g) s`, b.o.history); err != nil {
		return fmt.Errorf("seed history: %w", err)
	}
	_, err := b.pool.Exec(ctx, `VACUUM ANALYZE river_job`)
	return err
}

// benchArgs is the job: an empty handler, so the figures measure the queue.
type benchArgs struct {
	N int `json:"n"`
}

func (benchArgs) Kind() string { return "bench" }

type benchWorker struct {
	river.WorkerDefaults[benchArgs]
}

func (benchWorker) Work(context.Context, *river.Job[benchArgs]) error { return nil }

func (b *bench) client(working bool) (*river.Client[pgx.Tx], error) {
	cfg := &river.Config{
		Logger:            slog.New(slog.NewTextHandler(b.log, &slog.HandlerOptions{Level: slog.LevelWarn})),
		FetchCooldown:     b.o.fetchCooldown,
		FetchPollInterval: b.o.fetchPoll,
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, benchWorker{})
	cfg.Workers = workers
	if working {
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: b.o.workers}}
	}
	return river.NewClient(riverpgxv5.New(b.pool), cfg)
}

// completions subscribes to completion events before the client starts, and
// returns a channel closed when n jobs have completed, with the time of the
// last one.
func completions(c *river.Client[pgx.Tx], n int) (done <-chan time.Time, cancel func()) {
	events, unsub := c.SubscribeConfig(&river.SubscribeConfig{
		// Large enough that no event is dropped even if this goroutine
		// falls behind: a dropped event would make the drain look endless.
		ChanSize: n + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	out := make(chan time.Time, 1)
	go func() {
		seen := 0
		for ev := range events {
			if ev.Kind != river.EventKindJobCompleted {
				continue // a benchmark job never fails; not counting it keeps the figure honest
			}
			if seen++; seen == n {
				out <- time.Now()
				return
			}
		}
	}()
	return out, unsub
}

// work pre-queues -jobs jobs (InsertMany, not timed) and times one client
// with -workers workers from Start until the last completion.
func (b *bench) work(ctx context.Context) (float64, error) {
	c, err := b.client(true)
	if err != nil {
		return 0, err
	}
	const batch = 5000
	for i := 0; i < b.o.jobs; i += batch {
		params := make([]river.InsertManyParams, 0, batch)
		for j := i; j < min(i+batch, b.o.jobs); j++ {
			params = append(params, river.InsertManyParams{Args: benchArgs{N: j}})
		}
		if _, err := c.InsertManyFast(ctx, params); err != nil {
			return 0, fmt.Errorf("pre-queue: %w", err)
		}
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE river_job`); err != nil {
		return 0, err
	}
	done, unsub := completions(c, b.o.jobs)
	defer unsub()
	start := time.Now()
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	end, err := wait(ctx, done, c)
	if err != nil {
		return 0, err
	}
	return rate(b.o.jobs, end.Sub(start)), b.verify(ctx, b.o.jobs)
}

// insert times -insert-jobs single inserts from -clients goroutines on an
// insert-only client.
func (b *bench) insert(ctx context.Context) (float64, error) {
	c, err := b.client(false)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := b.insertAll(ctx, c); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'available'`).Scan(&n); err != nil {
		return 0, err
	}
	if n != b.o.insertJobs {
		return 0, fmt.Errorf("%d jobs available after inserting %d", n, b.o.insertJobs)
	}
	return rate(b.o.insertJobs, elapsed), nil
}

// insertAndWork starts a working client and -clients inserting goroutines at
// the same time, timed until the last inserted job has completed.
func (b *bench) insertAndWork(ctx context.Context) (float64, error) {
	c, err := b.client(true)
	if err != nil {
		return 0, err
	}
	done, unsub := completions(c, b.o.insertJobs)
	defer unsub()
	start := time.Now()
	if err := c.Start(ctx); err != nil {
		return 0, err
	}
	insertErr := make(chan error, 1)
	go func() { insertErr <- b.insertAll(ctx, c) }()
	end, err := wait(ctx, done, c)
	if ierr := <-insertErr; ierr != nil {
		return 0, ierr
	}
	if err != nil {
		return 0, err
	}
	return rate(b.o.insertJobs, end.Sub(start)), b.verify(ctx, b.o.insertJobs)
}

// insertAll inserts -insert-jobs jobs, one Insert (one transaction) each,
// from -clients goroutines sharing a counter.
func (b *bench) insertAll(ctx context.Context, c *river.Client[pgx.Tx]) error {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		firstErr error
		once     sync.Once
	)
	for range b.o.clients {
		wg.Go(func() {
			for {
				n := int(next.Add(1))
				if n > b.o.insertJobs {
					return
				}
				if _, err := c.Insert(ctx, benchArgs{N: n}, nil); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

// wait blocks until the drain is done, then stops the client (not timed).
func wait(ctx context.Context, done <-chan time.Time, c *river.Client[pgx.Tx]) (time.Time, error) {
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(stopCtx)
	}()
	select {
	case end := <-done:
		return end, nil
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	case <-time.After(20 * time.Minute):
		return time.Time{}, errors.New("drain did not finish within 20 minutes")
	}
}

// verify checks that the database agrees with the events: n jobs completed
// besides the seeded history, none left behind.
func (b *bench) verify(ctx context.Context, n int) error {
	var completed, other int
	err := b.pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state <> 'completed')
		FROM river_job`).Scan(&completed, &other)
	if err != nil {
		return err
	}
	if completed != b.o.history+n || other != 0 {
		return fmt.Errorf("after the drain: %d completed (want %d), %d in other states", completed, b.o.history+n, other)
	}
	return nil
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

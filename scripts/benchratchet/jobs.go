package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jobs"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// Durable-job and SDK figures (issue 6, item 1), each over HTTP through the
// Go SDK (sdk/go) as a user's producer and worker would call the service.
// The names are paired in scripts/benchrun/ratios.go:
//
//	ratchet.jobs.enqueue_per_s              vs river.insert_jobs_per_s, pgbench.insert_tps
//	ratchet.jobs.work_jobs_per_s            vs river.work_jobs_per_s, pgbench.claim_complete_tps, …batch100…
//	ratchet.jobs.insert_and_work_jobs_per_s vs river.insert_and_work_jobs_per_s
//
// As bench/river and scripts/bench-pgbench do: b.scale.History completed
// jobs (with their executions) are seeded before each figure and the tables
// ANALYZEd; throughput is wall-clock over the whole batch, from the first
// request (or the worker's Start) to the last job recorded SUCCEEDED in the
// database (its updated_at, written by the report); afterwards exactly the
// expected jobs must be SUCCEEDED and the worker must have reported no error.

// The tool every figure enqueues; its handler does nothing, as River's
// benchmark job does.
const (
	benchTool    = "bench_noop"
	benchVersion = "1"
)

// River's benchmark client polls with FetchCooldown 2 ms and
// FetchPollInterval 20 ms; the throughput figures give the SDK worker the
// same idle poll so neither side idles longer than the other.
const benchPollInterval = 20 * time.Millisecond

// historyWarm is how many real jobs are enqueued and worked before being
// cloned into history.
const historyWarm = 200

type benchInput struct {
	N int `json:"n"`
}

// jobsSession is one instance and workspace with a producer (INGEST key)
// and a WORKER key for benchTool, with b.scale.History finished jobs seeded.
type jobsSession struct {
	b         *bench
	in        *instance
	ws        string
	producer  *ratchet.Client
	workerKey string
	svc       *jobs.Service
	// cloneTag prefixes every clone's id tag, so that runs against the same
	// database (benchratchet -database-url twice, go test -count) do not
	// collide on the clones' ids.
	cloneTag string
}

func (b *bench) jobsSetup(ctx context.Context, wrap func(http.Handler) http.Handler) (s *jobsSession, err error) {
	in, err := b.serverInstance(ctx, "ratchet.jobs", wrap)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			in.Close()
		}
	}()
	ws, operator, err := in.Signup(ctx)
	if err != nil {
		return nil, err
	}
	ingest, err := in.MintKey(ctx, operator, map[string]any{"name": "bench-producer", "preset": "INGEST"})
	if err != nil {
		return nil, err
	}
	wk, err := in.MintKey(ctx, operator, map[string]any{"name": "bench-worker", "preset": "WORKER",
		"tools": []string{benchTool + "@" + benchVersion}})
	if err != nil {
		return nil, err
	}
	s = &jobsSession{b: b, in: in, ws: ws, workerKey: wk, svc: in.App.Server.Jobs, cloneTag: ids.Random(2)}
	if s.producer, err = s.client(ingest); err != nil {
		return nil, err
	}
	return s, s.seedHistory(ctx)
}

func (s *jobsSession) Close() { s.in.Close() }

// client is an SDK client over the session's instance.
func (s *jobsSession) client(key string) (*ratchet.Client, error) { return s.in.SDK(key) }

// seedHistory works historyWarm real jobs to SUCCEEDED, clones them (with
// their executions) into b.scale.History finished jobs, and ANALYZEs.
func (s *jobsSession) seedHistory(ctx context.Context) error {
	warm := min(historyWarm, max(s.b.scale.History, 1))
	runs, err := s.startRuns(ctx, "history", 1)
	if err != nil {
		return err
	}
	w, werrs, err := s.startWorker(ctx, ratchet.StartOptions{Concurrency: 100, PollInterval: benchPollInterval}, nil)
	if err != nil {
		return err
	}
	if _, err := s.enqueueMany(ctx, runs, warm); err != nil {
		return err
	}
	_, err = s.waitSucceeded(ctx, runs, warm)
	if err := errors.Join(err, stopWorker(w), werrs.err()); err != nil {
		return fmt.Errorf("history warm-up: %w", err)
	}
	copies := (s.b.scale.History - 1) / warm
	pool := s.in.App.Pool
	if _, err := cloneRows(ctx, pool, "jobs", copies, "s.workspace_id = $1", map[string]string{
		"id": "s.id || '-h' || g", "step_id": "s.step_id || '-h' || g", "idempotency_key": "s.idempotency_key || ':h' || g",
	}, s.ws); err != nil {
		return err
	}
	if _, err := cloneRows(ctx, pool, "job_executions", copies,
		"s.job_id IN (SELECT id FROM jobs WHERE workspace_id = $1 AND run_id = $2)",
		map[string]string{"job_id": "s.job_id || '-h' || g"}, s.ws, runs[0]); err != nil {
		return err
	}
	return analyze(ctx, pool, "jobs", "job_executions", "job_runs")
}

// startRuns starts n runs.
func (s *jobsSession) startRuns(ctx context.Context, name string, n int) ([]string, error) {
	var ids []string
	for i := range n {
		r, err := s.producer.StartRun(ctx, name+"-"+strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		ids = append(ids, r.ID)
	}
	return ids, nil
}

// enqueue enqueues one job (input n) into run.
func (s *jobsSession) enqueue(ctx context.Context, run string, n int) (*ratchet.EnqueueResult, error) {
	return s.producer.Enqueue(ctx, run, benchInput{N: n}, ratchet.EnqueueOptions{Name: benchTool, Version: benchVersion})
}

// enqueueMany enqueues n jobs, one per request, from b.scale.Clients
// clients; job i goes to runs[i%len(runs)].
func (s *jobsSession) enqueueMany(ctx context.Context, runs []string, n int) (loadResult, error) {
	return load(ctx, s.b.scale.Clients, n, func(ctx context.Context, i int) error {
		_, err := s.enqueue(ctx, runs[i%len(runs)], i)
		return err
	})
}

// errList collects a worker's OnError calls: a figure whose worker saw any
// error (a failed claim or report, a lost lease) is not a figure.
type errList struct {
	mu   sync.Mutex
	errs []error
}

func (e *errList) add(err error) {
	e.mu.Lock()
	e.errs = append(e.errs, err)
	e.mu.Unlock()
}

func (e *errList) err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.errs) == 0 {
		return nil
	}
	return fmt.Errorf("worker reported %d error(s), first: %w", len(e.errs), e.errs[0])
}

// startWorker starts an SDK worker for benchTool; onStart (optional) is
// called at the start of every handler.
func (s *jobsSession) startWorker(ctx context.Context, opts ratchet.StartOptions, onStart func(benchInput)) (*ratchet.Worker, *errList, error) {
	return s.startWorkerOn(ctx, s.in, opts, onStart)
}

// startWorkerOn is startWorker with the worker talking to instance in.
func (s *jobsSession) startWorkerOn(ctx context.Context, in *instance, opts ratchet.StartOptions, onStart func(benchInput)) (*ratchet.Worker, *errList, error) {
	c, err := in.SDK(s.workerKey)
	if err != nil {
		return nil, nil, err
	}
	w := ratchet.NewWorker(c)
	if err := ratchet.RegisterTool(w, ratchet.Tool[benchInput, struct{}]{Name: benchTool, Version: benchVersion,
		Handler: func(_ context.Context, in benchInput, _ ratchet.JobContext) (struct{}, error) {
			if onStart != nil {
				onStart(in)
			}
			return struct{}{}, nil
		}}); err != nil {
		return nil, nil, err
	}
	errs := &errList{}
	opts.OnError = errs.add
	if err := w.Start(ctx, opts); err != nil {
		return nil, nil, err
	}
	return w, errs, nil
}

func stopWorker(w *ratchet.Worker) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return w.Stop(ctx)
}

// waitSucceeded waits until no job of runs is still due or running, checks
// that exactly want are SUCCEEDED, and returns when the last of them was
// recorded (the largest updated_at, written by its report).
func (s *jobsSession) waitSucceeded(ctx context.Context, runs []string, want int) (time.Time, error) {
	return s.waitHandledThenSucceeded(ctx, runs, want, nil)
}

// waitHandledThenSucceeded is waitSucceeded for a worker whose handlers
// count their starts in handled: it waits in process until every job has
// started, and only then polls the database for the last reports. Polling
// a large run's jobs every 100 ms throughout would take a good part of the
// server's CPU from the figure being measured (River's side waits on its
// in-process completion events). The figure's end is still the database's
// own record of the last report.
func (s *jobsSession) waitHandledThenSucceeded(ctx context.Context, runs []string, want int, handled *atomic.Int64) (time.Time, error) {
	for handled != nil && handled.Load() < int64(want) {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	for {
		var active, succeeded, other int
		var last *time.Time
		err := s.in.App.Pool.QueryRow(ctx, `SELECT
				count(*) FILTER (WHERE status IN ('QUEUED', 'RETRY_SCHEDULED', 'RUNNING', 'WAITING')),
				count(*) FILTER (WHERE status = 'SUCCEEDED'),
				count(*) FILTER (WHERE status NOT IN ('QUEUED', 'RETRY_SCHEDULED', 'RUNNING', 'WAITING', 'SUCCEEDED')),
				max(updated_at) FILTER (WHERE status = 'SUCCEEDED')
			FROM jobs WHERE run_id = ANY($1::text[])`, runs).Scan(&active, &succeeded, &other, &last)
		if err != nil {
			return time.Time{}, err
		}
		if active == 0 {
			if succeeded != want || other != 0 || last == nil {
				return time.Time{}, fmt.Errorf("%d jobs SUCCEEDED and %d in another final state, want %d SUCCEEDED", succeeded, other, want)
			}
			return *last, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// preQueue enqueues one real job into a new run and clones it into n queued
// jobs in all (lib/jobs CloneQueued, one INSERT … SELECT), then ANALYZEs.
// tag must be unique within the session (cloneTag sets sessions apart).
func (s *jobsSession) preQueue(ctx context.Context, tag string, n int) (run string, err error) {
	runs, err := s.startRuns(ctx, "queue-"+tag, 1)
	if err != nil {
		return "", err
	}
	tmpl, err := s.enqueue(ctx, runs[0], 0)
	if err != nil {
		return "", err
	}
	if err := s.cloneQueued(ctx, tmpl.JobID, tag, n-1); err != nil {
		return "", err
	}
	return runs[0], analyze(ctx, s.in.App.Pool, "jobs", "job_executions")
}

// cloneQueued adds n copies of the QUEUED job jobID, in slices so no single
// statement runs into the request statement timeout on a loaded machine.
func (s *jobsSession) cloneQueued(ctx context.Context, jobID, tag string, n int) error {
	const slice = 25_000
	for part := 0; n > 0; part++ {
		k := min(n, slice)
		// Hex keeps the tag inside the id alphabet (Crockford base32 has
		// no i, l, o or u): a clone the API cannot parse answers 404.
		if _, err := s.svc.CloneQueued(ctx, jobID, s.cloneTag+tag+strconv.FormatInt(int64(part), 16)+"x", k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// jobsEnqueue: b.scale.Requests single enqueues over HTTP (POST
// /api/v1/runs/{id}/steps through the SDK producer, one job per request),
// from b.scale.Clients clients, each job into one of Clients runs so that
// clients do not queue on one run's lock.
func jobsEnqueue(ctx context.Context, b *bench) error {
	s, err := b.jobsSetup(ctx, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	runs, err := s.startRuns(ctx, "enqueue", b.scale.Clients)
	if err != nil {
		return err
	}
	res, err := s.enqueueMany(ctx, runs, b.scale.Requests)
	if err != nil {
		return err
	}
	var queued int
	if err := s.in.App.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE run_id = ANY($1::text[]) AND status = 'QUEUED'`,
		runs).Scan(&queued); err != nil {
		return err
	}
	if queued != b.scale.Requests {
		return fmt.Errorf("%d jobs queued, want %d", queued, b.scale.Requests)
	}
	res.CPU.report(b.out, "ratchet.jobs.enqueue", res.N)
	b.emit("ratchet.jobs.enqueue_per_s", res.Rate())
	b.emit("ratchet.jobs.enqueue_p50_ms", ms(res.Percentile(50)))
	b.emit("ratchet.jobs.enqueue_p99_ms", ms(res.Percentile(99)))
	return nil
}

// jobsWork: b.scale.Jobs pre-queued jobs (not timed) drained by one SDK
// worker at concurrency b.scale.Workers; timed from Start to the last job
// recorded SUCCEEDED.
func jobsWork(ctx context.Context, b *bench) error {
	var claims atomic.Int64
	s, err := b.jobsSetup(ctx, countClaims(&claims))
	if err != nil {
		return err
	}
	defer s.Close()
	run, err := s.preQueue(ctx, "wk", b.scale.Jobs)
	if err != nil {
		return err
	}
	claims.Store(0)
	var handled atomic.Int64
	cpu := startCPUWindow()
	start := time.Now()
	w, werrs, err := s.startWorker(ctx, ratchet.StartOptions{Concurrency: b.scale.Workers, PollInterval: benchPollInterval},
		func(benchInput) { handled.Add(1) })
	if err != nil {
		return err
	}
	last, err := s.waitHandledThenSucceeded(ctx, []string{run}, b.scale.Jobs, &handled)
	cpu.stop().report(b.out, "ratchet.jobs.work", b.scale.Jobs)
	if err := errors.Join(err, stopWorker(w), werrs.err()); err != nil {
		return err
	}
	b.emit("ratchet.jobs.work_jobs_per_s", float64(b.scale.Jobs)/last.Sub(start).Seconds())
	b.emit("ratchet.jobs.work_jobs_per_claim", float64(b.scale.Jobs)/float64(max(claims.Load(), 1)))
	return nil
}

// countClaims counts claim requests where the server receives them.
func countClaims(n *atomic.Int64) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == "POST" && strings.HasPrefix(r.URL.Path, "/api/v1/workers/") && strings.HasSuffix(r.URL.Path, "/claim") {
				n.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	}
}

// jobsInsertAndWork: b.scale.Clients clients enqueue b.scale.InsertJobs jobs
// one per request while the SDK worker (b.scale.Workers) works them; timed
// from the first enqueue until the last is SUCCEEDED.
func jobsInsertAndWork(ctx context.Context, b *bench) error {
	s, err := b.jobsSetup(ctx, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	runs, err := s.startRuns(ctx, "insert-and-work", b.scale.Clients)
	if err != nil {
		return err
	}
	var handled atomic.Int64
	w, werrs, err := s.startWorker(ctx, ratchet.StartOptions{Concurrency: b.scale.Workers, PollInterval: benchPollInterval},
		func(benchInput) { handled.Add(1) })
	if err != nil {
		return err
	}
	start := time.Now()
	_, err = s.enqueueMany(ctx, runs, b.scale.InsertJobs)
	var last time.Time
	if err == nil {
		last, err = s.waitHandledThenSucceeded(ctx, runs, b.scale.InsertJobs, &handled)
	}
	if err := errors.Join(err, stopWorker(w), werrs.err()); err != nil {
		return err
	}
	b.emit("ratchet.jobs.insert_and_work_jobs_per_s", float64(b.scale.InsertJobs)/last.Sub(start).Seconds())
	return nil
}

// jobsClaimLatency: latency of one claim (limit 1, over HTTP through the
// SDK client) with each of b.scale.ClaimQueued jobs queued behind it (bulk
// loaded with CloneQueued, then VACUUM ANALYZE, as a long-lived queue table
// would be), b.scale.ClaimSamples sequential
// claims per depth, each reported (not timed) before the next, from a
// CHECKPOINT taken after the load and its vacuum. Emits
// ratchet.jobs.claim_p50_ms_<depth> and _p99_ (depth as 10k, 1m, …).
func jobsClaimLatency(ctx context.Context, b *bench) error {
	s, err := b.jobsSetup(ctx, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	c, err := s.client(s.workerKey)
	if err != nil {
		return err
	}
	wid, err := c.RegisterWorker(ctx, []ratchet.ToolRef{{Name: benchTool, Version: benchVersion}})
	if err != nil {
		return err
	}
	runs, err := s.startRuns(ctx, "claim", 1)
	if err != nil {
		return err
	}
	tmpl, err := s.enqueue(ctx, runs[0], 0)
	if err != nil {
		return err
	}
	queued, claimed := 1, 0
	for i, depth := range b.scale.ClaimQueued {
		if add := depth - (queued - claimed); add > 0 {
			if err := s.cloneQueued(ctx, tmpl.JobID, "cq"+strconv.Itoa(i), add); err != nil {
				return err
			}
			queued += add
		}
		if err := vacuumAnalyze(ctx, s.in.App.Pool, "jobs", "job_executions"); err != nil {
			return err
		}
		// Each depth is timed from a checkpoint, so that both start from the
		// same state: otherwise the 1 M depth may be timed while the
		// checkpoint its bulk load set off (about a gigabyte of WAL) runs,
		// and the 10 k one after no such load (BENCHMARKS.md, session 30:
		// not a difference the ratio's spread shows, but one fewer).
		if _, err := s.in.App.Pool.Exec(ctx, "CHECKPOINT"); err != nil {
			fmt.Fprintf(b.out, "# claim latency: CHECKPOINT refused (it needs superuser or pg_checkpoint); depths timed without one\n")
		}
		before, ioErr := readClaimIO(ctx, s.in.App.Pool)
		lat := make([]time.Duration, b.scale.ClaimSamples)
		for k := range lat {
			t := time.Now()
			js, err := c.Claim(ctx, wid, 1, 0)
			lat[k] = time.Since(t)
			if err != nil {
				return err
			}
			if len(js) != 1 {
				return fmt.Errorf("claim with %d queued answered %d jobs", depth, len(js))
			}
			claimed++
			if _, err := c.ReportJob(ctx, js[0].JobID, ratchet.JobReport{LeaseToken: js[0].LeaseToken,
				Status: ratchet.ReportSucceeded, Output: []byte(`{}`)}); err != nil {
				return err
			}
		}
		label := depthLabel(depth)
		if after, err := readClaimIO(ctx, s.in.App.Pool); err == nil && ioErr == nil {
			n := float64(len(lat))
			fmt.Fprintf(b.out, "# claim io %s: per claim and report: WAL %.1f records, %.0f B, %.2f full pages; buffers %.1f hit, %.2f read\n",
				label, float64(after.walRecords-before.walRecords)/n, float64(after.walBytes-before.walBytes)/n,
				float64(after.walFPI-before.walFPI)/n, float64(after.hit-before.hit)/n, float64(after.read-before.read)/n)
		}
		b.emit("ratchet.jobs.claim_p50_ms_"+label, ms(percentile(lat, 50)))
		b.emit("ratchet.jobs.claim_p99_ms_"+label, ms(percentile(lat, 99)))
	}
	return nil
}

// depthLabel spells a queue depth as the figure names do: 10k, 1m, 500.
func depthLabel(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "m"
	case n >= 1_000 && n%1_000 == 0:
		return strconv.Itoa(n/1_000) + "k"
	}
	return strconv.Itoa(n)
}

// jobsEndToEnd: enqueue → handler start with an idle SDK worker waiting in a
// long-poll claim (WaitSeconds 20, the default 30 s poll interval), p50 and
// p99 over b.scale.E2ESamples jobs enqueued one at a time after a random
// pause of up to 250 ms, so they land at every point of the server's
// long-poll schedule. Producer and worker reach the same instance, so the
// enqueue wakes the parked claim (a long-running server's case).
func jobsEndToEnd(ctx context.Context, b *bench) error {
	return endToEnd(ctx, b, "ratchet.jobs.e2e", false)
}

// jobsEndToEndAcrossInstances is jobsEndToEnd with the producer and the
// worker on two instances, as on a serverless deployment where any request
// may reach any instance: the worker's long poll is not woken by the
// enqueue and finds the job at its next look.
func jobsEndToEndAcrossInstances(ctx context.Context, b *bench) error {
	return endToEnd(ctx, b, "ratchet.jobs.e2e_cross_instance", true)
}

// endToEnd times enqueue → handler start for b.scale.E2ESamples jobs, one
// at a time at random intervals, and emits name_p50_ms and name_p99_ms. With
// cross the worker talks to a second instance (the serverless default
// configuration) over the same database.
func endToEnd(ctx context.Context, b *bench, name string, cross bool) error {
	s, err := b.jobsSetup(ctx, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	runs, err := s.startRuns(ctx, "e2e", 1)
	if err != nil {
		return err
	}
	workerIn := s.in
	if cross {
		if workerIn, err = b.instance(ctx, nil); err != nil {
			return err
		}
		defer workerIn.Close()
	}
	started := make(chan benchInput, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Ended by cancelling wctx, not Stop: Stop would wait out the long poll.
	_, werrs, err := s.startWorkerOn(wctx, workerIn, ratchet.StartOptions{Concurrency: 10, WaitSeconds: 20},
		func(in benchInput) { started <- in })
	if err != nil {
		return err
	}
	lat := make([]time.Duration, b.scale.E2ESamples)
	for i := range lat {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(rand.Int64N(int64(250 * time.Millisecond)))):
		}
		t := time.Now()
		if _, err := s.enqueue(ctx, runs[0], i+1); err != nil {
			return err
		}
		select {
		case in := <-started:
			lat[i] = time.Since(t)
			if in.N != i+1 {
				return fmt.Errorf("handler started job %d, want %d", in.N, i+1)
			}
		case <-time.After(time.Minute):
			return fmt.Errorf("job %d did not start within a minute", i+1)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if _, err := s.waitSucceeded(ctx, runs, len(lat)); err != nil {
		return err
	}
	if err := werrs.err(); err != nil {
		return err
	}
	b.emit(name+"_p50_ms", ms(percentile(lat, 50)))
	b.emit(name+"_p99_ms", ms(percentile(lat, 99)))
	return nil
}

// idleClaims: claim calls an idle SDK worker makes in b.scale.IdleWindow
// (10 minutes) at default settings, counted at the server. The poll loop
// has no clock of its own but the interval (jittered ±10 %), so the window
// and the interval are both scaled down 100× (6 s at 300 ms for 10 minutes
// at the default 30 s); the count is the same.
func idleClaims(ctx context.Context, b *bench) error {
	var claims atomic.Int64
	s, err := b.jobsSetup(ctx, countClaims(&claims))
	if err != nil {
		return err
	}
	defer s.Close()
	const scaleDown = 100
	claims.Store(0)
	w, werrs, err := s.startWorker(ctx, ratchet.StartOptions{PollInterval: ratchet.DefaultPollInterval / scaleDown}, nil)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(b.scale.IdleWindow / scaleDown):
	}
	if err := errors.Join(ctx.Err(), stopWorker(w), werrs.err()); err != nil {
		return err
	}
	fmt.Fprintf(b.out, "# idle_claims: %v window at a %v poll interval (the defaults %v and %v scaled down %d×)\n",
		b.scale.IdleWindow/scaleDown, ratchet.DefaultPollInterval/scaleDown, b.scale.IdleWindow, ratchet.DefaultPollInterval, scaleDown)
	b.emit("ratchet.serverless.idle_claims_10min", float64(claims.Load()))
	return nil
}

// severable is a transport that can be cut, as if the process holding it
// died: every request after the cut fails without reaching the server.
type severable struct {
	next http.RoundTripper
	cut  atomic.Bool
}

func (s *severable) RoundTrip(r *http.Request) (*http.Response, error) {
	if s.cut.Load() {
		return nil, errors.New("severed")
	}
	return s.next.RoundTrip(r)
}

// reclaimTimeout is the job timeout of the reclaim figure.
const reclaimTimeout = time.Second

// jobsReclaim: a worker claims a job (timeout 1 s) and dies (its transport
// is cut: no heartbeat, no report); a second worker, long-polling, picks the
// job up again. Emits how long after the timeout that happened:
// ratchet.jobs.reclaim_after_timeout_s (issue 6: within the timeout plus
// 30 s). The lease is the timeout plus JOB_LEASE_GRACE_MS (default 10 s).
func jobsReclaim(ctx context.Context, b *bench) error {
	s, err := b.jobsSetup(ctx, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	runs, err := s.startRuns(ctx, "reclaim", 1)
	if err != nil {
		return err
	}
	cut := &severable{next: s.in.Client.Transport}
	dc, err := ratchet.NewClient(ratchet.Config{BaseURL: s.in.URL, APIKey: s.workerKey,
		HTTPClient: &http.Client{Transport: cut, Timeout: time.Minute}, MaxRetries: -1})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	doomed := ratchet.NewWorker(dc)
	claimed := make(chan time.Time, 1)
	if err := ratchet.RegisterTool(doomed, ratchet.Tool[benchInput, struct{}]{Name: benchTool, Version: benchVersion,
		Handler: func(hctx context.Context, _ benchInput, _ ratchet.JobContext) (struct{}, error) {
			cut.cut.Store(true) // the process "dies" holding the lease
			claimed <- time.Now()
			<-hctx.Done() // and this handler never finishes on its own
			return struct{}{}, hctx.Err()
		}}); err != nil {
		return err
	}
	if err := doomed.Start(wctx, ratchet.StartOptions{WaitSeconds: 20, OnError: func(error) {}}); err != nil {
		return err
	}
	if _, err := s.producer.Enqueue(ctx, runs[0], benchInput{N: 1}, ratchet.EnqueueOptions{
		Name: benchTool, Version: benchVersion, Timeout: reclaimTimeout, MaxAttempts: 3}); err != nil {
		return err
	}
	var t0 time.Time
	select {
	case t0 = <-claimed:
	case <-time.After(time.Minute):
		return errors.New("the job was not claimed within a minute")
	case <-ctx.Done():
		return ctx.Err()
	}
	rescued := make(chan time.Time, 1)
	_, werrs, err := s.startWorker(wctx, ratchet.StartOptions{WaitSeconds: 20}, func(benchInput) { rescued <- time.Now() })
	if err != nil {
		return err
	}
	var t1 time.Time
	select {
	case t1 = <-rescued:
	case <-time.After(2 * time.Minute):
		return errors.New("the job of the dead worker was not reclaimed within 2 minutes")
	case <-ctx.Done():
		return ctx.Err()
	}
	if _, err := s.waitSucceeded(ctx, runs, 1); err != nil {
		return err
	}
	if err := werrs.err(); err != nil {
		return err
	}
	b.emit("ratchet.jobs.reclaim_after_timeout_s", (t1.Sub(t0) - reclaimTimeout).Seconds())
	return nil
}

package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// The database connection dies mid-request (chaos QA): behind serverless,
// PgBouncer and managed Postgres, connections are cut at any moment (a
// failover, idle reaping, pg_terminate_backend): before a statement, mid
// transaction, during COMMIT. TestChaosConnectionsDieMidRequest runs a mixed
// workload through the real handler and the Go SDK — gate begin → report
// on new and repeated keys, job enqueues under stable keys, a worker
// claiming and reporting, a second worker registering, webhooks created
// under Idempotency-Keys, cron sweeper passes — while a second connection
// keeps terminating the service's own and a trigger ends some of their
// commits at COMMIT. Once the chaos stops it holds the promises to the
// record: nothing acknowledged is lost, no key executes twice outside the
// documented retry semantics (each repeat is counted and justified), every
// retry of a lost answer gets the same outcome, no answer is a 500, nothing
// is logged as an error, and the instance recovers by itself.

// chaosLog is what the SDK clients' transport saw of the calls the
// invariants are about: every answer, by what it acknowledged.
type chaosLog struct {
	next http.RoundTripper

	mu sync.Mutex
	// executes are begin answers with decision execute, by lease token.
	executes map[string]grant
	// gateReports are effect reports answered 2xx: lease token → outcome.
	gateReports map[string]string
	// enqueues are enqueue answers 2xx by idempotency key.
	enqueues map[string][]ratchet.EnqueueResult
	// claims are jobs a claim answered: job id → attempts handed over.
	claims map[string][]int
	// jobReports are job reports answered 2xx (single or in a batch):
	// job id → attempts recorded.
	jobReports map[string][]int
	// failures counts answers that were not 2xx by status and code, and
	// transport errors.
	failures map[string]int
	// internal are the bodies of every 500 (none may leak).
	internal []string
}

type grant struct {
	effectID string
	attempt  int
}

func newChaosLog(next http.RoundTripper) *chaosLog {
	return &chaosLog{next: next, executes: map[string]grant{}, gateReports: map[string]string{},
		enqueues: map[string][]ratchet.EnqueueResult{}, claims: map[string][]int{}, jobReports: map[string][]int{},
		failures: map[string]int{}}
}

var (
	gateReportPath = regexp.MustCompile(`/api/v1/effects/[^/]+/report$`)
	enqueuePath    = regexp.MustCompile(`/api/v1/runs/[^/]+/steps$`)
	claimPath      = regexp.MustCompile(`/api/v1/workers/[^/]+/claim$`)
	jobReportPath  = regexp.MustCompile(`/api/v1/jobs/([^/]+/)?report$`)
)

func (l *chaosLog) RoundTrip(r *http.Request) (*http.Response, error) {
	return apitest.Tee(l.next, r, func(r *http.Request, req []byte, res *http.Response, body []byte) {
		l.note(r.URL.Path, req, res.StatusCode, body)
	}, func(err error) {
		l.mu.Lock()
		l.failures["transport: "+err.Error()]++
		l.mu.Unlock()
	})
}

func (l *chaosLog) note(path string, req []byte, status int, body []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if status < 200 || status > 299 {
		var env struct {
			Error struct {
				Code   string         `json:"code"`
				Detail map[string]any `json:"detail"`
			} `json:"error"`
		}
		_ = json.Unmarshal(body, &env)
		name := fmt.Sprint(status, " ", env.Error.Code)
		if o, ok := env.Error.Detail["outcome"].(string); ok {
			name += " " + o
		}
		l.failures[name]++
		if status == http.StatusInternalServerError {
			l.internal = append(l.internal, path+": "+string(body))
		}
		return
	}
	switch {
	case strings.HasSuffix(path, "/effects/begin"):
		var b struct {
			Decision   string `json:"decision"`
			EffectID   string `json:"effect_id"`
			Attempt    int    `json:"attempt"`
			LeaseToken string `json:"lease_token"`
		}
		if json.Unmarshal(body, &b) == nil && b.Decision == "execute" {
			l.executes[b.LeaseToken] = grant{effectID: b.EffectID, attempt: b.Attempt}
		}
	case gateReportPath.MatchString(path):
		var q struct {
			LeaseToken string `json:"lease_token"`
			Outcome    string `json:"outcome"`
		}
		if json.Unmarshal(req, &q) == nil {
			l.gateReports[q.LeaseToken] = q.Outcome
		}
	case enqueuePath.MatchString(path):
		var e ratchet.EnqueueResult
		if json.Unmarshal(body, &e) == nil {
			l.enqueues[e.IdempotencyKey] = append(l.enqueues[e.IdempotencyKey], e)
		}
	case claimPath.MatchString(path):
		var c struct {
			Jobs []ratchet.ClaimedJob `json:"jobs"`
		}
		if json.Unmarshal(body, &c) == nil {
			for _, j := range c.Jobs {
				l.claims[j.JobID] = append(l.claims[j.JobID], j.Attempt)
			}
		}
	case jobReportPath.MatchString(path):
		for _, a := range apitest.AcknowledgedJobReports(body) {
			l.jobReports[a.JobID] = append(l.jobReports[a.JobID], a.Attempt)
		}
	}
}

// killer terminates the service's database connections, the way a
// failover, a pooler's idle reaping or an operator's pg_terminate_backend
// would: every one of them at once, or one chosen at random (idle or in
// the middle of a statement, a transaction or its COMMIT).
type killer struct {
	conn   *pgx.Conn
	killed atomic.Int64
	rounds atomic.Int64
}

// sqlKill ends up to $1 of the service's connections (application_name
// ratchet, which db.Open sets) in this test's database, chosen at random.
const sqlKill = `
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM (
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
      AND application_name = 'ratchet'
    ORDER BY random() LIMIT $1) s`

func (k *killer) run(ctx context.Context) {
	for ctx.Err() == nil {
		time.Sleep(time.Duration(40+rand.IntN(160)) * time.Millisecond)
		limit := 1
		if rand.IntN(4) == 0 {
			limit = 1000 // all of them: a failover
		}
		var n int64
		if err := k.conn.QueryRow(ctx, sqlKill, limit).Scan(&n); err == nil {
			k.killed.Add(n)
			k.rounds.Add(1)
		}
	}
}

// chaosFor is how long the workload is handed new work under the chaos.
const chaosFor = 5 * time.Second

// chaosCost is what each gate attempt declares.
const chaosCost = 1000

// endCommits makes some of the workspace's commits end their connection:
// a deferred trigger on the tables the workload writes terminates its own
// backend at COMMIT, now and then, so that the client's COMMIT (or its
// statement's, for one sent alone) is never answered and did not land. The
// killer covers the others: a connection ended idle, mid-statement, or
// between a commit and its answer. calm stops it.
func endCommits(t *testing.T, ctx context.Context, ws string) (calm func()) {
	t.Helper()
	conn, err := pgx.Connect(ctx, apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	tables := []string{"effects", "effect_attempts", "jobs", "job_executions", "job_workers", "webhooks",
		"webhook_deliveries"}
	_, err = conn.Exec(ctx, `
CREATE SEQUENCE IF NOT EXISTS chaos_commits_ended;
CREATE OR REPLACE FUNCTION chaos_end_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF random() < 0.03 THEN
        PERFORM nextval('chaos_commits_ended'); -- kept: a sequence is not rolled back
        PERFORM pg_terminate_backend(pg_backend_pid());
    END IF;
    RETURN NULL;
END $$`)
	require.NoError(t, err)
	for _, table := range tables {
		_, err := conn.Exec(ctx, fmt.Sprintf(`CREATE CONSTRAINT TRIGGER chaos_end_at_commit AFTER INSERT OR UPDATE ON %s
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.workspace_id = '%s') EXECUTE FUNCTION chaos_end_at_commit()`,
			table, ws))
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), apitest.DatabaseURL(t))
		require.NoError(t, err)
		defer conn.Close(context.Background())
		for _, table := range tables {
			_, err := conn.Exec(context.Background(), "DROP TRIGGER chaos_end_at_commit ON "+table)
			require.NoError(t, err)
		}
		_, err = conn.Exec(context.Background(), "DROP FUNCTION chaos_end_at_commit(); DROP SEQUENCE chaos_commits_ended")
		require.NoError(t, err)
	})
	return func() {
		conn, err := pgx.Connect(ctx, apitest.DatabaseURL(t))
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, `CREATE OR REPLACE FUNCTION chaos_end_at_commit() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN RETURN NULL; END $$`)
		require.NoError(t, err)
	}
}

type chaosOut struct {
	Key     string `json:"key"`
	Attempt int    `json:"attempt"`
}

// actions counts what ran outside: per key (an effect, a job) the attempts
// acted on, and whether two ever ran at once.
type actions struct {
	mu       sync.Mutex
	ran      map[string][]grant // key → the attempts acted on
	running  map[string]int
	overlaps []string
}

func newActions() *actions { return &actions{ran: map[string][]grant{}, running: map[string]int{}} }

func (a *actions) start(key string, g grant) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ran[key] = append(a.ran[key], g)
	a.running[key]++
	if a.running[key] > 1 {
		a.overlaps = append(a.overlaps, key)
	}
}

func (a *actions) end(key string) {
	a.mu.Lock()
	a.running[key]--
	a.mu.Unlock()
}

// TestChaosConnectionsDieMidRequest is not parallel: it terminates every
// connection of the service to the package's database, and runs sweeper
// passes, which every other test of the package (paused until the
// sequential tests are done) would feel.
func TestChaosConnectionsDieMidRequest(t *testing.T) {
	logs := &apitest.LockedBuffer{}
	b := setup(t,
		apitest.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))),
		apitest.WithConfig(func(c *config.Config) {
			c.JobLeaseGraceMs = 1000 // a lost claim's lease lapses within the test
			c.DBMaxConns = 4         // a serverless instance's pool
			c.WebhookAllowPrivateNetworks = true
		}))
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	seen := newChaosLog(b.env.Server.Client().Transport)
	sdk := func(key string) *ratchet.Client {
		c, err := ratchet.NewClient(ratchet.Config{BaseURL: b.env.Server.URL, APIKey: key,
			HTTPClient: &http.Client{Transport: seen, Timeout: 20 * time.Second}})
		require.NoError(t, err)
		return c
	}
	// The agent's key and the effect type carry daily ceilings, whose
	// counters each grant charges in its own transaction: a grant applied
	// twice would show there.
	agent := sdk(b.env.Key(b.ws, map[string]any{"name": "agent", "preset": "AGENT",
		"daily_spend_ceiling_micros": 1_000_000_000_000}))
	producer := sdk(b.env.Key(b.ws, map[string]any{"name": "producer", "preset": "INGEST"}))
	b.env.Must(http.StatusOK, "PUT", "/api/v1/policies/chaos.send", b.ws.Key, map[string]any{
		"on_indeterminate": "retry", "lease_seconds": 5, "max_attempts": 50, "daily_budget_micros": 1_000_000_000_000})
	run, err := producer.StartRun(ctx, "chaos", ratchet.WithIdempotencyKey("chaos-run"))
	require.NoError(t, err)
	operator := sdk(b.ws.Key)
	hooks := newReceiver(t)

	// The worker.
	jobs := newActions()
	w := ratchet.NewWorker(sdk(b.workerKey(t, "chaos_job@1")))
	require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[chaosOut, chaosOut]{Name: "chaos_job", Version: "1",
		Handler: func(ctx context.Context, in chaosOut, job ratchet.JobContext) (chaosOut, error) {
			jobs.start(job.JobID, grant{effectID: job.JobID, attempt: job.Attempt})
			defer jobs.end(job.JobID)
			time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
			return chaosOut{Key: in.Key, Attempt: job.Attempt}, nil
		}}))
	workerErrs := &errs{}
	require.NoError(t, w.Start(context.Background(), ratchet.StartOptions{Concurrency: 4,
		PollInterval: 50 * time.Millisecond, WaitSeconds: 1, OnError: workerErrs.add}))
	// A second worker is started mid-chaos (its registration is keyed).
	second := ratchet.NewWorker(sdk(b.workerKey(t, "chaos_job@1")))
	require.NoError(t, ratchet.RegisterTool(second, ratchet.Tool[chaosOut, chaosOut]{Name: "chaos_job", Version: "1",
		Handler: func(ctx context.Context, in chaosOut, job ratchet.JobContext) (chaosOut, error) {
			jobs.start(job.JobID, grant{effectID: job.JobID, attempt: job.Attempt})
			defer jobs.end(job.JobID)
			return chaosOut{Key: in.Key, Attempt: job.Attempt}, nil
		}}))
	var secondStarted atomic.Bool
	workersStopped := false
	stopWorkers := func() {
		if workersStopped {
			return
		}
		workersStopped = true
		sctx, scancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer scancel()
		require.NoError(t, w.Stop(sctx), "every report recorded")
		if secondStarted.Load() {
			require.NoError(t, second.Stop(sctx), "every report recorded")
		}
	}
	defer stopWorkers()

	// The sweeper, through the cron route as Vercel's schedule calls it.
	sweepCtx, stopSweeps := context.WithCancel(ctx)
	var sweeps sync.WaitGroup
	var passes atomic.Int64
	var sweepAnswers sync.Map // status → count
	sweeps.Go(func() {
		for sweepCtx.Err() == nil {
			req, _ := http.NewRequestWithContext(sweepCtx, "POST", b.env.Server.URL+"/api/cron/sweep", nil)
			req.Header.Set("Authorization", "Bearer test-cron-secret")
			if res, err := b.env.Server.Client().Do(req); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				n, _ := sweepAnswers.LoadOrStore(res.StatusCode, new(atomic.Int64))
				n.(*atomic.Int64).Add(1)
			}
			passes.Add(1)
			time.Sleep(100 * time.Millisecond)
		}
	})
	defer func() { stopSweeps(); sweeps.Wait() }()

	// The chaos, on a connection of its own (not named ratchet; its
	// statement in flight when the chaos stops ends it).
	kcfg, err := pgx.ParseConfig(apitest.DatabaseURL(t))
	require.NoError(t, err)
	kcfg.RuntimeParams["application_name"] = "ratchet_chaos"
	kconn, err := pgx.ConnectConfig(ctx, kcfg)
	require.NoError(t, err)
	defer kconn.Close(context.Background())
	k := &killer{conn: kconn}
	calm := endCommits(t, ctx, b.ws.ID)
	chaosCtx, stopChaos := context.WithCancel(ctx)
	var chaos sync.WaitGroup
	chaos.Go(func() { k.run(chaosCtx) })
	defer func() { stopChaos(); chaos.Wait() }()

	// The gate: new keys, each begun once (every seventh acting for two
	// seconds, its lease heartbeated), and every fifth key begun by three
	// callers at once. A call the SDK gave up on is made again (a
	// client's own retry), until the key answers execute (and the action is
	// reported) or duplicate.
	effects := newActions()
	var gaveUp sync.Map // error text → count, for the log
	doEffect := func(key string, slow bool) {
		for ctx.Err() == nil {
			out, err := ratchet.DoEffect(ctx, agent, ratchet.BeginRequest{EffectType: "chaos.send", IdempotencyKey: key,
				Payload: map[string]string{"key": key}, CostMicros: ratchet.Micros(chaosCost)},
				func(actx context.Context, l ratchet.Lease) (chaosOut, error) {
					effects.start(key, grant{effectID: l.EffectID, attempt: l.Attempt})
					defer effects.end(key)
					took := time.Duration(rand.IntN(20)) * time.Millisecond
					if slow {
						took = 2 * time.Second // heartbeated through the chaos
					}
					select {
					case <-time.After(took):
					case <-actx.Done():
						return chaosOut{}, context.Cause(actx) // its lease was lost: it reports nothing
					}
					return chaosOut{Key: key, Attempt: l.Attempt}, nil
				})
			if err == nil {
				if out.Result.Key != key {
					t.Errorf("%s answered the result of %q", key, out.Result.Key)
				}
				return
			}
			call := "DoEffect's begin: "
			if out != nil {
				call = "DoEffect's report: "
			}
			n, _ := gaveUp.LoadOrStore(call+classify(err), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Jobs: steps under stable keys, every third enqueued twice at once.
	enqueue := func(key string) {
		for ctx.Err() == nil {
			_, err := producer.Enqueue(ctx, run.ID, chaosOut{Key: key}, ratchet.EnqueueOptions{
				Name: "chaos_job", Version: "1", IdempotencyKey: key, Timeout: 2 * time.Second, MaxAttempts: 10})
			if err == nil {
				return
			}
			n, _ := gaveUp.LoadOrStore("Enqueue: "+classify(err), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Webhooks under Idempotency-Keys, each created twice at once (the
	// second waits for the first's answer).
	var hookAnswers sync.Map // idempotency key → *sync.Map of webhook ids
	createHook := func(key string) {
		for ctx.Err() == nil {
			h, err := operator.CreateWebhookWithKey(ctx, hooks.url(key), []string{"run.finished"}, key)
			if err == nil {
				ids, _ := hookAnswers.LoadOrStore(key, &sync.Map{})
				ids.(*sync.Map).Store(h.ID, true)
				return
			}
			n, _ := gaveUp.LoadOrStore("CreateWebhook: "+classify(err), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	}
	hookKeys := []string{"chaos-hook-0", "chaos-hook-1", "chaos-hook-2", "chaos-hook-3"}
	var gateKeys, jobKeys []string
	var work sync.WaitGroup
	tasks := make(chan func())
	for _, key := range hookKeys {
		work.Go(func() { createHook(key) })
		work.Go(func() { createHook(key) })
	}
	work.Go(func() {
		// Start registers the worker, asked again through the chaos
		// (and started again, as a process would, if the SDK gave up).
		for ctx.Err() == nil {
			err := second.Start(context.Background(), ratchet.StartOptions{Concurrency: 2,
				PollInterval: 50 * time.Millisecond, OnError: workerErrs.add})
			if err == nil {
				secondStarted.Store(true)
				return
			}
			n, _ := gaveUp.LoadOrStore("Start: "+classify(err), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	})
	work.Go(func() {
		defer close(tasks)
		// New work is handed out for chaosFor; the chaos lasts until it
		// is all done.
		until := time.Now().Add(chaosFor)
		for i := 0; time.Now().Before(until); i++ {
			key := fmt.Sprint("chaos:new:", i)
			gateKeys = append(gateKeys, key)
			tasks <- func() { doEffect(key, i%7 == 3) }
			if i%2 == 0 {
				jk := fmt.Sprint("chaos-job:", i)
				jobKeys = append(jobKeys, jk)
				tasks <- func() { enqueue(jk) }
				if i%3 == 0 {
					tasks <- func() { enqueue(jk) }
				}
			}
			if i%5 == 0 {
				key := fmt.Sprint("chaos:repeated:", i)
				gateKeys = append(gateKeys, key)
				for range 3 {
					tasks <- func() { doEffect(key, false) }
				}
			}
		}
	})
	for range 8 {
		work.Go(func() {
			for task := range tasks {
				task()
			}
		})
	}
	work.Wait()
	require.NoError(t, ctx.Err(), "the workload finished")
	stopChaos()
	chaos.Wait()
	calm()

	// The run completes with chaos stopped: lost claims lapse and are
	// claimed again; the sweeper and the reports settle the run. (Finished
	// now, so that its run.finished event is delivered without chaos: a
	// delivery whose claim or record the chaos ended is sent again only
	// once its claim's hold lapses, a minute later.)
	_, err = producer.FinishRun(ctx, run.ID)
	require.NoError(t, err)
	done := waitRun(t, producer, run.ID, func(r *ratchet.Run) bool { return r.Status != ratchet.RunRunning })
	require.Equal(t, ratchet.RunSucceeded, done.Status)
	// Every subscription is told the run finished: the sweeper delivers.
	for deadline := time.Now().Add(15 * time.Second); hooks.told(hookKeys) < len(hookKeys); time.Sleep(50 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "every webhook told of run.finished: %d of %d", hooks.told(hookKeys),
			len(hookKeys))
	}
	stopWorkers()
	stopSweeps()
	sweeps.Wait()

	// The instance recovered by itself: a fresh request succeeds at once,
	// with no retry.
	fresh, err := ratchet.NewClient(ratchet.Config{BaseURL: b.env.Server.URL,
		APIKey: b.env.Key(b.ws, map[string]any{"name": "fresh", "preset": "AGENT"}), MaxRetries: -1,
		HTTPClient: b.env.Server.Client()})
	require.NoError(t, err)
	begun, err := fresh.Begin(ctx, ratchet.BeginRequest{EffectType: "chaos.after", IdempotencyKey: "chaos:after",
		Payload: map[string]string{"key": "chaos:after"}, CostMicros: ratchet.Micros(0)})
	require.NoError(t, err, "a fresh request after the chaos")
	require.Equal(t, ratchet.DecisionExecute, begun.Decision)
	b.env.Must(http.StatusOK, "GET", "/api/v1/health", "", nil)

	seen.mu.Lock()
	defer seen.mu.Unlock()
	t.Logf("chaos: %d rounds, %d connections terminated, %d sweeper passes; failed answers %v",
		k.rounds.Load(), k.killed.Load(), passes.Load(), seen.failures)
	sweepAnswers.Range(func(k, v any) bool {
		t.Logf("sweeper passes answered %v: %d", k, v.(*atomic.Int64).Load())
		return true
	})
	gaveUp.Range(func(k, v any) bool {
		t.Logf("a call the SDK gave up on (made again): %v ×%d", k, v.(*atomic.Int64).Load())
		return true
	})
	require.Empty(t, seen.internal, "a terminated connection is never a 500")
	require.Positive(t, k.killed.Load())
	failed := 0
	for name, n := range seen.failures {
		if strings.HasPrefix(name, "503 ") {
			failed += n
		}
	}
	require.Positive(t, failed, "the chaos failed requests, which the SDK asked again")
	check := checker(t, ctx)
	var commitsEnded int64
	require.NoError(t, check.db.QueryRow(ctx,
		"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM chaos_commits_ended").Scan(&commitsEnded))
	t.Logf("commits ended at COMMIT: %d", commitsEnded)

	check.gate(b.ws.ID, gateKeys, seen, effects)
	check.jobs(run.ID, jobKeys, seen, jobs)
	check.webhooks(b.ws.ID, hookKeys, &hookAnswers, hooks)
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("logged as an error (an outage is a warning): %s", line)
		}
	}
	workerErrs.mu.Lock()
	t.Logf("worker notices (claims and reports asked again): %d", len(workerErrs.list))
	workerErrs.mu.Unlock()
}

// classify names an error the SDK gave up with, without its ids.
func classify(err error) string {
	var apiErr *ratchet.Error
	if errors.As(err, &apiErr) {
		return fmt.Sprint(apiErr.StatusCode, " ", apiErr.Code, " ", apiErr.Detail["outcome"])
	}
	return regexp.MustCompile(`(eff|job|stp|run)_[A-Za-z0-9]+`).ReplaceAllString(err.Error(), "$1_…")
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

type chaosChecker struct {
	t   *testing.T
	ctx context.Context
	db  *pgx.Conn
}

func checker(t *testing.T, ctx context.Context) *chaosChecker {
	conn, err := pgx.Connect(ctx, apitest.DatabaseURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return &chaosChecker{t: t, ctx: ctx, db: conn}
}

type attemptRow struct {
	effectID, key    string
	state            string
	attempt          int
	outcome          *string
	started, expires time.Time
	reported         *time.Time
}

// gate holds the gate's promises to the record.
func (c *chaosChecker) gate(ws string, keys []string, seen *chaosLog, acted *actions) {
	t := c.t
	rows, err := c.db.Query(c.ctx, `
SELECT e.id, e.idempotency_key, e.state, a.attempt, a.outcome, a.started_at, a.lease_expires_at, a.reported_at
FROM effects e JOIN effect_attempts a ON a.effect_id = e.id
WHERE e.workspace_id = $1 AND e.effect_type = 'chaos.send'
ORDER BY e.idempotency_key, a.attempt`, ws)
	require.NoError(t, err)
	byKey := map[string][]attemptRow{}
	byAttempt := map[grant]attemptRow{}
	for rows.Next() {
		var r attemptRow
		require.NoError(t, rows.Scan(&r.effectID, &r.key, &r.state, &r.attempt, &r.outcome, &r.started, &r.expires,
			&r.reported))
		byKey[r.key] = append(byKey[r.key], r)
		byAttempt[grant{r.effectID, r.attempt}] = r
	}
	require.NoError(t, rows.Err())
	require.Len(t, byKey, len(keys), "one effect per key")

	// Every begin answered execute has its attempt; every report answered
	// 2xx is recorded as reported.
	for token, g := range seen.executes {
		r, ok := byAttempt[g]
		require.True(t, ok, "an execute answer's attempt %+v is recorded", g)
		if outcome, reported := seen.gateReports[token]; reported {
			require.NotNil(t, r.outcome, "%+v", g)
			require.Equal(t, outcome, *r.outcome, "the report answered 2xx is recorded: %+v", g)
		}
	}
	require.Empty(t, acted.overlaps, "an action never ran while another held its key")
	// Every attempt granted was charged once to each daily counter (none
	// was reported failed, which would release its charge).
	var scopes []string
	var micros, count []int64
	srows, err := c.db.Query(c.ctx, `SELECT scope, sum(micros)::bigint, sum(count)::bigint FROM gate_spend
WHERE workspace_id = $1 GROUP BY scope ORDER BY scope`, ws)
	require.NoError(t, err)
	for srows.Next() {
		var scope string
		var m, n int64
		require.NoError(t, srows.Scan(&scope, &m, &n))
		scopes, micros, count = append(scopes, scope), append(micros, m), append(count, n)
	}
	require.NoError(t, srows.Err())
	require.Len(t, scopes, 2, "the key's and the type's counters: %v", scopes)
	for i, scope := range scopes {
		require.EqualValues(t, len(byAttempt), count[i], "%s counts every grant once", scope)
		require.EqualValues(t, chaosCost*len(byAttempt), micros[i], "%s charges every grant once", scope)
	}
	again, lost := 0, 0
	for _, key := range keys {
		attempts := byKey[key]
		require.Equal(t, "succeeded", attempts[0].state, "key %s ends succeeded", key)
		succeeded := 0
		for i, a := range attempts {
			if a.outcome != nil && *a.outcome == "succeeded" {
				succeeded++
				require.Equal(t, len(attempts)-1, i, "no attempt after the success of %s", key)
			} else {
				// Documented: an attempt granted and never reported
				// (its answer lost past the SDK's retries, or its report
				// never answered) lapses, indeterminate; under
				// on_indeterminate retry the next begin executes again.
				require.True(t, a.outcome == nil || *a.outcome == "indeterminate", "%s attempt %d: %v", key, a.attempt,
					a.outcome)
				require.Falsef(t, a.reported != nil, "%s attempt %d was reported", key, a.attempt)
			}
			if i > 0 {
				prev := attempts[i-1]
				require.False(t, a.started.Before(prev.expires),
					"%s: attempt %d began at %s, while attempt %d's lease held until %s", key, a.attempt, a.started,
					prev.attempt, prev.expires)
			}
		}
		require.Equal(t, 1, succeeded, "one success for %s", key)
		// The action ran once per attempt it was told to execute, and
		// more than once only after an attempt whose report never landed.
		ran := acted.ran[key]
		for _, g := range ran {
			_, ok := byAttempt[g]
			require.True(t, ok, "%s ran attempt %+v, which is recorded", key, g)
		}
		if len(attempts) > len(ran) {
			lost += len(attempts) - len(ran)
			t.Logf("gate key %s: %d attempts granted, %d acted on (an execute never reached its caller)", key,
				len(attempts), len(ran))
		}
		if len(ran) > 1 {
			again += len(ran) - 1
			t.Logf("gate key %s acted %d times: attempts %+v (each before the last lapsed unreported)", key, len(ran),
				attempts)
		}
	}
	t.Logf("gate: %d keys, %d execute answers, %d acknowledged reports, %d actions repeated after a lapse, "+
		"%d grants never acted on", len(keys), len(seen.executes), len(seen.gateReports), again, lost)
}

// webhooks holds the keyed creates' and the deliveries' promises: one
// subscription per Idempotency-Key, named by every answer under it; every
// delivery recorded delivered was received, and every subscription was
// told once per event at least (at-least-once: a delivery received whose
// record the chaos ended is sent again, counted).
func (c *chaosChecker) webhooks(ws string, keys []string, answers *sync.Map, got *receiver) {
	t := c.t
	var subscriptions int
	require.NoError(t, c.db.QueryRow(c.ctx, `SELECT count(*) FROM webhooks WHERE workspace_id = $1`, ws).
		Scan(&subscriptions))
	require.Equal(t, len(keys), subscriptions, "one subscription per Idempotency-Key")
	for _, key := range keys {
		ids, ok := answers.Load(key)
		require.True(t, ok, key)
		n := 0
		ids.(*sync.Map).Range(func(any, any) bool { n++; return true })
		require.Equal(t, 1, n, "every answer under %s names one subscription", key)
	}
	rows, err := c.db.Query(c.ctx, `SELECT w.url, d.event_id, d.state FROM webhook_deliveries d
JOIN webhooks w ON w.id = d.webhook_id WHERE d.workspace_id = $1`, ws)
	require.NoError(t, err)
	again := 0
	for rows.Next() {
		var url, event, state string
		require.NoError(t, rows.Scan(&url, &event, &state))
		n := got.count(url, event)
		if state == "delivered" {
			require.Positive(t, n, "a delivery recorded delivered was received: %s %s", url, event)
		}
		if n > 1 {
			again += n - 1
		}
	}
	require.NoError(t, rows.Err())
	t.Logf("webhooks: %d subscriptions, %d deliveries received again", subscriptions, again)
}

// receiver is a webhook receiver that counts deliveries by path and
// Ratchet-Event-Id.
type receiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got map[string]int
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{got: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		r.mu.Lock()
		r.got[req.URL.Path+" "+req.Header.Get("Ratchet-Event-Id")]++
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) url(key string) string { return r.srv.URL + "/hook/" + key }

func (r *receiver) count(url, event string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[strings.TrimPrefix(url, r.srv.URL)+" "+event]
}

// told is how many of keys' subscriptions received a delivery.
func (r *receiver) told(keys []string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, key := range keys {
		for k := range r.got {
			if strings.HasPrefix(k, "/hook/"+key+" ") {
				n++
				break
			}
		}
	}
	return n
}

// jobs holds the durable jobs' promises to the record.
func (c *chaosChecker) jobs(runID string, keys []string, seen *chaosLog, ran *actions) {
	t := c.t
	type job struct {
		id, key, status string
		attempt         int
	}
	rows, err := c.db.Query(c.ctx, `SELECT id, idempotency_key, status, attempt FROM jobs WHERE run_id = $1`, runID)
	require.NoError(t, err)
	jobs := map[string]job{}
	for rows.Next() {
		var j job
		require.NoError(t, rows.Scan(&j.id, &j.key, &j.status, &j.attempt))
		_, dup := jobs[j.key]
		require.False(t, dup, "one job per key: %s", j.key)
		jobs[j.key] = j
	}
	require.NoError(t, rows.Err())
	require.Len(t, jobs, len(keys), "every enqueue answered 2xx has exactly one job, and no other was made")
	for _, key := range keys {
		answers := seen.enqueues[key]
		require.NotEmpty(t, answers, key)
		for _, a := range answers {
			require.Equal(t, jobs[key].id, a.JobID, "every answer for %s names its one job", key)
		}
	}

	type execution struct {
		attempt  int
		outcome  *string
		warning  *string
		reported *time.Time
	}
	erows, err := c.db.Query(c.ctx, `
SELECT x.job_id, x.attempt, x.outcome, x.warning, x.reported_at
FROM job_executions x JOIN jobs j ON j.id = x.job_id WHERE j.run_id = $1 ORDER BY x.job_id, x.attempt`, runID)
	require.NoError(t, err)
	execs := map[string][]execution{}
	for erows.Next() {
		var id string
		var x execution
		require.NoError(t, erows.Scan(&id, &x.attempt, &x.outcome, &x.warning, &x.reported))
		execs[id] = append(execs[id], x)
	}
	require.NoError(t, erows.Err())
	require.Empty(t, ran.overlaps, "a job never ran twice at once")
	again, lostClaims := 0, 0
	for _, key := range keys {
		j := jobs[key]
		require.Equal(t, "SUCCEEDED", j.status, key)
		xs := execs[j.id]
		require.NotEmpty(t, xs)
		succeeded := 0
		for i, x := range xs {
			require.Equal(t, i+1, x.attempt)
			if x.outcome != nil && *x.outcome == "SUCCEEDED" {
				succeeded++
				require.Equal(t, len(xs)-1, i, "no execution after the success of %s", key)
				continue
			}
			// Documented at-least-once: an execution whose lease lapsed
			// (its claim's answer lost past the SDK's retries, or its
			// report never landed) is failed with a warning, and the job
			// is claimed again.
			require.NotNil(t, x.warning, "%s attempt %d failed only by its lapse", key, x.attempt)
		}
		require.Equal(t, 1, succeeded, "one successful execution of %s", key)
		for _, a := range seen.jobReports[j.id] {
			require.Equal(t, "SUCCEEDED", *xs[a-1].outcome, "the report answered 2xx for %s attempt %d is recorded", key, a)
		}
		handled := ran.ran[j.id]
		for _, g := range handled {
			require.LessOrEqual(t, g.attempt, len(xs), "%s ran attempt %d, which is recorded", key, g.attempt)
		}
		if len(handled) > 1 {
			again += len(handled) - 1
			var seen []string
			for _, x := range xs {
				seen = append(seen, fmt.Sprintf("attempt %d: %v, %v", x.attempt, deref(x.outcome), deref(x.warning)))
			}
			t.Logf("job %s ran %d times: each before the last lost its lease (%s)", key, len(handled),
				strings.Join(seen, "; "))
		}
		if len(xs) > len(handled) {
			lostClaims += len(xs) - len(handled)
		}
	}
	t.Logf("jobs: %d keys, %d claims answered, %d reports acknowledged, %d handlers run again after a lapse, "+
		"%d executions whose claim never reached the worker", len(keys), len(seen.claims), len(seen.jobReports), again,
		lostClaims)
}

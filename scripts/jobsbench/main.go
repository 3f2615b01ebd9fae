// Command jobsbench measures the durable job queue against a real Postgres:
// enqueue throughput, claim latency and claim+report throughput with a deep
// queue (bulk-loaded with one INSERT … SELECT generate_series, then
// ANALYZE), and prints the claim's EXPLAIN ANALYZE plan. It calls the
// lib/jobs service directly (no HTTP), in a throwaway database it drops
// afterwards.
//
//	go run ./scripts/jobsbench -depth 10000
//	go run ./scripts/jobsbench -depth 1000000
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/testpg"
)

func main() {
	var (
		admin    = flag.String("url", os.Getenv("DATABASE_URL"), "admin Postgres URL (a database is created in it)")
		depth    = flag.Int("depth", 10_000, "queued jobs before measuring claims")
		enqueueN = flag.Int("enqueue", 5_000, "jobs enqueued through the service for the enqueue measurement")
		workN    = flag.Int("work", 10_000, "jobs claimed and reported for the throughput measurement")
		workers  = flag.Int("workers", 8, "concurrent claimers / producers")
		batch    = flag.Int("batch", 10, "claim limit per request in the throughput measurement")
		latencyN = flag.Int("latency", 1_000, "sequential single-job claims timed for latency")
		mode     = flag.String("mode", "exec", "DB_QUERY_EXEC_MODE: exec (default, pooler-safe) or cache_statement")
	)
	flag.Parse()
	if err := run(*admin, *mode, *depth, *enqueueN, *workN, *workers, *batch, *latencyN); err != nil {
		fmt.Fprintln(os.Stderr, "jobsbench:", redact.ErrorText(err))
		os.Exit(1)
	}
}

func run(admin, mode string, depth, enqueueN, workN, workers, batch, latencyN int) error {
	if admin == "" {
		return fmt.Errorf("set -url or DATABASE_URL")
	}
	ctx := context.Background()
	name := "ratchet_bench_" + ids.Random(4)
	url, err := testpg.CreateDatabase(ctx, admin, name)
	if err != nil {
		return err
	}
	defer func() { _ = testpg.DropDatabase(context.Background(), admin, name) }()
	cfg := &config.Config{
		DatabaseURL: url, ResultEncryptionKey: base64.StdEncoding.EncodeToString(make([]byte, 32)),
		KeyHashSecret: "bench-key-hash-secret-0123456789", SignupMode: "open", BillingMode: "off", Port: 8787,
		DBMaxConns: int32(workers + 2), DBMaxConnIdleTime: time.Minute, DBQueryExecMode: mode,
		DBConnectTimeout: 5 * time.Second, DBStatementTimeout: 10 * time.Minute, JobLeaseGraceMs: 10_000,
		AutoMigrate: true,
	}
	a, err := app.New(ctx, cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	defer a.Close()
	_, key, err := a.Server.Auth.Signup(ctx, "bench")
	if err != nil {
		return err
	}
	p, err := a.Server.Auth.Authenticate(ctx, key.Secret)
	if err != nil {
		return err
	}
	svc := a.Server.Jobs
	run, err := svc.CreateRun(ctx, p.WorkspaceID, jobs.CreateRunRequest{Name: "bench"})
	if err != nil {
		return err
	}
	fmt.Printf("jobsbench: mode=%s depth=%d enqueue=%d work=%d workers=%d batch=%d latency=%d\n",
		mode, depth, enqueueN, workN, workers, batch, latencyN)

	// 1. Enqueue throughput (a tool no worker claims, so it does not
	// disturb the claim measurements).
	var next atomic.Int64
	start := time.Now()
	if err := parallel(workers, func() error {
		for {
			i := next.Add(1)
			if i > int64(enqueueN) {
				return nil
			}
			_, err := svc.Enqueue(ctx, p.WorkspaceID, run.ID, jobs.EnqueueRequest{Name: "enqueue_only", Version: "1",
				Input: json.RawMessage(fmt.Sprintf(`{"customerId":"cus_%d","plan":"pro"}`, i))})
			if err != nil {
				return err
			}
		}
	}); err != nil {
		return err
	}
	el := time.Since(start)
	fmt.Printf("enqueue: %d jobs in %s = %.0f jobs/s (%d producers)\n", enqueueN, el.Round(time.Millisecond),
		float64(enqueueN)/el.Seconds(), workers)

	// 2. Bulk-load the claimed tool's queue.
	tmpl, err := svc.Enqueue(ctx, p.WorkspaceID, run.ID, jobs.EnqueueRequest{Name: "bench_tool", Version: "1",
		Input: json.RawMessage(`{"n":0}`)})
	if err != nil {
		return err
	}
	start = time.Now()
	if _, err := svc.CloneQueued(ctx, tmpl.JobID, "b", depth-1); err != nil {
		return err
	}
	if _, err := a.Pool.Exec(ctx, "ANALYZE"); err != nil {
		return err
	}
	fmt.Printf("load: %d queued jobs bulk-loaded and analysed in %s\n", depth, time.Since(start).Round(time.Millisecond))

	register := func() (string, error) {
		r, err := svc.RegisterWorker(ctx, p, jobs.RegisterRequest{Tools: []jobs.Tool{{Name: "bench_tool", Version: "1"}}})
		return r.WorkerID, err
	}
	wid, err := register()
	if err != nil {
		return err
	}

	// 3. Claim latency: one worker, sequential single-job claims.
	lat := make([]time.Duration, 0, latencyN)
	for range latencyN {
		t0 := time.Now()
		c, err := svc.Claim(ctx, p, wid, jobs.ClaimRequest{Limit: ptr(1)})
		if err != nil {
			return err
		}
		lat = append(lat, time.Since(t0))
		if len(c.Jobs) != 1 {
			return fmt.Errorf("queue ran dry during the latency run")
		}
		if err := report(ctx, svc, p, c.Jobs[0]); err != nil {
			return err
		}
	}
	slices.Sort(lat)
	fmt.Printf("claim latency (limit 1, sequential, %d claims): p50 %s  p95 %s  p99 %s  max %s\n", latencyN,
		pct(lat, 50), pct(lat, 95), pct(lat, 99), lat[len(lat)-1].Round(time.Microsecond))

	// 4. Claim + report throughput: concurrent workers, one report per job,
	// then one batched report per claim.
	single := func(c jobs.ClaimResult) error {
		for _, j := range c.Jobs {
			if err := report(ctx, svc, p, j); err != nil {
				return err
			}
		}
		return nil
	}
	batched := func(c jobs.ClaimResult) error {
		var req jobs.BatchReportRequest
		for _, j := range c.Jobs {
			req.Reports = append(req.Reports, jobs.BatchReportItem{JobID: j.JobID, LeaseToken: j.LeaseToken,
				Status: jobs.StatusSucceeded, Output: json.RawMessage(`{"ok":true}`)})
		}
		res, err := svc.ReportBatch(ctx, p, req)
		if err != nil {
			return err
		}
		for _, r := range res.Results {
			if r.Error != nil {
				return fmt.Errorf("batch report: %s", r.Error.Code)
			}
		}
		return nil
	}
	for _, phase := range []struct {
		label  string
		report func(jobs.ClaimResult) error
	}{{"claim+report (one report per job)", single}, {"claim+batch report (one batched report per claim)", batched}} {
		var done atomic.Int64
		start = time.Now()
		if err := parallel(workers, func() error {
			w, err := register()
			if err != nil {
				return err
			}
			for done.Load() < int64(workN) {
				c, err := svc.Claim(ctx, p, w, jobs.ClaimRequest{Limit: &batch})
				if err != nil || len(c.Jobs) == 0 {
					return err
				}
				if err := phase.report(c); err != nil {
					return err
				}
				done.Add(int64(len(c.Jobs)))
			}
			return nil
		}); err != nil {
			return err
		}
		el = time.Since(start)
		fmt.Printf("%s: %d jobs in %s = %.0f jobs/s (%d workers, claim limit %d)\n", phase.label, done.Load(),
			el.Round(time.Millisecond), float64(done.Load())/el.Seconds(), workers, batch)
	}

	// 5. The claim's plan, with the executions written above analysed too.
	if _, err := a.Pool.Exec(ctx, "ANALYZE"); err != nil {
		return err
	}
	plan, err := svc.ExplainClaim(ctx, p, wid, batch)
	if err != nil {
		return err
	}
	fmt.Println("claim plan (EXPLAIN ANALYZE, rolled back):")
	fmt.Println("  " + strings.ReplaceAll(plan, "\n", "\n  "))
	return nil
}

func report(ctx context.Context, svc *jobs.Service, p *auth.Principal, j jobs.ClaimedJob) error {
	_, err := svc.Report(ctx, p, j.JobID, jobs.ReportRequest{LeaseToken: j.LeaseToken,
		Status: jobs.StatusSucceeded, Output: json.RawMessage(`{"ok":true}`)})
	return err
}

func parallel(n int, f func() error) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func pct(sorted []time.Duration, p int) time.Duration {
	return sorted[(len(sorted)-1)*p/100].Round(time.Microsecond)
}

func ptr[T any](v T) *T { return &v }

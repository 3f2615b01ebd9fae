// Command benchratchet measures Ratchet's side of the benchmark (issue 6) on
// the database it is given and prints one `name value` line per figure, the
// format scripts/bench collects next to River's and pgbench's figures:
//
//	go run ./scripts/benchratchet [-database-url URL] [-quick] [-only PREFIX,...]
//
// It must run from the repository root (it builds functions/local and the
// Lambda binaries). The database is migrated first. Figures that cannot be
// measured yet print a `# TODO name: ...` comment instead of a value, so the
// runner never computes a ratio from a number that was not measured.
//
// Each figure is a function in figures(); the gate, jobs and SDK hooks are in
// gate.go and jobs.go. A figure gets a fresh in-process instance (the real
// app on a loopback HTTP server, as a deployment would serve it) through
// b.instance, and emits its values through b.emit.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/migrations"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "benchratchet:", redact.ErrorText(err))
		os.Exit(1)
	}
}

// scale is how much work each figure does. full is the default run (the
// whole suite within a few minutes on 2 cores), quick a smoke run, and the
// test suite uses its own tiny scale.
type scale struct {
	Clients      int // concurrent HTTP clients for request-rate figures
	Requests     int // requests per request-rate figure
	Jobs         int // pre-queued jobs drained by the SDK worker
	Workers      int // SDK worker concurrency
	InsertJobs   int // jobs enqueued by the insert-and-work figure
	ClaimQueued  []int
	ClaimSamples int // sequential claims timed at each depth
	E2ESamples   int // jobs timed enqueue → handler start
	History      int // completed rows seeded before a figure (then ANALYZE)
	ColdStarts   int // process starts timed for the cold-start figure
	Burst        int // concurrent requests in the connection burst
	IdleWindow   time.Duration
	LambdaBuild  bool // run scripts/build-lambda (needs the repository root)
	ProcessStart bool // time functions/local as a real process (needs the repository root)
}

var (
	fullScale = scale{
		Clients: 16, Requests: 10_000, Jobs: 50_000, Workers: 100, InsertJobs: 10_000,
		ClaimQueued: []int{10_000, 1_000_000}, ClaimSamples: 200, E2ESamples: 40, History: 100_000, ColdStarts: 5, Burst: 64,
		IdleWindow: 10 * time.Minute, LambdaBuild: true, ProcessStart: true,
	}
	quickScale = scale{
		Clients: 8, Requests: 1_000, Jobs: 2_000, Workers: 100, InsertJobs: 500,
		ClaimQueued: []int{1_000, 10_000}, ClaimSamples: 50, E2ESamples: 10, History: 5_000, ColdStarts: 2, Burst: 16,
		IdleWindow: 10 * time.Minute, LambdaBuild: true, ProcessStart: true,
	}
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("benchratchet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres `URL` (default $DATABASE_URL); migrated, then measured")
	quick := fs.Bool("quick", false, "smoke-run scale")
	only := fs.String("only", "", "comma-separated figure name `prefixes` to run (default all)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (server and clients) to `file`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *dbURL == "" {
		return errors.New("-database-url or DATABASE_URL is required")
	}
	sc := fullScale
	if *quick {
		sc = quickScale
	}
	cfg, err := benchConfig(*dbURL)
	if err != nil {
		return err
	}
	if _, err := db.MigrateURL(ctx, *dbURL, migrations.FS); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	b := &bench{scale: sc, cfg: cfg, out: stdout, log: stderr}
	fmt.Fprintf(stdout, "# ratchet clients=%d requests=%d jobs=%d workers=%d insert_jobs=%d history=%d default_db_max_conns=%d query_exec_mode=%s\n",
		sc.Clients, sc.Requests, sc.Jobs, sc.Workers, sc.InsertJobs, sc.History, cfg.DBMaxConns, cfg.DBQueryExecMode)
	var prefixes []string
	if *only != "" {
		prefixes = strings.Split(*only, ",")
	}
	return b.runFigures(ctx, prefixes)
}

// benchConfig is the product's default configuration (config.Load with the
// defaults of every optional setting) over dbURL, with throwaway secrets for
// the required ones that the environment does not set.
func benchConfig(dbURL string) (*config.Config, error) {
	set := func(name, value string) {
		if os.Getenv(name) == "" {
			os.Setenv(name, value)
		}
	}
	os.Setenv("DATABASE_URL", dbURL)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	set("RESULT_ENCRYPTION_KEY", base64.StdEncoding.EncodeToString(key))
	set("KEY_HASH_SECRET", "bench-key-hash-secret-"+base64.RawURLEncoding.EncodeToString(key[:12]))
	cfg, err := config.Load()
	if err != nil {
		return nil, err
	}
	// The sweeper is not part of any figure; the local server's ticker
	// would otherwise add its own load.
	cfg.SweepInterval = time.Hour
	return cfg, nil
}

// figure is one measurement; run emits zero or more values through b.emit.
type figure struct {
	name string // prefix of every value it emits, e.g. "ratchet.serverless.cold_start"
	run  func(context.Context, *bench) error
}

// figures lists every figure in the order they run. The TODO hooks (gate.go,
// jobs.go) emit `# TODO` comments until they are filled in.
func figures() []figure {
	return []figure{
		{"ratchet.gate.cycles", gateCycles},
		{"ratchet.gate.duplicate_begins", gateDuplicateBegins},
		{"ratchet.jobs.enqueue", jobsEnqueue},
		{"ratchet.jobs.work", jobsWork},
		{"ratchet.jobs.insert_and_work", jobsInsertAndWork},
		{"ratchet.jobs.claim", jobsClaimLatency},
		{"ratchet.jobs.e2e", jobsEndToEnd},
		{"ratchet.jobs.e2e_cross_instance", jobsEndToEndAcrossInstances},
		{"ratchet.jobs.reclaim", jobsReclaim},
		{"ratchet.serverless.cold_start", coldStart},
		{"ratchet.serverless.lambda", lambdaSize},
		{"ratchet.serverless.idle_claims", idleClaims},
		{"ratchet.serverless.db_conns", dbConns},
	}
}

// bench carries what every figure needs.
type bench struct {
	scale scale
	cfg   *config.Config
	out   io.Writer
	log   io.Writer
}

// runFigures runs every selected figure. A figure that fails is reported
// (a `# FAILED` comment, and the returned error) without stopping the
// others, so one broken figure does not cost a round all of its figures.
func (b *bench) runFigures(ctx context.Context, prefixes []string) error {
	var errs []error
	for _, f := range figures() {
		if !selected(f.name, prefixes) {
			continue
		}
		if ctx.Err() != nil {
			return errors.Join(append(errs, ctx.Err())...)
		}
		fmt.Fprintf(b.log, "benchratchet: %s\n", f.name)
		if err := f.run(ctx, b); err != nil {
			err = fmt.Errorf("%s: %w", f.name, err)
			fmt.Fprintf(b.out, "# FAILED %s\n", strings.ReplaceAll(redact.ErrorText(err), "\n", " "))
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func selected(name string, prefixes []string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if p = strings.TrimSpace(p); p != "" && strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// emit prints one figure line. Rates and counts are whole numbers;
// milliseconds keep two decimals.
func (b *bench) emit(name string, v float64) {
	if v >= 100 || v == float64(int64(v)) {
		fmt.Fprintf(b.out, "%s %.0f\n", name, v)
		return
	}
	fmt.Fprintf(b.out, "%s %.2f\n", name, v)
}

// todo marks a figure that is not measured yet: a comment, never a value.
func (b *bench) todo(name, why string) {
	fmt.Fprintf(b.out, "# TODO %s: %s\n", name, why)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

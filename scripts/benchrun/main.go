// Command benchrun is the benchmark runner behind scripts/bench (issue 6):
// on one fresh PostgreSQL cluster it runs R rounds of three suites, each in a
// fresh database, and writes every figure per round, the medians and the
// ratios to bench/results/latest.txt (plus a dated copy):
//
//	river    bench/river (its own Go module: River never enters the product's)
//	pgbench  scripts/bench-pgbench (single INSERT, one-job and 100-job claim+complete)
//	ratchet  scripts/benchratchet (the gate, jobs, SDK and serverless figures)
//
// The suites take turns going first from round to round, so no side always
// runs on a warmer or a more tired server. Ratios are only ever taken within
// one round.
//
// By default the cluster is started from the local PostgreSQL binaries with
// PostgreSQL's default settings (fsync and synchronous_commit on, as on a real
// server) in a temporary directory removed at the end. -fast uses the test
// suite's throwaway settings instead (durability off: far higher write
// figures that no production server shows); -database-url measures on a
// server you run (fresh databases are created and dropped in it).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/testpg"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", redact.ErrorText(err))
		os.Exit(1)
	}
}

type options struct {
	rounds      int
	quick       bool
	fast        bool
	databaseURL string
	suites      []string
	out         string
	note        string
	args        []string
}

func run(ctx context.Context, args []string) error {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	defRounds := 3
	if v, err := strconv.Atoi(os.Getenv("BENCH_ROUNDS")); err == nil && v > 0 {
		defRounds = v
	}
	fs.IntVar(&o.rounds, "rounds", defRounds, "rounds (default $BENCH_ROUNDS or 3; 1 with -quick)")
	fs.BoolVar(&o.quick, "quick", false, "smoke run: tiny scale, one round unless -rounds is given")
	fs.BoolVar(&o.fast, "fast", false, "throwaway cluster with durability off (fsync, synchronous_commit): not comparable to a real server")
	fs.StringVar(&o.databaseURL, "database-url", os.Getenv("BENCH_DATABASE_URL"), "measure on this server instead of a fresh cluster (default $BENCH_DATABASE_URL); must allow CREATE DATABASE")
	suites := fs.String("suites", "river,pgbench,ratchet", "comma-separated suites to run")
	fs.StringVar(&o.out, "out", "", "results file (default bench/results/latest.txt with a dated copy beside it; bench/results/quick.txt, no copy, with -quick)")
	fs.StringVar(&o.note, "note", os.Getenv("BENCH_NOTE"), "free text recorded in the results (e.g. \"machine shared with 3 other builds\")")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	o.args = args
	roundsSet := false
	fs.Visit(func(f *flag.Flag) { roundsSet = roundsSet || f.Name == "rounds" })
	if o.quick && !roundsSet {
		o.rounds = 1
	}
	dated := o.out == "" && !o.quick // a smoke run never replaces the real results
	if o.out == "" {
		o.out = "bench/results/latest.txt"
		if o.quick {
			o.out = "bench/results/quick.txt"
		}
	}
	if o.rounds < 1 {
		return errors.New("-rounds must be at least 1")
	}
	for _, s := range strings.Split(*suites, ",") {
		s = strings.TrimSpace(s)
		if _, ok := suiteCommands[s]; !ok {
			return fmt.Errorf("unknown suite %q (river, pgbench, ratchet)", s)
		}
		o.suites = append(o.suites, s)
	}

	root, err := repoRoot()
	if err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	logf("building the suites")
	if err := buildSuites(ctx, o.suites); err != nil {
		return err
	}

	adminURL, clusterKind, closeCluster, err := provision(ctx, o)
	if err != nil {
		return err
	}
	defer closeCluster()

	env, err := describeEnvironment(ctx, adminURL, clusterKind, o)
	if err != nil {
		return err
	}
	started := time.Now()
	var outs []output
	var failed []string
	for round := 1; round <= o.rounds; round++ {
		// Rotate which suite goes first.
		order := append(append([]string{}, o.suites[(round-1)%len(o.suites):]...), o.suites[:(round-1)%len(o.suites)]...)
		for _, s := range order {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			out := runSuite(ctx, adminURL, s, round, o.quick)
			if out.Err != nil {
				failed = append(failed, fmt.Sprintf("round %d %s: %s", round, s, redact.ErrorText(out.Err)))
				logf("round %d %s FAILED: %s", round, s, redact.ErrorText(out.Err))
			}
			outs = append(outs, out)
		}
	}
	env = append(env, fmt.Sprintf("duration: %s; load average at the end: %s", time.Since(started).Round(time.Second), loadavg()))

	var report bytes.Buffer
	writeReport(&report, env, o.rounds, outs, failed)
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	paths := []string{o.out}
	if dated {
		paths = append(paths, filepath.Join(filepath.Dir(o.out), started.UTC().Format("20060102T150405Z")+".txt"))
	}
	for _, p := range paths {
		if err := os.WriteFile(p, report.Bytes(), 0o644); err != nil {
			return err
		}
	}
	os.Stdout.Write(report.Bytes())
	logf("wrote %s", strings.Join(paths, " and "))
	if len(failed) > 0 {
		return fmt.Errorf("%d suite run(s) failed", len(failed))
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// suiteCommands builds each suite's command line (run from the repository
// root, with DATABASE_URL set to the suite's fresh database).
var suiteCommands = map[string]func(dbURL string, quick bool) []string{
	"river": func(dbURL string, quick bool) []string {
		args := []string{"bin/bench/river", "-database-url", dbURL}
		if quick {
			args = append(args, "-jobs", "2000", "-insert-jobs", "500", "-history", "5000")
		}
		return args
	},
	"pgbench": func(dbURL string, quick bool) []string {
		args := []string{"scripts/bench-pgbench", "-database-url", dbURL}
		if quick {
			args = append(args, "-quick")
		}
		return args
	},
	"ratchet": func(dbURL string, quick bool) []string {
		args := []string{"bin/bench/benchratchet", "-database-url", dbURL}
		if quick {
			args = append(args, "-quick")
		}
		return args
	},
}

// buildSuites compiles the Go suites before anything is timed, so no round
// pays for a compiler running beside it.
func buildSuites(ctx context.Context, suites []string) error {
	for _, s := range suites {
		var cmd *exec.Cmd
		switch s {
		case "river":
			abs, _ := filepath.Abs("bin/bench/river")
			cmd = exec.CommandContext(ctx, "go", "build", "-o", abs, ".")
			cmd.Dir = "bench/river"
		case "ratchet":
			cmd = exec.CommandContext(ctx, "go", "build", "-o", "bin/bench/benchratchet", "./scripts/benchratchet")
		default:
			continue
		}
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build %s suite: %w", s, err)
		}
	}
	return nil
}

// provision returns an admin URL on which databases can be created.
func provision(ctx context.Context, o options) (adminURL, kind string, closeFn func(), err error) {
	if o.databaseURL != "" {
		return o.databaseURL, "the server at -database-url (its own settings)", func() {}, nil
	}
	// testpg takes $DATABASE_URL first; the benchmark must not land on a
	// shared server by accident, so only -database-url selects one.
	os.Unsetenv("DATABASE_URL")
	opts := testpg.Options{Logf: func(f string, a ...any) { logf(f, a...) }}
	var dir string
	kind = "fresh local cluster, throwaway settings (fsync=off, synchronous_commit=off, full_page_writes=off): NOT comparable to a real server"
	if !o.fast {
		dir, err = os.MkdirTemp("", "ratchet-bench-")
		if err != nil {
			return "", "", nil, err
		}
		// PostgreSQL runs as the postgres user when we are root; it must
		// be able to reach its data directory inside ours.
		_ = os.Chmod(dir, 0o755)
		opts.DataDir = filepath.Join(dir, "pg")
		kind = "fresh local cluster, PostgreSQL default settings"
	}
	cluster, err := testpg.Provision(ctx, opts)
	if err != nil {
		if dir != "" {
			os.RemoveAll(dir)
		}
		return "", "", nil, err
	}
	return cluster.URL, kind, func() {
		if err := cluster.Close(); err != nil {
			logf("stop cluster: %s", redact.ErrorText(err))
		}
		if dir != "" {
			os.RemoveAll(dir)
		}
	}, nil
}

// runSuite runs one suite in a database of its own, dropped afterwards.
func runSuite(ctx context.Context, adminURL, suite string, round int, quick bool) output {
	out := output{Suite: suite, Round: round}
	name := fmt.Sprintf("bench_%s_r%d_%d", suite, round, time.Now().Unix())
	dbURL, err := testpg.CreateDatabase(ctx, adminURL, name)
	if err != nil {
		out.Err = err
		return out
	}
	defer func() {
		if err := testpg.DropDatabase(context.Background(), adminURL, name); err != nil {
			logf("drop %s: %s", name, redact.ErrorText(err))
		}
	}()
	load := loadavg()
	logf("round %d: %s (load average %s)", round, suite, load)
	out.Comments = append(out.Comments, "# load average before: "+load)

	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	argv := suiteCommands[suite](dbURL, quick)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL) // the last value of a key wins
	var stdout bytes.Buffer
	cmd.Stdout = io.MultiWriter(&stdout, prefixWriter{os.Stderr, "  " + suite + "| "})
	cmd.Stderr = prefixWriter{os.Stderr, "  " + suite + "| "}
	cmd.WaitDelay = 30 * time.Second
	runErr := cmd.Run()
	values, comments, parseErr := parseOutput(&stdout)
	out.Values, out.Comments = values, append(out.Comments, comments...)
	out.Err = errors.Join(runErr, parseErr)
	return out
}

// prefixWriter labels a suite's output on the runner's stderr.
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	s := strings.TrimRight(string(b), "\n")
	for _, line := range strings.Split(s, "\n") {
		fmt.Fprintln(p.w, p.prefix+line)
	}
	return len(b), nil
}

func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// describeEnvironment records what a reader needs to judge the figures:
// machine, versions, server settings, and the command.
func describeEnvironment(ctx context.Context, adminURL, clusterKind string, o options) ([]string, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	var version string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil {
		return nil, err
	}
	var settings []string
	for _, s := range []string{"fsync", "synchronous_commit", "full_page_writes", "shared_buffers", "max_connections", "work_mem"} {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v); err != nil {
			return nil, err
		}
		settings = append(settings, s+"="+v)
	}
	commit := strings.TrimSpace(commandOutput("git", "rev-parse", "--short", "HEAD"))
	if strings.TrimSpace(commandOutput("git", "status", "--porcelain")) != "" {
		commit += " (with uncommitted changes)"
	}
	env := []string{
		"date: " + time.Now().UTC().Format(time.RFC3339),
		"command: " + shellQuote(append([]string{"scripts/bench"}, o.args...)),
		fmt.Sprintf("rounds: %d; suites: %s; scale: %s", o.rounds, strings.Join(o.suites, ","), map[bool]string{true: "quick (smoke run, not for publishing)", false: "default"}[o.quick]),
		"commit: " + commit,
		fmt.Sprintf("machine: %d CPUs (nproc), %s; %s", runtime.NumCPU(), memTotal(), strings.TrimSpace(commandOutput("uname", "-srm"))),
		"load average at the start: " + loadavg(),
		"go: " + runtime.Version(),
		"postgres: " + version,
		"cluster: " + clusterKind + "; " + strings.Join(settings, " "),
		"pgbench: " + strings.TrimSpace(commandOutput("bash", "-c", "pgbench --version 2>/dev/null || ls /usr/lib/postgresql/*/bin/pgbench")),
	}
	if o.note != "" {
		env = append(env, "note: "+o.note)
	}
	return env, nil
}

// shellQuote renders argv so it can be pasted back into a shell.
func shellQuote(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r == '-' || r == '_' || r == '.' || r == '/' || r == ',' || r == ':' || r == '=' ||
				(r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'))
		}) < 0 {
			out[i] = a
		} else {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}

func memTotal() string {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "memory unknown"
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return fmt.Sprintf("%.1f GiB memory", kb/1024/1024)
		}
	}
	return "memory unknown"
}

func commandOutput(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "unknown"
	}
	return string(out)
}

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run inside the ratchet repository")
	}
	return filepath.Dir(mod), nil
}

// writeReport writes the results file: environment, Markdown tables, what is
// not measured, failures, and every suite's raw comment lines.
func writeReport(w io.Writer, env []string, rounds int, outs []output, failed []string) {
	fmt.Fprintln(w, "# Ratchet benchmark results")
	fmt.Fprintln(w)
	for _, e := range env {
		fmt.Fprintln(w, "- "+e)
	}
	fmt.Fprintln(w)
	newTable(rounds, outs).writeTables(w)

	seen := map[string]bool{}
	var todos []string
	for _, o := range outs {
		for _, c := range o.Comments {
			if strings.HasPrefix(c, "# TODO ") && !seen[c] {
				seen[c] = true
				todos = append(todos, strings.TrimPrefix(c, "# TODO "))
			}
		}
	}
	if len(todos) > 0 {
		fmt.Fprint(w, "\n### Not measured yet\n\n")
		for _, t := range todos {
			fmt.Fprintln(w, "- "+t)
		}
	}
	if len(failed) > 0 {
		fmt.Fprint(w, "\n### FAILED\n\n")
		for _, f := range failed {
			fmt.Fprintln(w, "- "+f)
		}
	}
	fmt.Fprint(w, "\n### Suite configuration and notes, per round\n\n```\n")
	for _, o := range outs {
		for _, c := range o.Comments {
			if !strings.HasPrefix(c, "# TODO ") {
				fmt.Fprintf(w, "round %d %-8s %s\n", o.Round, o.Suite, c)
			}
		}
	}
	fmt.Fprintln(w, "```")
}

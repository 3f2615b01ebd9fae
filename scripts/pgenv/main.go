// Command pgenv runs a command with DATABASE_URL pointing at a real
// PostgreSQL server provisioned by lib/testpg:
//
//	go run ./scripts/pgenv [-data DIR] -- CMD ARGS...
//
// The server comes from $DATABASE_URL if already set, otherwise from local
// PostgreSQL binaries, otherwise from Docker (see package testpg). Without
// -data the cluster is thrown away when CMD exits; with -data it is kept in
// DIR (created with initdb on first use) and only the server is stopped,
// which is what scripts/dev uses for local development.
//
// CMD inherits stdin, stdout and stderr. SIGINT and SIGTERM are forwarded to
// it, so the cluster outlives CMD's own shutdown and is torn down afterwards.
// pgenv exits with CMD's exit status (128+N if CMD died of signal N). Note
// that `go run` itself reports any non-zero status as 1; scripts/test and
// scripts/dev therefore build pgenv and exec the binary.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/testpg"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pgenv: "+format+"\n", args...)
}

func run(args []string) int {
	fs := flag.NewFlagSet("pgenv", flag.ContinueOnError)
	dataDir := fs.String("data", "", "keep the cluster in `DIR` (initdb on first use) instead of a throwaway one")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: pgenv [-data DIR] -- CMD [ARGS...]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	cmdArgs := fs.Args()

	// Signals cancel provisioning until the child runs, then go to the
	// child. pgenv itself never dies of them, so teardown always happens.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var (
		mu       sync.Mutex
		child    *os.Process
		received os.Signal
	)
	go func() {
		for s := range sigs {
			mu.Lock()
			if child != nil {
				_ = child.Signal(s)
			} else {
				received = s
				cancel()
			}
			mu.Unlock()
		}
	}()

	cluster, err := testpg.Provision(ctx, testpg.Options{DataDir: *dataDir, Logf: func(format string, args ...any) {
		logf("%s", strings.TrimPrefix(fmt.Sprintf(format, args...), "testpg: "))
	}})
	if err != nil {
		logf("%s", redact.ErrorText(err))
		mu.Lock()
		defer mu.Unlock()
		if received != nil {
			return signalCode(received)
		}
		return 1
	}
	teardown := func() {
		if err := cluster.Close(); err != nil {
			logf("teardown: %s", redact.ErrorText(err))
		}
	}

	cmd := exec.Command(cmdArgs[0], cmdArgs[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(withoutVar(os.Environ(), "DATABASE_URL"), "DATABASE_URL="+cluster.URL)

	mu.Lock()
	if ctx.Err() != nil { // interrupted while provisioning
		mu.Unlock()
		teardown()
		return signalCode(received)
	}
	err = cmd.Start()
	if err == nil {
		child = cmd.Process
	}
	mu.Unlock()
	if err != nil {
		logf("%s", redact.ErrorText(err))
		teardown()
		return 127
	}

	_ = cmd.Wait()
	code := exitCode(cmd.ProcessState)
	teardown()
	return code
}

// exitCode maps the child's status to ours, using the shell convention
// 128+N for death by signal N.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// signalCode is the exit status for a run interrupted by s.
func signalCode(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 1
}

func withoutVar(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

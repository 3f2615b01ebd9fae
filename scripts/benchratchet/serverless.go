package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// coldStart times process start → first successful database-touching answer
// (GET /api/v1/health runs SELECT 1 and answers 200 only when Postgres
// does). The process is functions/local, built once beforehand and started
// ColdStarts times after one untimed start (which pays for the page cache);
// the figure is the median. functions/local also checks migrations at start
// (one advisory-locked read of the record table), which a Lambda instance
// does not, so the figure errs on the slow side.
//
// The in-process figure is the part a warm runtime pays on a new instance:
// app.New (config, pool, services, route table) and the first answer.
func coldStart(ctx context.Context, b *bench) error {
	var inproc []time.Duration
	for range max(b.scale.ColdStarts, 1) {
		d, err := b.coldStartInProcess(ctx)
		if err != nil {
			return err
		}
		inproc = append(inproc, d)
	}
	b.emit("ratchet.serverless.cold_start_inprocess_ms", ms(percentile(inproc, 50)))

	if !b.scale.ProcessStart {
		return nil
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "benchratchet-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "local")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./functions/local")
	build.Dir, build.Stdout, build.Stderr = root, b.log, b.log
	if err := build.Run(); err != nil {
		return fmt.Errorf("build functions/local: %w", err)
	}
	var starts []time.Duration
	for i := 0; i <= b.scale.ColdStarts; i++ {
		d, err := b.coldStartProcess(ctx, bin)
		if err != nil {
			return err
		}
		if i > 0 {
			starts = append(starts, d)
		}
	}
	b.emit("ratchet.serverless.cold_start_ms", ms(percentile(starts, 50)))
	return nil
}

func (b *bench) coldStartInProcess(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	in, err := b.instance(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	if err := in.Expect(ctx, http.StatusOK, "GET", "/api/v1/health", "", nil, nil); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func (b *bench) coldStartProcess(ctx context.Context, bin string) (time.Duration, error) {
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "PORT="+strconv.Itoa(port), "SWEEP_INTERVAL=1h")
	cmd.Stdout, cmd.Stderr = nil, nil // its log is not part of the figure
	health := fmt.Sprintf("http://127.0.0.1:%d/api/v1/health", port)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	deadline := time.After(30 * time.Second)
	for {
		res, err := client.Get(health)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return time.Since(start), nil
			}
		}
		select {
		case err := <-exited:
			return 0, fmt.Errorf("functions/local exited before answering: %v", err)
		case <-deadline:
			return 0, errors.New("functions/local did not answer health within 30 s")
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// repoRoot finds the main module's directory from the working directory up.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		raw, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(raw), "module github.com/getratchet/ratchet\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from inside the ratchet repository (needs go.mod of github.com/getratchet/ratchet)")
		}
		dir = parent
	}
}

// lambdaSize builds the Lambda binaries exactly as a deploy does
// (scripts/build-lambda, arm64, stripped) and reports the API function's
// size in bytes.
func lambdaSize(ctx context.Context, b *bench) error {
	if !b.scale.LambdaBuild {
		return nil
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "build-lambda"), "arm64")
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, b.log, b.log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("scripts/build-lambda: %w", err)
	}
	fi, err := os.Stat(filepath.Join(root, "bin", "lambda", "api", "bootstrap"))
	if err != nil {
		return err
	}
	b.emit("ratchet.serverless.lambda_api_bytes", float64(fi.Size()))
	return nil
}

// dbConns reports the pool's configured maximum (DB_MAX_CONNS at its
// default) and the most connections Postgres saw from one instance while
// Burst clients hammered it with authenticated, database-touching requests.
// The count comes from pg_stat_activity (application_name=ratchet in this
// database), sampled every 2 ms from a separate connection, so it is what
// the server holds, not what the pool believes.
func dbConns(ctx context.Context, b *bench) error {
	in, err := b.instance(ctx, nil)
	if err != nil {
		return err
	}
	defer in.Close()
	_, operator, err := in.Signup(ctx)
	if err != nil {
		return err
	}
	b.emit("ratchet.serverless.db_conns_max", float64(in.App.Pool.Config().MaxConns))

	sampler, err := pgx.Connect(ctx, b.cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer sampler.Close(context.Background())
	var (
		peak atomic.Int64
		stop = make(chan struct{})
		wg   sync.WaitGroup
	)
	wg.Go(func() {
		for {
			var n int64
			err := sampler.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'ratchet'`).Scan(&n)
			if err == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	})
	paths := []string{"/api/v1/health", "/api/v1/keys"}
	_, err = load(ctx, b.scale.Burst, b.scale.Burst*20, func(ctx context.Context, i int) error {
		return in.Expect(ctx, http.StatusOK, "GET", paths[i%2], operator, nil, nil)
	})
	close(stop)
	wg.Wait()
	if err != nil {
		return err
	}
	b.emit("ratchet.serverless.db_conns_burst", float64(peak.Load()))
	return nil
}

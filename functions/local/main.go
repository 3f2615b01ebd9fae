// Command local serves every route and runs the sweeper on a ticker, with
// migrations applied at start: the whole service on one port for
// development (scripts/dev starts a Postgres for it when DATABASE_URL is unset).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// The first signal drains (up to 25 s); the second one, with the
		// default behaviour restored, ends the process at once.
		<-ctx.Done()
		stop()
		fmt.Fprintln(os.Stderr, "ratchet: shutting down; interrupt again to quit now")
	}()
	if err := run(ctx, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run starts the server and blocks until ctx ends. ready, when set, receives
// the listening address (tests use it).
func run(ctx context.Context, logOut io.Writer, ready chan<- string) error {
	cfg, err := config.Load()
	if err != nil {
		return err
	}
	cfg.AutoMigrate = true // the local server always brings its schema up to date
	cfg.SizeForServer()    // one process serves every concurrent request
	logger := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if os.Getenv("LOG_REQUESTS") != "" {
		logger = slog.New(slog.NewTextHandler(logOut, nil))
	}
	a, err := app.New(ctx, cfg, app.Options{Logger: logger})
	if err != nil {
		return err
	}
	defer a.Close()

	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", cfg.Port))
	if err != nil {
		return fmt.Errorf("listen on PORT %d: %w", cfg.Port, err)
	}
	srv := &http.Server{Handler: a.Server, ReadHeaderTimeout: 10 * time.Second}
	// The sweeper (and the webhook sends it runs detached) stops before the
	// pool closes: the deferred a.Close runs after this.
	sweepCtx, stopSweeping := context.WithCancel(ctx)
	swept := make(chan struct{})
	go func() {
		a.Sweeper.Loop(sweepCtx, cfg.SweepInterval)
		close(swept)
	}()
	defer func() {
		stopSweeping()
		<-swept
	}()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	fmt.Fprintf(logOut, "ratchet: listening on http://localhost:%d (sweeping every %s)\n", ln.Addr().(*net.TCPAddr).Port, cfg.SweepInterval)
	if ready != nil {
		ready <- ln.Addr().String()
	}
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	// Serve returns as soon as Shutdown begins; the requests in flight get
	// their grace before the sweeper stops and the pool closes (review: a
	// long-polling claim answered 500 "closed pool").
	<-drained
	return nil
}

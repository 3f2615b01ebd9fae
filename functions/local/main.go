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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/redact"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// The first signal drains (up to 25 s); the second one, with the
		// default behaviour restored, ends the process at once. One Ctrl-C
		// arrives twice under scripts/dev: the terminal signals the whole
		// foreground process group, and pgenv, in it too, forwards what it
		// gets (QA: the copy ended the process, cutting the requests in
		// flight). Signals within sameInterrupt of the first are that one,
		// still caught (and ignored) until stop restores the default.
		<-ctx.Done()
		fmt.Fprintln(os.Stderr, "ratchet: shutting down; interrupt again to quit now")
		time.Sleep(sameInterrupt)
		stop()
	}()
	if err := run(ctx, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, redact.ErrorText(err))
		os.Exit(1)
	}
}

// sameInterrupt is how long after the first interrupt another counts as
// the same one, delivered twice (see main); a person's second Ctrl-C comes
// later.
const sameInterrupt = 500 * time.Millisecond

// run starts the server and blocks until ctx ends. ready, when set, receives
// the listening address (tests use it).
func run(ctx context.Context, logOut io.Writer, ready chan<- string) error {
	cfg, err := config.Load()
	if err != nil {
		return err
	}
	profilesAt, profilesOffLoopback, err := pprofAddr() // RATCHET_PPROF_ADDR; off by default
	if err != nil {
		return err
	}
	cfg.AutoMigrate = true // the local server always brings its schema up to date
	cfg.SizeForServer()    // one process serves every concurrent request
	logger := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if os.Getenv("LOG_REQUESTS") != "" {
		logger = slog.New(slog.NewTextHandler(logOut, nil))
	}
	a, err := whenReachable(ctx, logger, startWait, func() (*app.App, error) {
		return app.New(ctx, cfg, app.Options{Logger: logger})
	})
	if err != nil {
		return err
	}
	defer a.Close()

	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.BindAddress, strconv.Itoa(cfg.Port)))
	if err != nil {
		return fmt.Errorf("listen on BIND_ADDRESS %q PORT %d: %w", cfg.BindAddress, cfg.Port, err)
	}
	// Reading a request is bounded whole: each route cuts its body at its
	// own time (lib/httpapi), and ReadTimeout is the backstop for the MCP
	// endpoint, which reads its own (security QA: a body held back kept its
	// connection and goroutine indefinitely). net/http lifts it once the
	// body is read, so a long poll's answer is not cut.
	srv := &http.Server{Handler: a.Server, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute,
		IdleTimeout: 2 * time.Minute}
	stopProfiles, err := servePprof(logOut, profilesAt, profilesOffLoopback)
	if err != nil {
		ln.Close()
		return err
	}
	defer stopProfiles()
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
	fmt.Fprintf(logOut, "ratchet: listening on %s (sweeping every %s)\n", listeningOn(ln.Addr().(*net.TCPAddr)), cfg.SweepInterval)
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

// listeningOn says where the server can be reached: localhost when it
// listens on a loopback address, every interface when on the unspecified
// one.
func listeningOn(addr *net.TCPAddr) string {
	port := strconv.Itoa(addr.Port)
	switch {
	case addr.IP.IsLoopback():
		return "http://" + net.JoinHostPort("localhost", port)
	case addr.IP.IsUnspecified():
		return "http://" + net.JoinHostPort("localhost", port) + " and every other interface"
	}
	return "http://" + net.JoinHostPort(addr.IP.String(), port)
}

// startWait is how long the server waits at start for a database it cannot
// reach (a container started beside its database, a restart during an
// outage) before it gives up.
const startWait = time.Minute

// whenReachable calls start until it succeeds, fails for another reason
// than an unreachable database, wait passes or ctx ends (its error then
// wraps both ctx's cause and the last try's), pausing between tries from
// 250 ms doubling to 5 s (crash QA: a server restarted while the database
// was away exited at once and stayed down).
func whenReachable[T any](ctx context.Context, logger *slog.Logger, wait time.Duration, start func() (T, error)) (T, error) {
	deadline := time.Now().Add(wait)
	for pause := 250 * time.Millisecond; ; pause = min(2*pause, 5*time.Second) {
		v, err := start()
		if err == nil || !unreachable(err) || time.Now().Add(pause).After(deadline) {
			return v, err
		}
		logger.Warn("database unreachable; trying again", "in", pause.String())
		select {
		case <-ctx.Done():
			// Both halves: the stop is why it gave up, the last try why it
			// had not started (an interrupt's cause names its signal).
			return v, fmt.Errorf("stopped waiting for the database: %w (last try: %w)", context.Cause(ctx), err)
		case <-time.After(pause):
		}
	}
}

// unreachable is true of a start that failed for want of the database, not
// because it refused us (a wrong password, a database that does not exist:
// waiting would not help).
func unreachable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "28") || strings.HasPrefix(pe.Code, "3D")) {
		return false
	}
	return db.IsUnavailable(err)
}

// Package app wires one instance of the service: configuration, the pool,
// the domain services, the HTTP server and the sweeper. Every entry point
// (Vercel files, Lambda, the local server, tests) builds the same App.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/reseal"
	"github.com/getratchet/ratchet/lib/sweep"
	"github.com/getratchet/ratchet/migrations"
)

// App is one wired instance.
type App struct {
	Config  *config.Config
	Pool    *pgxpool.Pool
	Server  *httpapi.Server
	Sweeper *sweep.Sweeper
	Logger  *slog.Logger
}

// Options tune New for tests.
type Options struct {
	Logger *slog.Logger
	// Now, when set, is the clock every decision reads, as is: tests move
	// time with it. Unset, decisions read the database's clock (db.Clock).
	Now func() time.Time
	// Wall is the instance's own clock when Now is unset (nil: time.Now),
	// which db.Clock corrects by the database's; tests skew it to show that
	// its reading decides nothing.
	Wall func() time.Time
}

// New builds an App. It applies migrations first when cfg.AutoMigrate is set.
func New(ctx context.Context, cfg *config.Config, opts Options) (*App, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	logger = redact.Logger(logger) // every part of the app logs errors as redact.ErrorText has them
	for _, w := range cfg.Warnings() {
		logger.Warn("config: " + w)
	}
	now := opts.Now
	var clock *db.Clock
	if now == nil {
		clock = db.NewClock(opts.Wall)
		now = clock.Now
	}
	if cfg.AutoMigrate {
		if _, err := db.MigrateURL(ctx, cfg.MigrationURL(), migrations.FS); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
	}
	var pool *pgxpool.Pool
	var err error
	if clock != nil {
		pool, err = db.OpenWithClock(ctx, cfg, clock)
	} else {
		pool, err = db.Open(ctx, cfg)
	}
	if err != nil {
		return nil, err
	}
	sealer, err := cfg.Sealer()
	if err != nil {
		pool.Close()
		return nil, err
	}
	authSvc := auth.NewService(pool, cfg.KeyHashSecret, cfg.KeyCacheTTL, now)
	sweeper := sweep.New(now, logger, sweep.Task{
		Name: "rate_counters.prune", Drains: true,
		Run: func(ctx context.Context, now time.Time) (int, error) {
			n, err := auth.PruneCounters(ctx, pool, now.Add(-2*time.Hour), rateCountersPerPass)
			return int(n), err
		},
	})
	// Checked here rather than at start, where it would cost every cold
	// start a statement, or refuse to start and take every route down for
	// values a removed key sealed (seal QA: nothing noticed a missing key
	// until a read of such a value failed). The failing task is logged at
	// each pass, named in the cron route's errors and fails the Lambda
	// sweeper's invocation.
	sweeper.Add(sweep.Task{Name: "seal.keys", Run: func(ctx context.Context, _ time.Time) (int, error) {
		missing, err := reseal.MissingKeys(ctx, pool, sealer)
		if err == nil && len(missing) > 0 {
			err = &reseal.MissingKeysError{IDs: missing}
		}
		return 0, err
	}})
	answers := idempotency.New(pool, sealer, now)
	sweeper.Add(sweep.Task{Name: "idempotency.expired", Drains: true, Run: func(ctx context.Context, now time.Time) (int, error) {
		return answers.Purge(ctx, now, idempotentAnswersPerPass)
	}})
	deps := httpapi.Deps{
		Config: cfg, Pool: pool, Auth: authSvc, Sealer: sealer, Sweeper: sweeper, Logger: logger, Now: now,
		Idempotency: answers,
	}
	if err := wireDomain(&deps, sweeper); err != nil {
		pool.Close()
		return nil, err
	}
	if opts.Now != nil {
		// A clock its caller moves may go back, and the instances sharing
		// a database read clocks years apart (tests): effects.retention
		// checks every pair at each run (gate.CheckRetentionEveryPass).
		deps.Gate.CheckRetentionEveryPass()
	}
	return &App{Config: cfg, Pool: pool, Server: httpapi.New(deps), Sweeper: sweeper, Logger: logger}, nil
}

// Close releases the pool.
func (a *App) Close() { a.Pool.Close() }

var (
	defaultMu       sync.Mutex
	defaultApp      *App
	defaultErr      error
	defaultFailedAt time.Time
)

// defaultRetryAfter is how long a failed build answers for itself before the
// next call tries again: requests arriving during an outage fail at once
// instead of each waiting out a migration's connect in turn.
const defaultRetryAfter = 5 * time.Second

// Default returns the instance's App, built once from the environment and
// reused across invocations (the serverless pattern: one pool per instance).
// A failed build is not kept for good: a database that was down at a cold
// start (with AUTO_MIGRATE) must not fail every later invocation of the
// instance, so a call defaultRetryAfter later builds again.
func Default() (*App, error) {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	if defaultApp != nil {
		return defaultApp, nil
	}
	if defaultErr != nil && time.Since(defaultFailedAt) < defaultRetryAfter {
		return nil, defaultErr
	}
	cfg, err := config.Load()
	if err == nil {
		defaultApp, err = New(context.Background(), cfg, Options{})
	}
	if err != nil {
		defaultErr, defaultFailedAt = err, time.Now()
		return nil, err
	}
	return defaultApp, nil
}

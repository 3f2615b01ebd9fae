// Package db owns Postgres access: the per-instance pool, migrations and the
// classification of driver errors the API must answer specially.
//
// Serverless sizing: every function instance holds its own pool, so the pool
// is tiny (DB_MAX_CONNS, default 4), idle connections are closed quickly, and
// no session state is relied upon. The default query mode is QueryExecModeExec:
// one round trip per query with the extended protocol and unnamed statements,
// which works behind transaction-mode poolers (PgBouncer, Neon, Supabase port
// 6543) where named prepared statements would leak between clients. Locks are
// transaction-scoped (pg_advisory_xact_lock, FOR UPDATE); nothing uses
// LISTEN/NOTIFY or session advisory locks.
package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/config"
)

// Open creates a pool from the configuration. It does not connect until the
// first query, so a cold start pays for the connection only when needed.
func Open(ctx context.Context, cfg *config.Config) (*pgxpool.Pool, error) { return open(ctx, cfg, nil) }

func open(ctx context.Context, cfg *config.Config, clock *Clock) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("config: DATABASE_URL is malformed (%v)", redactURLError(err))
	}
	pc.MaxConns = cfg.DBMaxConns
	pc.MinConns = 0
	pc.MaxConnIdleTime = cfg.DBMaxConnIdleTime
	pc.MaxConnLifetime = 30 * time.Minute
	pc.HealthCheckPeriod = time.Minute
	pc.ConnConfig.ConnectTimeout = cfg.DBConnectTimeout
	pc.ConnConfig.DefaultQueryExecMode = execMode(cfg.DBQueryExecMode)
	// Every request and sweep task runs under a deadline. When it passes
	// mid-statement, pgx's default handler closes the connection, sending a
	// cancel request on the way out so that the server stops the statement,
	// and the pool opens another when needed. The deadline is what bounds a
	// statement behind a pooler, where statement_timeout cannot be sent (see
	// below). A cancel request that kept the connection
	// (pgconn.CancelRequestContextWatcherHandler) crashed PgBouncer 1.18,
	// Debian 12's, in transaction mode, taking every instance's database
	// away (pooler QA: one client hanging up on a begin that waited for a
	// lock was enough); the default has not.
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	// Startup parameters, not SET: they cost no round trip. PgBouncer
	// forwards application_name, TimeZone, DateStyle, client_encoding and
	// standard_conforming_strings and refuses any other startup
	// parameter (unless told to ignore it, and then drops it), so
	// statement_timeout is sent only when DB_STATEMENT_TIMEOUT asks for it,
	// for a direct connection; behind a pooler set it on the role instead.
	pc.ConnConfig.RuntimeParams["application_name"] = "ratchet"
	if cfg.DBStatementTimeout > 0 {
		pc.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(cfg.DBStatementTimeout.Milliseconds(), 10)
	}
	pinSession(pc.ConnConfig.RuntimeParams)
	pc.AfterConnect = scanTimesInUTC
	if clock != nil {
		clock.hook(pc)
	}
	pc.ConnConfig.Tracer = acquireBound(cfg.DBAcquireTimeout)
	return pgxpool.NewWithConfig(ctx, pc)
}

// pinSession sets the session settings Ratchet's statements and pgx's
// readers depend on, as startup parameters (no round trip) that PgBouncer
// forwards: the pool's connections and the migrations' alike.
func pinSession(params map[string]string) {
	params["timezone"] = "UTC"
	// pgx reads dates and times in ISO output only: a database or role
	// set to another DateStyle ('SQL, DMY', a legacy default) failed every
	// statement that answers a time, in every exec mode (QA). PgBouncer
	// forwards DateStyle as it does TimeZone.
	params["datestyle"] = "ISO, MDY"
	// The same for what pgx's simple protocol insists on and a legacy
	// database may have otherwise (QA: every statement failed in
	// simple_protocol mode), and for text: a LATIN1 or SQL_ASCII database
	// talking in its own encoding stored UTF-8 bytes as one character each,
	// where with UTF8 declared it converts or refuses. PgBouncer forwards
	// both. bytea_output and array_nulls it does not: Migrate checks them.
	params["client_encoding"] = "UTF8"
	params["standard_conforming_strings"] = "on"
}

// scanTimesInUTC makes the connection scan timestamptz values in UTC. pgx
// scans them in the process's local zone, and API.md wants every timestamp
// answered in UTC: on a host whose zone is not UTC (a laptop running
// scripts/dev) answers carried "-05:00" (QA). The session's TimeZone above
// is the server side's (date arithmetic, to_char); this is the client's.
// Registering a type changes only the connection's own map; no round trip.
func scanTimesInUTC(_ context.Context, conn *pgx.Conn) error {
	conn.TypeMap().RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID,
		Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC}})
	return nil
}

func execMode(s string) pgx.QueryExecMode {
	switch s {
	case "simple_protocol":
		return pgx.QueryExecModeSimpleProtocol
	case "cache_statement":
		return pgx.QueryExecModeCacheStatement
	case "cache_describe":
		return pgx.QueryExecModeCacheDescribe
	case "describe_exec":
		return pgx.QueryExecModeDescribeExec
	default:
		return pgx.QueryExecModeExec
	}
}

// redactURLError keeps pgx's parse errors from echoing a password.
func redactURLError(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return "cannot parse connection string"
	}
	return "cannot parse connection string"
}

// IsUnavailable reports whether err means the database could not be reached
// (connect failure, network error, server shutting down, or the acquire timed
// out), as opposed to a query that Postgres rejected.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	// The connection ended while a statement was in flight (a restart, a
	// network cut): pgx answers the read's end of file, or that the
	// connection is closed.
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		// 57014: cancelled by a statement timeout or by the request's
		// deadline (a cancel request): the database was too slow to answer.
		// (A client that went away cancels too; the router tells that case
		// by the request's context before asking here.)
		// 08P01: what a pooler answers when it cannot serve the query in
		// time (PgBouncer's query_wait_timeout) or lost its server.
		case "57014", "08P01", "57P01", "57P02", "57P03", "53300", "08000", "08003", "08006", "08001", "08004":
			return true
		}
		return false
	}
	return pgconn.SafeToRetry(err)
}

// PoolWaitError is a statement that never got a connection from the pool
// before its caller's end or the wait's bound (DB_ACQUIRE_TIMEOUT): every
// one stayed in use (Busy: requests waiting on a lock, a slow sweep), or a
// new one was still being opened. Nothing was sent. It wraps the context's
// error, so it is still a timeout (or a cancellation) to callers that ask.
type PoolWaitError struct {
	// Busy: every connection the pool may open was in use when the wait
	// ended.
	Busy bool
	err  error
}

func (e *PoolWaitError) Error() string {
	if e.Busy {
		return "no pooled database connection came free: " + e.err.Error()
	}
	return "no database connection in time: " + e.err.Error()
}

func (e *PoolWaitError) Unwrap() error { return e.err }

// IsPoolWait reports whether err is a statement that never got a pooled
// connection (PoolWaitError).
func IsPoolWait(err error) bool {
	var pw *PoolWaitError
	return errors.As(err, &pw)
}

// IsPoolBusy reports whether err is a statement that waited in vain for one
// of the pool's connections, all in use when it stopped waiting.
func IsPoolBusy(err error) bool {
	var pw *PoolWaitError
	return errors.As(err, &pw) && pw.Busy
}

// acquireBound is the pool's acquire tracer. It marks an acquire that ends
// without a connection as a PoolWaitError, and bounds each wait by its
// duration (0: by the caller's context alone), opening a new connection
// included. Without it a request waited for a connection until its own
// deadline (15 s for most routes), and was answered "may have been
// applied" though it never reached the database (pool QA: four requests
// waiting on one locked row took a Lambda-sized pool of 4 from every other
// request of the instance). pgxpool waits with the context this answers,
// and returns that context's Err as the acquire's error.
type acquireBound time.Duration

type acquireCtx struct {
	context.Context
	cancel context.CancelFunc
	pool   *pgxpool.Pool
}

// Err marks the wait's end: a connection was never had, so nothing was
// sent. Busy says whether every connection was in use as it ended.
func (c *acquireCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		st := c.pool.Stat()
		return &PoolWaitError{Busy: st.IdleConns() == 0 && st.TotalConns() >= st.MaxConns(), err: err}
	}
	return nil
}

func (b acquireBound) TraceAcquireStart(ctx context.Context, pool *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	c := &acquireCtx{Context: ctx, cancel: func() {}, pool: pool}
	if b > 0 {
		c.Context, c.cancel = context.WithTimeout(ctx, time.Duration(b))
	}
	return c
}

func (acquireBound) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	if c, ok := ctx.(*acquireCtx); ok {
		c.cancel()
	}
}

// TraceQueryStart and TraceQueryEnd do nothing: pgxpool finds its acquire
// tracer only on the connection's query tracer.
func (acquireBound) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (acquireBound) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// IsCanceled reports whether Postgres cancelled the statement (57014): its
// statement_timeout ran out, or someone asked it to stop (a cancel request,
// pg_cancel_backend). The database answered: it is up.
func IsCanceled(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014"
}

// Unapplied reports whether a failed database call certainly changed
// nothing: connecting failed, no pooled connection came free, pgx knows the
// statement was never sent, or
// Postgres rolled it back as a deadlock's victim. Otherwise it may have
// committed before the failure reached us.
func Unapplied(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) || IsPoolWait(err) || pgconn.SafeToRetry(err) || HasCode(err, CodeDeadlockDetected)
}

// Unique-violation and friends, for callers that turn constraint errors into
// API answers.
const (
	CodeUniqueViolation      = "23505"
	CodeSerializationFailure = "40001"
	CodeDeadlockDetected     = "40P01"
	CodeForeignKeyViolation  = "23503"
	CodeCheckViolation       = "23514"
	CodeQueryCanceled        = "57014"
	CodeLockNotAvailable     = "55P03" // lock_timeout passed, or NOWAIT
)

// HasCode reports whether err is a Postgres error with the given SQLSTATE.
func HasCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// ConstraintName returns the violated constraint's name, or "".
func ConstraintName(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.ConstraintName
	}
	return ""
}

// CollectIDs reads a one-column result of ids, straight from a Query's
// two results, so that a caller wraps one error for both.
func CollectIDs(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Snapshot runs fn in a read-only REPEATABLE READ transaction, so that a
// read made of several statements (a run, then its steps and their
// attempts) sees one moment and not a transition halfway. When ctx
// carries a request's transaction (BeginRequest), fn reads in a savepoint
// of it instead, as Tx does: the read that answers a keyed action (a
// step's cancel) sees what the action wrote, uncommitted yet, where a
// snapshot of its own saw the state before, and the read needs no second
// connection of the pool, which the request's transaction may hold. The
// rows that action locked hold still until it commits.
func Snapshot(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	if requestTx(ctx) != nil {
		return Tx(ctx, pool, fn)
	}
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

// Tx runs fn in a transaction, committing when fn returns nil. When ctx
// carries a request's transaction (BeginRequest), fn runs in a savepoint of
// it instead, and what it writes commits with the request's own work. It is
// the one place services begin transactions, so every caller gets the same
// rollback discipline, joins a request's transaction the same way, and
// runs ctx's check last, before its commit (WithCheck).
func Tx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	if rt := requestTx(ctx); rt != nil {
		tx, err := rt.begun(ctx)
		if err != nil {
			return err
		}
		return pgx.BeginFunc(ctx, tx, fn)
	}
	if check := checkOf(ctx); check != nil {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := fn(tx); err != nil {
				return err
			}
			return check(ctx, tx)
		})
	}
	return pgx.BeginFunc(ctx, pool, fn)
}

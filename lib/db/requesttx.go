package db

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier runs statements: a pool, or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// RequestTx is one transaction holding all the work of a request, begun and
// ended by the code serving it rather than by the services it calls: the
// Idempotency-Key path (lib/httpapi) commits a route's writes together with
// the answer it records for them, so that either both are kept or neither
// is, and a retry never acts twice (Stripe's atomic phases). The services
// learn of it through the context BeginRequest returns: Tx runs in a
// savepoint of it, Conn answers it, and AfterCommit waits for its commit.
//
// It begins at its first statement, so a request refused before it reads
// anything holds no connection, and none sits idle in a transaction while
// the request is checked. It belongs to one goroutine, as the pgx.Tx under
// it does.
type RequestTx struct {
	pool        *pgxpool.Pool
	tx          pgx.Tx // nil until the first statement
	afterCommit []func()
}

type requestTxKey struct{}

// BeginRequest returns a RequestTx on pool, and a context that carries it
// to the services a request calls.
func BeginRequest(ctx context.Context, pool *pgxpool.Pool) (context.Context, *RequestTx) {
	rt := &RequestTx{pool: pool}
	return context.WithValue(ctx, requestTxKey{}, rt), rt
}

// requestTx is the RequestTx ctx carries, or nil.
func requestTx(ctx context.Context) *RequestTx {
	rt, _ := ctx.Value(requestTxKey{}).(*RequestTx)
	return rt
}

// begun is the transaction, begun now if no statement has been sent yet.
func (rt *RequestTx) begun(ctx context.Context) (pgx.Tx, error) {
	if rt.tx == nil {
		tx, err := rt.pool.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("begin request transaction: %w", err)
		}
		rt.tx = tx
	}
	return rt.tx, nil
}

type checkKey struct{}

// WithCheck returns ctx carrying check, which every transaction begun
// under it runs last, just before its commit (Tx's, and a request's
// transaction, RequestTx.Commit), so that what the transaction wrote
// commits only if check passed in it: for a request whose key must still
// be live as it writes (auth.RequireLive, which holds the key's row until
// the transaction ends, so that a revocation waits for the commit). Last,
// so that the row is held for one round trip, not while the transaction
// waits for its other locks: held from the first statement, a revoke
// waited behind a stream of writes of the key that took turns on a lock of
// their own, each holding the row as it waited (a revoke's FOR UPDATE
// does not keep later KEY SHAREs from joining). A check that fails fails
// the transaction with its error, and nothing it wrote is kept. Snapshot's
// read-only transactions, statements run on the pool outside a
// transaction, and what runs once the request's write committed
// (Unchecked, AfterRequest) are not checked.
func WithCheck(ctx context.Context, check func(context.Context, pgx.Tx) error) context.Context {
	return context.WithValue(ctx, checkKey{}, check)
}

// checkOf is ctx's check (WithCheck), or nil.
func checkOf(ctx context.Context) func(context.Context, pgx.Tx) error {
	check, _ := ctx.Value(checkKey{}).(func(context.Context, pgx.Tx) error)
	return check
}

// Exec runs a statement in the transaction.
func (rt *RequestTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, err := rt.begun(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

// Query runs a query in the transaction.
func (rt *RequestTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := rt.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Query(ctx, sql, args...)
}

// QueryRow runs a query of one row in the transaction.
func (rt *RequestTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := rt.begun(ctx)
	if err != nil {
		return errRow{err}
	}
	return tx.QueryRow(ctx, sql, args...)
}

// errRow is a row whose query could not be sent.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// ErrCommitUnknown marks a failed commit that may nevertheless have landed:
// the connection was lost while the commit was sent or answered.
var ErrCommitUnknown = errors.New("commit outcome unknown")

// Commit runs ctx's check (WithCheck) in the transaction, whose error it
// answers (nothing committed), commits the transaction, then runs what
// AfterCommit deferred. A
// failure wraps ErrCommitUnknown unless the commit surely did not land: it
// was never sent, or the server answered that it rolled back (the
// transaction had failed before, or COMMIT failed with an ERROR, such as a
// serialization failure). A FATAL answer (the connection terminated) or no
// answer may come after the commit landed.
func (rt *RequestTx) Commit(ctx context.Context) error {
	if rt.tx != nil {
		if check := checkOf(ctx); check != nil {
			if err := check(ctx, rt.tx); err != nil {
				return err // the caller rolls back
			}
		}
		if err := rt.tx.Commit(ctx); err != nil {
			var pe *pgconn.PgError
			if errors.Is(err, pgx.ErrTxCommitRollback) || Unapplied(err) ||
				(errors.As(err, &pe) && pe.SeverityUnlocalized == "ERROR") {
				return fmt.Errorf("commit request transaction: %w", err)
			}
			return fmt.Errorf("commit request transaction: %w: %w", ErrCommitUnknown, err)
		}
	}
	rt.Landed()
	return nil
}

// Landed runs what AfterCommit deferred: Commit does once the commit is
// answered, and the caller of a Commit that failed with ErrCommitUnknown
// does once it found, on another connection, that the commit landed.
func (rt *RequestTx) Landed() {
	for _, fn := range rt.afterCommit {
		fn()
	}
	rt.afterCommit = nil
}

// Rollback rolls the transaction back and drops what AfterCommit deferred.
// Rolling back one already ended does nothing.
func (rt *RequestTx) Rollback(ctx context.Context) error {
	rt.afterCommit = nil
	if rt.tx == nil {
		return nil
	}
	if err := rt.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("roll back request transaction: %w", err)
	}
	return nil
}

// OutsideRequest is ctx without the request's transaction: what runs under
// it commits on its own. For housekeeping a service does before its work
// (ending a lapsed lease, as a read or the sweeper would), whose locks must
// not be held until the request commits, where they would break the order
// the service's own transaction takes its locks in. Only before the
// request's transaction has begun: after, its statements would need a
// second connection of the pool, so they join the transaction instead.
func OutsideRequest(ctx context.Context) context.Context {
	if rt := requestTx(ctx); rt != nil && rt.tx == nil {
		return context.WithValue(ctx, requestTxKey{}, (*RequestTx)(nil))
	}
	return ctx
}

// InRequest says whether ctx carries a request's transaction
// (BeginRequest), which the caller's work joins.
func InRequest(ctx context.Context) bool { return requestTx(ctx) != nil }

// AfterRequest is ctx without its request's transaction, for what
// AfterCommit runs once that transaction has committed: what runs under it
// commits on its own, Unchecked.
func AfterRequest(ctx context.Context) context.Context {
	return context.WithValue(Unchecked(ctx), requestTxKey{}, (*RequestTx)(nil))
}

// Unchecked is ctx without its check (WithCheck): for the work a request
// does once what it wrote has committed, which follows from that write (a
// group settled after its step's report), so that a key revoked since
// does not fail the request after its change was made.
func Unchecked(ctx context.Context) context.Context {
	if checkOf(ctx) == nil {
		return ctx
	}
	return context.WithValue(ctx, checkKey{}, (func(context.Context, pgx.Tx) error)(nil))
}

// Conn is what a service runs a statement of its own on: the request's
// transaction when ctx carries one (BeginRequest), else pool. A service
// that reaches the pool itself while a request's transaction holds a
// connection would act outside it, and could wait for a connection the
// request holds.
func Conn(ctx context.Context, pool *pgxpool.Pool) Querier {
	if rt := requestTx(ctx); rt != nil {
		return rt
	}
	return pool
}

// AfterCommit runs fn once what the caller wrote is committed: at once,
// unless ctx carries a request's transaction (BeginRequest), which the
// caller's work joined and whose commit it waits for; dropped if that
// rolls back. For what must not happen before the data it announces is
// visible, such as waking a claim to look for a new job.
func AfterCommit(ctx context.Context, fn func()) {
	if rt := requestTx(ctx); rt != nil {
		rt.afterCommit = append(rt.afterCommit, fn)
		return
	}
	fn()
}

// Statement runs a write of one statement (Writer).
type Statement interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Writer is what a service runs a write of one statement on: Conn's,
// except that under a check (WithCheck) and outside a request's
// transaction the statement runs in a transaction of its own, checked
// before it commits, as Tx's are: on the pool it would write unchecked.
func Writer(ctx context.Context, pool *pgxpool.Pool) Statement {
	if requestTx(ctx) == nil && checkOf(ctx) != nil {
		return checkedStatement{pool}
	}
	return Conn(ctx, pool)
}

// checkedStatement runs each statement in a Tx of its own.
type checkedStatement struct{ pool *pgxpool.Pool }

func (c checkedStatement) Exec(ctx context.Context, sql string, args ...any) (tag pgconn.CommandTag, err error) {
	err = Tx(ctx, c.pool, func(tx pgx.Tx) error {
		tag, err = tx.Exec(ctx, sql, args...)
		return err
	})
	return tag, err
}

// QueryRow runs the statement as the row is scanned.
func (c checkedStatement) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return checkedRow{c.pool, ctx, sql, args}
}

type checkedRow struct {
	pool *pgxpool.Pool
	ctx  context.Context // the statement's: it runs at Scan
	sql  string
	args []any
}

func (r checkedRow) Scan(dest ...any) error {
	return Tx(r.ctx, r.pool, func(tx pgx.Tx) error { return tx.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...) })
}

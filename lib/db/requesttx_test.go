package db_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/testpg"
)

// requestPool is a pool of one connection over a table of its own (a temp
// table would be the connection's), so that any statement a service sent
// outside the request's transaction would wait for the connection the
// transaction holds.
func requestPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pool, err := db.Open(context.Background(), &config.Config{DatabaseURL: apitest.DatabaseURL(t), DBMaxConns: 1,
		DBMaxConnIdleTime: time.Minute, DBConnectTimeout: 5 * time.Second, DBQueryExecMode: "exec"})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := pgx.Identifier{fmt.Sprintf("request_tx_%d", time.Now().UnixNano())}.Sanitize()
	_, err = pool.Exec(context.Background(), `CREATE TABLE `+table+` (n int PRIMARY KEY)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+table) })
	return pool, table
}

func rows(t *testing.T, pool *pgxpool.Pool, table string) []int {
	t.Helper()
	r, err := pool.Query(context.Background(), `SELECT n FROM `+table+` ORDER BY n`)
	require.NoError(t, err)
	ns, err := pgx.CollectRows(r, pgx.RowTo[int])
	require.NoError(t, err)
	return ns
}

// What a service does under a request's transaction (db.Tx, db.Conn,
// db.AfterCommit) commits with it or not at all, on its one connection;
// a service's transaction that fails rolls back only its own part.
func TestRequestTxHoldsTheWorkOfItsServices(t *testing.T) {
	t.Parallel()
	pool, table := requestPool(t)
	ctx := context.Background()
	insert := func(ctx context.Context, n int) error {
		_, err := db.Conn(ctx, pool).Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, n)
		return err
	}

	for _, commit := range []bool{true, false} {
		base := 10
		if !commit {
			base = 20
		}
		rctx, rt := db.BeginRequest(ctx, pool)
		var after []string
		require.NoError(t, insert(rctx, base+1))
		require.NoError(t, db.Tx(rctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(rctx, `INSERT INTO `+table+` VALUES ($1)`, base+2)
			return err
		}))
		failed := db.Tx(rctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(rctx, `INSERT INTO `+table+` VALUES ($1)`, base+3); err != nil {
				return err
			}
			_, err := tx.Exec(rctx, `INSERT INTO `+table+` VALUES ($1)`, base+1) // a duplicate
			return err
		})
		require.True(t, db.HasCode(failed, db.CodeUniqueViolation), "%v", failed)
		db.AfterCommit(rctx, func() { after = append(after, "woken") })
		require.Empty(t, after, "not before the commit")
		require.NoError(t, rt.QueryRow(rctx, `SELECT count(*) FROM `+table+` WHERE n > $1`, base).
			Scan(new(int)), "the transaction is usable after a service's failed one")
		if commit {
			require.NoError(t, rt.Commit(ctx))
			require.Equal(t, []string{"woken"}, after)
		} else {
			require.NoError(t, rt.Rollback(ctx))
			require.Empty(t, after, "dropped with the work")
		}
		require.NoError(t, rt.Rollback(ctx), "rolling back an ended transaction does nothing")
	}
	require.Equal(t, []int{11, 12}, rows(t, pool, table))

	// It takes its connection at its first statement: one that sends none
	// holds none, and commits nothing but what waited for it.
	rctx, rt := db.BeginRequest(ctx, pool)
	var ran bool
	db.AfterCommit(rctx, func() { ran = true })
	require.Zero(t, pool.Stat().AcquiredConns())
	require.NoError(t, rt.Commit(ctx))
	require.True(t, ran)
	rctx, rt = db.BeginRequest(ctx, pool)
	require.NoError(t, insert(rctx, 13))
	require.EqualValues(t, 1, pool.Stat().AcquiredConns())
	require.NoError(t, rt.Rollback(ctx))
	require.Zero(t, pool.Stat().AcquiredConns())

	// Outside the request's transaction, before it began, work commits on
	// its own; after, it joins (the pool has no second connection for it).
	rctx, rt = db.BeginRequest(ctx, pool)
	require.NoError(t, insert(db.OutsideRequest(rctx), 14))
	require.NoError(t, insert(rctx, 15))
	require.NoError(t, insert(db.OutsideRequest(rctx), 16))
	require.NoError(t, rt.Rollback(ctx))
	require.Equal(t, []int{11, 12, 14}, rows(t, pool, table))

	// Without a request's transaction, each runs on its own.
	var woken bool
	require.NoError(t, insert(ctx, 31))
	db.AfterCommit(ctx, func() { woken = true })
	require.True(t, woken)
	require.Equal(t, []int{11, 12, 14, 31}, rows(t, pool, table))
}

// A commit whose connection dies while the server commits may have landed:
// the error says the outcome is unknown. One the server refused (the
// transaction had already failed, or COMMIT failed with an ERROR) surely
// did not.
func TestRequestTxCommitSaysWhenItsOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	pool, table := requestPool(t)
	ctx := context.Background()

	rctx, rt := db.BeginRequest(ctx, pool)
	_, err := rt.Exec(rctx, `INSERT INTO `+table+` VALUES (1)`)
	require.NoError(t, err)
	_, err = rt.Exec(rctx, `INSERT INTO `+table+` VALUES (1)`)
	require.Error(t, err)
	err = rt.Commit(ctx)
	require.ErrorIs(t, err, pgx.ErrTxCommitRollback)
	require.NotErrorIs(t, err, db.ErrCommitUnknown)

	// COMMIT refused with an ERROR (here a deferred trigger's) rolled back.
	rctx, rt = db.BeginRequest(ctx, pool)
	_, err = rt.Exec(rctx, testpg.RefuseAtCommit+`; INSERT INTO `+table+` VALUES (3)`)
	require.NoError(t, err)
	err = rt.Commit(ctx)
	require.Error(t, err)
	require.NotErrorIs(t, err, db.ErrCommitUnknown)
	require.Empty(t, rows(t, pool, table))

	// A deferred trigger ends the connection at COMMIT, after the client
	// sent it: from the client's side, a commit whose answer never came.
	rctx, rt = db.BeginRequest(ctx, pool)
	_, err = rt.Exec(rctx, testpg.EndConnectionAtCommit+`; INSERT INTO `+table+` VALUES (2)`)
	require.NoError(t, err)
	woken := 0
	db.AfterCommit(rctx, func() { woken++ })
	err = rt.Commit(ctx)
	require.ErrorIs(t, err, db.ErrCommitUnknown, "%v", err)
	require.False(t, db.Unapplied(err), "the commit was sent")
	require.Empty(t, rows(t, pool, table), "(here it did not land)")
	require.Zero(t, woken, "not run for a commit whose outcome is unknown")
	// Its caller, finding on another connection that such a commit landed,
	// runs what waited for it.
	rt.Landed()
	rt.Landed()
	require.Equal(t, 1, woken, "once")
}

// A check (db.WithCheck) runs last, before the commit, in every
// transaction begun under it: Tx's, a request's (once, as it commits) and
// Writer's own for a statement outside a request; refused, nothing the
// transaction wrote is kept, and its error is answered. Unchecked and AfterRequest drop
// it, and a statement on the pool (Conn outside a request) is not checked.
func TestACheckRunsLastInEveryTransactionBegunUnderIt(t *testing.T) {
	t.Parallel()
	pool, table := requestPool(t)
	refused := fmt.Errorf("refused")
	var checks int
	pass := true
	checked := db.WithCheck(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
		checks++
		// In the transaction it checks: what it writes rolls back with it.
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES (0)`); err != nil {
			return err
		}
		if !pass {
			return refused
		}
		return nil
	})
	insert := func(ctx context.Context, n int) error {
		return db.Tx(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, n)
			return err
		})
	}
	empty := func() {
		_, err := pool.Exec(context.Background(), `DELETE FROM `+table)
		require.NoError(t, err)
	}
	var n int
	writes := map[string]func(context.Context) error{
		"Tx": func(ctx context.Context) error { return insert(ctx, 1) },
		"Writer.Exec": func(ctx context.Context) error {
			_, err := db.Writer(ctx, pool).Exec(ctx, `INSERT INTO `+table+` VALUES (1)`)
			return err
		},
		"Writer.QueryRow": func(ctx context.Context) error {
			return db.Writer(ctx, pool).QueryRow(ctx, `INSERT INTO `+table+` VALUES (1) RETURNING n`).Scan(&n)
		},
		"a request's transaction": func(ctx context.Context) error {
			rctx, rt := db.BeginRequest(ctx, pool)
			defer func() { _ = rt.Rollback(ctx) }()
			if err := insert(rctx, 1); err != nil {
				return err
			}
			if _, err := db.Writer(rctx, pool).Exec(rctx, `INSERT INTO `+table+` VALUES (2)`); err != nil {
				return err
			}
			return rt.Commit(ctx)
		},
	}
	for name, write := range writes {
		pass, checks = false, 0
		require.ErrorIs(t, write(checked), refused, name)
		require.Equal(t, 1, checks, name)
		require.Empty(t, rows(t, pool, table), "%s: refused, it wrote nothing", name)

		pass, checks = true, 0
		require.NoError(t, write(checked), name)
		require.Equal(t, 1, checks, "%s: checked once", name)
		require.Contains(t, rows(t, pool, table), 0, "%s: checked in its transaction", name)
		empty()

		pass, checks = false, 0
		require.NoError(t, write(db.Unchecked(checked)), name)
		empty()
		require.NoError(t, write(db.AfterRequest(checked)), name)
		empty()
		require.Zero(t, checks, "%s: unchecked", name)
	}
	_, err := db.Conn(checked, pool).Exec(checked, `INSERT INTO `+table+` VALUES (3)`)
	require.NoError(t, err)
	require.Zero(t, checks, "a statement on the pool is not checked")
}

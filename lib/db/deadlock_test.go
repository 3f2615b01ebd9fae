package db_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
)

// Two transactions locking two rows in opposite orders deadlock, and
// Postgres rolls one back (40P01). Under TxRetryingDeadlocks both complete:
// the victim runs again from nothing applied, once the other has gone on.
func TestADeadlocksVictimRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := db.Open(ctx, &config.Config{DatabaseURL: apitest.DatabaseURL(t), DBMaxConns: 4,
		DBMaxConnIdleTime: time.Minute, DBConnectTimeout: 5 * time.Second, DBQueryExecMode: "exec"})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := fmt.Sprintf("deadlock_probe_%d", time.Now().UnixNano())
	_, err = pool.Exec(ctx, `CREATE TABLE `+table+` (id int PRIMARY KEY, n int NOT NULL);
		INSERT INTO `+table+` VALUES (1, 0), (2, 0)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+table) })

	// Each holds its first row before either asks for its second: one of
	// the two is then a deadlock's victim.
	var bothHold sync.WaitGroup
	bothHold.Add(2)
	var runs atomic.Int32
	transfer := func(first, second int) error {
		once := sync.Once{}
		return db.TxRetryingDeadlocks(ctx, pool, func(tx pgx.Tx) error {
			runs.Add(1)
			if _, err := tx.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = $1`, first); err != nil {
				return err
			}
			once.Do(func() { bothHold.Done(); bothHold.Wait() })
			_, err := tx.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = $1`, second)
			return err
		})
	}
	errs := make(chan error, 2)
	go func() { errs <- transfer(1, 2) }()
	go func() { errs <- transfer(2, 1) }()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.EqualValues(t, 3, runs.Load(), "the victim ran once more, the other once")
	var one, two int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT n FROM `+table+` WHERE id = 1), (SELECT n FROM `+table+` WHERE id = 2)`).Scan(&one, &two))
	require.Equal(t, []int{2, 2}, []int{one, two}, "each transaction applied once; the victim's first run was rolled back")
}

// The retries are bounded, only a deadlock is retried, and a deadlock's
// victim counts as unapplied (its transaction was rolled back).
func TestRetryDeadlocksIsBoundedAndOnlyForDeadlocks(t *testing.T) {
	t.Parallel()
	deadlock := fmt.Errorf("report: %w", &pgconn.PgError{Code: db.CodeDeadlockDetected})
	runs := 0
	err := db.RetryDeadlocks(context.Background(), func() error { runs++; return deadlock })
	require.ErrorIs(t, err, deadlock)
	require.Equal(t, db.DeadlockRetries+1, runs)
	require.True(t, db.Unapplied(err))

	runs = 0
	other := errors.New("boom")
	require.ErrorIs(t, db.RetryDeadlocks(context.Background(), func() error { runs++; return other }), other)
	require.Equal(t, 1, runs)

	// A context that ends stops the retries at the pause.
	runs = 0
	done, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, db.RetryDeadlocks(done, func() error { runs++; return deadlock }), deadlock)
	require.Equal(t, 1, runs)

	runs = 0
	require.NoError(t, db.RetryDeadlocks(context.Background(), func() error {
		if runs++; runs < 3 {
			return deadlock
		}
		return nil
	}))
	require.Equal(t, 3, runs)
}

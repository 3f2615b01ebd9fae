package db_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// apitest.Main holds a session of its own on the run's database for the
// whole run, so that another run's testpg.DropStaleTestDatabases, which
// leaves a database in use, never takes it mid-run, whatever the clocks
// say (review: its name's time alone decided, and a run whose clock was a
// day ahead dropped it WITH (FORCE)); between tests the service's pools
// may hold none.
func TestATestRunHoldsItsDatabase(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var held bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1 AND pid <> pg_backend_pid())`,
		apitest.RunSession).Scan(&held))
	require.True(t, held, "the run holds a session on its database")
}

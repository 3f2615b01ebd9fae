package db_test

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/getratchet/ratchet/migrations"
)

// freshDatabase creates an empty database next to the package's one.
func freshDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	admin := apitest.DatabaseURL(t)
	name := "ratchet_mig_" + strings.ToLower(ids.Random(6))
	u, err := testpg.CreateDatabase(ctx, admin, name)
	require.NoError(t, err)
	t.Cleanup(func() { _ = testpg.DropDatabase(context.Background(), admin, name) })
	return u
}

func TestConcurrentMigrationsApplyEachFileOnce(t *testing.T) {
	t.Parallel()
	target := freshDatabase(t)
	all, err := db.LoadMigrations(migrations.FS)
	require.NoError(t, err)
	require.NotEmpty(t, all)

	const instances = 8
	var wg sync.WaitGroup
	applied := make([][]int, instances)
	errs := make([]error, instances)
	for i := 0; i < instances; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			applied[i], errs[i] = db.MigrateURL(context.Background(), target, migrations.FS)
		}(i)
	}
	wg.Wait()
	total := 0
	for i := range errs {
		require.NoError(t, errs[i])
		total += len(applied[i])
	}
	require.Equal(t, len(all), total, "each migration applied by exactly one instance")

	conn, err := pgx.Connect(context.Background(), target)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM schema_migrations`).Scan(&n))
	require.Equal(t, len(all), n)

	again, err := db.MigrateURL(context.Background(), target, migrations.FS)
	require.NoError(t, err)
	require.Empty(t, again)
}

func TestFailedMigrationLeavesNothingHalfApplied(t *testing.T) {
	t.Parallel()
	target := freshDatabase(t)
	fsys := fstest.MapFS{
		"0001_ok.sql":     {Data: []byte(`CREATE TABLE a (id int);`)},
		"0002_broken.sql": {Data: []byte(`CREATE TABLE b (id int); SELECT no_such_function();`)},
	}
	_, err := db.MigrateURL(context.Background(), target, fsys)
	require.ErrorContains(t, err, "0002_broken")
	conn, err := pgx.Connect(context.Background(), target)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var tables int
	require.NoError(t, conn.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('a', 'b', 'schema_migrations')`).Scan(&tables))
	require.Zero(t, tables)
}

func TestLoadMigrationsRejectsDuplicateVersions(t *testing.T) {
	t.Parallel()
	_, err := db.LoadMigrations(fstest.MapFS{
		"0001_a.sql": {Data: []byte(`SELECT 1`)},
		"0001_b.sql": {Data: []byte(`SELECT 1`)},
	})
	require.ErrorContains(t, err, "0001")
}

func TestIsUnavailable(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(apitest.DatabaseURL(t))
	require.NoError(t, err)
	u.Host = "127.0.0.1:1" // nothing listens on port 1
	_, err = pgx.Connect(context.Background(), u.String())
	require.Error(t, err)
	require.True(t, db.IsUnavailable(err))

	conn, err := pgx.Connect(context.Background(), apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), `SELECT * FROM no_such_table`)
	require.Error(t, err)
	require.False(t, db.IsUnavailable(err), "a rejected query is not an outage")
}

// A connection that ends while a statement is in flight is an outage, and
// one whose statement was sent may have been applied; a failed connect was
// not.
func TestConnectionLostMidStatement(t *testing.T) {
	t.Parallel()
	conn, err := pgx.Connect(context.Background(), apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	victim, err := pgx.Connect(context.Background(), apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer victim.Close(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := victim.Exec(context.Background(), `SELECT pg_sleep(10)`)
		done <- err
	}()
	pid := victim.PgConn().PID()
	require.Eventually(t, func() bool {
		var killed bool
		_ = conn.QueryRow(context.Background(), `SELECT pg_terminate_backend($1::int)`, pid).Scan(&killed)
		return killed
	}, 5*time.Second, 20*time.Millisecond)
	err = <-done
	require.Error(t, err)
	require.True(t, db.IsUnavailable(err), "%v", err)
	require.False(t, db.Unapplied(err), "the statement was sent: %v", err)

	u, _ := url.Parse(apitest.DatabaseURL(t))
	u.Host = "127.0.0.1:1"
	_, err = pgx.Connect(context.Background(), u.String())
	require.True(t, db.Unapplied(err), "nothing was sent: %v", err)

	// The connection ends under the statement with no word from the server
	// (a crash, a reset): the read ends in EOF.
	cut, err := testpg.StartCutProxy(apitest.DatabaseURL(t))
	require.NoError(t, err)
	t.Cleanup(cut.Close)
	cfg, err := pgx.ParseConfig(cut.URL)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec // the service's mode
	through, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	go func() { time.Sleep(200 * time.Millisecond); cut.Cut() }()
	_, err = through.Exec(context.Background(), `SELECT pg_sleep(10)`)
	require.Error(t, err)

	require.True(t, db.IsUnavailable(err), "%v", err)
	require.False(t, db.Unapplied(err), "the statement was sent: %v", err)
}

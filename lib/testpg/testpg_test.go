package testpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// uniqueName returns a database name that does not collide with other tests
// or test processes sharing the same server (DATABASE_URL). It contains a
// quote, a space and upper case letters to exercise identifier quoting and
// URL escaping.
func uniqueName(prefix string) string {
	return fmt.Sprintf(`%s "Q" %d_%d`, prefix, os.Getpid(), rand.Uint32())
}

// queryOne runs a single-value query against connString.
func queryOne[T any](t *testing.T, ctx context.Context, connString, sql string, args ...any) T {
	t.Helper()
	conn, err := pgx.Connect(ctx, connString)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var v T
	require.NoError(t, conn.QueryRow(ctx, sql, args...).Scan(&v))
	return v
}

func databaseExists(t *testing.T, ctx context.Context, adminURL, name string) bool {
	t.Helper()
	conn, err := pgx.Connect(ctx, adminURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, "select exists(select 1 from pg_database where datname = $1)", name).Scan(&exists))
	return exists
}

// exerciseCluster creates a database, uses it and drops it again, including
// while a session is still connected (DROP ... WITH (FORCE)).
func exerciseCluster(t *testing.T, ctx context.Context, adminURL string) {
	t.Helper()
	name := uniqueName("testpg")
	dbURL, err := CreateDatabase(ctx, adminURL, name)
	require.NoError(t, err)
	t.Cleanup(func() { _ = DropDatabase(context.Background(), adminURL, name) })

	require.Equal(t, 1, queryOne[int](t, ctx, dbURL, "select 1"))
	require.Equal(t, name, queryOne[string](t, ctx, dbURL, "select current_database()"))

	held, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer held.Close(context.Background())

	require.NoError(t, DropDatabase(ctx, adminURL, name))
	require.False(t, databaseExists(t, ctx, adminURL, name))
	require.NoError(t, DropDatabase(ctx, adminURL, name), "dropping a missing database is not an error")
}

// provisioned is a server from Provision, closed when the test ends, and a
// context that bounds the test's work on it.
func provisioned(t *testing.T) (context.Context, *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	c, err := Provision(ctx, Options{Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return ctx, c
}

func TestProvision(t *testing.T) {
	t.Parallel()
	ctx, c := provisioned(t)
	if os.Getenv("DATABASE_URL") != "" {
		require.Equal(t, "env", c.source)
		require.Equal(t, os.Getenv("DATABASE_URL"), c.URL)
	}
	exerciseCluster(t, ctx, c.URL)
}

func TestCreateDatabaseRejectsBadNames(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", "x\x00y", strings.Repeat("a", 64)} {
		_, err := CreateDatabase(context.Background(), "postgres://127.0.0.1:1/x", name)
		require.Error(t, err, "name %q", name)
	}
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, name, want string }{
		{"postgres://u:p@h:5432/postgres?sslmode=disable", "app_test", "postgres://u:p@h:5432/app_test?sslmode=disable"},
		{"postgresql://h/db?dbname=other&sslmode=disable", "n", "postgresql://h/n?sslmode=disable"},
		{"postgres://h/postgres", `a "b"/c`, "postgres://h/a%20%22b%22%2Fc"},
		{"host=h user=u dbname=postgres", "it's", `host=h user=u dbname=postgres dbname='it\'s'`},
	}
	for _, tt := range tests {
		got, err := withDatabase(tt.in, tt.name)
		require.NoError(t, err)
		require.Equal(t, tt.want, got)
		cfg, err := pgx.ParseConfig(got)
		require.NoError(t, err)
		require.Equal(t, tt.name, cfg.Database, "pgx must see the new database in %q", got)
	}
}

// TestProvisionLocal exercises the local-binaries path directly, even when
// DATABASE_URL is set. It is the only test that may skip: on a machine
// without a PostgreSQL server installation this path cannot run, while every
// other test still gets a server through DATABASE_URL or Docker.
func TestProvisionLocal(t *testing.T) {
	t.Parallel()
	bin, err := findBinaries(thisMachine, 0)
	if errors.Is(err, ErrNoBinaries) {
		t.Skipf("local-binaries path not testable: %v", err)
	}
	require.NoError(t, err)
	t.Logf("using PostgreSQL %d binaries in %s", bin.major, bin.dir)

	t.Run("throwaway", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		c, err := provisionLocal(ctx, Options{Logf: t.Logf})
		require.NoError(t, err)
		defer c.Close()
		require.Equal(t, "local", c.source)
		require.NotEmpty(t, c.tmpDir)

		require.Equal(t, "off", queryOne[string](t, ctx, c.URL, "show fsync"))
		require.Equal(t, "200", queryOne[string](t, ctx, c.URL, "show max_connections"))
		require.Equal(t, "127.0.0.1", queryOne[string](t, ctx, c.URL, "show listen_addresses"))
		require.Equal(t, c.tmpDir, queryOne[string](t, ctx, c.URL, "show unix_socket_directories"))
		require.True(t, queryOne[bool](t, ctx, c.URL, "select rolsuper from pg_roles where rolname = current_user"))
		exerciseCluster(t, ctx, c.URL)

		require.NoError(t, c.Close())
		require.NoError(t, c.Close(), "Close is idempotent")
		_, err = os.Stat(c.tmpDir)
		require.ErrorIs(t, err, os.ErrNotExist, "temporary directory must be removed")
		_, err = pgx.Connect(ctx, c.URL)
		require.Error(t, err, "server must be stopped")
	})

	// Several clusters at once, as parallel test packages do: they must
	// not collide on ports or directories.
	t.Run("concurrent", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		const n = 4
		clusters := make([]*Cluster, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				clusters[i], errs[i] = provisionLocal(ctx, Options{})
			}()
		}
		wg.Wait()
		for i := range n {
			if clusters[i] != nil {
				defer clusters[i].Close()
			}
		}
		seen := map[string]bool{}
		for i := range n {
			require.NoError(t, errs[i])
			require.False(t, seen[clusters[i].URL], "duplicate URL %s", clusters[i].URL)
			seen[clusters[i].URL] = true
			require.Equal(t, clusters[i].dataDir, queryOne[string](t, ctx, clusters[i].URL, "show data_directory"))
		}
		for i := range n {
			require.NoError(t, clusters[i].Close())
		}
	})

	// A port taken between picking and binding must be reported as
	// errPortInUse (which provisionLocal retries) and leave no server.
	t.Run("port in use", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		su, err := lookupServerUser(thisMachine)
		require.NoError(t, err)
		plan, err := prepareThrowaway(bin, su)
		require.NoError(t, err)
		defer plan.removeTmp()
		require.NoError(t, runInitdb(ctx, plan))

		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close()
		srv, err := startServer(ctx, plan, l.Addr().(*net.TCPAddr).Port)
		require.ErrorIs(t, err, errPortInUse)
		require.Nil(t, srv)
	})

	// The DataDir mode used by scripts/dev: data survives a restart and
	// durability settings stay at their defaults.
	t.Run("persistent", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		// Not t.TempDir(): that is a 0700 directory owned by us, which
		// the postgres user cannot enter when the tests run as root.
		parent, err := os.MkdirTemp("", "testpg-persist-")
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(parent) })
		require.NoError(t, os.Chmod(parent, 0o755))
		dataDir := filepath.Join(parent, "pg")

		c, err := provisionLocal(ctx, Options{DataDir: dataDir, Logf: t.Logf})
		require.NoError(t, err)
		defer c.Close()
		require.Equal(t, "on", queryOne[string](t, ctx, c.URL, "show fsync"))
		conn, err := pgx.Connect(ctx, c.URL)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "create table kept (v text); insert into kept values ('hello')")
		require.NoError(t, err)
		require.NoError(t, conn.Close(ctx))
		require.NoError(t, c.Close())
		_, err = os.Stat(filepath.Join(dataDir, "PG_VERSION"))
		require.NoError(t, err, "data directory must be kept")

		c2, err := provisionLocal(ctx, Options{DataDir: dataDir, Logf: t.Logf})
		require.NoError(t, err)
		defer c2.Close()
		require.Equal(t, "hello", queryOne[string](t, ctx, c2.URL, "select v from kept"))

		// A second start on the directory in use (another scripts/dev)
		// is refused before it touches the running cluster's log.
		logPath := filepath.Join(dataDir, "postgres.log")
		before, err := os.ReadFile(logPath)
		require.NoError(t, err)
		require.NotEmpty(t, before)
		c3, err := provisionLocal(ctx, Options{DataDir: dataDir, Logf: t.Logf})
		require.ErrorContains(t, err, "is in use by a running postgres")
		require.Nil(t, c3)
		after, err := os.ReadFile(logPath)
		require.NoError(t, err)
		require.True(t, bytes.HasPrefix(after, before), "the running cluster's log was cut")
		require.NoError(t, c2.Close())
	})

	// A Crashable cluster is our own even when DATABASE_URL names a shared
	// server, acknowledges a commit only once written, and survives a crash
	// (pg_ctl stop -m immediate) and a restart on the same URL with every
	// commit it acknowledged.
	t.Run("crashable", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		c, err := Provision(ctx, Options{Crashable: true, Logf: t.Logf})
		require.NoError(t, err)
		defer c.Close()
		require.Equal(t, "local", c.source, "never DATABASE_URL's server")
		require.Equal(t, "on", queryOne[string](t, ctx, c.URL, "show synchronous_commit"))
		conn, err := pgx.Connect(ctx, c.URL)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "create table kept (v int); insert into kept select generate_series(1, 1000)")
		require.NoError(t, err)

		require.NoError(t, c.Crash(ctx))
		require.Error(t, conn.Ping(ctx), "the crash ended the session")
		_, err = pgx.Connect(ctx, c.URL)
		require.Error(t, err, "the server is down")
		require.ErrorContains(t, c.Crash(ctx), "pg_ctl", "a crashed server is not crashed again")

		require.NoError(t, c.Restart(ctx))
		require.ErrorContains(t, c.Restart(ctx), "still running")
		require.Equal(t, 1000, queryOne[int](t, ctx, c.URL, "select count(*) from kept"))
		log, err := os.ReadFile(filepath.Join(c.tmpDir, "postgres.log"))
		require.NoError(t, err)
		require.Contains(t, string(log), "database system was interrupted", "the restart ran crash recovery")
		require.Contains(t, string(log), "received immediate shutdown request", "the log is kept across restarts")
		require.NoError(t, c.Close())

		plain, err := provisionLocal(ctx, Options{})
		require.NoError(t, err)
		defer plain.Close()
		require.ErrorContains(t, plain.Crash(ctx), "only a Crashable cluster")
		require.ErrorContains(t, plain.Restart(ctx), "only a Crashable cluster")
	})

	t.Run("cancelled", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c, err := provisionLocal(ctx, Options{})
		require.ErrorIs(t, err, context.Canceled)
		require.Nil(t, c)
	})
}

func TestNoPostgresError(t *testing.T) {
	t.Parallel()
	err := noPostgresError(ErrNoBinaries, errors.New("docker daemon not reachable"))
	for _, want := range []string{"apt-get install postgresql", "Docker", "DATABASE_URL", "initdb", "docker daemon not reachable"} {
		require.Contains(t, err.Error(), want)
	}
}

// TestSweepStale checks that directories abandoned by killed processes are
// removed while live and freshly created ones are kept.
func TestSweepStale(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	old := time.Now().Add(-time.Hour)
	mk := func(name string, lock, age bool) string {
		dir := filepath.Join(parent, name)
		require.NoError(t, os.Mkdir(dir, 0o700))
		if lock {
			f, err := lockDir(dir)
			require.NoError(t, err)
			t.Cleanup(func() { f.Close() })
		} else {
			require.NoError(t, os.WriteFile(filepath.Join(dir, lockName), nil, 0o600))
		}
		if age {
			require.NoError(t, os.Chtimes(dir, old, old))
		}
		return dir
	}
	stale := mk(tmpPattern+"stale", false, true)
	live := mk(tmpPattern+"live", true, true)
	young := mk(tmpPattern+"young", false, false)
	other := mk("other-stale", false, true)

	sweepStale(parent)

	for dir, want := range map[string]bool{stale: false, live: true, young: true, other: true} {
		_, err := os.Stat(dir)
		require.Equal(t, want, err == nil, "%s exists", dir)
	}
}

// A test database's name says when it was created, so that a run can drop
// those a killed run left behind (hygiene QA: leftovers accumulated on a
// long-lived server): TestDatabaseName writes the time, which
// testDatabaseCreated reads back; a name it did not write (another
// project's, or one from before names held a time) has no age and is never
// taken for stale.
func TestTestDatabaseNamesTellTheirAge(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_796_550_000, 0)
	name := TestDatabaseName(now)
	require.Regexp(t, `^ratchet_test_1796550000_[a-z0-9]{6}$`, name)
	require.NotEqual(t, name, TestDatabaseName(now), "two runs in one second get two names")
	require.NoError(t, checkDatabaseName(TestDatabaseName(time.Unix(1<<62, 0))), "within 63 bytes")
	created, ok := testDatabaseCreated(name)
	require.True(t, ok)
	require.True(t, created.Equal(now))

	require.False(t, staleTestDatabase(name, now))
	require.False(t, staleTestDatabase(name, now.Add(StaleAfter-time.Second)))
	require.True(t, staleTestDatabase(name, now.Add(StaleAfter)))
	for _, other := range []string{"ratchet_test_k3x9qa", "ratchet_mig_k3x9qa", "postgres", "ratchet_test_",
		"ratchet_test_1796550000", "ratchet_test_1796550000_K3X9QA", "ratchet_test_1796550000_k3x9qa_x",
		"ratchet_test_01796550000_k3x9qa", "ratchet_test_-1796550000_k3x9qa", "ratchet_test__k3x9qa",
		"app_ratchet_test_1796550000_k3x9qa"} {
		_, ok := testDatabaseCreated(other)
		require.False(t, ok, other)
		require.False(t, staleTestDatabase(other, now.Add(100*StaleAfter)), other)
	}
}

// DropStaleTestDatabases drops the test databases created a day ago or
// more, and nothing else: not a younger one (a run in progress), not one
// whose name holds no time.
func TestStaleTestDatabasesAreDropped(t *testing.T) {
	t.Parallel()
	ctx, c := provisioned(t)

	now := time.Now()
	stale, young := TestDatabaseName(now.Add(-StaleAfter-time.Minute)), TestDatabaseName(now.Add(-time.Hour))
	ageless := TestDatabasePrefix + fmt.Sprintf("%06d", rand.IntN(1_000_000))
	for _, name := range []string{stale, young, ageless} {
		_, err := CreateDatabase(ctx, c.URL, name)
		require.NoError(t, err)
		t.Cleanup(func() { _ = DropDatabase(context.Background(), c.URL, name) })
	}
	dropped, err := DropStaleTestDatabases(ctx, c.URL, now)
	require.NoError(t, err)
	for _, name := range dropped {
		require.True(t, staleTestDatabase(name, now), "only stale ones are dropped: %s", name)
	}
	// Another test process may have dropped it first: what counts is that
	// it is gone.
	require.False(t, databaseExists(t, ctx, c.URL, stale), "a database a day old is dropped")
	require.True(t, databaseExists(t, ctx, c.URL, young), "a younger one is a run's in progress")
	require.True(t, databaseExists(t, ctx, c.URL, ageless), "one whose name holds no time is left alone")
}

// A database whose name reads stale but that a session still uses is a
// run's in progress: its clock a day or more behind the dropping run's
// (two machines sharing DATABASE_URL), or a run past a day (-timeout 0).
// It is left, without an error, and a later run drops it once nothing
// uses it. Dropped WITH (FORCE), the run's sessions were ended and its
// database taken from under it mid-run.
func TestAStaleNamedDatabaseInUseIsKept(t *testing.T) {
	t.Parallel()
	ctx, c := provisioned(t)
	now := time.Now()
	name := TestDatabaseName(now.Add(-StaleAfter - time.Minute))
	url, err := CreateDatabase(ctx, c.URL, name)
	require.NoError(t, err)
	t.Cleanup(func() { _ = DropDatabase(context.Background(), c.URL, name) })
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.Background())

	dropped, err := DropStaleTestDatabases(ctx, c.URL, now)
	require.NoError(t, err)
	require.NotContains(t, dropped, name)
	require.True(t, databaseExists(t, ctx, c.URL, name), "a database in use is a run's in progress")
	require.NoError(t, conn.Ping(ctx), "its session goes on")

	require.NoError(t, conn.Close(ctx))
	require.Eventually(t, func() bool { // the server ends the session's backend once it reads the close
		return queryOne[int64](t, ctx, c.URL, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, name) == 0
	}, 10*time.Second, 5*time.Millisecond, "the session has ended")
	_, err = DropStaleTestDatabases(ctx, c.URL, now)
	require.NoError(t, err)
	require.False(t, databaseExists(t, ctx, c.URL, name), "dropped once nothing uses it")
}

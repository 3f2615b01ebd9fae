package testpg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestDatabasePrefix begins the name of each database a test creates
// (TestDatabaseName).
const TestDatabasePrefix = "ratchet_test_"

// StaleAfter is how old a test database is when DropStaleTestDatabases
// takes it for one a run left behind: no package's tests run that long
// (go test stops a test binary after 10 minutes unless told otherwise).
const StaleAfter = 24 * time.Hour

// TestDatabaseName names a test database created at now: TestDatabasePrefix,
// now in Unix seconds, and six random letters and digits
// (ratchet_test_1796550000_k3x9qa). A test drops its database when it ends,
// failed or not, but a test binary that is killed (go test's -timeout, a
// panic, an interrupt) drops nothing: the time in the name is what lets a
// later run tell such a leftover from a database a run in progress uses
// (DropStaleTestDatabases). Leftovers accumulated on a long-lived server
// (DATABASE_URL) when the names held no time.
func TestDatabaseName(now time.Time) string {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789"
	suffix := make([]byte, 6)
	for i := range suffix {
		suffix[i] = chars[rand.IntN(len(chars))]
	}
	return TestDatabasePrefix + strconv.FormatInt(now.Unix(), 10) + "_" + string(suffix)
}

// testDatabaseCreated reads when the test database name was created, as
// TestDatabaseName wrote it; ok is false for any other name (another
// project's database, or a test database named before names held a time,
// whose age cannot be told).
func testDatabaseCreated(name string) (created time.Time, ok bool) {
	rest, ok := strings.CutPrefix(name, TestDatabasePrefix)
	if !ok {
		return time.Time{}, false
	}
	secs, suffix, ok := strings.Cut(rest, "_")
	if !ok || len(suffix) != 6 || strings.Trim(suffix, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(secs, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != secs {
		return time.Time{}, false
	}
	return time.Unix(n, 0), true
}

// staleTestDatabase says whether name is a test database (TestDatabaseName)
// created StaleAfter or more before now.
func staleTestDatabase(name string, now time.Time) bool {
	created, ok := testDatabaseCreated(name)
	return ok && !created.After(now.Add(-StaleAfter))
}

// DropStaleTestDatabases drops the test databases on the server behind
// adminURL that were created StaleAfter or more before now and that no
// session uses: those runs killed before they could drop theirs left
// behind (a killed run's sessions end with it). It answers the names it
// dropped; one it could not drop is skipped, its error joined to err.
// Only names TestDatabaseName writes are read: nothing else on the server
// is touched.
//
// One in use is a run's in progress whatever its name says (apitest.Main
// holds a session on its database for the whole run): its creator's clock
// a day behind this one's (two machines sharing a server), or a run past a
// day (-timeout 0). It is left, never dropped WITH (FORCE) as DropDatabase
// drops a run's own: that ended the run's sessions and took its database
// mid-run (review).
func DropStaleTestDatabases(ctx context.Context, adminURL string, now time.Time) (dropped []string, err error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("testpg: connect to admin database: %w", err)
	}
	rows, err := conn.Query(ctx, `SELECT d.datname FROM pg_database d WHERE starts_with(d.datname, $1)
		AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)`, TestDatabasePrefix)
	var names []string
	if err == nil {
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	conn.Close(context.Background())
	if err != nil {
		return nil, fmt.Errorf("testpg: list test databases: %w", err)
	}
	var errs []error
	for _, name := range names {
		if !staleTestDatabase(name, now) {
			continue
		}
		ok, err := dropUnused(ctx, adminURL, name)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			dropped = append(dropped, name)
		}
	}
	return dropped, errors.Join(errs...)
}

// dropUnused drops database name unless a session uses it (one that
// connected since the list was read): ok is false, with no error, when it
// is in use (the server waits up to five seconds for its sessions to end
// before it answers so).
func dropUnused(ctx context.Context, adminURL, name string) (ok bool, err error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return false, fmt.Errorf("testpg: connect to admin database: %w", err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" /* object_in_use */ {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("testpg: drop database %q: %w", name, err)
	}
	return true, nil
}

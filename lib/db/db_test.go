package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
)

// A statement whose context ends is cancelled on the server, not only
// abandoned by the client: behind a pooler, where no statement_timeout can
// be sent, this is what bounds it (and frees its locks). The pool opens
// without a statement_timeout by default.
func TestAnEndedContextCancelsTheStatementOnTheServer(t *testing.T) {
	t.Parallel()
	url := apitest.DatabaseURL(t)
	pool, err := db.Open(context.Background(), &config.Config{DatabaseURL: url, DBMaxConns: 2,
		DBMaxConnIdleTime: time.Minute, DBConnectTimeout: 5 * time.Second, DBQueryExecMode: "exec"})
	require.NoError(t, err)
	defer pool.Close()

	var timeout string
	require.NoError(t, pool.QueryRow(context.Background(), `SHOW statement_timeout`).Scan(&timeout))
	require.Equal(t, "0", timeout, "no startup parameter a pooler would refuse")

	const marker = "ratchet_cancel_probe_7f3a"
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	opened := pool.Stat().NewConnsCount()
	_, err = pool.Exec(ctx, `SELECT pg_sleep(30), '`+marker+`'`)
	require.Error(t, err)
	// The connection is closed with its statement (keeping it with a cancel
	// request alone crashed PgBouncer 1.18), and the pool serves the next
	// query on a new one.
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT 1`).Scan(new(int)))
	require.Equal(t, opened+1, pool.Stat().NewConnsCount(), "the ended statement's connection was closed")

	// The server stopped running it (it would otherwise sleep on for 30 s).
	admin, err := db.Open(context.Background(), &config.Config{DatabaseURL: url, DBMaxConns: 1,
		DBMaxConnIdleTime: time.Minute, DBConnectTimeout: 5 * time.Second, DBQueryExecMode: "exec"})
	require.NoError(t, err)
	defer admin.Close()
	require.Eventually(t, func() bool {
		var running int
		err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE '%'||$1||'%' AND pid <> pg_backend_pid()`, marker).Scan(&running)
		return err == nil && running == 0
	}, 5*time.Second, 50*time.Millisecond)
}

// openOne opens a pool of one connection over url in exec mode mode,
// closed when the test ends.
func openOne(t *testing.T, url, mode string) *pgxpool.Pool {
	t.Helper()
	pool, err := db.Open(context.Background(), &config.Config{DatabaseURL: url, DBMaxConns: 1,
		DBMaxConnIdleTime: time.Minute, DBConnectTimeout: 5 * time.Second, DBQueryExecMode: mode})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Every timestamptz a pool scans is in UTC, in every exec mode (simple
// protocol reads text, the others binary): pgx would scan it in the
// process's local zone, and on a host whose zone is not UTC the API
// answered "-05:00" timestamps where API.md promises UTC (QA). Location is
// compared, not the rendering, so the test fails on a UTC host too
// (time.Local is not time.UTC even there).
func TestTimestampsScanInUTCWhateverTheHostsZone(t *testing.T) {
	t.Parallel()
	url := apitest.DatabaseURL(t)
	for _, mode := range []string{"exec", "simple_protocol", "cache_statement", "cache_describe", "describe_exec"} {
		t.Run(mode, func(t *testing.T) {
			pool := openOne(t, url, mode)
			var now time.Time
			var given, null *time.Time
			in := time.Date(2026, 12, 3, 0, 34, 36, 0, time.FixedZone("EST", -5*3600))
			require.NoError(t, pool.QueryRow(context.Background(), `SELECT now(), $1::timestamptz, NULL::timestamptz`, in).
				Scan(&now, &given, &null))
			require.Equal(t, time.UTC, now.Location())
			require.Equal(t, time.UTC, given.Location())
			require.True(t, given.Equal(in), "the same instant: %s", given)
			require.Nil(t, null)
		})
	}
}

// A database or role whose DateStyle is not ISO ('SQL, DMY' below, set as
// the connection's options, which rank as a role's setting would under the
// startup parameters) still reads its times: pgx parses ISO output only,
// and every statement answering a time failed, in every exec mode (QA).
func TestTimesReadWhateverTheDatabasesDateStyle(t *testing.T) {
	t.Parallel()
	url := withOptions(apitest.DatabaseURL(t), "DateStyle=SQL,DMY")
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			pool := openOne(t, url, mode)
			var at time.Time
			require.NoError(t, pool.QueryRow(context.Background(), `SELECT '2026-12-03 05:49:01.5+00'::timestamptz`).Scan(&at))
			require.True(t, at.Equal(time.Date(2026, 12, 3, 5, 49, 1, 500_000_000, time.UTC)), "read %s", at)
		})
	}
}

// A database or role talking another client encoding, or with
// standard_conforming_strings off, still works in the simple protocol
// (pgx refuses both there: every statement failed, QA), and text is sent
// as UTF-8, which a LATIN1 database converts or refuses rather than
// storing its bytes one character each.
func TestSessionsTalkUTF8WithStandardStrings(t *testing.T) {
	t.Parallel()
	pool := openOne(t, withOptions(apitest.DatabaseURL(t), "client_encoding=LATIN1", "standard_conforming_strings=off"), "simple_protocol")
	var encoding, text string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT current_setting('client_encoding'), $1::text`, "ws 日本 ✓").
		Scan(&encoding, &text))
	require.Equal(t, "UTF8", encoding)
	require.Equal(t, "ws 日本 ✓", text)
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// tinyScale runs every figure with just enough work to exercise its code
// path, so the benchmark cannot rot between full runs. The Lambda build is
// left to scripts/test, which runs scripts/build-lambda itself.
var tinyScale = scale{
	Clients: 4, Requests: 40, Jobs: 50, Workers: 4, InsertJobs: 20,
	ClaimQueued: []int{10, 100}, ClaimSamples: 5, E2ESamples: 3, History: 300, ColdStarts: 1, Burst: 8,
	IdleWindow: time.Second, LambdaBuild: false, ProcessStart: true,
}

// TestFiguresSmoke runs the whole Ratchet suite at tiny scale against the
// package's database and checks the output is what scripts/bench parses: one
// `name value` line per measured figure with a positive number, `#` comments
// otherwise. It asserts no speed, only that the figures exist and that one
// instance never holds more connections than its pool allows.
//
// Not parallel: benchConfig fills the required settings from the
// environment, as the command does.
func TestFiguresSmoke(t *testing.T) {
	t.Setenv("RESULT_ENCRYPTION_KEY", "")
	t.Setenv("KEY_HASH_SECRET", "")
	t.Setenv("DATABASE_URL", "")
	cfg, err := benchConfig(apitest.DatabaseURL(t))
	require.NoError(t, err)
	require.EqualValues(t, 4, cfg.DBMaxConns, "the figure must describe the default pool")

	var out bytes.Buffer
	b := &bench{scale: tinyScale, cfg: cfg, out: &out, log: io.Discard}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	require.NoError(t, b.runFigures(ctx, nil))

	values := map[string]float64{}
	var comments []string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			comments = append(comments, line)
			continue
		}
		fields := strings.Fields(line)
		require.Len(t, fields, 2, "line %q", line)
		v, err := strconv.ParseFloat(fields[1], 64)
		require.NoError(t, err, "line %q", line)
		require.Positive(t, v, "line %q", line)
		values[fields[0]] = v
	}
	for _, name := range []string{
		"ratchet.serverless.cold_start_inprocess_ms", "ratchet.serverless.cold_start_ms",
		"ratchet.serverless.db_conns_max", "ratchet.serverless.db_conns_burst",
		"ratchet.jobs.enqueue_per_s", "ratchet.jobs.work_jobs_per_s", "ratchet.jobs.insert_and_work_jobs_per_s",
		"ratchet.jobs.claim_p50_ms_10", "ratchet.jobs.claim_p50_ms_100", "ratchet.jobs.e2e_p50_ms", "ratchet.jobs.e2e_p99_ms",
		"ratchet.jobs.e2e_cross_instance_p50_ms", "ratchet.jobs.e2e_cross_instance_p99_ms",
		"ratchet.serverless.idle_claims_10min", "ratchet.jobs.reclaim_after_timeout_s",
	} {
		require.Contains(t, values, name)
	}
	require.LessOrEqual(t, values["ratchet.serverless.db_conns_burst"], values["ratchet.serverless.db_conns_max"])
	// The claim figure's diagnostics: each depth timed from a checkpoint
	// (the test's role may take one) with its io line.
	joined := strings.Join(comments, "\n")
	require.Contains(t, joined, "# claim io 10: per claim and report: WAL ")
	require.Contains(t, joined, "# claim io 100: per claim and report: WAL ")
	require.NotContains(t, joined, "CHECKPOINT refused")
}

// TestOnlySelectsByPrefix checks -only, which the lead's per-figure runs use.
func TestOnlySelectsByPrefix(t *testing.T) {
	t.Parallel()
	require.True(t, selected("ratchet.jobs.work", nil))
	require.True(t, selected("ratchet.jobs.work", []string{"ratchet.gate", "ratchet.jobs"}))
	require.False(t, selected("ratchet.serverless.db_conns", []string{"ratchet.jobs"}))
}

func TestPercentileNearestRank(t *testing.T) {
	t.Parallel()
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(101-i)*time.Millisecond)
	}
	require.Equal(t, 50*time.Millisecond, percentile(d, 50))
	require.Equal(t, 99*time.Millisecond, percentile(d, 99))
	require.Equal(t, 100*time.Millisecond, percentile(d, 100))
	require.Equal(t, time.Duration(0), percentile(nil, 50))
}

// cloneRows copies every column it is not told to override, whatever the
// table's columns are, so seeds stay right when migrations add columns.
func TestCloneRowsKeepsEveryOtherColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer pool.Close()
	// Dropped first too: go test -count runs this again in the same database.
	_, err = pool.Exec(ctx, `DROP TABLE IF EXISTS bench_clone_test;
		CREATE TABLE bench_clone_test (id text PRIMARY KEY, ws text NOT NULL, key text NOT NULL,
		sealed bytea, doc jsonb, n int NOT NULL, at timestamptz NOT NULL DEFAULT now(), UNIQUE (ws, key));
		INSERT INTO bench_clone_test (id, ws, key, sealed, doc, n) VALUES
		('a', 'w1', 'k1', '\x0102', '{"x":1}', 1), ('b', 'w1', 'k2', NULL, NULL, 2), ('c', 'w2', 'k1', '\x03', '[]', 3)`)
	require.NoError(t, err)

	n, err := cloneRows(ctx, pool, "bench_clone_test", 3, "s.ws = $1",
		map[string]string{"id": "s.id || '-h' || g", "key": "s.key || ':h' || g"}, "w1")
	require.NoError(t, err)
	require.EqualValues(t, 6, n)
	require.NoError(t, analyze(ctx, pool, "bench_clone_test"))

	var sealed []byte
	var doc string
	var num int
	require.NoError(t, pool.QueryRow(ctx, `SELECT sealed, doc::text, n FROM bench_clone_test WHERE id = 'a-h3' AND key = 'k1:h3'`).
		Scan(&sealed, &doc, &num))
	require.Equal(t, []byte{1, 2}, sealed)
	require.Equal(t, `{"x": 1}`, doc)
	require.Equal(t, 1, num)
	var total, w2 int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE ws = 'w2') FROM bench_clone_test`).Scan(&total, &w2))
	require.Equal(t, 9, total)
	require.Equal(t, 1, w2, "rows outside the filter are not copied")
	_, err = pool.Exec(ctx, `DROP TABLE bench_clone_test`)
	require.NoError(t, err)
}

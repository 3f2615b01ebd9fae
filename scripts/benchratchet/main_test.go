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

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// tinyScale runs every figure with just enough work to exercise its code
// path, so the benchmark cannot rot between full runs. The Lambda build is
// left to scripts/test, which runs scripts/build-lambda itself.
var tinyScale = scale{
	Clients: 4, Requests: 40, Jobs: 50, Workers: 4, InsertJobs: 20,
	ClaimQueued: []int{10, 100}, History: 100, ColdStarts: 1, Burst: 8,
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
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
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
	} {
		require.Contains(t, values, name)
	}
	require.LessOrEqual(t, values["ratchet.serverless.db_conns_burst"], values["ratchet.serverless.db_conns_max"])
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

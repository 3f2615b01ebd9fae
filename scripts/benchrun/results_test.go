package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseOutputTakesFiguresAndComments(t *testing.T) {
	t.Parallel()
	values, comments, err := parseOutput(strings.NewReader(
		"# river v0.51.2 jobs=10\nriver.work_jobs_per_s 9300\n\n# TODO ratchet.x: later\nriver.insert_jobs_per_s 2100.5\n"))
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"river.work_jobs_per_s": 9300, "river.insert_jobs_per_s": 2100.5}, values)
	require.Equal(t, []string{"# river v0.51.2 jobs=10", "# TODO ratchet.x: later"}, comments)
}

func TestParseOutputRefusesGarbage(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"river.work_jobs_per_s\n", "river.work_jobs_per_s fast\n", "a 1\na 2\n", "some log line here\n"} {
		_, _, err := parseOutput(strings.NewReader(in))
		require.Error(t, err, "input %q", in)
	}
}

// Ratios are taken within a round and only then summarised: a round missing
// either side contributes nothing.
func TestRatiosAreWithinRoundsThenMedian(t *testing.T) {
	t.Parallel()
	outs := []output{
		{Suite: "river", Round: 1, Values: map[string]float64{"river.work_jobs_per_s": 10_000}},
		{Suite: "ratchet", Round: 1, Values: map[string]float64{"ratchet.jobs.work_jobs_per_s": 12_000}},
		{Suite: "river", Round: 2, Values: map[string]float64{"river.work_jobs_per_s": 5_000}},
		{Suite: "ratchet", Round: 2, Values: map[string]float64{"ratchet.jobs.work_jobs_per_s": 5_500}},
		{Suite: "river", Round: 3, Values: map[string]float64{"river.work_jobs_per_s": 9_000}},
		{Suite: "ratchet", Round: 3, Err: errors.New("boom")},
	}
	tb := newTable(3, outs)
	r := tb.ratioValues("ratchet.jobs.work_jobs_per_s", "river.work_jobs_per_s")
	require.InDelta(t, 1.2, *r[0], 1e-9)
	require.InDelta(t, 1.1, *r[1], 1e-9)
	require.Nil(t, r[2])
	m, ok := median(r)
	require.True(t, ok)
	require.InDelta(t, 1.15, m, 1e-9)

	m, ok = median(tb.Values["river.work_jobs_per_s"])
	require.True(t, ok)
	require.Equal(t, 9_000.0, m)

	var buf bytes.Buffer
	tb.writeTables(&buf)
	out := buf.String()
	require.Contains(t, out, "| `river.work_jobs_per_s` | 10000 | 5000 | 9000 | **9000** |")
	require.Contains(t, out, "`ratchet.jobs.work_jobs_per_s` / `river.work_jobs_per_s` | 1.20× | 1.10× | — | **1.15×** |")
	require.Contains(t, out, "Ratios waiting for a figure:")
	require.Less(t, strings.Index(out, "ratchet.jobs.work_jobs_per_s` |"), strings.Index(out, "river.work_jobs_per_s` |"),
		"Ratchet's figures come first")
}

func TestReportListsTodosAndFailures(t *testing.T) {
	t.Parallel()
	outs := []output{
		{Suite: "ratchet", Round: 1, Values: map[string]float64{}, Comments: []string{"# TODO ratchet.gate.cycles_per_s: not yet", "# ratchet clients=16"}},
		{Suite: "ratchet", Round: 2, Values: map[string]float64{}, Comments: []string{"# TODO ratchet.gate.cycles_per_s: not yet"}},
	}
	var buf bytes.Buffer
	writeReport(&buf, []string{"machine: test"}, 2, outs, []string{"round 2 river: exit status 1"})
	out := buf.String()
	require.Equal(t, 1, strings.Count(out, "- ratchet.gate.cycles_per_s: not yet"))
	require.Contains(t, out, "### FAILED\n\n- round 2 river: exit status 1")
	require.Contains(t, out, "round 1 ratchet  # ratchet clients=16")
}

// Every suite's command line exists, and -quick reaches every suite.
func TestSuiteCommandsPassQuick(t *testing.T) {
	t.Parallel()
	for name, cmd := range suiteCommands {
		full, quick := cmd("postgres://x/db", false), cmd("postgres://x/db", true)
		require.Contains(t, full, "postgres://x/db", name)
		require.Greater(t, len(quick), len(full), name)
	}
}

func TestShellQuoteRoundTrips(t *testing.T) {
	t.Parallel()
	require.Equal(t, `scripts/bench -rounds 5 -note 'it'\''s noisy'`, shellQuote([]string{"scripts/bench", "-rounds", "5", "-note", "it's noisy"}))
}

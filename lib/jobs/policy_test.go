package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

// The seed's example: six attempts, 10 s initial, ×2, 600 s cap, ±20%.
var seedPolicy = jobs.RetryPolicy{Preset: jobs.PresetCustom, MaxAttempts: 6, InitialDelayMs: 10_000, Multiplier: 2,
	MaxDelayMs: 600_000, JitterPercent: 20}

func TestSeedRetrySchedule(t *testing.T) {
	t.Parallel()
	nominal := []float64{10_000, 20_000, 40_000, 80_000, 160_000}
	for n := 1; n <= 5; n++ {
		require.Equal(t, nominal[n-1], seedPolicy.NominalDelay(n), "failure %d", n)
		// u=0.5 is the jitter-free midpoint; u in [0,1) spans ±20%.
		require.Equal(t, time.Duration(nominal[n-1])*time.Millisecond, seedPolicy.Delay(n, 0.5))
		lo := time.Duration(nominal[n-1]*0.8) * time.Millisecond
		hi := time.Duration(nominal[n-1]*1.2) * time.Millisecond
		require.Equal(t, lo, seedPolicy.Delay(n, 0))
		for _, u := range []float64{0, 0.1, 0.37, 0.5, 0.99, 0.999999} {
			d := seedPolicy.Delay(n, u)
			require.GreaterOrEqual(t, d, lo)
			require.LessOrEqual(t, d, hi)
			require.Zero(t, d%time.Millisecond, "rounded to milliseconds")
		}
	}
}

func TestCapAppliesBeforeJitterAndFinalLimitIs24h(t *testing.T) {
	t.Parallel()
	// STANDARD: 30 s doubling, capped at 15 min before jitter.
	std := jobs.Presets[jobs.PresetStandard]
	require.Equal(t, float64(30_000), std.NominalDelay(1))
	require.Equal(t, float64(480_000), std.NominalDelay(5))
	require.Equal(t, float64(900_000), std.NominalDelay(6))
	require.Equal(t, float64(900_000), std.NominalDelay(60)) // no overflow
	require.Equal(t, 1080*time.Second, std.Delay(9, 0.9999999999))
	require.Equal(t, 720*time.Second, std.Delay(9, 0))

	day := jobs.RetryPolicy{Preset: jobs.PresetCustom, MaxAttempts: 10, InitialDelayMs: 86_400_000, Multiplier: 1,
		MaxDelayMs: 86_400_000, JitterPercent: 50}
	require.Equal(t, 24*time.Hour, day.Delay(1, 0.99), "jitter never pushes beyond 24 h")
	require.Equal(t, 12*time.Hour, day.Delay(1, 0))
}

func TestPresets(t *testing.T) {
	t.Parallel()
	for name, want := range map[string][3]int64{
		jobs.PresetStandard:   {5, 30_000, 900_000},
		jobs.PresetAggressive: {8, 5_000, 300_000},
		jobs.PresetRelaxed:    {3, 120_000, 1_800_000},
	} {
		p := jobs.Presets[name]
		require.Equal(t, want, [3]int64{int64(p.MaxAttempts), p.InitialDelayMs, p.MaxDelayMs}, name)
		require.Equal(t, 2.0, p.Multiplier, name)
		require.Equal(t, 20.0, p.JitterPercent, name)
	}
}

func TestRetryAfterIsAnUnjitteredFloor(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Policy delay after failure 1 is 8-12 s; a 60 s hint wins, unjittered.
	require.Equal(t, now.Add(60*time.Second), seedPolicy.NextDue(now, 1, ptr[int64](60_000), 0.99))
	// A hint below the jittered delay does not shorten it.
	require.Equal(t, now.Add(12*time.Second), seedPolicy.NextDue(now, 1, ptr[int64](1_000), 1))
	// Never beyond 24 h.
	require.Equal(t, now.Add(24*time.Hour), seedPolicy.NextDue(now, 1, ptr[int64](86_400_000), 0.5))
	require.Equal(t, now.Add(10*time.Second), seedPolicy.NextDue(now, 1, nil, 0.5))
}

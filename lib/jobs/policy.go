package jobs

import (
	"math"
	"time"
)

// Retry presets (seed 001): attempts include the first execution; built-ins
// double their delay, with ±20% jitter applied after the cap.
const (
	PresetStandard   = "STANDARD"
	PresetAggressive = "AGGRESSIVE"
	PresetRelaxed    = "RELAXED"
	PresetCustom     = "CUSTOM"
)

// Policy limits (API.md §3.2 and §5).
const (
	MinAttempts      = 1
	MaxAttemptsLimit = 10
	MaxDelayLimitMs  = 86_400_000 // the final delay is never more than 24 h
	MinRetryAfterMs  = 1_000
	MaxRetryAfterMs  = 86_400_000
	MinTimeoutMs     = 1_000
	MaxTimeoutMs     = 86_400_000
	DefaultTimeoutMs = 30_000
	// MaxEnqueueDelayMs bounds an enqueue's delayMs: 30 days.
	MaxEnqueueDelayMs = 2_592_000_000
	// A claim leases at most MaxClaimLimit jobs (DefaultClaimLimit when it
	// names no limit) and waits at most MaxClaimWaitSeconds for one (API.md
	// §3.1; none when it names no wait).
	MaxClaimLimit       = 100
	DefaultClaimLimit   = 1
	MaxClaimWaitSeconds = 20
	MaxMultiplier       = 10
	MaxJitterPercent    = 100
	MaxConcurrentMax    = 1000
	RateLimitMax        = 100_000
	// The endpoint circuit breaker (migration 0018).
	CircuitThresholdMax      = 1000
	MinCircuitCooldownMs     = 1_000
	DefaultCircuitCooldownMs = 60_000
	maxDelayDuration         = time.Duration(MaxDelayLimitMs) * time.Millisecond
	defaultJitterPct         = 20
	defaultMultiplier        = 2
)

// RetryPolicy is a complete retry schedule. For built-in presets it is the
// preset's expansion; CUSTOM carries the caller's values.
type RetryPolicy struct {
	Preset         string  `json:"preset" openapi:"enum=STANDARD|AGGRESSIVE|RELAXED|CUSTOM"`
	MaxAttempts    int     `json:"maxAttempts"`
	InitialDelayMs int64   `json:"initialDelayMs"`
	Multiplier     float64 `json:"multiplier"`
	MaxDelayMs     int64   `json:"maxDelayMs"`
	JitterPercent  float64 `json:"jitterPercent"`
}

// Presets are the built-in schedules.
var Presets = map[string]RetryPolicy{
	PresetStandard:   {PresetStandard, 5, 30_000, defaultMultiplier, 15 * 60_000, defaultJitterPct},
	PresetAggressive: {PresetAggressive, 8, 5_000, defaultMultiplier, 5 * 60_000, defaultJitterPct},
	PresetRelaxed:    {PresetRelaxed, 3, 120_000, defaultMultiplier, 30 * 60_000, defaultJitterPct},
}

// NominalDelay is the delay after failure number n (1-based) before jitter:
// min(maxDelayMs, initialDelayMs * multiplier^(n-1)).
func (p RetryPolicy) NominalDelay(n int) float64 {
	if n < 1 {
		n = 1
	}
	d := float64(p.InitialDelayMs) * math.Pow(p.Multiplier, float64(n-1))
	if math.IsInf(d, 0) || math.IsNaN(d) || d > float64(p.MaxDelayMs) {
		d = float64(p.MaxDelayMs)
	}
	return d
}

// Delay is the delay after failure n with jitter applied: the nominal delay
// times a factor in [1-j, 1+j] chosen by u (uniform in [0,1)), rounded to
// milliseconds and never beyond 24 hours.
func (p RetryPolicy) Delay(n int, u float64) time.Duration {
	j := p.JitterPercent / 100
	factor := 1 - j + 2*j*u
	ms := math.Round(p.NominalDelay(n) * factor)
	if ms < 0 {
		ms = 0
	}
	d := time.Duration(ms) * time.Millisecond
	return min(d, maxDelayDuration)
}

// NextDue is when the attempt after failure n is due: now plus the greater
// of the jittered policy delay and the worker's retryAfterMs floor (never
// jittered), limited to 24 hours.
func (p RetryPolicy) NextDue(now time.Time, n int, retryAfterMs *int64, u float64) time.Time {
	d := p.Delay(n, u)
	if retryAfterMs != nil {
		d = max(d, time.Duration(*retryAfterMs)*time.Millisecond)
	}
	return now.Add(min(d, maxDelayDuration)).Truncate(time.Millisecond)
}

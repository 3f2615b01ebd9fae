package config

import (
	"encoding/base64"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func validEnv(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@localhost:5432/db")
	t.Setenv("RESULT_ENCRYPTION_KEY", base64.StdEncoding.EncodeToString(make([]byte, 32)))
	t.Setenv("KEY_HASH_SECRET", "0123456789abcdef0123")
	for _, name := range []string{"RESULT_ENCRYPTION_KEYS", "SIGNUP_MODE", "SIGNUP_TOKEN", "CRON_SECRET", "PORT", "BIND_ADDRESS", "DB_QUERY_EXEC_MODE", "DB_MAX_CONNS", "BILLING_MODE",
		"SWEEP_INTERVAL", "KEY_CACHE_TTL", "JOB_LEASE_GRACE_MS", "SIGNUP_RATE_PER_HOUR", "DB_STATEMENT_TIMEOUT",
		"DB_ACQUIRE_TIMEOUT", "JOB_RETENTION_DAYS", "EVENT_RETENTION_DAYS"} {
		unset(t, name)
	}
}

// unset removes name for the test and restores it afterwards.
func unset(t *testing.T, name string) {
	t.Setenv(name, "")
	require.NoError(t, os.Unsetenv(name))
}

func TestLoadDefaults(t *testing.T) {
	validEnv(t)
	c, err := Load()
	require.NoError(t, err)
	require.Equal(t, 8787, c.Port)
	require.Equal(t, "127.0.0.1", c.BindAddress, "the local server is not reachable from the network by default")
	require.Equal(t, "open", c.SignupMode)
	require.Equal(t, "exec", c.DBQueryExecMode)
	require.EqualValues(t, 4, c.DBMaxConns)
	require.Zero(t, c.DBStatementTimeout, "no startup parameter a pooler would refuse")
	require.Zero(t, c.DBAcquireTimeout, "a request waits for a connection until its deadline")
	require.Equal(t, c.DatabaseURL, c.MigrationURL())
	require.Equal(t, 90, c.JobRetentionDays)
	require.Equal(t, 30, c.EventRetentionDays)
	// API.md §5: open signup has no throttle unless SIGNUP_RATE_PER_HOUR is
	// set; metering is off unless BILLING_MODE turns it on; the local server
	// sweeps every 5 s; a job lease's grace is 10 000 ms.
	require.Zero(t, c.SignupRatePerHour)
	require.Equal(t, "off", c.BillingMode)
	require.Equal(t, 5*time.Second, c.SweepInterval)
	require.EqualValues(t, 10_000, c.JobLeaseGraceMs)
}

// A long-running server sizes its pool for concurrent requests unless
// DB_MAX_CONNS says otherwise; serverless keeps the default of 4.
func TestSizeForServer(t *testing.T) {
	validEnv(t)
	c, err := Load()
	require.NoError(t, err)
	c.SizeForServer()
	require.EqualValues(t, ServerDBMaxConns, c.DBMaxConns)

	t.Setenv("DB_MAX_CONNS", "4")
	c, err = Load()
	require.NoError(t, err)
	c.SizeForServer()
	require.EqualValues(t, 4, c.DBMaxConns)
	require.Zero(t, c.DBStatementTimeout, "no startup parameter a pooler would refuse")
}

// A short shared secret works (deployments run with one) but is warned
// about, by name only.
func TestShortSharedSecretsAreWarnedAbout(t *testing.T) {
	validEnv(t)
	c, err := Load()
	require.NoError(t, err)
	require.Empty(t, c.Warnings())
	t.Setenv("CRON_SECRET", "abc123")
	t.Setenv("SIGNUP_MODE", "token")
	t.Setenv("SIGNUP_TOKEN", "letmein")
	c, err = Load()
	require.NoError(t, err)
	w := c.Warnings()
	require.Len(t, w, 2)
	require.Contains(t, w[0], "CRON_SECRET is shorter than 16 characters")
	require.Contains(t, w[1], "SIGNUP_TOKEN is shorter than 16 characters")
	for _, line := range w {
		require.NotContains(t, line, "abc123")
		require.NotContains(t, line, "letmein")
	}
	t.Setenv("CRON_SECRET", "0123456789abcdef")
	t.Setenv("SIGNUP_TOKEN", "0123456789abcdef")
	c, err = Load()
	require.NoError(t, err)
	require.Empty(t, c.Warnings())
	// Padded to 16 with whitespace, which the cron route does not compare.
	t.Setenv("CRON_SECRET", "abc123         \n")
	c, err = Load()
	require.NoError(t, err)
	w = c.Warnings()
	require.Len(t, w, 1)
	require.Contains(t, w[0], "CRON_SECRET is shorter than 16 characters")
}

// SIGNUP_TOKEN is compared without the whitespace around it, which no
// header carries: whitespace alone is no token, refused at start as an
// unset one is, and a token padded to 16 with it is warned of as short
// (QA: "   " passed as set, and every signup was refused).
func TestSignupTokenIsTrimmed(t *testing.T) {
	validEnv(t)
	t.Setenv("SIGNUP_MODE", "token")
	t.Setenv("SIGNUP_TOKEN", " \n\t ")
	_, err := Load()
	require.ErrorContains(t, err, "SIGNUP_TOKEN is required when SIGNUP_MODE=token")
	t.Setenv("SIGNUP_TOKEN", "letmein         \n")
	c, err := Load()
	require.NoError(t, err)
	require.Equal(t, "letmein", c.SignupBearer())
	w := c.Warnings()
	require.Len(t, w, 1)
	require.Contains(t, w[0], "SIGNUP_TOKEN is shorter than 16 characters")
}

func TestLoadNamesTheBadSetting(t *testing.T) {
	cases := map[string]struct{ name, value, want string }{
		"missing db":      {"DATABASE_URL", "", "DATABASE_URL is required"},
		"bad db":          {"DATABASE_URL", "mysql://x", "DATABASE_URL is malformed"},
		"missing enc":     {"RESULT_ENCRYPTION_KEY", "", "RESULT_ENCRYPTION_KEY is required"},
		"short enc":       {"RESULT_ENCRYPTION_KEY", base64.StdEncoding.EncodeToString(make([]byte, 16)), "RESULT_ENCRYPTION_KEY is malformed"},
		"bad old enc":     {"RESULT_ENCRYPTION_KEYS", "nope", "RESULT_ENCRYPTION_KEYS entry 1 is malformed"},
		"short hash":      {"KEY_HASH_SECRET", "short", "KEY_HASH_SECRET is malformed"},
		"bad port":        {"PORT", "eighty", "PORT is malformed"},
		"secret in port":  {"PORT", "zqleak_port_secret", "PORT is malformed (want int: invalid syntax)"},
		"secret in bool":  {"AUTO_MIGRATE", "zqleak_bool_secret", "AUTO_MIGRATE is malformed (want bool: invalid syntax)"},
		"secret in conns": {"DB_MAX_CONNS", "zqleak_conns_secret", "DB_MAX_CONNS is malformed (want int32: invalid syntax)"},
		"huge conns":      {"DB_MAX_CONNS", "99999999999", "DB_MAX_CONNS is malformed (want int32: value out of range)"},
		"secret in dur":   {"SWEEP_INTERVAL", "zqleak_dur_secret", "SWEEP_INTERVAL is malformed (want a duration, e.g. 5s)"},
		"bad host":        {"BIND_ADDRESS", "every interface", "BIND_ADDRESS is malformed"},
		"bad signup":      {"SIGNUP_MODE", "maybe", "SIGNUP_MODE is malformed"},
		"token no secret": {"SIGNUP_MODE", "token", "SIGNUP_TOKEN is required"},
		"bad mode":        {"DB_QUERY_EXEC_MODE", "fast", "DB_QUERY_EXEC_MODE is malformed"},
		"billing":         {"BILLING_MODE", "on", "BILLING_MODE is malformed"},
		"no sweep":        {"SWEEP_INTERVAL", "0s", "SWEEP_INTERVAL is malformed"},
		"negative sweep":  {"SWEEP_INTERVAL", "-5s", "SWEEP_INTERVAL is malformed"},
		"negative ttl":    {"KEY_CACHE_TTL", "-1s", "KEY_CACHE_TTL is malformed"},
		"endless ttl":     {"KEY_CACHE_TTL", "5m1s", "KEY_CACHE_TTL is malformed (0 to 5m0s: a revoked key"},
		"negative grace":  {"JOB_LEASE_GRACE_MS", "-1", "JOB_LEASE_GRACE_MS is malformed"},
		"endless grace":   {"JOB_LEASE_GRACE_MS", "3600001", "JOB_LEASE_GRACE_MS is malformed (0 to 3600000, an hour)"},
		"negative signup": {"SIGNUP_RATE_PER_HOUR", "-3", "SIGNUP_RATE_PER_HOUR is malformed"},
		"no timeout":      {"DB_STATEMENT_TIMEOUT", "-1s", "DB_STATEMENT_TIMEOUT is malformed"},
		"no acquire":      {"DB_ACQUIRE_TIMEOUT", "-1s", "DB_ACQUIRE_TIMEOUT is malformed"},
		"negative runs":   {"JOB_RETENTION_DAYS", "-1", "JOB_RETENTION_DAYS is malformed"},
		"eternal events":  {"EVENT_RETENTION_DAYS", "3651", "EVENT_RETENTION_DAYS is malformed"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			validEnv(t)
			if tc.value == "" {
				unset(t, tc.name)
			} else {
				t.Setenv(tc.name, tc.value)
			}
			_, err := Load()
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			require.NotContains(t, err.Error(), "\n", "one line")
			if tc.value != "" && len(tc.value) > 6 {
				require.False(t, strings.Contains(err.Error(), tc.value), "never echo the value")
			}
		})
	}
}

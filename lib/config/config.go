// Package config reads the service's settings from the environment with
// envconfig. Start-up fails with one line naming the first missing or
// malformed setting, never with a stack of unrelated errors.
package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/getratchet/ratchet/lib/seal"
)

// Config holds every setting. Defaults suit a serverless instance: a tiny
// pool, short idle time and a query mode that works behind transaction-mode
// poolers.
type Config struct {
	DatabaseURL string `envconfig:"DATABASE_URL" required:"true"`
	// MigrationDatabaseURL is a direct (non-pooled) URL for migrations;
	// defaults to DatabaseURL.
	MigrationDatabaseURL string `envconfig:"MIGRATION_DATABASE_URL"`

	// ResultEncryptionKey is the current AES-256 key (base64, 32 bytes).
	ResultEncryptionKey string `envconfig:"RESULT_ENCRYPTION_KEY" required:"true"`
	// ResultEncryptionKeys are other keys, comma separated, accepted for
	// decryption only: older keys during a rotation, and the next key before
	// it seals (README, "Rotating RESULT_ENCRYPTION_KEY").
	ResultEncryptionKeys []string `envconfig:"RESULT_ENCRYPTION_KEYS"`
	// KeyHashSecret keys the HMAC under which API keys (and dimension values)
	// are stored.
	KeyHashSecret string `envconfig:"KEY_HASH_SECRET" required:"true"`
	CronSecret    string `envconfig:"CRON_SECRET"`

	SignupMode        string `envconfig:"SIGNUP_MODE" default:"open"`
	SignupToken       string `envconfig:"SIGNUP_TOKEN"`
	SignupRatePerHour int    `envconfig:"SIGNUP_RATE_PER_HOUR"`
	BillingMode       string `envconfig:"BILLING_MODE" default:"off"`

	Port int `envconfig:"PORT" default:"8787"`
	// BindAddress is the address the local server listens on: the loopback one by
	// default, so a development server with open signup is not reachable
	// from the network it sits on (QA: it listened on every interface
	// while saying localhost). 0.0.0.0 serves every interface (a container).
	// Not HOST, which some shells and CI set to the machine's name.
	BindAddress string `envconfig:"BIND_ADDRESS" default:"127.0.0.1"`

	DBMaxConns        int32         `envconfig:"DB_MAX_CONNS" default:"4"`
	DBMaxConnIdleTime time.Duration `envconfig:"DB_MAX_CONN_IDLE_TIME" default:"30s"`
	// DBQueryExecMode: exec (default; one round trip, no server-side prepared
	// statements, safe behind PgBouncer/Neon/Supabase transaction poolers),
	// simple_protocol, or cache_statement (fastest on a direct connection).
	DBQueryExecMode  string        `envconfig:"DB_QUERY_EXEC_MODE" default:"exec"`
	DBConnectTimeout time.Duration `envconfig:"DB_CONNECT_TIMEOUT" default:"5s"`
	// DBAcquireTimeout bounds how long a statement waits for one of the
	// pool's connections (opening a new one included); 0 (the default) waits until
	// its request's or sweep task's deadline. A wait that runs out sent
	// nothing. Off by default: a burst on one hot row (200 begins on one
	// run's wallet) queues for connections longer than a few seconds and
	// still succeeds within its deadline.
	DBAcquireTimeout time.Duration `envconfig:"DB_ACQUIRE_TIMEOUT" default:"0s"`
	// DBStatementTimeout is sent as the statement_timeout startup parameter
	// when positive: for a direct connection (PgBouncer refuses it). Off by
	// default; requests and sweep tasks are bounded by their deadlines,
	// which cancel their statements on the server.
	DBStatementTimeout time.Duration `envconfig:"DB_STATEMENT_TIMEOUT" default:"0s"`

	// KeyCacheTTL bounds how long a revoked key may still be accepted by an
	// instance that had it cached. Zero disables the cache; at most
	// MaxKeyCacheTTL.
	KeyCacheTTL time.Duration `envconfig:"KEY_CACHE_TTL" default:"5s"`

	SweepInterval   time.Duration `envconfig:"SWEEP_INTERVAL" default:"5s"`
	JobLeaseGraceMs int64         `envconfig:"JOB_LEASE_GRACE_MS" default:"10000"`
	// JobRetentionDays: a finished run, with its steps' jobs, executions and
	// replays, is deleted this many days after its last step ended; 0 keeps
	// runs for ever. EventRetentionDays does the same for the event outbox
	// and webhook deliveries.
	JobRetentionDays   int `envconfig:"JOB_RETENTION_DAYS" default:"90"`
	EventRetentionDays int `envconfig:"EVENT_RETENTION_DAYS" default:"30"`
	// WebhookAllowPrivateNetworks lets webhooks target loopback and private
	// addresses (self-hosting, tests), and take plain http URLs. Off, such
	// deliveries are refused, and a create or PATCH of url must send https.
	WebhookAllowPrivateNetworks bool `envconfig:"WEBHOOK_ALLOW_PRIVATE_NETWORKS" default:"false"`
	// AutoMigrate applies pending migrations on start (local server: on).
	AutoMigrate bool `envconfig:"AUTO_MIGRATE" default:"false"`
}

// ServerDBMaxConns is the pool of a long-running server (functions/local)
// when DB_MAX_CONNS is not set. The default of 4 is sized for serverless,
// where an instance serves one request at a time; one process serving many
// concurrent requests needs a connection per request in flight, or requests
// queue for the pool and each commit waits for its own WAL flush instead of
// sharing one with the commits of other connections (group commit).
const ServerDBMaxConns = 16

// SizeForServer sizes the pool for a long-running server (ServerDBMaxConns)
// unless DB_MAX_CONNS sets it.
func (c *Config) SizeForServer() {
	if os.Getenv("DB_MAX_CONNS") == "" {
		c.DBMaxConns = ServerDBMaxConns
	}
}

// Load reads the environment.
func Load() (*Config, error) {
	var c Config
	if err := envconfig.Process("", &c); err != nil {
		return nil, oneLine(err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// oneLine turns envconfig's error into "config: SETTING: problem".
func oneLine(err error) error {
	var pe *envconfig.ParseError
	if ok := asParseError(err, &pe); ok {
		return fmt.Errorf("config: %s is malformed (%s)", pe.KeyName, parseProblem(pe))
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "required key ") {
		name := strings.TrimSuffix(strings.TrimPrefix(msg, "required key "), " missing value")
		return fmt.Errorf("config: %s is required but not set", name)
	}
	return fmt.Errorf("config: %w", err)
}

// parseProblem is what is wrong with pe's value, without it: the parse's
// own error quotes it (`strconv.ParseInt: parsing "…"`, `time: invalid
// duration "…"`), and the error is logged at start-up (logs QA: a secret
// pasted into PORT or a duration setting was logged whole).
func parseProblem(pe *envconfig.ParseError) string {
	var ne *strconv.NumError
	switch {
	case errors.As(pe.Err, &ne):
		return "want " + pe.TypeName + ": " + ne.Err.Error()
	case pe.TypeName == "time.Duration":
		return "want a duration, e.g. 5s"
	}
	return "want " + pe.TypeName
}

func asParseError(err error, target **envconfig.ParseError) bool {
	pe, ok := err.(*envconfig.ParseError)
	if ok {
		*target = pe
	}
	return ok
}

// maxRetentionDays bounds JOB_RETENTION_DAYS and EVENT_RETENTION_DAYS (ten
// years; 0 keeps records for ever).
const maxRetentionDays = 3650

// MaxKeyCacheTTL bounds KEY_CACHE_TTL: a revoked (a leaked) key is still
// accepted by another instance for up to that long, for reads, reports and
// heartbeats, so a longer one would leave a revocation unfelt for minutes
// (wire QA: KEY_CACHE_TTL=24h was taken). Five minutes is far past what
// caching saves: one key lookup per key and instance every few seconds.
const MaxKeyCacheTTL = 5 * time.Minute

// maxJobLeaseGraceMs bounds JOB_LEASE_GRACE_MS: an hour.
const maxJobLeaseGraceMs = 3_600_000

// Validate checks values envconfig cannot.
func (c *Config) Validate() error {
	// A variable set to the empty string counts as not set.
	for _, s := range [][2]string{{"DATABASE_URL", c.DatabaseURL},
		{"RESULT_ENCRYPTION_KEY", c.ResultEncryptionKey}, {"KEY_HASH_SECRET", c.KeyHashSecret}} {
		if strings.TrimSpace(s[1]) == "" {
			return fmt.Errorf("config: %s is required but not set", s[0])
		}
	}
	u, err := url.Parse(c.DatabaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return fmt.Errorf("config: DATABASE_URL is malformed (want postgres://user@host:port/db)")
	}
	if _, err := DecodeKey(c.ResultEncryptionKey); err != nil {
		return fmt.Errorf("config: RESULT_ENCRYPTION_KEY is malformed (%v)", err)
	}
	for i, k := range c.ResultEncryptionKeys {
		if _, err := DecodeKey(k); err != nil {
			return fmt.Errorf("config: RESULT_ENCRYPTION_KEYS entry %d is malformed (%v)", i+1, err)
		}
	}
	if len(c.KeyHashSecret) < 16 {
		return fmt.Errorf("config: KEY_HASH_SECRET is malformed (at least 16 characters)")
	}
	switch c.SignupMode {
	case "open", "closed":
	case "token":
		if c.SignupBearer() == "" {
			return fmt.Errorf("config: SIGNUP_TOKEN is required when SIGNUP_MODE=token (whitespace alone is none)")
		}
	default:
		return fmt.Errorf("config: SIGNUP_MODE is malformed (open, token or closed)")
	}
	if c.BillingMode != "off" {
		// Metering is not built: a deployment that asks for it is told at
		// start rather than silently served for free (API.md §5).
		return fmt.Errorf("config: BILLING_MODE is malformed (only off: this version does no metering)")
	}
	switch c.DBQueryExecMode {
	case "exec", "simple_protocol", "cache_statement", "cache_describe", "describe_exec":
	default:
		return fmt.Errorf("config: DB_QUERY_EXEC_MODE is malformed (exec, simple_protocol, cache_describe, " +
			"cache_statement or describe_exec)")
	}
	if c.DBMaxConns < 1 {
		return fmt.Errorf("config: DB_MAX_CONNS is malformed (at least 1)")
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("config: PORT is malformed (0-65535; 0 picks a free port)")
	}
	if c.BindAddress != "" && net.ParseIP(c.BindAddress) == nil && c.BindAddress != "localhost" {
		return fmt.Errorf("config: BIND_ADDRESS is malformed (an IP address such as 127.0.0.1 or 0.0.0.0, or localhost)")
	}
	// A non-positive interval panics the sweeper's ticker; negative waits,
	// graces and rates mean nothing.
	for _, d := range []struct {
		name     string
		v        time.Duration
		positive bool
	}{
		{"SWEEP_INTERVAL", c.SweepInterval, true}, {"DB_CONNECT_TIMEOUT", c.DBConnectTimeout, true},
		{"DB_MAX_CONN_IDLE_TIME", c.DBMaxConnIdleTime, true}, {"DB_STATEMENT_TIMEOUT", c.DBStatementTimeout, false},
		{"KEY_CACHE_TTL", c.KeyCacheTTL, false}, {"DB_ACQUIRE_TIMEOUT", c.DBAcquireTimeout, false},
	} {
		switch {
		case d.positive && d.v <= 0:
			return fmt.Errorf("config: %s is malformed (a positive duration, e.g. 5s)", d.name)
		case d.v < 0:
			return fmt.Errorf("config: %s is malformed (0 or a positive duration)", d.name)
		}
	}
	if c.KeyCacheTTL > MaxKeyCacheTTL {
		return fmt.Errorf("config: KEY_CACHE_TTL is malformed (0 to %s: a revoked key is still accepted by other "+
			"instances for up to this long)", MaxKeyCacheTTL)
	}
	// Bounded above too: a dead worker's job waits its timeout plus the
	// grace before another claim takes it, and a huge one would overflow
	// the statements' interval arithmetic (time QA).
	if c.JobLeaseGraceMs < 0 || c.JobLeaseGraceMs > maxJobLeaseGraceMs {
		return fmt.Errorf("config: JOB_LEASE_GRACE_MS is malformed (0 to %d, an hour)", maxJobLeaseGraceMs)
	}
	for _, d := range []struct {
		name string
		v    int
	}{{"JOB_RETENTION_DAYS", c.JobRetentionDays}, {"EVENT_RETENTION_DAYS", c.EventRetentionDays}} {
		if d.v < 0 || d.v > maxRetentionDays {
			return fmt.Errorf("config: %s is malformed (0 to keep for ever, or 1-%d days)", d.name, maxRetentionDays)
		}
	}
	if c.SignupRatePerHour < 0 {
		return fmt.Errorf("config: SIGNUP_RATE_PER_HOUR is malformed (0 for no limit, or more)")
	}
	return nil
}

// DecodeKey decodes a base64 AES-256 key.
func DecodeKey(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("not base64")
	}
	if len(b) != 32 {
		return nil, fmt.Errorf("want 32 bytes, got %d", len(b))
	}
	return b, nil
}

// Sealer builds the sealer of RESULT_ENCRYPTION_KEY (which seals) and
// RESULT_ENCRYPTION_KEYS (which only open). Call it after Validate.
func (c *Config) Sealer() (*seal.Sealer, error) {
	current, err := DecodeKey(c.ResultEncryptionKey)
	if err != nil {
		return nil, fmt.Errorf("config: RESULT_ENCRYPTION_KEY is malformed (%v)", err)
	}
	older := make([][]byte, 0, len(c.ResultEncryptionKeys))
	for i, k := range c.ResultEncryptionKeys {
		b, err := DecodeKey(k)
		if err != nil {
			return nil, fmt.Errorf("config: RESULT_ENCRYPTION_KEYS entry %d is malformed (%v)", i+1, err)
		}
		older = append(older, b)
	}
	return seal.New(current, older...)
}

// minSharedSecret is the length under which a shared secret (CRON_SECRET,
// SIGNUP_TOKEN) is guessable. Shorter ones are still accepted (refusing
// them would stop deployments that run today) but warned about.
const minSharedSecret = 16

// Warnings are settings that work but weaken the service, one line each,
// naming the setting and never its value: logged at start.
func (c *Config) Warnings() []string {
	var out []string
	if cron := c.CronBearer(); cron != "" && len(cron) < minSharedSecret {
		out = append(out, fmt.Sprintf("CRON_SECRET is shorter than %d characters: anyone who guesses it can run sweeper passes", minSharedSecret))
	}
	if c.SignupMode == "token" && len(c.SignupBearer()) < minSharedSecret {
		out = append(out, fmt.Sprintf("SIGNUP_TOKEN is shorter than %d characters: anyone who guesses it can create workspaces", minSharedSecret))
	}
	return out
}

// MigrationURL is the URL migrations run over.
func (c *Config) MigrationURL() string {
	if c.MigrationDatabaseURL != "" {
		return c.MigrationDatabaseURL
	}
	return c.DatabaseURL
}

// CronBearer is the credential the cron route takes: CRON_SECRET without
// the whitespace around it, as no Authorization header carries it (a
// newline pasted with the secret refused every sweep, its own schedule's
// included, logging nothing: review). Empty, the secret is unset, whitespace
// alone included, and the route refuses every caller.
func (c *Config) CronBearer() string { return strings.TrimSpace(c.CronSecret) }

// SignupBearer is the token SIGNUP_MODE=token takes: SIGNUP_TOKEN without
// the whitespace around it, which no Ratchet-Signup-Token header carries
// (HTTP drops it from a header's value), as CronBearer is CRON_SECRET's
// (security QA: a token set with its newline refused every signup, and one
// of whitespace alone passed the check that it was set).
func (c *Config) SignupBearer() string { return strings.TrimSpace(c.SignupToken) }

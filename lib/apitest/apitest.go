// Package apitest runs the real service over a real Postgres for tests: each
// test package gets its own freshly migrated database (so packages can run in
// parallel), and each test makes its own workspace (so tests within a package
// are isolated the way tenants are).
package apitest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/getratchet/ratchet/migrations"
)

var (
	mu          sync.Mutex
	databaseURL string
)

// Main provisions Postgres (DATABASE_URL, a throwaway local cluster, or a
// container), creates and migrates a database for this package, runs the
// tests and drops the database, whether they passed or not. A test binary
// killed before that (go test's -timeout, a panic, an interrupt) leaves its
// database behind: on a long-lived server the next run drops those a day old
// or more that no session uses (testpg.DropStaleTestDatabases; a run holds
// a session on its own, holdDatabase). Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }
func Main(m *testing.M) int {
	ctx := context.Background()
	cluster, err := testpg.Provision(ctx, testpg.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "apitest:", err)
		return 1
	}
	defer cluster.Close()
	if _, err := testpg.DropStaleTestDatabases(ctx, cluster.URL, time.Now()); err != nil {
		fmt.Fprintln(os.Stderr, "apitest: drop the test databases killed runs left:", err) // and go on
	}
	name := testpg.TestDatabaseName(time.Now())
	url, err := testpg.CreateDatabase(ctx, cluster.URL, name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apitest: create database:", err)
		return 1
	}
	defer func() {
		if err := testpg.DropDatabase(context.Background(), cluster.URL, name); err != nil {
			fmt.Fprintln(os.Stderr, "apitest: drop database:", err)
		}
	}()
	held, err := holdDatabase(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apitest: hold database:", err)
		return 1
	}
	defer held.Close(context.Background())
	if _, err := db.MigrateURL(ctx, url, migrations.FS); err != nil {
		fmt.Fprintln(os.Stderr, "apitest: migrate:", err)
		return 1
	}
	mu.Lock()
	databaseURL = url
	mu.Unlock()
	return m.Run()
}

// RunSession is the application_name of the session Main holds on its
// database for the whole run (holdDatabase).
const RunSession = "ratchet test run"

// holdDatabase opens a session on the run's database, held until the run
// ends: a database some session uses is a run's in progress, which
// testpg.DropStaleTestDatabases leaves whatever the time in its name says
// (another run's clock a day ahead, or this run past a day), and a killed
// run's session ends with it. The service's own pools alone leave the
// database unused between tests.
func holdDatabase(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = RunSession
	return pgx.ConnectConfig(ctx, cfg)
}

// DatabaseURL is this package's test database.
func DatabaseURL(t testing.TB) string {
	mu.Lock()
	defer mu.Unlock()
	if databaseURL == "" {
		t.Fatal("apitest: call apitest.Main from TestMain")
	}
	return databaseURL
}

// Config returns a valid configuration over the package's database.
func Config(t testing.TB) *config.Config {
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	return &config.Config{
		DatabaseURL: DatabaseURL(t), ResultEncryptionKey: key, KeyHashSecret: "test-key-hash-secret-0123456789",
		CronSecret: "test-cron-secret", SignupMode: "open", BillingMode: "off", Port: 8787,
		DBMaxConns: 8, DBMaxConnIdleTime: 30 * time.Second, DBQueryExecMode: "exec",
		DBConnectTimeout: 5 * time.Second, DBStatementTimeout: 30 * time.Second,
		KeyCacheTTL: 5 * time.Second, SweepInterval: time.Hour, JobLeaseGraceMs: 10000,
	}
}

// Env is one running service instance.
type Env struct {
	T      testing.TB
	App    *app.App
	Server *httptest.Server
	Client *http.Client
	budget *atomic.Int64 // NarrowAnswers; 0: answer.Budget
}

// NarrowAnswers holds this instance's answers from now on to n bytes of
// JSON rather than answer.Budget, so that a test of what happens past the
// budget sends kilobytes, not megabytes (under -race, a group of 1 MB
// compensations took 35 s).
func (e *Env) NarrowAnswers(n int) { e.budget.Store(int64(n)) }

// Option adjusts the configuration or app options before start.
type Option func(*config.Config, *app.Options)

// WithConfig edits the configuration.
func WithConfig(f func(*config.Config)) Option {
	return func(c *config.Config, _ *app.Options) { f(c) }
}

// WithLogger sets the logger (the default discards everything).
func WithLogger(l *slog.Logger) Option {
	return func(_ *config.Config, o *app.Options) { o.Logger = l }
}

// LockedBuffer is a log sink safe to read while handlers and the sweeper
// write to it: pass slog.NewTextHandler(&buf, nil) to WithLogger.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// WithNow injects a clock.
func WithNow(now func() time.Time) Option {
	return func(_ *config.Config, o *app.Options) { o.Now = now }
}

// WithWall gives the instance its own wall clock (skewed, say) under the
// database's: decisions still read the database's clock (db.Clock).
func WithWall(wall func() time.Time) Option {
	return func(_ *config.Config, o *app.Options) { o.Wall = wall }
}

// Start builds an App over the package database and serves it on a loopback
// httptest server, closed when the test ends.
func Start(t testing.TB, opts ...Option) *Env {
	cfg := Config(t)
	ao := app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, o := range opts {
		o(cfg, &ao)
	}
	a, err := app.New(context.Background(), cfg, ao)
	require.NoError(t, err)
	budget := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := budget.Load(); n > 0 {
			r = r.WithContext(answer.Within(r.Context(), int(n)))
		}
		a.Server.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		a.Close()
	})
	return &Env{T: t, App: a, Server: srv, Client: srv.Client(), budget: budget}
}

// Response is a decoded reply.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into a generic map.
func (r *Response) JSON() map[string]any {
	var m map[string]any
	_ = json.Unmarshal(r.Body, &m)
	return m
}

// Decode decodes the body into v.
func (r *Response) Decode(t testing.TB, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.Body, v), "body: %s", r.Body)
}

// ErrorCode returns error.code from an error envelope, or "".
func (r *Response) ErrorCode() string {
	if e, ok := r.JSON()["error"].(map[string]any); ok {
		code, _ := e["code"].(string)
		return code
	}
	return ""
}

// Do sends a request with an optional bearer key and JSON body (a string or
// []byte is sent as is with its Content-Length, an io.Reader as is without
// one, chunked; anything else is marshalled).
func (e *Env) Do(method, path, key string, body any) *Response {
	e.T.Helper()
	return e.DoWith(method, path, key, nil, body)
}

// DoWith is Do with more request headers.
func (e *Env) DoWith(method, path, key string, header http.Header, body any) *Response {
	e.T.Helper()
	var rdr io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rdr = strings.NewReader(b)
	case []byte:
		rdr = bytes.NewReader(b)
	case io.Reader:
		rdr = io.MultiReader(b) // hides the length a *bytes.Reader would give away
	default:
		raw, err := json.Marshal(b)
		require.NoError(e.T, err)
		rdr = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.Server.URL+path, rdr)
	require.NoError(e.T, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if rdr != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for name, values := range header {
		req.Header[name] = values
	}
	res, err := e.Client.Do(req)
	require.NoError(e.T, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(e.T, err)
	c, err := loadChecker()
	require.NoError(e.T, err, "the OpenAPI document")
	if msg := c.check(req, res.StatusCode, res.Header, raw); msg != "" {
		e.T.Error(msg)
	}
	return &Response{Status: res.StatusCode, Header: res.Header, Body: raw}
}

// Must sends a request and requires the given status.
func (e *Env) Must(status int, method, path, key string, body any) *Response {
	e.T.Helper()
	r := e.Do(method, path, key, body)
	require.Equal(e.T, status, r.Status, "%s %s: %s", method, path, r.Body)
	return r
}

// Workspace is a signed-up tenant with its operator key.
type Workspace struct {
	ID  string
	Key string
}

// Signup creates a workspace and returns its id and operator secret.
func (e *Env) Signup() Workspace {
	e.T.Helper()
	r := e.Must(http.StatusCreated, "POST", "/api/v1/workspaces", "", map[string]any{"name": "test"})
	var out struct {
		WorkspaceID string `json:"workspace_id"`
		Key         struct {
			Secret string `json:"secret"`
		} `json:"key"`
	}
	r.Decode(e.T, &out)
	return Workspace{ID: out.WorkspaceID, Key: out.Key.Secret}
}

// Key mints a key in ws with the given request body and returns its secret.
func (e *Env) Key(ws Workspace, body map[string]any) string {
	e.T.Helper()
	r := e.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, body)
	secret, _ := r.JSON()["secret"].(string)
	require.NotEmpty(e.T, secret)
	return secret
}

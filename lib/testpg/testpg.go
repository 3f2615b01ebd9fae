// Package testpg provisions a real PostgreSQL server for tests and local
// development.
//
// The team rule is that tests talk to a real PostgreSQL, never a mock: SQL
// semantics (constraints, locking, transaction isolation, JSON operators,
// error codes) are exactly what mocks get wrong. To make that cheap enough to
// be the default everywhere, Provision picks the first source that works:
//
//  1. $DATABASE_URL, when set. CI or a developer can point at any server they
//     already run; the caller must be allowed to CREATE DATABASE there.
//  2. A throwaway cluster started from local initdb/postgres binaries (found
//     in $PATH and /usr/lib/postgresql/*/bin, highest major version first).
//     Starting a cluster takes about a second and needs nothing but the
//     PostgreSQL server package.
//  3. A postgres:16-alpine container via testcontainers-go, when Docker is
//     reachable.
//  4. Otherwise an error that says what to install.
//
// The throwaway cluster never touches a server that may already run on the
// machine: it listens on a free TCP port on 127.0.0.1 only, keeps its unix
// socket in its own temporary directory, and runs with durability switched off
// (fsync, synchronous_commit, full_page_writes) because its data is discarded
// anyway. Several test processes may provision clusters at the same time (go
// test runs packages in parallel); port collisions are detected and retried.
//
// PostgreSQL refuses to run as root. CI runs as root, so when the effective
// uid is 0 initdb and postgres are started with the credentials of the
// "postgres" system user (falling back to "nobody"), and the directories they
// use are handed over to that user.
//
// The package targets Unix-like systems (Linux, macOS).
package testpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// ContainerImage is the image used when PostgreSQL is provisioned through
// Docker.
const ContainerImage = "postgres:16-alpine"

// installHint is appended to the error returned when no PostgreSQL could be
// provisioned at all, so that the reader knows how to fix their machine.
const installHint = "install PostgreSQL server binaries (Debian: apt-get install postgresql; macOS: brew install postgresql) or Docker, or set DATABASE_URL"

const (
	// readyTimeout bounds how long we wait for a freshly started server to
	// accept connections.
	readyTimeout = 30 * time.Second
	// startAttempts is how many free ports are tried before giving up; a
	// port picked as free can be grabbed by another process before postgres
	// binds it.
	startAttempts = 8
	// superuser is the bootstrap superuser created by initdb (and by the
	// container image), so URLs look the same whatever the source.
	superuser = "postgres"
	// containerTimeout bounds starting the Docker container, image pull
	// included: a registry that never answers must not hang the caller.
	containerTimeout = 5 * time.Minute
	// maxSocketPath is a conservative limit for the unix socket path
	// (sun_path is 108 bytes on Linux, 104 on macOS).
	maxSocketPath = 100
)

// throwawaySettings make a disposable cluster fast. They trade crash safety,
// which a cluster deleted after the test run does not need, for speed.
var throwawaySettings = []string{
	"fsync=off",
	"synchronous_commit=off",
	"full_page_writes=off",
	"max_connections=200",
	"shared_buffers=128MB",
}

// Options configures Provision.
type Options struct {
	// DataDir, if set, makes the local cluster persistent: it lives at that
	// path (initdb runs only if the directory is missing or empty) and
	// Close stops the server but keeps the data. Durability settings are
	// left at PostgreSQL's defaults. Meant for local development.
	DataDir string
	// Logf, if set, receives short progress messages (which source was
	// used, where the server listens).
	Logf func(format string, args ...any)
	// Crashable asks for a throwaway cluster of this process's own that a
	// test may crash and start again (Cluster.Crash, Cluster.Restart):
	// started from local binaries even when DATABASE_URL is set (a shared
	// server must never be taken down), never from Docker (Provision
	// answers an error wrapping ErrNoBinaries where there are none), and
	// with synchronous_commit left on, so that a commit is in the kernel's
	// hands before it is acknowledged and a crash of the server loses none
	// (fsync stays off: the machine does not crash, only postgres).
	Crashable bool

	// host is what Provision asks of the machine; nil means this one.
	// Tests set it to prove each branch of the choice of source.
	host *machine
}

// machine is every lookup the choice of a PostgreSQL source depends on, so
// that tests can stand in for a machine without binaries, Docker or a
// server (TestProvisionChoosesASource).
type machine struct {
	getenv     func(string) string // $DATABASE_URL and $PATH
	globs      []string            // install locations off $PATH
	geteuid    func() int
	lookupUser func(string) (*user.User, error)
	dockerPing func(context.Context) error
	// runContainer starts the container (pulling its image if need be)
	// and answers its connection string and how to remove it.
	runContainer func(ctx context.Context, cmd []string) (url string, terminate func() error, err error)
	// containerWait bounds runContainer and the wait for its server.
	containerWait time.Duration
	// urlWait bounds the wait for a $DATABASE_URL server to answer.
	urlWait time.Duration
}

var thisMachine = &machine{
	getenv:        os.Getenv,
	globs:         binaryGlobs,
	geteuid:       os.Geteuid,
	lookupUser:    user.Lookup,
	dockerPing:    dockerReachable,
	runContainer:  runContainer,
	containerWait: containerTimeout,
	urlWait:       readyTimeout,
}

func (o Options) machine() *machine {
	if o.host != nil {
		return o.host
	}
	return thisMachine
}

func (o Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// Cluster is a provisioned PostgreSQL server.
type Cluster struct {
	// URL is a postgres:// URL (or whatever DATABASE_URL holds) for a
	// database in which the caller may CREATE DATABASE. For clusters
	// started by this package it connects as the superuser.
	URL string

	source  string // "env", "local" or "docker"
	dataDir string // data directory of a local cluster
	tmpDir  string // temporary directory removed by Close ("" if none)

	// A Crashable cluster's server, replaced by Restart.
	mu   sync.Mutex
	plan *localPlan
	srv  *localServer
	port int

	closeFn   func() error
	closeOnce sync.Once
	closeErr  error
}

// Close stops the server started by Provision and removes its temporary
// files. For a persistent DataDir cluster the server is shut down cleanly and
// the data kept. It is a no-op for DATABASE_URL. Close is safe to call more
// than once.
func (c *Cluster) Close() error {
	if c == nil {
		return nil
	}
	c.closeOnce.Do(func() {
		if c.closeFn != nil {
			c.closeErr = c.closeFn()
		}
	})
	return c.closeErr
}

// Provision returns a PostgreSQL server following the order described in the
// package documentation. The caller must Close the returned cluster. If ctx is
// cancelled while a server is being started, that server is killed again.
func Provision(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Crashable {
		if opts.DataDir != "" {
			return nil, errors.New("testpg: a Crashable cluster is a throwaway one; it takes no DataDir")
		}
		c, err := provisionLocal(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("testpg: a cluster to crash: %w", err)
		}
		return c, nil
	}
	h := opts.machine()
	if u := h.getenv("DATABASE_URL"); u != "" {
		if opts.DataDir != "" {
			opts.logf("testpg: DATABASE_URL is set; ignoring data dir %s", opts.DataDir)
		}
		// A URL that does not parse never will: say so at once rather
		// than retrying it for the whole wait. The parse error names no
		// password (pgx redacts it).
		if _, err := pgx.ParseConfig(u); err != nil {
			return nil, fmt.Errorf("testpg: DATABASE_URL is set but is not a PostgreSQL connection string: %w", err)
		}
		if err := waitReady(ctx, u, nil, h.urlWait); err != nil {
			return nil, fmt.Errorf("testpg: DATABASE_URL is set but not usable (unset it to use local PostgreSQL binaries or Docker): %w", err)
		}
		opts.logf("testpg: using DATABASE_URL")
		return &Cluster{URL: u, source: "env"}, nil
	}

	var localErr error
	c, err := provisionLocal(ctx, opts)
	switch {
	case err == nil:
		return c, nil
	case ctx.Err() != nil:
		return nil, err
	case errors.Is(err, ErrNoBinaries):
		localErr = err
	case opts.DataDir != "":
		// A persistent cluster that exists but cannot be started must
		// not be silently replaced by an empty container.
		return nil, err
	default:
		localErr = err
		opts.logf("testpg: local PostgreSQL failed, trying Docker: %v", err)
	}

	if opts.DataDir != "" {
		opts.logf("testpg: no local PostgreSQL binaries; the Docker cluster will NOT persist data in %s", opts.DataDir)
	}
	c, err = provisionContainer(ctx, opts)
	if err == nil {
		return c, nil
	}
	if ctx.Err() != nil {
		return nil, err
	}
	return nil, noPostgresError(localErr, err)
}

// noPostgresError explains why every source failed and what to install.
func noPostgresError(localErr, dockerErr error) error {
	return fmt.Errorf("testpg: no PostgreSQL available (local: %v; docker: %v): %s", localErr, dockerErr, installHint)
}

// CreateDatabase creates database name on the server behind adminURL and
// returns a URL for it: the same host, port, user and parameters as adminURL
// with only the database replaced. adminURL may be a URL or a keyword/value
// connection string.
func CreateDatabase(ctx context.Context, adminURL, name string) (string, error) {
	if err := checkDatabaseName(name); err != nil {
		return "", err
	}
	dbURL, err := withDatabase(adminURL, name)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", fmt.Errorf("testpg: connect to admin database: %w", err)
	}
	defer conn.Close(context.Background())

	stmt := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	for attempt := 0; ; attempt++ {
		_, err = conn.Exec(ctx, stmt)
		// CREATE DATABASE copies template1 and fails with object_in_use
		// while another session is connected to it (for instance a
		// concurrent CREATE DATABASE on some servers); that is transient.
		var pgErr *pgconn.PgError
		if err == nil || attempt >= 20 || !errors.As(err, &pgErr) || pgErr.Code != "55006" {
			break
		}
		if err := sleepCtx(ctx, time.Duration(50*(attempt+1))*time.Millisecond); err != nil {
			break
		}
	}
	if err != nil {
		return "", fmt.Errorf("testpg: create database %q: %w", name, err)
	}
	return dbURL, nil
}

// DropDatabase drops database name on the server behind adminURL, terminating
// any sessions still connected to it. Dropping a database that does not exist
// is not an error.
func DropDatabase(ctx context.Context, adminURL, name string) error {
	if err := checkDatabaseName(name); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("testpg: connect to admin database: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("testpg: drop database %q: %w", name, err)
	}
	return nil
}

// checkDatabaseName rejects names PostgreSQL would silently change:
// identifiers longer than 63 bytes are truncated, which would make the
// returned URL point at a database that does not exist.
func checkDatabaseName(name string) error {
	switch {
	case name == "":
		return errors.New("testpg: empty database name")
	case len(name) > 63:
		return fmt.Errorf("testpg: database name %q is longer than 63 bytes", name)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("testpg: database name %q contains a NUL byte", name)
	}
	return nil
}

// withDatabase returns connString with its database replaced by name.
func withDatabase(connString, name string) (string, error) {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		u, err := url.Parse(connString)
		if err != nil {
			return "", fmt.Errorf("testpg: parse connection URL: %w", err)
		}
		// Escape "/" too, so the name stays a single path segment.
		u.Path = "/" + name
		u.RawPath = "/" + url.PathEscape(name)
		if q := u.Query(); q.Has("dbname") {
			// A dbname query parameter would override the path.
			q.Del("dbname")
			u.RawQuery = q.Encode()
		}
		return u.String(), nil
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(name)
	return strings.TrimSpace(connString) + " dbname='" + quoted + "'", nil
}

// waitReady connects to connString with pgx until it succeeds, the 30 s
// budget runs out, ctx ends, or exited is closed (the server process died).
// Errors that retrying cannot fix (bad password, missing database) end the
// wait immediately.
func waitReady(ctx context.Context, connString string, exited <-chan struct{}, budget time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	var lastErr error
	for {
		attemptCtx, cancelAttempt := context.WithTimeout(ctx, 3*time.Second)
		conn, err := pgx.Connect(attemptCtx, connString)
		if err == nil {
			err = conn.Ping(attemptCtx)
			conn.Close(context.Background())
		}
		cancelAttempt()
		if err == nil {
			return nil
		}
		lastErr = err
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code != "57P03" && pgErr.Code != "53300" {
			// Anything but "starting up" / "too many connections"
			// is an answer from a working server that will not change.
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server not ready: %w (last error: %v)", ctx.Err(), lastErr)
		case <-exited:
			return errServerExited
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// ---------------------------------------------------------------------------
// Local binaries

// ErrNoBinaries says no local PostgreSQL server binaries were found: a
// Crashable cluster cannot be started on this machine.
var ErrNoBinaries = errors.New("no PostgreSQL server binaries (initdb, postgres, pg_ctl) found in $PATH or /usr/lib/postgresql/*/bin")

var (
	errServerExited = errors.New("postgres exited")
	errPortInUse    = errors.New("port already in use")
)

// binaryGlobs are well-known install locations that are usually not on
// $PATH: Debian/Ubuntu, RHEL (PGDG), source builds and Homebrew.
var binaryGlobs = []string{
	"/usr/lib/postgresql/*/bin",
	"/usr/pgsql-*/bin",
	"/usr/local/pgsql/bin",
	"/opt/homebrew/opt/postgresql@*/bin",
	"/usr/local/opt/postgresql@*/bin",
}

// pgBinaries is a directory holding initdb and postgres of one major version.
type pgBinaries struct {
	dir   string
	major int
}

var versionRE = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// findBinaries returns the directory of the newest PostgreSQL server
// binaries (initdb, postgres and pg_ctl, which Cluster.Crash runs), or of major version wantMajor if it is non-zero (an existing
// data directory can only be opened by its own major version).
func findBinaries(h *machine, wantMajor int) (pgBinaries, error) {
	var dirs []string
	for _, d := range filepath.SplitList(h.getenv("PATH")) {
		// initdb and postgres run in their own working directory, where
		// a relative $PATH entry ("bin") would name nothing: resolve it
		// against ours, where it was found.
		if d == "" {
			continue
		}
		if abs, err := filepath.Abs(d); err == nil {
			dirs = append(dirs, abs)
		}
	}
	for _, g := range h.globs {
		m, _ := filepath.Glob(g)
		dirs = append(dirs, m...)
	}

	seen := map[string]bool{}
	var found []pgBinaries
	for _, d := range dirs {
		postgres := filepath.Join(d, "postgres")
		if !isExecutable(postgres) || !isExecutable(filepath.Join(d, "initdb")) || !isExecutable(filepath.Join(d, "pg_ctl")) {
			continue
		}
		key := postgres
		if real, err := filepath.EvalSymlinks(postgres); err == nil {
			key = real
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		major, err := serverMajor(postgres)
		if err != nil {
			continue
		}
		found = append(found, pgBinaries{dir: d, major: major})
	}
	if len(found) == 0 {
		return pgBinaries{}, ErrNoBinaries
	}
	// Stable: for equal versions $PATH order wins.
	sort.SliceStable(found, func(i, j int) bool { return found[i].major > found[j].major })
	if wantMajor == 0 {
		return found[0], nil
	}
	for _, b := range found {
		if b.major == wantMajor {
			return b, nil
		}
	}
	return pgBinaries{}, fmt.Errorf("data directory needs PostgreSQL %d, but only version %d binaries were found (%s)", wantMajor, found[0].major, found[0].dir)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// serverMajor runs `postgres --version` (allowed as root) and returns the
// major version.
func serverMajor(postgres string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, postgres, "--version").Output()
	if err != nil {
		return 0, err
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("unrecognised version output %q", out)
	}
	return strconv.Atoi(string(m[1]))
}

// serverUser says as whom initdb and postgres run. A nil *serverUser means
// "as ourselves"; it is non-nil only when we are root, because PostgreSQL
// refuses to run with root privileges.
type serverUser struct {
	name     string
	uid, gid uint32
}

func lookupServerUser(h *machine) (*serverUser, error) {
	if h.geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := h.lookupUser(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &serverUser{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
	}
	return nil, errors.New(`running as root, but there is no "postgres" (or "nobody") user to run PostgreSQL as; create one (useradd --system postgres) or run as a normal user`)
}

// chown hands path to the server user (no-op when not root).
func (u *serverUser) chown(path string) error {
	if u == nil {
		return nil
	}
	return os.Chown(path, int(u.uid), int(u.gid))
}

// canReach reports whether the server user can traverse every directory
// leading to (and including) dir. A root-owned 0700 directory on the way,
// such as /root or a t.TempDir(), makes initdb fail with an obscure error.
func (u *serverUser) canReach(dir string) error {
	if u == nil {
		return nil
	}
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok {
			mode := fi.Mode().Perm()
			var bit os.FileMode = 0o001
			switch {
			case st.Uid == u.uid:
				bit = 0o100
			case st.Gid == u.gid:
				bit = 0o010
			}
			if mode&bit == 0 {
				return fmt.Errorf("user %q cannot access %s (mode %v); PostgreSQL must run as %q because we are root", u.name, p, mode, u.name)
			}
		}
		if parent := filepath.Dir(p); parent == p {
			return nil
		}
	}
}

// sysProcAttr puts the child in its own process group, so a Ctrl-C meant for
// the program under test does not shut the database down underneath it, and
// drops root privileges if needed.
func (u *serverUser) sysProcAttr() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if u != nil {
		attr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: []uint32{u.gid}}
	}
	return attr
}

// setParentDeathSignal asks the kernel to send sig to the child when the OS
// thread that started it dies, so a test binary killed with SIGKILL (go test
// -timeout, CI cancellation) does not leave postgres running. The field only
// exists on Linux; reflection keeps this package a single portable file.
func setParentDeathSignal(attr *syscall.SysProcAttr, sig syscall.Signal) {
	f := reflect.ValueOf(attr).Elem().FieldByName("Pdeathsig")
	if f.IsValid() && f.CanSet() && f.Type() == reflect.TypeOf(sig) {
		f.Set(reflect.ValueOf(sig))
	}
}

// serverEnv is the environment for initdb and postgres: ours without PG*
// variables (PGDATA, PGPORT, ... must not redirect them) and with the C
// locale, so messages are in English (we grep the log for bind failures) and
// the cluster does not depend on the machine's locale setup.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "LANG=C")
}

// localPlan is everything needed to start a local cluster.
type localPlan struct {
	bin        pgBinaries
	user       *serverUser
	dataDir    string
	socketDir  string // "" disables unix sockets
	logPath    string
	workDir    string   // cwd of the server; must be reachable by user
	tmpDir     string   // removed on failure/Close; "" for persistent
	tmpLock    *os.File // flock'ed while tmpDir is in use; see sweepStale
	persistent bool
	crashable  bool // Options.Crashable: commits acknowledged only once written
	started    bool // the server was started once: a restart keeps its log
}

// removeTmp deletes the throwaway directory, then releases its lock.
func (p *localPlan) removeTmp() error {
	if p.tmpDir == "" {
		return nil
	}
	err := os.RemoveAll(p.tmpDir)
	if p.tmpLock != nil {
		_ = p.tmpLock.Close()
	}
	return err
}

// provisionLocal starts a cluster from local binaries. It is the code path
// Provision takes when DATABASE_URL is unset; tests call it directly to
// exercise it regardless of the environment.
func provisionLocal(ctx context.Context, opts Options) (c *Cluster, err error) {
	wantMajor := 0
	var dataDir string
	if opts.DataDir != "" {
		dataDir, err = filepath.Abs(opts.DataDir)
		if err != nil {
			return nil, err
		}
		if b, err := os.ReadFile(filepath.Join(dataDir, "PG_VERSION")); err == nil {
			wantMajor, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
	}
	bin, err := findBinaries(opts.machine(), wantMajor)
	if err != nil {
		return nil, err
	}
	su, err := lookupServerUser(opts.machine())
	if err != nil {
		return nil, err
	}

	var plan *localPlan
	if dataDir != "" {
		plan, err = preparePersistent(bin, su, dataDir)
	} else {
		plan, err = prepareThrowaway(bin, su)
	}
	if err != nil {
		return nil, err
	}
	plan.crashable = opts.Crashable
	defer func() {
		if err != nil {
			_ = plan.removeTmp()
		}
	}()

	if _, statErr := os.Stat(filepath.Join(plan.dataDir, "PG_VERSION")); statErr != nil {
		if err := runInitdb(ctx, plan); err != nil {
			return nil, err
		}
	}

	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		srv, err := startServer(ctx, plan, port)
		if errors.Is(err, errPortInUse) && attempt < startAttempts {
			continue
		}
		if err != nil {
			return nil, err
		}

		kind := "throwaway data dir"
		if plan.persistent {
			kind = "data dir"
		}
		opts.logf("testpg: started PostgreSQL %d (%s) on 127.0.0.1:%d, %s %s", bin.major, bin.dir, port, kind, plan.dataDir)
		c := &Cluster{URL: srv.url, source: "local", dataDir: plan.dataDir, tmpDir: plan.tmpDir, srv: srv, port: port}
		if plan.crashable {
			c.plan = plan
		}
		c.closeFn = func() error {
			c.mu.Lock()
			srv := c.srv
			c.mu.Unlock()
			var stopErr error
			if plan.persistent {
				// Fast shutdown: checkpoint, so the next
				// start needs no crash recovery.
				stopErr = srv.stop(syscall.SIGINT, time.Minute)
			} else {
				// Immediate shutdown: the data is thrown away.
				stopErr = srv.stop(syscall.SIGQUIT, 15*time.Second)
			}
			if err := plan.removeTmp(); err != nil && stopErr == nil {
				stopErr = err
			}
			return stopErr
		}
		return c, nil
	}
}

const (
	tmpPattern = "testpg-"
	lockName   = ".testpg.lock"
)

// prepareThrowaway creates the temporary directory holding data, socket and
// log of a throwaway cluster.
func prepareThrowaway(bin pgBinaries, su *serverUser) (*localPlan, error) {
	var lastErr error
	for _, parent := range []string{os.TempDir(), "/tmp"} {
		sweepStale(parent)
		tmp, err := os.MkdirTemp(parent, tmpPattern)
		if err != nil {
			lastErr = err
			continue
		}
		var lock *os.File
		if tmp, err = filepath.EvalSymlinks(tmp); err == nil {
			lock, err = lockDir(tmp)
		}
		if err == nil {
			err = su.chown(tmp)
		}
		if err == nil {
			err = su.canReach(tmp)
		}
		if err == nil && len(tmp)+len("/.s.PGSQL.65535") > maxSocketPath {
			err = fmt.Errorf("temporary directory path %s is too long for a unix socket", tmp)
		}
		if err != nil {
			_ = os.RemoveAll(tmp)
			if lock != nil {
				_ = lock.Close()
			}
			lastErr = err
			continue
		}
		return &localPlan{
			tmpLock:   lock,
			bin:       bin,
			user:      su,
			dataDir:   filepath.Join(tmp, "data"),
			socketDir: tmp,
			logPath:   filepath.Join(tmp, "postgres.log"),
			workDir:   tmp,
			tmpDir:    tmp,
		}, nil
	}
	return nil, fmt.Errorf("create temporary directory: %w", lastErr)
}

// lockDir takes an exclusive flock on a file in dir for as long as the
// returned file stays open. The kernel drops it when the process dies, however
// it dies, which is how sweepStale tells abandoned directories from live ones.
// (The descriptor is close-on-exec, so postgres does not inherit it.)
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

// sweepStale removes throwaway directories left behind by processes that were
// killed before they could clean up (SIGKILL, go test -timeout), so they do
// not pile up in /tmp. A directory is stale when nobody holds its lock; very
// young directories are skipped because their creator may not have locked
// them yet. Errors are ignored: this is best-effort housekeeping.
func sweepStale(parent string) {
	dirs, _ := filepath.Glob(filepath.Join(parent, tmpPattern+"*"))
	for _, dir := range dirs {
		fi, err := os.Lstat(dir)
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < time.Minute {
			continue
		}
		f, err := os.Open(filepath.Join(dir, lockName))
		if err != nil {
			continue // not ours, or not readable by us
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			// A postmaster that survived its parent (no parent-death
			// signal outside Linux) notices its removed data
			// directory and shuts itself down.
			_ = os.RemoveAll(dir)
		}
		f.Close()
	}
}

// preparePersistent checks (and if needed creates) a persistent data
// directory.
func preparePersistent(bin pgBinaries, su *serverUser, dataDir string) (*localPlan, error) {
	entries, err := os.ReadDir(dataDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(filepath.Dir(dataDir), 0o755); err != nil {
			return nil, err
		}
		if err := os.Mkdir(dataDir, 0o700); err != nil {
			return nil, err
		}
		entries = nil
	case err != nil:
		return nil, err
	}
	if len(entries) == 0 {
		// initdb insists on owning an empty 0700 directory.
		if err := su.chown(dataDir); err != nil {
			return nil, err
		}
		if err := os.Chmod(dataDir, 0o700); err != nil {
			return nil, err
		}
	} else if _, err := os.Stat(filepath.Join(dataDir, "PG_VERSION")); err != nil {
		return nil, fmt.Errorf("%s is neither empty nor a PostgreSQL data directory", dataDir)
	} else if pid, running := postmasterRunning(dataDir); running {
		// Postgres would refuse to start on it too, but only after
		// startServer truncated the running cluster's log (QA).
		return nil, fmt.Errorf("%s is in use by a running postgres (pid %d), another scripts/dev perhaps: "+
			"stop it, or choose another data directory", dataDir, pid)
	}
	if err := su.canReach(dataDir); err != nil {
		return nil, fmt.Errorf("%w; choose a data directory outside it (scripts/dev: set RATCHET_DEV_PGDATA)", err)
	}
	socketDir := dataDir
	if len(socketDir)+len("/.s.PGSQL.65535") > maxSocketPath {
		socketDir = "" // TCP only; the URL uses TCP anyway
	}
	return &localPlan{
		bin:        bin,
		user:       su,
		dataDir:    dataDir,
		socketDir:  socketDir,
		logPath:    filepath.Join(dataDir, "postgres.log"),
		workDir:    dataDir,
		persistent: true,
	}, nil
}

func runInitdb(ctx context.Context, plan *localPlan) error {
	args := []string{
		"-D", plan.dataDir,
		"-U", superuser,
		"--auth=trust", // local-only server; no passwords to manage
		"--encoding=UTF8",
		"--locale=C",
	}
	if !plan.persistent {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(plan.bin.dir, "initdb"), args...)
	cmd.Dir = plan.workDir
	cmd.Env = serverEnv()
	cmd.SysProcAttr = plan.user.sysProcAttr()
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("initdb: %w", ctx.Err())
		}
		return fmt.Errorf("initdb %s: %w\n%s", plan.dataDir, err, tail(out.Bytes(), 20))
	}
	return nil
}

// freePort asks the kernel for a currently unused port on 127.0.0.1. Another
// process may take it before postgres binds it; startServer reports that as
// errPortInUse and the caller tries again.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// localServer is a running postmaster started by startServer.
type localServer struct {
	proc    *os.Process
	exited  chan struct{} // closed once the postmaster has been reaped
	url     string
	logPath string
}

// startServer starts postgres on port and waits until it accepts
// connections. On any failure the process is killed before returning.
func startServer(ctx context.Context, plan *localPlan, port int) (*localServer, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if plan.started {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	logFile, err := os.OpenFile(plan.logPath, flags, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy

	args := []string{
		"-D", plan.dataDir,
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + plan.socketDir,
	}
	if !plan.persistent {
		for _, s := range throwawaySettings {
			if plan.crashable && strings.HasPrefix(s, "synchronous_commit=") {
				s = "synchronous_commit=on" // an acknowledged commit survives a crash
			}
			args = append(args, "-c", s)
		}
	}
	cmd := exec.Command(filepath.Join(plan.bin.dir, "postgres"), args...)
	cmd.Dir = plan.workDir
	cmd.Env = serverEnv()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = plan.user.sysProcAttr()
	// SIGQUIT = immediate shutdown; the postmaster takes its backends down.
	setParentDeathSignal(cmd.SysProcAttr, syscall.SIGQUIT)

	// The parent-death signal fires when the *thread* that forked the
	// child exits. Go may retire threads, so fork from a goroutine locked
	// to its thread and keep it alive (waiting) as long as postgres runs.
	srv := &localServer{exited: make(chan struct{}), logPath: plan.logPath}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: when this goroutine returns the thread is
		// destroyed, which is harmless because postgres is gone by then.
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(srv.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	srv.proc = cmd.Process
	srv.url = fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", superuser, port)

	if err := srv.waitStarted(ctx, plan.dataDir); err != nil {
		_ = srv.stop(syscall.SIGQUIT, 5*time.Second)
		logTail := srv.logTail()
		if strings.Contains(logTail, "could not create any TCP/IP sockets") || strings.Contains(logTail, "Address already in use") {
			return nil, fmt.Errorf("%w: %d", errPortInUse, port)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("start postgres: %w", ctx.Err())
		}
		return nil, fmt.Errorf("postgres did not become ready: %w; log %s ends with:\n%s", err, plan.logPath, logTail)
	}
	plan.started = true
	return srv, nil
}

// waitStarted waits until the postmaster reports "ready" in its pid file,
// then until pgx can connect. Checking the pid file first makes sure that the
// server answering on the port is ours and not some other process that
// grabbed the port while ours failed to bind it.
func (s *localServer) waitStarted(ctx context.Context, dataDir string) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	pidFile := filepath.Join(dataDir, "postmaster.pid")
	for !postmasterReady(pidFile, s.proc.Pid) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.exited:
			return errServerExited
		case <-time.After(25 * time.Millisecond):
		}
	}
	return waitReady(ctx, s.url, s.exited, readyTimeout)
}

// postmasterRunning reports the postmaster whose pid dataDir's
// postmaster.pid names, when that process is alive and, where /proc says,
// is a postgres (a stale file's pid may have been reused).
func postmasterRunning(dataDir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, false
	}
	// EPERM is another user's process: not this cluster's postmaster, which
	// runs as the user that started it (root signals anyone), so a stale
	// file whose pid was reused, as postgres itself reads it (review).
	if err := syscall.Kill(pid, 0); err != nil {
		return 0, false
	}
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil &&
		!strings.HasPrefix(string(comm), "postgres") {
		return 0, false
	}
	return pid, true
}

// postmasterReady parses postmaster.pid: line 1 is the PID, line 8 the
// status ("ready" once connections are accepted; PostgreSQL 10+).
func postmasterReady(pidFile string, pid int) bool {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return false
	}
	lines := strings.Split(string(b), "\n")
	return len(lines) >= 8 && strings.TrimSpace(lines[0]) == strconv.Itoa(pid) && strings.TrimSpace(lines[7]) == "ready"
}

// stop sends sig to the postmaster and waits up to grace for it to exit,
// then kills it. Backends notice the dead postmaster and exit on their own.
func (s *localServer) stop(sig syscall.Signal, grace time.Duration) error {
	select {
	case <-s.exited:
		return nil
	default:
	}
	_ = s.proc.Signal(sig)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-s.exited:
		return nil
	case <-timer.C:
	}
	_ = s.proc.Kill()
	<-s.exited
	return fmt.Errorf("postgres did not stop within %s of %v and was killed", grace, sig)
}

func (s *localServer) logTail() string {
	b, err := readTail(s.logPath, 16<<10)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	return tail(b, 20)
}

func readTail(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		if _, err := f.Seek(-n, io.SeekEnd); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(f)
}

// tail returns the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---------------------------------------------------------------------------
// Docker

// provisionContainer starts ContainerImage with testcontainers-go, within
// the machine's containerWait (an image pull from a registry that never
// answers would otherwise hang the caller). The container is also removed
// by testcontainers' reaper (Ryuk) if this process dies without calling
// Close.
func provisionContainer(ctx context.Context, opts Options) (*Cluster, error) {
	h := opts.machine()
	if err := h.dockerPing(ctx); err != nil {
		return nil, fmt.Errorf("docker daemon not reachable: %w", err)
	}
	cmd := []string{"postgres"}
	for _, s := range throwawaySettings {
		cmd = append(cmd, "-c", s)
	}
	startCtx, cancel := context.WithTimeout(ctx, h.containerWait)
	defer cancel()
	connString, terminate, err := h.runContainer(startCtx, cmd)
	if err == nil {
		err = waitReady(startCtx, connString, nil, readyTimeout)
	}
	if err != nil {
		if terminate != nil {
			_ = terminate()
		}
		if ctx.Err() == nil && startCtx.Err() != nil {
			return nil, fmt.Errorf("start %s container: not up within %v (is the image's registry reachable?): %w", ContainerImage, h.containerWait, err)
		}
		return nil, fmt.Errorf("start %s container: %w", ContainerImage, err)
	}
	opts.logf("testpg: started Docker container %s", ContainerImage)
	return &Cluster{URL: connString, source: "docker", closeFn: terminate}, nil
}

// runContainer is thisMachine's runContainer: ContainerImage through
// testcontainers-go, the server started with cmd.
func runContainer(ctx context.Context, cmd []string) (string, func() error, error) {
	ctr, err := tcpostgres.Run(ctx, ContainerImage,
		testcontainers.WithLogger(tclog.NewNoopLogger()),
		tcpostgres.WithDatabase(superuser),
		tcpostgres.WithUsername(superuser),
		tcpostgres.WithPassword(superuser),
		testcontainers.WithCmd(cmd...),
		tcpostgres.BasicWaitStrategies(),
	)
	terminate := func() error { return testcontainers.TerminateContainer(ctr) }
	if err != nil {
		return "", terminate, err
	}
	connString, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", terminate, err
	}
	return connString, terminate, nil
}

// dockerReachable pings the Docker daemon. testcontainers may panic when no
// daemon is configured at all, hence the recover.
func dockerReachable(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	provider, err := testcontainers.ProviderDefault.GetProvider(testcontainers.WithLogger(tclog.NewNoopLogger()))
	if err != nil {
		return err
	}
	defer provider.Close()
	return provider.Health(ctx)
}

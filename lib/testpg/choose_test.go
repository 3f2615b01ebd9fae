package testpg

import (
	"context"
	"errors"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeMachine is a machine with nothing on it: no $DATABASE_URL, an empty
// $PATH, no install locations, not root, and no Docker. Each test adds the
// one thing its branch needs.
func fakeMachine(t *testing.T, env map[string]string) *machine {
	return &machine{
		getenv:     func(k string) string { return env[k] },
		geteuid:    func() int { return 1000 },
		lookupUser: func(string) (*user.User, error) { return nil, errors.New("no users here") },
		dockerPing: func(context.Context) error { return errors.New("Cannot connect to the Docker daemon") },
		urlWait:    readyTimeout,
	}
}

// fakeBinDir writes initdb, postgres and pg_ctl stand-ins, postgres
// answering --version as PostgreSQL major; initdb exits with initdbStatus.
func fakeBinDir(t *testing.T, dir string, major, initdbStatus int) string {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	version := "#!/bin/sh\necho 'postgres (PostgreSQL) " + strconv.Itoa(major) + ".3'\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "postgres"), []byte(version), 0o755))
	initdb := "#!/bin/sh\necho 'initdb: fake failure' >&2\nexit " + strconv.Itoa(initdbStatus) + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "initdb"), []byte(initdb), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pg_ctl"), []byte("#!/bin/sh\nexit 1\n"), 0o755))
	return dir
}

func TestProvisionChoosesASource(t *testing.T) {
	t.Parallel()

	t.Run("nothing available says what to install", func(t *testing.T) {
		t.Parallel()
		h := fakeMachine(t, nil)
		pinged := false
		h.dockerPing = func(context.Context) error {
			pinged = true
			return errors.New("Cannot connect to the Docker daemon")
		}
		c, err := Provision(context.Background(), Options{host: h})
		require.Nil(t, c)
		require.True(t, pinged, "Docker is tried when there are no binaries")
		for _, want := range []string{"no PostgreSQL available", "initdb", "Cannot connect to the Docker daemon",
			"apt-get install postgresql", "brew install postgresql", "Docker", "DATABASE_URL"} {
			require.ErrorContains(t, err, want)
		}
	})

	t.Run("DATABASE_URL is used and nothing else is tried", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		real, err := Provision(ctx, Options{})
		require.NoError(t, err)
		defer real.Close()

		h := fakeMachine(t, map[string]string{"DATABASE_URL": real.URL})
		h.dockerPing = func(context.Context) error { t.Error("Docker tried although DATABASE_URL is set"); return nil }
		c, err := Provision(ctx, Options{host: h, DataDir: "ignored"})
		require.NoError(t, err)
		require.Equal(t, "env", c.source)
		require.Equal(t, real.URL, c.URL)
		require.NoError(t, c.Close())
	})

	// A refused port: the error says DATABASE_URL is the problem, what the
	// server answered, and how to do without it, once the wait is up.
	t.Run("DATABASE_URL refusing connections is a clear error", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		h := fakeMachine(t, map[string]string{"DATABASE_URL": "postgres://postgres:s3cret@" + addr + "/postgres?sslmode=disable"})
		h.urlWait = 300 * time.Millisecond
		c, err := Provision(context.Background(), Options{host: h})
		require.Nil(t, c)
		require.ErrorContains(t, err, "DATABASE_URL is set but not usable")
		require.ErrorContains(t, err, "unset it")
		require.ErrorContains(t, err, addr)
		require.NotContains(t, err.Error(), "s3cret", "the password is not shown")
	})

	// A server that takes the connection and never answers (a firewall,
	// a wedged proxy) ends in the same error, not a hang.
	t.Run("DATABASE_URL never answering is an error, not a hang", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close()
		go func() {
			var held []net.Conn
			for {
				conn, err := l.Accept()
				if err != nil {
					for _, c := range held {
						c.Close()
					}
					return
				}
				held = append(held, conn) // silent
			}
		}()
		h := fakeMachine(t, map[string]string{"DATABASE_URL": "postgres://postgres@" + l.Addr().String() + "/postgres?sslmode=disable"})
		h.urlWait = 300 * time.Millisecond
		_, err = Provision(context.Background(), Options{host: h})
		require.ErrorContains(t, err, "DATABASE_URL is set but not usable")
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})

	// A URL that cannot parse fails at once: retrying it for the whole
	// wait (as it did) only delays the same answer (QA).
	t.Run("malformed DATABASE_URL fails at once", func(t *testing.T) {
		t.Parallel()
		h := fakeMachine(t, map[string]string{"DATABASE_URL": "postgres://postgres:s3cret@127.0.0.1:notaport/postgres"})
		h.urlWait = time.Minute
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := Provision(ctx, Options{host: h})
		require.ErrorContains(t, err, "DATABASE_URL is set but is not a PostgreSQL connection string")
		require.NotErrorIs(t, err, context.DeadlineExceeded, "it waited instead of failing at once")
		require.NotContains(t, err.Error(), "s3cret", "the password is not shown")
	})

	// Binaries that are there but fail: a throwaway cluster falls back to
	// Docker (and the error tells both stories); a persistent one never
	// does, since an empty container must not replace its data.
	t.Run("local failure falls back to Docker for a throwaway cluster only", func(t *testing.T) {
		t.Parallel()
		bin := fakeBinDir(t, filepath.Join(t.TempDir(), "bin"), 16, 1)
		h := fakeMachine(t, map[string]string{"PATH": bin})
		pinged := 0
		h.dockerPing = func(context.Context) error { pinged++; return errors.New("no docker") }

		_, err := Provision(context.Background(), Options{host: h})
		require.Equal(t, 1, pinged)
		require.ErrorContains(t, err, "initdb: fake failure")
		require.ErrorContains(t, err, "no docker")
		require.ErrorContains(t, err, "apt-get install postgresql")

		parent, err := os.MkdirTemp("", "testpg-choose-")
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(parent) })
		_, err = Provision(context.Background(), Options{host: h, DataDir: filepath.Join(parent, "pg")})
		require.Equal(t, 1, pinged, "Docker tried for a persistent cluster")
		require.ErrorContains(t, err, "initdb: fake failure")
	})
}

func TestFindBinaries(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	onPath := fakeBinDir(t, filepath.Join(root, "path"), 15, 0)
	fakeBinDir(t, filepath.Join(root, "lib", "14", "bin"), 14, 0)
	fakeBinDir(t, filepath.Join(root, "lib", "16", "bin"), 16, 0)
	onlyPostgres := filepath.Join(root, "half")
	fakeBinDir(t, onlyPostgres, 17, 0)
	require.NoError(t, os.Remove(filepath.Join(onlyPostgres, "initdb")))
	// A server package without pg_ctl starts clusters but cannot crash
	// them (Cluster.Crash): it does not count either.
	noPgCtl := filepath.Join(root, "nopgctl")
	fakeBinDir(t, noPgCtl, 18, 0)
	require.NoError(t, os.Remove(filepath.Join(noPgCtl, "pg_ctl")))
	globs := []string{filepath.Join(root, "lib", "*", "bin")}

	machineWith := func(path string, globs []string) *machine {
		h := fakeMachine(t, map[string]string{"PATH": path})
		h.globs = globs
		return h
	}

	t.Run("the newest of several versions", func(t *testing.T) {
		b, err := findBinaries(machineWith(onlyPostgres+string(os.PathListSeparator)+noPgCtl+string(os.PathListSeparator)+onPath, globs), 0)
		require.NoError(t, err)
		require.Equal(t, 16, b.major, "a postgres without initdb or pg_ctl beside it does not count")
		require.Equal(t, filepath.Join(root, "lib", "16", "bin"), b.dir)
	})
	t.Run("the data directory's version", func(t *testing.T) {
		b, err := findBinaries(machineWith(onPath, globs), 14)
		require.NoError(t, err)
		require.Equal(t, filepath.Join(root, "lib", "14", "bin"), b.dir)
		_, err = findBinaries(machineWith(onPath, globs), 12)
		require.ErrorContains(t, err, "data directory needs PostgreSQL 12, but only version 16 binaries were found")
	})
	t.Run("only on PATH", func(t *testing.T) {
		b, err := findBinaries(machineWith("::"+onPath, nil), 0)
		require.NoError(t, err)
		require.Equal(t, binaryResult(onPath, 15), b)
	})
	// initdb and postgres run in another working directory: a relative
	// $PATH entry must come back absolute (it came back as found and
	// the server would not start).
	t.Run("a relative PATH entry", func(t *testing.T) {
		cwd, err := os.Getwd()
		require.NoError(t, err)
		rel, err := filepath.Rel(cwd, onPath)
		require.NoError(t, err)
		b, err := findBinaries(machineWith(rel, nil), 0)
		require.NoError(t, err)
		require.Equal(t, onPath, b.dir)
	})
	t.Run("equal versions: PATH order wins", func(t *testing.T) {
		second := fakeBinDir(t, filepath.Join(root, "second"), 15, 0)
		b, err := findBinaries(machineWith(second+string(os.PathListSeparator)+onPath, nil), 0)
		require.NoError(t, err)
		require.Equal(t, second, b.dir)
	})
	t.Run("none", func(t *testing.T) {
		_, err := findBinaries(machineWith(onlyPostgres+string(os.PathListSeparator)+noPgCtl, nil), 0)
		require.ErrorIs(t, err, ErrNoBinaries)
		require.ErrorContains(t, err, "pg_ctl")
	})
}

// Docker reachable but its image pull never ending (a registry that does
// not answer): Provision gives up after the machine's containerWait and
// says so, rather than hang.
func TestProvisionContainerHasATimeLimit(t *testing.T) {
	t.Parallel()
	h := fakeMachine(t, nil)
	h.dockerPing = func(context.Context) error { return nil }
	h.containerWait = 50 * time.Millisecond
	terminated := false
	h.runContainer = func(ctx context.Context, _ []string) (string, func() error, error) {
		if _, ok := ctx.Deadline(); !ok {
			return "", nil, errors.New("started without a time limit")
		}
		<-ctx.Done() // the pull that never ends
		return "", func() error { terminated = true; return nil }, ctx.Err()
	}
	c, err := Provision(context.Background(), Options{host: h})
	require.Nil(t, c)
	require.ErrorContains(t, err, "not up within 50ms")
	require.ErrorContains(t, err, "registry")
	require.True(t, terminated, "what was started is removed")
}

// As root the server runs as another user, who must reach the data
// directory: when it cannot, the error names the variable scripts/dev
// takes another directory from.
func TestPersistentDataDirOutOfReachNamesTheVariable(t *testing.T) {
	t.Parallel()
	parent := filepath.Join(t.TempDir(), "private")
	dataDir := filepath.Join(parent, "pg")
	require.NoError(t, os.MkdirAll(dataDir, 0o755))
	require.NoError(t, os.Chmod(parent, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "PG_VERSION"), []byte("16\n"), 0o600))
	su := &serverUser{name: "postgres", uid: uint32(os.Getuid()) + 4242, gid: uint32(os.Getgid()) + 4242}
	_, err := preparePersistent(pgBinaries{dir: "/nonexistent", major: 16}, su, dataDir)
	require.ErrorContains(t, err, "cannot access "+parent)
	require.ErrorContains(t, err, "RATCHET_DEV_PGDATA")
}

func binaryResult(dir string, major int) pgBinaries { return pgBinaries{dir: dir, major: major} }

// PostgreSQL refuses to run as root: as root the server runs as "postgres",
// else "nobody", never as a uid-0 account; without either the error says
// what to create.
func TestLookupServerUser(t *testing.T) {
	t.Parallel()
	users := map[string]*user.User{}
	h := fakeMachine(t, nil)
	h.lookupUser = func(name string) (*user.User, error) {
		if u, ok := users[name]; ok {
			return u, nil
		}
		return nil, user.UnknownUserError(name)
	}

	su, err := lookupServerUser(h)
	require.NoError(t, err)
	require.Nil(t, su, "not root: run as ourselves")

	h.geteuid = func() int { return 0 }
	_, err = lookupServerUser(h)
	require.ErrorContains(t, err, "useradd --system postgres")

	users["postgres"] = &user.User{Uid: "0", Gid: "0"}
	_, err = lookupServerUser(h)
	require.Error(t, err, "a postgres account with uid 0 is root all the same")

	users["nobody"] = &user.User{Uid: "65534", Gid: "65534"}
	su, err = lookupServerUser(h)
	require.NoError(t, err)
	require.Equal(t, &serverUser{name: "nobody", uid: 65534, gid: 65534}, su)

	users["postgres"] = &user.User{Uid: "108", Gid: "115"}
	su, err = lookupServerUser(h)
	require.NoError(t, err)
	require.Equal(t, &serverUser{name: "postgres", uid: 108, gid: 115}, su)
}

// A postmaster.pid left by a crashed run names a process that is gone, or
// one that is not a postgres (its pid reused): the data directory is free.
func TestPostmasterRunningIgnoresAStalePidFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(pid int) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "postmaster.pid"),
			[]byte(strconv.Itoa(pid)+"\n"+dir+"\n1700000000\n5432\n\n127.0.0.1\n  0 0\nready\n"), 0o600))
	}
	_, running := postmasterRunning(dir)
	require.False(t, running, "no pid file")
	write(os.Getpid()) // alive, but the test binary, not a postgres
	if _, err := os.Stat("/proc/self/comm"); err == nil {
		_, running = postmasterRunning(dir)
		require.False(t, running, "a reused pid")
	}
	write(1 << 22) // above Linux's pid_max: no such process
	_, running = postmasterRunning(dir)
	require.False(t, running, "a dead pid")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte("garbage"), 0o600))
	_, running = postmasterRunning(dir)
	require.False(t, running, "an unreadable pid file")
}

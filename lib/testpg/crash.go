package testpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Crashable is a Crashable cluster of the test's own, closed when it ends.
// Where there are no local PostgreSQL server binaries the test cannot
// crash a database (a shared server must not be taken down, and this
// package does not crash containers), and it fails saying so: a skip
// would pass unseen in a plain `go test`. RATCHET_SKIP_DB_CRASH=1 asks for
// the skip instead, on a machine that has Docker only, say.
func Crashable(t testing.TB, ctx context.Context) *Cluster {
	t.Helper()
	c, err := Provision(ctx, Options{Crashable: true, Logf: t.Logf})
	if errors.Is(err, ErrNoBinaries) {
		why := fmt.Sprintf("%s crashes a PostgreSQL cluster of its own and needs local server binaries "+
			"(initdb, postgres, pg_ctl; Debian: apt-get install postgresql; macOS: brew install postgresql): %v",
			t.Name(), err)
		if os.Getenv("RATCHET_SKIP_DB_CRASH") != "1" {
			t.Fatal(why + "; set RATCHET_SKIP_DB_CRASH=1 to skip it")
		}
		t.Skip("NOT RUN (RATCHET_SKIP_DB_CRASH=1): " + why)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Crash stops a Crashable cluster's server as `pg_ctl stop -m immediate`
// does, with that command: every backend quits at once, nothing is
// checkpointed, and the next start runs crash recovery from the WAL. It
// returns once the server has exited; its URL then refuses connections.
func (c *Cluster) Crash(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.plan == nil {
		return errors.New("testpg: only a Crashable cluster can be crashed")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.plan.bin.dir, "pg_ctl"), "stop", "-m", "immediate", "-w",
		"-D", c.plan.dataDir)
	cmd.Dir = c.plan.workDir
	cmd.Env = serverEnv()
	// pg_ctl refuses to run as root, as postgres does.
	cmd.SysProcAttr = c.plan.user.sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testpg: pg_ctl stop -m immediate: %w\n%s", err, out)
	}
	select {
	case <-c.srv.exited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("testpg: the crashed server did not exit: %w", ctx.Err())
	}
}

// Restart starts a Crashable cluster's server again, after Crash, on the
// same port and data directory (its URL unchanged), and returns once crash
// recovery is done and it accepts connections. Its log is kept across
// restarts.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.plan == nil {
		return errors.New("testpg: only a Crashable cluster can be restarted")
	}
	select {
	case <-c.srv.exited:
	default:
		return errors.New("testpg: the server is still running; Crash it first")
	}
	srv, err := startServer(ctx, c.plan, c.port)
	if err != nil {
		return fmt.Errorf("testpg: restart: %w", err)
	}
	c.srv = srv
	return nil
}

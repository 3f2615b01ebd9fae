package sdktest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
)

// The other languages' SDKs, from this package's directory. Their own tests
// run against the real service here: this package's router over real
// Postgres, reached over HTTP at RATCHET_TEST_BASE_URL.
const (
	pythonSDK     = "../../sdk/python"
	typescriptSDK = "../../sdk/typescript"
	// The operator console is no SDK, but its tests are JavaScript run
	// against the service in the same way.
	consolePages = "../console"
)

// TestPythonSDK runs sdk/python/tests (the standard library's unittest).
// RATCHET_PYTHON names the interpreter (python3 by default, 3.10 or newer).
func TestPythonSDK(t *testing.T) {
	t.Parallel()
	python := pythonInterpreter(t)
	out := runAgainstServer(t, pythonSDK, nil, python, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", "tests")
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests?`).FindStringSubmatch(out)
	require.NotNil(t, ran, "no unittest summary in:\n%s", out)
	requireRanAll(t, out, ran[1], regexp.MustCompile(`(?m)skipped|\.\.\. skip`).MatchString(out), 20)
}

// TestTypeScriptSDK runs sdk/typescript/test (node:test). RATCHET_NODE
// names the runtime (node by default, 18 or newer).
func TestTypeScriptSDK(t *testing.T) {
	t.Parallel()
	runNodeTests(t, typescriptSDK, "test", "*.test.js", 20)
}

// TestConsole drives the operator console's pages (lib/console) from Node
// against the service, through their own forms and buttons. A job's lease
// lapses 500 ms after its timeout, so that a page showing a lapsed attempt
// can be tested in seconds.
func TestConsole(t *testing.T) {
	t.Parallel()
	runNodeTests(t, consolePages, "jstest", "*.test.mjs", 10, func(c *config.Config) { c.JobLeaseGraceMs = 500 })
}

// runNodeTests runs dir/sub/pattern with node:test against the service
// (configured by configure, when given), failing on any failed or skipped
// test, or fewer than atLeast.
func runNodeTests(t *testing.T, dir, sub, pattern string, atLeast int, configure ...func(*config.Config)) {
	t.Helper()
	node := nodeInterpreter(t)
	files, err := filepath.Glob(filepath.Join(dir, sub, pattern))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no test files in %s/%s", dir, sub)
	args := []string{"--test", "--test-reporter=tap"}
	for _, f := range files {
		args = append(args, filepath.Join(sub, filepath.Base(f)))
	}
	out := runAgainstServer(t, dir, configure, node, args...)
	count := func(name string) string {
		m := regexp.MustCompile(`(?m)^# ` + name + ` (\d+)$`).FindStringSubmatch(out)
		require.NotNil(t, m, "no %q count in the TAP summary:\n%s", name, out)
		return m[1]
	}
	require.Equal(t, "0", count("fail"), out)
	requireRanAll(t, out, count("pass"), count("skipped") != "0" || count("todo") != "0" || count("cancelled") != "0", atLeast)
}

// runAgainstServer starts the service and runs name args in dir with
// RATCHET_TEST_BASE_URL pointing at it, failing on a non-zero exit. The
// service delivers webhooks to local receivers, and RATCHET_TEST_CRON_SECRET
// opens its cron route, so that a test can run a sweep (a delivery pass).
func runAgainstServer(t *testing.T, dir string, configure []func(*config.Config), name string, args ...string) string {
	t.Helper()
	var cronSecret string
	env := apitest.Start(t, apitest.WithConfig(func(c *config.Config) {
		c.WebhookAllowPrivateNetworks = true
		cronSecret = c.CronSecret
		for _, f := range configure {
			f(c)
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "RATCHET_TEST_BASE_URL="+env.Server.URL, "RATCHET_TEST_CRON_SECRET="+cronSecret,
		"PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s's tests failed:\n%s", dir, out)
	return string(out)
}

// requireRanAll fails when any test was skipped (a test counted as passing
// that never ran) or when fewer than atLeast ran (a file not picked up).
func requireRanAll(t *testing.T, out, ran string, skipped bool, atLeast int) {
	t.Helper()
	require.False(t, skipped, "some tests were skipped:\n%s", out)
	n, err := strconv.Atoi(ran)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, atLeast, "fewer tests ran than exist:\n%s", out)
}

// pythonInterpreter is RATCHET_PYTHON (python3 by default), 3.10 or newer.
func pythonInterpreter(t *testing.T) string {
	t.Helper()
	return interpreter(t, "RATCHET_PYTHON", "python3", "Python 3.10 or newer (Debian: apt-get install python3)",
		"-c", "import sys; print(sys.version_info >= (3, 10))")
}

// nodeInterpreter is RATCHET_NODE (node by default), 18 or newer.
func nodeInterpreter(t *testing.T) string {
	t.Helper()
	return interpreter(t, "RATCHET_NODE", "node", "Node.js 18 or newer (Debian: apt-get install nodejs)",
		"-e", "console.log(String(Number(process.versions.node.split('.')[0]) >= 18).replace(/^./, c => c.toUpperCase()))")
}

// interpreter finds the program named by env (or def) and checks its
// version with check, which must print True; it fails saying what to
// install when there is none.
func interpreter(t *testing.T, env, def, needs string, check ...string) string {
	t.Helper()
	name := os.Getenv(env)
	if name == "" {
		name = def
	}
	path, err := exec.LookPath(name)
	require.NoError(t, err, "these tests need %s, or %s naming one", needs, env)
	out, err := exec.Command(path, check...).Output()
	require.NoError(t, err, "running %s", path)
	require.Equal(t, "True", strings.TrimSpace(string(out)), "%s is too old: these tests need %s, or %s naming one", path, needs, env)
	return path
}

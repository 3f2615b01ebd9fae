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
)

// pythonSDK is the Python SDK's directory, from this package's.
const pythonSDK = "../../sdk/python"

// TestPythonSDK runs the Python SDK's own tests (sdk/python/tests, the
// standard library's unittest) against the real service: this package's
// router over real Postgres, reached over HTTP. RATCHET_PYTHON names the
// interpreter (python3 by default, 3.10 or newer).
func TestPythonSDK(t *testing.T) {
	python := findPython(t)
	env := apitest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", "tests")
	cmd.Dir = pythonSDK
	cmd.Env = append(os.Environ(), "RATCHET_TEST_BASE_URL="+env.Server.URL, "PYTHONPATH=.",
		"PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the Python SDK's tests failed:\n%s", out)
	summary := string(out)
	// Every test must have run against the server: a skip here would be a
	// test counted as passing that never ran.
	require.NotRegexp(t, regexp.MustCompile(`(?m)skipped|\.\.\. skip`), summary, "some Python tests were skipped:\n%s", out)
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests?`).FindStringSubmatch(summary)
	require.NotNil(t, ran, "no unittest summary in:\n%s", out)
	n, _ := strconv.Atoi(ran[1])
	require.Greater(t, n, 20, "fewer Python tests ran than exist:\n%s", out)
}

// findPython returns a Python 3.10+ interpreter, failing with what to
// install when there is none.
func findPython(t *testing.T) string {
	t.Helper()
	name := os.Getenv("RATCHET_PYTHON")
	if name == "" {
		name = "python3"
	}
	path, err := exec.LookPath(name)
	require.NoError(t, err, "the Python SDK's tests need Python 3.10 or newer: install python3 "+
		"(Debian: apt-get install python3) or set RATCHET_PYTHON to an interpreter")
	out, err := exec.Command(path, "-c", "import sys; print(sys.version_info >= (3, 10))").Output()
	require.NoError(t, err, "running %s", path)
	require.Equal(t, "True", strings.TrimSpace(string(out)),
		"%s is older than Python 3.10, which the Python SDK needs: install a newer python3 or set RATCHET_PYTHON", path)
	abs, err := filepath.Abs(pythonSDK)
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(abs, "getratchet", "__init__.py"))
	require.NoError(t, err, "the Python SDK is not at %s", abs)
	return path
}

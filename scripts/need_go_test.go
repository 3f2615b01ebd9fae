package scripts_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The two commands stop at once, saying what to install, on a machine
// without a go that can build the project (pgenv review: no go answered
// "gofmt: command not found", an old one its own "invalid go version"),
// and change nothing first (scripts/dev writes .data only after).
func TestTheTwoCommandsSayWhichGoTheyNeed(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	want := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	require.NotNil(t, want, "go.mod has no go line")

	// A go that cannot read go.mod, as a release before 1.21 does.
	oldGo := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(oldGo, "go"),
		[]byte("#!/bin/sh\necho 'go: errors parsing go.mod: invalid go version' >&2\nexit 1\n"), 0o755))
	for _, script := range []string{"scripts/test", "scripts/dev"} {
		for name, path := range map[string]string{
			"no go":  "/usr/bin:/bin",
			"old go": oldGo + ":/usr/bin:/bin",
		} {
			t.Run(script+"/"+name, func(t *testing.T) {
				clone := t.TempDir() // a copy of what the scripts read, so .data is never written here
				for _, f := range []string{script, "scripts/need-go.sh", "go.mod"} {
					b, err := os.ReadFile(filepath.Join(root, f))
					require.NoError(t, err)
					require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(clone, f)), 0o755))
					require.NoError(t, os.WriteFile(filepath.Join(clone, f), b, 0o755))
				}
				cmd := exec.Command("bash", filepath.Join(clone, script))
				cmd.Env = append(os.Environ(), "PATH="+path)
				out, err := cmd.CombinedOutput()
				var exit *exec.ExitError
				require.ErrorAs(t, err, &exit, "%s", out)
				require.Equal(t, 1, exit.ExitCode(), "%s", out)
				require.Contains(t, string(out), "Go "+string(want[1])+" or later")
				require.NotContains(t, string(out), "command not found")
				_, err = os.Stat(filepath.Join(clone, ".data"))
				require.True(t, os.IsNotExist(err), "%s wrote .data before checking for go", script)
			})
		}
	}
}

// need_go hands the scripts the gofmt of the toolchain go.mod selects, not
// whichever is first on PATH (an older release's formats differently).
func TestNeedGoPicksTheToolchainsGofmt(t *testing.T) {
	out, err := exec.Command("bash", "-c", `cd .. && source scripts/need-go.sh && need_go t && echo "$GOFMT"`).Output()
	require.NoError(t, err)
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(strings.TrimSpace(string(goroot)), "bin", "gofmt"), strings.TrimSpace(string(out)))
}

package main

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// The local server serves Go's profiles only when RATCHET_PPROF_ADDR asks,
// on that address alone, never on the API's port, and stops serving them
// when it stops (scripts/soak -pprof reads its goroutines and heap there).
func TestProfilesAreServedOnlyWhenAsked(t *testing.T) {
	profilesAt := regexp.MustCompile(`Go profiles on (http://\S+/debug/pprof/)`)
	get := func(url string) (int, string) {
		t.Helper()
		res, err := http.Get(url)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(body)
	}

	t.Run("off by default", func(t *testing.T) {
		t.Setenv(pprofAddrEnv, "")
		require.NoError(t, os.Unsetenv(pprofAddrEnv))
		logs := new(apitest.LockedBuffer)
		base := startOverDatabase(t, apitest.DatabaseURL(t), logs)
		status, _ := get(base + "/debug/pprof/")
		require.Equal(t, http.StatusNotFound, status, "the API's port serves no profiles")
		require.NotRegexp(t, profilesAt, logs.String())
	})

	var profiles string
	t.Run("on when asked", func(t *testing.T) {
		t.Setenv(pprofAddrEnv, "127.0.0.1:0")
		logs := new(apitest.LockedBuffer)
		base := startOverDatabase(t, apitest.DatabaseURL(t), logs)
		m := profilesAt.FindStringSubmatch(logs.String()) // written before the server is ready
		require.NotNil(t, m, "the server says where its profiles are: %s", logs.String())
		profiles = m[1]
		status, body := get(profiles)
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, "goroutine")
		status, body = get(profiles + "goroutine?debug=1") // what scripts/soak reads
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, "goroutine profile: total ")
		status, _ = get(base + "/debug/pprof/")
		require.Equal(t, http.StatusNotFound, status, "still none on the API's port")
	})
	_, err := http.Get(profiles)
	require.Error(t, err, "the profiles stop with the server")
}

// Only the local server can serve profiles: no deployed function (Lambda's
// api and sweeper, Vercel's api/) links net/http/pprof.
func TestNoDeployedFunctionLinksPprof(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the functions' packages with")
	}
	cmd := exec.Command(gobin, "list", "-deps", "../api", "../sweeper", "../../api/...")
	out, err := cmd.Output()
	require.NoError(t, err)
	deps := strings.Fields(string(out))
	require.True(t, slices.Contains(deps, "net/http"), "the list is of the functions' dependencies")
	require.False(t, slices.Contains(deps, "net/http/pprof"), "a deployed function links net/http/pprof")
}

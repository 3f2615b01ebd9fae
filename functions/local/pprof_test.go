package main

import (
	"context"
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

// The profiles are served on loopback only (127.0.0.0/8, ::1, localhost)
// unless RATCHET_PPROF_ALLOW_REMOTE says otherwise: any other address, an
// empty host (every interface) first, stops the server at start with one
// line saying why and what to set (hygiene QA: it served them anywhere, the
// README only warning).
func TestProfilesStayOnLoopbackUnlessAllowed(t *testing.T) {
	for _, c := range []struct {
		addr, allow string
		refused     bool
	}{
		{":6060", "", true}, {"0.0.0.0:6060", "", true}, {"[::]:6060", "", true},
		{"192.0.2.7:6060", "", true}, {"[2001:db8::7]:6060", "", true}, {"example.com:6060", "", true},
		{"localhost.example.com:6060", "0", true},
		{"127.0.0.1:6060", "", false}, {"127.8.9.10:6060", "", false}, {"[::1]:6060", "", false},
		{"localhost:6060", "", false}, {"LocalHost:6060", "", false},
		{":6060", "1", false}, {"192.0.2.7:6060", "true", false},
	} {
		t.Setenv(pprofAddrEnv, c.addr)
		t.Setenv(pprofAllowRemoteEnv, c.allow)
		addr, _, err := pprofAddr()
		if !c.refused {
			require.NoError(t, err, "%s (allow %q)", c.addr, c.allow)
			require.Equal(t, c.addr, addr)
			continue
		}
		require.Error(t, err, "%s (allow %q)", c.addr, c.allow)
		require.NotContains(t, err.Error(), "\n", "one line")
		require.Contains(t, err.Error(), pprofAddrEnv+` "`+c.addr+`" is not a loopback address`)
		require.Contains(t, err.Error(), "use 127.0.0.1:6060")
		require.Contains(t, err.Error(), "or set "+pprofAllowRemoteEnv+"=1")
	}
	t.Setenv(pprofAllowRemoteEnv, "maybe")
	_, _, err := pprofAddr()
	require.ErrorContains(t, err, pprofAllowRemoteEnv+" is malformed")

	t.Run("refused at start", func(t *testing.T) {
		localEnv(t)
		t.Setenv(pprofAllowRemoteEnv, "")
		t.Setenv(pprofAddrEnv, ":0")
		logs := new(apitest.LockedBuffer)
		err := run(context.Background(), logs, nil)
		require.ErrorContains(t, err, pprofAddrEnv+` ":0" is not a loopback address`)
		require.NotContains(t, logs.String(), "listening on", "the server never started")
	})

	t.Run("served off loopback when allowed", func(t *testing.T) {
		t.Setenv(pprofAllowRemoteEnv, "1")
		t.Setenv(pprofAddrEnv, ":0") // every interface, loopback among them
		logs := new(apitest.LockedBuffer)
		startOverDatabase(t, apitest.DatabaseURL(t), logs)
		m := regexp.MustCompile(`Go profiles on http://\S+:(\d+)/debug/pprof/`).FindStringSubmatch(logs.String())
		require.NotNil(t, m, "the server says where its profiles are: %s", logs.String())
		res, err := http.Get("http://127.0.0.1:" + m[1] + "/debug/pprof/")
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
	})
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

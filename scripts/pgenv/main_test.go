package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// pgenv's exit status is the contract scripts/test and scripts/dev rely on:
// usage errors are 2, a failed provisioning 1, a missing command 127, and
// otherwise the command's own status (128+N for death by signal N).
func TestRunExitStatus(t *testing.T) {
	require.Equal(t, 2, run(nil), "no command")
	require.Equal(t, 2, run([]string{"-bogus", "--", "true"}), "unknown flag")

	// Provisioning fails at once, before any command runs.
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:notaport/postgres")
	require.Equal(t, 1, run([]string{"--", "sh", "-c", "exit 0"}))
}

func TestRunPassesTheServerOn(t *testing.T) {
	// Whatever server the environment gives (DATABASE_URL under
	// scripts/test, else a throwaway cluster), the command sees it in
	// DATABASE_URL and its status comes back.
	require.Equal(t, 3, run([]string{"--", "sh", "-c", `test -n "$DATABASE_URL" && exit 3`}))
	require.Equal(t, 128+15, run([]string{"--", "sh", "-c", `kill -TERM $$`}))
	require.Equal(t, 127, run([]string{"--", "/nonexistent/command"}))
}

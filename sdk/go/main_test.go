package ratchet

import (
	"io"
	"log/slog"
	"os"
	"testing"
)

// TestMain discards what reaches slog.Default(): a worker started without
// StartOptions.OnError writes its default failure log there, which printed
// into the tests' output (go test -v, and a failing test's). The tests of
// that log give their worker a logger of its own (loggingWorker) and assert
// its lines.
func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	os.Exit(m.Run())
}

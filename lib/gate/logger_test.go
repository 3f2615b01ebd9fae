package gate_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/gate"
)

// The gate writes every error it logs as redact.ErrorText has it, whatever
// logger it is given, as the jobs', webhooks' and sweeper's services do
// (logs QA: given a plain logger, or nil, it wrote a data exception's
// message, which quotes the value Postgres refused).
func TestGateLogsErrorsAsErrorTextOnAnyLogger(t *testing.T) {
	t.Parallel()
	const marker = "zqleak_gate_logger"
	var buf bytes.Buffer
	svc := gate.New(nil, nil, nil, nil, slog.New(slog.NewTextHandler(&buf, nil)))
	pe := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: `invalid input syntax for type integer: "` + marker + `"`}
	svc.Logger().Warn("kept groups not dated by a lowered retention", "err", fmt.Errorf("shorten kept groups: %w", pe))
	require.Contains(t, buf.String(), "SQLSTATE 22P02")
	require.NotContains(t, buf.String(), marker)
}

package jobs_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/jobs"
)

// The replay preview checks the saved input against its targets' input
// schemas only: its reads of the targets leave their output schemas (up to
// 256 KiB each, a hundred targets a page) in the database (review: both
// read every target's output schema and dropped it).
func TestTheReplayPreviewDoesNotReadOutputSchemas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out := `{"type":"object","description":"` + strings.Repeat("o", 100) + `"}`
	for _, v := range []string{"1", "2"} {
		_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
			HandlerVersion: v, InputSchema: json.RawMessage(`{"type":"object"}`), OutputSchema: json.RawMessage(out)})
		require.NoError(t, err)
	}
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"targets": {jobs.SQLReplayTargets, []any{b.ws, "send_email", 100}},
		"older":   {jobs.SQLReplayOlderTargets, []any{b.ws, "send_email", 3, 100}},
	} {
		rows, err := b.env.App.Pool.Query(ctx, q.sql, q.args...)
		require.NoError(t, err, name)
		read, err := pgx.CollectRows(rows, pgx.RowToMap)
		require.NoError(t, err, name)
		for _, r := range read {
			require.NotNil(t, r["input_schema"], "%s: the input schema is read", name)
			require.True(t, r["output_schema"] == nil, "%s: the output schema is not read", name)
		}
		n := len(read)
		require.Equal(t, 2, n, name)
	}
}

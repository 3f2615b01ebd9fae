package gate_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBeginExecuteReportDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("welcome")
	d := b.mustBegin("execute", email(k))
	require.Equal(t, "leased", d["state"])
	require.EqualValues(t, 1, d["attempt"])
	require.Equal(t, false, d["probe"])
	require.NotEmpty(t, d["lease_token"])
	require.NotEmpty(t, d["lease_expires_at"])
	id := str(d["effect_id"])

	again := b.mustBegin("in_flight", email(k))
	require.Equal(t, id, again["effect_id"])
	require.EqualValues(t, 60, again["retry_after_seconds"])

	r := b.report(id, str(d["lease_token"]), "succeeded", map[string]any{"message_id": "m_1"})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	e := r.JSON()
	require.Equal(t, "succeeded", e["state"])
	require.Equal(t, map[string]any{"message_id": "m_1"}, e["result"])
	attempts := e["attempts"].([]any)
	require.Len(t, attempts, 1)
	require.Equal(t, "succeeded", attempts[0].(map[string]any)["outcome"])

	dup := b.mustBegin("duplicate", email(k))
	require.Equal(t, map[string]any{"message_id": "m_1"}, dup["result"])
	require.Equal(t, "succeeded", dup["state"])
	require.EqualValues(t, 1, dup["attempt"])
}

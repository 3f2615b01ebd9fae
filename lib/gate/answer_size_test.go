package gate_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/redact"
)

// An effect at its worst fits in one answer, through MCP too, so neither
// its read nor a page of effects (which always holds one) passes
// answer.Budget: its attempts are bounded by max_attempts (at most 50, each
// execute one attempt, a resolve none), each with a resolve note of at most
// 2 000 characters, and its result by gate.MaxResultBytes. Here every
// value is of its longest, in the characters that grow most when written
// (a note's control characters are six bytes in the API's JSON and seven
// in an MCP tool result's text; a result's escaped backslashes two and
// four), and the MCP tool result carries the answer as text and as
// structured content (size QA: a step, unbounded the same way, passed it).
func TestAnEffectsWorstAnswerFitsTheBudget(t *testing.T) {
	t.Parallel()
	const maxAttempts = 50 // gate_policies.max_attempts, 1-50
	now := time.Now()
	note, outcome, key := strings.Repeat("\x01", gate.MaxNoteRunes), "succeeded", "key_"+strings.Repeat("x", 26)
	id, cost := "eff_"+strings.Repeat("x", 26), int64(1e18)
	preview := json.RawMessage(`"` + strings.Repeat(`\\`, redact.MaxBytes/2-1) + `"`)
	e := gate.Effect{ID: id, EffectType: strings.Repeat("t", gate.EffectTypeMaxLength),
		IdempotencyKey: strings.Repeat("🙂", 255), State: "succeeded", Attempt: maxAttempts,
		Result:        json.RawMessage(`"` + strings.Repeat(`\\`, gate.MaxResultBytes/2-1) + `"`),
		ResultPreview: preview, PayloadPreview: preview, CostMicros: &cost, RunID: &id, GroupID: &id,
		CompensatesEffectID: &id, DenialCode: &outcome, ApprovalID: &id, LeaseExpiresAt: &now,
		CreatedAt: now, UpdatedAt: now}
	for i := range maxAttempts {
		e.Attempts = append(e.Attempts, gate.Attempt{Attempt: i + 1, Outcome: &outcome, Probe: true, StartedAt: now,
			LeaseExpiresAt: now, ReportedAt: &now, BeganByKeyID: key, ReportedByKeyID: &key, ResolvedByKeyID: &key,
			ResolvedAt: &now, ResolveNote: &note})
	}
	text, err := jsonx.Marshal(e)
	require.NoError(t, err)
	mcp := jsonx.StringLen(string(text)) + len(text) // as mcpserver's room reckons a tool result
	t.Logf("an effect at its worst: %d bytes, %d as an MCP tool result", len(text), mcp)
	require.Less(t, mcp, answer.Budget-64<<10, "an effect at its worst, through MCP")
}

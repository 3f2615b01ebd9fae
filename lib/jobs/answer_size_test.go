package jobs_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// A step at its worst, its last StepAttemptsShown attempts each with a
// warning and an error message of the longest, in characters JSON writes
// as six bytes, and its last StepReplaysShown replays with the longest
// reasons, is answered within answer.Budget with room to spare: a page of
// steps, which always holds one, and a step's read hold it (size QA).
func TestAStepsWorstAnswerFitsTheBudget(t *testing.T) {
	t.Parallel()
	wide := func(n int) string { return strings.Repeat("\x01", n) } // written \u0001
	four := func(n int) string { return strings.Repeat("🙂", n) }
	preview := json.RawMessage(`"` + strings.Repeat(`\u0001`, (8<<10)/6-1) + `"`) // redact.MaxBytes
	now := time.Now()
	after, status := "stp_"+strings.Repeat("x", 26), "SUCCEEDED"
	cv := 1 << 30
	st := jobs.Step{ID: "stp_" + strings.Repeat("x", 26), RunID: "run_" + strings.Repeat("x", 26),
		Name: four(200), Version: four(100), Endpoint: four(200), Status: "EXHAUSTED", IdempotencyKey: four(255),
		AfterStepID: &after, AfterStatus: &status, ContractVersion: &cv, InputPreview: preview, OutputPreview: preview,
		CreatedAt: now, FinishedAt: &now}
	j := &st.DurableJob
	j.ID, j.Status, j.DueAt, j.LeaseExpiresAt = "job_"+strings.Repeat("x", 26), "EXHAUSTED", &now, &now
	for i := range jobs.StepAttemptsShown {
		msg, warn, outcome, retryable, ms := wide(jobs.MaxErrorMessage), wide(jobs.MaxErrorMessage), "FAILED", false, int64(86_400_000)
		j.Attempts = append(j.Attempts, jobs.Attempt{Attempt: 1<<30 - i, WorkerID: "wkr_" + strings.Repeat("x", 26),
			Outcome: &outcome, Warning: &warn, Retryable: &retryable, RetryAfterMs: &ms, ErrorMessage: &msg,
			StartedAt: now, LeaseExpiresAt: now, ReportedAt: &now})
	}
	for range jobs.StepReplaysShown {
		reason := wide(jobs.MaxReplayReason)
		j.Replays = append(j.Replays, jobs.Replay{ID: "rpl_" + strings.Repeat("x", 26), KeyID: "key_" + strings.Repeat("x", 26),
			Reason: &reason, PriorStatus: "EXHAUSTED", PriorAttempt: 1 << 30, AdditionalAttempts: 10, MaxAttempts: 1 << 30,
			OldHandlerVersion: four(100), NewHandlerVersion: four(100), OldContractVersion: &cv, NewContractVersion: &cv,
			CreatedAt: now})
	}
	j.AttemptsTruncated, j.ReplaysTruncated = true, true
	b, err := jsonx.Marshal(st)
	require.NoError(t, err)
	t.Logf("a step at its worst: %d bytes", len(b))
	require.Less(t, len(b), answer.Budget*3/4, "a step at its worst")
}

// A rejected output's reason, the attempt's error message and warning, is
// held to what a worker's message may hold, however long the keys the
// schema refused (size QA: twenty keys of 50 KB made a reason of a
// megabyte, stored twice on the attempt).
func TestARejectedOutputsReasonIsBounded(t *testing.T) {
	t.Parallel()
	schema := []byte(`{"type":"object","additionalProperties":false}`)
	out := map[string]any{}
	for i := range 30 {
		out[fmt.Sprintf("%02d", i)+strings.Repeat("k", 50_000)] = 1
	}
	doc, err := json.Marshal(out)
	require.NoError(t, err)
	reason, err := jobs.OutputRejection(schema, 3, doc)
	require.NoError(t, err)
	require.LessOrEqual(t, utf8.RuneCountInString(reason), jobs.MaxErrorMessage)
	require.True(t, strings.HasPrefix(reason, "Output rejected by contract 3's outputSchema (output.00"), reason[:80])
	require.True(t, strings.HasSuffix(reason, "…); not retried."), reason[len(reason)-40:])

	require.Equal(t, "abc", jobs.CutMessage("abc", 3))
	require.Equal(t, "a…", jobs.CutMessage("abc", 2))
	require.Equal(t, "🙂🙂…", jobs.CutMessage("🙂🙂🙂🙂", 3))
}

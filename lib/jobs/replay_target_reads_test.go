package jobs_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// failedStep enqueues send_email@1 with input, no contract, and exhausts it.
func failedStep(t *testing.T, b *bundle, input string) jobs.EnqueueResult {
	t.Helper()
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{Input: json.RawMessage(input), MaxAttempts: ptr[int64](1)})
	b.fail(t, b.claimOne(t, b.register(t)), &jobs.ReportError{Retryable: ptr(false)})
	return st
}

func publishAs(t *testing.T, b *bundle, version, status, schema string) {
	t.Helper()
	_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
		HandlerVersion: version, InputSchema: json.RawMessage(schema), Status: &status})
	require.NoError(t, err)
}

// damageInput makes the job's saved input one no instance can open.
func damageInput(t *testing.T, b *bundle, jobID string) {
	t.Helper()
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE jobs SET input_sealed = $2 WHERE id = $1`, jobID, []byte("damaged"))
	require.NoError(t, err)
}

// zeros is an array input of n zeros.
func zeros(n int64) string {
	items := make([]string, n)
	for i := range items {
		items[i] = "0"
	}
	return "[" + strings.Join(items, ",") + "]"
}

// anyOf25 checks each item of an array against 25 branches, the last of
// which accepts anything: each item counts 26 evaluations.
var anyOf25 = `{"type":"array","items":{"anyOf":[` + strings.Repeat(`{"type":"string"},`, 24) + `{}]}}`

// The replay preview reads its listed targets' input schemas as its budget
// reaches them: a first batch with the list (the first target, then at
// most jobs.ReplaySchemaBatchBytes), then a batch at a time, each within
// that bound and what the budget left may reach (review: the list read all
// its 100 schemas, up to 256 KiB each, when the budget stopped at the
// first). Here the newest target's check alone could take more than the
// whole budget: no schema is read after it.
func TestTheReplayPreviewReadsListedSchemasAsItsBudgetReachesThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := failedStep(t, b, zeros(jobs.MaxCheckEvaluations/26+1))
	big := `{"type":"array","description":"` + strings.Repeat("d", 200_000) + `"}`
	for range 10 {
		publishAs(t, b, "2", "ACTIVE", big) // each would fit
	}
	publishAs(t, b, "2", "ACTIVE", anyOf25) // 11: its check could pass the budget

	var reads [][]int
	jobs.OnSchemasRead(b.svc, func(versions []int) { reads = append(reads, versions) })
	p, err := b.svc.PreviewReplay(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	require.Len(t, p.Upgrades, 11)
	for _, u := range p.Upgrades {
		require.False(t, u.Checked, "contract %d: the first check could take the whole budget", u.ContractVersion)
	}
	require.True(t, p.Eligible)
	require.Len(t, reads, 1, "the list's read alone: %v", reads)
	require.Contains(t, reads[0], 11)
	require.LessOrEqual(t, (len(reads[0])-1)*len(big), jobs.ReplaySchemaBatchBytes,
		"the first batch holds the first and about 1 MiB more: %v", reads[0])
	require.Less(t, len(reads[0]), 11, "not every schema: %v", reads[0])

	// An input that fits them all reads each schema once, in batches
	// within the bound.
	st = failedStep(t, b, `[]`)
	reads = nil
	p, err = b.svc.PreviewReplay(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	seen := map[int]bool{}
	for i, r := range reads {
		require.NotEmpty(t, r)
		require.LessOrEqual(t, (len(r)-1)*len(big), jobs.ReplaySchemaBatchBytes, "read %d: %v", i, r)
		for _, v := range r {
			require.False(t, seen[v], "contract %d read twice", v)
			seen[v] = true
		}
	}
	require.Len(t, seen, 11)
	require.Greater(t, len(reads), 1, "more than 1 MiB of schemas is read in batches")
	for _, u := range p.Upgrades {
		require.True(t, u.Checked && u.Compatible, "contract %d", u.ContractVersion)
	}

	// An input the instance cannot open reads no schema.
	damageInput(t, b, st.JobID)
	reads = nil
	p, err = b.svc.PreviewReplay(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	require.True(t, p.InputUnreadable)
	require.Equal(t, [][]int{nil}, reads)
}

// The preview spends its budget on the targets a replay may choose first,
// and only what is left on FORBIDDEN ones (review: listed newest first,
// a FORBIDDEN contract newer than the only ACTIVE one spent the budget,
// and the ACTIVE one, which fits, read not checked). Each check here
// counts a little over half the budget.
func TestTheReplayPreviewChecksChoosableTargetsFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := failedStep(t, b, zeros(jobs.MaxCheckEvaluations/2/26+1))
	publishAs(t, b, "2", "ACTIVE", anyOf25)    // 1: fits
	publishAs(t, b, "3", "FORBIDDEN", anyOf25) // 2: newer, never choosable

	p, err := b.svc.PreviewReplay(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	require.Len(t, p.Upgrades, 2)
	forbidden, active := p.Upgrades[0], p.Upgrades[1]
	require.EqualValues(t, 2, forbidden.ContractVersion, "listed newest first")
	require.True(t, active.Checked, "checked first")
	require.True(t, active.Compatible)
	require.Empty(t, active.Validation)
	require.True(t, forbidden.Forbidden)
	require.False(t, forbidden.Checked, "what was left could not cover it")
	require.Contains(t, forbidden.Validation[0].Message, "was not checked")
}

// The preview tells a target's problems as an enqueue does: an input that
// fails every alternative of an anyOf is one problem (QA: one for each).
func TestTheReplayPreviewTellsAFailedAnyOfOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := failedStep(t, b, `{"a":"x"}`)
	publishAs(t, b, "2", "ACTIVE", `{"properties":{"a":{"anyOf":[{"type":"integer"},{"type":"boolean"}]}}}`)
	p, err := b.svc.PreviewReplay(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	require.Len(t, p.Upgrades, 1)
	require.Equal(t, []apierr.FieldError{{Field: "input.a", Message: "must be of type integer or boolean (got string)"}},
		p.Upgrades[0].Validation)
}

package jobs_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jobs"
)

// A step enqueued before its handler version had a contract, replayed once
// every contract of that version is FORBIDDEN: a same-version replay would
// run the forbidden handler, as an enqueue of it no longer may (migration
// 0048), so it is refused (409 invalid_state), the step left as it was;
// replayed onto another version's ACTIVE contract it runs (jobs QA: the
// same-version replay queued the forbidden handler).
func TestASameVersionReplayOfAForbiddenHandlerVersionIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{Input: json.RawMessage(`{}`), MaxAttempts: ptr[int64](1)})
	require.Nil(t, b.step(t, st.StepID).ContractVersion)
	b.fail(t, b.claimOne(t, b.register(t)), &jobs.ReportError{Retryable: ptr(false)})
	require.Equal(t, "EXHAUSTED", b.step(t, st.StepID).Status)

	for _, c := range []struct{ version, status string }{{"1", "FORBIDDEN"}, {"2", "ACTIVE"}} {
		_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
			HandlerVersion: c.version, InputSchema: json.RawMessage(`{"type":"object"}`), Status: &c.status})
		require.NoError(t, err)
	}
	_, err := b.svc.Enqueue(ctx, b.ws, b.run(t), jobs.EnqueueRequest{Name: "send_email", Version: "1"})
	require.Equal(t, apierr.CodeInvalidState, code(t, err), "an enqueue of the forbidden version is refused")

	_, err = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.Equal(t, apierr.CodeInvalidState, code(t, err), "and so is a replay of it")
	require.Contains(t, err.Error(), "FORBIDDEN")
	require.Equal(t, "EXHAUSTED", b.step(t, st.StepID).Status, "nothing changed")

	res, err := b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
		TargetContractVersion: ptr[int64](2), ExpectedHandlerVersion: ptr("1"), AcknowledgeVersionChange: ptr(true)})
	require.NoError(t, err, "an upgrade leaves the forbidden version")
	require.Equal(t, "2", res.HandlerVersion)
	require.Equal(t, "QUEUED", b.step(t, st.StepID).Status)
}

// The preview of a step whose handler version is wholly FORBIDDEN agrees
// with what a replay does: the same-version replay is refused, so the step
// is eligible only while an upgrade that is not FORBIDDEN accepts its saved
// input, and handlerVersionForbidden says only an upgrade can run it (jobs
// QA: it read eligible: true, ineligibleReason null, while every replay
// was refused).
func TestTheReplayPreviewOfAForbiddenHandlerVersionSaysOnlyAnUpgradeRuns(t *testing.T) {
	t.Parallel()
	b, st, publish := exhaustedStep(t)
	preview := func() jobs.ReplayPreview {
		t.Helper()
		p, err := b.svc.PreviewReplay(ctx, b.ws, st.StepID)
		require.NoError(t, err)
		return p
	}
	p := preview()
	require.True(t, p.Eligible, "no contract at all: the same version replays")
	require.False(t, p.HandlerVersionForbidden)

	publish("1", "FORBIDDEN", `{"type":"object"}`)
	publish("2", "FORBIDDEN", `{"type":"object"}`)
	publish("3", "ACTIVE", `{"type":"object","required":["to"]}`)
	p = preview()
	require.True(t, p.HandlerVersionForbidden)
	require.False(t, p.Eligible, "the same version is refused, contract 2 is FORBIDDEN, 3 does not fit")
	require.NotNil(t, p.IneligibleReason)
	require.Contains(t, *p.IneligibleReason, "FORBIDDEN")
	_, err := b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true)})
	require.Equal(t, apierr.CodeInvalidState, code(t, err), "as the replay finds")

	publish("4", "ACTIVE", `{"type":"object"}`)
	p = preview()
	require.True(t, p.HandlerVersionForbidden, "the same version is still refused")
	require.True(t, p.Eligible, "contract 4 takes the step")
	require.Nil(t, p.IneligibleReason)
	_, err = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
		TargetContractVersion: ptr[int64](4), ExpectedHandlerVersion: ptr("1"), AcknowledgeVersionChange: ptr(true)})
	require.NoError(t, err, "as the replay finds")
}

// The preview lists the newest contracts only (100), but its eligibility
// reads them all: a step of a wholly FORBIDDEN handler version whose only
// fitting upgrade is older than the listed page reads eligible, as the
// replay onto that upgrade succeeds (jobs QA: it read eligible: false).
func TestTheReplayPreviewFindsAFittingUpgradeOlderThanItsList(t *testing.T) {
	t.Parallel()
	b, st, publish := exhaustedStep(t)
	publish("1", "FORBIDDEN", `{"type":"object"}`)
	publish("2", "ACTIVE", `{"type":"object"}`)
	// More than a page of newer contracts, half FORBIDDEN, the rest not
	// fitting the saved input.
	for v := 3; v <= 3+jobs.MaxReplayTargets; v++ {
		status := "ACTIVE"
		if v%2 == 0 {
			status = "FORBIDDEN"
		}
		publish(strconv.Itoa(v), status, `{"type":"object","required":["to"]}`)
	}
	p, err := b.svc.PreviewReplay(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	require.True(t, p.HandlerVersionForbidden)
	require.Len(t, p.Upgrades, jobs.MaxReplayTargets, "the list stays bounded")
	for _, u := range p.Upgrades {
		require.NotEqual(t, 2, u.ContractVersion, "contract 2 is older than the list")
		require.False(t, u.Compatible && !u.Forbidden)
	}
	require.True(t, p.Eligible, "contract 2 takes the step")
	require.Nil(t, p.IneligibleReason)
	_, err = b.svc.Replay(ctx, b.worker, st.StepID, jobs.ReplayRequest{AcknowledgeDuplicateRisk: ptr(true),
		TargetContractVersion: ptr[int64](2), ExpectedHandlerVersion: ptr("1"), AcknowledgeVersionChange: ptr(true)})
	require.NoError(t, err, "as the replay finds")

	// With no fitting contract anywhere, the step reads not eligible.
	b2, st2, publish2 := exhaustedStep(t)
	publish2("1", "FORBIDDEN", `{"type":"object"}`)
	for v := 2; v <= 2+jobs.MaxReplayTargets; v++ {
		publish2(strconv.Itoa(v), "ACTIVE", `{"type":"object","required":["to"]}`)
	}
	p, err = b2.svc.PreviewReplay(ctx, b2.ws, st2.StepID)
	require.NoError(t, err)
	require.False(t, p.Eligible, "no contract fits")
	require.NotNil(t, p.IneligibleReason)
}

// exhaustedStep is a send_email@1 step, enqueued with input {} before any
// contract, EXHAUSTED, with publish publishing a contract of its tool.
func exhaustedStep(t *testing.T) (*bundle, jobs.EnqueueResult, func(version, status, schema string)) {
	t.Helper()
	b := setup(t)
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{Input: json.RawMessage(`{}`), MaxAttempts: ptr[int64](1)})
	b.fail(t, b.claimOne(t, b.register(t)), &jobs.ReportError{Retryable: ptr(false)})
	return b, st, func(version, status, schema string) {
		t.Helper()
		_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
			HandlerVersion: version, InputSchema: json.RawMessage(schema), Status: &status})
		require.NoError(t, err)
	}
}

// A preview checks the contracts a replay may choose before the FORBIDDEN
// ones, the older ones past its list included (review: the FORBIDDEN
// ones, listed first, spent the budget, and each ACTIVE one read "not
// checked"): here the newest FORBIDDEN contract's check alone could take
// more than the whole budget, yet the older ACTIVE ones are read with
// their schemas and checked, and only then is that one told not checked.
// A preview of an input it cannot open reads on past its list for one
// contract only, without its schema: any may take the step, so it reads
// eligible, and no schema is read that no check would use (review: a page
// of 100 older input schemas, about 25 MB, was read, and only the first
// looked at).
func TestAReplayPreviewWhoseBudgetIsSpentReadsNoOlderSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Checking the input against the newest contract (25 branches for
	// each of its items) could take more than the whole budget.
	items := make([]string, jobs.MaxCheckEvaluations/26+1)
	for i := range items {
		items[i] = "0"
	}
	st := b.enqueue(t, b.run(t), jobs.EnqueueRequest{Input: json.RawMessage("[" + strings.Join(items, ",") + "]"),
		MaxAttempts: ptr[int64](1)})
	b.fail(t, b.claimOne(t, b.register(t)), &jobs.ReportError{Retryable: ptr(false)})
	publish := func(version, status, schema string) {
		t.Helper()
		_, err := b.svc.PublishContract(ctx, b.ws, "key_test", "send_email", jobs.PublishContractRequest{
			HandlerVersion: version, InputSchema: json.RawMessage(schema), Status: &status})
		require.NoError(t, err)
	}
	publish("1", "FORBIDDEN", `{}`)
	big := `{"type":"array","description":"` + strings.Repeat("d", 50_000) + `"}`
	for range 3 {
		publish("2", "ACTIVE", big) // older than the list; each would fit
	}
	for range jobs.MaxReplayTargets - 1 {
		publish("3", "FORBIDDEN", `{}`)
	}
	branches := strings.TrimSuffix(strings.Repeat(`{"type":"string"},`, 24)+`{}`, ",")
	publish("3", "FORBIDDEN", `{"type":"array","items":{"anyOf":[`+branches+`]}}`)

	var pages [][]jobs.Contract
	jobs.OnOlderTargets(b.svc, func(older []jobs.Contract) { pages = append(pages, older) })
	p, err := b.svc.PreviewReplay(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	require.True(t, p.HandlerVersionForbidden)
	require.Len(t, p.Upgrades, jobs.MaxReplayTargets)
	require.True(t, p.Eligible, "an older contract fits: %v", p.IneligibleReason)
	require.Len(t, pages, 1, "one read past the list")
	require.Len(t, pages[0], 3, "of the older contracts not FORBIDDEN")
	require.EqualValues(t, 4, pages[0][0].ContractVersion, "the newest older one")
	require.NotNil(t, pages[0][0].InputSchema, "with its schema: the FORBIDDEN ones spent nothing before it")
	newest := p.Upgrades[0]
	require.EqualValues(t, 104, newest.ContractVersion)
	require.False(t, newest.Checked, "checked with what was left, which could not cover it")

	// So with an input this instance cannot open (here damaged): any
	// older contract may take the step, and none's schema is read.
	damageInput(t, b, st.JobID)
	pages = nil
	p, err = b.svc.PreviewReplay(ctx, b.ws, st.StepID)
	require.NoError(t, err)
	require.True(t, p.InputUnreadable)
	require.True(t, p.Eligible, "%v", p.IneligibleReason)
	require.Len(t, pages, 1)
	require.Equal(t, 1, len(pages[0]))
	require.Nil(t, pages[0][0].InputSchema)
}

package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// recorder keeps the raw body of the last answer to each method and path
// (query left out) a client received.
type recorder struct {
	mu   sync.Mutex
	last map[string][]byte
	next http.RoundTripper
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := r.next.RoundTrip(req)
	if err != nil {
		return res, err
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	r.mu.Lock()
	r.last[req.Method+" "+strings.TrimPrefix(req.URL.Path, "/api/v1")] = body
	r.mu.Unlock()
	return res, nil
}

// covers requires that the last answer to method and path decodes into a
// value of v's type with no field left over: every field the server sent
// has a field in the SDK's type (QA: a typed SDK drops what its struct
// does not name).
func (r *recorder) covers(t *testing.T, method, path string, v any) {
	t.Helper()
	r.mu.Lock()
	body, ok := r.last[method+" "+path]
	r.mu.Unlock()
	require.True(t, ok, "no answer recorded for %s %s", method, path)
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(reflect.New(reflect.TypeOf(v).Elem()).Interface()),
		"%s %s answers a field %T does not have", method, path, v)
}

// recordingClient is an SDK client for key whose answers rec records.
func (b *bundle) recordingClient(t *testing.T, key string) (*ratchet.Client, *recorder) {
	rec := &recorder{last: map[string][]byte{}}
	return b.client(t, key, func(next http.RoundTripper) http.RoundTripper { rec.next = next; return rec }), rec
}

// The SDK's types hold every field the gate's answers carry: begin,
// report, heartbeat, effect reads, resolve, groups and their unwind.
func TestGoSDKTypesCoverTheGatesAnswers(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	op, rec := g.recordingClient(t, g.ws.Key)

	g.policy(t, "cov.send", map[string]any{"lease_seconds": 5})
	r := req("cov.send", "cov:1")
	r.Dimensions = map[string]string{"recipient": "user_1"}
	b, err := op.Begin(ctx, r)
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionExecute, b.Decision)
	rec.covers(t, "POST", "/effects/begin", b)
	_, err = op.HeartbeatEffect(ctx, b.EffectID, b.LeaseToken)
	require.NoError(t, err)
	busy, err := op.Begin(ctx, r)
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionInFlight, busy.Decision)
	require.Positive(t, busy.RetryAfterSeconds)
	rec.covers(t, "POST", "/effects/begin", busy)
	_, err = op.HeartbeatEffect(ctx, b.EffectID, b.LeaseToken)
	require.NoError(t, err)
	rec.covers(t, "POST", "/effects/"+b.EffectID+"/heartbeat", &struct {
		EffectID       string    `json:"effect_id"`
		LeaseExpiresAt time.Time `json:"lease_expires_at"`
	}{})
	eff, err := op.ReportEffect(ctx, b.EffectID, b.LeaseToken, ratchet.OutcomeSucceeded, sent{MessageID: "m"})
	require.NoError(t, err)
	rec.covers(t, "POST", "/effects/"+b.EffectID+"/report", eff)
	dup, err := op.Begin(ctx, r)
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionDuplicate, dup.Decision)
	rec.covers(t, "POST", "/effects/begin", dup)
	eff, err = op.GetEffect(ctx, b.EffectID)
	require.NoError(t, err)
	rec.covers(t, "GET", "/effects/"+b.EffectID, eff)
	page, err := op.ListEffects(ctx, ratchet.EffectQuery{Limit: 5})
	require.NoError(t, err)
	rec.covers(t, "GET", "/effects", page)

	// A denial's body: the decision beside the error envelope.
	g.policy(t, "cov.drop", map[string]any{"mode": "deny"})
	denied, err := op.Begin(ctx, req("cov.drop", "cov:2"))
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionDenied, denied.Decision)

	// Approval held: approval_id.
	g.policy(t, "cov.wire", map[string]any{"mode": "require_approval"})
	held, err := op.Begin(ctx, req("cov.wire", "cov:3"))
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionApprovalRequired, held.Decision)
	rec.covers(t, "POST", "/effects/begin", held)
	approval, err := op.Approve(ctx, held.ApprovalID, "ok")
	require.NoError(t, err)
	rec.covers(t, "POST", "/approvals/"+held.ApprovalID+"/approve", approval)

	// Policies and breakers.
	pol, err := op.UpdateEffectPolicy(ctx, "cov.send", nil, ratchet.PolicyUpdate{"max_attempts": 3})
	require.NoError(t, err)
	rec.covers(t, "PUT", "/policies/cov.send", pol)
	structuring, err := op.GetPolicyStructuring(ctx, "cov.send")
	require.NoError(t, err)
	rec.covers(t, "GET", "/policies/cov.send/structuring", structuring)
	require.Len(t, structuring.Windows, 2)
	circuit, err := op.OpenCircuit(ctx, "cov.send", ratchet.BreakerDeny, "test")
	require.NoError(t, err)
	rec.covers(t, "POST", "/circuits/cov.send/open", circuit)
	circuit, err = op.CloseCircuit(ctx, "cov.send")
	require.NoError(t, err)
	rec.covers(t, "POST", "/circuits/cov.send/close", circuit)
	stopped, err := op.EmergencyStop(ctx, "", "drill")
	require.NoError(t, err)
	rec.covers(t, "POST", "/circuits/stop", stopped)
	released, err := op.ReleaseEmergencyStop(ctx)
	require.NoError(t, err)
	rec.covers(t, "POST", "/circuits/release", released)

	// Reconciliation: the vendor's record of the effect matches it.
	from := time.Now().Add(-time.Hour)
	reconReq := ratchet.ReconcileRequest{EffectType: "cov.send", From: from, To: time.Now().Add(time.Minute),
		Records: []ratchet.ReconcileRecord{{IdempotencyKey: "cov:1", Status: ratchet.VendorSucceeded, AmountMicros: ratchet.Micros(0)},
			{IdempotencyKey: "cov:unknown", Status: ratchet.VendorSucceeded}},
		IdempotencyKey: "cov:reconcile:1"}
	recon, err := op.Reconcile(ctx, reconReq)
	require.NoError(t, err)
	rec.covers(t, "POST", "/reconcile", recon)
	require.Equal(t, 1, recon.Counts.Matched)
	// The same request under the caller's key is answered the first
	// reconciliation, not compared again.
	again, err := op.Reconcile(ctx, reconReq)
	require.NoError(t, err)
	require.True(t, again.ReconciledAt.Equal(recon.ReconciledAt), "a second reconciliation under the same key")
	require.Equal(t, b.EffectID, *recon.Matched[0].EffectID)
	require.Equal(t, 1, recon.Counts.UnknownToRatchet)
	require.Equal(t, "cov:unknown", recon.UnknownToRatchet[0].IdempotencyKey)
	empty, err := op.Reconcile(ctx, ratchet.ReconcileRequest{EffectType: "cov.none", From: from, To: time.Now()})
	require.NoError(t, err, "no records is a valid comparison")
	require.Empty(t, empty.Matched)

	// Groups: create, read, commit, unwind.
	group, err := op.CreateGroup(ctx, "cov group")
	require.NoError(t, err)
	rec.covers(t, "POST", "/groups", group)
	gr := req("cov.send", "cov:4")
	gr.GroupID = group.ID
	gr.Compensation = &ratchet.Compensation{EffectType: "cov.unsend", Payload: map[string]string{"to": "user_1"}}
	gb, err := op.Begin(ctx, gr)
	require.NoError(t, err)
	_, err = op.ReportEffect(ctx, gb.EffectID, gb.LeaseToken, ratchet.OutcomeSucceeded, sent{MessageID: "g"})
	require.NoError(t, err)
	read, err := op.GetGroup(ctx, group.ID)
	require.NoError(t, err)
	rec.covers(t, "GET", "/groups/"+group.ID, read)
	require.False(t, read.StepsTruncated)
	groupSteps, err := op.ListGroupSteps(ctx, group.ID, ratchet.ListQuery{})
	require.NoError(t, err)
	rec.covers(t, "GET", "/groups/"+group.ID+"/steps", groupSteps)
	require.Len(t, groupSteps.Data, 1)
	require.Equal(t, gb.EffectID, groupSteps.Data[0].EffectID)
	require.Nil(t, groupSteps.NextCursor)
	commit, err := op.CommitGroup(ctx, group.ID)
	require.NoError(t, err)
	rec.covers(t, "POST", "/groups/"+group.ID+"/commit", commit)
	unwind, err := op.UnwindGroup(ctx, group.ID)
	require.NoError(t, err)
	rec.covers(t, "POST", "/groups/"+group.ID+"/unwind", unwind)
	require.Len(t, unwind.Plan, 1)
}

// The SDK's types hold every field the job routes answer: runs, steps,
// enqueue, claim, heartbeat, report, cancel and the key reads.
func TestGoSDKTypesCoverTheJobAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	op, rec := b.recordingClient(t, b.ws.Key)
	worker, wrec := b.recordingClient(t, b.workerKey(t, "cov@1"))

	run, err := op.StartRun(ctx, "cov", ratchet.WithIdempotencyKey("cov-run"))
	require.NoError(t, err)
	rec.covers(t, "POST", "/runs", run)
	st, err := op.Enqueue(ctx, run.ID, map[string]string{"a": "b"}, ratchet.EnqueueOptions{Name: "cov", Version: "1"})
	require.NoError(t, err)
	rec.covers(t, "POST", "/runs/"+run.ID+"/steps", st)
	second, err := op.Enqueue(ctx, run.ID, map[string]string{"a": "c"}, ratchet.EnqueueOptions{Name: "cov", Version: "1"})
	require.NoError(t, err)

	workerID, err := worker.RegisterWorker(ctx, []ratchet.ToolRef{{Name: "cov", Version: "1"}})
	require.NoError(t, err)
	wrec.covers(t, "POST", "/workers/register", &struct {
		WorkerID string `json:"workerId"`
	}{})
	jobs, err := worker.Claim(ctx, workerID, 1, 0)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	wrec.covers(t, "POST", "/workers/"+workerID+"/claim", &struct {
		Jobs []ratchet.ClaimedJob `json:"jobs"`
	}{})
	j := jobs[0]
	_, err = worker.HeartbeatJob(ctx, j.JobID, j.LeaseToken)
	require.NoError(t, err)
	wrec.covers(t, "POST", "/jobs/"+j.JobID+"/heartbeat", &ratchet.JobHeartbeat{})
	rep, err := worker.ReportJob(ctx, j.JobID, ratchet.JobReport{LeaseToken: j.LeaseToken, Status: ratchet.ReportFailed,
		Error: &ratchet.JobError{Message: "later", Retryable: true}})
	require.NoError(t, err)
	wrec.covers(t, "POST", "/jobs/"+j.JobID+"/report", rep)

	cancelled, err := op.CancelStep(ctx, second.StepID)
	require.NoError(t, err)
	rec.covers(t, "POST", "/steps/"+second.StepID+"/cancel", cancelled)
	got, err := op.GetRun(ctx, run.ID)
	require.NoError(t, err)
	rec.covers(t, "GET", "/runs/"+run.ID, got)
	steps, err := op.ListRunSteps(ctx, run.ID, ratchet.StepQuery{})
	require.NoError(t, err)
	rec.covers(t, "GET", "/runs/"+run.ID+"/steps", steps)
	finished, err := op.FinishRun(ctx, run.ID)
	require.NoError(t, err)
	rec.covers(t, "POST", "/runs/"+run.ID+"/finish", finished)

	one, err := op.GetStep(ctx, st.StepID)
	require.NoError(t, err)
	rec.covers(t, "GET", "/steps/"+st.StepID, one)
	require.Equal(t, run.ID, one.RunID)
	require.Len(t, one.DurableJob.Attempts, 1)
	runs, err := op.ListRuns(ctx, ratchet.RunQuery{Status: ratchet.RunFailed})
	require.NoError(t, err)
	rec.covers(t, "GET", "/runs", runs)
	require.Len(t, runs.Data, 1, "the run failed with its cancelled step")
	require.Equal(t, run.ID, runs.Data[0].ID)
	require.Nil(t, runs.NextCursor)

	preview, err := op.ReplayPreview(ctx, second.StepID)
	require.NoError(t, err)
	rec.covers(t, "GET", "/steps/"+second.StepID+"/replay", preview)

	me, err := op.CurrentKey(ctx)
	require.NoError(t, err)
	rec.covers(t, "GET", "/keys/current", me)
	hook, err := op.CreateWebhook(ctx, "https://example.com/hook", []string{"run.finished"})
	require.NoError(t, err)
	rec.covers(t, "POST", "/webhooks", hook)
	h, err := op.GetWebhook(ctx, hook.ID)
	require.NoError(t, err)
	rec.covers(t, "GET", "/webhooks/"+hook.ID, h)
	rotated, err := op.RotateWebhookSecret(ctx, hook.ID, ratchet.RotateSecretOptions{})
	require.NoError(t, err)
	rec.covers(t, "POST", "/webhooks/"+hook.ID+"/rotate-secret", rotated)
	h, err = op.DeleteWebhook(ctx, hook.ID)
	require.NoError(t, err)
	rec.covers(t, "DELETE", "/webhooks/"+hook.ID, h)
	key, err := op.CreateKey(ctx, ratchet.KeySpec{Name: "cov", Preset: "AGENT"})
	require.NoError(t, err)
	rec.covers(t, "POST", "/keys", key)
	revoked, err := op.RevokeKey(ctx, key.ID)
	require.NoError(t, err)
	rec.covers(t, "DELETE", "/keys/"+key.ID, revoked)

	// Contracts, synthetic tests and a replay.
	contract, err := op.PublishContract(ctx, "cov", ratchet.ContractSpec{HandlerVersion: "1",
		InputSchema: json.RawMessage(`{"type":"object"}`)})
	require.NoError(t, err)
	rec.covers(t, "POST", "/tools/cov/contracts", contract)
	test, err := op.TestTool(ctx, "cov", "1", map[string]string{"a": "b"})
	require.NoError(t, err)
	rec.covers(t, "POST", "/tools/cov/test", test)
	replayed, err := op.Replay(ctx, second.StepID, ratchet.ReplayOptions{AcknowledgeDuplicateRisk: true, MaxAttempts: 1})
	require.NoError(t, err)
	rec.covers(t, "POST", "/steps/"+second.StepID+"/replay", replayed)
	attempts, err := op.ListStepAttempts(ctx, st.StepID, ratchet.ListQuery{})
	require.NoError(t, err)
	rec.covers(t, "GET", "/steps/"+st.StepID+"/attempts", attempts)
	require.Len(t, attempts.Data, 1)
	replays, err := op.ListStepReplays(ctx, second.StepID, ratchet.ListQuery{})
	require.NoError(t, err)
	rec.covers(t, "GET", "/steps/"+second.StepID+"/replays", replays)
	require.Len(t, replays.Data, 1)
	require.Equal(t, replayed.JobID, second.JobID)
	eps, err := op.ListEndpoints(ctx, ratchet.ListQuery{})
	require.NoError(t, err)
	rec.covers(t, "GET", "/endpoints", eps)
}

// The error detail the gate's denials carry is readable through the SDK's
// accessors: resets_at of a budget, the dimension of a per-counterparty
// ceiling, the scopes a 403 forbidden requires.
func TestGoSDKReadsTheDenialsDetail(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	g.policy(t, "cov.pay", map[string]any{"daily_budget_micros": 10,
		"dimension_limits": map[string]any{"payee": map[string]any{"daily_count": 1}}})
	pay := func(key string, cost int64) (*ratchet.BeginResponse, error) {
		r := req("cov.pay", key)
		r.CostMicros = ratchet.Micros(cost)
		r.Dimensions = map[string]string{"payee": "p1"}
		return g.agent.Begin(ctx, r)
	}
	first, err := pay("cov:pay:1", 5)
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionExecute, first.Decision)

	over, err := pay("cov:pay:2", 5)
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionDenied, over.Decision)
	require.Equal(t, ratchet.CodeDimensionLimitExceeded, over.Denial.Code)
	require.Equal(t, "payee", over.Denial.Dimension())
	resets, ok := over.Denial.ResetsAt()
	require.True(t, ok)
	require.True(t, resets.After(time.Now()), "the next UTC midnight: %v", resets)
	require.Equal(t, resets.UTC().Truncate(24*time.Hour), resets.UTC(), "a UTC day window")

	g.policy(t, "cov.pay", map[string]any{"dimension_limits": nil})
	budget, err := pay("cov:pay:3", 6)
	require.NoError(t, err)
	require.Equal(t, ratchet.CodeBudgetExceeded, budget.Denial.Code)
	require.Equal(t, "", budget.Denial.Dimension())
	resets, ok = budget.Denial.ResetsAt()
	require.True(t, ok)
	require.False(t, resets.IsZero())

	_, err = g.agent.GetEffect(ctx, first.EffectID)
	var apiErr *ratchet.Error
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, []string{"effects:read"}, apiErr.Required())
	_, ok = apiErr.ResetsAt()
	require.False(t, ok)
}

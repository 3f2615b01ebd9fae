package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// An operator reads a failing endpoint's recent attempts, changes its
// policy under its version, pauses and resumes it and closes its circuit,
// and reads the queue's health, all through the SDK.
func TestOperatorManagesAnEndpointThroughTheSDK(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	serveFlaky(t, b)
	run, err := b.producer.StartRun(ctx, "operations")
	require.NoError(t, err)
	st, err := b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "c"},
		ratchet.EnqueueOptions{Name: "flaky", Version: "1", Endpoint: "fast"})
	require.NoError(t, err)
	_, err = b.producer.FinishRun(ctx, run.ID)
	require.NoError(t, err)
	require.Equal(t, ratchet.RunSucceeded, waitRun(t, b.producer, run.ID, func(r *ratchet.Run) bool {
		return r.Status != ratchet.RunRunning
	}).Status)

	eps, err := b.operator.ListEndpoints(ctx, ratchet.ListQuery{})
	require.NoError(t, err)
	var ep ratchet.Endpoint
	for _, e := range eps.Data {
		if e.Name == "fast" {
			ep = e
		}
	}
	require.NotEmpty(t, ep.ID)
	require.Equal(t, "CUSTOM", ep.PolicyPreset)
	got, err := b.operator.GetEndpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, ep, *got)
	sameJSON(t, b, "/api/v1/endpoints/"+ep.ID+"/policy", got)

	failed, err := b.operator.ListEndpointAttempts(ctx, ep.ID, ratchet.AttemptQuery{Outcome: "FAILED"})
	require.NoError(t, err)
	require.Len(t, failed.Data, 1)
	f := failed.Data[0]
	require.Equal(t, st.JobID, f.JobID)
	require.Equal(t, st.StepID, f.StepID)
	require.Equal(t, run.ID, f.RunID)
	require.Equal(t, "flaky", f.Name)
	require.Equal(t, 1, f.Attempt)
	require.NotNil(t, f.ErrorMessage)
	require.Contains(t, *f.ErrorMessage, "provider busy")
	first, err := b.operator.ListEndpointAttempts(ctx, ep.ID, ratchet.AttemptQuery{Limit: 1})
	require.NoError(t, err)
	require.Len(t, first.Data, 1)
	require.Equal(t, 2, first.Data[0].Attempt, "newest first")
	require.NotNil(t, first.NextCursor)
	rest, err := b.operator.ListEndpointAttempts(ctx, ep.ID, ratchet.AttemptQuery{Cursor: *first.NextCursor})
	require.NoError(t, err)
	require.Equal(t, failed.Data, rest.Data)
	require.Nil(t, rest.NextCursor)
	all, err := b.operator.ListEndpointAttempts(ctx, ep.ID, ratchet.AttemptQuery{})
	require.NoError(t, err)
	sameJSON(t, b, "/api/v1/endpoints/"+ep.ID+"/attempts", all)

	limited, err := b.operator.UpdateEndpointPolicy(ctx, ep.ID, ep.Version, ratchet.PolicyUpdate{"maxConcurrent": 3})
	require.NoError(t, err)
	require.Equal(t, 3, *limited.MaxConcurrent)
	require.Equal(t, ep.Version+1, limited.Version)
	_, err = b.operator.UpdateEndpointPolicy(ctx, ep.ID, ep.Version, ratchet.PolicyUpdate{"maxConcurrent": 4})
	requireAPIError(t, err, "version_conflict")
	lifted, err := b.operator.UpdateEndpointPolicy(ctx, ep.ID, limited.Version, ratchet.PolicyUpdate{"maxConcurrent": nil})
	require.NoError(t, err)
	require.Nil(t, lifted.MaxConcurrent, "nil clears")

	paused, err := b.operator.PauseEndpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.True(t, paused.Paused)
	_, err = b.producer.Enqueue(ctx, run.ID, welcomeIn{CustomerID: "held"},
		ratchet.EnqueueOptions{Name: "flaky", Version: "1", Endpoint: "fast"})
	requireAPIError(t, err, "invalid_state", "the run was finished")
	held, err := b.producer.StartRun(ctx, "held")
	require.NoError(t, err)
	_, err = b.producer.Enqueue(ctx, held.ID, welcomeIn{CustomerID: "held"},
		ratchet.EnqueueOptions{Name: "flaky", Version: "1", Endpoint: "fast"})
	require.NoError(t, err)
	health, err := b.operator.ListQueueHealth(ctx, ratchet.ListQuery{})
	require.NoError(t, err)
	require.Len(t, health.Data, 1)
	require.Equal(t, "flaky", health.Data[0].Name)
	require.EqualValues(t, 1, health.Data[0].Queued)
	require.Equal(t, []string{"fast"}, health.Data[0].PausedEndpoints)
	sameJSON(t, b, "/api/v1/queue/health", health)
	resumed, err := b.operator.ResumeEndpoint(ctx, ep.ID)
	require.NoError(t, err)
	require.False(t, resumed.Paused)
	require.Equal(t, ratchet.RunSucceeded, waitRun(t, b.producer, held.ID, func(r *ratchet.Run) bool {
		return r.Steps[0].Status == ratchet.JobSucceeded
	}).Steps[0].Status)

	// A breaker that opens at the first retryable failure, closed by hand.
	tripping, err := b.operator.UpdateEndpointPolicy(ctx, ep.ID, resumed.Version, ratchet.PolicyUpdate{
		"circuitFailureThreshold": 1, "circuitCooldownMs": 3_600_000})
	require.NoError(t, err)
	tripped, err := b.producer.StartRun(ctx, "tripped")
	require.NoError(t, err)
	_, err = b.producer.Enqueue(ctx, tripped.ID, welcomeIn{CustomerID: "trip"},
		ratchet.EnqueueOptions{Name: "flaky", Version: "1", Endpoint: "fast"})
	require.NoError(t, err)
	deadline := time.Now().Add(30 * time.Second)
	for {
		e, err := b.operator.GetEndpoint(ctx, ep.ID)
		require.NoError(t, err)
		if e.Circuit.State == "open" {
			require.Equal(t, 1, e.Circuit.ConsecutiveFailures)
			break
		}
		require.True(t, time.Now().Before(deadline), "the circuit never opened")
		time.Sleep(50 * time.Millisecond)
	}
	closed, err := b.operator.CloseEndpointCircuit(ctx, ep.ID)
	require.NoError(t, err)
	require.Equal(t, "closed", closed.Circuit.State)
	require.Zero(t, closed.Circuit.ConsecutiveFailures)
	require.Equal(t, tripping.Version, closed.Version, "closing changes no policy")
}

// An endpoint created ahead of its jobs through the SDK takes the policy
// given; creating it again answers it unchanged.
func TestCreateEndpointThroughTheSDK(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	e, err := b.operator.CreateEndpoint(ctx, "billing", ratchet.PolicyUpdate{"preset": "RELAXED", "maxConcurrent": 2})
	require.NoError(t, err)
	require.Equal(t, "RELAXED", e.PolicyPreset)
	require.Equal(t, 2, *e.MaxConcurrent)
	again, err := b.operator.CreateEndpoint(ctx, "billing", nil)
	require.NoError(t, err)
	require.Equal(t, e, again)
	sameJSON(t, b, "/api/v1/endpoints/"+e.ID+"/policy", again)
}

// requireAPIError requires that err is the API's refusal with code, and
// returns it.
func requireAPIError(t *testing.T, err error, code string, msgAndArgs ...any) *ratchet.Error {
	t.Helper()
	var apiErr *ratchet.Error
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, code, apiErr.Code, msgAndArgs...)
	return apiErr
}

// sameJSON requires that v, as the SDK decoded it, encodes to what the
// server answers at path: every field the server sends has its field in the
// SDK's type, under the same name.
func sameJSON(t *testing.T, b *bundle, path string, v any) {
	t.Helper()
	decoded, err := json.Marshal(v)
	require.NoError(t, err)
	require.JSONEq(t, string(b.env.Must(http.StatusOK, "GET", path, b.ws.Key, nil).Body), string(decoded), path)
}

// An operator decides the effects the gate held for approval through the
// SDK: listed while pending, approved (the next begin executes) or
// rejected (every begin is denied), each answer the server's own.
func TestOperatorDecidesApprovalsThroughTheSDK(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	g.policy(t, "wire.send", map[string]any{"mode": "require_approval"})
	held := func(key string) string {
		t.Helper()
		d, err := g.agent.Begin(ctx, req("wire.send", key))
		require.NoError(t, err)
		require.Equal(t, ratchet.DecisionApprovalRequired, d.Decision)
		require.NotEmpty(t, d.ApprovalID)
		return d.ApprovalID
	}
	yes, no := held("wire:yes"), held("wire:no")

	pending, err := g.operator.ListApprovals(ctx, ratchet.ApprovalQuery{State: ratchet.ApprovalPending})
	require.NoError(t, err)
	require.Len(t, pending.Data, 2)
	sameJSON(t, g.bundle, "/api/v1/approvals?state=pending", pending)
	one, err := g.operator.ListApprovals(ctx, ratchet.ApprovalQuery{Limit: 1})
	require.NoError(t, err)
	require.Len(t, one.Data, 1)
	require.NotNil(t, one.NextCursor, "a cursor to the other")

	approved, err := g.operator.Approve(ctx, yes, "checked with finance")
	require.NoError(t, err)
	require.Equal(t, ratchet.ApprovalApproved, approved.State)
	require.Equal(t, "checked with finance", *approved.Note)
	require.Equal(t, []string{"policy_requires_approval"}, approved.Answers)
	again, err := g.operator.Approve(ctx, yes, "")
	require.NoError(t, err)
	require.Equal(t, approved, again, "approving again answers the same approval")
	read, err := g.operator.GetApproval(ctx, yes)
	require.NoError(t, err)
	require.Equal(t, approved, read)
	sameJSON(t, g.bundle, "/api/v1/approvals/"+yes, read)
	d, err := g.agent.Begin(ctx, req("wire.send", "wire:yes"))
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionExecute, d.Decision)

	rejected, err := g.operator.Reject(ctx, no, "")
	require.NoError(t, err)
	require.Equal(t, ratchet.ApprovalRejected, rejected.State)
	d, err = g.agent.Begin(ctx, req("wire.send", "wire:no"))
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionDenied, d.Decision)
	_, err = g.operator.Approve(ctx, no, "")
	requireAPIError(t, err, "invalid_state")
}

// A contract published through the SDK whose answer is lost is published
// once (the retry carries the first attempt's Idempotency-Key); its tool is
// tested through the SDK against it, and input the schema refuses is 400.
func TestContractsAndToolTestsThroughTheSDK(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	publisher, lose := b.losingClient(t, b.ws.Key, "/contracts")
	spec := ratchet.ContractSpec{HandlerVersion: "1",
		InputSchema: json.RawMessage(`{"type":"object","required":["customerId"],` +
			`"properties":{"customerId":{"type":"string"}}}`),
		RetryPreset: "CUSTOM", RetryPolicy: &ratchet.RetrySchedule{MaxAttempts: 2, InitialDelayMs: 1000,
			Multiplier: 2, MaxDelayMs: 4000, JitterPercent: 10}}
	c, err := publisher.PublishContract(ctx, "welcome", spec)
	require.NoError(t, err)
	require.EqualValues(t, 2, lose.seen.Load(), "the first answer was lost and the call sent again")
	require.Equal(t, 1, c.ContractVersion)
	require.Equal(t, "CUSTOM", c.RetryPreset)
	require.Equal(t, 2, c.RetryPolicy.MaxAttempts)
	list, err := b.operator.ListContracts(ctx, "welcome", ratchet.ListQuery{})
	require.NoError(t, err)
	require.Len(t, list.Data, 1, "published once")
	require.Equal(t, *c, list.Data[0])
	sameJSON(t, b, "/api/v1/tools/welcome/contracts", list)

	tester, lostTest := b.losingClient(t, b.ws.Key, "/test")
	test, err := tester.TestTool(ctx, "welcome", "1", map[string]string{"customerId": "c_1"})
	require.NoError(t, err)
	require.EqualValues(t, 2, lostTest.seen.Load(), "the first answer was lost and the call sent again")
	var runs int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM job_runs WHERE workspace_id = $1`,
		b.ws.ID).Scan(&runs))
	require.Equal(t, 1, runs, "one synthetic run")
	require.Equal(t, 1, *test.ContractVersion)
	require.Equal(t, 1, test.MaxAttempts)
	require.Equal(t, ratchet.JobQueued, test.Status)
	run, err := b.operator.GetRun(ctx, test.RunID)
	require.NoError(t, err)
	require.Equal(t, test.StepID, run.Steps[0].ID)

	_, err = b.operator.TestTool(ctx, "welcome", "1", map[string]string{"other": "x"})
	requireAPIError(t, err, "invalid_request")
}

// An operator sets an effect type's policy under its version and works its
// breakers and the emergency stop through the SDK; an agent's begins meet
// what was set.
func TestOperatorSetsGatePoliciesAndCircuitsThroughTheSDK(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	def, err := g.operator.GetEffectPolicy(ctx, "sms.send")
	require.NoError(t, err)
	require.EqualValues(t, 0, def.Version, "the safe default")
	require.Equal(t, "block", def.OnIndeterminate)
	p, err := g.operator.UpdateEffectPolicy(ctx, "sms.send", &def.Version, ratchet.PolicyUpdate{
		"mode": "require_approval", "max_cost_micros": 5_000_000,
		"dimension_limits": map[string]any{"recipient": map[string]any{"daily_count": 3}}})
	require.NoError(t, err)
	require.Equal(t, "require_approval", p.Mode)
	require.Equal(t, int64(5_000_000), *p.MaxCostMicros)
	require.Equal(t, int64(3), *p.DimensionLimits["recipient"].DailyCount)
	sameJSON(t, g.bundle, "/api/v1/policies/sms.send", p)
	_, err = g.operator.UpdateEffectPolicy(ctx, "sms.send", &def.Version, ratchet.PolicyUpdate{"mode": "allow"})
	requireAPIError(t, err, "version_conflict")
	p, err = g.operator.UpdateEffectPolicy(ctx, "sms.send", &p.Version,
		ratchet.PolicyUpdate{"mode": "allow", "max_cost_micros": nil, "dimension_limits": nil})
	require.NoError(t, err)
	require.Nil(t, p.MaxCostMicros, "nil clears")
	blind, err := g.operator.UpdateEffectPolicy(ctx, "sms.send", nil, ratchet.PolicyUpdate{"lease_seconds": 30})
	require.NoError(t, err, "without a version: merged whatever it is")
	require.Equal(t, 30, blind.LeaseSeconds)
	require.Equal(t, p.Version+1, blind.Version)
	all, err := g.operator.ListEffectPolicies(ctx, ratchet.ListQuery{})
	require.NoError(t, err)
	sameJSON(t, g.bundle, "/api/v1/policies", all)

	open, err := g.operator.OpenCircuit(ctx, "sms.send", ratchet.BreakerDeny, "vendor incident")
	require.NoError(t, err)
	require.Equal(t, "open", open.State)
	require.Equal(t, "manual", *open.OpenedBy)
	d, err := g.agent.Begin(ctx, req("sms.send", "sms:1"))
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionDenied, d.Decision)
	closed, err := g.operator.CloseCircuit(ctx, "sms.send")
	require.NoError(t, err)
	require.Equal(t, "closed", closed.State)
	circuits, err := g.operator.ListCircuits(ctx, ratchet.ListQuery{})
	require.NoError(t, err)
	sameJSON(t, g.bundle, "/api/v1/circuits", circuits)

	off, err := g.operator.GetEmergencyStop(ctx)
	require.NoError(t, err)
	require.Equal(t, ratchet.StopState{State: "closed"}, *off)
	stopped, err := g.operator.EmergencyStop(ctx, "", "all hands")
	require.NoError(t, err)
	require.NotEmpty(t, stopped.Data)
	for _, c := range stopped.Data {
		require.Equal(t, "stop", *c.OpenedBy, c.EffectType)
	}
	on, err := g.operator.GetEmergencyStop(ctx)
	require.NoError(t, err)
	require.Equal(t, "open", on.State)
	require.Equal(t, ratchet.BreakerRequireApproval, *on.Action)
	sameJSON(t, g.bundle, "/api/v1/circuits/stop", on)
	d, err = g.agent.Begin(ctx, req("email.send", "stopped:1"))
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionApprovalRequired, d.Decision, "a type first seen during the stop is held too")
	_, err = g.operator.ReleaseEmergencyStop(ctx)
	require.NoError(t, err)
	d, err = g.agent.Begin(ctx, req("email.send", "released:1"))
	require.NoError(t, err)
	require.Equal(t, ratchet.DecisionExecute, d.Decision)
}

// Keys are minted once however the answer is lost, listed without secrets
// and revoked through the SDK; a revoked key's client is refused.
func TestKeysThroughTheSDK(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	minter, lose := b.losingClient(t, b.ws.Key, "/keys")
	k, err := minter.CreateKey(ctx, ratchet.KeySpec{Name: "mailer", Preset: "WORKER", Tools: []string{"send@1"}})
	require.NoError(t, err)
	require.EqualValues(t, 2, lose.seen.Load(), "the first answer was lost and the call sent again")
	require.NotEmpty(t, k.Secret)
	require.Equal(t, []string{"send@1"}, k.Tools)
	keys, err := b.operator.ListKeys(ctx, ratchet.ListQuery{})
	require.NoError(t, err)
	var mailers int
	for _, key := range keys.Data {
		if key.Name == "mailer" {
			mailers++
			require.Equal(t, k.APIKey, key)
		}
	}
	require.Equal(t, 1, mailers, "minted once")
	sameJSON(t, b, "/api/v1/keys", keys)
	// It names the key that minted it, whose mints list it (security
	// review: revoking a key leaves them live, to be found and revoked).
	op, err := b.operator.CurrentKey(ctx)
	require.NoError(t, err)
	require.Nil(t, op.CreatedByKeyID, "signup's key, minted by none")
	require.NotNil(t, k.CreatedByKeyID)
	require.Equal(t, op.ID, *k.CreatedByKeyID)
	minted, err := b.operator.ListKeysMintedBy(ctx, op.ID, ratchet.ListQuery{Limit: 200})
	require.NoError(t, err)
	require.Contains(t, minted.Data, k.APIKey)
	for _, m := range minted.Data {
		require.Equal(t, &op.ID, m.CreatedByKeyID, m.Name)
	}
	sameJSON(t, b, "/api/v1/keys?created_by="+op.ID+"&limit=200", minted)
	unminted, err := b.operator.ListKeysMintedBy(ctx, k.ID, ratchet.ListQuery{})
	require.NoError(t, err)
	require.Empty(t, unminted.Data, "a key that minted none")
	_, err = b.operator.ListKeysMintedBy(ctx, "", ratchet.ListQuery{})
	require.True(t, ratchet.IsCode(err, ratchet.CodeInvalidRequest), "no key id lists nothing, never every key: %v", err)
	// The minted key reads itself, though WORKER holds no keys scope.
	me, err := b.client(t, k.Secret, nil).CurrentKey(ctx)
	require.NoError(t, err)
	require.Equal(t, k.APIKey, *me)

	// A caller whose retries ran out asks again under its own key and gets
	// the same key and secret, shown only in that answer.
	spec := ratchet.KeySpec{Name: "recoverable", Preset: "INGEST"}
	kept, err := b.operator.CreateKeyWithKey(ctx, spec, "mint:recoverable")
	require.NoError(t, err)
	again, err := b.operator.CreateKeyWithKey(ctx, spec, "mint:recoverable")
	require.NoError(t, err)
	require.Equal(t, kept, again)

	// An empty tools list is sent as such: a worker key for no tool, not
	// one for any tool.
	none, err := b.operator.CreateKey(ctx, ratchet.KeySpec{Name: "idle", Scopes: []string{"jobs:work"}, Tools: []string{}})
	require.NoError(t, err)
	require.NotNil(t, none.Tools)
	require.Empty(t, none.Tools)
	anyTool, err := b.operator.CreateKey(ctx, ratchet.KeySpec{Name: "agent", Preset: "AGENT"})
	require.NoError(t, err)
	require.Nil(t, anyTool.Tools, "nil leaves the key unrestricted")

	revoked, err := b.operator.RevokeKey(ctx, k.ID)
	require.NoError(t, err)
	require.NotNil(t, revoked.RevokedAt)
	_, err = b.client(t, k.Secret, nil).RegisterWorker(ctx, []ratchet.ToolRef{{Name: "send", Version: "1"}})
	require.Equal(t, http.StatusUnauthorized, requireAPIError(t, err, "unauthorized").StatusCode)

	// A key found compromised is revoked with every key minted from it.
	leaky, err := b.operator.CreateKey(ctx, ratchet.KeySpec{Name: "leaky", Scopes: []string{"keys:write", "effects:begin"}})
	require.NoError(t, err)
	child, err := b.client(t, leaky.Secret, nil).CreateKey(ctx, ratchet.KeySpec{Name: "child", Scopes: []string{"effects:begin"}})
	require.NoError(t, err)
	tree, err := b.operator.RevokeKeyWithMinted(ctx, leaky.ID)
	require.NoError(t, err)
	require.Equal(t, leaky.ID, tree.ID)
	require.NotNil(t, tree.RevokedAt)
	require.Equal(t, []string{child.ID}, tree.MintedRevoked)
	_, err = b.client(t, child.Secret, nil).CurrentKey(ctx)
	requireAPIError(t, err, "unauthorized")
	twice, err := b.operator.RevokeKeyWithMinted(ctx, leaky.ID)
	require.NoError(t, err)
	require.Equal(t, []string{child.ID}, twice.MintedRevoked,
		"sent again (as after a lost answer): the keys the first call took, listed again")
	require.Equal(t, tree.APIKey, twice.APIKey)
}

package sdktest

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

type sent struct {
	MessageID string `json:"message_id"`
}

// gateBundle is a workspace with an AGENT client and a policy setter.
type gateBundle struct {
	*bundle
	agent *ratchet.Client
}

func setupGate(t *testing.T) *gateBundle {
	t.Helper()
	b := setup(t)
	return &gateBundle{bundle: b, agent: b.client(t, b.env.Key(b.ws, map[string]any{"name": "agent", "preset": "AGENT"}), nil)}
}

func (g *gateBundle) policy(t *testing.T, effectType string, body map[string]any) {
	t.Helper()
	g.env.Must(http.StatusOK, "PUT", "/api/v1/policies/"+effectType, g.ws.Key, body)
}

func req(effectType, key string) ratchet.BeginRequest {
	return ratchet.BeginRequest{EffectType: effectType, IdempotencyKey: key,
		Payload: map[string]string{"to": "user_123"}, CostMicros: ratchet.Micros(0)}
}

func TestGateExecuteThenDuplicate(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	var calls atomic.Int32
	send := func(ctx context.Context, l ratchet.Lease) (sent, error) {
		calls.Add(1)
		return sent{MessageID: "msg_1"}, nil
	}
	key := ratchet.BlindKey("test-secret", "welcome-email:user_123")
	out, err := ratchet.DoEffect(ctx, g.agent, req("email.send", key), send)
	require.NoError(t, err)
	require.False(t, out.Duplicate)
	require.Equal(t, "msg_1", out.Result.MessageID)
	require.Equal(t, 1, out.Attempt)

	eff, err := g.operator.GetEffect(ctx, out.EffectID)
	require.NoError(t, err)
	require.Equal(t, ratchet.EffectSucceeded, eff.State)
	require.Equal(t, key, eff.IdempotencyKey)

	again, err := ratchet.DoEffect(ctx, g.agent, req("email.send", key), send)
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, "msg_1", again.Result.MessageID, "the recorded result")
	require.Equal(t, out.EffectID, again.EffectID)
	require.EqualValues(t, 1, calls.Load(), "a duplicate never acts")

	// Same key, different payload: the caller's bug, surfaced as a typed error.
	other := req("email.send", key)
	other.Payload = map[string]string{"to": "someone_else"}
	_, err = ratchet.DoEffect(ctx, g.agent, other, send)
	require.True(t, ratchet.IsCode(err, ratchet.CodeIdempotencyKeyReuse), "%v", err)
}

func TestGateNotPerformedReportsFailedAndAllowsRetry(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	refused := errors.New("vendor refused before sending")
	out, err := ratchet.DoEffect(ctx, g.agent, req("email.send", "k-failed"), func(context.Context, ratchet.Lease) (sent, error) {
		return sent{}, ratchet.NotPerformed(refused)
	})
	require.ErrorIs(t, err, refused)
	require.Nil(t, out)
	effects := g.env.Must(http.StatusOK, "GET", "/api/v1/effects?effect_type=email.send", g.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, effects, 1)
	require.Equal(t, ratchet.EffectFailed, effects[0].(map[string]any)["state"])

	second, err := ratchet.DoEffect(ctx, g.agent, req("email.send", "k-failed"), func(_ context.Context, l ratchet.Lease) (sent, error) {
		return sent{MessageID: "msg_2"}, nil
	})
	require.NoError(t, err)
	require.Equal(t, 2, second.Attempt)
}

func TestGateUnsureErrorLeavesIndeterminateThenBlocked(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	g.policy(t, "payment.charge", map[string]any{"lease_seconds": 5})
	unsure := errors.New("connection reset mid-request")
	_, err := ratchet.DoEffect(ctx, g.agent, req("payment.charge", "charge:1"), func(context.Context, ratchet.Lease) (sent, error) {
		return sent{}, unsure
	})
	require.ErrorIs(t, err, unsure)
	time.Sleep(5500 * time.Millisecond) // let the 5 s lease lapse: nothing was reported

	_, err = ratchet.DoEffect(ctx, g.agent, req("payment.charge", "charge:1"), func(context.Context, ratchet.Lease) (sent, error) {
		t.Error("acted while blocked")
		return sent{}, nil
	})
	var blocked *ratchet.BlockedError
	require.ErrorAs(t, err, &blocked)
	require.ErrorIs(t, err, ratchet.ErrBlocked)
	require.NotNil(t, blocked.PriorAttempt)
	require.Equal(t, 1, blocked.PriorAttempt.Attempt)
	eff, err := g.operator.GetEffect(ctx, blocked.EffectID)
	require.NoError(t, err)
	require.Equal(t, ratchet.EffectIndeterminate, eff.State)

	// The recovery path: find it, verify at the vendor, resolve it; the key
	// then answers the vendor's result as a duplicate.
	page, err := g.operator.ListEffects(ctx, ratchet.EffectQuery{State: ratchet.EffectIndeterminate,
		EffectType: "payment.charge", Limit: 10})
	require.NoError(t, err)
	require.Len(t, page.Data, 1)
	require.Equal(t, blocked.EffectID, page.Data[0].ID)
	require.Nil(t, page.NextCursor)
	// A resolve naming another attempt than the unknown one is refused,
	// naming it; naming the one blocked names, it is recorded.
	_, err = g.operator.ResolveEffect(ctx, blocked.EffectID, ratchet.ResolveRequest{
		Outcome: ratchet.OutcomeSucceeded, Attempt: 2})
	var refused *ratchet.Error
	require.ErrorAs(t, err, &refused)
	require.Equal(t, "invalid_state", refused.Code)
	require.EqualValues(t, 1, refused.Detail["unresolved_attempt"])
	resolved, err := g.operator.ResolveEffect(ctx, blocked.EffectID, ratchet.ResolveRequest{
		Outcome: ratchet.OutcomeSucceeded, Result: sent{MessageID: "vendor_1"}, Note: "found at the vendor",
		Attempt: blocked.PriorAttempt.Attempt})
	require.NoError(t, err)
	require.Equal(t, ratchet.EffectSucceeded, resolved.State)
	// The record says who did what (QA: the SDK's Effect left these out).
	read, err := g.operator.GetEffect(ctx, blocked.EffectID)
	require.NoError(t, err)
	require.Len(t, read.Attempts, 1)
	a := read.Attempts[0]
	require.NotEmpty(t, a.BeganByKeyID)
	require.NotNil(t, a.ResolvedByKeyID)
	require.NotNil(t, a.ResolvedAt)
	require.Equal(t, "found at the vendor", *a.ResolveNote)
	require.False(t, a.Probe)
	require.JSONEq(t, `{"message_id":"vendor_1"}`, string(read.Result))
	require.NotEmpty(t, read.ResultPreview)
	require.Nil(t, read.LeaseExpiresAt, "no live lease")
	out, err := ratchet.DoEffect(ctx, g.agent, req("payment.charge", "charge:1"), func(context.Context, ratchet.Lease) (sent, error) {
		t.Error("acted after the resolution")
		return sent{}, nil
	})
	require.NoError(t, err)
	require.True(t, out.Duplicate)
	require.Equal(t, "vendor_1", out.Result.MessageID)
	_, err = g.operator.ResolveEffect(ctx, blocked.EffectID, ratchet.ResolveRequest{Outcome: ratchet.OutcomeFailed})
	require.True(t, ratchet.IsCode(err, "invalid_state"), "%v", err)
	page, err = g.operator.ListEffects(ctx, ratchet.EffectQuery{State: ratchet.EffectIndeterminate})
	require.NoError(t, err)
	require.Empty(t, page.Data)
}

// A group through the SDK: its steps declare compensations, the unwind
// plan names them, and performing each with its suggested key unwinds it.
func TestGateGroupUnwindThroughTheSDK(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	group, err := g.agent.CreateGroup(ctx, "order 551")
	require.NoError(t, err)
	require.Equal(t, "open", group.State)
	// Opened under a key, a group is opened once however often it is asked.
	keyed, err := g.agent.CreateGroupWithKey(ctx, "order 552", "order-552")
	require.NoError(t, err)
	require.False(t, keyed.Deduplicated)
	same, err := g.agent.CreateGroupWithKey(ctx, "order 552", "order-552")
	require.NoError(t, err)
	require.True(t, same.Deduplicated)
	require.Equal(t, keyed.ID, same.ID)
	for _, step := range []string{"reserve", "charge"} {
		r := req("order."+step, "order-551:"+step)
		r.GroupID = group.ID
		r.Compensation = &ratchet.Compensation{EffectType: "order.un" + step, Payload: map[string]string{"order": "551"}}
		_, err := ratchet.DoEffect(ctx, g.agent, r, func(context.Context, ratchet.Lease) (sent, error) {
			return sent{MessageID: step}, nil
		})
		require.NoError(t, err)
	}
	committed, err := g.agent.CommitGroup(ctx, group.ID)
	require.NoError(t, err)
	require.Equal(t, "committed", committed.State)
	again, err := g.agent.CommitGroup(ctx, group.ID)
	require.NoError(t, err, "committing twice answers the group")
	require.Equal(t, "committed", again.State)

	unwind, err := g.agent.UnwindGroup(ctx, group.ID)
	require.NoError(t, err)
	require.Equal(t, "unwinding", unwind.State)
	require.Len(t, unwind.Plan, 2)
	require.Equal(t, "order.uncharge", unwind.Plan[0].Compensation["effect_type"], "reverse order of success")
	for _, item := range unwind.Plan {
		r := ratchet.BeginRequest{EffectType: item.Compensation["effect_type"].(string),
			IdempotencyKey: item.SuggestedIdempotencyKey, Payload: item.Compensation["payload"],
			CompensatesEffectID: item.CompensatesEffectID, CostMicros: ratchet.Micros(0)}
		undo, err := ratchet.DoEffect(ctx, g.agent, r, func(context.Context, ratchet.Lease) (sent, error) {
			return sent{MessageID: "undone"}, nil
		})
		require.NoError(t, err)
		eff, err := g.operator.GetEffect(ctx, undo.EffectID)
		require.NoError(t, err)
		require.Equal(t, item.CompensatesEffectID, *eff.CompensatesEffectID)
	}
	final, err := g.agent.GetGroup(ctx, group.ID)
	require.NoError(t, err)
	require.Equal(t, "unwound", final.State)
	require.Len(t, final.Steps, 4)
}

func TestGateProbe(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	g.policy(t, "sms.send", map[string]any{"lease_seconds": 5, "on_indeterminate": "probe"})
	_, err := ratchet.DoEffect(ctx, g.agent, req("sms.send", "sms:1"), func(context.Context, ratchet.Lease) (sent, error) {
		return sent{}, errors.New("timeout")
	})
	require.Error(t, err)
	time.Sleep(5500 * time.Millisecond)
	out, err := ratchet.DoEffect(ctx, g.agent, req("sms.send", "sms:1"), func(_ context.Context, l ratchet.Lease) (sent, error) {
		require.True(t, l.Probe)
		require.NotNil(t, l.PriorAttempt)
		return sent{MessageID: "found-at-vendor"}, nil // the vendor had it: report what we found
	})
	require.NoError(t, err)
	require.Equal(t, 2, out.Attempt)
	dup, err := ratchet.DoEffect(ctx, g.agent, req("sms.send", "sms:1"), func(context.Context, ratchet.Lease) (sent, error) {
		return sent{}, errors.New("must not run")
	})
	require.NoError(t, err)
	require.Equal(t, "found-at-vendor", dup.Result.MessageID)
}

func TestGateInFlightWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	g.policy(t, "email.send", map[string]any{"lease_seconds": 5})
	holding, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := ratchet.DoEffect(ctx, g.agent, req("email.send", "k-race"), func(context.Context, ratchet.Lease) (sent, error) {
			close(holding)
			<-release
			return sent{MessageID: "by-holder"}, nil
		})
		first <- err
	}()
	<-holding
	// While the holder works, a second caller is told in_flight. With a
	// context shorter than the wait (retry_after: the holder's 5 s lease) it
	// gets ErrInFlight back... The context must still outlast the begin
	// itself: at 200 ms a slow begin on a loaded machine ran out of time
	// first (context deadline exceeded, not ErrInFlight).
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := ratchet.DoEffect(short, g.agent, req("email.send", "k-race"), func(context.Context, ratchet.Lease) (sent, error) {
		return sent{}, errors.New("must not run")
	})
	cancel()
	require.ErrorIs(t, err, ratchet.ErrInFlight)
	// ...and with patience it waits, asks again and sees the holder's result.
	type answer struct {
		out *ratchet.EffectOutcome[sent]
		err error
	}
	second := make(chan answer, 1)
	go func() {
		out, err := ratchet.DoEffect(ctx, g.agent, req("email.send", "k-race"), func(context.Context, ratchet.Lease) (sent, error) {
			return sent{}, errors.New("must not run")
		})
		second <- answer{out, err}
	}()
	time.Sleep(100 * time.Millisecond)
	close(release)
	require.NoError(t, <-first)
	select {
	case a := <-second:
		require.NoError(t, a.err)
		require.True(t, a.out.Duplicate)
		require.Equal(t, "by-holder", a.out.Result.MessageID)
	case <-time.After(time.Minute):
		t.Fatal("the waiting caller never got an answer")
	}
}

func TestGateApprovalRequired(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	g.policy(t, "wire.send", map[string]any{"mode": "require_approval"})
	_, err := ratchet.DoEffect(ctx, g.agent, req("wire.send", "wire:1"), func(context.Context, ratchet.Lease) (sent, error) {
		t.Error("acted before approval")
		return sent{}, nil
	})
	var pending *ratchet.ApprovalRequiredError
	require.ErrorAs(t, err, &pending)
	require.ErrorIs(t, err, ratchet.ErrApprovalRequired)
	require.NotEmpty(t, pending.ApprovalID)
	g.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+pending.ApprovalID+"/approve", g.ws.Key, map[string]any{"note": "ok"})
	out, err := ratchet.DoEffect(ctx, g.agent, req("wire.send", "wire:1"), func(context.Context, ratchet.Lease) (sent, error) {
		return sent{MessageID: "approved"}, nil
	})
	require.NoError(t, err)
	require.Equal(t, "approved", out.Result.MessageID)
	eff, err := g.operator.GetEffect(ctx, out.EffectID)
	require.NoError(t, err)
	require.Equal(t, pending.ApprovalID, *eff.ApprovalID)
}

func TestGateDenied(t *testing.T) {
	t.Parallel()
	g := setupGate(t)
	ctx := context.Background()
	g.policy(t, "db.drop", map[string]any{"mode": "deny"})
	_, err := ratchet.DoEffect(ctx, g.agent, req("db.drop", "drop:prod"), func(context.Context, ratchet.Lease) (sent, error) {
		t.Error("acted on a denied effect")
		return sent{}, nil
	})
	var denied *ratchet.DeniedError
	require.ErrorAs(t, err, &denied)
	require.ErrorIs(t, err, ratchet.ErrDenied)
	require.Equal(t, ratchet.CodePolicyDenied, denied.Code)
	require.Equal(t, ratchet.CodePolicyDenied, ratchet.ErrorCode(err))
	require.NotEmpty(t, denied.EffectID)
}

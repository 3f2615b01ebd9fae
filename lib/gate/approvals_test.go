package gate_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

func wire(k string) map[string]any {
	return map[string]any{"effect_type": "wire.send", "idempotency_key": k, "payload": map[string]any{"iban": "DE00"},
		"cost_micros": 2_000_000}
}

func TestApprovalApproveThenExecute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval"})
	k := key("wire")
	d := b.mustBegin("approval_required", wire(k))
	aid := str(d["approval_id"])
	require.Regexp(t, `^apr_`, aid)
	again := b.mustBegin("approval_required", wire(k))
	require.Equal(t, aid, again["approval_id"])
	require.EqualValues(t, 0, again["attempt"])

	list := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", b.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, list, 1)
	a := list[0].(map[string]any)
	require.Equal(t, aid, a["id"])
	require.Equal(t, d["effect_id"], a["effect_id"])
	require.Equal(t, "wire.send", a["effect_type"])
	require.Equal(t, "pending", a["state"])
	require.Equal(t, "policy_requires_approval", a["reason"])
	require.Nil(t, a["decided_at"])
	require.Empty(t, b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=approved", b.ws.Key, nil).JSON()["data"])
	errCode(t, b.env.Do("GET", "/api/v1/approvals?state=maybe", b.ws.Key, nil), http.StatusBadRequest, "invalid_request")

	// A note of null is refused, and decides nothing (QA: it approved).
	errCode(t, b.env.Do("POST", "/api/v1/approvals/"+aid+"/approve", b.ws.Key, map[string]any{"note": nil}),
		http.StatusBadRequest, "invalid_request")
	require.Len(t, b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", b.ws.Key, nil).JSON()["data"], 1)

	r := b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+aid+"/approve", b.ws.Key, map[string]any{"note": "ok by finance"})
	ap := r.JSON()
	require.Equal(t, "approved", ap["state"])
	require.Equal(t, "ok by finance", ap["note"])
	require.NotNil(t, ap["decided_at"])
	// Approving again answers the same approval; rejecting it now is illegal.
	require.Equal(t, ap, b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+aid+"/approve", b.ws.Key, nil).JSON())
	errCode(t, b.env.Do("POST", "/api/v1/approvals/"+aid+"/reject", b.ws.Key, nil), http.StatusConflict, "invalid_state")

	// One approval is read by the id begin answered with (QA: only the
	// list had it); another workspace's, or none, is unknown.
	require.Equal(t, ap, b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+aid, b.ws.Key, nil).JSON())
	other := b.env.Signup()
	errCode(t, b.env.Do("GET", "/api/v1/approvals/"+aid, other.Key, nil), http.StatusNotFound, "not_found")
	errCode(t, b.env.Do("GET", "/api/v1/approvals/apr_nope", b.ws.Key, nil), http.StatusNotFound, "not_found")
	errCode(t, b.env.Do("GET", "/api/v1/approvals/"+aid, b.agent(), nil), http.StatusForbidden, "forbidden")

	ex := b.mustBegin("execute", wire(k))
	require.EqualValues(t, 1, ex["attempt"]) // the wait consumed no attempt
	require.Equal(t, d["effect_id"], ex["effect_id"])
	// A failed attempt may retry without a second approval.
	require.Equal(t, http.StatusOK, b.report(str(ex["effect_id"]), str(ex["lease_token"]), "failed", nil).Status)
	ex2 := b.mustBegin("execute", wire(k))
	require.EqualValues(t, 2, ex2["attempt"])
}

func TestApprovalRejectIsFinal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("wire.send", map[string]any{"approval_above_micros": 1_000_000})
	k := key("wire")
	d := b.mustBegin("approval_required", wire(k))
	aid := str(d["approval_id"])
	ap := b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+aid+"/reject", b.ws.Key, map[string]any{"note": "no"}).JSON()
	require.Equal(t, "rejected", ap["state"])
	require.Equal(t, "cost_at_or_above_threshold", ap["reason"])
	require.Equal(t, "no", ap["note"])
	require.NotNil(t, ap["decided_at"])
	errCode(t, b.env.Do("POST", "/api/v1/approvals/"+aid+"/approve", b.ws.Key, nil), http.StatusConflict, "invalid_state")
	// ?state= filters by the decision (API.md §5: pending, approved or rejected).
	pending := str(b.mustBegin("approval_required", wire(key("wire")))["approval_id"])
	listed := func(state string) []any {
		return b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state="+state, b.ws.Key, nil).JSON()["data"].([]any)
	}
	require.Equal(t, []any{ap}, listed("rejected"))
	require.Len(t, listed("pending"), 1)
	require.Equal(t, pending, listed("pending")[0].(map[string]any)["id"])
	require.Empty(t, listed("approved"))

	for i := 0; i < 2; i++ {
		den := b.mustBegin("denied", wire(k))
		require.Equal(t, "approval_rejected", den["error"].(map[string]any)["code"])
		require.Equal(t, d["effect_id"], den["effect_id"])
		require.EqualValues(t, 0, den["attempt"])
	}
	// Final even once the policy no longer asks for approval.
	b.putPolicy("wire.send", map[string]any{"approval_above_micros": nil})
	b.mustBegin("denied", wire(k))
	e := b.get(str(d["effect_id"]))
	require.Equal(t, "denied", e["state"])
	require.Equal(t, "approval_rejected", e["denial_code"])
	require.Equal(t, aid, e["approval_id"])

	errCode(t, b.env.Do("POST", "/api/v1/approvals/apr_00000000000000000000000000/approve", b.ws.Key, nil),
		http.StatusNotFound, "not_found")
	errCode(t, b.env.Do("POST", "/api/v1/approvals/nope/approve", b.ws.Key, nil), http.StatusNotFound, "not_found")
}

func TestScopes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := b.agent()
	r := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", agent, email(key("agent")))
	d := r.JSON()
	require.Equal(t, "execute", d["decision"])
	id := str(d["effect_id"])
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/heartbeat", agent, map[string]any{"lease_token": d["lease_token"]})

	forbidden := func(method, path string, body any, scope string) {
		t.Helper()
		e := errCode(t, b.env.Do(method, path, agent, body), http.StatusForbidden, "forbidden")
		require.Equal(t, []any{scope}, e["detail"].(map[string]any)["required"])
	}
	forbidden("PUT", "/api/v1/policies/email.send", map[string]any{"mode": "deny"}, "policies:write")
	forbidden("GET", "/api/v1/policies/email.send", nil, "policies:read")
	forbidden("GET", "/api/v1/policies", nil, "policies:read")
	forbidden("GET", "/api/v1/effects/"+id, nil, "effects:read")
	forbidden("GET", "/api/v1/effects", nil, "effects:read")
	forbidden("POST", "/api/v1/effects/"+id+"/resolve", map[string]any{"outcome": "failed"}, "effects:resolve")
	forbidden("GET", "/api/v1/approvals", nil, "approvals:write")
	forbidden("POST", "/api/v1/approvals/apr_00000000000000000000000000/approve", nil, "approvals:write")
	forbidden("POST", "/api/v1/approvals/apr_00000000000000000000000000/reject", map[string]any{"note": "no"}, "approvals:write")

	r = b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/report", agent,
		map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded"})
	require.Equal(t, "succeeded", r.JSON()["state"])
	// The policy is untouched.
	require.EqualValues(t, 0, b.env.Must(http.StatusOK, "GET", "/api/v1/policies/email.send", b.ws.Key, nil).JSON()["version"])

	// A key with only effects:read may read but not begin.
	reader := b.env.Key(b.ws, map[string]any{"name": "reader", "scopes": []string{"effects:read"}})
	b.env.Must(http.StatusOK, "GET", "/api/v1/effects/"+id, reader, nil)
	e := errCode(t, b.env.Do("POST", "/api/v1/effects/begin", reader, email(key("r"))), http.StatusForbidden, "forbidden")
	require.Equal(t, []any{"effects:begin"}, e["detail"].(map[string]any)["required"])
}

func TestCrossTenantIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval"})
	d := b.mustBegin("execute", email(key("mine")))
	id := str(d["effect_id"])
	a := b.mustBegin("approval_required", wire(key("w")))
	other := b.env.Signup()

	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/api/v1/effects/" + id, nil},
		{"POST", "/api/v1/effects/" + id + "/report", map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded"}},
		{"POST", "/api/v1/effects/" + id + "/heartbeat", map[string]any{"lease_token": d["lease_token"]}},
		{"POST", "/api/v1/effects/" + id + "/resolve", map[string]any{"outcome": "succeeded"}},
		{"POST", "/api/v1/approvals/" + str(a["approval_id"]) + "/approve", nil},
		{"POST", "/api/v1/approvals/" + str(a["approval_id"]) + "/reject", nil},
	} {
		errCode(t, b.env.Do(c.method, c.path, other.Key, c.body), http.StatusNotFound, "not_found")
	}
	require.Empty(t, b.env.Must(http.StatusOK, "GET", "/api/v1/effects", other.Key, nil).JSON()["data"])
	require.Empty(t, b.env.Must(http.StatusOK, "GET", "/api/v1/approvals", other.Key, nil).JSON()["data"])
	// The other tenant's policy for the same type is its own default.
	require.EqualValues(t, 0, b.env.Must(http.StatusOK, "GET", "/api/v1/policies/wire.send", other.Key, nil).JSON()["version"])
	// Nothing changed for the owner.
	require.Equal(t, "leased", b.get(id)["state"])
	require.Equal(t, "pending", b.env.Must(http.StatusOK, "GET", "/api/v1/approvals", b.ws.Key, nil).JSON()["data"].([]any)[0].(map[string]any)["state"])
}

// An approval answers the question it was asked: one given for an amount
// does not carry the key through the emergency stop or a breaker that holds
// the type with require_approval; each needs an approval of its own, which
// then carries the key's retries while the hold lasts.
func TestApprovalForAnAmountDoesNotPassAHold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("wire.send", map[string]any{"approval_above_micros": 1_000_000})
	approve := func(d map[string]any) {
		b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(d["approval_id"])+"/approve", b.ws.Key, nil)
	}
	fail := func(d map[string]any) {
		require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)
	}
	k := key("wire")
	first := b.mustBegin("approval_required", wire(k))
	approve(first)
	fail(b.mustBegin("execute", wire(k)))

	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"reason": "incident"})
	held := b.mustBegin("approval_required", wire(k))
	require.NotEqual(t, first["approval_id"], held["approval_id"], "a new question")
	pending := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", b.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, pending, 1)
	require.Equal(t, "circuit_open", pending[0].(map[string]any)["reason"])
	approve(held)
	fail(b.mustBegin("execute", wire(k)))
	b.mustBegin("execute", wire(k)) // the stop's approval carries the retry
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/release", b.ws.Key, nil)

	// A breaker on the type alone, likewise.
	k2 := key("wire")
	approve(b.mustBegin("approval_required", wire(k2)))
	fail(b.mustBegin("execute", wire(k2)))
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/wire.send/open", b.ws.Key,
		map[string]any{"action": "require_approval", "reason": "vendor incident"})
	b.mustBegin("approval_required", wire(k2))
}

// An approval given before 0041 recorded no answers: it answers the reason
// it was asked for alone (and lists that), so a key it held for two
// reasons is asked once more, as that release asked it.
func TestAnApprovalOfAnEarlierReleaseAnswersItsReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval", "approval_above_micros": 1_000_000})
	k := wire(key("old"))
	held := b.mustBegin("approval_required", k)
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(held["approval_id"])+"/approve", b.ws.Key, nil)
	_, err := b.env.App.Pool.Exec(t.Context(), `UPDATE approvals SET answers = NULL WHERE id = $1`, str(held["approval_id"]))
	require.NoError(t, err)
	old := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+str(held["approval_id"]), b.ws.Key, nil).JSON()
	require.Equal(t, []any{"policy_requires_approval"}, old["answers"])
	again := b.mustBegin("approval_required", k)
	require.NotEqual(t, held["approval_id"], again["approval_id"])
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(again["approval_id"])+"/approve", b.ws.Key, nil)
	b.mustBegin("execute", k)
}

// An approval given for one breaker's opening answers that opening only: a
// breaker or the emergency stop opened after it was decided holds the key
// again (the stop halts every effect; the operator said yes to the earlier
// incident, not to this one), while the breaker it was given for lets the
// key through as long as it stays open.
func TestABreakerApprovalDoesNotAnswerALaterStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := sms(key("held"))
	a := b.executeThroughApprovedBreaker(body)
	d := b.mustBegin("execute", body) // the same breaker, still open: the approval answers it
	require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)

	b.clock.Add(24 * time.Hour)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key,
		map[string]any{"reason": "incident", "action": "require_approval"})
	again := b.mustBegin("approval_required", body)
	require.NotEqual(t, a["approval_id"], again["approval_id"], "a new question for the operator")
}

// Opening the same breaker again with the same action (a script repeating
// it, a new reason) is no new incident: the approval given for it still
// answers (review: every repeat asked again).
func TestARepeatedOpeningKeepsItsApproval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := sms(key("held"))
	b.executeThroughApprovedBreaker(body)
	b.clock.Add(time.Minute)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key,
		map[string]any{"action": "require_approval", "reason": "still flaky"})
	d := b.mustBegin("execute", body)
	require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)

	// So is an operator taking over a surge's breaker with its action (QA).
	b.putPolicy("email.send", map[string]any{"surge_per_hour": 2, "surge_action": "require_approval"})
	b.mustBegin("execute", email(key("a")))
	b.mustBegin("execute", email(key("b")))
	held := email(key("c"))
	a := b.mustBegin("approval_required", held)
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(a["approval_id"])+"/approve", b.ws.Key, nil)
	b.clock.Add(time.Minute)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/email.send/open", b.ws.Key,
		map[string]any{"action": "require_approval", "reason": "pin it"})
	require.Equal(t, "manual", b.circuit("email.send")["opened_by"])
	b.mustBegin("execute", held)
}

// A breaker given another action after a yes asks again even when the
// action is weaker: a key held by the stop and approved while its type's
// own breaker denied is denied by the breaker, and once the breaker is
// eased to require_approval it is asked again, since the yes did not
// answer that hold (README, approvals: the gate model found the server
// does so; the README named only an action made stricter).
func TestABreakerEasedAfterAnApprovalAsksAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := sms(key("held"))
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key,
		map[string]any{"reason": "incident", "action": "require_approval"})
	a := b.mustBegin("approval_required", body)
	b.clock.Add(time.Minute)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key,
		map[string]any{"action": "deny", "reason": "vendor down"})
	b.clock.Add(time.Minute)
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(a["approval_id"])+"/approve", b.ws.Key, nil)
	b.mustBegin("denied", body)

	b.clock.Add(time.Minute)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key,
		map[string]any{"action": "require_approval", "reason": "vendor back, watch it"})
	again := b.mustBegin("approval_required", body)
	require.NotEqual(t, a["approval_id"], again["approval_id"], "a new question for the operator")
}

// A stop that was only watching (monitor) when a breaker's approval was
// given, and is escalated to require_approval later, holds the key again:
// the escalation keeps the stop's opened_at, and the approval predates it.
func TestABreakerApprovalDoesNotAnswerAStopEscalatedLater(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key,
		map[string]any{"reason": "watching", "action": "monitor"})
	b.clock.Add(time.Minute)
	body := sms(key("held"))
	a := b.executeThroughApprovedBreaker(body)

	b.clock.Add(time.Hour)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key,
		map[string]any{"reason": "incident: halt everything", "action": "require_approval"})
	again := b.mustBegin("approval_required", body)
	require.NotEqual(t, a["approval_id"], again["approval_id"], "a new question for the operator")
}

// executeThroughApprovedBreaker opens sms.send's breaker with
// require_approval, holds body's key on it, approves the hold a minute
// later and executes the key once (reported failed, so it may run again);
// it returns the approval.
func (b *bundle) executeThroughApprovedBreaker(body map[string]any) map[string]any {
	b.t.Helper()
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key,
		map[string]any{"action": "require_approval", "reason": "vendor flaky"})
	a := b.mustBegin("approval_required", body)
	b.clock.Add(time.Minute)
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(a["approval_id"])+"/approve", b.ws.Key, nil)
	d := b.mustBegin("execute", body)
	require.Equal(b.t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)
	return a
}

// An approval answers every question that held when it was given, so the
// next begin executes (API.md §2.4; contract QA: a key held by the policy's
// mode and its amount was asked twice, the second question only after the
// first yes; so was one whose type the emergency stop held by the time the
// policy's question was answered). What arises after the yes asks again
// (QA: a breaker's yes carried a key through a require_approval mode set
// afterwards, and a lower threshold likewise).
func TestAnApprovalAnswersWhatHeldWhenItWasGiven(t *testing.T) {
	t.Parallel()
	b := setup(t)
	approve := func(d map[string]any) {
		b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(d["approval_id"])+"/approve", b.ws.Key, nil)
	}
	reason := func(d map[string]any) string {
		for _, a := range b.env.Must(http.StatusOK, "GET", "/api/v1/approvals", b.ws.Key, nil).JSON()["data"].([]any) {
			if a := a.(map[string]any); a["id"] == d["approval_id"] {
				return str(a["reason"])
			}
		}
		t.Fatalf("approval %v not listed", d["approval_id"])
		return ""
	}
	pending := func() int {
		return len(b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", b.ws.Key, nil).JSON()["data"].([]any))
	}

	// The policy's mode and an amount: one question, whose yes says what
	// it answers.
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval", "approval_above_micros": 1_000_000})
	k := wire(key("both"))
	held := b.mustBegin("approval_required", k)
	require.Equal(t, "policy_requires_approval", reason(held))
	pendingOne := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+str(held["approval_id"]), b.ws.Key, nil).JSON()
	require.Contains(t, pendingOne, "answers")
	require.Nil(t, pendingOne["answers"], "nothing answered while pending")
	yes := b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(held["approval_id"])+"/approve", b.ws.Key, nil).JSON()
	require.Equal(t, []any{"policy_requires_approval", "cost_at_or_above_threshold"}, yes["answers"])
	require.Equal(t, yes["answers"], b.lastEventData("approval.decided")["answers"])
	d := b.mustBegin("execute", k)
	require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)
	b.mustBegin("execute", k) // the yes still answers the retry
	require.Zero(t, pending())

	// A breaker and an amount: one question, asked for the breaker.
	b.putPolicy("wire.send", map[string]any{"mode": "allow"})
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/wire.send/open", b.ws.Key,
		map[string]any{"action": "require_approval", "reason": "incident"})
	k = wire(key("big"))
	held = b.mustBegin("approval_required", k)
	require.Equal(t, "circuit_open", reason(held))
	yes = b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(held["approval_id"])+"/approve", b.ws.Key, nil).JSON()
	require.Equal(t, []any{"circuit_open", "cost_at_or_above_threshold"}, yes["answers"])
	b.mustBegin("execute", k)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/wire.send/close", b.ws.Key, nil)

	// The stop opened while the policy's question waited: the yes given
	// under it answers it.
	b.putPolicy("sms.send", map[string]any{"mode": "require_approval"})
	st := sms(key("stop"))
	held = b.mustBegin("approval_required", st)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"reason": "incident"})
	b.clock.Add(time.Minute)
	approve(held)
	b.mustBegin("execute", st)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/release", b.ws.Key, nil)
	b.putPolicy("sms.send", map[string]any{"mode": "allow"})

	// A threshold lowered after the policy's yes: a new question.
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval", "approval_above_micros": 10_000_000})
	k = wire(key("lowered"))
	approve(b.mustBegin("approval_required", k))
	d = b.mustBegin("execute", k)
	require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)
	b.putPolicy("wire.send", map[string]any{"approval_above_micros": 1_000_000})
	again := b.mustBegin("approval_required", k)
	require.Equal(t, "cost_at_or_above_threshold", reason(again))
	approve(again)
	b.mustBegin("execute", k)

	// A breaker, then the policy's mode.
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key,
		map[string]any{"action": "require_approval"})
	s := sms(key("pm"))
	first := b.mustBegin("approval_required", s)
	approve(first)
	b.putPolicy("sms.send", map[string]any{"mode": "require_approval"})
	policy := b.mustBegin("approval_required", s)
	require.Equal(t, "policy_requires_approval", reason(policy))
	approve(policy)
	b.mustBegin("execute", s)
}

// A key revoked on one instance decides no approval on another whose cache
// still holds it (an approval lets the effect execute): 401, and the
// approval stays pending.
func TestARevokedKeyDecidesNoApprovalOnAnotherInstance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env2 := apitest.Start(t, apitest.WithNow(b.clock.Now))
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval"})
	aid := str(b.mustBegin("approval_required", wire(key("wire")))["approval_id"])
	approver := b.env.Key(b.ws, map[string]any{"name": "approver", "scopes": []string{"approvals:write"}})
	env2.Must(http.StatusOK, "GET", "/api/v1/approvals/"+aid, approver, nil) // cached there now
	b.env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+keyID(approver), b.ws.Key, nil)

	errCode(t, env2.Do("POST", "/api/v1/approvals/"+aid+"/approve", approver, nil), http.StatusUnauthorized,
		"unauthorized")
	require.Equal(t, "pending", b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+aid, b.ws.Key, nil).JSON()["state"])
}

// announcements is the data of the approval.requested events of approval id.
func (b *bundle) announcements(id string) []map[string]any {
	b.t.Helper()
	rows, err := b.env.App.Pool.Query(context.Background(), `SELECT data FROM events
		WHERE workspace_id = $1 AND type = 'approval.requested' AND subject_id = $2`, b.ws.ID, id)
	require.NoError(b.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[map[string]any])
	require.NoError(b.t, err)
	return out
}

// Every approval an operator is asked for is announced once
// (approval.requested: API.md §2.7; seed 003 tells an agent held for one to
// "wait for the webhook"): for each reason a begin holds a key, on a new key
// (begin's first statement) and on a retry (the locked path), and not again
// for begins that find the question pending.
func TestEveryApprovalRequestIsAnnounced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requested := func(d map[string]any, reason string) {
		t.Helper()
		require.Equal(t, []map[string]any{{"approval_id": d["approval_id"], "effect_id": d["effect_id"],
			"effect_type": "wire.send", "reason": reason}}, b.announcements(str(d["approval_id"])))
	}

	b.putPolicy("wire.send", map[string]any{"mode": "require_approval"})
	byMode := wire(key("mode"))
	d := b.mustBegin("approval_required", byMode)
	requested(d, "policy_requires_approval")
	require.Equal(t, d["approval_id"], b.mustBegin("approval_required", byMode)["approval_id"])
	requested(d, "policy_requires_approval") // not announced again
	require.Equal(t, 1, b.events("approval.requested"))

	b.putPolicy("wire.send", map[string]any{"mode": "allow", "approval_above_micros": 1_000_000})
	requested(b.mustBegin("approval_required", wire(key("amount"))), "cost_at_or_above_threshold")

	// A retry of a failed attempt, held by a policy changed since.
	b.putPolicy("wire.send", map[string]any{"mode": "allow", "approval_above_micros": nil})
	retried := wire(key("retry"))
	ex := b.mustBegin("execute", retried)
	require.Equal(t, http.StatusOK, b.report(str(ex["effect_id"]), str(ex["lease_token"]), "failed", nil).Status)
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval"})
	requested(b.mustBegin("approval_required", retried), "policy_requires_approval")

	b.putPolicy("wire.send", map[string]any{"mode": "allow"})
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/wire.send/open", b.ws.Key,
		map[string]any{"action": "require_approval"})
	requested(b.mustBegin("approval_required", wire(key("breaker"))), "circuit_open")
	require.Equal(t, 4, b.events("approval.requested"), "one per approval asked for, none more")
}

// A pending approval holds its key under a stricter rule that came after
// it (README, Approvals): the key's begins answer approval_required, the
// same approval, and nothing runs; once approved, the next begin is
// evaluated afresh and answers the stricter rule's denial (QA asked what it
// answers; review: every rule the README names).
func TestAPendingApprovalHoldsItsKeyUnderAStricterRule(t *testing.T) {
	t.Parallel()
	for stricter, code := range map[string]string{"deny policy": "policy_denied", "deny stop": "circuit_open",
		"deny breaker": "circuit_open", "lowered ceiling": "cost_ceiling_exceeded"} {
		t.Run(stricter, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.putPolicy("wire.send", map[string]any{"mode": "require_approval"})
			body := wire(key("held"))
			a := b.mustBegin("approval_required", body)
			switch stricter {
			case "deny policy":
				b.putPolicy("wire.send", map[string]any{"mode": "deny"})
			case "deny stop":
				b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key,
					map[string]any{"reason": "incident", "action": "deny"})
			case "deny breaker":
				b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/wire.send/open", b.ws.Key,
					map[string]any{"action": "deny"})
			case "lowered ceiling":
				b.putPolicy("wire.send", map[string]any{"max_cost_micros": 1_000_000})
			}
			again := b.mustBegin("approval_required", body)
			require.Equal(t, a["approval_id"], again["approval_id"], "the same question, still pending")

			b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(a["approval_id"])+"/approve", b.ws.Key, nil)
			b.refusal(code, "denied", body)
			require.Equal(t, "denied", b.get(str(a["effect_id"]))["state"])
		})
	}
}

// An approval names the key that decided it (decided_by_key_id), as an
// attempt names the key that resolved it: who approved a held effect is
// the first thing an audit of it asks, and the README's "decided by the
// resolving key" / "by the key that called unwind" / "by no key" said what
// no read showed (QA: stored, never answered). Null while pending; the
// first decision's key stands when the decision is repeated by another.
func TestAnApprovalNamesTheKeyThatDecidedIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval"})
	approver := b.env.Key(b.ws, map[string]any{"name": "approver", "preset": "OPERATOR"})
	held := func() string { return str(b.mustBegin("approval_required", wire(key("wire")))["approval_id"]) }
	read := func(id string) map[string]any {
		return b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+id, b.ws.Key, nil).JSON()
	}

	yes := held()
	pending := read(yes)
	require.Contains(t, pending, "decided_by_key_id")
	require.Nil(t, pending["decided_by_key_id"], "no key decided it yet")
	ap := b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+yes+"/approve", approver, nil).JSON()
	require.Equal(t, keyID(approver), ap["decided_by_key_id"])
	require.Equal(t, ap, read(yes))
	// A repeat by another key answers the first decision, its key included.
	require.Equal(t, ap, b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+yes+"/approve", b.ws.Key, nil).JSON())

	no := held()
	rej := b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+no+"/reject", b.ws.Key, nil).JSON()
	require.Equal(t, keyID(b.ws.Key), rej["decided_by_key_id"])
	byID := map[string]any{}
	for _, a := range b.env.Must(http.StatusOK, "GET", "/api/v1/approvals", b.ws.Key, nil).JSON()["data"].([]any) {
		byID[str(a.(map[string]any)["id"])] = a.(map[string]any)["decided_by_key_id"]
	}
	require.Equal(t, map[string]any{yes: keyID(approver), no: keyID(b.ws.Key)}, byID)
	// approval.decided says so too, once each.
	for id, by := range byID {
		var said []map[string]any
		rows, err := b.env.App.Pool.Query(context.Background(), `SELECT data FROM events
			WHERE workspace_id = $1 AND type = 'approval.decided' AND subject_id = $2`, b.ws.ID, id)
		require.NoError(t, err)
		said, err = pgx.CollectRows(rows, pgx.RowTo[map[string]any])
		require.NoError(t, err)
		require.Len(t, said, 1)
		require.Equal(t, by, said[0]["decided_by_key_id"])
	}
}

// An approval names what it holds, the effect's cost and idempotency key,
// so an approver that holds approvals:write alone (an approval bot) sees
// the amount and the work it says yes to: it cannot read the effect (QA: it
// approved a held wire blind). The fingerprint binds both: the approved key
// begun with another cost is 409 idempotency_key_reuse, never executed.
func TestAnApprovalNamesWhatItHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("wire.send", map[string]any{"approval_above_micros": 1_000_000})
	bot := b.env.Key(b.ws, map[string]any{"name": "approval bot", "scopes": []string{"approvals:write"}})
	k := key("wire")
	held := b.mustBegin("approval_required", wire(k))
	aid := str(held["approval_id"])
	errCode(t, b.env.Do("GET", "/api/v1/effects/"+str(held["effect_id"]), bot, nil), http.StatusForbidden, "forbidden")

	a := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+aid, bot, nil).JSON()
	require.EqualValues(t, 2_000_000, a["cost_micros"])
	require.Equal(t, k, a["idempotency_key"])
	ap := b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+aid+"/approve", bot, nil).JSON()
	require.EqualValues(t, 2_000_000, ap["cost_micros"])
	require.Equal(t, k, ap["idempotency_key"])
	listed := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=approved", bot, nil).JSON()["data"].([]any)
	require.Equal(t, []any{ap}, listed)

	more := wire(k)
	more["cost_micros"] = 2_000_000_000
	errCode(t, b.begin(more), http.StatusConflict, "idempotency_key_reuse")
	require.EqualValues(t, 1, b.mustBegin("execute", wire(k))["attempt"])

	// A held effect that declared no cost names none.
	b.putPolicy("email.send", map[string]any{"mode": "require_approval"})
	noCost := email(key("mail"))
	delete(noCost, "cost_micros")
	a = b.env.Must(http.StatusOK, "GET", "/api/v1/approvals/"+str(b.mustBegin("approval_required", noCost)["approval_id"]),
		bot, nil).JSON()
	require.Contains(t, a, "cost_micros")
	require.Nil(t, a["cost_micros"])
	require.Equal(t, noCost["idempotency_key"], a["idempotency_key"])
}

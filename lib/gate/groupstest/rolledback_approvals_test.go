package groupstest

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
)

// rolledBackNote is what the note of an approval a rollback closed says.
const rolledBackNote = "rolled back"

// heldStep begins a new vendor.order forward step of group g, which its
// policy holds for an approval, and answers its begin and its approval.
func (f *fx) heldStep(g string) (body map[string]any, approval string) {
	f.t.Helper()
	body = map[string]any{"effect_type": "vendor.order", "idempotency_key": "order:" + ids.Random(8), "group_id": g}
	d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", body)
	require.Equal(f.t, "approval_required", d["decision"])
	return body, d["approval_id"].(string)
}

// closedByRollback requires approval to have been closed by its group's
// rollback: rejected at the clock's instant with the note saying so,
// decided by key (nil: none), announced once.
func (f *fx) closedByRollback(approval string, key *string) map[string]any {
	f.t.Helper()
	a := f.must(http.StatusOK, "GET", "/api/v1/approvals/"+approval, nil)
	require.Equal(f.t, "rejected", a["state"], "%v", a)
	require.Contains(f.t, a["note"], rolledBackNote)
	require.Nil(f.t, a["answers"])
	at, err := time.Parse(time.RFC3339Nano, a["decided_at"].(string))
	require.NoError(f.t, err)
	require.True(f.t, f.clock.Now().Equal(at), "decided at %s", at)
	require.Equal(f.t, 1, f.events("approval.decided", approval))
	var by *string
	require.NoError(f.t, f.env.App.Pool.QueryRow(context.Background(),
		`SELECT decided_by_key_id FROM approvals WHERE id = $1`, approval).Scan(&by))
	require.Equal(f.t, key, by)
	var said map[string]any // what approval.decided says of the key
	require.NoError(f.t, f.env.App.Pool.QueryRow(context.Background(), `SELECT data FROM events
		WHERE workspace_id = $1 AND type = 'approval.decided' AND subject_id = $2`, f.ws.ID, approval).Scan(&said))
	require.Contains(f.t, said, "decided_by_key_id")
	if key == nil {
		require.Nil(f.t, a["decided_by_key_id"], "%v", a)
		require.Nil(f.t, said["decided_by_key_id"], "%v", said)
	} else {
		require.Equal(f.t, *key, a["decided_by_key_id"], "%v", a)
		require.Equal(f.t, *key, said["decided_by_key_id"], "%v", said)
	}
	return a
}

// keyID is the id of the workspace's key.
func (f *fx) keyID() *string {
	f.t.Helper()
	id := f.must(http.StatusOK, "GET", "/api/v1/keys/current", nil)["id"].(string)
	return &id
}

// An approval whose effect a group's rollback keeps from ever running is
// closed by the rollback, as a resolution closes one it makes moot: left
// pending, it could never be approved (409 group_unwinding) and stayed in
// the operators' queue for good (groups QA). A forward step's is closed as
// the unwind begins, rejected with a note saying why, decided by the key
// that unwound, announced once; the effect keeps its state, so a begin of
// its key is still answered by the group (409 group_unwinding), not
// approval_rejected.
func TestAnUnwindClosesItsForwardStepsApprovals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/vendor.order", map[string]any{"mode": "require_approval"})
	g := f.group()
	f.done(g, true)
	order, waiting := f.heldStep(g)
	_, other := f.heldStep(g)
	f.clock.Add(time.Second)
	require.Equal(t, "unwinding", f.unwind(g)["state"])

	for _, apr := range []string{waiting, other} {
		f.closedByRollback(apr, f.keyID())
	}
	pending := f.must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", nil)
	require.Empty(t, pending["data"], "the queue holds only questions")
	id := f.must(http.StatusOK, "GET", "/api/v1/approvals/"+waiting, nil)["effect_id"].(string)
	require.Equal(t, "awaiting_approval", f.must(http.StatusOK, "GET", "/api/v1/effects/"+id, nil)["state"],
		"the effect keeps its state")
	errCode(t, f.do("POST", "/api/v1/effects/begin", order), http.StatusConflict, "group_unwinding")
	ungrouped := map[string]any{"effect_type": order["effect_type"], "idempotency_key": order["idempotency_key"]}
	errCode(t, f.do("POST", "/api/v1/effects/begin", ungrouped), http.StatusConflict, "group_unwinding")

	// Decided: a yes is refused as after any rejection, a rejection answers
	// it unchanged; an unwind again closes nothing again.
	errCode(t, f.do("POST", "/api/v1/approvals/"+waiting+"/approve", map[string]any{}),
		http.StatusConflict, "invalid_state")
	a := f.must(http.StatusOK, "POST", "/api/v1/approvals/"+waiting+"/reject", map[string]any{"note": "late"})
	require.Contains(t, a["note"], rolledBackNote)
	f.clock.Add(time.Second)
	f.unwind(g)
	require.Equal(t, 1, f.events("approval.decided", waiting))
	errCode(t, f.do("POST", "/api/v1/effects/begin", order), http.StatusConflict, "group_unwinding")
}

// A compensation's approval can be given while the rollback runs; once the
// rollback ended its record is final and the compensation takes no
// attempt, so the approval still pending then is closed by that end, here
// a resolve's (decided by no key: the rollback's end, not the resolving
// key's act, makes it moot), announced once; the compensation keeps its
// state.
func TestTheEndOfARollbackClosesItsCompensationsApprovals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/payment.refund",
		map[string]any{"on_indeterminate": "retry", "lease_seconds": 5, "max_attempts": 2})
	g := f.group()
	a := f.done(g, true)
	item := f.unwind(g)["plan"].([]any)[0].(map[string]any)
	c := f.compensate(item, "") // unreported: its lease lapses
	f.clock.Add(time.Minute)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/payment.refund", map[string]any{"mode": "require_approval"})
	comp := item["compensation"].(map[string]any)
	retry := map[string]any{"effect_type": comp["effect_type"], "payload": comp["payload"], "cost_micros": 0,
		"idempotency_key": item["suggested_idempotency_key"], "compensates_effect_id": a}
	d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", retry)
	require.Equal(t, "approval_required", d["decision"])
	approval := d["approval_id"].(string)
	// Its last attempt: resolved failed, the compensation is finally
	// denied, and the rollback ends with the step irreversible.
	f.must(http.StatusOK, "PUT", "/api/v1/policies/payment.refund", map[string]any{"max_attempts": 1})
	f.clock.Add(time.Second)
	f.must(http.StatusOK, "POST", "/api/v1/effects/"+c+"/resolve", map[string]any{"outcome": "failed"})
	require.Equal(t, "unwind_failed", f.stored(g))

	f.closedByRollback(approval, nil)
	require.Equal(t, "failed", f.must(http.StatusOK, "GET", "/api/v1/effects/"+c, nil)["state"])
	require.Empty(t, f.must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", nil)["data"])
	require.NotEqual(t, "approval_required", f.do("POST", "/api/v1/effects/begin", retry).JSON()["decision"])
}

// An unwind never waits for a pending approval another transaction holds
// (an operator deciding it: a decide locks the approval, then the effect,
// so waiting could deadlock); it passes over it, and the sweeper
// (approvals.moot) closes it as the unwind would have, decided by no key
// (which key unwound is not recorded), announced once. It sweeps, so it is
// not parallel (see TestGroupSweeperBackstop).
func TestTheSweeperClosesAnApprovalAnUnwindPassedOver(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	f.must(http.StatusOK, "PUT", "/api/v1/policies/vendor.order", map[string]any{"mode": "require_approval"})
	g := f.group()
	f.done(g, true)
	order, approval := f.heldStep(g)
	holder, err := f.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	_, err = holder.Exec(ctx, `SELECT 1 FROM approvals WHERE id = $1 FOR UPDATE`, approval)
	require.NoError(t, err)
	waits := apitest.NewLockWaits(t, f.env.App.Pool, apitest.BackendPID(t, holder))
	done := make(chan struct{})
	var status int
	go func() {
		defer close(done)
		status = f.do("POST", "/api/v1/groups/"+g+"/unwind", nil).Status
	}()
	require.False(t, waits.Wait(done, "the unwind answers without waiting for the approval"))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "unwinding", f.stored(g))
	var held string
	require.NoError(t, holder.QueryRow(ctx, `SELECT state FROM approvals WHERE id = $1`, approval).Scan(&held))
	require.Equal(t, "pending", held, "passed over while held")
	require.NoError(t, holder.Rollback(ctx))

	for {
		n, err := f.env.App.Server.Gate.SweepMootApprovals(ctx, f.clock.Now(), 500)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	f.closedByRollback(approval, nil)
	errCode(t, f.do("POST", "/api/v1/effects/begin", order), http.StatusConflict, "group_unwinding")
}

// A group's unwind racing an operator's approve and reject of a forward
// step's approval: exactly one decision is made, announced once, and every
// answer agrees with it: a yes given before the rollback started, an
// operator's rejection, or the rollback's close (to which a rejection
// answers the approval unchanged, a yes 409); a yes may also be refused
// group_unwinding while another one, given before the rollback started,
// commits. No sweep is needed: an approval the unwind passed over was held
// by the decide that decided it.
func TestUnwindRacingADecisionOfAForwardStepsApproval(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.must(http.StatusOK, "PUT", "/api/v1/policies/vendor.order", map[string]any{"mode": "require_approval"})
	for round := 0; round < 8; round++ {
		g := f.group()
		f.done(g, true)
		order, approval := f.heldStep(g)
		rs := hammer(6, func(i int) *apitest.Response {
			switch i % 3 {
			case 0:
				return f.do("POST", "/api/v1/approvals/"+approval+"/approve", map[string]any{})
			case 1:
				return f.do("POST", "/api/v1/approvals/"+approval+"/reject", map[string]any{"note": "operator"})
			default:
				return f.do("POST", "/api/v1/groups/"+g+"/unwind", nil)
			}
		})
		a := f.must(http.StatusOK, "GET", "/api/v1/approvals/"+approval, nil)
		require.NotEqual(t, "pending", a["state"], "round %d", round)
		require.Equal(t, 1, f.events("approval.decided", approval), "round %d: one decision, one event", round)
		yes := 0
		for i, r := range rs {
			switch i % 3 {
			case 0:
				// A yes refused group_unwinding read the rollback begun, and
				// the approval pending: either the one that landed (before
				// the rollback, the unwind passing over it) was not yet
				// committed, or none did.
				switch {
				case r.Status == http.StatusOK:
					require.Equal(t, "approved", a["state"], "%s", r.Body)
					yes++
				case r.ErrorCode() != "group_unwinding":
					errCode(t, r, http.StatusConflict, "invalid_state")
				}
			case 1:
				if a["state"] == "approved" {
					errCode(t, r, http.StatusConflict, "invalid_state")
				} else {
					require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
					require.Equal(t, a["note"], r.JSON()["note"], "every rejection answers the one made")
				}
			default:
				require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			}
		}
		require.Equal(t, a["state"] == "approved", yes > 0, "round %d: a yes landed, and was answered", round)
		r := f.do("POST", "/api/v1/effects/begin", order)
		if a["state"] == "rejected" && a["note"] == "operator" {
			errCode(t, r, http.StatusForbidden, "approval_rejected")
		} else {
			if a["state"] == "rejected" {
				require.Contains(t, a["note"], rolledBackNote)
			}
			errCode(t, r, http.StatusConflict, "group_unwinding")
		}
	}
}

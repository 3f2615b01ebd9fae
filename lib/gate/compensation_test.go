package gate_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A compensating begin is held like any begin of its type: the emergency
// stop (or a breaker) and its type's daily ceilings refuse it as they
// would any other (a rollback storm is the kind of doing too much they are
// there to catch, and a budget on refunds bounds the refunds), while a
// run's wallet does not (README). A refusal a later begin can lift leaves
// the rollback unwinding, the plan offering the same compensation again,
// and the rollback ends once it is granted and succeeds.
func TestACompensationIsHeldByTheStopAndItsTypesCeilings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, _, d := b.groupWithStep("checkout", "")
	u := b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()
	item := u["plan"].([]any)[0].(map[string]any)
	comp := map[string]any{"effect_type": "email.retract", "cost_micros": 5,
		"idempotency_key": item["suggested_idempotency_key"], "compensates_effect_id": d["effect_id"]}
	unwind := func() map[string]any {
		return b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()
	}

	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"action": "deny"})
	errCode(t, b.begin(comp), http.StatusForbidden, "circuit_open")
	u = unwind()
	require.Equal(t, "unwinding", u["state"])
	require.Equal(t, "denied", u["plan"].([]any)[0].(map[string]any)["compensation_state"])
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/release", b.ws.Key, nil)

	b.putPolicy("email.retract", map[string]any{"daily_budget_micros": 4})
	errCode(t, b.begin(comp), http.StatusForbidden, "budget_exceeded")
	require.Equal(t, "unwinding", unwind()["state"])

	b.putPolicy("email.retract", map[string]any{"daily_budget_micros": 5})
	c := b.mustBegin("execute", comp)
	require.Equal(t, http.StatusOK, b.report(str(c["effect_id"]), str(c["lease_token"]), "succeeded", nil).Status)
	require.Equal(t, "unwound", unwind()["state"])
}

// A plan never suggests a key another effect holds: when the step's usual
// key and every alternate (compensate:<id>:2 … :9) are taken, by a key of
// the workspace squatting on them say, it suggests a fresh one, and the
// compensation begun under it executes (review: the plan went on suggesting
// the usual key, which every begin was refused, 409 idempotency_key_reuse).
func TestAPlanSuggestsAFreeKeyWhenEveryAlternateIsTaken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g, _, d := b.groupWithStep("checkout", "")
	step := str(d["effect_id"])
	taken := []string{"compensate:" + step}
	for n := 2; n <= 9; n++ {
		taken = append(taken, fmt.Sprintf("compensate:%s:%d", step, n))
	}
	for _, k := range taken {
		b.mustBegin("execute", email(k))
	}

	u := b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()
	item := u["plan"].([]any)[0].(map[string]any)
	suggested := str(item["suggested_idempotency_key"])
	require.NotContains(t, taken, suggested)
	require.True(t, strings.HasPrefix(suggested, "compensate:"+step+":"), suggested)
	c := b.mustBegin("execute", map[string]any{"effect_type": "email.retract", "idempotency_key": suggested,
		"compensates_effect_id": step})
	require.Equal(t, http.StatusOK, b.report(str(c["effect_id"]), str(c["lease_token"]), "succeeded", nil).Status)
	u = b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()
	require.Equal(t, "unwound", u["state"])
}

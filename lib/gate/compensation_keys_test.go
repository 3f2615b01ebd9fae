package gate_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

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

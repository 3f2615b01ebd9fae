package gate_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// A begin that waits for its effect's row (the locked path: another begin
// or a resolve holds it) decides on the breakers and the emergency stop as
// they stand once it holds the row, not as it read them before the wait
// (gate QA: gate_begin_locked evaluated the circuits before its row lock,
// so a key queued behind another request while an operator opened a deny
// breaker, or the stop, was granted execute after the breaker's 200).
func TestABeginThatWaitedForItsRowSeesTheBreakerOpenedMeanwhile(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(b *bundle){
		"breaker": func(b *bundle) {
			b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/email.send/open", b.ws.Key,
				map[string]any{"action": "deny", "reason": "incident"})
		},
		"stop": func(b *bundle) {
			b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key,
				map[string]any{"action": "deny", "reason": "incident"})
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			body := email(key("queued"))
			first := b.mustBegin("execute", body)
			id := str(first["effect_id"])
			require.Equal(t, http.StatusOK, b.report(id, str(first["lease_token"]), "failed", nil).Status)

			// Hold the row as a concurrent request would, so that the retry
			// takes the locked path and waits there.
			ctx := context.Background()
			holder, err := b.env.App.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = holder.Rollback(ctx) }()
			_, err = holder.Exec(ctx, `SELECT 1 FROM effects WHERE id = $1 FOR UPDATE`, id)
			require.NoError(t, err)
			waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, holder))

			type answer struct {
				status int
				out    map[string]any
				err    error
			}
			done, got := make(chan struct{}), make(chan answer, 1)
			go func() {
				defer close(done)
				status, out, err := post(b.env, "/api/v1/effects/begin", b.ws.Key, body)
				got <- answer{status, out, err}
			}()
			waits.Waiting(done, "the retry waits for the effect's row")
			open(b)
			require.NoError(t, holder.Rollback(ctx))

			a := <-got
			require.NoError(t, a.err)
			require.Equal(t, http.StatusForbidden, a.status, "%v", a.out)
			require.Equal(t, "denied", a.out["decision"])
			require.Equal(t, "circuit_open", a.out["error"].(map[string]any)["code"])
			require.EqualValues(t, 1, b.get(id)["attempt"], "no second attempt was granted")
		})
	}
}

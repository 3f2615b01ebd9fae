package gate_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
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
			holder := b.holding(`SELECT 1 FROM effects WHERE id = $1 FOR UPDATE`, id)
			out := b.refusedOnceHolderEnds(holder, body, "the retry waits for the effect's row", func() { open(b) })
			require.Equal(t, "denied", out["decision"])
			require.EqualValues(t, 1, b.get(id)["attempt"], "no second attempt was granted")
		})
	}
}

// A begin of a new key that meets the same key's begin still uncommitted
// (here a transaction standing for it: it took the key's turn, as
// gate_begin_in_turn does, and inserted the key) waits for it, and when that
// one rolls back (a ceiling refused it, a grouped begin is done again)
// decides on the breakers as they are then (gate QA: it had evaluated them
// before its insert waited, and was granted execute after the stop's 200).
func TestANewKeysBeginThatWaitedForTheSameKeySeesTheStopOpenedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := email(key("new"))
	ctx := context.Background()
	holder := b.holding(`SELECT pg_advisory_xact_lock(hashtextextended('gate_key:' || $1::text || '/' || $2::text, 0))`,
		b.ws.ID, body["idempotency_key"])
	_, err := holder.Exec(ctx, `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state,
		lease_seconds, created_by_key_id, created_at, updated_at)
		VALUES ($1, $2, 'email.send', $3, 'x', 'leased', 60, $4, now(), now())`,
		"eff_"+strings.ToLower(ids.Random(8)), b.ws.ID, body["idempotency_key"], keyID(b.ws.Key))
	require.NoError(t, err)
	b.refusedOnceHolderEnds(holder, body, "the new key's begin waits for the other begin of its key", func() {
		b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key,
			map[string]any{"action": "deny", "reason": "incident"})
	})
}

// refusedOnceHolderEnds sends a begin of body that must wait for holder's
// locks (why), runs open meanwhile, rolls holder back, and requires the
// begin to be refused circuit_open; it answers the begin's body.
func (b *bundle) refusedOnceHolderEnds(holder pgx.Tx, body map[string]any, why string, open func()) map[string]any {
	b.t.Helper()
	waits := apitest.NewLockWaits(b.t, b.env.App.Pool, apitest.BackendPID(b.t, holder))
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
	waits.Waiting(done, why)
	open()
	require.NoError(b.t, holder.Rollback(context.Background()))
	a := <-got
	require.NoError(b.t, a.err)
	require.Equal(b.t, http.StatusForbidden, a.status, "%v", a.out)
	require.Equal(b.t, "circuit_open", a.out["error"].(map[string]any)["code"])
	return a.out
}

package gate_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
)

// A begin and a policy PUT turning surge on take turns, so that the begin
// reads one policy throughout: gate_begin_in_turn reads it to decide
// whether to take the surge turn (and move its clock past the allowance's
// start), and gate_evaluate reads it again to count and trip. Were the PUT
// to land between the two reads, the begin would count and trip at its raw
// clock outside the surge turn (concurrency QA's question). It cannot: the
// begin holds the type's policy turn shared from before its first read
// until it commits, and the PUT holds it alone from before it reads the
// policy until it commits. Each order is driven here, turning surge on at
// threshold 3 with three keys begun after an operator's close at C:
//
//   - a PUT in flight (its write waiting on the policy row, held here):
//     a new key's begin, through an instance whose clock reads C - 1s,
//     waits for it, then is counted under the new policy in the surge
//     turn, stamped after C, and trips the breaker there (4 counted);
//   - a begin in flight (its insert waiting on an uncommitted insert of the
//     same key, held here, once it read the policy): the PUT waits for it,
//     the begin is decided under the policy before (it executes, counts
//     and trips nothing), and the next new key trips the breaker counting
//     it (5 counted).
func TestABeginAndAPolicyTurningSurgeOnTakeTurns(t *testing.T) {
	t.Parallel()
	surgeOn := map[string]any{"surge_per_hour": 3, "surge_action": "deny", "surge_cooldown_seconds": 60}
	type answer struct {
		status int
		out    map[string]any
		err    error
	}
	for _, order := range []string{"put first", "begin first"} {
		t.Run(order, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := t.Context()
			b.putPolicy("sms.send", map[string]any{"mode": "allow"}) // a row to hold
			// An allowance from a close at C; the raced begin of a PUT in
			// flight comes through an instance whose clock reads C - 1s.
			b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key, map[string]any{"action": "monitor"})
			b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
			closed, trips := b.clock.Now(), b.events("circuit.tripped") // the operator's
			b.clock.Add(time.Second)
			via := b.env
			if order == "put first" {
				via = apitest.Start(t, apitest.WithNow(func() time.Time { return b.clock.Now().Add(-2 * time.Second) }))
			}
			for range 3 {
				b.mustBegin("execute", sms(key("before")))
			}
			k := key("raced")
			var holder pgx.Tx
			if order == "put first" {
				holder = b.holding(`SELECT 1 FROM gate_policies WHERE workspace_id = $1 AND effect_type = 'sms.send'
					FOR UPDATE`, b.ws.ID)
			} else {
				holder = b.holding(`SELECT FROM gate_begin($1::text, 'sms.send', $2::text, NULL::bigint, '{}'::text[],
					NULL::int, 'fp', $3::timestamptz, $4::text, '{}'::jsonb, NULL::bytea, NULL::jsonb, '\x00'::bytea,
					$5::text, $6::text, NULL::text, NULL::text, NULL::bytea, NULL::text, $7::text, NULL::bigint,
					NULL::text, $8::text)`, b.ws.ID, k, b.clock.Now(), ids.New(ids.Effect), keyID(b.ws.Key),
					ids.New(ids.Approval), ids.New(ids.Event), ids.New(ids.Event))
			}
			var holderPID int32
			require.NoError(t, holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID))

			begun, written := make(chan answer, 1), make(chan answer, 1)
			beginRaced := func() {
				go func() {
					st, out, err := post(via, "/api/v1/effects/begin", b.ws.Key, sms(k))
					begun <- answer{st, out, err}
				}()
			}
			putSurgeOn := func() {
				go func() {
					st, out, err := put(b.env, "/api/v1/policies/sms.send", b.ws.Key, surgeOn)
					written <- answer{st, out, err}
				}()
			}
			// waiting answers the backend that waits for blocker's lock (of
			// a kind among events), failing if what was sent answered
			// instead: it went on without waiting.
			waiting := func(blocker int32, events []string, sent chan answer, what string) int32 {
				var (
					pid   atomic.Int32
					early atomic.Pointer[answer]
				)
				require.Eventually(t, func() bool {
					select {
					case a := <-sent:
						early.Store(&a)
						return true
					default:
					}
					var p int32
					if b.env.App.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
						WHERE wait_event_type = 'Lock' AND wait_event = ANY ($2::text[]) AND $1::int = ANY (pg_blocking_pids(pid))`,
						blocker, events).Scan(&p) != nil {
						return false
					}
					pid.Store(p)
					return true
				}, 10*time.Second, 5*time.Millisecond, what+" waits")
				if a := early.Load(); a != nil {
					require.Failf(t, what+" did not wait", "answered %d %v %v", a.status, a.out, a.err)
				}
				return pid.Load()
			}

			row, advisory := []string{"transactionid", "tuple"}, []string{"advisory"}
			if order == "put first" {
				putSurgeOn()
				put := waiting(holderPID, row, written, "the policy write")
				beginRaced()
				waiting(put, advisory, begun, "the begin of a new key, while the policy write turning surge on is in flight,")
				require.NoError(t, holder.Commit(ctx))
			} else {
				beginRaced()
				begin := waiting(holderPID, row, begun, "the begin")
				putSurgeOn()
				waiting(begin, advisory, written, "the policy write turning surge on, while a begin is in flight,")
				require.NoError(t, holder.Rollback(ctx))
			}
			w, d := <-written, <-begun
			require.NoError(t, w.err)
			require.Equal(t, http.StatusOK, w.status, "%v", w.out)
			require.NoError(t, d.err)

			if order == "begin first" {
				// Decided under the policy before the PUT: no surge, so no
				// count, no trip, whatever the clock.
				require.Equal(t, http.StatusOK, d.status, "%v", d.out)
				require.Equal(t, "execute", d.out["decision"], "%v", d.out)
				require.Equal(t, trips, b.events("circuit.tripped"))
				k = key("next")
				b.denialOf("circuit_open", sms(k)) // the fifth new key of the hour
			} else {
				require.Equal(t, http.StatusForbidden, d.status, "%v", d.out)
				require.Equal(t, "circuit_open", d.out["error"].(map[string]any)["code"], "%v", d.out)
			}
			require.Equal(t, trips+1, b.events("circuit.tripped"))
			var tripped map[string]any
			require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT data FROM events WHERE workspace_id = $1
				AND type = 'circuit.tripped' AND data ->> 'opened_by' = 'surge'`, b.ws.ID).Scan(&tripped))
			volume := 4 // the three before and the raced key
			if order == "begin first" {
				volume = 5 // and the next
			}
			require.EqualValues(t, volume, tripped["volume_last_hour"], "each key counted once")
			require.EqualValues(t, 3, tripped["threshold"])
			var stamped, opened time.Time
			require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT e.created_at, c.opened_at FROM effects e
				JOIN gate_circuits c ON c.workspace_id = e.workspace_id AND c.effect_type = e.effect_type
				WHERE e.workspace_id = $1 AND e.idempotency_key = $2 AND c.state = 'open'`, b.ws.ID, k).Scan(&stamped, &opened))
			require.True(t, stamped.Equal(opened), "the trip is the key's begin's: %v, %v", stamped, opened)
			require.True(t, opened.After(closed), "stamped in the surge turn, after the allowance's start %v: %v", closed, opened)
		})
	}
}

// A key begun while the type counts no surge, after the breaker's last
// close, counts in the allowance that close started once a policy turns
// surge on, whatever the clock of the instance it came through: one whose
// clock reads before the close stamps it just after the allowance's start,
// as a begin in the surge turn is (it was stamped at its own reading, before
// the start, and counted by no begin after the PUT: with a threshold of 1,
// the next new key executed too).
func TestAKeyBegunWithSurgeOffCountsInTheAllowanceWhateverTheClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key, map[string]any{"action": "monitor"})
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
	closed := b.clock.Now()
	lagging := apitest.Start(t, apitest.WithNow(func() time.Time { return b.clock.Now().Add(-time.Second) }))
	k := key("lagging")
	d := lagging.Must(http.StatusOK, "POST", "/api/v1/effects/begin", b.ws.Key, sms(k)).JSON()
	require.Equal(t, "execute", d["decision"])
	var stamped time.Time
	require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), `SELECT created_at FROM effects
		WHERE workspace_id = $1 AND idempotency_key = $2`, b.ws.ID, k).Scan(&stamped))
	require.True(t, stamped.After(closed), "stamped after the allowance's start %v: %v", closed, stamped)

	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 1, "surge_action": "deny"})
	b.denialOf("circuit_open", sms(key("next")))
	var volume int
	require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), `SELECT (data ->> 'volume_last_hour')::int FROM events
		WHERE workspace_id = $1 AND type = 'circuit.tripped' AND data ->> 'opened_by' = 'surge'`, b.ws.ID).Scan(&volume))
	require.Equal(t, 2, volume)
}

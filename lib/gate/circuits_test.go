package gate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/testpg"
)

func (b *bundle) circuits() map[string]map[string]any {
	b.t.Helper()
	out := map[string]map[string]any{}
	list := b.env.Must(http.StatusOK, "GET", "/api/v1/circuits?limit=200", b.ws.Key, nil).JSON()
	for _, x := range list["data"].([]any) {
		c := x.(map[string]any)
		out[str(c["effect_type"])] = c
	}
	return out
}

func (b *bundle) circuit(effectType string) map[string]any {
	b.t.Helper()
	c, ok := b.circuits()[effectType]
	require.True(b.t, ok, "no circuit for %s", effectType)
	return c
}

func (b *bundle) events(typ string) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.env.App.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM events WHERE workspace_id = $1 AND type = $2`, b.ws.ID, typ).Scan(&n))
	return n
}

// lastEventData is the data of the workspace's latest event of type typ
// (two stamped at the same clock reading come in no set order).
func (b *bundle) lastEventData(typ string) map[string]any {
	b.t.Helper()
	var data map[string]any
	require.NoError(b.t, b.env.App.Pool.QueryRow(context.Background(), `SELECT data FROM events
		WHERE workspace_id = $1 AND type = $2 ORDER BY created_at DESC, id DESC LIMIT 1`, b.ws.ID, typ).Scan(&data))
	return data
}

// holdSurgeTurn takes effectType's surge turn in a transaction of its own,
// as a begin that counts the surge holds it, until the test commits or
// rolls it back (or ends).
func (b *bundle) holdSurgeTurn(effectType string) pgx.Tx {
	b.t.Helper()
	ctx := context.Background()
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('surge:' || $1::text || ':' || $2::text, 0))`,
		b.ws.ID, effectType)
	require.NoError(b.t, err)
	return tx
}

// awaitSurgeTurnWaiter waits until a statement waits for an advisory lock
// (the surge turn holdSurgeTurn holds).
func (b *bundle) awaitSurgeTurnWaiter(msg string) {
	b.t.Helper()
	require.Eventually(b.t, func() bool {
		var n int
		require.NoError(b.t, b.env.App.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&n))
		return n > 0
	}, 10*time.Second, 10*time.Millisecond, msg)
}

func sms(k string) map[string]any {
	return map[string]any{"effect_type": "sms.send", "idempotency_key": k, "payload": map[string]any{"to": "+1"}}
}

// Changing a breaker or the stop needs policies:write; reading them,
// policies:read or policies:write. An agent's key holds neither.
func TestCircuitRoutesNeedPoliciesScopes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	agent := b.agent()
	for _, path := range []string{"/api/v1/circuits/stop", "/api/v1/circuits/release", "/api/v1/circuits/sms.send/open",
		"/api/v1/circuits/sms.send/close"} {
		e := errCode(t, b.env.Do("POST", path, agent, nil), http.StatusForbidden, "forbidden")
		require.Equal(t, []any{"policies:write"}, e["detail"].(map[string]any)["required"], path)
	}
	for _, path := range []string{"/api/v1/circuits", "/api/v1/circuits/stop"} {
		e := errCode(t, b.env.Do("GET", path, agent, nil), http.StatusForbidden, "forbidden")
		// API.md §2.5: "All need policies:write"; policies:read reads them too.
		require.Equal(t, []any{"policies:write"}, e["detail"].(map[string]any)["required"], path)
		require.Equal(t, []any{"policies:write", "policies:read"}, e["detail"].(map[string]any)["any_of"], path)
	}
	// The agent cannot have closed anything: its begins still meet the breaker.
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key, map[string]any{"action": "deny"})
	errCode(t, b.env.Do("POST", "/api/v1/circuits/sms.send/close", agent, nil), http.StatusForbidden, "forbidden")
	r := b.env.Do("POST", "/api/v1/effects/begin", agent, sms(key("a")))
	require.Equal(t, http.StatusForbidden, r.Status)
	require.Equal(t, "circuit_open", r.JSON()["error"].(map[string]any)["code"])
}

func TestCircuitListShapeAndVolume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cs := b.circuits()
	// Starter policies are configured types.
	require.Contains(t, cs, "payment.charge")
	require.Equal(t, map[string]any{"effect_type": "payment.charge", "state": "closed", "opened_by": nil,
		"action": nil, "reason": nil, "volume_last_hour": 0.0, "baseline_median_hourly": nil, "threshold": nil,
		"opened_at": nil, "closes_at": nil}, cs["payment.charge"])

	// The baseline is a median of hourly volumes, so where the hour
	// boundaries fall matters: begin five minutes into an hour (started
	// near its end, the volume below straddled two hours, median 2).
	next := b.clock.Now().Truncate(time.Hour).Add(time.Hour + 5*time.Minute)
	b.clock.Add(next.Sub(b.clock.Now()))
	for i := 0; i < 3; i++ {
		b.mustBegin("execute", sms(key("v")))
	}
	require.EqualValues(t, 3, b.circuit("sms.send")["volume_last_hour"])
	// A repeated key is not a new key.
	k := sms(key("again"))
	b.mustBegin("execute", k)
	b.mustBegin("in_flight", k)
	require.EqualValues(t, 4, b.circuit("sms.send")["volume_last_hour"])
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 10})
	require.EqualValues(t, 10, b.circuit("sms.send")["threshold"])
	b.clock.Add(59 * time.Minute)
	require.EqualValues(t, 4, b.circuit("sms.send")["volume_last_hour"])
	b.clock.Add(2 * time.Minute)
	c := b.circuit("sms.send")
	require.EqualValues(t, 0, c["volume_last_hour"])
	require.EqualValues(t, 4, c["baseline_median_hourly"])

	require.Equal(t, []string{"effect_type"}, validationFields(t, b.env.Do("POST", "/api/v1/circuits/a%20b/open", b.ws.Key, nil)))
	require.Contains(t, validationFields(t, b.env.Do("POST", "/api/v1/circuits/sms.send/open", b.ws.Key,
		map[string]any{"action": "explode"})), "action")
	require.Contains(t, validationFields(t, b.env.Do("POST", "/api/v1/circuits/stop", b.ws.Key,
		map[string]any{"action": "halt"})), "action")
	// The allowed values read as a list, as every other refusal's do (QA:
	// "must be one of [monitor require_approval deny]", Go's slice syntax).
	refusal := b.env.Do("POST", "/api/v1/circuits/sms.send/open", b.ws.Key, map[string]any{"action": "explode"}).JSON()
	require.Equal(t, []any{map[string]any{"field": "action", "message": "must be one of monitor, require_approval, deny"}},
		refusal["error"].(map[string]any)["detail"].(map[string]any)["validation"])
}

// The list computes each type's baseline once, for its column and for a
// learned ceiling's threshold: computed twice, it read the type's week of
// effects twice (scale QA: 1.5M effects, 0.3 s of a circuits page). One
// baseline, one series of hours in the plan.
func TestCircuitListComputesTheBaselineOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nodes, err := testpg.Explain(context.Background(), b.env.App.Pool, gate.SQLListCircuits,
		b.ws.ID, "", 100, b.clock.Now(), "")
	require.NoError(t, err)
	series := 0
	for _, n := range nodes {
		if n.Fields["Node Type"] == "Function Scan" && n.Fields["Function Name"] == "generate_series" {
			series++
		}
	}
	require.Equal(t, 1, series, "one baseline per type")
}

func TestSurgeRequireApprovalCooldownAndFreshAllowance(t *testing.T) {
	// Not parallel: SweepCircuits closes every workspace's lapsed breakers.
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 3, "surge_cooldown_seconds": 60})
	for i := 0; i < 3; i++ {
		b.mustBegin("execute", sms(key("ok")))
	}
	tripped := b.mustBegin("approval_required", sms(key("trip")))
	opened := b.clock.Now()
	c := b.circuit("sms.send")
	require.Equal(t, "open", c["state"])
	require.Equal(t, "surge", c["opened_by"])
	require.Equal(t, "require_approval", c["action"])
	require.EqualValues(t, 3, c["threshold"])
	require.EqualValues(t, 4, c["volume_last_hour"])
	require.Equal(t, opened.Format(time.RFC3339), c["opened_at"])
	require.Equal(t, opened.Add(time.Minute).Format(time.RFC3339), c["closes_at"])
	require.Equal(t, 1, b.events("circuit.tripped"))
	// The work waits for a human through the ordinary approvals.
	a := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", b.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, a, 1)
	require.Equal(t, "circuit_open", a[0].(map[string]any)["reason"])
	require.Equal(t, tripped["approval_id"], a[0].(map[string]any)["id"])
	b.mustBegin("approval_required", sms(key("held")))
	require.Equal(t, 1, b.events("circuit.tripped"))

	// The cooldown closes it: a fresh allowance of 3, then it trips again.
	b.clock.Add(61 * time.Second)
	require.Equal(t, "closed", b.circuit("sms.send")["state"])
	for i := 0; i < 3; i++ {
		b.mustBegin("execute", sms(key("second-chance")))
	}
	b.mustBegin("approval_required", sms(key("again")))
	require.Equal(t, 2, b.events("circuit.tripped"))
	require.Equal(t, 1, b.events("circuit.closed"), "the first opening, closed before the second")

	// The sweeper makes a cooldown durable and tells subscribers.
	b.clock.Add(61 * time.Second)
	_, err := b.env.App.Server.Gate.SweepCircuits(context.Background(), b.clock.Now(), 500)
	require.NoError(t, err)
	require.Equal(t, 2, b.events("circuit.closed"))
	require.Equal(t, "closed", b.circuit("sms.send")["state"])
}

func TestSurgeDenyAndMonitor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 2, "surge_action": "deny"})
	b.mustBegin("execute", sms(key("a")))
	b.mustBegin("execute", sms(key("b")))
	e := b.denialOf("circuit_open", sms(key("c")))
	require.Equal(t, "circuit_open", e["code"])
	c := b.circuit("sms.send")
	require.Equal(t, "deny", c["action"])
	require.Equal(t, b.clock.Now().Add(time.Hour).Format(time.RFC3339), c["closes_at"]) // default cooldown 3600
	// The denial says which breaker, and when it closes by itself.
	require.Equal(t, map[string]any{"opened_by": "surge", "opened_at": c["opened_at"], "closes_at": c["closes_at"]},
		e["detail"])

	b.putPolicy("email.send", map[string]any{"surge_per_hour": 2, "surge_action": "monitor"})
	for i := 0; i < 5; i++ {
		b.mustBegin("execute", email(key("m")))
	}
	c = b.circuit("email.send")
	require.Equal(t, "open", c["state"])
	require.Equal(t, "monitor", c["action"])
	require.EqualValues(t, 5, c["volume_last_hour"])
	require.Equal(t, 2, b.events("circuit.tripped"))
}

// A policy that turns surge off closes the breaker the surge opened (QA: it
// went on denying until its cooldown, up to a day); one that only raises
// the ceiling leaves it to its cooldown, and a manual breaker stays as the
// operator set it.
func TestTurningSurgeOffClosesTheSurgesBreaker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 2, "surge_action": "deny"})
	b.mustBegin("execute", sms(key("a")))
	b.mustBegin("execute", sms(key("b")))
	b.denialOf("circuit_open", sms(key("c")))
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 100})
	require.Equal(t, "open", b.circuit("sms.send")["state"], "a higher ceiling waits for the cooldown")
	b.denialOf("circuit_open", sms(key("d")))

	b.putPolicy("sms.send", map[string]any{"surge_per_hour": nil})
	require.Equal(t, "closed", b.circuit("sms.send")["state"])
	require.Equal(t, 1, b.events("circuit.closed"))
	b.mustBegin("execute", sms(key("e")))

	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/email.send/open", b.ws.Key,
		map[string]any{"action": "deny", "reason": "vendor down"})
	b.putPolicy("email.send", map[string]any{"surge_per_hour": 5})
	b.putPolicy("email.send", map[string]any{"surge_per_hour": nil})
	require.Equal(t, "open", b.circuit("email.send")["state"], "an operator's breaker is theirs to close")
	require.Equal(t, 1, b.events("circuit.closed"))
}

// A policy turning surge off waits for a begin that holds the type's surge
// turn: the trip that begin makes is closed by the policy, not left open
// (review: a trip landing between the close and the begin's evaluation).
// Not parallel: it waits for a lock wait in the database.
func TestTurningSurgeOffWaitsForABeginsTrip(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 2, "surge_action": "deny"})
	tx := b.holdSurgeTurn("sms.send") // a begin in its surge turn, about to trip
	put := make(chan int, 1)
	go func() {
		put <- b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, map[string]any{"surge_per_hour": nil}).Status
	}()
	b.awaitSurgeTurnWaiter("the policy waits for the surge turn")
	_, err := tx.Exec(ctx, `INSERT INTO gate_circuits (workspace_id, effect_type, state, opened_by, action, opened_at,
		closes_at, updated_at) VALUES ($1, 'sms.send', 'open', 'surge', 'deny', $2, $2::timestamptz + interval '1 hour', $2)`,
		b.ws.ID, b.clock.Now())
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, http.StatusOK, <-put)
	require.Equal(t, "closed", b.circuit("sms.send")["state"])
}

// An operator's close waits for a begin in the type's surge turn and
// measures the fresh allowance from when it got the turn: begins stamped
// after the allowance's start are then only those that saw the breaker
// closed (race QA: a close that read the clock before waiting behind a
// burst the breaker refused counted those refusals in the new allowance,
// which they used up at once). Not parallel: it waits for a lock wait.
func TestACloseMeasuresItsAllowanceFromWhenItGotTheTurn(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 2, "surge_action": "deny"})
	b.mustBegin("execute", sms(key("a")))
	b.mustBegin("execute", sms(key("b")))
	b.denialOf("circuit_open", sms(key("c")))

	tx := b.holdSurgeTurn("sms.send") // a begin in its surge turn, refused
	closed := make(chan int, 1)
	go func() {
		closed <- b.env.Do("POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil).Status
	}()
	b.awaitSurgeTurnWaiter("the close waits for the surge turn")
	b.clock.Add(time.Second)
	gotTurn := b.clock.Now()
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, http.StatusOK, <-closed)

	var from time.Time
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT allowance_from FROM gate_circuits
		WHERE workspace_id = $1 AND effect_type = 'sms.send'`, b.ws.ID).Scan(&from))
	require.True(t, from.Equal(gotTurn), "allowance from %v, the turn came at %v", from, gotTurn)
	b.clock.Add(time.Second) // (the allowance counts arrivals after its start)
	b.mustBegin("execute", sms(key("d")))
	b.mustBegin("execute", sms(key("e")))
	b.denialOf("circuit_open", sms(key("f")))
}

func TestManualBreakerHasNoCooldownAndCloseDoesNotDisarm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key,
		map[string]any{"action": "deny", "reason": "runaway loop"}).JSON()
	require.Equal(t, "open", c["state"])
	require.Equal(t, "manual", c["opened_by"])
	require.Equal(t, "runaway loop", c["reason"])
	require.Nil(t, c["closes_at"])
	require.Equal(t, 1, b.events("circuit.tripped"))
	// The event has a surge trip's shape (QA): what no count opened is null.
	require.Equal(t, map[string]any{"effect_type": "sms.send", "opened_by": "manual", "action": "deny",
		"opened_at": b.lastEventData("circuit.tripped")["opened_at"], "closes_at": nil, "volume_last_hour": nil,
		"threshold": nil}, b.lastEventData("circuit.tripped"))
	e := b.denialOf("circuit_open", sms(key("x")))
	require.Equal(t, map[string]any{"opened_by": "manual", "opened_at": c["opened_at"], "closes_at": nil}, e["detail"])
	b.clock.Add(48 * time.Hour)
	b.denialOf("circuit_open", sms(key("y")))

	c = b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil).JSON()
	require.Equal(t, "closed", c["state"])
	require.Nil(t, c["action"])
	require.Equal(t, 1, b.events("circuit.closed"))
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
	require.Equal(t, 1, b.events("circuit.closed"))

	// Closing a surge breaker grants a fresh allowance measured from the close.
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 2})
	// y, begun in the same hour before the close, is not counted against it.
	b.clock.Add(time.Second)
	b.mustBegin("execute", sms(key("a")))
	b.mustBegin("execute", sms(key("b")))
	b.mustBegin("approval_required", sms(key("c")))
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
	b.clock.Add(time.Second)
	b.mustBegin("execute", sms(key("d")))
	b.mustBegin("execute", sms(key("e")))
	b.mustBegin("approval_required", sms(key("f")))
	require.Equal(t, "surge", b.circuit("sms.send")["opened_by"])
}

// A type's own open breaker of a weaker action does not disarm its surge
// ceiling: the strictest action decides (QA). A surge breaker is raised to
// the stricter action, keeping its opening and cooldown; a manual one stays
// as the operator set it, while the surge's action holds each begin over
// the ceiling.
func TestAWeakerBreakerDoesNotDisarmTheSurge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// "Watch before you enforce": a monitor trip, then the policy enforces.
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 2, "surge_action": "monitor"})
	for range 3 {
		b.mustBegin("execute", sms(key("watch")))
	}
	watched := b.circuit("sms.send")
	require.Equal(t, "monitor", watched["action"])
	b.clock.Add(time.Minute)
	b.putPolicy("sms.send", map[string]any{"surge_action": "deny"})
	b.denialOf("circuit_open", sms(key("enforced")))
	enforced := b.circuit("sms.send")
	require.Equal(t, "deny", enforced["action"])
	require.Equal(t, "surge", enforced["opened_by"])
	require.Equal(t, watched["opened_at"], enforced["opened_at"])
	require.Equal(t, watched["closes_at"], enforced["closes_at"])
	require.Equal(t, 2, b.events("circuit.tripped"), "the opening, then the stricter action")
	b.denialOf("circuit_open", sms(key("again")))
	require.Equal(t, 2, b.events("circuit.tripped"))

	// A manual monitor breaker: the surge still denies over its ceiling.
	b.putPolicy("email.send", map[string]any{"surge_per_hour": 2, "surge_action": "deny"})
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/email.send/open", b.ws.Key,
		map[string]any{"action": "monitor", "reason": "watching"})
	b.mustBegin("execute", email(key("m")))
	b.mustBegin("execute", email(key("m")))
	e := b.denialOf("circuit_open", email(key("m")))
	require.Equal(t, map[string]any{"opened_by": "surge"}, e["detail"], "not the operator's monitor")
	manual := b.circuit("email.send")
	require.Equal(t, "manual", manual["opened_by"])
	require.Equal(t, "monitor", manual["action"], "the operator's breaker is left as set")
	// Once the hour's volume is back under the ceiling, begins execute.
	b.clock.Add(time.Hour + time.Second)
	b.mustBegin("execute", email(key("m")))

	// A breaker at least as strict as the surge decides alone.
	b.putPolicy("push.send", map[string]any{"surge_per_hour": 1, "surge_action": "require_approval"})
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/push.send/open", b.ws.Key,
		map[string]any{"action": "deny", "reason": "stop"})
	push := map[string]any{"effect_type": "push.send", "idempotency_key": key("p"), "payload": map[string]any{}}
	b.denialOf("circuit_open", push)
}

func TestEmergencyStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.mustBegin("execute", sms(key("before")))
	list := b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key,
		map[string]any{"reason": "incident"}).JSON()
	for _, x := range list["data"].([]any) {
		c := x.(map[string]any)
		require.Equal(t, "open", c["state"], "%v", c)
		require.Equal(t, "stop", c["opened_by"])
		require.Equal(t, "require_approval", c["action"])
		require.Nil(t, c["closes_at"])
	}
	require.Equal(t, 1, b.events("circuit.tripped"))
	b.mustBegin("approval_required", sms(key("held")))
	// A type first seen while the stop is on is held too.
	first := map[string]any{"effect_type": "brand.new", "idempotency_key": key("new")}
	b.mustBegin("approval_required", first)
	require.Equal(t, "stop", b.circuit("brand.new")["opened_by"])
	// Closing one type does not lift the stop, and the close says so: it
	// answers the circuit as begins read it, the stop's.
	closed := b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil).JSON()
	require.Equal(t, []any{"open", "stop"}, []any{closed["state"], closed["opened_by"]})
	b.mustBegin("approval_required", sms(key("still")))
	// A stricter stop denies, and is announced; the same again is not.
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"action": "deny"})
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"action": "deny"})
	require.Equal(t, 2, b.events("circuit.tripped"))
	e := b.denialOf("circuit_open", sms(key("denied")))
	require.Equal(t, "stop", e["detail"].(map[string]any)["opened_by"])
	require.Nil(t, e["detail"].(map[string]any)["closes_at"])
	// Re-issued as a monitor (API.md lets the stop watch), it halts nothing
	// more, and says so: the change is announced, not silent (QA).
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"action": "monitor"})
	require.Equal(t, 3, b.events("circuit.tripped"))
	b.mustBegin("execute", sms(key("watched")))
	// Made strict again, it is announced again (QA: its first deny's
	// announcement had swallowed this one); a repeat still is not.
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"action": "deny"})
	require.Equal(t, 4, b.events("circuit.tripped"))
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"action": "deny"})
	require.Equal(t, 4, b.events("circuit.tripped"))
	b.denialOf("circuit_open", sms(key("denied-again")))
	// A type's own stricter breaker outlives the release.
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/email.send/open", b.ws.Key, map[string]any{"action": "deny"})
	// While both deny, the denial names the stop.
	require.Equal(t, "stop", b.denialOf("circuit_open", email(key("both")))["detail"].(map[string]any)["opened_by"])

	list = b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/release", b.ws.Key, nil).JSON()
	require.NotEmpty(t, list["data"])
	require.Equal(t, 1, b.events("circuit.closed"))
	b.mustBegin("execute", sms(key("after")))
	b.mustBegin("execute", map[string]any{"effect_type": "brand.new", "idempotency_key": key("new2")})
	b.denialOf("circuit_open", email(key("own")))
	require.Equal(t, "manual", b.circuit("email.send")["opened_by"])
}

func TestReadingTheEmergencyStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	read := func() map[string]any {
		return b.env.Must(http.StatusOK, "GET", "/api/v1/circuits/stop", b.ws.Key, nil).JSON()
	}
	off := map[string]any{"state": "closed", "action": nil, "reason": nil, "opened_at": nil}
	require.Equal(t, off, read())
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"reason": "incident"})
	on := read()
	require.Equal(t, "open", on["state"])
	require.Equal(t, "require_approval", on["action"])
	require.Equal(t, "incident", on["reason"])
	require.NotNil(t, on["opened_at"])
	// Re-issued, it keeps when it opened. When every type is held by a
	// stricter breaker of its own, the list shows those and not the stop:
	// this read still tells.
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"action": "monitor"})
	for _, x := range b.env.Must(http.StatusOK, "GET", "/api/v1/circuits", b.ws.Key, nil).JSON()["data"].([]any) {
		typ := x.(map[string]any)["effect_type"].(string)
		b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/"+typ+"/open", b.ws.Key, map[string]any{"action": "deny"})
	}
	for _, x := range b.env.Must(http.StatusOK, "GET", "/api/v1/circuits", b.ws.Key, nil).JSON()["data"].([]any) {
		require.Equal(t, "manual", x.(map[string]any)["opened_by"], "%v", x)
	}
	again := read()
	require.Equal(t, []any{"open", "monitor", nil, on["opened_at"]},
		[]any{again["state"], again["action"], again["reason"], again["opened_at"]})
	// Another workspace's stop is not this one's.
	other := b.env.Signup()
	require.Equal(t, off, b.env.Must(http.StatusOK, "GET", "/api/v1/circuits/stop", other.Key, nil).JSON())
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/release", b.ws.Key, nil)
	require.Equal(t, off, read())
}

func TestLearnedSurgeCeiling(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := b.clock.Now()
	b.clock.Add(now.Truncate(time.Hour).Add(time.Hour).Sub(now)) // on an hour boundary
	b.putPolicy("sms.send", map[string]any{"surge_multiplier": 2, "surge_action": "deny"})
	// Six hours of 20 an hour. Until 6 hours of history exist the ceiling is inert.
	for h := 0; h < 6; h++ {
		for i := 0; i < 20; i++ {
			b.mustBegin("execute", sms(key("base")))
		}
		c := b.circuit("sms.send")
		require.Nil(t, c["threshold"], "hour %d", h)
		require.Equal(t, "closed", c["state"])
		b.clock.Add(time.Hour)
	}
	c := b.circuit("sms.send")
	require.EqualValues(t, 20, c["baseline_median_hourly"])
	require.EqualValues(t, 40, c["threshold"])
	require.EqualValues(t, 0, c["volume_last_hour"])
	for i := 0; i < 40; i++ {
		b.mustBegin("execute", sms(key("busy")))
	}
	b.denialOf("circuit_open", sms(key("surge")))
	require.Equal(t, "surge", b.circuit("sms.send")["opened_by"])
	// Begin computed the baseline once for this hour and cached it.
	var median float64
	var hour time.Time
	require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), `SELECT baseline_median, baseline_for
		FROM gate_effect_types WHERE workspace_id = $1 AND effect_type = 'sms.send'`, b.ws.ID).Scan(&median, &hour))
	require.EqualValues(t, 20, median)
	require.True(t, hour.Equal(b.clock.Now().Truncate(time.Hour)), "%v", hour)
	// The median ignores one runaway hour, and the ceiling never drops below 30.
	b.putPolicy("email.send", map[string]any{"surge_multiplier": 2})
	b.mustBegin("execute", email(key("one")))
	b.clock.Add(7 * time.Hour)
	require.EqualValues(t, 30, b.circuit("email.send")["threshold"])
}

// Seed 003: "surge_per_hour wins if both are set", even where the learned
// ceiling is live and lower.
func TestSurgePerHourWinsOverMultiplier(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := b.clock.Now()
	b.clock.Add(now.Truncate(time.Hour).Add(time.Hour).Sub(now)) // on an hour boundary
	b.putPolicy("sms.send", map[string]any{"surge_multiplier": 2, "surge_per_hour": 50, "surge_action": "deny"})
	for h := 0; h < 6; h++ {
		for i := 0; i < 20; i++ {
			b.mustBegin("execute", sms(key("base")))
		}
		b.clock.Add(time.Hour)
	}
	require.EqualValues(t, 50, b.circuit("sms.send")["threshold"], "not the learned 2 × 20")
	for i := 0; i < 50; i++ {
		b.mustBegin("execute", sms(key("busy")))
	}
	b.denialOf("circuit_open", sms(key("over")))

	b.putPolicy("sms.send", map[string]any{"surge_per_hour": nil})
	b.clock.Add(time.Hour)
	require.EqualValues(t, 40, b.circuit("sms.send")["threshold"], "the learned ceiling once surge_per_hour is null")
}

// TestConcurrentSurgeTripsOnce races new keys past the threshold from two
// instances: the breaker opens once (one event) and exactly the threshold's
// worth executes (the first begins of a surge type take turns, 0025; they
// overshot by the number in flight).
func TestConcurrentSurgeTripsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env2 := apitest.Start(t, apitest.WithNow(b.clock.Now))
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 10, "surge_action": "deny"})
	const racers = 60
	counts, _ := raceBodies(t, racers, b.ws.Key, func(int) map[string]any { return sms(key("surge")) }, b.env, env2)
	require.Equal(t, map[string]int{"execute": 10, "403:circuit_open": racers - 10}, counts)
	require.Equal(t, 1, b.events("circuit.tripped"))
	c := b.circuit("sms.send")
	require.Equal(t, "open", c["state"])
	require.EqualValues(t, racers, c["volume_last_hour"])
	b.denialOf("circuit_open", sms(key("after")))
}

// With the real clock and two instances, as in production, a surge ceiling
// admits exactly its number of new keys: each begin's clock reading is taken
// before it waits for its turn, and the count once stopped at that reading,
// missing the keys of begins that went first with later readings (QA: 11 to
// 16 of 60 through a ceiling of 10).
func TestSurgeCeilingIsExactWithTheRealClock(t *testing.T) {
	t.Parallel()
	env1, env2 := apitest.Start(t), apitest.Start(t)
	ws := env1.Signup()
	const racers = 60
	for round := range 4 {
		typ := fmt.Sprintf("sms.r%d", round)
		env1.Must(http.StatusOK, "PUT", "/api/v1/policies/"+typ, ws.Key,
			map[string]any{"surge_per_hour": 10, "surge_action": "deny"})
		counts, _ := raceBodies(t, racers, ws.Key, func(int) map[string]any {
			body := sms(key("surge"))
			body["effect_type"] = typ
			return body
		}, env1, env2)
		require.Equal(t, map[string]int{"execute": 10, "403:circuit_open": racers - 10}, counts, "round %d", round)
	}
}

// The deterministic form: a begin whose clock reading is a millisecond
// behind the ten that reached the ceiling is refused as the 11th.
func TestSurgeCountsKeysStampedAfterTheBeginsOwnClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 10, "surge_action": "deny"})
	t0 := b.clock.Now()
	b.clock.Set(t0.Add(time.Millisecond))
	for range 10 {
		b.mustBegin("execute", sms(key("surge")))
	}
	b.clock.Set(t0) // read the clock, then waited for its turn
	b.denialOf("circuit_open", sms(key("surge")))
	require.EqualValues(t, 11, b.circuit("sms.send")["volume_last_hour"])
}

// A surge breaker whose cooldown ended reads closed at once; when it trips
// again before the sweeper's next pass, the first opening is recorded closed
// before the second is recorded tripped (the trip reopened the row in
// place, and subscribers saw tripped, tripped, closed). The same holds for
// an operator's open.
func TestALapsedSurgeBreakerIsRecordedClosedBeforeItOpensAgain(t *testing.T) {
	// Not parallel: SweepCircuits closes every workspace's lapsed breakers.
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 1, "surge_cooldown_seconds": 60})
	b.mustBegin("execute", sms(key("ok")))
	b.mustBegin("approval_required", sms(key("trip1")))
	b.clock.Add(61 * time.Second)
	require.Equal(t, "closed", b.circuit("sms.send")["state"])
	b.mustBegin("execute", sms(key("ok2")))
	b.mustBegin("approval_required", sms(key("trip2")))
	require.Equal(t, 2, b.events("circuit.tripped"))
	require.Equal(t, 1, b.events("circuit.closed"), "the first opening, closed before the second")
	b.clock.Add(61 * time.Second)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key,
		map[string]any{"action": "deny", "reason": "by hand"})
	require.Equal(t, 3, b.events("circuit.tripped"))
	require.Equal(t, 2, b.events("circuit.closed"), "the second opening, closed before the operator's")
	_, err := b.env.App.Server.Gate.SweepCircuits(context.Background(), b.clock.Now(), 500)
	require.NoError(t, err)
	require.Equal(t, 2, b.events("circuit.closed"), "the operator's breaker has no cooldown")
}

// A new key of a type with a surge breaker that waited for its turn is
// decided as of when the turn came (its clock reading plus the wait), so
// its lease is whole when granted (0028).
func TestABeginThatWaitedForItsSurgeTurnGetsAWholeLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 100})
	ctx := t.Context()
	conn, err := b.env.App.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	turn := `hashtextextended('surge:' || $1::text || ':sms.send', 0)`
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(`+turn+`)`, b.ws.ID)
	require.NoError(t, err)
	body := sms(key("waits"))
	body["lease_seconds"] = 5
	done := make(chan *apitest.Response, 1)
	go func() { done <- b.begin(body) }()
	require.Eventually(t, func() bool {
		var n int
		_ = b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database()`).Scan(&n)
		return n > 0
	}, 5*time.Second, 10*time.Millisecond)
	time.Sleep(1100 * time.Millisecond) // real time passes; the fake clock stands still
	_, err = conn.Exec(ctx, `SELECT pg_advisory_unlock(`+turn+`)`, b.ws.ID)
	require.NoError(t, err)
	r := <-done
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	d := r.JSON()
	require.Equal(t, "execute", d["decision"])
	exp, err := time.Parse(time.RFC3339, str(d["lease_expires_at"]))
	require.NoError(t, err)
	require.False(t, exp.Before(b.clock.Now().Add(6*time.Second)), "lease from before the wait: %s", exp)
}

// A policy that changes surge_action changes the action of the breaker the
// surge opened, at once, and says so (circuit.tripped): it held with the
// action it tripped with until a new key tripped it again, so a monitor
// breaker made deny let the retries of known keys execute meanwhile (QA).
// A manual breaker keeps its operator's action.
func TestChangingTheSurgeActionRetunesTheOpenBreaker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 2, "surge_action": "monitor"})
	first := b.mustBegin("execute", sms(key("a")))
	b.mustBegin("execute", sms(key("b")))
	b.mustBegin("execute", sms(key("c")))
	require.Equal(t, "monitor", b.circuit("sms.send")["action"])
	retry := sms(str(b.get(str(first["effect_id"]))["idempotency_key"]))
	require.Equal(t, http.StatusOK, b.report(str(first["effect_id"]), str(first["lease_token"]), "failed", nil).Status)
	closesAt := b.circuit("sms.send")["closes_at"]

	b.clock.Add(time.Second) // the retune's event after the trip's (lastEventData)
	b.putPolicy("sms.send", map[string]any{"surge_action": "deny"})
	c := b.circuit("sms.send")
	require.Equal(t, "deny", c["action"])
	require.Equal(t, closesAt, c["closes_at"], "the cooldown is the trip's")
	require.Equal(t, 2, b.events("circuit.tripped"))
	retuned := b.lastEventData("circuit.tripped")
	require.Equal(t, "deny", retuned["action"])
	require.Contains(t, retuned, "threshold", "a surge trip's shape")
	require.Nil(t, retuned["volume_last_hour"])
	b.denialOf("circuit_open", retry)

	b.putPolicy("sms.send", map[string]any{"surge_action": "require_approval"})
	b.mustBegin("approval_required", retry)
	require.Equal(t, 3, b.events("circuit.tripped"))

	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key,
		map[string]any{"action": "deny", "reason": "vendor down"})
	b.putPolicy("sms.send", map[string]any{"surge_action": "monitor"})
	require.Equal(t, "deny", b.circuit("sms.send")["action"], "an operator's breaker is theirs")
}

// A key a breaker refused before it was ever granted counts towards the
// surge again when it is retried after the close (migration 0040): closing
// grants a fresh allowance and the breaker stays armed (seed 003), so a
// runaway loop's refused backlog is admitted up to the allowance and then
// trips the breaker again (circuits QA: all 70 of 70 refused keys executed
// once it closed). The circuits' volume_last_hour still counts first begins.
func TestARefusedBacklogIsCountedAgainAfterTheClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 10, "surge_action": "deny",
		"surge_cooldown_seconds": 60})
	var refused []string
	for i := range 30 {
		k := key("loop")
		if i < 10 {
			b.mustBegin("execute", sms(k))
			continue
		}
		b.denialOf("circuit_open", sms(k))
		refused = append(refused, k)
	}
	require.Equal(t, 1, b.events("circuit.tripped"))

	// The cooldown ends: ten of the backlog fit the fresh allowance, the
	// eleventh trips the breaker again (recorded closed first) and is
	// refused, as is the rest.
	b.clock.Add(61 * time.Second)
	for i, k := range refused {
		if i < 10 {
			b.mustBegin("execute", sms(k))
		} else {
			b.denialOf("circuit_open", sms(k))
		}
	}
	c := b.circuit("sms.send")
	require.Equal(t, "open", c["state"])
	require.Equal(t, "surge", c["opened_by"])
	require.Equal(t, b.clock.Now().Format(time.RFC3339), c["opened_at"])
	require.EqualValues(t, 30, c["volume_last_hour"], "first begins only")
	require.Equal(t, 2, b.events("circuit.tripped"))
	require.Equal(t, 1, b.events("circuit.closed"), "the first opening, closed before the second")
	data := b.lastEventData("circuit.tripped")
	require.EqualValues(t, 11, data["volume_last_hour"], "the allowance's count that tripped it")
	require.EqualValues(t, 10, data["threshold"])
	b.denialOf("circuit_open", sms(refused[10]))

	// An operator's close is a fresh allowance too, shared by the backlog
	// and new keys: five of each, then a new key trips it.
	b.clock.Add(time.Second)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
	b.clock.Add(time.Second)
	for _, k := range refused[10:15] {
		b.mustBegin("execute", sms(k))
	}
	for range 5 {
		b.mustBegin("execute", sms(key("new")))
	}
	b.denialOf("circuit_open", sms(key("new")))
	b.denialOf("circuit_open", sms(refused[15]))
	require.Equal(t, 3, b.events("circuit.tripped"))
}

// A key the breaker would have refused but that the evaluation refused
// first, policy_denied (mode deny) or cost_ceiling_exceeded, is the surge's
// arrival when next begun, as a circuit_open one is: those refusals come
// before the breaker's, so a runaway loop's backlog under them was held by
// them alone, and once the policy let it through (mode allow again, a
// higher ceiling) after the breaker cooled down, it ran in full, counted by
// no begin (QA: 30 of 30 executed against an allowance of 10).
func TestABacklogAPolicyRefusedIsCountedWhenLetThrough(t *testing.T) {
	for _, c := range []struct {
		code          string
		refuse, allow map[string]any
		cost          int
	}{
		{"policy_denied", map[string]any{"mode": "deny"}, map[string]any{"mode": "allow"}, 0},
		{"cost_ceiling_exceeded", map[string]any{"max_cost_micros": 100}, map[string]any{"max_cost_micros": 1000}, 500},
	} {
		t.Run(c.code, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.putPolicy("sms.send", map[string]any{"surge_per_hour": 10, "surge_action": "deny",
				"surge_cooldown_seconds": 60})
			b.putPolicy("sms.send", c.refuse)
			body := func(k string) map[string]any {
				m := sms(k)
				m["cost_micros"] = c.cost
				return m
			}
			var refused []string
			for range 30 {
				k := key("loop")
				b.denialOf(c.code, body(k))
				refused = append(refused, k)
			}
			require.Equal(t, "open", b.circuit("sms.send")["state"], "the loop tripped the surge")

			b.clock.Add(61 * time.Second) // cooled down
			b.putPolicy("sms.send", c.allow)
			for i, k := range refused {
				if i < 10 {
					b.mustBegin("execute", body(k))
				} else {
					b.denialOf("circuit_open", body(k))
				}
			}
			require.Equal(t, 2, b.events("circuit.tripped"))
			require.EqualValues(t, 11, b.lastEventData("circuit.tripped")["volume_last_hour"])
		})
	}
}

// tripSurge sets sms.send's surge at two keys an hour, deny, a minute's
// cooldown, and trips it at the clock's reading: two keys execute, then
// refused keys are refused (the first of them trips the breaker).
func (b *bundle) tripSurge(refused int) []string {
	b.t.Helper()
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 2, "surge_action": "deny", "surge_cooldown_seconds": 60})
	b.mustBegin("execute", sms(key("first")))
	b.mustBegin("execute", sms(key("first")))
	keys := make([]string, refused)
	for i := range keys {
		keys[i] = key("refused")
		b.denialOf("circuit_open", sms(keys[i]))
	}
	return keys
}

// The close that starts an allowance may be stamped ahead of the clock of a
// begin that is decided after it: the sweeper's clock, another instance's,
// or the cooldown's end met by a reading taken before the request waited.
// Such a begin, of a new key or of a refused key begun again, is counted in
// that allowance all the same (afterAllowanceSQL, migration 0056): stamped
// before its start, it was counted by no later begin, and every one
// executed (race QA: 5 of 5 against an allowance of 2).
func TestABeginStampedBeforeTheAllowanceIsCountedInIt(t *testing.T) {
	// Not parallel: SweepCircuits closes every workspace's lapsed breakers.
	for _, arrivals := range []bool{false, true} {
		b := setup(t)
		refused := b.tripSurge(5)
		tripped := b.clock.Now()
		n, err := b.env.App.Server.Gate.SweepCircuits(t.Context(), tripped.Add(61*time.Second), 500)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		b.clock.Set(tripped.Add(59 * time.Second))
		var decisions []any
		for _, k := range refused[:4] {
			if !arrivals {
				k = key("new")
			}
			decisions = append(decisions, b.begin(sms(k)).JSON()["decision"])
		}
		require.Equal(t, []any{"execute", "execute", "denied", "denied"}, decisions, "arrivals: %v", arrivals)
		require.Equal(t, 2, b.events("circuit.tripped"))
		require.Equal(t, 1, b.events("circuit.closed"))
	}
}

// statementLog records the statements a pool sends, in order.
type statementLog struct {
	mu  sync.Mutex
	sql []string
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, d.SQL)
	return ctx
}

func (*statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// An arrival's begin holds its type's surge turn, which every begin of a
// new key of the type waits for, so each round trip it makes in the turn
// is one more for each of them: the statement that closes a lapsed breaker
// also answers the begin's clock moved after the allowance's start, the
// next is the row's lock (review: a statement of its own read the start in
// between). At the cooldown's end to the microsecond, the close starts the
// allowance at the arrival's own reading, and the arrival is counted in it
// all the same: two keys in all execute.
func TestAnArrivalReadsItsAllowanceWithTheLapsedClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	refused := b.tripSurge(1)
	b.clock.Add(60 * time.Second) // surge_cooldown_seconds: the cooldown's end, unswept
	sent := &statementLog{}
	h := serverTraced(b, sent)
	status, out := postTo(t, h, "/api/v1/effects/begin", b.ws.Key, sms(refused[0]))
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.Equal(t, "execute", out["decision"])
	require.Equal(t, 1, b.events("circuit.closed"))

	turn := slices.IndexFunc(sent.sql, func(q string) bool { return strings.Contains(q, "hashtextextended('surge:'") })
	row := slices.IndexFunc(sent.sql, func(q string) bool { return strings.Contains(q, "gate_begin_locked(") })
	require.True(t, turn >= 0 && row > turn, "the turn, then the row: %q", sent.sql)
	require.Len(t, sent.sql[turn+1:row], 1, "the lapsed close alone: %q", sent.sql[turn+1:row])

	require.Equal(t, "execute", b.begin(sms(key("new"))).JSON()["decision"])
	require.Equal(t, "denied", b.begin(sms(key("new"))).JSON()["decision"], "the arrival counted in the allowance")
}

// Every close of a breaker takes its type's surge turn, the sweeper's and
// an operator's opening over a lapsed surge breaker too: one landing while
// a refused key's begin held the turn (here, waiting for the key's row)
// started an allowance that begin had not read, stamped ahead of its
// clock, and the begin, decided under it, was counted by no later begin:
// the allowance admitted one key more (race QA).
func TestACloseWaitsForABeginInTheSurgeTurn(t *testing.T) {
	// Not parallel: SweepCircuits closes every workspace's lapsed breakers,
	// and the waits are found in pg_stat_activity.
	for _, closer := range []string{"sweeper", "operator"} {
		t.Run(closer, func(t *testing.T) {
			b := setup(t)
			ahead := apitest.NewClock(b.clock.Now())
			env2 := apitest.Start(t, apitest.WithNow(ahead.Now))
			refused := b.tripSurge(1)
			ahead.Add(61 * time.Second)
			b.clock.Add(59 * time.Second) // before the cooldown's end

			ctx := t.Context()
			holder, err := b.env.App.Pool.Begin(ctx)
			require.NoError(t, err)
			defer holder.Rollback(ctx) //nolint:errcheck // rolled back below
			_, err = holder.Exec(ctx, `SELECT 1 FROM effects WHERE workspace_id = $1 AND idempotency_key = $2 FOR UPDATE`,
				b.ws.ID, refused[0])
			require.NoError(t, err)
			type answer struct {
				status int
				out    map[string]any
				err    error
			}
			arrival := make(chan answer, 1)
			go func() {
				status, out, err := postBegin(b.env, b.ws.Key, sms(refused[0]))
				arrival <- answer{status, out, err}
			}()
			require.Eventually(t, func() bool {
				var n int
				require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple')
					  AND datname = current_database() AND query LIKE '%gate_begin_locked%'`).Scan(&n))
				return n > 0
			}, 10*time.Second, 10*time.Millisecond, "the arrival waits for its row, in the surge turn")

			closed := make(chan answer, 1)
			go func() {
				if closer == "sweeper" {
					n, err := env2.App.Server.Gate.SweepCircuits(context.Background(), ahead.Now(), 500)
					closed <- answer{status: n, err: err}
					return
				}
				status, out, err := post(env2, "/api/v1/circuits/sms.send/open", b.ws.Key,
					map[string]any{"action": "monitor", "reason": "watching"})
				closed <- answer{status, out, err}
			}()
			var done *answer
			require.Eventually(t, func() bool {
				select {
				case a := <-closed:
					done = &a
					return true
				default:
				}
				var n int
				require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND datname = current_database()`).Scan(&n))
				return n > 0
			}, 10*time.Second, 10*time.Millisecond, "the close is done or waits for the surge turn")
			require.NoError(t, holder.Rollback(ctx))
			a := <-arrival
			require.NoError(t, a.err)
			if done == nil {
				a := <-closed
				done = &a
			}
			require.NoError(t, done.err)

			// The allowance, from the cooldown's end, admits two keys in all.
			decisions := []any{a.out["decision"]}
			b.clock.Set(ahead.Now())
			for range 3 {
				decisions = append(decisions, b.begin(sms(key("new"))).JSON()["decision"])
			}
			require.Equal(t, []any{"denied", "execute", "execute", "denied"}, decisions,
				"the arrival, decided as of its clock, met the breaker open; two new keys fit the allowance")
			require.Equal(t, 1, b.events("circuit.closed"))
		})
	}
}

// Retried at once from two instances, a refused backlog is admitted exactly
// up to the fresh allowance: each arrival takes the type's surge turn, as a
// new key does.
func TestConcurrentRetriesOfARefusedBacklogFitTheAllowance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env2 := apitest.Start(t, apitest.WithNow(b.clock.Now))
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 10, "surge_action": "deny"})
	const racers = 60
	keys := make([]string, racers)
	for i := range keys {
		keys[i] = key("backlog")
	}
	bodyOf := func(i int) map[string]any { return sms(keys[i]) }
	counts, _ := raceBodies(t, racers, b.ws.Key, bodyOf, b.env, env2)
	require.Equal(t, map[string]int{"execute": 10, "403:circuit_open": racers - 10}, counts)

	// (Begins that waited for their turn stamped their keys up to the wait
	// after the test clock's reading, gate_begin_in_turn: the close comes
	// later. Under -race on a loaded machine, 60 begins in turn waited past
	// a second: the refused ones arrived after the close, and took the
	// allowance.)
	b.clock.Add(30 * time.Second)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
	b.clock.Add(time.Second)
	counts, _ = raceBodies(t, racers, b.ws.Key, bodyOf, b.env, env2)
	require.Equal(t, map[string]int{"in_flight": 10, "execute": 10, "403:circuit_open": racers - 20}, counts)
	require.Equal(t, 2, b.events("circuit.tripped"))
}

// Only a key refused before its first grant arrives again: a retry of a
// key that was granted and failed, refused while the breaker was open, is a
// retry after the close, as before it, and takes nothing of the allowance.
// Nor is a refusal counted again while the breaker still holds the type.
func TestARefusedRetryOfAGrantedKeyIsNotAnArrival(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 2, "surge_action": "deny",
		"surge_cooldown_seconds": 60})
	var granted []map[string]any
	for range 2 {
		d := b.mustBegin("execute", sms(key("granted")))
		require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)
		granted = append(granted, sms(str(b.get(str(d["effect_id"]))["idempotency_key"])))
	}
	held := sms(key("held"))
	b.denialOf("circuit_open", held)
	for _, retry := range granted {
		b.denialOf("circuit_open", retry)
	}
	for range 3 {
		b.denialOf("circuit_open", held) // the open breaker holds it: not counted
	}

	b.clock.Add(61 * time.Second)
	for _, retry := range granted {
		b.mustBegin("execute", retry)
	}
	b.mustBegin("execute", held)
	b.mustBegin("execute", sms(key("new")))
	b.denialOf("circuit_open", sms(key("new")))
	require.Equal(t, 2, b.events("circuit.tripped"))
}

// A refused key begun again under a policy with no surge is recorded as an
// arrival all the same, as a new key's begin is counted whatever the
// policy says (migration 0070): a policy turning surge on counts both
// since the last close. It was counted by neither: five refused keys begun
// again, then surge turned on at 5 an hour, and the next new key executed,
// where after five new keys it was refused.
func TestAnArrivalUnderNoSurgeIsCountedWhenSurgeIsTurnedOn(t *testing.T) {
	t.Parallel()
	for _, begunAgain := range []string{"new keys", "refused keys"} {
		t.Run(begunAgain, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.putPolicy("sms.send", map[string]any{"mode": "allow"})
			b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key, map[string]any{"action": "deny"})
			var refused []map[string]any
			for range 5 {
				k := sms(key("held"))
				b.denialOf("circuit_open", k)
				refused = append(refused, k)
			}
			b.clock.Add(time.Second)
			b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
			b.clock.Add(time.Second)
			for _, k := range refused {
				if begunAgain == "new keys" {
					k = sms(key("new"))
				}
				b.mustBegin("execute", k)
			}
			b.putPolicy("sms.send", map[string]any{"surge_per_hour": 5, "surge_action": "deny"})
			b.denialOf("circuit_open", sms(key("next")))
			require.EqualValues(t, 6, b.lastEventData("circuit.tripped")["volume_last_hour"])
		})
	}
}

// A key that turned into an arrival between its read and its row lock (its
// begin did not take the surge turn first) is begun again: retry_request,
// rather than take the turn after the row (a deadlock with a begin holding
// the turn and waiting for the row). Nothing changes meanwhile.
func TestAnArrivalWithoutItsSurgeTurnIsBegunAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 1, "surge_action": "deny"})
	b.mustBegin("execute", sms(key("first")))
	held := sms(key("held"))
	refused := b.mustBegin("denied", held)
	b.clock.Add(time.Second)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
	b.clock.Add(time.Second)

	p := &auth.Principal{WorkspaceID: b.ws.ID, KeyID: keyID(b.ws.Key)}
	_, err := b.env.App.Server.Gate.BeginLocked(t.Context(), p, gate.BeginRequest{EffectType: "sms.send",
		IdempotencyKey: str(held["idempotency_key"]), Payload: json.RawMessage(`{"to":"+1"}`)})
	ae, ok := apierr.As(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, apierr.CodeRetryRequest, ae.Code)
	require.Equal(t, "closed", b.circuit("sms.send")["state"])

	d := b.mustBegin("execute", held) // the retry, through the front door
	require.Equal(t, refused["effect_id"], d["effect_id"])
}

// A key begun again counts once in the surge's window: the begin's own key
// is taken out of the counts its "1 +" stands for (review: a key refused
// under the emergency stop, created within the hour, and a key begun again
// within the hour of its last arrival, counted twice and tripped the
// breaker one key early, or held a key that was alone in its hour).
func TestAnArrivalCountsItsOwnKeyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 10, "surge_action": "deny"})
	for range 5 {
		b.mustBegin("execute", sms(key("before")))
	}
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key,
		map[string]any{"reason": "incident", "action": "deny"})
	var refused []map[string]any
	for range 5 {
		body := sms(key("held"))
		b.denialOf("circuit_open", body)
		refused = append(refused, body)
	}
	tripped := b.events("circuit.tripped")
	for range 3 {
		b.denialOf("circuit_open", refused[0]) // the stop holds it; ten keys this hour, not more
	}
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/release", b.ws.Key, nil)
	for _, body := range refused {
		b.mustBegin("execute", body)
	}
	require.Equal(t, tripped, b.events("circuit.tripped"), "ten keys: the threshold, not over it")
	b.denialOf("circuit_open", sms(key("eleventh")))

	// Under an operator's monitor breaker a deny surge holds each key over
	// the ceiling without opening a breaker, so a held key arrives at each
	// begin: alone in its trailing hour, it is under the ceiling of 1.
	b.putPolicy("email.send", map[string]any{"surge_per_hour": 1, "surge_action": "deny"})
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/email.send/open", b.ws.Key,
		map[string]any{"action": "monitor", "reason": "watching"})
	b.mustBegin("execute", email(key("first")))
	held := email(key("held"))
	b.denialOf("circuit_open", held)
	b.clock.Add(59 * time.Minute)
	b.denialOf("circuit_open", held) // with the first, two in the hour
	b.clock.Add(2 * time.Minute)
	b.mustBegin("execute", held)
}

// An arrival never reports the type's cached baseline stale, so its begin
// writes no gate_effect_types row outside the surge turn (final read: a
// grouped begin of a refused key held that row into the turn it took next,
// while a new key's begin held the turn and waited for the row, a
// deadlock). gate_surge still counts it, and a new key still refreshes the
// cache; a key that was granted is not counted at all.
func TestAnArrivalLeavesTheBaselineCacheToNewKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 1, "surge_action": "deny"})
	first := sms(key("first"))
	b.mustBegin("execute", first)
	held := sms(key("held"))
	b.denialOf("circuit_open", held)
	// As gate_evaluate calls it for a learned ceiling whose cache is stale.
	surge := func(k string) (stale, counted bool, err error) {
		err = b.env.App.Pool.QueryRow(t.Context(), `SELECT stale, volume IS NOT NULL FROM gate_surge($1::text,
			'sms.send'::text, $2::text, NULL::int, 2, $3::timestamptz - interval '7 hours', $3::timestamptz,
			NULL::timestamptz, NULL::float8, NULL::timestamptz)`, b.ws.ID, k, b.clock.Now()).Scan(&stale, &counted)
		return
	}
	stale, counted, err := surge(str(held["idempotency_key"]))
	require.NoError(t, err)
	require.True(t, counted, "an arrival is counted")
	require.False(t, stale, "an arrival leaves the cache alone")
	stale, counted, err = surge(key("new"))
	require.NoError(t, err)
	require.True(t, counted)
	require.True(t, stale, "a new key refreshes it")
	_, _, err = surge(str(first["idempotency_key"]))
	require.ErrorIs(t, err, pgx.ErrNoRows, "a granted key is not counted")
}

// Opens and closes of one breaker racing each other each answer the state
// they made, as do stops and releases racing each other (race QA: read
// after the commit, an open answered "closed" and a stop a list it no
// longer held).
func TestCircuitActionsAnswerTheStateTheyMade(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.mustBegin("execute", sms(key("seen")))
	const n = 12
	for round := range 3 {
		type answer struct {
			path string
			r    *apitest.Response
		}
		answers := make(chan answer, 4*n)
		var paths []string
		for range n {
			paths = append(paths, "/api/v1/circuits/sms.send/open", "/api/v1/circuits/sms.send/close",
				"/api/v1/circuits/stop", "/api/v1/circuits/release")
		}
		start := make(chan struct{})
		for _, path := range paths {
			var body any
			if strings.HasSuffix(path, "/open") || strings.HasSuffix(path, "/stop") {
				body = map[string]any{"action": "deny"}
			}
			go func() {
				<-start
				answers <- answer{path, b.env.Do("POST", path, b.ws.Key, body)}
			}()
		}
		close(start)
		for range paths {
			a := <-answers
			require.Equal(t, http.StatusOK, a.r.Status, "%s: %s", a.path, a.r.Body)
			body := a.r.JSON()
			switch a.path {
			case "/api/v1/circuits/sms.send/open":
				require.Equal(t, "open", body["state"], "round %d: %v", round, body)
			case "/api/v1/circuits/sms.send/close":
				// Closed, unless the stop holds it: the close does not lift it.
				if body["opened_by"] != "stop" {
					require.Equal(t, "closed", body["state"], "round %d: %v", round, body)
				}
			default:
				for _, x := range body["data"].([]any) {
					c := x.(map[string]any)
					if c["effect_type"] != "sms.send" || c["opened_by"] == "manual" {
						continue // a type's own breaker may hold it, whatever the stop
					}
					held := c["opened_by"] == "stop"
					require.Equal(t, a.path == "/api/v1/circuits/stop", held, "round %d %s: %v", round, a.path, c)
				}
			}
		}
	}
}

// A key's rate limit and a type's surge are its own: one key refused for
// its rate holds neither another key of its workspace nor another
// workspace's, and one workspace's surge, which trips its breaker, is not
// counted in another workspace's volume of the same type (multi-tenant
// QA). The clock stands still: one minute's window throughout. Not
// parallel: SweepCircuits closes every workspace's lapsed breakers.
func TestRateLimitsAndSurgesArePerKeyAndWorkspace(t *testing.T) {
	noisy := setup(t)
	quiet := &bundle{t: t, clock: noisy.clock, env: noisy.env, ws: noisy.env.Signup()}
	limited := func(b *bundle) string {
		return b.env.Key(b.ws, map[string]any{"name": "rl", "preset": "AGENT", "rate_limit_per_minute": 1})
	}
	first, second, other := limited(noisy), limited(noisy), limited(quiet)
	begin := func(secret string) *apitest.Response {
		return noisy.env.Do("POST", "/api/v1/effects/begin", secret, email(key("rl")))
	}
	require.Equal(t, http.StatusOK, begin(first).Status)
	errCode(t, begin(first), http.StatusTooManyRequests, "rate_limited")
	require.Equal(t, http.StatusOK, begin(second).Status, "another key of the workspace")
	require.Equal(t, http.StatusOK, begin(other).Status, "another workspace's key")

	for _, b := range []*bundle{noisy, quiet} {
		b.putPolicy("sms.send", map[string]any{"surge_per_hour": 3})
	}
	for range 3 {
		noisy.mustBegin("execute", sms(key("surge")))
	}
	noisy.mustBegin("approval_required", sms(key("trip")))
	require.Equal(t, "open", noisy.circuit("sms.send")["state"])
	for range 3 {
		quiet.mustBegin("execute", sms(key("own")))
	}
	require.Equal(t, "closed", quiet.circuit("sms.send")["state"], "the other workspace's volume is its own")
	require.EqualValues(t, 3, quiet.circuit("sms.send")["volume_last_hour"])
	quiet.mustBegin("approval_required", sms(key("own-trip"))) // its own fourth trips its own
}

// A close through an instance whose clock lags the one that took the burst
// grants the fresh allowance all the same: it starts after the latest key
// begun while the breaker was open, not at the closing clock's reading,
// which came before the burst's stamps and counted the whole refused burst
// in the allowance (QA: a burst through an instance a second ahead, closed
// through another, and the next begin was refused again). So does a policy
// PUT turning surge off, then on again.
func TestACloseThroughALaggingInstanceGrantsTheFreshAllowance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ahead := apitest.Start(t, apitest.WithNow(func() time.Time { return b.clock.Now().Add(time.Second) }))
	burst := func() {
		for i := range 8 {
			want := "execute"
			if i >= 5 {
				want = "denied"
			}
			r := ahead.Do("POST", "/api/v1/effects/begin", b.ws.Key, sms(key("ahead")))
			require.Equal(t, want, r.JSON()["decision"], "%s", r.Body)
		}
	}
	allowance := func(why string) {
		for range 5 {
			b.mustBegin("execute", sms(key("after")))
		}
		b.denialOf("circuit_open", sms(key("after")))
		require.Equal(t, "open", b.circuit("sms.send")["state"], why)
	}

	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 5, "surge_action": "deny"})
	burst()
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
	closedAt, err := time.Parse(time.RFC3339Nano, str(b.lastEventData("circuit.closed")["closed_at"]))
	require.NoError(t, err)
	require.True(t, closedAt.Equal(b.clock.Now()), "closed at %v, by the closing clock %v: when it closed, "+
		"not when its allowance starts", closedAt, b.clock.Now())
	allowance("the operator's close")

	b.clock.Add(time.Hour + time.Minute) // a new hour: the burst's keys no longer count
	burst()
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": nil})
	require.Equal(t, "closed", b.circuit("sms.send")["state"])
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 5})
	allowance("surge turned off, then on")
}

// A key stamped far ahead of the closing clock (by a clock the instances no
// longer keep, db.Clock) does not carry the allowance's start, and with it
// every later begin's stamp and lease, past a minute ahead of the close.
func TestACloseFollowsAKeyStampedAheadAMinuteAtMost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	farAhead := apitest.Start(t, apitest.WithNow(func() time.Time { return b.clock.Now().Add(time.Hour) }))
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", b.ws.Key, map[string]any{"action": "deny"})
	r := farAhead.Do("POST", "/api/v1/effects/begin", b.ws.Key, sms(key("far")))
	require.Equal(t, http.StatusForbidden, r.Status, "%s", r.Body)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
	d := b.mustBegin("execute", sms(key("after")))
	expires, err := time.Parse(time.RFC3339Nano, str(d["lease_expires_at"]))
	require.NoError(t, err)
	require.False(t, expires.After(b.clock.Now().Add(time.Minute+time.Minute+time.Millisecond)),
		"lease until %v: the allowance followed a key an hour ahead", expires)
}

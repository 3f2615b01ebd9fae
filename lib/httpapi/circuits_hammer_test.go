package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/events"
)

// circuitEvent is a circuit.tripped or circuit.closed event as recorded.
type circuitEvent struct {
	typ, openedBy, action string
}

// circuitEvents are the breaker events of subject (an effect type, or '*'
// for the emergency stop) in workspace ws, in the order their transactions
// wrote them: each action takes the breaker's turn before it writes, so
// the order transaction ids were assigned in is the turns' order (the
// clock, read by two instances, may tie or disagree by a microsecond).
func circuitEvents(t *testing.T, env *apitest.Env, ws, subject string) []circuitEvent {
	t.Helper()
	rows, err := env.App.Pool.Query(context.Background(), `SELECT type, data FROM events
		WHERE workspace_id = $1 AND subject_id = $2 AND type IN ($3, $4) ORDER BY xmin::text::bigint, id`,
		ws, subject, events.CircuitTripped, events.CircuitClosed)
	require.NoError(t, err)
	defer rows.Close()
	var out []circuitEvent
	for rows.Next() {
		var typ string
		var data []byte
		require.NoError(t, rows.Scan(&typ, &data))
		var d struct {
			OpenedBy string  `json:"opened_by"`
			Action   *string `json:"action"`
		}
		require.NoError(t, json.Unmarshal(data, &d))
		e := circuitEvent{typ: typ, openedBy: d.OpenedBy}
		if d.Action != nil {
			e.action = *d.Action
		}
		out = append(out, e)
	}
	require.NoError(t, rows.Err())
	return out
}

// requireOneEventPerTransition requires the events of a breaker to tell
// exactly its transitions: it starts closed, so the first is a trip; a
// close follows a trip; a trip while open (re-opened) changes the opener
// or the action; and the last says how the breaker's row ends.
func requireOneEventPerTransition(t *testing.T, env *apitest.Env, ws, subject string) {
	t.Helper()
	evs := circuitEvents(t, env, ws, subject)
	require.NotEmpty(t, evs, subject)
	var open *circuitEvent
	for i, e := range evs {
		switch {
		case e.typ == events.CircuitClosed:
			require.NotNil(t, open, "%s: event %d closes a closed breaker: %v", subject, i, evs)
			require.Equal(t, open.openedBy, e.openedBy, "%s: event %d", subject, i)
			open = nil
		case open != nil:
			require.NotEqual(t, *open, e, "%s: event %d trips an open breaker again unchanged: %v", subject, i, evs)
			open = &evs[i]
		default:
			open = &evs[i]
		}
	}
	var state, openedBy, action string
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `SELECT state, coalesce(opened_by, ''),
		coalesce(action, '') FROM gate_circuits WHERE workspace_id = $1 AND effect_type = $2`, ws, subject).
		Scan(&state, &openedBy, &action))
	if open == nil {
		require.Equal(t, "closed", state, subject)
		return
	}
	require.Equal(t, "open", state, subject)
	require.Equal(t, *open, circuitEvent{events.CircuitTripped, openedBy, action}, subject)
}

// Manual opens (with one action or another) and closes of one type's
// breaker, stops and releases racing on two instances, round after round:
// each answers 200; the type's breaker and the stop each record exactly one
// event per transition (requireOneEventPerTransition), and each ends as
// its last event says.
func TestCircuitActionsRacingOnTwoInstancesRecordEachTransitionOnce(t *testing.T) {
	t.Parallel()
	// The real clock: each transition's event is keyed by when the breaker
	// opened, which a frozen clock would make the same for every opening.
	e := apitest.Start(t)
	instances := []*apitest.Env{e, apitest.Start(t)}
	ws := e.Signup()
	actions := []string{"deny", "require_approval"}
	const racers = 16
	for round := range 4 {
		answers := make([]*apitest.Response, racers)
		apitest.StartTogether(racers, func(i int) {
			var path string
			var body any
			switch i % 4 {
			case 0:
				path, body = "/api/v1/circuits/sms.send/open", map[string]any{"action": actions[i/4%2]}
			case 1:
				path = "/api/v1/circuits/sms.send/close"
			case 2:
				path, body = "/api/v1/circuits/stop", map[string]any{"action": actions[(i/4+round)%2]}
			default:
				path = "/api/v1/circuits/release"
			}
			answers[i] = instances[i%2].Do("POST", path, ws.Key, body)
		})
		for i, r := range answers {
			require.Equal(t, http.StatusOK, r.Status, "round %d racer %d: %s", round, i, r.Body)
		}
		requireOneEventPerTransition(t, e, ws.ID, "sms.send")
		requireOneEventPerTransition(t, e, ws.ID, "*")
	}
}

// Every opening and closing is announced, even one whose clock reads the
// instant an earlier transition of the same breaker read, as another
// instance's clock can when it lags by the time between them (here two
// instances reading one frozen instant): two open-close cycles of a type's
// breaker and of the stop are four events each. Before, the events were
// keyed by when the breaker opened, so the second cycle's trip and close
// took the first's keys and were dropped.
func TestEachCircuitTransitionIsAnnouncedUnderOneClockReading(t *testing.T) {
	t.Parallel()
	instant := apitest.NewClock(time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))
	instances := []*apitest.Env{apitest.Start(t, apitest.WithNow(instant.Now)), apitest.Start(t, apitest.WithNow(instant.Now))}
	ws := instances[0].Signup()
	for _, env := range instances {
		env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/open", ws.Key, map[string]any{"action": "deny"})
		env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", ws.Key, nil)
		env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", ws.Key, map[string]any{"action": "deny"})
		env.Must(http.StatusOK, "POST", "/api/v1/circuits/release", ws.Key, nil)
	}
	for _, subject := range []string{"sms.send", "*"} {
		require.Len(t, circuitEvents(t, instances[0], ws.ID, subject), 4, subject)
		requireOneEventPerTransition(t, instances[0], ws.ID, subject)
	}
}

package webhooks_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/events"
)

// A delivery's data carries the names it names as they are: only the
// times SQL wrote (keys ending _at, read +00:00 from the outbox) are sent
// with Z. An endpoint may be named like a time ("printable, without white
// space at either end"), and so may a handler version; rewritten, the
// circuit.closed of endpoint "2026-12-07T09:00:00+00:00" named an endpoint
// that does not exist, and a step.replayed's newHandlerVersion one no
// worker registers (events QA).
func TestADeliverySendsNamesThatReadLikeTimesAsTheyAre(t *testing.T) {
	env, clk := start(t, true)
	ws := env.Signup()
	rcv := newReceiver(t)
	env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": rcv.URL, "events": []string{events.CircuitClosed}})

	const name = "2026-12-07T09:00:00+00:00"
	ep := env.Must(http.StatusCreated, "POST", "/api/v1/endpoints", ws.Key, map[string]any{"name": name}).JSON()
	require.Equal(t, name, ep["name"])
	_, err := env.App.Pool.Exec(context.Background(), `UPDATE job_endpoints SET circuit_state = 'open',
		circuit_opened_at = $2 WHERE id = $1`, ep["id"], clk.Now().Add(-time.Minute))
	require.NoError(t, err)
	env.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+ep["id"].(string)+"/circuit/close", ws.Key, nil)

	env.App.Sweeper.RunOnce(context.Background())
	require.Equal(t, 1, rcv.count())
	var got struct {
		SubjectID string         `json:"subject_id"`
		Data      map[string]any `json:"data"`
	}
	require.NoError(t, json.Unmarshal(rcv.bodies[0], &got))
	require.Equal(t, ep["id"], got.SubjectID)
	require.Equal(t, name, got.Data["endpoint"], "the endpoint's name, as its reads show it")
}

package httpapi_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
)

// keyedEffects counts, by route name, what a route that takes an
// Idempotency-Key makes each time it acts, where a row says so ($1 the
// workspace). A rotation acting twice is refused the second time (the
// previous secret still signs), a retry of deliveries and a reconciliation
// only by their answers.
var keyedEffects = map[string]string{
	"keys.create":       `SELECT count(*) FROM api_keys WHERE workspace_id = $1`,
	"webhooks.create":   `SELECT count(*) FROM webhooks WHERE workspace_id = $1`,
	"contracts.publish": `SELECT count(*) FROM tool_contracts WHERE workspace_id = $1`,
	"tools.test":        `SELECT count(*) FROM job_runs WHERE workspace_id = $1`,
	"workers.register":  `SELECT count(*) FROM job_workers WHERE workspace_id = $1`,
	"steps.replay":      `SELECT count(*) FROM job_replays WHERE workspace_id = $1`,
	"runs.create":       `SELECT count(*) FROM job_runs WHERE workspace_id = $1`,
	"groups.create":     `SELECT count(*) FROM effect_groups WHERE workspace_id = $1`,
}

// Racers released together on two instances, each sending one request of
// every route that takes an Idempotency-Key under one key, a quarter of
// them with other body bytes (the same JSON after a space, which acts the
// same: only the bytes tell them apart): the route acts exactly once
// (one answer not marked replayed, one row made); every other answer to a
// body like the actor's is its answer byte for byte, marked replayed and
// naming its request, or 409 retry_request; every answer to the other
// body is 409 idempotency_key_reuse or retry_request.
func TestIdempotencyKeysRacingOnTwoInstancesActOnce(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	instances := e.twoInstances()
	other := instances[1]
	calls := idempotentCalls(e, e.register("send_email@1"))
	for _, r := range httpapi.Routes() {
		if r.Idempotent {
			require.Contains(t, calls, r.Name)
		}
	}
	const racers = 16
	methods := idempotentMethods()
	for name, call := range calls {
		same, err := json.Marshal(call.body)
		require.NoError(t, err)
		bodies := [][]byte{same, append([]byte(" "), same...)}
		bodyOf := func(i int) int { // racers 3, 7, 11 and 15 send the other bytes
			if i%4 == 3 {
				return 1
			}
			return 0
		}
		before := effects(e, name)
		answers := make([]*apitest.Response, racers)
		apitest.StartTogether(racers, func(i int) {
			answers[i] = instances[i%2].DoWith(methods[name], call.path, call.key, idemKey("hammer:"+name), bodies[bodyOf(i)])
		})
		actor := -1
		for i, r := range answers {
			if r.Status < 300 && r.Header.Get(httpapi.ReplayedHeader) == "" {
				require.Equal(t, -1, actor, "%s: racers %d and %d both acted", name, actor, i)
				actor = i
			}
		}
		require.NotEqual(t, -1, actor, "%s: no racer acted", name)
		acted := answers[actor]
		for i, r := range answers {
			switch {
			case i == actor:
			case r.Status < 300:
				require.Equal(t, bodyOf(actor), bodyOf(i), "%s: racer %d was given another body's answer", name, i)
				require.Equal(t, "true", r.Header.Get(httpapi.ReplayedHeader), "%s: racer %d", name, i)
				require.Equal(t, acted.Header.Get("X-Request-Id"), r.Header.Get(httpapi.OriginalRequestHeader), "%s: racer %d", name, i)
				require.Equal(t, acted.Status, r.Status, "%s: racer %d", name, i)
				require.Equal(t, string(acted.Body), string(r.Body), "%s: racer %d", name, i)
			case r.Status == http.StatusConflict && r.ErrorCode() == "retry_request":
			case r.Status == http.StatusConflict && r.ErrorCode() == "idempotency_key_reuse":
				require.NotEqual(t, bodyOf(actor), bodyOf(i), "%s: racer %d sent the acting body", name, i)
			default:
				t.Fatalf("%s: racer %d answered %d: %s", name, i, r.Status, r.Body)
			}
		}
		if before >= 0 {
			require.Equal(t, before+1, effects(e, name), "%s: made once", name)
		}
		again := other.DoWith(methods[name], call.path, call.key, idemKey("hammer:"+name), bodies[bodyOf(actor)])
		require.Equal(t, string(acted.Body), string(again.Body), "%s: given again once the race is over", name)
	}
}

// effects is what the route named makes in e's workspace so far, or -1
// when no row counts it.
func effects(e *jobsEnv, name string) int {
	sql, ok := keyedEffects[name]
	if !ok {
		return -1
	}
	return e.count(sql, e.ws.ID)
}

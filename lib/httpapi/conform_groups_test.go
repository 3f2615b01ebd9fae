package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/ids"
)

// README, "Effect groups": a group is its creating key's unit of work; a key
// that can only ask and report (AGENT) may not read, join, commit or unwind
// another key's group, whose steps and unwind plan (compensation payloads
// included) are effects it may not read. On every route of the table that
// names a group in its path (a new one fails here until it is listed), and
// on a begin that joins it, another agent of the workspace is answered
// exactly as for a group id that names nothing, and the group is left as it
// was (security review: /groups/{id}/steps was held by no test).
func TestEveryGroupRouteHidesAnotherKeysGroupFromAnAgent(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	owner := env.Key(ws, map[string]any{"name": "owner", "preset": "AGENT"})
	other := env.Key(ws, map[string]any{"name": "other", "preset": "AGENT"})
	g := env.Must(http.StatusCreated, "POST", "/api/v1/groups", owner, map[string]any{"name": "checkout"}).JSON()["id"].(string)
	d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", owner, map[string]any{
		"effect_type": "payment.charge", "idempotency_key": "charge:1", "group_id": g, "cost_micros": 1000,
		"compensation": map[string]any{"effect_type": "payment.refund", "payload": map[string]any{"card": "tok_secret"}},
	}).JSON()
	env.Must(http.StatusOK, "POST", "/api/v1/effects/"+d["effect_id"].(string)+"/report", owner,
		map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded"})
	read := func() string {
		return string(env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g, owner, nil).Body)
	}
	before := read()

	hidden := func(what string, theirs, unknown *apitest.Response) {
		t.Helper()
		require.Equal(t, http.StatusNotFound, theirs.Status, "%s: %s", what, theirs.Body)
		require.Equal(t, apierr.CodeNotFound, theirs.ErrorCode(), what)
		require.Equal(t, unknown.Status, theirs.Status, what)
		require.Equal(t, unknown.JSON()["error"], theirs.JSON()["error"], "%s: answered as an unknown group", what)
		require.NotContains(t, string(theirs.Body), "tok_secret", what)
	}
	checked := 0
	for _, r := range httpapi.Routes() {
		if !strings.HasPrefix(r.Pattern, "/api/v1/groups/{id}") {
			continue
		}
		path := func(id string) string { return strings.Replace(r.Pattern, "{id}", id, 1) }
		hidden(r.Method+" "+r.Pattern, env.Do(r.Method, path(g), other, nil),
			env.Do(r.Method, path(ids.New(ids.Group)), other, nil))
		checked++
	}
	require.Equal(t, 4, checked, "get, steps, commit, unwind")
	join := func(group string) *apitest.Response {
		return env.Do("POST", "/api/v1/effects/begin", other, map[string]any{
			"effect_type": "payment.charge", "idempotency_key": "join:" + group, "group_id": group, "cost_micros": 1000})
	}
	hidden("begin joining it", join(g), join(ids.New(ids.Group)))

	require.Equal(t, before, read(), "the refusals changed nothing")
	require.Equal(t, "open", env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g, owner, nil).JSON()["state"])
}

package gate_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
)

// stored is what a refused resolve must leave as it was: the effect's stored
// row, its attempts (outcomes, resolutions, charges), the workspace's spend
// and the events recorded.
func (b *bundle) stored(id string) string {
	b.t.Helper()
	var out string
	require.NoError(b.t, b.env.App.Pool.QueryRow(b.t.Context(), `SELECT jsonb_build_object(
        'effect', (SELECT to_jsonb(e) FROM effects e WHERE e.id = $1),
        'attempts', (SELECT jsonb_agg(to_jsonb(a) ORDER BY a.attempt) FROM effect_attempts a WHERE a.effect_id = $1),
        'spend', (SELECT jsonb_agg(to_jsonb(s) ORDER BY s.scope, s.day) FROM gate_spend s
                  WHERE s.workspace_id = (SELECT workspace_id FROM effects WHERE id = $1)),
        'events', (SELECT count(*) FROM events v
                   WHERE v.workspace_id = (SELECT workspace_id FROM effects WHERE id = $1)))::text`, id).Scan(&out))
	return out
}

// A resolve that names an attempt applies only to the attempt it would
// settle, the latest unknown one (resolve QA: a resolve to failed whose
// answer was lost, retried after the key was begun again and that attempt
// lapsed, recorded the new attempt failed, releasing its charges and
// freeing the key, though nobody had checked whether it acted).
func TestAResolveNamingAnAttemptSettlesOnlyThatAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"daily_budget_micros": 1000})
	resolve := func(id string, body map[string]any) map[string]any {
		t.Helper()
		return errCode(t, b.env.Do("POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, body),
			http.StatusConflict, "invalid_state")["detail"].(map[string]any)
	}
	body := charge(key("named"), 600)
	id := str(b.mustBegin("execute", body)["effect_id"])
	b.clock.Add(61 * time.Second) // attempt 1 lapses (not yet recorded)

	// A wrong attempt on a first resolve is refused and changes nothing:
	// not even the lapse is recorded.
	before, stored := b.get(id), b.stored(id)
	for _, wrong := range []int{2, 7} {
		require.Equal(t, map[string]any{"state": "indeterminate", "unresolved_attempt": 1.0},
			resolve(id, map[string]any{"outcome": "failed", "attempt": wrong}))
	}
	require.Equal(t, before, b.get(id))
	require.Equal(t, stored, b.stored(id), "a refused resolve changes nothing")

	// The right one is recorded.
	first := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed", "attempt": 1}).JSON()
	require.Equal(t, "failed", first["state"])
	// Repeated before the key is begun again: answered as first settled,
	// whether it names the attempt or not; another attempt is refused.
	require.Equal(t, first, b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed", "attempt": 1}).JSON())
	require.Equal(t, map[string]any{"state": "failed"}, resolve(id, map[string]any{"outcome": "failed", "attempt": 2}))

	// The key runs again (the resolve to failed freed it and its charge)
	// and attempt 2 lapses: its outcome is unknown, its charge held.
	d2 := b.mustBegin("execute", body)
	require.EqualValues(t, 2, d2["attempt"])
	b.clock.Add(61 * time.Second)
	b.denialOf("budget_exceeded", charge(key("over"), 401))

	// The first resolve sent again, naming its attempt, is refused: it
	// names attempt 2 as the unresolved one, says attempt 1 was resolved
	// so, and changes nothing (charges, state, attempts).
	before, stored = b.get(id), b.stored(id)
	require.Equal(t, "indeterminate", before["state"])
	require.Equal(t, map[string]any{"state": "indeterminate", "unresolved_attempt": 2.0, "attempt": 1.0,
		"resolved_outcome": "failed"}, resolve(id, map[string]any{"outcome": "failed", "attempt": 1}))
	// Another outcome for attempt 1 says only which attempt is unknown.
	require.Equal(t, map[string]any{"state": "indeterminate", "unresolved_attempt": 2.0},
		resolve(id, map[string]any{"outcome": "succeeded", "attempt": 1}))
	require.Equal(t, before, b.get(id))
	require.Equal(t, stored, b.stored(id), "a refused resolve changes nothing")
	b.denialOf("budget_exceeded", charge(key("still-over"), 401))
	b.mustBegin("blocked", body)

	// Without attempt, the old behaviour: the resolve settles attempt 2.
	e := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed"}).JSON()
	require.Equal(t, "failed", e["state"])
	require.Equal(t, "failed", e["attempts"].([]any)[1].(map[string]any)["outcome"])
	b.mustBegin("execute", charge(key("freed"), 1000))
}

// Under on_indeterminate retry, with attempt 1 unknown and its retry
// reported failed, the attempt a resolve settles is attempt 1 (what the
// blocked and probe answers' prior_attempt name), not the effect's latest.
func TestAResolveNamesTheLatestUnknownAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry"})
	body := charge(key("named-retry"), 0)
	id := str(b.mustBegin("execute", body)["effect_id"])
	b.clock.Add(61 * time.Second)
	retry := b.mustBegin("execute", body)
	require.Equal(t, "indeterminate", b.report(id, str(retry["lease_token"]), "failed", nil).JSON()["state"])
	stored := b.stored(id)
	r := b.env.Do("POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "succeeded", "attempt": 2})
	require.Equal(t, map[string]any{"state": "indeterminate", "unresolved_attempt": 1.0},
		errCode(t, r, http.StatusConflict, "invalid_state")["detail"])
	require.Equal(t, stored, b.stored(id))
	e := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "succeeded", "attempt": 1}).JSON()
	require.Equal(t, "succeeded", e["state"])
}

// attempt is an integer of at least 1; a refusal changes nothing. A
// number is told one rule, whether the decoder refuses it (1.5, 2^63) or
// the handler (0, -1), as a bounded integer of the jobs routes is (QA: 0
// read "must be an integer of at least 1", 1.5 "from 1 to 2^63-1").
func TestAResolvesAttemptIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := str(b.mustBegin("execute", email(key("named-invalid")))["effect_id"])
	b.clock.Add(61 * time.Second)
	stored := b.stored(id)
	for _, bad := range []string{`0`, `-1`, `1.5`, `"1"`, `true`, `[1]`, `1e400`} {
		r := b.env.Do("POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, `{"outcome":"failed","attempt":`+bad+`}`)
		e := errCode(t, r, http.StatusBadRequest, "invalid_request")
		fields := []string{}
		for _, v := range e["detail"].(map[string]any)["validation"].([]any) {
			fields = append(fields, str(v.(map[string]any)["field"]))
		}
		require.Equal(t, []string{"attempt"}, fields, "%s: %v", bad, e)
	}
	for _, bad := range []string{`0`, `-1`, `1.5`, `9223372036854775808`} {
		r := b.env.Do("POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, `{"outcome":"failed","attempt":`+bad+`}`)
		require.Equal(t, []any{map[string]any{"field": "attempt", "message": apierr.IntegerRule(1, "2^63-1")}},
			errCode(t, r, http.StatusBadRequest, "invalid_request")["detail"].(map[string]any)["validation"], bad)
	}
	require.Equal(t, stored, b.stored(id))
	// null is not sent, as for every optional field.
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, `{"outcome":"failed","attempt":null}`)
}

package gate_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
)

func TestLapsedLeaseBlocksUntilResolved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("blocked")
	d := b.mustBegin("execute", email(k))
	id, token := str(d["effect_id"]), str(d["lease_token"])
	started := b.clock.Now()

	b.clock.Add(59 * time.Second)
	b.mustBegin("in_flight", email(k))
	b.clock.Add(time.Second) // lease_expires_at == now: lapsed

	// Indeterminate at once, with no sweeper having run.
	e := b.get(id)
	require.Equal(t, "indeterminate", e["state"])
	require.Equal(t, "indeterminate", e["attempts"].([]any)[0].(map[string]any)["outcome"])
	list := b.env.Must(http.StatusOK, "GET", "/api/v1/effects?state=indeterminate", b.ws.Key, nil).JSON()
	require.Len(t, list["data"], 1)
	require.Empty(t, b.env.Must(http.StatusOK, "GET", "/api/v1/effects?state=leased", b.ws.Key, nil).JSON()["data"])

	blocked := b.mustBegin("blocked", email(k))
	require.Equal(t, "indeterminate", blocked["state"])
	require.Equal(t, map[string]any{"attempt": 1.0, "started_at": started.Format(time.RFC3339),
		"lease_expired_at": started.Add(60 * time.Second).Format(time.RFC3339)}, blocked["prior_attempt"])
	b.mustBegin("blocked", email(k)) // blocking consumes no attempt

	// The late report is refused and the attempt stays indeterminate.
	errCode(t, b.report(id, token, "succeeded", nil), http.StatusConflict, "lease_expired")
	errCode(t, b.env.Do("POST", "/api/v1/effects/"+id+"/heartbeat", b.ws.Key, map[string]any{"lease_token": token}),
		http.StatusConflict, "lease_expired")
	require.Equal(t, "indeterminate", b.get(id)["state"])

	result := map[string]any{"message_id": "found-at-vendor"}
	r := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "succeeded", "result": result, "note": "checked the vendor dashboard"})
	e = r.JSON()
	require.Equal(t, "succeeded", e["state"])
	require.Equal(t, result, e["result"])
	a := e["attempts"].([]any)[0].(map[string]any)
	require.Equal(t, "succeeded", a["outcome"])
	require.Equal(t, keyID(b.ws.Key), a["resolved_by_key_id"])
	require.Equal(t, "checked the vendor dashboard", a["resolve_note"])
	require.Nil(t, a["reported_at"])

	dup := b.mustBegin("duplicate", email(k))
	require.Equal(t, result, dup["result"])
	// Late report on the lapsed attempt stays lease_expired, resolved or not.
	late := errCode(t, b.report(id, token, "succeeded", nil), http.StatusConflict, "lease_expired")
	require.Contains(t, late["message"], "has since been recorded as succeeded", "not 'reads unknown': it was resolved")
	errCode(t, b.report(id, token, "failed", nil), http.StatusConflict, "lease_expired")
	late = errCode(t, b.env.Do("POST", "/api/v1/effects/"+id+"/heartbeat", b.ws.Key, map[string]any{"lease_token": token}),
		http.StatusConflict, "lease_expired")
	require.Contains(t, late["message"], "has since been recorded as succeeded")
	// Resolving again is an illegal transition, but a repeat of this key's
	// own resolve (its answer lost) answers the effect as it is (QA).
	errCode(t, b.env.Do("POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "failed"}),
		http.StatusConflict, "invalid_state")
	again := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "succeeded", "result": result, "note": "checked the vendor dashboard"}).JSON()
	require.Equal(t, e, again)
	other := b.env.Key(b.ws, map[string]any{"name": "other operator", "preset": "OPERATOR"})
	errCode(t, b.env.Do("POST", "/api/v1/effects/"+id+"/resolve", other, map[string]any{"outcome": "succeeded"}),
		http.StatusConflict, "invalid_state")
}

func TestResolveFailedAllowsNewAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("resolve-failed")
	d := b.mustBegin("execute", email(k))
	id := str(d["effect_id"])
	b.clock.Add(61 * time.Second)
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed", "note": "vendor has no record"})
	d2 := b.mustBegin("execute", email(k))
	require.EqualValues(t, 2, d2["attempt"])
	require.Equal(t, false, d2["probe"])
	// The resolve repeated now (its first answer lost) is refused, the key
	// having been begun again, but says it landed; another resolve says
	// only the state.
	landed := func(state string) {
		t.Helper()
		before := b.get(id)
		detail := func(key, outcome string) any {
			t.Helper()
			r := b.env.Do("POST", "/api/v1/effects/"+id+"/resolve", key, map[string]any{"outcome": outcome})
			return errCode(t, r, http.StatusConflict, "invalid_state")["detail"]
		}
		require.Equal(t, map[string]any{"state": state, "attempt": 1.0, "resolved_outcome": "failed"},
			detail(b.ws.Key, "failed"))
		require.Equal(t, map[string]any{"state": state}, detail(b.ws.Key, "succeeded"))
		other := b.env.Key(b.ws, map[string]any{"name": "op-" + state, "preset": "OPERATOR"})
		require.Equal(t, map[string]any{"state": state}, detail(other, "failed"))
		require.Equal(t, before, b.get(id), "a refused resolve changes nothing")
	}
	landed("leased")
	// The report's answer shows the first attempt's resolution as a read does.
	r := b.report(id, str(d2["lease_token"]), "succeeded", nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	first := r.JSON()["attempts"].([]any)[0].(map[string]any)
	require.Equal(t, "vendor has no record", first["resolve_note"])
	require.Equal(t, b.get(id)["attempts"], r.JSON()["attempts"])
	landed("succeeded")
}

// A resolve repeated after its key was begun again is refused with the
// attempt it resolved, also when the new attempt ended as the resolve did
// (README: only a repeat while the key was not begun again answers the
// effect; model QA: a second attempt reported failed made the repeat of a
// resolve to failed answer 200 with an effect it had not settled). A retry
// reported failed before the resolve is no new begin: the repeat still
// answers the effect.
func TestResolveRepeatedAfterTheKeyFailedAgainSaysItLanded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	resolve := func(id string) *apitest.Response {
		t.Helper()
		return b.env.Do("POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "failed"})
	}
	k := key("resolve-again")
	id := str(b.mustBegin("execute", email(k))["effect_id"])
	b.clock.Add(61 * time.Second)
	require.Equal(t, http.StatusOK, resolve(id).Status)
	b.clock.Add(time.Second)
	d := b.mustBegin("execute", email(k))
	b.clock.Add(time.Second)
	require.Equal(t, http.StatusOK, b.report(id, str(d["lease_token"]), "failed", nil).Status)
	before := b.get(id)
	require.Equal(t, "failed", before["state"])
	require.Equal(t, map[string]any{"state": "failed", "attempt": 1.0, "resolved_outcome": "failed"},
		errCode(t, resolve(id), http.StatusConflict, "invalid_state")["detail"])
	require.Equal(t, before, b.get(id), "a refused resolve changes nothing")

	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry"})
	body := charge(key("resolve-retry"), 0)
	id = str(b.mustBegin("execute", body)["effect_id"])
	b.clock.Add(61 * time.Second)
	retry := b.mustBegin("execute", body)
	b.clock.Add(time.Second)
	require.Equal(t, "indeterminate",
		b.report(id, str(retry["lease_token"]), "failed", nil).JSON()["state"], "attempt 1 is still unknown")
	b.clock.Add(time.Second)
	first := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed"}).JSON()
	b.clock.Add(time.Second)
	require.Equal(t, first, b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed"}).JSON(), "a repeat: attempt 2 was reported before the resolve")
}

func TestOnIndeterminateRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "retry", "max_attempts": 2})
	k := key("retry")
	d1 := b.mustBegin("execute", email(k))
	b.clock.Add(61 * time.Second)
	d2 := b.mustBegin("execute", email(k))
	require.EqualValues(t, 2, d2["attempt"])
	require.Equal(t, false, d2["probe"])
	require.Nil(t, d2["prior_attempt"])
	// The first holder was superseded: lease_lost, even though its lease also
	// lapsed; it names the attempt, which was never reported.
	lost := errCode(t, b.report(str(d1["effect_id"]), str(d1["lease_token"]), "succeeded", nil), http.StatusConflict,
		"lease_lost")
	require.Equal(t, map[string]any{"attempt": float64(1)}, lost["detail"])
	e := b.get(str(d1["effect_id"]))
	require.Equal(t, "indeterminate", e["attempts"].([]any)[0].(map[string]any)["outcome"])
	require.Nil(t, e["attempts"].([]any)[1].(map[string]any)["outcome"])

	// A second lapse exhausts max_attempts (2): denied, final.
	b.clock.Add(61 * time.Second)
	d3 := b.mustBegin("denied", email(k))
	require.Equal(t, "max_attempts_exceeded", d3["error"].(map[string]any)["code"])
}

func TestOnIndeterminateProbe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "probe"})
	k := key("probe")
	d1 := b.mustBegin("execute", email(k))
	started := b.clock.Now()
	b.clock.Add(90 * time.Second)
	d2 := b.mustBegin("execute", email(k))
	require.Equal(t, true, d2["probe"])
	require.EqualValues(t, 2, d2["attempt"])
	require.Equal(t, map[string]any{"attempt": 1.0, "started_at": started.Format(time.RFC3339),
		"lease_expired_at": started.Add(60 * time.Second).Format(time.RFC3339)}, d2["prior_attempt"])
	b.mustBegin("in_flight", email(k))
	r := b.report(str(d1["effect_id"]), str(d2["lease_token"]), "succeeded", map[string]any{"found": true})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	attempts := r.JSON()["attempts"].([]any)
	require.Equal(t, true, attempts[1].(map[string]any)["probe"])
	require.Equal(t, "indeterminate", attempts[0].(map[string]any)["outcome"])
}

// The result limit is on the value, not on how it was written (contract
// QA: Python's json.dumps escapes every character beyond ASCII, so 150 KB
// of text sent as 300 KB was refused, and so was the retry of a report
// accepted in UTF-8).
func TestTheResultLimitIsOnTheValue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	report := func(id, token, result string) *apitest.Response {
		return b.env.Do("POST", "/api/v1/effects/"+id+"/report", b.ws.Key,
			`{"lease_token":"`+token+`","outcome":"succeeded","result":`+result+`}`)
	}
	escaped := `{"text":"` + strings.Repeat(`\u65e5`, 50_000) + `"}` // 300 KB as sent, 150 KB as UTF-8
	padded := `{"text":"` + strings.Repeat("x", 200_000) + `"` + strings.Repeat(" ", 100_000) + `}`
	// Review: HTML characters were measured escaped (6 bytes each).
	html := `{"html":"` + strings.Repeat("<", 100_000) + strings.Repeat("x", 150_000) + `"}` + strings.Repeat(" ", 20_000)
	for _, result := range []string{escaped, padded, html} {
		d := b.mustBegin("execute", email(key("written")))
		id, token := str(d["effect_id"]), str(d["lease_token"])
		first := report(id, token, result)
		require.Equal(t, http.StatusOK, first.Status, "%.200s", first.Body)
		again := report(id, token, result)
		require.Equal(t, http.StatusOK, again.Status, "a retry written the same way")
		require.JSONEq(t, string(first.Body), string(again.Body))
		var stored int
		require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), `SELECT octet_length(result) FROM effects WHERE id = $1`,
			id).Scan(&stored))
		require.Less(t, stored, gate.MaxResultBytes+1024, "stored written again, within the limit (and its seal)")
	}
	d := b.mustBegin("execute", email(key("large")))
	large := `{"text":"` + strings.Repeat("日", 90_000) + `"}` // 270 KB however written
	errCode(t, report(str(d["effect_id"]), str(d["lease_token"]), large), http.StatusRequestEntityTooLarge, "payload_too_large")
	require.Equal(t, "leased", b.get(str(d["effect_id"]))["state"])
}

// A resolve's result is held to a report's limit (API.md §2.2: over 256 KiB
// is 413 payload_too_large): refused whole, the effect still indeterminate
// and resolvable; at the limit it is recorded.
func TestAResolvesResultIsHeldToTheResultLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := b.mustBegin("execute", email(key("resolve-large")))
	id := str(d["effect_id"])
	b.clock.Add(61 * time.Second)
	resolve := func(text string) *apitest.Response {
		return b.env.Do("POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
			map[string]any{"outcome": "succeeded", "result": map[string]any{"text": text}})
	}
	errCode(t, resolve(strings.Repeat("x", gate.MaxResultBytes)), http.StatusRequestEntityTooLarge, "payload_too_large")
	e := b.get(id)
	require.Equal(t, "indeterminate", e["state"])
	require.Nil(t, e["attempts"].([]any)[0].(map[string]any)["resolved_at"])
	fits := strings.Repeat("x", gate.MaxResultBytes-len(`{"text":""}`))
	r := resolve(fits)
	require.Equal(t, http.StatusOK, r.Status, "%.300s", r.Body)
	require.Equal(t, "succeeded", r.JSON()["state"])
	require.Equal(t, map[string]any{"text": fits}, b.mustBegin("duplicate", email(str(e["idempotency_key"])))["result"])
}

func TestReportRules(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("rules")
	d := b.mustBegin("execute", email(k))
	id, token := str(d["effect_id"]), str(d["lease_token"])

	unknown := errCode(t, b.report(id, "not-a-token", "succeeded", nil), http.StatusConflict, "lease_lost")
	require.Empty(t, unknown["detail"], "a token of no attempt says nothing more")
	require.Contains(t, validationFields(t, b.report(id, token, "maybe", nil)), "outcome")
	require.Contains(t, validationFields(t, b.report(id, "", "failed", nil)), "lease_token")
	big := map[string]any{"blob": string(bytes.Repeat([]byte("x"), 256<<10))}
	errCode(t, b.report(id, token, "succeeded", big), http.StatusRequestEntityTooLarge, "payload_too_large")
	errCode(t, b.report("eff_nope", token, "succeeded", nil), http.StatusNotFound, "not_found")
	errCode(t, b.report("eff_00000000000000000000000000", token, "succeeded", nil), http.StatusNotFound, "not_found")
	// Nothing above changed the effect.
	require.Equal(t, "leased", b.get(id)["state"])

	first := b.report(id, token, "failed", map[string]any{"why": "rejected by vendor"})
	require.Equal(t, http.StatusOK, first.Status, "%s", first.Body)
	b.clock.Add(time.Second)
	// Repeating the same outcome with the same token: 200 and the same object.
	again := b.report(id, token, "failed", map[string]any{"ignored": true})
	require.Equal(t, http.StatusOK, again.Status, "%s", again.Body)
	require.JSONEq(t, string(first.Body), string(again.Body))
	// A different outcome on a reported attempt is invalid_state and changes nothing.
	errCode(t, b.report(id, token, "succeeded", nil), http.StatusConflict, "invalid_state")
	require.Equal(t, "failed", b.get(id)["state"])
	errCode(t, b.env.Do("POST", "/api/v1/effects/"+id+"/heartbeat", b.ws.Key, map[string]any{"lease_token": token}),
		http.StatusConflict, "invalid_state")

	// A newer attempt supersedes the token. Its repeated report is
	// lease_lost, and says the attempt's report was recorded (QA: a client
	// whose answer a crash lost could not tell whether it had landed).
	d2 := b.mustBegin("execute", email(k))
	lost := errCode(t, b.report(id, token, "failed", nil), http.StatusConflict, "lease_lost")
	require.Equal(t, map[string]any{"attempt": float64(1), "reported_outcome": "failed"}, lost["detail"])
	errCode(t, b.env.Do("POST", "/api/v1/effects/"+id+"/heartbeat", b.ws.Key, map[string]any{"lease_token": token}),
		http.StatusConflict, "lease_lost")
	require.Equal(t, http.StatusOK, b.report(id, str(d2["lease_token"]), "succeeded", nil).Status)
}

func TestHeartbeatExtendsLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("heartbeat")
	d := b.mustBegin("execute", email(k))
	id, token := str(d["effect_id"]), str(d["lease_token"])
	b.clock.Add(50 * time.Second)
	r := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/heartbeat", b.ws.Key, map[string]any{"lease_token": token})
	want := b.clock.Now().Add(60 * time.Second).Format(time.RFC3339)
	require.Equal(t, map[string]any{"effect_id": id, "lease_expires_at": want}, r.JSON())
	b.clock.Add(50 * time.Second) // 100 s after begin, alive thanks to the heartbeat
	require.Equal(t, "in_flight", b.begin(email(k)).JSON()["decision"])
	e := b.get(id)
	require.Equal(t, want, e["attempts"].([]any)[0].(map[string]any)["lease_expires_at"])
	require.Equal(t, http.StatusOK, b.report(id, token, "succeeded", nil).Status)
}

// A heartbeat extends a lease by the length it was granted (API.md §2.2:
// "Extend a live lease by its length from now"): a begin's shorter
// lease_seconds holds on each heartbeat, and a policy changed since changes
// neither a shortened lease nor a whole one.
func TestAHeartbeatExtendsByTheLeasesOwnLength(t *testing.T) {
	t.Parallel()
	b := setup(t)
	heartbeat := func(d map[string]any) any {
		t.Helper()
		return b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+str(d["effect_id"])+"/heartbeat", b.ws.Key,
			map[string]any{"lease_token": d["lease_token"]}).JSON()["lease_expires_at"]
	}
	short := email(key("short"))
	short["lease_seconds"] = 10
	s := b.mustBegin("execute", short)
	whole := b.mustBegin("execute", email(key("whole"))) // the policy's 60
	b.clock.Add(5 * time.Second)
	require.Equal(t, b.clock.Now().Add(10*time.Second).Format(time.RFC3339), heartbeat(s))
	b.putPolicy("email.send", map[string]any{"lease_seconds": 30})
	b.clock.Add(5 * time.Second)
	require.Equal(t, b.clock.Now().Add(10*time.Second).Format(time.RFC3339), heartbeat(s))
	require.Equal(t, b.clock.Now().Add(60*time.Second).Format(time.RFC3339), heartbeat(whole))
}

func TestResolveOnlyFromIndeterminate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	resolve := func(id string) {
		t.Helper()
		before := b.get(id)
		errCode(t, b.env.Do("POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "succeeded"}),
			http.StatusConflict, "invalid_state")
		require.Equal(t, before, b.get(id))
	}
	leased := b.mustBegin("execute", email(key("leased")))
	resolve(str(leased["effect_id"]))

	done := b.mustBegin("execute", email(key("done")))
	require.Equal(t, http.StatusOK, b.report(str(done["effect_id"]), str(done["lease_token"]), "succeeded", nil).Status)
	resolve(str(done["effect_id"]))

	failed := b.mustBegin("execute", email(key("failed")))
	require.Equal(t, http.StatusOK, b.report(str(failed["effect_id"]), str(failed["lease_token"]), "failed", nil).Status)
	resolve(str(failed["effect_id"]))

	b.putPolicy("wire.send", map[string]any{"mode": "require_approval"})
	waiting := b.mustBegin("approval_required", map[string]any{"effect_type": "wire.send", "idempotency_key": key("w")})
	resolve(str(waiting["effect_id"]))

	b.putPolicy("fax.send", map[string]any{"mode": "deny"})
	denied := b.mustBegin("denied", map[string]any{"effect_type": "fax.send", "idempotency_key": key("f")})
	resolve(str(denied["effect_id"]))

	errCode(t, b.env.Do("POST", "/api/v1/effects/eff_00000000000000000000000000/resolve", b.ws.Key,
		map[string]any{"outcome": "succeeded"}), http.StatusNotFound, "not_found")
	require.Contains(t, validationFields(t, b.env.Do("POST", "/api/v1/effects/"+str(leased["effect_id"])+"/resolve",
		b.ws.Key, map[string]any{"outcome": "indeterminate"})), "outcome")
}

// A retry refused after a lapse (attempts used up, the policy now denying,
// a breaker) answers denied but leaves the effect indeterminate: the prior
// attempt's unknown outcome stays listed and resolvable, and once resolved
// it answers for the key.
func TestRefusedRetryKeepsTheUnknownOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "retry", "max_attempts": 2})
	k := key("lapse")
	d := b.mustBegin("execute", email(k))
	b.clock.Add(2 * time.Minute)
	d2 := b.mustBegin("execute", email(k))
	require.EqualValues(t, 2, d2["attempt"])
	b.clock.Add(2 * time.Minute)

	refused := b.refusal("max_attempts_exceeded", "indeterminate", email(k))
	require.EqualValues(t, 2, refused["detail"].(map[string]any)["attempts"])
	id := str(d["effect_id"])
	require.Equal(t, "max_attempts_exceeded", b.get(id)["denial_code"], "stored beside the unknown outcome")
	// Final for the key: neither a denying policy nor a raised ceiling
	// changes the answer.
	b.putPolicy("email.send", map[string]any{"mode": "deny"})
	b.refusal("max_attempts_exceeded", "indeterminate", email(k))
	b.putPolicy("email.send", map[string]any{"mode": "allow", "max_attempts": 5})
	b.refusal("max_attempts_exceeded", "indeterminate", email(k))
	require.Equal(t, "indeterminate", b.get(id)["state"])
	listed := b.env.Must(http.StatusOK, "GET", "/api/v1/effects?state=indeterminate", b.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, listed, 1)
	require.Equal(t, id, listed[0].(map[string]any)["id"])

	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "succeeded", "result": map[string]any{"sent": true}})
	require.Nil(t, b.get(id)["denial_code"], "it succeeded: no denial stands")
	dup := b.mustBegin("duplicate", email(k))
	require.Equal(t, map[string]any{"sent": true}, dup["result"])

	// A denial the policy can lift is stored beside the unknown outcome
	// too, and lifts with it.
	b.putPolicy("sms.send", map[string]any{"on_indeterminate": "retry"})
	k2 := key("lapse")
	d = b.mustBegin("execute", map[string]any{"effect_type": "sms.send", "idempotency_key": k2})
	b.clock.Add(2 * time.Minute)
	b.putPolicy("sms.send", map[string]any{"mode": "deny"})
	b.refusal("policy_denied", "indeterminate", map[string]any{"effect_type": "sms.send", "idempotency_key": k2})
	require.Equal(t, "policy_denied", b.get(str(d["effect_id"]))["denial_code"])
	b.putPolicy("sms.send", map[string]any{"mode": "allow"})
	b.mustBegin("execute", map[string]any{"effect_type": "sms.send", "idempotency_key": k2})
	require.Nil(t, b.get(str(d["effect_id"]))["denial_code"])
}

// A retry after a lapse that waits for an approval keeps the unknown
// outcome in view: the effect stays indeterminate (listed, resolvable,
// unresolved in its group's rollback), one approval answers every begin
// meanwhile, and once approved the retry is a probe when the policy asks
// for one.
func TestApprovalWaitKeepsTheUnknownOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "probe"})
	group := b.newGroup("g", "")
	step := func(k string) map[string]any { return groupStep(group, email(k), nil) }
	first := b.mustBegin("execute", step(key("one")))
	require.Equal(t, http.StatusOK, b.report(str(first["effect_id"]), str(first["lease_token"]), "succeeded", nil).Status)
	k := key("two")
	d := b.mustBegin("execute", step(k))
	id := str(d["effect_id"])
	b.clock.Add(2 * time.Minute)

	b.putPolicy("email.send", map[string]any{"mode": "require_approval"})
	held := b.mustBegin("approval_required", step(k))
	require.Equal(t, "indeterminate", held["state"])
	again := b.mustBegin("approval_required", step(k))
	require.Equal(t, held["approval_id"], again["approval_id"], "one approval for the wait")
	require.Equal(t, "indeterminate", b.get(id)["state"])
	listed := b.env.Must(http.StatusOK, "GET", "/api/v1/effects?state=indeterminate", b.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, listed, 1)
	pending := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", b.ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, pending, 1)

	unwind := b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+group+"/unwind", b.ws.Key, nil).JSON()
	require.Equal(t, []any{id}, unwind["unresolved"], "a maybe stops the rollback")

	// Approved, the retry of an ungrouped key is the probe its policy
	// asks for.
	k = key("three")
	b.putPolicy("email.send", map[string]any{"mode": "allow"})
	b.mustBegin("execute", email(k))
	b.clock.Add(2 * time.Minute)
	b.putPolicy("email.send", map[string]any{"mode": "require_approval"})
	held = b.mustBegin("approval_required", email(k))
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(held["approval_id"])+"/approve", b.ws.Key, nil)
	probe := b.mustBegin("execute", email(k))
	require.Equal(t, true, probe["probe"])
	require.EqualValues(t, 1, probe["prior_attempt"].(map[string]any)["attempt"])
	require.EqualValues(t, 2, probe["attempt"])
}

// A retry after a lapse that needed an approval, then rejected: the
// rejection is final for the key, and the earlier attempt's unknown outcome
// is not buried under it.
func TestRejectedRetryKeepsTheUnknownOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "retry"})
	k := key("lapse")
	d := b.mustBegin("execute", email(k))
	id := str(d["effect_id"])
	b.clock.Add(2 * time.Minute)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/stop", b.ws.Key, map[string]any{"reason": "incident"})
	held := b.mustBegin("approval_required", email(k))
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(held["approval_id"])+"/reject", b.ws.Key, nil)

	require.Equal(t, "indeterminate", b.get(id)["state"])
	b.refusal("approval_rejected", "indeterminate", email(k))
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/release", b.ws.Key, nil)
	b.refusal("approval_rejected", "indeterminate", email(k))

	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "failed"})
	b.denialOf("approval_rejected", email(k)) // final: the effect is denied now
	require.Equal(t, "denied", b.get(id)["state"])
}

// A pending approval holds an indeterminate key whatever the policy says
// meanwhile, as it holds an awaiting_approval one: granting past it left it
// pending, and a rejection decided later denied the key for good.
func TestPendingApprovalHoldsAnIndeterminateKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "retry"})
	k := key("stale")
	b.mustBegin("execute", email(k))
	b.clock.Add(2 * time.Minute)
	b.putPolicy("email.send", map[string]any{"mode": "require_approval", "on_indeterminate": "retry"})
	held := b.mustBegin("approval_required", email(k))
	b.putPolicy("email.send", map[string]any{"mode": "allow", "on_indeterminate": "retry"})
	b.mustBegin("approval_required", email(k))
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(held["approval_id"])+"/approve", b.ws.Key, nil)
	b.mustBegin("execute", email(k))
}

// Resolved failed, an indeterminate key refused with max_attempts_exceeded
// stays refused: the code outlives the resolve, which clears any other.
func TestResolvedFailureKeepsAFinalRefusal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "retry", "max_attempts": 1})
	k := key("final")
	id := str(b.mustBegin("execute", email(k))["effect_id"])
	b.clock.Add(2 * time.Minute)
	b.refusal("max_attempts_exceeded", "indeterminate", email(k))
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "failed"})
	require.Equal(t, "max_attempts_exceeded", b.get(id)["denial_code"])
	b.putPolicy("email.send", map[string]any{"max_attempts": 5})
	b.denialOf("max_attempts_exceeded", email(k))
}

// A retry that waited on the effect's row is granted a lease measured from
// when it got the row, not from its clock reading before the wait.
func TestARetryThatWaitedOnTheEffectsRowGetsAWholeLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := email(key("row"))
	body["lease_seconds"] = 5
	d := b.mustBegin("execute", body)
	require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)

	ctx := t.Context()
	holder, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck // committed below
	_, err = holder.Exec(ctx, `SELECT 1 FROM effects WHERE id = $1 FOR UPDATE`, str(d["effect_id"]))
	require.NoError(t, err)
	done := make(chan *apitest.Response, 1)
	go func() { done <- b.begin(body) }()
	require.Eventually(t, func() bool {
		var n int
		_ = b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple')
			  AND datname = current_database() AND query LIKE '%gate_begin_locked%'`).Scan(&n)
		return n > 0
	}, 5*time.Second, 10*time.Millisecond)
	b.clock.Add(6 * time.Second)
	require.NoError(t, holder.Commit(ctx))
	r := <-done
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	again := r.JSON()
	require.Equal(t, "execute", again["decision"])
	require.EqualValues(t, 2, again["attempt"])
	require.Equal(t, b.clock.Now().Add(5*time.Second).Format(time.RFC3339), again["lease_expires_at"])
}

// A heartbeat never shortens a lease: one that carries an older clock
// reading than a heartbeat already recorded (it waited for the effect's row
// behind it, or its instance's clock is behind) leaves the later expiry.
func TestALateHeartbeatNeverShortensTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := b.mustBegin("execute", email(key("late-heartbeat")))
	id, token := str(d["effect_id"]), str(d["lease_token"])
	t0 := b.clock.Now()
	heartbeat := func() any {
		return b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/heartbeat", b.ws.Key,
			map[string]any{"lease_token": token}).JSON()["lease_expires_at"]
	}
	b.clock.Set(t0.Add(30 * time.Second))
	want := t0.Add(90 * time.Second).Format(time.RFC3339)
	require.Equal(t, want, heartbeat())
	b.clock.Set(t0.Add(10 * time.Second))
	require.Equal(t, want, heartbeat())
	require.Equal(t, want, b.get(id)["attempts"].([]any)[0].(map[string]any)["lease_expires_at"])
}

// A begin that names its request_id and is retried after its answer was
// lost gets the same execute, token included, while the lease is live (it
// was in_flight, then indeterminate, though the action never ran); any
// other request, or one without the id, is in_flight. A new attempt on the
// locked path rejoins the same way, a lapsed lease does not, and the id is
// not part of the operation (no idempotency_key_reuse).
func TestARetriedBeginGetsTheExecuteItsAnswerLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("lost-answer")
	body := email(k)
	body["request_id"] = "req-one-0123456789"
	first := b.mustBegin("execute", body)
	again := b.mustBegin("execute", body)
	require.Equal(t, first, again, "the same answer, token included")
	other := email(k)
	b.mustBegin("in_flight", other)
	other["request_id"] = "req-two-0123456789"
	b.mustBegin("in_flight", other)
	// The same id from another key of the workspace is another caller.
	cross := b.env.Do("POST", "/api/v1/effects/begin", b.agent(), body)
	require.Equal(t, http.StatusOK, cross.Status, "%s", cross.Body)
	require.Equal(t, "in_flight", cross.JSON()["decision"])

	// The token it got back works: a failure, then a retry under a new id.
	id := str(first["effect_id"])
	require.Equal(t, http.StatusOK, b.report(id, str(again["lease_token"]), "failed", nil).Status)
	retry := email(k)
	retry["request_id"] = "req-three-0123456789"
	second := b.mustBegin("execute", retry)
	require.EqualValues(t, 2, second["attempt"])
	require.Equal(t, second, b.mustBegin("execute", retry))
	b.mustBegin("in_flight", body) // the first request's id names attempt 1, not this lease

	// Once the lease lapsed, the retry is any other begin: the outcome is unknown.
	b.clock.Add(2 * time.Minute)
	require.Equal(t, "blocked", b.begin(retry).JSON()["decision"])

	// Characters are counted, as the schema's minLength counts them: eight
	// two-byte ones are sixteen bytes but eight characters (MCP QA).
	for _, bad := range []string{"", "1", "fifteen-chars-x", strings.Repeat("é", 8)} {
		errCode(t, b.begin(map[string]any{"effect_type": "email.send", "idempotency_key": key("bad"),
			"request_id": bad}), http.StatusBadRequest, "invalid_request")
	}

	// A probe rejoins with the attempt it probes.
	b.putPolicy("sms.send", map[string]any{"on_indeterminate": "probe"})
	lapsed := b.mustBegin("execute", sms(key("probed")))
	b.clock.Add(2 * time.Minute)
	probeBody := sms(str(b.get(str(lapsed["effect_id"]))["idempotency_key"]))
	probeBody["request_id"] = "req-probe-0123456789"
	probe := b.mustBegin("execute", probeBody)
	require.Equal(t, true, probe["probe"])
	require.EqualValues(t, 1, probe["prior_attempt"].(map[string]any)["attempt"])
	require.Equal(t, probe, b.mustBegin("execute", probeBody))
}

// A grant that queued on a daily ceiling's counter (charged last, behind
// another grant's uncommitted charge) for longer than a second answers a
// lease measured from when it ended, on the fast path for a new key and on
// the locked path for a retry (review: the answer's lease had lapsed).
func TestAGrantThatWaitedOnADailyCounterGetsAWholeLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"daily_budget_micros": 1_000_000, "lease_seconds": 5})
	first := b.mustBegin("execute", charge(key("counter"), 10)) // the counter exists from here
	retried := charge(key("retried"), 10)
	d := b.mustBegin("execute", retried)
	require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)

	for _, body := range []map[string]any{charge(key("fresh"), 10), retried} {
		ctx := t.Context()
		holder, err := b.env.App.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = holder.Exec(ctx, `SELECT 1 FROM gate_spend WHERE workspace_id = $1 FOR UPDATE`, b.ws.ID)
		require.NoError(t, err)
		done := make(chan *apitest.Response, 1)
		go func() { done <- b.begin(body) }()
		waiting := func() bool {
			var n int
			_ = b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n)
			return n > 0
		}
		if !assert.Eventually(t, waiting, 5*time.Second, 10*time.Millisecond, "the begin queues on the counter") {
			_ = holder.Rollback(ctx)
			<-done
			t.FailNow()
		}
		time.Sleep(1200 * time.Millisecond) // real time; the test's clock stands still
		require.NoError(t, holder.Commit(ctx))
		r := <-done
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		got := r.JSON()
		require.Equal(t, "execute", got["decision"])
		exp, err := time.Parse(time.RFC3339, str(got["lease_expires_at"]))
		require.NoError(t, err)
		require.False(t, exp.Before(b.clock.Now().Add(6*time.Second)), "lease from before the wait: %s", exp)
		require.Equal(t, got["lease_expires_at"], b.get(str(got["effect_id"]))["lease_expires_at"])
	}
	require.Equal(t, "in_flight", b.mustBegin("in_flight", charge(str(b.get(str(first["effect_id"]))["idempotency_key"]), 10))["decision"])
}

// A grant that waited so long that its attempt is no longer leased when its
// lease is measured again (the sweeper found it lapsed meanwhile) is not
// answered as granted: begin is asked again (review: execute was answered
// with a worthless token). A live lease is lengthened instead.
func TestASlowGrantWhoseLeaseIsGoneAsksForTheBeginAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := b.env.App.Server.Gate
	live := b.mustBegin("execute", email(key("slow-live")))
	gone := b.mustBegin("execute", email(key("slow-gone")))
	require.Equal(t, http.StatusOK, b.report(str(gone["effect_id"]), str(gone["lease_token"]), "failed", nil).Status)

	sent := time.Now().Add(-3 * time.Second)
	err := g.AfterSlowGrant(t.Context(), str(gone["effect_id"]), 1, sent)
	e, ok := apierr.As(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, apierr.CodeRetryRequest, e.Code)
	require.Equal(t, "failed", b.get(str(gone["effect_id"]))["state"])

	require.NoError(t, g.AfterSlowGrant(t.Context(), str(live["effect_id"]), 1, sent))
	exp, err := time.Parse(time.RFC3339, str(b.get(str(live["effect_id"]))["lease_expires_at"]))
	require.NoError(t, err)
	require.False(t, exp.Before(b.clock.Now().Add(8*time.Second)), "lease not measured again: %s", exp)
}

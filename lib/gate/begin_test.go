package gate_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/ids"
)

func TestBeginExecuteReportDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("welcome")
	d := b.mustBegin("execute", email(k))
	require.Equal(t, "leased", d["state"])
	require.EqualValues(t, 1, d["attempt"])
	require.Equal(t, false, d["probe"])
	require.NotEmpty(t, d["lease_token"])
	require.NotEmpty(t, d["lease_expires_at"])
	id := str(d["effect_id"])

	again := b.mustBegin("in_flight", email(k))
	require.Equal(t, id, again["effect_id"])
	require.EqualValues(t, 60, again["retry_after_seconds"])

	r := b.report(id, str(d["lease_token"]), "succeeded", map[string]any{"message_id": "m_1"})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	e := r.JSON()
	require.Equal(t, "succeeded", e["state"])
	require.Equal(t, map[string]any{"message_id": "m_1"}, e["result"])
	attempts := e["attempts"].([]any)
	require.Len(t, attempts, 1)
	require.Equal(t, "succeeded", attempts[0].(map[string]any)["outcome"])

	dup := b.mustBegin("duplicate", email(k))
	require.Equal(t, map[string]any{"message_id": "m_1"}, dup["result"])
	require.Equal(t, "succeeded", dup["state"])
	require.EqualValues(t, 1, dup["attempt"])
}

func TestBeginValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	long := make([]byte, 256)
	for i := range long {
		long[i] = 'k'
	}
	cases := []struct {
		name  string
		body  any
		field string
	}{
		{"no type", map[string]any{"idempotency_key": "k"}, "effect_type"},
		{"bad type", map[string]any{"effect_type": "a b", "idempotency_key": "k"}, "effect_type"},
		{"slash type", map[string]any{"effect_type": "a/b", "idempotency_key": "k"}, "effect_type"},
		{"no key", map[string]any{"effect_type": "email.send"}, "idempotency_key"},
		{"long key", map[string]any{"effect_type": "email.send", "idempotency_key": string(long)}, "idempotency_key"},
		{"control key", map[string]any{"effect_type": "email.send", "idempotency_key": "a\nb"}, "idempotency_key"},
		{"negative cost", map[string]any{"effect_type": "email.send", "idempotency_key": "k", "cost_micros": -1}, "cost_micros"},
		{"fractional cost", map[string]any{"effect_type": "email.send", "idempotency_key": "k", "cost_micros": 1.5}, "cost_micros"},
		{"dimension type", map[string]any{"effect_type": "email.send", "idempotency_key": "k", "dimensions": map[string]any{"r": 1}}, "dimensions.r"},
		{"compensation outside a group", map[string]any{"effect_type": "email.send", "idempotency_key": "k",
			"compensation": map[string]any{"effect_type": "email.retract"}}, "compensation"},
		{"empty dimension", map[string]any{"effect_type": "email.send", "idempotency_key": "k", "dimensions": map[string]any{"r": ""}}, "dimensions.r"},
		{"lease", map[string]any{"effect_type": "email.send", "idempotency_key": "k", "lease_seconds": 0}, "lease_seconds"},
		{"run id", map[string]any{"effect_type": "email.send", "idempotency_key": "k", "run_id": ""}, "run_id"},
		{"group id", map[string]any{"effect_type": "email.send", "idempotency_key": "k", "group_id": ""}, "group_id"},
		{"an id beside a problem", map[string]any{"effect_type": "a b", "idempotency_key": "k", "run_id": "run_missing"}, "effect_type"},
		{"unknown field", map[string]any{"effect_type": "email.send", "idempotency_key": "k", "colour": 1}, "colour"},
	}
	for _, c := range cases {
		r := b.env.Do("POST", "/api/v1/effects/begin", b.ws.Key, c.body)
		require.Contains(t, validationFields(t, r), c.field, c.name)
	}
	// A field left out is required; one sent wrong is told the rule (MCP
	// QA: a left-out key was told the rule, a left-out id "is required").
	r := b.env.Do("POST", "/api/v1/effects/begin", b.ws.Key, map[string]any{})
	require.Equal(t, []any{map[string]any{"field": "effect_type", "message": "is required"},
		map[string]any{"field": "idempotency_key", "message": "is required"}},
		errCode(t, r, http.StatusBadRequest, "invalid_request")["detail"].(map[string]any)["validation"])
	r = b.env.Do("POST", "/api/v1/effects/begin", b.ws.Key, map[string]any{"effect_type": "a b", "idempotency_key": string(long)})
	require.Equal(t, []any{map[string]any{"field": "effect_type", "message": "must be 1-100 characters: letters, digits, . _ : -"},
		map[string]any{"field": "idempotency_key", "message": "must be 1-255 printable characters"}},
		errCode(t, r, http.StatusBadRequest, "invalid_request")["detail"].(map[string]any)["validation"])
	// 255 characters is the limit, not 255 bytes.
	b.mustBegin("execute", map[string]any{"effect_type": "email.send", "idempotency_key": string(long[:254]) + "é"})
	// Nothing was stored by the refusals.
	list := b.env.Must(http.StatusOK, "GET", "/api/v1/effects", b.ws.Key, nil).JSON()
	require.Len(t, list["data"], 1)
}

// An id in the body that names nothing is unknown whatever its form
// (API.md §0): "grp_missing" is answered as a well-formed id of no group
// is, 404, never a 400 telling the ids' form (contract QA), and nothing
// is stored.
func TestBeginWithAnUnknownIdOfAnyFormIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, c := range []struct{ field, id, what string }{
		{"run_id", "run_missing", "run"}, {"run_id", "run_00000000000000000000000000", "run"},
		{"group_id", "grp_missing", "group"}, {"group_id", "eff_00000000000000000000000000", "group"},
		{"group_id", "grp_00000000000000000000000000", "group"},
		{"compensates_effect_id", "eff_missing", "effect"}, {"compensates_effect_id", "x", "effect"},
	} {
		r := b.begin(map[string]any{"effect_type": "email.send", "idempotency_key": "k-" + c.field, c.field: c.id})
		errCode(t, r, http.StatusNotFound, "not_found")
		require.Contains(t, string(r.Body), "No such "+c.what+" in this workspace.", "%s %s", c.field, c.id)
	}
	list := b.env.Must(http.StatusOK, "GET", "/api/v1/effects", b.ws.Key, nil).JSON()
	require.Empty(t, list["data"])
}

func TestIdempotencyKeyReuseAndCanonicalFingerprint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("reuse")
	first := `{"effect_type":"email.send","idempotency_key":"` + k + `","payload":{"a":1,"b":[1,2],"c":{"x":1.0,"y":2}},"cost_micros":5}`
	d := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", b.ws.Key, first).JSON()
	require.Equal(t, "execute", d["decision"])
	// The same document with keys reordered and 1.0 written as 1 is the same fingerprint.
	same := `{"idempotency_key":"` + k + `","cost_micros":5,"payload":{"c":{"y":2,"x":1},"b":[1,2],"a":1},"effect_type":"email.send"}`
	require.Equal(t, "in_flight", b.env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", b.ws.Key, same).JSON()["decision"])

	for _, other := range []map[string]any{
		{"effect_type": "email.send", "idempotency_key": k, "payload": map[string]any{"a": 1, "b": []int{2, 1}, "c": map[string]any{"x": 1, "y": 2}}, "cost_micros": 5},
		{"effect_type": "email.send", "idempotency_key": k, "payload": map[string]any{"a": 1, "b": []int{1, 2}, "c": map[string]any{"x": 1, "y": 2}}, "cost_micros": 6},
		{"effect_type": "email.send", "idempotency_key": k, "payload": map[string]any{"a": 1, "b": []int{1, 2}, "c": map[string]any{"x": 1, "y": 2}}},
		{"effect_type": "sms.send", "idempotency_key": k, "payload": map[string]any{"a": 1, "b": []int{1, 2}, "c": map[string]any{"x": 1, "y": 2}}, "cost_micros": 5},
		{"effect_type": "email.send", "idempotency_key": k, "payload": map[string]any{"a": 1, "b": []int{1, 2}, "c": map[string]any{"x": 1, "y": 2}}, "cost_micros": 5, "dimensions": map[string]any{"to": "x"}},
	} {
		errCode(t, b.begin(other), http.StatusConflict, "idempotency_key_reuse")
	}
	// Keys are per workspace: another tenant may use the same key.
	ws2 := b.env.Signup()
	r := b.env.Do("POST", "/api/v1/effects/begin", ws2.Key, first)
	require.Equal(t, "execute", r.JSON()["decision"], "%s", r.Body)
}

// The fingerprint is stored keyed, so the database gives no way to confirm
// a guessed payload; one an earlier release stored as a plain SHA-256 of
// the canonical operation still recognises its key's retries and reuse.
func TestFingerprintsAreStoredKeyed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("keyed")
	body := map[string]any{"effect_type": "email.send", "idempotency_key": k, "payload": map[string]any{"to": "u1"},
		"cost_micros": 5}
	id := str(b.mustBegin("execute", body)["effect_id"])
	canon := `{"cost_micros":5,"dimensions":{},"effect_type":"email.send","payload":{"to":"u1"}}`
	sum := sha256.Sum256([]byte(canon))
	plain := hex.EncodeToString(sum[:])
	var stored string
	require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), `SELECT fingerprint FROM effects WHERE id = $1`,
		id).Scan(&stored))
	require.True(t, strings.HasPrefix(stored, "k1:"), stored)
	require.NotContains(t, stored, plain)
	b.mustBegin("in_flight", body)
	other := map[string]any{"effect_type": "email.send", "idempotency_key": k, "payload": map[string]any{"to": "u2"},
		"cost_micros": 5}
	errCode(t, b.begin(other), http.StatusConflict, "idempotency_key_reuse")

	// As an earlier release stored it.
	_, err := b.env.App.Pool.Exec(context.Background(), `UPDATE effects SET fingerprint = $2 WHERE id = $1`, id, plain)
	require.NoError(t, err)
	b.mustBegin("in_flight", body)
	errCode(t, b.begin(other), http.StatusConflict, "idempotency_key_reuse")
}

func TestLeaseSecondsCanOnlyTighten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := b.clock.Now()
	short := email(key("short"))
	short["lease_seconds"] = 10
	d := b.mustBegin("execute", short)
	require.Equal(t, now.Add(10*time.Second).Format(time.RFC3339), d["lease_expires_at"])

	long := email(key("long"))
	long["lease_seconds"] = 3000
	d = b.mustBegin("execute", long)
	require.Equal(t, now.Add(60*time.Second).Format(time.RFC3339), d["lease_expires_at"])

	huge := email(key("huge"))
	huge["lease_seconds"] = 1 << 40
	d = b.mustBegin("execute", huge)
	require.Equal(t, now.Add(60*time.Second).Format(time.RFC3339), d["lease_expires_at"], "capped, not refused")

	b.putPolicy("email.send", map[string]any{"lease_seconds": 120})
	d = b.mustBegin("execute", email(key("policy")))
	require.Equal(t, now.Add(120*time.Second).Format(time.RFC3339), d["lease_expires_at"])
}

func TestFailedRetrySucceededDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("invoice")
	d1 := b.mustBegin("execute", email(k))
	id := str(d1["effect_id"])
	r := b.report(id, str(d1["lease_token"]), "failed", map[string]any{"error": "smtp 550"})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, "failed", r.JSON()["state"])

	b.clock.Add(time.Second)
	d2 := b.mustBegin("execute", email(k))
	require.Equal(t, id, d2["effect_id"])
	require.EqualValues(t, 2, d2["attempt"])
	require.NotEqual(t, d1["lease_token"], d2["lease_token"])

	result := map[string]any{"message_id": "m_42", "nested": map[string]any{"ok": true, "n": []any{1.0, "two"}}}
	r = b.report(id, str(d2["lease_token"]), "succeeded", result)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)

	for i := 0; i < 3; i++ {
		dup := b.mustBegin("duplicate", email(k))
		require.Equal(t, result, dup["result"])
		require.EqualValues(t, 2, dup["attempt"])
	}
	e := b.get(id)
	require.Equal(t, result, e["result"])
	attempts := e["attempts"].([]any)
	require.Len(t, attempts, 2)
	require.Equal(t, "failed", attempts[0].(map[string]any)["outcome"])
	require.Equal(t, "succeeded", attempts[1].(map[string]any)["outcome"])
}

func TestDuplicateWithoutResultAnswersNull(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("noresult")
	d := b.mustBegin("execute", email(k))
	require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "succeeded", nil).Status)
	r := b.begin(email(k))
	require.Contains(t, string(r.Body), `"result":null`)
}

func TestMaxAttemptsIsFinal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"max_attempts": 2})
	k := key("max")
	for i := 1; i <= 2; i++ {
		d := b.mustBegin("execute", email(k))
		require.EqualValues(t, i, d["attempt"])
		require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)
	}
	d := b.mustBegin("denied", email(k))
	require.Equal(t, "denied", d["state"])
	require.EqualValues(t, 2, d["attempt"])
	require.Equal(t, "max_attempts_exceeded", d["error"].(map[string]any)["code"])

	// Final for the key, even once the ceiling is raised.
	b.putPolicy("email.send", map[string]any{"max_attempts": 5})
	d = b.mustBegin("denied", email(k))
	require.Equal(t, "max_attempts_exceeded", d["error"].(map[string]any)["code"])
	e := b.get(str(d["effect_id"]))
	require.Equal(t, "denied", e["state"])
	require.Equal(t, "max_attempts_exceeded", e["denial_code"])
}

func TestDuplicateReturnsTheRecordedResultVerbatim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := key("verbatim")
	d := b.mustBegin("execute", email(k))
	raw := `{"lease_token":"` + str(d["lease_token"]) + `","outcome":"succeeded","result":{"z":1,"a":[3,2,1],"m":{"y":"é","b":null}}}`
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+str(d["effect_id"])+"/report", b.ws.Key, raw)
	r := b.begin(email(k))
	require.Contains(t, string(r.Body), `"result":{"z":1,"a":[3,2,1],"m":{"y":"é","b":null}}`)
}

func TestLockedPathAnswersRetryRequestWhenTheKeyVanished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := &auth.Principal{WorkspaceID: b.ws.ID, KeyID: keyID(b.ws.Key)}
	_, err := b.env.App.Server.Gate.BeginLocked(context.Background(), p, gate.BeginRequest{
		EffectType: "email.send", IdempotencyKey: key("vanished")})
	e, ok := apierr.As(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, apierr.CodeRetryRequest, e.Code)
	require.Equal(t, http.StatusConflict, e.Status)
}

// run_id names a run of the workspace: another workspace's run, or one that
// never existed, is 404 like every unknown id, and nothing is written.
func TestBeginRunMustBeKnown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mine := b.env.Must(http.StatusCreated, "POST", "/api/v1/runs", b.ws.Key, map[string]any{"name": "r"}).JSON()["id"].(string)
	other := b.env.Signup()
	theirs := b.env.Must(http.StatusCreated, "POST", "/api/v1/runs", other.Key, map[string]any{"name": "r"}).JSON()["id"].(string)
	for _, run := range []string{theirs, ids.New(ids.Run)} {
		body := email(key("run"))
		body["run_id"] = run
		errCode(t, b.begin(body), http.StatusNotFound, "not_found")
	}
	require.Empty(t, b.env.Must(http.StatusOK, "GET", "/api/v1/effects", b.ws.Key, nil).JSON()["data"])
	body := email(key("run"))
	body["run_id"] = mine
	d := b.mustBegin("execute", body)
	require.Equal(t, mine, b.env.Must(http.StatusOK, "GET", "/api/v1/effects/"+str(d["effect_id"]), b.ws.Key, nil).JSON()["run_id"])
}

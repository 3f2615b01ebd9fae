package gate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/jsonstrict"
)

func TestPolicyDefaultAndStarters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.env.Must(http.StatusOK, "GET", "/api/v1/policies/never.configured", b.ws.Key, nil).JSON()
	require.Equal(t, map[string]any{
		"effect_type": "never.configured", "version": 0.0, "mode": "allow", "on_indeterminate": "block",
		"lease_seconds": 60.0, "max_attempts": 5.0, "max_cost_micros": nil, "approval_above_micros": nil,
		"daily_budget_micros": nil, "reconcile_every_hours": nil, "require_cost": false,
		"required_dimensions": []any{}, "dimension_limits": map[string]any{}, "structuring_threshold_micros": nil,
		"surge_per_hour": nil, "surge_multiplier": nil, "surge_action": "require_approval",
		"surge_cooldown_seconds": 3600.0, "retention_days": 90.0, "updated_at": nil, "last_reconciled_at": nil,
	}, p)

	list := b.env.Must(http.StatusOK, "GET", "/api/v1/policies", b.ws.Key, nil).JSON()
	var types []string
	for _, x := range list["data"].([]any) {
		types = append(types, x.(map[string]any)["effect_type"].(string))
		require.EqualValues(t, 1, x.(map[string]any)["version"])
		require.Equal(t, true, x.(map[string]any)["require_cost"])
	}
	require.Equal(t, []string{"payment.charge", "refund.issue"}, types)
	page := b.env.Must(http.StatusOK, "GET", "/api/v1/policies?limit=1", b.ws.Key, nil).JSON()
	require.Len(t, page["data"], 1)
	require.Equal(t, "payment.charge", page["next_cursor"])
	page = b.env.Must(http.StatusOK, "GET", "/api/v1/policies?limit=1&cursor=payment.charge", b.ws.Key, nil).JSON()
	require.Equal(t, "refund.issue", page["data"].([]any)[0].(map[string]any)["effect_type"])
	require.Nil(t, page["next_cursor"])

	// A starter policy is enforced: a charge must declare its cost.
	errCode(t, b.begin(map[string]any{"effect_type": "payment.charge", "idempotency_key": key("c")}),
		http.StatusBadRequest, "cost_required")
}

func TestPolicyPutMergesAndVersions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.putPolicy("sms.send", map[string]any{"mode": "require_approval", "max_cost_micros": 5_000_000,
		"required_dimensions": []string{"recipient"}, "dimension_limits": map[string]any{
			"recipient": map[string]any{"daily_micros": 1_000_000, "daily_count": 20}},
		"reconcile_every_hours": 24, "surge_multiplier": 3, "surge_per_hour": 100, "structuring_threshold_micros": 900,
		"daily_budget_micros": 50_000_000, "retention_days": 30, "surge_cooldown_seconds": 600, "surge_action": "deny"})
	require.EqualValues(t, 1, p["version"])
	require.Equal(t, "require_approval", p["mode"])
	require.Equal(t, "block", p["on_indeterminate"])
	require.EqualValues(t, 5_000_000, p["max_cost_micros"])
	require.Equal(t, map[string]any{"recipient": map[string]any{"daily_micros": 1e6, "daily_count": 20.0}}, p["dimension_limits"])

	// Omitted keeps, null clears, expected_version must match.
	p = b.putPolicy("sms.send", map[string]any{"expected_version": 1, "max_cost_micros": nil, "lease_seconds": 30,
		"required_dimensions": nil})
	require.EqualValues(t, 2, p["version"])
	require.Nil(t, p["max_cost_micros"])
	require.EqualValues(t, 30, p["lease_seconds"])
	require.Equal(t, "require_approval", p["mode"])
	require.Equal(t, []any{}, p["required_dimensions"])
	require.EqualValues(t, 24, p["reconcile_every_hours"])
	require.Equal(t, "deny", p["surge_action"])

	// A stale expected_version is a conflict even for a PUT that would
	// change nothing (API.md §5: when sent, it must equal the version).
	errCode(t, b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, map[string]any{"expected_version": 1,
		"lease_seconds": 30}), http.StatusConflict, "version_conflict")
	r := b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, map[string]any{"expected_version": 1, "mode": "deny"})
	e := errCode(t, r, http.StatusConflict, "version_conflict")
	require.EqualValues(t, 2, e["detail"].(map[string]any)["current_version"])
	require.Equal(t, "require_approval", b.env.Must(http.StatusOK, "GET", "/api/v1/policies/sms.send", b.ws.Key, nil).JSON()["mode"])
	// Input invalid whatever the version is refused as such, stale or not
	// (fuzz QA: it answered version_conflict).
	errCode(t, b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, map[string]any{"expected_version": 1,
		"lease_seconds": 0}), http.StatusBadRequest, "invalid_request")

	// A PUT that changes nothing (no field, a body of null, or the values
	// already set) makes no new version (QA); a body of [] is refused.
	require.EqualValues(t, 2, b.putPolicy("sms.send", map[string]any{})["version"])
	require.EqualValues(t, 2, b.env.Must(http.StatusOK, "PUT", "/api/v1/policies/sms.send", b.ws.Key, "null").JSON()["version"])
	same := b.putPolicy("sms.send", map[string]any{"expected_version": 2, "lease_seconds": 30, "mode": "require_approval",
		"dimension_limits": map[string]any{"recipient": map[string]any{"daily_micros": 1_000_000, "daily_count": 20}}})
	require.EqualValues(t, 2, same["version"])
	require.Equal(t, p["updated_at"], same["updated_at"])
	require.Equal(t, []string{"body"}, validationFields(t, b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, "[]")))
	require.EqualValues(t, 2, b.env.Must(http.StatusOK, "GET", "/api/v1/policies/sms.send", b.ws.Key, nil).JSON()["version"])

	// expected_version 0 creates only when unconfigured.
	p = b.putPolicy("push.send", map[string]any{"expected_version": 0})
	require.EqualValues(t, 1, p["version"])
	errCode(t, b.env.Do("PUT", "/api/v1/policies/push.send", b.ws.Key, map[string]any{"expected_version": 0}),
		http.StatusConflict, "version_conflict")
	// A version no policy ever had is a malformed request, not a stale one.
	require.Equal(t, []string{"expected_version"}, validationFields(t, b.env.Do("PUT", "/api/v1/policies/push.send",
		b.ws.Key, map[string]any{"expected_version": -1, "mode": "deny"})))
	// Told in the words the decoder tells 1.5 in, whichever refuses it.
	message := func(v any) any {
		e := errCode(t, b.env.Do("PUT", "/api/v1/policies/push.send", b.ws.Key, map[string]any{"expected_version": v}),
			http.StatusBadRequest, "invalid_request")
		return e["detail"].(map[string]any)["validation"].([]any)[0].(map[string]any)["message"]
	}
	require.Equal(t, message(1.5), message(-1))
	require.EqualValues(t, 1, b.env.Must(http.StatusOK, "GET", "/api/v1/policies/push.send", b.ws.Key, nil).JSON()["version"])
}

func TestPolicyValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nine := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}
	limits := map[string]any{}
	for _, d := range nine {
		limits[d] = map[string]any{"daily_count": 1}
	}
	cases := []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"mode": "sometimes"}, "mode"},
		{map[string]any{"mode": nil}, "mode"},
		{map[string]any{"on_indeterminate": "guess"}, "on_indeterminate"},
		{map[string]any{"lease_seconds": 4}, "lease_seconds"},
		{map[string]any{"lease_seconds": 3601}, "lease_seconds"},
		{map[string]any{"lease_seconds": nil}, "lease_seconds"},
		{map[string]any{"max_attempts": 0}, "max_attempts"},
		{map[string]any{"max_attempts": 51}, "max_attempts"},
		{map[string]any{"surge_per_hour": 0}, "surge_per_hour"},
		{map[string]any{"surge_per_hour": 2147483648}, "surge_per_hour"},
		{map[string]any{"surge_multiplier": 1}, "surge_multiplier"},
		{map[string]any{"surge_multiplier": 2147483648}, "surge_multiplier"},
		{map[string]any{"max_cost_micros": -1}, "max_cost_micros"},
		{map[string]any{"approval_above_micros": -1}, "approval_above_micros"},
		{map[string]any{"daily_budget_micros": -5}, "daily_budget_micros"},
		{map[string]any{"reconcile_every_hours": 0}, "reconcile_every_hours"},
		{map[string]any{"reconcile_every_hours": 8761}, "reconcile_every_hours"},
		{map[string]any{"require_cost": nil}, "require_cost"},
		{map[string]any{"require_cost": "yes"}, "require_cost"},
		{map[string]any{"required_dimensions": nine}, "required_dimensions"},
		{map[string]any{"required_dimensions": []string{"ok", "bad name"}}, "required_dimensions.1"},
		{map[string]any{"required_dimensions": []string{"a", "a"}}, "required_dimensions.1"},
		{map[string]any{"dimension_limits": limits}, "dimension_limits"},
		{map[string]any{"dimension_limits": map[string]any{"r": map[string]any{"daily_count": 0}}}, "dimension_limits.r.daily_count"},
		{map[string]any{"dimension_limits": map[string]any{"r": map[string]any{"daily_micros": -1}}}, "dimension_limits.r.daily_micros"},
		{map[string]any{"dimension_limits": map[string]any{"r": map[string]any{"daily_microz": 1}}}, "dimension_limits.r.daily_microz"},
		{map[string]any{"dimension_limits": map[string]any{"r": 5}}, "dimension_limits.r"},
		{map[string]any{"dimension_limits": map[string]any{"r": map[string]any{}}}, "dimension_limits.r"},
		{map[string]any{"dimension_limits": map[string]any{"r": map[string]any{"daily_micros": nil, "daily_count": nil}}},
			"dimension_limits.r"},
		{map[string]any{"structuring_threshold_micros": -1}, "structuring_threshold_micros"},
		{map[string]any{"surge_per_hour": 0}, "surge_per_hour"},
		{map[string]any{"surge_multiplier": 1}, "surge_multiplier"},
		{map[string]any{"surge_action": "panic"}, "surge_action"},
		{map[string]any{"surge_cooldown_seconds": 59}, "surge_cooldown_seconds"},
		{map[string]any{"surge_cooldown_seconds": 86401}, "surge_cooldown_seconds"},
		{map[string]any{"retention_days": 0}, "retention_days"},
		{map[string]any{"retention_days": 401}, "retention_days"},
		{map[string]any{"colour": "red"}, "colour"},
	}
	for _, c := range cases {
		r := b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, c.body)
		require.Contains(t, validationFields(t, r), c.field, "%v", c.body)
	}
	// A limit's names are exact and named once, as everywhere in a body.
	for body, field := range map[string]string{
		`{"dimension_limits":{"recipient":{"Daily_Micros":5}}}`:                  "dimension_limits.recipient.Daily_Micros",
		`{"dimension_limits":{"recipient":{"daily_micros":5,"daily_micros":6}}}`: "dimension_limits.recipient.daily_micros",
	} {
		require.Equal(t, []string{field}, validationFields(t, b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, body)), body)
	}
	// Several problems are named at once.
	fields := validationFields(t, b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key,
		map[string]any{"lease_seconds": 1, "max_attempts": 99}))
	require.ElementsMatch(t, []string{"lease_seconds", "max_attempts"}, fields)
	// A malformed effect type in the path.
	require.Contains(t, validationFields(t, b.env.Do("PUT", "/api/v1/policies/bad%20type", b.ws.Key,
		map[string]any{})), "effect_type")

	// Approval threshold above the ceiling is its own code, also across PUTs.
	r := b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key,
		map[string]any{"max_cost_micros": 100, "approval_above_micros": 101})
	errCode(t, r, http.StatusBadRequest, "approval_threshold_above_ceiling")
	b.putPolicy("sms.send", map[string]any{"max_cost_micros": 100, "approval_above_micros": 100}) // equal is allowed
	errCode(t, b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, map[string]any{"max_cost_micros": 99}),
		http.StatusBadRequest, "approval_threshold_above_ceiling")

	// None of the refusals changed the policy.
	p := b.env.Must(http.StatusOK, "GET", "/api/v1/policies/sms.send", b.ws.Key, nil).JSON()
	require.EqualValues(t, 1, p["version"])
	require.EqualValues(t, 100, p["max_cost_micros"])
}

// API.md §2.3's bounds are inclusive: each end of every range is taken and
// reads back as sent (TestPolicyValidation pins only the values just
// outside them).
func TestPolicyBoundsAreInclusive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	eight := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	limits := map[string]any{}
	for _, d := range eight {
		limits[d] = map[string]any{"daily_micros": nil, "daily_count": 1}
	}
	for _, c := range []struct {
		field string
		value any
	}{
		{"lease_seconds", 5}, {"lease_seconds", 3600}, {"max_attempts", 1}, {"max_attempts", 50},
		{"surge_multiplier", 2}, {"surge_cooldown_seconds", 60}, {"surge_cooldown_seconds", 86400},
		{"retention_days", 1}, {"retention_days", 400}, {"required_dimensions", eight}, {"dimension_limits", limits},
	} {
		p := b.putPolicy("bounds.x", map[string]any{c.field: c.value})
		want, err := json.Marshal(c.value)
		require.NoError(t, err)
		got, err := json.Marshal(p[c.field])
		require.NoError(t, err)
		require.JSONEq(t, string(want), string(got), "%s %v", c.field, c.value)
	}
}

func TestPolicyEnforcement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	begin := func(typ string, cost any, dims map[string]any) map[string]any {
		body := map[string]any{"effect_type": typ, "idempotency_key": key(typ), "payload": map[string]any{"n": 1}}
		if cost != nil {
			body["cost_micros"] = cost
		}
		if dims != nil {
			body["dimensions"] = dims
		}
		return body
	}

	// mode deny: 403 with the decision; the effect is stored, and re-evaluated afresh later.
	b.putPolicy("fax.send", map[string]any{"mode": "deny"})
	body := begin("fax.send", nil, nil)
	d := b.mustBegin("denied", body)
	require.Equal(t, "policy_denied", d["error"].(map[string]any)["code"])
	require.Equal(t, "denied", d["state"])
	require.EqualValues(t, 0, d["attempt"])
	e := b.get(str(d["effect_id"]))
	require.Equal(t, "denied", e["state"])
	require.Equal(t, "policy_denied", e["denial_code"])
	b.putPolicy("fax.send", map[string]any{"mode": "allow"})
	d = b.mustBegin("execute", body)
	require.EqualValues(t, 1, d["attempt"]) // the denial consumed no attempt

	// max_cost_micros.
	b.putPolicy("charge", map[string]any{"max_cost_micros": 1000})
	d = b.mustBegin("denied", begin("charge", 1001, nil))
	require.Equal(t, "cost_ceiling_exceeded", d["error"].(map[string]any)["code"])
	b.mustBegin("execute", begin("charge", 1000, nil))
	b.mustBegin("execute", begin("charge", nil, nil))

	// require_cost: 400, nothing stored.
	b.putPolicy("api.call", map[string]any{"require_cost": true})
	body = begin("api.call", nil, nil)
	errCode(t, b.begin(body), http.StatusBadRequest, "cost_required")
	list := b.env.Must(http.StatusOK, "GET", "/api/v1/effects?effect_type=api.call", b.ws.Key, nil).JSON()
	require.Empty(t, list["data"])
	b.mustBegin("execute", begin("api.call", 0, nil))

	// required_dimensions, plus any dimension a limit is keyed on.
	b.putPolicy("email.bulk", map[string]any{"required_dimensions": []string{"recipient"},
		"dimension_limits": map[string]any{"domain": map[string]any{"daily_count": 5}}})
	r := b.begin(begin("email.bulk", nil, map[string]any{"other": "x"}))
	e = errCode(t, r, http.StatusBadRequest, "dimension_required")
	require.Equal(t, []any{"domain", "recipient"}, e["detail"].(map[string]any)["dimensions"])
	r = b.begin(begin("email.bulk", nil, map[string]any{"recipient": "x"}))
	e = errCode(t, r, http.StatusBadRequest, "dimension_required")
	require.Equal(t, []any{"domain"}, e["detail"].(map[string]any)["dimensions"])
	b.mustBegin("execute", begin("email.bulk", nil, map[string]any{"recipient": "x", "domain": "example.com"}))

	// approval_above_micros: cost becomes mandatory; at or above holds; below allows.
	b.putPolicy("refund", map[string]any{"max_cost_micros": 500, "approval_above_micros": 100})
	errCode(t, b.begin(begin("refund", nil, nil)), http.StatusBadRequest, "cost_required")
	b.mustBegin("execute", begin("refund", 99, nil))
	a := b.mustBegin("approval_required", begin("refund", 100, nil))
	require.NotEmpty(t, a["approval_id"])
	require.Equal(t, "awaiting_approval", a["state"])
	require.EqualValues(t, 0, a["attempt"])
	d = b.mustBegin("denied", begin("refund", 501, nil)) // refuse wins over hold
	require.Equal(t, "cost_ceiling_exceeded", d["error"].(map[string]any)["code"])
	// A low amount never turns require_approval back into an allow.
	b.putPolicy("refund", map[string]any{"mode": "require_approval"})
	b.mustBegin("approval_required", begin("refund", 1, nil))
}

// Concurrent writers of one policy without expected_version each merge into
// what the one before wrote: every PUT answers 200 and the version counts
// them all (optimistic retries gave up under contention and answered 500),
// for a type's first write too.
func TestPolicyConcurrentPutsAllLand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const writers = 30
	var wg sync.WaitGroup
	statuses := make([]int, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = b.env.Do("PUT", "/api/v1/policies/race.type", b.ws.Key,
				map[string]any{"max_attempts": 1 + i%50, "required_dimensions": []string{fmt.Sprintf("d%d", i)}}).Status
		}()
	}
	wg.Wait()
	for i, st := range statuses {
		require.Equal(t, http.StatusOK, st, "writer %d", i)
	}
	p := b.env.Must(http.StatusOK, "GET", "/api/v1/policies/race.type", b.ws.Key, nil).JSON()
	require.EqualValues(t, writers, p["version"])
}

// A PUT that breaks a rule only with stored fields written since it read is
// stale, not invalid (review: a ceiling lowered meanwhile answered 400
// approval_threshold_above_ceiling to a client that had never seen it).
func TestPolicyPutStaleAgainstALaterCeilingIsAConflict(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.send", map[string]any{"max_cost_micros": 1000})
	b.putPolicy("sms.send", map[string]any{"max_cost_micros": 100})
	errCode(t, b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, map[string]any{"expected_version": 1,
		"approval_above_micros": 500}), http.StatusConflict, "version_conflict")
	errCode(t, b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, map[string]any{"expected_version": 2,
		"approval_above_micros": 500}), http.StatusBadRequest, "approval_threshold_above_ceiling")
	// A threshold above a ceiling sent beside it is invalid whatever the
	// version: refused as such, not as stale, so a client that re-reads and
	// sends it again is not refused for another reason the second time.
	errCode(t, b.env.Do("PUT", "/api/v1/policies/sms.send", b.ws.Key, map[string]any{"expected_version": 1,
		"approval_above_micros": 500, "max_cost_micros": 400}), http.StatusBadRequest,
		"approval_threshold_above_ceiling")
}

// A policy PUT's body re-encodes as it was read: a dimension's limit is
// kept as written and written back as JSON, not as the base64 of its bytes
// (the strict decoder's fuzz test: {"":{}} came back as "e30=").
func TestAPolicyRequestReencodesItsDimensionLimits(t *testing.T) {
	body := []byte(`{"dimension_limits":{"recipient":{"daily_count":3},"":{}}}`)
	var req gate.PutPolicyRequest
	require.NoError(t, jsonstrict.Decode(body, &req))
	again, err := json.Marshal(req.DimensionLimits)
	require.NoError(t, err)
	require.JSONEq(t, `{"recipient":{"daily_count":3},"":{}}`, string(again))
}

// A policy write lowering a type's max_attempts can spend a compensation
// that failed and waited for a retry: its rollback then ends
// (unwind_failed) with the write, as when the compensation's own outcome
// lands (afterStep), under an Idempotency-Key too. It stayed unwinding in
// storage until a read or the sweeper settled it, so a list of groups by
// state, and what follows a rollback's end, lagged the write.
func TestLoweringMaxAttemptsEndsTheRollbacksItSpent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stored := func(g string) string {
		var state string
		require.NoError(t, b.env.App.Pool.QueryRow(context.Background(),
			`SELECT state FROM effect_groups WHERE id = $1`, g).Scan(&state))
		return state
	}
	for i, header := range []http.Header{nil, {"Idempotency-Key": {"lower-max-attempts"}}} {
		b.putPolicy("email.retract", map[string]any{"max_attempts": 3})
		g, _, step := b.groupWithStep(fmt.Sprintf("spent-%d", i), "")
		b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil)
		b.executedAs("failed", map[string]any{"effect_type": "email.retract",
			"idempotency_key": "compensate:" + str(step["effect_id"]), "compensates_effect_id": step["effect_id"]})
		require.Equal(t, "unwinding", stored(g), "the failed compensation may be tried again")

		r := b.env.DoWith("PUT", "/api/v1/policies/email.retract", b.ws.Key, header, map[string]any{"max_attempts": 1})
		require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
		require.Equal(t, "unwind_failed", stored(g), "ended by the write, before any read")
	}
}

// A PUT's required_dimensions and dimension_limits replace the stored ones
// whole, not key by key: a dimension left out of dimension_limits loses its
// limit. The document says so (review: it said only "omitted fields keep
// their value", which a client reading it as a JSON merge patch took to
// keep the limits it did not send, and a ceiling was lifted unseen).
func TestAPutsDimensionListsReplaceTheStoredOnesWhole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("sms.limits", map[string]any{"required_dimensions": []string{"recipient", "sender"},
		"dimension_limits": map[string]any{"recipient": map[string]any{"daily_count": 3},
			"sender": map[string]any{"daily_micros": 500}}})
	p := b.putPolicy("sms.limits", map[string]any{"required_dimensions": []string{"sender"},
		"dimension_limits": map[string]any{"recipient": map[string]any{"daily_count": 4}}})
	require.Equal(t, []any{"sender"}, p["required_dimensions"])
	require.Equal(t, map[string]any{"recipient": map[string]any{"daily_micros": nil, "daily_count": 4.0}},
		p["dimension_limits"], "the sender's limit, left out, is gone")

	var doc struct {
		Paths map[string]map[string]struct {
			Summary string `json:"summary"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(b.env.Must(http.StatusOK, "GET", "/api/v1/openapi.json", "", nil).Body, &doc))
	summary := doc.Paths["/api/v1/policies/{effect_type}"]["put"].Summary
	require.True(t, strings.Contains(summary, "(required_dimensions, dimension_limits) replaces the one stored whole"),
		"the PUT's summary says how its lists and maps merge: %s", summary)
}

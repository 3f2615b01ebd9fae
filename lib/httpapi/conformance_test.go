package httpapi_test

// Conformance probes against the wire contract (API.md §0 and §5): routes,
// statuses, envelopes, field sets and error details. Each row states one
// binding sentence of the contract, so a regression names what it broke.

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/money"
)

// TestConformanceDecodePaths: detail.validation[].field is the dotted path
// from the body root, for unknown and mistyped fields alike, nested included.
func TestConformanceDecodePaths(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dst        any
		body, want string
	}{
		{&jobs.ReportRequest{}, `{"error":{"message":"x","bogus":1}}`, "error.bogus"},
		{&jobs.ReportRequest{}, `{"error":{"retryAfterMs":"soon"}}`, "error.retryAfterMs"},
		{&jobs.ReportRequest{}, `{"bogus":1}`, "bogus"},
		{&jobs.PublishContractRequest{}, `{"retryPolicy":{"maxAttempts":"x"}}`, "retryPolicy.maxAttempts"},
		{&jobs.PublishContractRequest{}, `{"retryPolicy":{"maxAttempts":3,"zzz":1}}`, "retryPolicy.zzz"},
		{&jobs.RegisterRequest{}, `{"tools":[{"name":"a","version":"1"},{"name":"b","version":"1","x":2}]}`, "tools.1.x"},
		{&jobs.BatchReportRequest{}, `{"reports":[{"jobId":"j","leaseToken":"t","error":{"nope":1}}]}`, "reports.0.error.nope"},
		{&gate.PutPolicyRequest{}, `{"lease_seconds":"x"}`, "lease_seconds"},
		{&gate.BeginRequest{}, `{"compensation":{"effect_type":"a","zz":1}}`, "compensation.zz"},
		{&gate.BeginRequest{}, `{"compensation":{"effect_type":1}}`, "compensation.effect_type"},
		{&jobs.RegisterRequest{}, `{"tools":[{"name":"a","version":"1"},{"name":2,"version":"1"}]}`, "tools.1.name"},
		{&jobs.RegisterRequest{}, `{"tools":"send@1"}`, "tools"},
		{&gate.PutPolicyRequest{}, `{"required_dimensions":["a",1]}`, "required_dimensions.1"},
		{&jobs.ReportRequest{}, `{"error":{"retryAfterMs":1.5}}`, "error.retryAfterMs"},
		{&gate.BeginRequest{}, `{"payload":{"anything":{"goes":1}},"bogus":true}`, "bogus"},
		{&gate.BeginRequest{}, `{"compensation":{"payload":{"deep":[1]}},"lease_seconds":"x"}`, "lease_seconds"},
		{&jobs.PublishContractRequest{}, `{"inputSchema":{"type":"object"},"retryPolicy":{"bogus":1}}`, "retryPolicy.bogus"},
		// A map's entry is named by its key.
		{&gate.BeginRequest{}, `{"dimensions":{"from":"a","to":5}}`, "dimensions.to"},
		{&jobs.RegisterRequest{}, `{"tools":[{"name":"a","version":"1"},{"name":"b","version":[1]}]}`, "tools.1.version"},
	} {
		err := httpapi.DecodeJSON([]byte(c.body), c.dst)
		var ae *apierr.Error
		require.ErrorAs(t, err, &ae, c.body)
		require.Equal(t, apierr.CodeInvalidRequest, ae.Code, c.body)
		require.Equal(t, []apierr.FieldError{{Field: c.want, Message: ae.Detail["validation"].([]apierr.FieldError)[0].Message}},
			ae.Detail["validation"], c.body)
	}
}

// A request body's unknown and mistyped fields are listed together, as the
// README says, not only the first one the decoder met.
func TestConformanceDecodeListsEveryProblem(t *testing.T) {
	t.Parallel()
	err := httpapi.DecodeJSON([]byte(`{"idempotency_key":2,"effect_type":1,"colour":"red","lease_seconds":"x"}`),
		&gate.BeginRequest{})
	var ae *apierr.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, []apierr.FieldError{
		{Field: "colour", Message: "is not a known field"},
		{Field: "effect_type", Message: "must be a string"},
		{Field: "idempotency_key", Message: "must be a string"},
		{Field: "lease_seconds", Message: "must be an integer"},
	}, ae.Detail["validation"])
	// An integer a field's type cannot hold is told the type's range (QA:
	// 2^63 read "must be an integer"), whether the decoder or the walk
	// found it, narrowed by the field's tag (lease_seconds is min=1); an
	// amount of money, the amounts' range (gate QA: 10^19 was told the
	// type's, 9·10^18 the amounts').
	for _, c := range []struct{ body, field, rule string }{
		{`{"lease_seconds":9223372036854775808}`, "lease_seconds", "must be an integer from 1 to 2^63-1"},
		{`{"lease_seconds":100000000000000000000000,"colour":1}`, "lease_seconds", "must be an integer from 1 to 2^63-1"},
		{`{"cost_micros":10000000000000000000}`, "cost_micros", money.Rule},
		{`{"cost_micros":100000000000000000000000,"colour":1}`, "cost_micros", money.Rule},
	} {
		err = httpapi.DecodeJSON([]byte(c.body), &gate.BeginRequest{})
		require.ErrorAs(t, err, &ae)
		require.Contains(t, ae.Detail["validation"], apierr.FieldError{Field: c.field, Message: c.rule}, c.body)
	}
	for _, body := range []string{`{"budgetMicros":10000000000000000000}`, `{"budgetMicros":-10000000000000000000,"x":1}`} {
		err = httpapi.DecodeJSON([]byte(body), &jobs.CreateRunRequest{})
		require.ErrorAs(t, err, &ae)
		require.Contains(t, ae.Detail["validation"], apierr.FieldError{Field: "budgetMicros", Message: money.Rule}, body)
	}
	// A number that is no integer is told the field's bounds too (ops QA:
	// maxAttempts 1.5 read "must be an integer", 11 "from 1 to 10").
	for _, body := range []string{`{"maxAttempts":1.5}`, `{"maxAttempts":1.5,"x":1}`} {
		err = httpapi.DecodeJSON([]byte(body), &jobs.EnqueueRequest{})
		require.ErrorAs(t, err, &ae)
		require.Contains(t, ae.Detail["validation"], apierr.FieldError{Field: "maxAttempts", Message: "must be an integer from 1 to 10"}, body)
	}
	// An integer sent as a string is a string (review: "30" was told the
	// range), whether the decoder or the walk found it.
	for _, body := range []string{`{"lease_seconds":"30"}`, `{"lease_seconds":"30","colour":1}`,
		`{"cost_micros":"9223372036854775808"}`} {
		err = httpapi.DecodeJSON([]byte(body), &gate.BeginRequest{})
		require.ErrorAs(t, err, &ae)
		for _, p := range ae.Detail["validation"].([]apierr.FieldError) {
			if p.Field != "colour" {
				require.Equal(t, "must be an integer", p.Message, body)
			}
		}
	}
}

func keysOf(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var _ = http.StatusOK

// contractRoutes is every route API.md names (ids well-formed but unknown).
var contractRoutes = [][2]string{
	{"POST", "/api/v1/keys"}, {"GET", "/api/v1/keys"}, {"DELETE", "/api/v1/keys/key_01m8mgjegc1c0fpgzc2q7nz2v8"},
	{"POST", "/api/v1/effects/begin"}, {"GET", "/api/v1/effects"},
	{"GET", "/api/v1/effects/eff_01m8mgjegsysz4qt412qpccs5e"},
	{"POST", "/api/v1/effects/eff_01m8mgjegsysz4qt412qpccs5e/report"},
	{"POST", "/api/v1/effects/eff_01m8mgjegsysz4qt412qpccs5e/heartbeat"},
	{"POST", "/api/v1/effects/eff_01m8mgjegsysz4qt412qpccs5e/resolve"},
	{"GET", "/api/v1/policies"}, {"GET", "/api/v1/policies/email.send"}, {"PUT", "/api/v1/policies/email.send"},
	{"GET", "/api/v1/approvals"}, {"POST", "/api/v1/approvals/apr_01m8mgjehqh9k8t28cny8gz3xh/approve"},
	{"POST", "/api/v1/approvals/apr_01m8mgjehqh9k8t28cny8gz3xh/reject"},
	{"GET", "/api/v1/circuits"}, {"POST", "/api/v1/circuits/email.send/open"},
	{"POST", "/api/v1/circuits/email.send/close"}, {"POST", "/api/v1/circuits/stop"}, {"POST", "/api/v1/circuits/release"},
	{"POST", "/api/v1/groups"}, {"GET", "/api/v1/groups/grp_01m8mgjej72fgqnmkj8dw87agp"},
	{"POST", "/api/v1/groups/grp_01m8mgjej72fgqnmkj8dw87agp/commit"},
	{"POST", "/api/v1/groups/grp_01m8mgjej72fgqnmkj8dw87agp/unwind"},
	{"POST", "/api/v1/reconcile"}, {"POST", "/api/v1/webhooks"},
	{"GET", "/api/v1/webhooks/whk_01m8kjtk8gsrfzr7mt4ax3c1gx/deliveries"},
	{"POST", "/api/v1/runs"}, {"GET", "/api/v1/runs/run_01m8mgjejemp8r6x8drx0e13jw"},
	{"POST", "/api/v1/runs/run_01m8mgjejemp8r6x8drx0e13jw/steps"},
	{"POST", "/api/v1/runs/run_01m8mgjejemp8r6x8drx0e13jw/finish"},
	{"POST", "/api/v1/steps/stp_01m8mgjejf3v6d1k607me40emv/cancel"},
	{"POST", "/api/v1/workers/register"}, {"POST", "/api/v1/workers/wkr_01m8mgjek0ze8ys743sv5h6qz5/claim"},
	{"POST", "/api/v1/jobs/job_01m8mgjejfew3b48vmdmgwjm45/heartbeat"},
	{"POST", "/api/v1/jobs/job_01m8mgjejfew3b48vmdmgwjm45/report"},
	{"GET", "/api/v1/endpoints"}, {"POST", "/api/v1/endpoints"},
	{"GET", "/api/v1/endpoints/end_01m8mgjejgrc2400rdrvd7hy99/policy"},
	{"PUT", "/api/v1/endpoints/end_01m8mgjejgrc2400rdrvd7hy99/policy"},
	{"POST", "/api/v1/endpoints/end_01m8mgjejgrc2400rdrvd7hy99/pause"},
	{"POST", "/api/v1/endpoints/end_01m8mgjejgrc2400rdrvd7hy99/resume"},
	{"POST", "/api/v1/endpoints/end_01m8mgjejgrc2400rdrvd7hy99/circuit/close"},
	{"POST", "/api/v1/tools/send_email/contracts"}, {"GET", "/api/v1/tools/send_email/contracts"},
	{"POST", "/api/v1/tools/send_email/test"},
	{"GET", "/api/v1/steps/stp_01m8mgjejf3v6d1k607me40emv/replay"},
	{"POST", "/api/v1/steps/stp_01m8mgjejf3v6d1k607me40emv/replay"},
	{"GET", "/api/v1/queue/health"},
}

// TestConformanceRoutesExist: every route of API.md exists under /api/v1 and
// the /v1 alias (an authenticated route answers 401 without a key, never
// 404), and every response carries X-Request-Id.
func TestConformanceRoutesExist(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	for _, r := range contractRoutes {
		for _, path := range []string{r[1], strings.TrimPrefix(r[1], "/api")} {
			res := env.Do(r[0], path, "", nil)
			require.Equal(t, http.StatusUnauthorized, res.Status, "%s %s: %s", r[0], path, res.Body)
			require.Equal(t, apierr.CodeUnauthorized, res.ErrorCode(), "%s %s", r[0], path)
			require.NotEmpty(t, res.Header.Get("X-Request-Id"), "%s %s", r[0], path)
		}
	}
	for _, path := range []string{"/api/v1/health", "/v1/health", "/api/v1/openapi.json", "/llms.txt",
		"/.well-known/ratchet.json"} {
		res := env.Must(http.StatusOK, "GET", path, "", nil)
		require.NotEmpty(t, res.Header.Get("X-Request-Id"), path)
	}
	for _, c := range []struct{ method, path, key string }{
		{"GET", "/api/v1/nope", ""}, {"GET", "/api/cron/sweep", ""}, {"POST", "/api/cron/sweep", "wrong"},
	} {
		res := env.Do(c.method, c.path, c.key, nil)
		want := http.StatusUnauthorized
		if c.path == "/api/v1/nope" {
			want = http.StatusNotFound
		}
		require.Equal(t, want, res.Status, "%s %s: %s", c.method, c.path, res.Body)
		require.NotEmpty(t, res.ErrorCode())
		require.NotEmpty(t, res.Header.Get("X-Request-Id"))
	}
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	env.Must(http.StatusOK, "GET", "/api/v1/openapi.json", "", nil).Decode(t, &doc)
	for _, r := range contractRoutes {
		require.Contains(t, doc.Paths[openAPIPath(r[1])], strings.ToLower(r[0]), "%s %s in openapi", r[0], r[1])
	}
}

// A malformed id is answered as an unknown well-formed one is, the same
// resource named (QA: a malformed webhook id read "No such id").
func TestConformanceMalformedIDsAreUnknownIDs(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	checked := 0
	for _, r := range contractRoutes {
		parts := strings.Split(r[1], "/")
		for i, part := range parts {
			if prefix, _, ok := strings.Cut(part, "_"); !ok || len(part) != len(prefix)+27 {
				continue
			}
			unknown := env.Do(r[0], r[1], ws.Key, `{}`)
			if unknown.Status != http.StatusNotFound {
				continue // refused before its lookup (a body it needs)
			}
			bad := append([]string(nil), parts...)
			bad[i] = "not-an-id"
			malformed := env.Do(r[0], strings.Join(bad, "/"), ws.Key, `{}`)
			require.Equal(t, http.StatusNotFound, malformed.Status, "%s %s: %s", r[0], r[1], malformed.Body)
			msg := func(res *apitest.Response) any { return res.JSON()["error"].(map[string]any)["message"] }
			require.Equal(t, msg(unknown), msg(malformed), "%s %s", r[0], r[1])
			checked++
		}
	}
	require.Greater(t, checked, 15)
}

// openAPIPath turns a concrete contract path back into its pattern.
func openAPIPath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		if prefix, _, ok := strings.Cut(s, "_"); ok && len(s) == len(prefix)+27 {
			switch {
			case i == 4 && parts[3] == "workers":
				parts[i] = "{workerId}"
			default:
				parts[i] = "{id}"
			}
		}
	}
	out := strings.Join(parts, "/")
	out = strings.Replace(out, "/policies/email.send", "/policies/{effect_type}", 1)
	out = strings.Replace(out, "/circuits/email.send/", "/circuits/{effect_type}/", 1)
	return strings.Replace(out, "/tools/send_email/", "/tools/{name}/", 1)
}

// requireFields asserts obj carries every field the contract lists (§5).
func requireFields(t *testing.T, what string, obj map[string]any, fields ...string) {
	t.Helper()
	for _, f := range fields {
		require.Contains(t, obj, f, "%s lacks %q: has %v", what, f, keysOf(obj))
	}
}

func first(t *testing.T, page map[string]any) map[string]any {
	t.Helper()
	data, ok := page["data"].([]any)
	require.True(t, ok, "page: %v", page)
	require.NotEmpty(t, data)
	return data[0].(map[string]any)
}

// TestConformanceGateShapes: the snake_case objects of §5 and the statuses
// of the effect-gate routes.
func TestConformanceGateShapes(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws, other := env.Signup(), env.Signup()
	op := ws.Key

	key := env.Must(http.StatusCreated, "POST", "/api/v1/keys", op, map[string]any{"name": "a", "preset": "AGENT"}).JSON()
	keyFields := []string{"id", "name", "scopes", "tools", "daily_spend_ceiling_micros", "rate_limit_per_minute",
		"created_at", "revoked_at"}
	requireFields(t, "key", key, append(keyFields, "secret")...)
	page := env.Must(http.StatusOK, "GET", "/api/v1/keys", op, nil).JSON()
	requireFields(t, "keys page", page, "data", "next_cursor")
	requireFields(t, "listed key", first(t, page), keyFields...)
	env.Must(http.StatusNotFound, "DELETE", "/api/v1/keys/"+key["id"].(string), other.Key, nil)
	revoked := env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+key["id"].(string), op, nil).JSON()
	requireFields(t, "revoked key", revoked, keyFields...)
	require.NotNil(t, revoked["revoked_at"])

	begin := map[string]any{"effect_type": "email.send", "idempotency_key": "welcome:1", "payload": map[string]any{"to": "u"}}
	b := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", op, begin).JSON()
	requireFields(t, "execute", b, "decision", "effect_id", "state", "attempt", "lease_token", "lease_expires_at", "probe")
	id := b["effect_id"].(string)
	hb := env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/heartbeat", op, map[string]any{"lease_token": b["lease_token"]}).JSON()
	require.Equal(t, []string{"effect_id", "lease_expires_at"}, keysOf(hb))
	effectFields := []string{"id", "effect_type", "idempotency_key", "state", "attempt", "attempts", "result",
		"payload_preview", "cost_micros", "run_id", "group_id", "denial_code", "created_at", "updated_at"}
	report := map[string]any{"lease_token": b["lease_token"], "outcome": "succeeded", "result": map[string]any{"n": 1}}
	eff := env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/report", op, report).JSON()
	requireFields(t, "effect", eff, effectFields...)
	requireFields(t, "attempt", eff["attempts"].([]any)[0].(map[string]any),
		"attempt", "outcome", "started_at", "lease_expires_at", "reported_at")
	require.Equal(t, eff, env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/report", op, report).JSON(),
		"a repeated report answers the same object")
	report["outcome"] = "failed"
	require.Equal(t, apierr.CodeInvalidState, env.Must(http.StatusConflict, "POST", "/api/v1/effects/"+id+"/report", op, report).ErrorCode())
	dup := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", op, begin).JSON()
	require.Equal(t, "duplicate", dup["decision"])
	require.Equal(t, map[string]any{"n": float64(1)}, dup["result"])
	requireFields(t, "effect get", env.Must(http.StatusOK, "GET", "/api/v1/effects/"+id, op, nil).JSON(), effectFields...)
	env.Must(http.StatusNotFound, "GET", "/api/v1/effects/"+id, other.Key, nil)
	requireFields(t, "listed effect", first(t, env.Must(http.StatusOK, "GET", "/api/v1/effects", op, nil).JSON()), effectFields...)

	policyFields := []string{"effect_type", "version", "mode", "on_indeterminate", "lease_seconds", "max_attempts",
		"max_cost_micros", "approval_above_micros", "daily_budget_micros", "reconcile_every_hours", "require_cost",
		"required_dimensions", "dimension_limits", "structuring_threshold_micros", "surge_per_hour",
		"surge_multiplier", "surge_action", "surge_cooldown_seconds", "retention_days"}
	def := env.Must(http.StatusOK, "GET", "/api/v1/policies/never.seen", op, nil).JSON()
	requireFields(t, "policy", def, policyFields...)
	require.Equal(t, float64(0), def["version"])
	require.Equal(t, "allow", def["mode"])
	require.Equal(t, "block", def["on_indeterminate"])
	require.Equal(t, float64(60), def["lease_seconds"])
	require.Equal(t, float64(5), def["max_attempts"])
	put := env.Must(http.StatusOK, "PUT", "/api/v1/policies/pay.charge", op,
		map[string]any{"max_cost_micros": 100, "approval_above_micros": 100}).JSON()
	requireFields(t, "put policy", put, policyFields...)
	above := env.Must(http.StatusBadRequest, "PUT", "/api/v1/policies/pay.charge", op, map[string]any{"approval_above_micros": 101})
	require.Equal(t, apierr.CodeApprovalAboveCeiling, above.ErrorCode())
	stale := env.Must(http.StatusConflict, "PUT", "/api/v1/policies/pay.charge", op, map[string]any{"expected_version": 0})
	require.Equal(t, apierr.CodeVersionConflict, stale.ErrorCode())
	requireFields(t, "policies page", env.Must(http.StatusOK, "GET", "/api/v1/policies", op, nil).JSON(), "data", "next_cursor")

	env.Must(http.StatusOK, "PUT", "/api/v1/policies/x.deny", op, map[string]any{"mode": "deny"})
	denied := env.Must(http.StatusForbidden, "POST", "/api/v1/effects/begin", op,
		map[string]any{"effect_type": "x.deny", "idempotency_key": "d", "payload": map[string]any{}}).JSON()
	requireFields(t, "denied", denied, "decision", "effect_id", "error")
	require.Equal(t, "denied", denied["decision"])
	require.Equal(t, apierr.CodePolicyDenied, denied["error"].(map[string]any)["code"])
	stored := env.Must(http.StatusOK, "GET", "/api/v1/effects/"+denied["effect_id"].(string), op, nil).JSON()
	require.Equal(t, "denied", stored["state"], "a denied effect is stored")
	require.Equal(t, apierr.CodePolicyDenied, stored["denial_code"])

	env.Must(http.StatusOK, "PUT", "/api/v1/policies/x.appr", op, map[string]any{"mode": "require_approval"})
	ab := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", op,
		map[string]any{"effect_type": "x.appr", "idempotency_key": "a", "payload": map[string]any{}}).JSON()
	require.Equal(t, "approval_required", ab["decision"])
	approvalFields := []string{"id", "effect_id", "effect_type", "state", "reason", "created_at", "decided_at", "note"}
	pending := first(t, env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", op, nil).JSON())
	requireFields(t, "approval", pending, approvalFields...)
	require.Equal(t, ab["approval_id"], pending["id"])
	env.Must(http.StatusBadRequest, "GET", "/api/v1/approvals?state=maybe", op, nil)
	env.Must(http.StatusNotFound, "POST", "/api/v1/approvals/"+pending["id"].(string)+"/approve", other.Key, nil)
	decided := env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+pending["id"].(string)+"/approve", op, map[string]any{"note": "ok"}).JSON()
	requireFields(t, "decided approval", decided, approvalFields...)
	require.Equal(t, "approved", decided["state"])

	circuitFields := []string{"effect_type", "state", "opened_by", "action", "volume_last_hour",
		"baseline_median_hourly", "threshold", "opened_at", "closes_at"}
	requireFields(t, "circuit", first(t, env.Must(http.StatusOK, "GET", "/api/v1/circuits", op, nil).JSON()), circuitFields...)
	opened := env.Must(http.StatusOK, "POST", "/api/v1/circuits/email.send/open", op, map[string]any{"action": "monitor", "reason": "r"}).JSON()
	requireFields(t, "opened circuit", opened, circuitFields...)
	require.Equal(t, "open", opened["state"])
	require.Nil(t, opened["closes_at"], "a manual breaker has no cooldown")
	env.Must(http.StatusOK, "POST", "/api/v1/circuits/email.send/close", op, nil)

	g := env.Must(http.StatusCreated, "POST", "/api/v1/groups", op, map[string]any{"name": "g"}).JSON()
	requireFields(t, "group", g, "id", "state")
	require.Equal(t, "open", g["state"])
	gid := g["id"].(string)
	env.Must(http.StatusNotFound, "GET", "/api/v1/groups/"+gid, other.Key, nil)
	committed := env.Must(http.StatusOK, "POST", "/api/v1/groups/"+gid+"/commit", op, nil).JSON()
	requireFields(t, "commit", committed, "group_id", "state", "plan", "unresolved")
	require.Equal(t, "committed", committed["state"])
	unwound := env.Must(http.StatusOK, "POST", "/api/v1/groups/"+gid+"/unwind", op, nil).JSON()
	requireFields(t, "unwind", unwound, "group_id", "state", "plan", "unresolved")
	require.Equal(t, gid, committed["group_id"], "one type reads both answers' id")
	require.Equal(t, gid, unwound["group_id"])

	wh := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", op,
		map[string]any{"url": "https://example.com/h", "events": []string{"run.finished"}}).JSON()
	requireFields(t, "webhook", wh, "id", "secret")
	env.Must(http.StatusNotFound, "GET", "/api/v1/webhooks/"+wh["id"].(string)+"/deliveries", other.Key, nil)
	requireFields(t, "deliveries", env.Must(http.StatusOK, "GET", "/api/v1/webhooks/"+wh["id"].(string)+"/deliveries", op, nil).JSON(),
		"data", "next_cursor")

	rec := env.Must(http.StatusOK, "POST", "/api/v1/reconcile", op, map[string]any{"effect_type": "email.send",
		"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "records": []any{}}).JSON()
	requireFields(t, "reconcile", rec, "matched", "missing_at_vendor", "unknown_to_ratchet", "amount_mismatch", "resolved")
}

// TestConformanceErrors: §0 and §5 error rules shared by every route.
func TestConformanceErrors(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for _, path := range []string{"/api/v1/keys?limit=0", "/api/v1/effects?limit=abc", "/api/v1/endpoints?limit=201",
		"/api/v1/policies?limit=-1", "/api/v1/approvals?limit=", "/api/v1/circuits?limit=1.5"} {
		res := env.Do("GET", path, ws.Key, nil)
		if strings.HasPrefix(path, "/api/v1/circuits") && res.Status == http.StatusOK {
			continue // not paginated: one circuit per effect type
		}
		require.Equal(t, http.StatusBadRequest, res.Status, "%s: %s", path, res.Body)
		require.Equal(t, apierr.CodeInvalidRequest, res.ErrorCode(), path)
		var body struct {
			Error struct {
				Detail struct {
					Validation []apierr.FieldError `json:"validation"`
				} `json:"detail"`
			} `json:"error"`
		}
		res.Decode(t, &body)
		require.Equal(t, "limit", body.Error.Detail.Validation[0].Field, path)
		require.NotEmpty(t, res.Header.Get("X-Request-Id"))
	}
	requireFields(t, "camel page", env.Must(http.StatusOK, "GET", "/api/v1/endpoints?limit=200", ws.Key, nil).JSON(),
		"data", "nextCursor")

	ingest := env.Key(ws, map[string]any{"name": "i", "preset": "INGEST"})
	res := env.Must(http.StatusForbidden, "POST", "/api/v1/effects/begin", ingest,
		map[string]any{"effect_type": "a.b", "idempotency_key": "k", "payload": map[string]any{}})
	require.Equal(t, map[string]any{"required": []any{"effects:begin"}}, res.JSON()["error"].(map[string]any)["detail"])

	// Over an instance whose clock is frozen mid-minute: the limit's window
	// is the clock's minute, and the wall clock could roll it between the
	// two begins (the second was then let through).
	frozen := apitest.Start(t, apitest.WithNow(func() time.Time { return time.Date(2030, 1, 1, 12, 0, 30, 0, time.UTC) }))
	rl := env.Key(ws, map[string]any{"name": "rl", "preset": "AGENT", "rate_limit_per_minute": 1})
	body := map[string]any{"effect_type": "a.b", "idempotency_key": "r", "payload": map[string]any{}}
	frozen.Must(http.StatusOK, "POST", "/api/v1/effects/begin", rl, body)
	limited := frozen.Must(http.StatusTooManyRequests, "POST", "/api/v1/effects/begin", rl, body)
	require.Equal(t, apierr.CodeRateLimited, limited.ErrorCode())
	require.Contains(t, limited.JSON()["error"].(map[string]any)["detail"], "retry_after_seconds")

	big := env.Do("POST", "/api/v1/runs", ws.Key, `{"name":"`+strings.Repeat("a", httpapi.MaxBodyBytes)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, big.Status)
	require.Equal(t, apierr.CodePayloadTooLarge, big.ErrorCode())

	unknown := env.Must(http.StatusBadRequest, "POST", "/api/v1/runs", ws.Key, map[string]any{"name": "r", "nme": 1})
	require.Equal(t, apierr.CodeInvalidRequest, unknown.ErrorCode())
	// A bodiless action refuses unknown fields too, and takes {} or nothing.
	runID := env.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key, map[string]any{"name": "r"}).JSON()["id"].(string)
	extra := env.Must(http.StatusBadRequest, "POST", "/api/v1/runs/"+runID+"/finish", ws.Key, map[string]any{"force": true})
	require.Contains(t, string(extra.Body), `"field":"force"`)
	env.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", ws.Key, map[string]any{})
	env.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", ws.Key, nil)
	// So does a read: its body was ignored, so a filter sent there was
	// answered as if it held.
	read := env.Must(http.StatusBadRequest, "GET", "/api/v1/runs/"+runID, ws.Key, map[string]any{"limit": 5})
	require.Contains(t, string(read.Body), `"field":"limit"`)
	env.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID, ws.Key, map[string]any{})

	dims := env.Must(http.StatusBadRequest, "PUT", "/api/v1/policies/t.x", ws.Key,
		map[string]any{"dimension_limits": map[string]any{"recipient": map[string]any{"daily_micro": 5}}})
	require.Contains(t, string(dims.Body), `"field":"dimension_limits.recipient.daily_micro"`)
}

// TestConformanceJobShapes: the camelCase objects of §5, job lease rules and
// the endpoint routes (circuit/close included).
func TestConformanceJobShapes(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	other := e.Signup()
	op := e.ws.Key

	run := e.Must(http.StatusCreated, "POST", "/api/v1/runs", e.ingest, map[string]any{"name": "r"}).JSON()
	requireFields(t, "run", run, "id", "name", "status")
	require.Equal(t, "RUNNING", run["status"])
	runID := run["id"].(string)
	enqueue := map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"a": 1}, "timeoutMs": 1000, "maxAttempts": 3}
	st := e.enqueue(runID, enqueue)
	requireFields(t, "enqueue", st, "stepId", "jobId", "idempotencyKey", "status", "dueAt", "deduplicated")
	require.Equal(t, false, st["deduplicated"])
	require.Equal(t, true, e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/steps", e.ingest, enqueue).JSON()["deduplicated"])
	for _, n := range []int{0, 11} {
		bad := e.Must(http.StatusBadRequest, "POST", "/api/v1/runs/"+runID+"/steps", e.ingest,
			map[string]any{"name": "send_email", "version": "1", "maxAttempts": n})
		require.Contains(t, string(bad.Body), `"field":"maxAttempts"`)
	}

	got := e.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID, e.ingest, nil).JSON()
	requireFields(t, "run", got, "id", "name", "status", "completionRequested", "createdAt", "finishedAt", "steps")
	step := got["steps"].([]any)[0].(map[string]any)
	requireFields(t, "step", step, "id", "name", "version", "endpoint", "status", "idempotencyKey", "afterStepId",
		"afterStatus", "durableJob")
	dj := step["durableJob"].(map[string]any)
	requireFields(t, "durableJob", dj, "id", "status", "attempt", "maxAttempts", "dueAt", "policy")
	requireFields(t, "durableJob.policy", dj["policy"].(map[string]any), "preset", "maxAttempts", "initialDelayMs",
		"multiplier", "maxDelayMs", "jitterPercent", "timeoutMs")
	require.Equal(t, float64(3), dj["policy"].(map[string]any)["maxAttempts"], "the enqueue override is effective")
	require.Equal(t, step["status"], dj["status"])
	require.Equal(t, "send_email", step["endpoint"])
	e.Must(http.StatusNotFound, "GET", "/api/v1/runs/"+runID, other.Key, nil)
	e.Must(http.StatusNotFound, "GET", "/api/v1/steps/"+st["stepId"].(string), other.Key, nil)

	health := e.Must(http.StatusOK, "GET", "/api/v1/queue/health", e.ingest, nil).JSON()
	requireFields(t, "queue health", first(t, health), "name", "version", "queued", "oldestQueuedAgeSeconds",
		"workersSeen", "openCircuitEndpoints", "pausedEndpoints", "atConcurrencyLimitEndpoints", "rateLimitedEndpoints",
		"message")

	unlisted := e.Must(http.StatusForbidden, "POST", "/api/v1/workers/register", e.worker,
		map[string]any{"tools": []any{map[string]any{"name": "other", "version": "2"}}})
	require.Contains(t, unlisted.JSON()["error"].(map[string]any)["detail"].(map[string]any)["required"], "tool:other@2")
	e.Must(http.StatusCreated, "POST", "/api/v1/workers/register", op,
		map[string]any{"tools": []any{map[string]any{"name": "anything", "version": "9"}}})
	w := e.register("send_email@1")
	otherWorker := e.Key(e.ws, map[string]any{"name": "w2", "preset": "WORKER", "tools": []string{"send_email@1"}})
	e.Must(http.StatusNotFound, "POST", "/api/v1/workers/"+w+"/claim", otherWorker, map[string]any{"limit": 1})

	claimedAt := e.clock.Now()
	j1 := e.claim(w, 1)[0]
	requireFields(t, "claimed job", j1, "jobId", "stepId", "runId", "name", "version", "attempt", "leaseToken",
		"leaseExpiresAt", "timeoutMs", "idempotencyKey", "input")
	require.Equal(t, claimedAt.Add(11*time.Second).Format(time.RFC3339), j1["leaseExpiresAt"],
		"lease = claim time + timeoutMs + 10 s grace")
	hb := e.Must(http.StatusOK, "POST", "/api/v1/jobs/"+j1["jobId"].(string)+"/heartbeat", e.worker,
		map[string]any{"leaseToken": j1["leaseToken"]}).JSON()
	require.Equal(t, []string{"cancelRequested", "leaseExpiresAt"}, keysOf(hb))

	e.clock.Add(12 * time.Second)
	j2 := e.claim(w, 1)
	require.Len(t, j2, 1, "a lapsed job is claimable again at once")
	stale := e.Must(http.StatusConflict, "POST", "/api/v1/jobs/"+j1["jobId"].(string)+"/heartbeat", e.worker,
		map[string]any{"leaseToken": j1["leaseToken"]})
	require.Equal(t, apierr.CodeLeaseLost, stale.ErrorCode())
	require.Equal(t, apierr.CodeLeaseLost, e.report(j1, map[string]any{"status": "SUCCEEDED"}).ErrorCode())
	e.clock.Add(20 * time.Second)
	rep := e.report(j2[0], map[string]any{"status": "FAILED", "error": map[string]any{"message": "x", "retryable": false}})
	require.Equal(t, http.StatusOK, rep.Status, "the current token is accepted after its lease lapsed: %s", rep.Body)
	require.Equal(t, []string{"attempt", "jobId", "nextDueAt", "status"}, keysOf(rep.JSON()))

	preview := e.Must(http.StatusOK, "GET", "/api/v1/steps/"+st["stepId"].(string)+"/replay", op, nil).JSON()
	requireFields(t, "replay preview", preview, "eligible", "handlerVersion", "upgrades")
	replay := e.Must(http.StatusOK, "POST", "/api/v1/steps/"+st["stepId"].(string)+"/replay", op,
		map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": 1, "reason": "r"}).JSON()
	require.Equal(t, []string{"attempt", "handlerVersion", "jobId", "maxAttempts", "status", "stepId"}, keysOf(replay))
	require.Equal(t, st["jobId"], replay["jobId"])
	require.Equal(t, "QUEUED", replay["status"])

	contract := e.Must(http.StatusCreated, "POST", "/api/v1/tools/send_email/contracts", op,
		map[string]any{"handlerVersion": "1", "inputSchema": map[string]any{}, "outputSchema": map[string]any{}}).JSON()
	contractFields := []string{"name", "contractVersion", "handlerVersion", "inputSchema", "outputSchema", "timeoutMs",
		"retryPreset", "retryPolicy", "status", "createdAt"}
	requireFields(t, "contract", contract, contractFields...)
	require.Equal(t, float64(1), contract["contractVersion"])
	requireFields(t, "listed contract", first(t, e.Must(http.StatusOK, "GET", "/api/v1/tools/send_email/contracts", op, nil).JSON()),
		contractFields...)

	endpointFields := []string{"id", "name", "version", "policyPreset", "retryPolicy", "maxAttempts",
		"defaultTimeoutMs", "maxConcurrent", "rateLimitPerMinute", "paused", "circuitFailureThreshold",
		"circuitCooldownMs", "circuit"}
	created := e.Must(http.StatusCreated, "POST", "/api/v1/endpoints", op, map[string]any{"name": "billing"}).JSON()
	requireFields(t, "endpoint", created, endpointFields...)
	require.Equal(t, map[string]any{"state": "closed", "openedAt": nil, "probeAt": nil, "consecutiveFailures": float64(0)},
		created["circuit"])
	require.Nil(t, created["circuitFailureThreshold"], "the breaker is off until a threshold is set")
	require.Equal(t, float64(60000), created["circuitCooldownMs"])
	again := e.Must(http.StatusOK, "POST", "/api/v1/endpoints", op, map[string]any{"name": "billing", "preset": "RELAXED"}).JSON()
	require.Equal(t, created, again, "an existing name answers 200 unchanged")
	epID := created["id"].(string)
	e.Must(http.StatusNotFound, "GET", "/api/v1/endpoints/"+epID+"/policy", other.Key, nil)
	e.Must(http.StatusNotFound, "POST", "/api/v1/endpoints/"+epID+"/circuit/close", other.Key, nil)
	noVersion := e.Must(http.StatusBadRequest, "PUT", "/api/v1/endpoints/"+epID+"/policy", op, map[string]any{"preset": "RELAXED"})
	require.Contains(t, string(noVersion.Body), `"field":"expectedVersion"`)
	rel := e.Must(http.StatusOK, "PUT", "/api/v1/endpoints/"+epID+"/policy", op,
		map[string]any{"expectedVersion": created["version"], "preset": "RELAXED"}).JSON()
	requireFields(t, "put endpoint", rel, endpointFields...)
	require.Equal(t, "RELAXED", rel["policyPreset"])
	badCircuit := e.Must(http.StatusBadRequest, "PUT", "/api/v1/endpoints/"+epID+"/policy", op,
		map[string]any{"expectedVersion": rel["version"], "circuitFailureThreshold": 0, "circuitCooldownMs": 500})
	require.Contains(t, string(badCircuit.Body), `"field":"circuitFailureThreshold"`)
	require.Contains(t, string(badCircuit.Body), `"field":"circuitCooldownMs"`)
	breaker := e.Must(http.StatusOK, "PUT", "/api/v1/endpoints/"+epID+"/policy", op,
		map[string]any{"expectedVersion": rel["version"], "circuitFailureThreshold": 5, "circuitCooldownMs": 30000}).JSON()
	require.Equal(t, float64(5), breaker["circuitFailureThreshold"])
	require.Equal(t, float64(30000), breaker["circuitCooldownMs"])
	paused := e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+epID+"/pause", op, nil).JSON()
	require.Equal(t, true, paused["paused"])
	closed := e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+epID+"/circuit/close", op, nil).JSON()
	requireFields(t, "closed circuit endpoint", closed, endpointFields...)
	require.Equal(t, "closed", closed["circuit"].(map[string]any)["state"])
	require.Equal(t, paused, closed, "closing a closed circuit answers the endpoint unchanged")
	require.Equal(t, false, e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+epID+"/resume", op, nil).JSON()["paused"])
	// An open circuit's shape (lib/jobs opens them by reported failures), and close clears it.
	_, err := e.App.Pool.Exec(context.Background(), `UPDATE job_endpoints SET circuit_state = 'open',
		circuit_opened_at = now(), circuit_probe_at = now() + interval '30 seconds', circuit_failures = 5
		WHERE id = $1::text`, epID)
	require.NoError(t, err)
	open := e.Must(http.StatusOK, "GET", "/api/v1/endpoints/"+epID+"/policy", op, nil).JSON()
	require.Equal(t, "open", open["circuit"].(map[string]any)["state"])
	require.NotNil(t, open["circuit"].(map[string]any)["openedAt"])
	require.NotNil(t, open["circuit"].(map[string]any)["probeAt"])
	require.Equal(t, float64(5), open["circuit"].(map[string]any)["consecutiveFailures"])
	reclosed := e.Must(http.StatusOK, "POST", "/api/v1/endpoints/"+epID+"/circuit/close", op, nil).JSON()
	require.Equal(t, map[string]any{"state": "closed", "openedAt": nil, "probeAt": nil, "consecutiveFailures": float64(0)},
		reclosed["circuit"])

	e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/finish", e.ingest, nil)
	require.Equal(t, true, e.Must(http.StatusOK, "POST", "/api/v1/runs/"+runID+"/steps", e.ingest, enqueue).JSON()["deduplicated"])
	late := e.Must(http.StatusConflict, "POST", "/api/v1/runs/"+runID+"/steps", e.ingest,
		map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"new": true}})
	require.Equal(t, apierr.CodeInvalidState, late.ErrorCode())
}

// TestConformanceEveryRequestRejectsUnknownFields: every route's request body
// refuses an unknown field with 400 invalid_request naming it (§0).
func TestConformanceEveryRequestRejectsUnknownFields(t *testing.T) {
	t.Parallel()
	for _, r := range httpapi.Routes() {
		if r.Request == nil {
			continue
		}
		dst := reflect.New(reflect.TypeOf(r.Request)).Interface()
		err := httpapi.DecodeJSON([]byte(`{"zz_not_a_field":1}`), dst)
		var ae *apierr.Error
		require.ErrorAs(t, err, &ae, r.Name)
		require.Equal(t, apierr.CodeInvalidRequest, ae.Code, r.Name)
		require.Equal(t, "zz_not_a_field", ae.Detail["validation"].([]apierr.FieldError)[0].Field, r.Name)
	}
}

// TestConformanceDecisions: the extra fields of each begin decision (§2.1).
func TestConformanceDecisions(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	op := e.ws.Key
	begin := func(status int, body map[string]any) map[string]any {
		t.Helper()
		d := e.Must(status, "POST", "/api/v1/effects/begin", op, body).JSON()
		requireFields(t, "decision", d, "decision", "effect_id", "state", "attempt")
		return d
	}
	body := map[string]any{"effect_type": "e.x", "idempotency_key": "k", "payload": map[string]any{}, "lease_seconds": 5}
	begin(http.StatusOK, body)
	inFlight := begin(http.StatusOK, body)
	require.Equal(t, "in_flight", inFlight["decision"])
	requireFields(t, "in_flight", inFlight, "retry_after_seconds")
	e.clock.Add(6 * time.Second)
	blocked := begin(http.StatusOK, body)
	require.Equal(t, "blocked", blocked["decision"])
	require.Equal(t, []string{"attempt", "lease_expired_at", "started_at"}, keysOf(blocked["prior_attempt"].(map[string]any)))
	e.Must(http.StatusOK, "PUT", "/api/v1/policies/e.x", op, map[string]any{"on_indeterminate": "probe"})
	probe := begin(http.StatusOK, body)
	require.Equal(t, "execute", probe["decision"])
	require.Equal(t, true, probe["probe"])
	requireFields(t, "probe", probe, "lease_token", "lease_expires_at", "prior_attempt")

	e.Must(http.StatusOK, "PUT", "/api/v1/policies/p.a", op, map[string]any{"mode": "require_approval"})
	held := map[string]any{"effect_type": "p.a", "idempotency_key": "z", "payload": map[string]any{}}
	a := begin(http.StatusOK, held)
	require.Equal(t, "approval_required", a["decision"])
	require.Equal(t, float64(0), a["attempt"], "an approval wait consumes no attempt")
	rejected := e.Must(http.StatusOK, "POST", "/api/v1/approvals/"+a["approval_id"].(string)+"/reject", op,
		map[string]any{"note": "no"}).JSON()
	require.Equal(t, "rejected", rejected["state"])
	denied := begin(http.StatusForbidden, held)
	require.Equal(t, "denied", denied["decision"])
	require.Equal(t, apierr.CodeApprovalRejected, denied["error"].(map[string]any)["code"])
	held["payload"] = map[string]any{"other": 1}
	require.Equal(t, apierr.CodeIdempotencyKeyReuse,
		e.Must(http.StatusConflict, "POST", "/api/v1/effects/begin", op, held).ErrorCode())
}

// TestTimestampsReadBackAsWritten: Postgres keeps microseconds, so a write's
// answer carries the time at that precision too; otherwise a client that
// compares the answer with a later read of the same object sees two times.
func TestTimestampsReadBackAsWritten(t *testing.T) {
	t.Parallel()
	c := apitest.NewClock(time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC))
	env := apitest.Start(t, apitest.WithNow(c.Now))
	ws := env.Signup()

	run := env.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key, map[string]any{"name": "r"}).JSON()
	read := env.Must(http.StatusOK, "GET", "/api/v1/runs/"+run["id"].(string), ws.Key, nil).JSON()
	require.Equal(t, read["createdAt"], run["createdAt"], "run")
	require.Equal(t, "2026-11-29T12:00:00.123456Z", run["createdAt"])

	step := map[string]any{"name": "send_email", "version": "1", "input": 1, "idempotencyKey": "k"}
	first := env.Must(http.StatusCreated, "POST", "/api/v1/runs/"+run["id"].(string)+"/steps", ws.Key, step).JSON()
	again := env.Must(http.StatusOK, "POST", "/api/v1/runs/"+run["id"].(string)+"/steps", ws.Key, step).JSON()
	require.Equal(t, again["dueAt"], first["dueAt"], "enqueue and its duplicate")

	wh := env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", ws.Key,
		map[string]any{"url": "https://example.com/h", "events": []string{"run.finished"}}).JSON()
	list := env.Must(http.StatusOK, "GET", "/api/v1/webhooks", ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, list, 1)
	require.Equal(t, list[0].(map[string]any)["created_at"], wh["created_at"], "webhook")
}

// A path with an empty or dot segment (an id left blank) is an unknown
// route: 404 in the envelope with a request id, not the mux's bare redirect
// to some other path.
func TestEmptyPathSegmentIs404(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for _, p := range []string{"/api/v1/runs//steps", "/api/v1//queue/health", "/api/v1/effects/./report",
		"/v1/runs//steps"} {
		req, err := http.NewRequest("POST", env.Server.URL+p, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+ws.Key)
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		res, err := client.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		require.Equal(t, http.StatusNotFound, res.StatusCode, "%s: %s", p, body)
		require.Contains(t, string(body), `"not_found"`, p)
		require.NotEmpty(t, res.Header.Get("X-Request-Id"), p)
	}
}

// A compressed body is refused as such, nothing done: nothing decompresses
// it, and it read as invalid JSON at offset 1 (QA). identity is no
// compression.
func TestACompressedBodyIsRefusedAsSuch(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, err := w.Write([]byte(`{"name":"zipped"}`))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	postTo := func(path, encoding string, body []byte) *http.Response {
		req, err := http.NewRequest("POST", env.Server.URL+path, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+ws.Key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Content-Encoding", encoding)
		res, err := env.Client.Do(req)
		require.NoError(t, err)
		return res
	}
	// The MCP endpoint, which reads its own body, refuses it alike (MCP QA:
	// it ran the call).
	for _, path := range []string{"/api/v1/runs", "/api/v1/mcp"} {
		for _, enc := range []string{"gzip", "br", "gzip, identity"} {
			res := postTo(path, enc, gz.Bytes())
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			require.Equal(t, http.StatusBadRequest, res.StatusCode, "%s %s", path, enc)
			require.Contains(t, string(body), `"field":"Content-Encoding"`, "%s %s", path, enc)
		}
	}
	res := postTo("/api/v1/runs", "identity", []byte(`{"name":"plain"}`))
	res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	var runs int
	require.NoError(t, env.App.Pool.QueryRow(t.Context(), `SELECT count(*) FROM job_runs WHERE workspace_id = $1`,
		ws.ID).Scan(&runs))
	require.Equal(t, 1, runs, "only the plain body's run")
}

// A NUL in any string of a body (JSON's \u0000) is a bad request, not an
// internal error: PostgreSQL stores no NUL in text or jsonb. An escaped
// backslash before u0000 is not a NUL.
func TestNULIsABadRequest(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/api/v1/keys", `{"name":"a\u0000b","preset":"AGENT"}`},
		{"POST", "/api/v1/runs", `{"name":"\u0000"}`},
		{"POST", "/api/v1/effects/begin", `{"effect_type":"email.send","idempotency_key":"k","payload":{"a\u0000":1}}`},
		{"POST", "/api/v1/groups", `{"name":"x\"\u0000"}`},
	} {
		r := env.Do(tc.method, tc.path, ws.Key, tc.body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s %s: %s", tc.method, tc.path, r.Body)
		require.Equal(t, "invalid_request", r.ErrorCode())
	}
	// Query parameters too, and text that is not UTF-8 (PostgreSQL takes
	// neither), on every list and filter.
	for _, q := range []string{"/api/v1/effects?cursor=%00", "/api/v1/effects?cursor=%FF%FE",
		"/api/v1/effects?effect_type=%C3", "/api/v1/approvals?state=%FF", "/api/v1/keys?cursor=%FF",
		"/api/v1/webhooks?cursor=%FF", "/api/v1/endpoints?cursor=%FF", "/api/v1/policies?cursor=%FF",
		"/api/v1/tools/a%FFb/contracts", "/api/v1/tools/a%00b/contracts"} {
		r := env.Do("GET", q, ws.Key, nil)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", q, r.Body)
		require.Equal(t, "invalid_request", r.ErrorCode(), q)
	}
	// An id that cannot be text names nothing: 404, as an unknown id is.
	for _, q := range []string{"/api/v1/runs/run_%00", "/api/v1/effects/%FF", "/api/v1/steps/a%00b/replay"} {
		r := env.Do("GET", q, ws.Key, nil)
		require.Equal(t, http.StatusNotFound, r.Status, "%s: %s", q, r.Body)
		require.Equal(t, "not_found", r.ErrorCode(), q)
	}
	r := env.Do("POST", "/api/v1/workers/wrk_%00/claim", ws.Key, `{}`)
	require.Equal(t, http.StatusNotFound, r.Status, "%s", r.Body)
	require.Contains(t, string(r.Body), "No such worker in this workspace.")
	env.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key, `{"name":"C:\\u0000dir"}`)
	// A lone UTF-16 surrogate reads as U+FFFD too ("k\ud800" and "k\udbff"
	// would be one key); a pair is a character like any other.
	for _, k := range []string{`k\ud800`, `k\udbff`, `k\udc00x`, `k\ud800\u0041`} {
		r := env.Do("POST", "/api/v1/effects/begin", ws.Key, `{"effect_type":"u.x","idempotency_key":"`+k+`"}`)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", k, r.Body)
	}
	env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key, `{"effect_type":"u.x","idempotency_key":"k\ud83d\ude00"}`)
	// Bytes that are not UTF-8 are not JSON: encoding/json would read both
	// keys below as "k\uFFFD1", one effect for two keys.
	for _, body := range []string{"{\"effect_type\":\"u.x\",\"idempotency_key\":\"k\xff1\"}",
		"{\"effect_type\":\"u.x\",\"idempotency_key\":\"k\xfe1\"}"} {
		r := env.Do("POST", "/api/v1/effects/begin", ws.Key, body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s", r.Body)
		require.Equal(t, "invalid_request", r.ErrorCode())
	}
}

// Field names are exact: a key that names a field only by encoding/json's
// case-folding is unknown (400 with its path), wherever it sits; free-form
// documents (payload, input) keep whatever keys they have.
func TestFieldNamesAreCaseSensitive(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for _, tc := range []struct{ method, path, body, field string }{
		{"POST", "/api/v1/keys", `{"name":"a","PRESET":"AGENT"}`, "PRESET"},
		{"POST", "/api/v1/effects/begin", `{"Effect_Type":"email.send","idempotency_key":"k"}`, "Effect_Type"},
		{"POST", "/api/v1/effects/begin", `{"effect_type":"email.send","idempotency_key":"k","compensation":{"Effect_type":"x"}}`,
			"compensation.Effect_type"},
		{"POST", "/api/v1/workers/register", `{"tools":[{"name":"a","Version":"1"}]}`, "tools.0.Version"},
	} {
		require.Equal(t, []string{tc.field}, validationFields(t, env.Do(tc.method, tc.path, ws.Key, tc.body)), tc.body)
	}
	d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		`{"effect_type":"email.send","idempotency_key":"k2","payload":{"Preset":1,"EFFECT_TYPE":2}}`).JSON()
	require.Equal(t, "execute", d["decision"])
}

// A key repeated in one object is refused with its path, wherever it sits,
// free-form payloads and inputs included: encoding/json would keep the last,
// other parsers (a proxy, a worker) the first. Nothing is written.
func TestRepeatedKeysAreRefused(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for _, tc := range []struct{ method, path, body, field string }{
		{"POST", "/api/v1/effects/begin", `{"effect_type":"email.send","idempotency_key":"k","effect_type":"refund"}`,
			"effect_type"},
		{"POST", "/api/v1/effects/begin", `{"effect_type":"email.send","idempotency_key":"k","payload":{"to":"a","n":{"x":1,"x":2}}}`,
			"payload.n.x"},
		{"POST", "/api/v1/effects/begin", `{"effect_type":"email.send","idempotency_key":"k","dimensions":{"r":"a","r":"b"}}`,
			"dimensions.r"},
		// An escape spells the same key.
		{"POST", "/api/v1/effects/begin", `{"effect_type":"email.send","idempotency_key":"k","effect\u005ftype":"x"}`,
			"effect_type"},
		{"POST", "/api/v1/workers/register", `{"tools":[{"name":"a","version":"1"},{"name":"b","name":"c","version":"1"}]}`,
			"tools.1.name"},
		// A large object (its keys are kept in a map past a few dozen):
		// the last key repeats the first.
		{"POST", "/api/v1/effects/begin", `{"effect_type":"email.send","idempotency_key":"k","payload":{` +
			manyKeys(40) + `,"k0":2}}`, "payload.k0"},
		// A number no float64 holds reads as Infinity in most languages.
		{"POST", "/api/v1/effects/begin", `{"effect_type":"email.send","idempotency_key":"k","payload":{"n":[1,-1e400]}}`,
			"payload.n.1"},
	} {
		require.Equal(t, []string{tc.field}, validationFields(t, env.Do(tc.method, tc.path, ws.Key, tc.body)), tc.body)
	}
	list := env.Must(http.StatusOK, "GET", "/api/v1/effects", ws.Key, nil).JSON()["data"].([]any)
	require.Empty(t, list, "a refused begin wrote nothing")
	// The same key in two objects, and an escaped key that is another key,
	// are fine.
	d := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		`{"effect_type":"email.send","idempotency_key":"k2","payload":{"a":{"x":1},"b":{"x":1},"x\u0041":[{"y":1},{"y":2}],`+
			`"big":18446744073709551615,"small":1e-400,"e":1.5e300}}`).JSON()
	require.Equal(t, "execute", d["decision"])
}

// manyKeys is n distinct members "k0":0, "k1":1, ... of a JSON object.
func manyKeys(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"k%d":%d`, i, i)
	}
	return strings.Join(parts, ",")
}

// A list's data is an array, never null (API.md §0 and §5: {"data": [...]}),
// and so are the arrays of §2.7, §3.1 and §3.2 that the server always writes
// (a claim's jobs, a replay preview's upgrades and each one's validation, a
// reconciliation's lists): the OpenAPI document says so too, so a client
// generated from it is not told to expect null (QA: every list's data read
// "array or null"), and lib/apitest holds every answer to it.
func TestConformanceAlwaysWrittenArraysAreNotNullable(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(httpapi.OpenAPI())
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]struct {
				Content map[string]struct {
					Schema map[string]any `json:"schema"`
				} `json:"content"`
			} `json:"responses"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	success := func(path, method string) map[string]any {
		t.Helper()
		for status, r := range doc.Paths[path][method].Responses {
			if strings.HasPrefix(status, "2") {
				if s := r.Content["application/json"].Schema; s != nil {
					return s
				}
			}
		}
		t.Fatalf("%s %s has no JSON success schema", method, path)
		return nil
	}
	prop := func(s map[string]any, name string) map[string]any {
		t.Helper()
		p, ok := s["properties"].(map[string]any)[name].(map[string]any)
		require.True(t, ok, "no property %q in %v", name, keysOf(s["properties"].(map[string]any)))
		return p
	}
	lists := 0
	for path, ops := range doc.Paths {
		for method := range ops {
			for status, r := range ops[method].Responses {
				s := r.Content["application/json"].Schema
				if !strings.HasPrefix(status, "2") || s == nil {
					continue
				}
				if p, ok := s["properties"].(map[string]any); ok && p["data"] != nil {
					require.Equal(t, "array", prop(s, "data")["type"], "%s %s: data", method, path)
					lists++
				}
			}
		}
	}
	require.Greater(t, lists, 15)
	for _, c := range []struct {
		path, method string
		fields       []string
	}{
		{"/api/v1/workers/{workerId}/claim", "post", []string{"jobs"}},
		{"/api/v1/steps/{id}/replay", "get", []string{"upgrades"}},
		{"/api/v1/reconcile", "post", []string{"matched", "missing_at_vendor", "unknown_to_ratchet",
			"amount_mismatch", "resolved", "status_mismatch", "unsettled"}},
		// And the arrays of §1, §2 and §3's objects (conformance QA: a
		// key's scopes, an effect's attempts, a policy's
		// required_dimensions and a run's steps read "array or null",
		// though a key holds a scope, an effect with no attempt answers
		// [], a policy [] and a run [] when it has none).
		{"/api/v1/keys", "post", []string{"scopes"}},
		{"/api/v1/keys/current", "get", []string{"scopes"}},
		{"/api/v1/keys/{id}", "delete", []string{"scopes"}},
		{"/api/v1/effects/{id}", "get", []string{"attempts"}},
		{"/api/v1/effects/{id}/report", "post", []string{"attempts"}},
		{"/api/v1/effects/{id}/resolve", "post", []string{"attempts"}},
		{"/api/v1/policies/{effect_type}", "get", []string{"required_dimensions"}},
		{"/api/v1/policies/{effect_type}", "put", []string{"required_dimensions"}},
		{"/api/v1/runs", "post", []string{"steps"}},
		{"/api/v1/runs/{id}", "get", []string{"steps"}},
		// And every other the server always writes (conformance QA: the
		// manifest's, a group's, an unwind's, a batch report's, a
		// structuring read's and a queue's lists read "array or null").
		{"/.well-known/ratchet.json", "get", []string{"routes", "decisions", "scopes"}},
		{"/api/v1/groups", "post", []string{"steps"}},
		{"/api/v1/groups/{id}", "get", []string{"steps"}},
		{"/api/v1/groups/{id}/commit", "post", []string{"steps", "plan", "unresolved"}},
		{"/api/v1/groups/{id}/unwind", "post", []string{"plan", "unresolved", "irreversible", "reversed"}},
		{"/api/v1/jobs/report", "post", []string{"results"}},
		{"/api/v1/policies/{effect_type}/structuring", "get", []string{"windows"}},
	} {
		s := success(c.path, c.method)
		for _, f := range c.fields {
			require.Equal(t, "array", prop(s, f)["type"], "%s %s: %s", c.method, c.path, f)
		}
	}
	upgrade := prop(success("/api/v1/steps/{id}/replay", "get"), "upgrades")["items"].(map[string]any)
	require.Equal(t, "array", prop(upgrade, "validation")["type"], "upgrades[].validation")
	// Lists inside: a manifest route's (any_scopes, when not left out), a
	// preset's scopes, the MCP tools and their icons' sizes, a queue's
	// endpoints, a step's durable job's attempts and replays.
	manifest := success("/.well-known/ratchet.json", "get")
	route := prop(manifest, "routes")["items"].(map[string]any)
	require.Equal(t, "array", prop(route, "scopes")["type"], "routes[].scopes")
	require.Equal(t, "array", prop(route, "any_scopes")["type"], "routes[].any_scopes")
	require.Equal(t, "array", prop(manifest, "presets")["additionalProperties"].(map[string]any)["type"], "presets")
	mcp := prop(manifest, "mcp")
	require.Equal(t, "array", prop(mcp, "tools")["type"], "mcp.tools")
	defs := prop(mcp, "tool_definitions")
	require.Equal(t, "array", defs["type"], "mcp.tool_definitions")
	icons := prop(defs["items"].(map[string]any), "icons")
	require.Equal(t, "array", icons["type"], "mcp.tool_definitions[].icons")
	require.Equal(t, "array", prop(icons["items"].(map[string]any), "sizes")["type"], "icons[].sizes")
	queue := prop(success("/api/v1/queue/health", "get"), "data")["items"].(map[string]any)
	for _, f := range []string{"openCircuitEndpoints", "pausedEndpoints", "atConcurrencyLimitEndpoints", "rateLimitedEndpoints"} {
		require.Equal(t, "array", prop(queue, f)["type"], "queue health: %s", f)
	}
	for _, s := range []map[string]any{success("/api/v1/steps/{id}", "get"),
		prop(success("/api/v1/runs/{id}", "get"), "steps")["items"].(map[string]any),
		prop(success("/api/v1/runs/{id}/steps", "get"), "data")["items"].(map[string]any)} {
		job := prop(s, "durableJob")
		require.Equal(t, "array", prop(job, "attempts")["type"], "durableJob.attempts")
		require.Equal(t, "array", prop(job, "replays")["type"], "durableJob.replays")
	}
}

// TestConformanceNullableResponseArraysAreListed walks every schema the
// document gives the server's writing (each route's answers, success and
// error, and the components: a webhook's body) and requires each array that
// may be null to be one listed here, with what its null means: a slice
// field the server always writes, [] when empty, is tagged
// openapi:"notNull" (or omitempty: left out, never null), so a new one
// cannot read "array or null" unnoticed (conformance QA: twenty-odd arrays
// did, the manifest's, a group's, a queue's, a step's durableJob's among
// them, though none is ever null, and a generated client had to expect it).
func TestConformanceNullableResponseArraysAreListed(t *testing.T) {
	t.Parallel()
	// Null by design: the value says something [] would not.
	byDesign := map[string]string{}
	for _, loc := range []string{"POST /api/v1/keys .tools", "GET /api/v1/keys .data[].tools",
		"GET /api/v1/keys/current .tools", "DELETE /api/v1/keys/{id} .tools", "POST /api/v1/workspaces .key.tools"} {
		byDesign[loc] = "a key's tools: null when it is not restricted to tools (API.md: a key with no tools list works any tool)"
	}
	for _, loc := range []string{"GET /api/v1/approvals .data[].answers", "GET /api/v1/approvals/{id} .answers",
		"POST /api/v1/approvals/{id}/approve .answers", "POST /api/v1/approvals/{id}/reject .answers"} {
		byDesign[loc] = "an approval's answers: null while pending and for a rejection"
	}

	found := map[string]bool{}
	walkAnswerSchemas(t, func(where string, m map[string]any) {
		if types, ok := m["type"].([]any); ok && slices.Contains(types, any("array")) && slices.Contains(types, any("null")) {
			found[where] = true
		}
	})
	requireOnlyListed(t, found, byDesign, "arrays the document says may be null: tag each field openapi:\"notNull\" "+
		"if the server always writes it, else list it here with what its null means")
}

// TestConformanceOmittedResponseFieldsAreNeverNull: a field an answer leaves
// out when it has no value (omitempty: not required) is never null when it
// is there, so its schema allows no null, raw JSON (any value) aside
// (TypeScript SDK QA: begin's lease_expires_at, a denial's probe,
// prior_attempt and retry_after_seconds, a commit's deduplicated read "or
// null", and a typed client declared them so or disagreed with the
// document).
func TestConformanceOmittedResponseFieldsAreNeverNull(t *testing.T) {
	t.Parallel()
	byDesign := map[string]string{
		"components/Error .error.detail.closes_at": "circuit_open: null when the breaker closes only by hand",
	}
	for _, f := range []string{"", ".destructiveHint", ".openWorldHint"} {
		byDesign["GET /.well-known/ratchet.json .mcp.tool_definitions[].annotations"+f] = "the MCP SDK's " +
			"ToolAnnotations writes itself (MarshalJSON), which the document cannot read through"
	}
	found := map[string]bool{}
	walkAnswerSchemas(t, func(where string, m map[string]any) {
		required, _ := m["required"].([]any)
		props, _ := m["properties"].(map[string]any)
		for name, p := range props {
			p, _ := p.(map[string]any)
			types, _ := p["type"].([]any)
			enum, _ := p["enum"].([]any)
			if !slices.Contains(required, any(name)) && (slices.Contains(types, any("null")) || slices.Contains(enum, nil)) {
				found[where+"."+name] = true
			}
		}
	})
	requireOnlyListed(t, found, byDesign, "fields left out when empty that the document says may be null")
}

// A job heartbeat answers its lease's new end (API.md §3.1: {
// "leaseExpiresAt", "cancelRequested" }): every claim sets a job's lease and
// nothing clears it, so it is never null, and the document says so
// (TypeScript SDK QA: it read "string or null", where the SDKs declare a
// time).
func TestConformanceJobHeartbeatAnswersALeaseEnd(t *testing.T) {
	t.Parallel()
	var lease map[string]any
	walkAnswerSchemas(t, func(where string, m map[string]any) {
		if where == "POST /api/v1/jobs/{id}/heartbeat .leaseExpiresAt" {
			lease = m
		}
	})
	require.Equal(t, "string", lease["type"])
	require.Equal(t, "date-time", lease["format"])
}

// requireOnlyListed requires found to hold the places byDesign lists, each
// with its reason, and no other; msg says what an unlisted one is.
func requireOnlyListed(t *testing.T, found map[string]bool, byDesign map[string]string, msg string) {
	t.Helper()
	var unlisted []string
	for loc := range found {
		if _, ok := byDesign[loc]; !ok {
			unlisted = append(unlisted, loc)
		}
	}
	sort.Strings(unlisted)
	require.Empty(t, unlisted, msg)
	for loc, why := range byDesign {
		require.True(t, found[loc], "%s (%s) is listed as null by design, but the document no longer says so", loc, why)
	}
}

// walkAnswerSchemas calls visit with every schema the document gives the
// server's writing (each route's answers, success and error, and the
// components: a webhook's body) and each schema within them, named by
// where it is: "GET /api/v1/keys .data[].tools", "components/Error .error".
func walkAnswerSchemas(t *testing.T, visit func(where string, s map[string]any)) {
	t.Helper()
	b, err := json.Marshal(httpapi.OpenAPI())
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	var walk func(where string, s any)
	walk = func(where string, s any) {
		m, ok := s.(map[string]any)
		if !ok {
			return
		}
		visit(where, m)
		props, _ := m["properties"].(map[string]any)
		for name, p := range props {
			walk(where+"."+name, p)
		}
		walk(where+"[]", m["items"])
		walk(where+"{}", m["additionalProperties"])
		for _, k := range []string{"anyOf", "oneOf", "allOf", "prefixItems"} {
			subs, _ := m[k].([]any)
			for _, sub := range subs {
				walk(where, sub)
			}
		}
	}
	routes := 0
	for path, ops := range doc["paths"].(map[string]any) {
		for method, op := range ops.(map[string]any) {
			for _, r := range op.(map[string]any)["responses"].(map[string]any) {
				content, _ := r.(map[string]any)["content"].(map[string]any)
				for _, c := range content {
					walk(strings.ToUpper(method)+" "+path+" ", c.(map[string]any)["schema"])
				}
			}
			routes++
		}
	}
	require.Greater(t, routes, 50)
	for name, s := range doc["components"].(map[string]any)["schemas"].(map[string]any) {
		walk("components/"+name+" ", s)
	}
}

// TestConformanceEmptyListsAreWrittenAsArrays: the lists the document
// states as never null (TestConformanceAlwaysWrittenArraysAreNotNullable) are
// [] in their empty cases, over HTTP: a group without steps, its commit
// and its unwind; a type's structuring before any begin; a queue nothing
// holds; a step never tried nor replayed, alone and in its run; a batch
// report refused item by item; and a manifest route without alternatives
// leaves any_scopes out. (Every answer is checked against the document by
// apitest too, so a null there would fail it.)
func TestConformanceEmptyListsAreWrittenAsArrays(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	key := e.ws.Key
	lists := func(r *apitest.Response, names ...string) map[string]json.RawMessage {
		t.Helper()
		var body map[string]json.RawMessage
		r.Decode(t, &body)
		for _, n := range names {
			require.Equal(t, "[]", string(body[n]), "%s: %s", n, r.Body)
		}
		return body
	}

	g := lists(e.Must(http.StatusCreated, "POST", "/api/v1/groups", key, map[string]any{"name": "empty"}), "steps")
	var id string
	require.NoError(t, json.Unmarshal(g["id"], &id))
	lists(e.Must(http.StatusOK, "GET", "/api/v1/groups/"+id, key, nil), "steps")
	lists(e.Must(http.StatusOK, "POST", "/api/v1/groups/"+id+"/commit", key, nil), "steps", "plan", "unresolved")
	lists(e.Must(http.StatusOK, "POST", "/api/v1/groups/"+id+"/unwind", key, nil),
		"plan", "unresolved", "irreversible", "reversed")

	var s gate.Structuring
	e.Must(http.StatusOK, "GET", "/api/v1/policies/email.send/structuring", key, nil).Decode(t, &s)
	require.Len(t, s.Windows, 2)

	runID := e.run()
	stepID := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": 1})["stepId"].(string)
	var health struct {
		Data []map[string]json.RawMessage `json:"data"`
	}
	e.Must(http.StatusOK, "GET", "/api/v1/queue/health", key, nil).Decode(t, &health)
	require.Len(t, health.Data, 1)
	for _, n := range []string{"openCircuitEndpoints", "pausedEndpoints", "atConcurrencyLimitEndpoints", "rateLimitedEndpoints"} {
		require.Equal(t, "[]", string(health.Data[0][n]), n)
	}
	var st struct {
		DurableJob map[string]json.RawMessage `json:"durableJob"`
	}
	e.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID, key, nil).Decode(t, &st)
	require.Equal(t, "[]", string(st.DurableJob["attempts"]))
	require.Equal(t, "[]", string(st.DurableJob["replays"]))
	run := e.getRun(runID)
	require.Equal(t, []any{}, durable(run, 0)["attempts"])
	require.Equal(t, []any{}, durable(run, 0)["replays"])

	r := e.Must(http.StatusOK, "POST", "/api/v1/jobs/report", e.worker, map[string]any{"reports": []map[string]any{
		{"jobId": "job_nothing", "leaseToken": "x", "status": "SUCCEEDED"}}})
	var rep jobs.BatchReportResponse
	r.Decode(t, &rep)
	require.Len(t, rep.Results, 1)
	require.NotNil(t, rep.Results[0].Error)

	var m struct {
		Routes []map[string]json.RawMessage `json:"routes"`
	}
	e.Must(http.StatusOK, "GET", "/.well-known/ratchet.json", "", nil).Decode(t, &m)
	plain := 0
	for _, route := range m.Routes {
		if _, ok := route["any_scopes"]; !ok {
			plain++
			require.NotEqual(t, "null", string(route["scopes"]))
		} else {
			require.NotEqual(t, "null", string(route["any_scopes"]))
		}
	}
	require.Greater(t, plain, 0)
}

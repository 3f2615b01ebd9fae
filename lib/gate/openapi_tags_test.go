package gate_test

import (
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/schematags"
)

// dimensionNames are names to try against a tag's name rule: valid ones,
// every kind begin refuses, and the longest allowed and one past it.
var dimensionNames = []string{"recipient", "a", "A9._-", ".x", "-x", "_x", "a b", "a:b", "é", "",
	strings.Repeat("a", 64), strings.Repeat("a", 65)}

// tagAdmits reports whether a name pattern and length tag admit name.
func tagAdmits(pattern, maxLength, name string) bool {
	most, err := strconv.Atoi(maxLength)
	return err == nil && regexp.MustCompile(pattern).MatchString(name) && len([]rune(name)) <= most
}

// The openapi tags of a policy PUT restate the bounds its handler checks,
// and which fields may be null: each is held to the handler
// (apitest.CheckRequestTags), so neither drifts from the other without a
// failing test.
func TestPolicyOpenAPITagsAgreeWithTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	typ := reflect.TypeFor[gate.PutPolicyRequest]()
	checked := apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: typ,
		Base: func(string) map[string]any { return map[string]any{} },
		Send: func(body map[string]any) *apitest.Response {
			return b.env.Do("PUT", "/api/v1/policies/"+apitest.Unique("tags.t"), b.ws.Key, body)
		},
	})
	require.Greater(t, checked, 40, "the policy's bounds are tagged")

	// The policy as answered carries the same tags as the PUT that sets it,
	// but may be notNull where the PUT takes null to clear a value the
	// answer writes otherwise (required_dimensions: null clears it to []).
	answered := reflect.TypeFor[gate.Policy]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if a, ok := answered.FieldByName(f.Name); ok {
			put, answer := schematags.Rules(f), schematags.Rules(a)
			if _, ok := put["notNull"]; !ok {
				delete(answer, "notNull")
			}
			require.Equal(t, put, answer, f.Name)
		}
	}
}

// The effect type's tag (pattern and length) admits exactly what begin
// admits, and the key's and cost's bounds are begin's.
func TestBeginOpenAPITagsAgreeWithTheHandler(t *testing.T) {
	t.Parallel()
	field := func(name string) map[string]string {
		f, ok := reflect.TypeFor[gate.BeginRequest]().FieldByName(name)
		require.True(t, ok, name)
		return schematags.Rules(f)
	}
	et := field("EffectType")
	pattern := regexp.MustCompile(et["pattern"])
	maxLen, err := strconv.Atoi(et["maxLength"])
	require.NoError(t, err)
	for _, s := range []string{"email.send", "a", "A9:_-.", ".x", "-x", "a b", "é", "", strings.Repeat("a", 100),
		strings.Repeat("a", 101), "a/b"} {
		tagged := pattern.MatchString(s) && len([]rune(s)) <= maxLen
		require.Equal(t, gate.ValidEffectType(s), tagged, "%q", s)
	}
	comp, ok := reflect.TypeFor[gate.Compensation]().FieldByName("EffectType")
	require.True(t, ok)
	require.Equal(t, et, schematags.Rules(comp))
	// A reconciliation's type is any type begin takes, and required; its
	// window's ends are required timestamps (contract QA: stated nowhere).
	rec, ok := reflect.TypeFor[gate.ReconcileRequest]().FieldByName("EffectType")
	require.True(t, ok)
	withRequired := maps.Clone(et)
	withRequired["required"] = ""
	require.Equal(t, withRequired, schematags.Rules(rec))

	b := setup(t)
	key := field("IdempotencyKey")
	cost := field("CostMicros")
	longest, _ := strconv.Atoi(key["maxLength"])
	most, _ := strconv.ParseInt(cost["max"], 10, 64)
	b.mustBegin("execute", map[string]any{"effect_type": "tags.begin", "idempotency_key": strings.Repeat("k", longest),
		"cost_micros": most})
	require.ElementsMatch(t, []string{"cost_micros", "idempotency_key"}, validationFields(t, b.env.Do("POST",
		"/api/v1/effects/begin", b.ws.Key, map[string]any{"effect_type": "tags.begin",
			"idempotency_key": strings.Repeat("k", longest+1), "cost_micros": most + 1})))
	require.Equal(t, "0", cost["min"], fmt.Sprint(cost))

	// request_id's length bounds are begin's (docs QA: the schema had none).
	rid := field("RequestID")
	shortest, _ := strconv.Atoi(rid["minLength"])
	longestID, _ := strconv.Atoi(rid["maxLength"])
	for n, ok := range map[int]bool{shortest - 1: false, shortest: true, longestID: true, longestID + 1: false} {
		r := b.env.Do("POST", "/api/v1/effects/begin", b.ws.Key, map[string]any{"effect_type": "tags.begin",
			"idempotency_key": fmt.Sprint("rid-", n), "request_id": strings.Repeat("r", n)})
		require.Equal(t, ok, r.Status == http.StatusOK, "%d: %s", n, r.Body)
	}

	// dimensions' bounds are begin's: how many, which names, each value's
	// length (docs QA: the schema said only "an object of strings").
	dims := field("Dimensions")
	most, _ = strconv.ParseInt(dims["maxProperties"], 10, 64)
	valMin, _ := strconv.Atoi(dims["valueMinLength"])
	valMax, _ := strconv.Atoi(dims["valueMaxLength"])
	require.Positive(t, int(most)*valMin*valMax, fmt.Sprint(dims))
	n := 0
	refused := func(d map[string]string) bool {
		n++
		r := b.env.Do("POST", "/api/v1/effects/begin", b.ws.Key, map[string]any{"effect_type": "tags.dims",
			"idempotency_key": fmt.Sprint("dims-", n), "dimensions": d})
		if r.Status == http.StatusOK {
			return false
		}
		require.NotEmpty(t, validationFields(t, r), "%v", d)
		return true
	}
	for _, name := range dimensionNames {
		tagged := tagAdmits(dims["keyPattern"], dims["keyMaxLength"], name)
		require.Equal(t, tagged, !refused(map[string]string{name: "v"}), "%q", name)
	}
	for length, ok := range map[int]bool{valMin - 1: false, valMin: true, valMax: true, valMax + 1: false} {
		require.Equal(t, ok, !refused(map[string]string{"to": strings.Repeat("é", length)}), "value of %d", length)
	}
	for count, ok := range map[int64]bool{most: true, most + 1: false} {
		d := map[string]string{}
		for i := range count {
			d[fmt.Sprint("d", i)] = "v"
		}
		require.Equal(t, ok, !refused(d), "%d dimensions", count)
	}
}

// A policy's dimension lists state begin's name rule and their own limits
// (how many, no repeats), held to the PUT's checks here; the answered
// policy carries the same tags (TestPolicyOpenAPITagsAgreeWithTheHandler).
func TestPolicyDimensionTagsAgreeWithTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	field := func(name string) map[string]string {
		f, ok := reflect.TypeFor[gate.PutPolicyRequest]().FieldByName(name)
		require.True(t, ok, name)
		return schematags.Rules(f)
	}
	accepted := func(body map[string]any) bool {
		r := b.env.Do("PUT", "/api/v1/policies/tags.dims", b.ws.Key, body)
		if r.Status == http.StatusOK {
			return true
		}
		require.NotEmpty(t, validationFields(t, r), "%v", body)
		return false
	}
	listed := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprint("d", i)
		}
		return out
	}

	req := field("RequiredDimensions")
	most, _ := strconv.Atoi(req["maxItems"])
	require.Contains(t, req, "uniqueItems")
	for _, name := range dimensionNames {
		tagged := tagAdmits(req["itemPattern"], req["itemMaxLength"], name)
		require.Equal(t, tagged, accepted(map[string]any{"required_dimensions": []string{name}}), "%q", name)
	}
	require.True(t, accepted(map[string]any{"required_dimensions": listed(most)}))
	require.False(t, accepted(map[string]any{"required_dimensions": listed(most + 1)}))
	require.False(t, accepted(map[string]any{"required_dimensions": []string{"to", "to"}}))

	lim := field("DimensionLimits")
	most, _ = strconv.Atoi(lim["maxProperties"])
	limits := func(names ...string) map[string]any {
		out := map[string]any{}
		for _, n := range names {
			out[n] = map[string]any{"daily_count": 1}
		}
		return map[string]any{"dimension_limits": out}
	}
	for _, name := range dimensionNames {
		tagged := tagAdmits(lim["keyPattern"], lim["keyMaxLength"], name)
		require.Equal(t, tagged, accepted(limits(name)), "%q", name)
	}
	require.True(t, accepted(limits(listed(most)...)))
	require.False(t, accepted(limits(listed(most+1)...)))
}

// An approval decision's note, a group's create and a reconciliation's
// records state in the document the bounds and values their handlers
// check (the document stated none), held to them here.
func TestDecideGroupAndReconcileTagsAgreeWithTheHandlers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("tags.approve", map[string]any{"mode": "require_approval"})
	checked := apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: reflect.TypeFor[gate.DecideRequest](),
		// Each decision decides an approval of its own: the id rides in
		// the body until Send takes it out.
		Base: func(string) map[string]any {
			a := b.mustBegin("approval_required", map[string]any{"effect_type": "tags.approve",
				"idempotency_key": key("approve")})
			return map[string]any{"approval": a["approval_id"]}
		},
		Send: func(body map[string]any) *apitest.Response {
			id := str(body["approval"])
			delete(body, "approval")
			return b.env.Do("POST", "/api/v1/approvals/"+id+"/approve", b.ws.Key, body)
		},
	})
	require.Greater(t, checked, 2, "a decision's note is tagged")

	checked = apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: reflect.TypeFor[gate.CreateGroupRequest](),
		Base: func(string) map[string]any { return map[string]any{"name": "tags"} },
		Send: func(body map[string]any) *apitest.Response {
			return b.env.Do("POST", "/api/v1/groups", b.ws.Key, body)
		},
	})
	require.GreaterOrEqual(t, checked, 10, "a group's create is tagged")

	now := time.Now().UTC()
	checked = apitest.CheckRequestTags(t, apitest.TagProbe{
		Type:   reflect.TypeFor[gate.ReconcileRecord](),
		Prefix: "records.0.",
		Base: func(string) map[string]any {
			return map[string]any{"idempotency_key": apitest.Unique("tags-rec-"), "status": "succeeded",
				"amount_micros": 100}
		},
		Send: func(record map[string]any) *apitest.Response {
			return b.env.Do("POST", "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": "tags.reconcile",
				"from": now.Add(-time.Hour).Format(time.RFC3339), "to": now.Format(time.RFC3339),
				"records": []any{record}})
		},
	})
	require.Greater(t, checked, 10, "a reconciliation record is tagged")

	// The request's own fields: each required one is refused when left out.
	checked = apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: reflect.TypeFor[gate.ReconcileRequest](),
		Base: func(string) map[string]any {
			return map[string]any{"effect_type": "tags.reconcile", "from": now.Add(-time.Hour).Format(time.RFC3339),
				"to": now.Format(time.RFC3339), "records": []any{}}
		},
		Send: func(body map[string]any) *apitest.Response {
			return b.env.Do("POST", "/api/v1/reconcile", b.ws.Key, body)
		},
	})
	require.GreaterOrEqual(t, checked, 4, "a reconciliation's fields are tagged")
}

// A reconciliation's records state in the document the count its handler
// takes (verification QA: enforced, not stated): none (the vendor has no
// records in the window) up to maxItems, which is accepted, and one more
// refused naming records.
func TestReconcileRecordsTagsAgreeWithTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f, ok := reflect.TypeFor[gate.ReconcileRequest]().FieldByName("Records")
	require.True(t, ok)
	rules := schematags.Rules(f)
	most, err := strconv.Atoi(rules["maxItems"])
	require.NoError(t, err, "records states its greatest count")
	require.Equal(t, gate.MaxReconcileRecords, most)
	require.NotContains(t, rules, "minItems", "an empty list is taken")

	now := time.Now().UTC()
	send := func(n int) *apitest.Response {
		records := make([]map[string]any, n)
		for i := range records {
			records[i] = map[string]any{"idempotency_key": fmt.Sprintf("r%05d", i), "status": "pending"}
		}
		return b.env.Do("POST", "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": "tags.records",
			"from": now.Add(-time.Hour).Format(time.RFC3339), "to": now.Format(time.RFC3339), "records": records})
	}
	for _, n := range []int{0, most} {
		r := send(n)
		require.Equal(t, http.StatusOK, r.Status, "%d records: %s", n, r.Body)
	}
	require.Equal(t, []string{"records"}, validationFields(t, send(most+1)))
}

// A dimension's limit in a policy PUT is stated in the OpenAPI document as
// the object the handler takes, {daily_micros, daily_count}, with their
// bounds, held to the handler here (contract QA: the request's
// dimension_limits took any value per dimension in the document, while the
// answer's were typed, so a client generated from it could not tell what
// to send).
func TestDimensionLimitTagsAgreeWithTheHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	checked := apitest.CheckRequestTags(t, apitest.TagProbe{
		Type:   reflect.TypeFor[gate.DimensionLimit](),
		Prefix: "dimension_limits.r.",
		// The other field set, so that the one under test alone may be
		// null or left out (a limit must set one of them).
		Base: func(field string) map[string]any {
			if field == "daily_count" {
				return map[string]any{"daily_micros": 5}
			}
			return map[string]any{"daily_count": 1}
		},
		Send: func(limit map[string]any) *apitest.Response {
			return b.env.Do("PUT", "/api/v1/policies/"+apitest.Unique("tags.limit"), b.ws.Key,
				map[string]any{"dimension_limits": map[string]any{"r": limit}})
		},
	})
	require.GreaterOrEqual(t, checked, 5, "a limit's bounds are tagged")

	// The document's PUT states the limit as the answer's limit is stated,
	// but that a PUT may leave either field out; an unknown field is
	// refused (decodeDimensionLimit), and so in the document.
	openapi, at := apitest.OpenAPIDoc(t), apitest.At
	put := at(openapi, "paths", "/api/v1/policies/{effect_type}", "put")
	limit := []string{"content", "application/json", "schema", "properties", "dimension_limits",
		"additionalProperties"}
	sent, _ := at(put, append([]string{"requestBody"}, limit...)...).(map[string]any)
	answered, _ := at(put, append([]string{"responses", "200"}, limit...)...).(map[string]any)
	require.NotNil(t, sent, "the document states a PUT's limit: %v", put)
	require.Equal(t, false, sent["additionalProperties"], "an unknown field is refused")
	require.Equal(t, answered["properties"], sent["properties"], "the same fields, with the same bounds")
	require.Nil(t, sent["required"], "a PUT's limit may leave either field out")
	require.EqualValues(t, 1, sent["minProperties"], "but not both")
	for _, field := range []string{"daily_micros", "daily_count"} {
		require.Contains(t, answered["properties"], field)
	}
	require.Equal(t, []string{"dimension_limits.r"}, validationFields(t, b.env.Do("PUT",
		"/api/v1/policies/tags.limit.empty", b.ws.Key, map[string]any{"dimension_limits": map[string]any{"r": map[string]any{}}})),
		"an empty limit is refused, as minProperties says")
}

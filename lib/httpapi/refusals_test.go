package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/mcpserver"
)

// TestRefusalsChangeNothing holds every route of the served OpenAPI document
// to API.md §0 and §5: bad input is answered with its documented status and
// error code (400 invalid_request naming the field in detail.validation,
// 404 not_found for an id this caller cannot see, 413 payload_too_large,
// 401 unauthorized for a credential that is none), and changes nothing: a
// digest of every table's rows is the same after the refusal as before it.
//
// The routes come from the document, so a new route is covered as it is
// added: its body's cases from its request schema (each member's type,
// nullability, bounds, enum, pattern and required-ness, at every level of
// a valid body in refusalSeeds), its query's from its parameters, its
// path's from the kind of id it names. Where only one thing is wrong the
// rest of the request is valid, so a route that let it through would act
// and the digest would show it. A route with no case fails the test unless
// refusalNothingToRefuse says why it has none.
//
// Not parallel: the digest covers the whole database, which the package's
// other tests write to, and the parallel ones start only once every test
// that is not has ended. About 2 000 requests, each between two digests.
func TestRefusalsChangeNothing(t *testing.T) {
	w := newRefusalWorld(t)
	doc := apitest.OpenAPIDoc(t)
	paths, _ := doc["paths"].(map[string]any)
	for _, path := range slices.Sorted(maps.Keys(paths)) {
		ops, _ := paths[path].(map[string]any)
		for _, method := range slices.Sorted(maps.Keys(ops)) {
			op, _ := ops[method].(map[string]any)
			route := strings.ToUpper(method) + " " + path
			cases := w.casesFor(t, strings.ToUpper(method), path, op)
			reason, exempt := refusalNothingToRefuse[route]
			switch {
			case len(cases) == 0 && !exempt:
				t.Errorf("%s: no bad-input case; add a seed (refusalSeeds) or list it with its reason "+
					"(refusalNothingToRefuse)", route)
			case len(cases) > 0 && exempt:
				t.Errorf("%s is listed as having nothing to refuse (%s), yet has %d cases", route, reason, len(cases))
			}
			t.Run(route, func(t *testing.T) {
				for _, c := range cases {
					w.expectRefused(t, c)
				}
			})
		}
	}
}

// refusalNothingToRefuse lists the routes that read no input a caller can
// get wrong, each with why.
var refusalNothingToRefuse = map[string]string{
	"GET /api/v1/health":            "public: no path parameter, no body, and takes any query (README)",
	"GET /api/v1/openapi.json":      "public discovery document: no path parameter, no body, any query",
	"GET /.well-known/ratchet.json": "public discovery document: no path parameter, no body, any query",
	"GET /llms.txt":                 "public discovery document: no path parameter, no body, any query",
}

// refusalUntouched names the tables a refused request is documented to
// write, each with the rule; every other table must read the same after a
// refusal. None here: the one such table, rate_counters (README, Rate
// limits: "A refused request still counts"), counts only the requests of
// a key with a rate_limit_per_minute, and the caller's operator key has
// none, so its refusals must leave that table alone too.
var refusalUntouched = map[string]string{}

// refusalSeeds are valid bodies of the routes whose body has required
// fields (a route whose body requires none starts from {}). Each case
// breaks one thing in its route's seed, or sends it whole with one other
// thing wrong (a path id, the query, a header, the credential), so that a
// route that missed the fault would act. {lease}, {job} and {group} stand
// for the caller's own, {delivery} for a delivery id of nothing.
var refusalSeeds = map[string]string{
	"PUT /api/v1/policies/{effect_type}":          `{"dimension_limits":{"to":{"daily_count":3,"daily_micros":5}},"required_dimensions":["to"]}`,
	"POST /api/v1/workspaces":                     `{"name":"acme"}`,
	"POST /api/v1/effects/begin":                  `{"effect_type":"email.send","idempotency_key":"refusal","group_id":"{group}","compensation":{"effect_type":"email.unsend","payload":{}},"dimensions":{"to":"a@b.c"}}`,
	"POST /api/v1/effects/{id}/heartbeat":         `{"lease_token":"{lease}"}`,
	"POST /api/v1/effects/{id}/report":            `{"lease_token":"{lease}","outcome":"succeeded","result":{"id":"m"}}`,
	"POST /api/v1/effects/{id}/resolve":           `{"outcome":"failed","note":"n"}`,
	"POST /api/v1/endpoints":                      `{"name":"refusal"}`,
	"PUT /api/v1/endpoints/{id}/policy":           `{"expectedVersion":1,"preset":"RELAXED"}`,
	"POST /api/v1/groups":                         `{"name":"g"}`,
	"POST /api/v1/jobs/report":                    `{"reports":[{"jobId":"{job}","leaseToken":"t","status":"SUCCEEDED"}]}`,
	"POST /api/v1/jobs/{id}/heartbeat":            `{"leaseToken":"t"}`,
	"POST /api/v1/jobs/{id}/report":               `{"leaseToken":"t","status":"FAILED","error":{"message":"m","retryable":true,"retryAfterMs":1000}}`,
	"POST /api/v1/keys":                           `{"name":"agent","scopes":["effects:read"],"tools":["send_email@1"]}`,
	"POST /api/v1/reconcile":                      `{"effect_type":"email.send","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","records":[{"idempotency_key":"k","status":"succeeded","amount_micros":5}]}`,
	"POST /api/v1/runs":                           `{"name":"r"}`,
	"POST /api/v1/runs/{id}/steps":                `{"name":"send_email","version":"1","input":{"a":1}}`,
	"POST /api/v1/steps/{id}/replay":              `{"acknowledgeDuplicateRisk":true}`,
	"POST /api/v1/tools/{name}/contracts":         `{"handlerVersion":"2","inputSchema":{"type":"object"},"retryPreset":"CUSTOM","retryPolicy":{"preset":"CUSTOM","maxAttempts":3,"initialDelayMs":1000,"multiplier":2,"maxDelayMs":10000,"jitterPercent":10}}`,
	"POST /api/v1/tools/{name}/test":              `{"version":"1","input":{}}`,
	"POST /api/v1/webhooks":                       `{"url":"https://example.com/h","events":["run.finished"]}`,
	"PATCH /api/v1/webhooks/{id}":                 `{"disabled":false}`,
	"POST /api/v1/webhooks/{id}/deliveries/retry": `{"delivery_ids":["{delivery}"]}`,
	"POST /api/v1/workers/register":               `{"tools":[{"name":"send_email","version":"1"}]}`,
}

// refusal is one bad request and the answer API.md documents for it.
type refusal struct {
	name         string
	method, path string
	key          string
	header       http.Header
	body         any // string, []byte, io.Reader or nil (apitest.Env.Do)
	status       int
	code         string // error.code; for MCP's JSON-RPC refusals, ""
	field        string // invalid_request: a problem's field is this or under it; "" takes any
	rpcCode      int    // MCP: the JSON-RPC error code
	rpcID        any    // MCP: the id the JSON-RPC error answers under (nil: null)
	bodiless     bool   // MCP: a notification or a response, answered 202 without a body
	slot         bool   // a batch: status 200, its one slot refused with code and field
	tool         bool   // an MCP tool call: status 200, its result the error envelope
	// forbidden: detail.required and detail.any_of exactly (nil: not checked)
	required, anyOf []string
}

// refusalWorld is the shared setup: the caller's workspace with one object
// of each kind, another workspace with the same, and the digest query.
type refusalWorld struct {
	env        *apitest.Env
	own, other apitest.Workspace
	ownIDs     map[string]string // by the path segment before the id: "effects" → eff_…
	otherIDs   map[string]string
	subst      map[string]string // seed placeholders
	// keys of the caller's workspace: an AGENT key, a WORKER key whose
	// tools list names one job tool, and a revoked key (MCP's cases).
	agent, worker, revoked string
	// lacking maps a scope set (joined by spaces) to a key of the caller's
	// workspace holding every other scope, uncapped and with no tools
	// list (lackingKey).
	lacking     map[string]string
	digestQuery string
}

func newRefusalWorld(t *testing.T) *refusalWorld {
	env := apitest.Start(t)
	w := &refusalWorld{env: env, own: env.Signup(), other: env.Signup()}
	var lease string
	w.ownIDs, lease = refusalObjects(env, w.own)
	w.otherIDs, _ = refusalObjects(env, w.other)
	w.subst = map[string]string{"{lease}": lease, "{job}": w.ownIDs["jobs"], "{effect}": w.ownIDs["effects"],
		"{group}": w.ownIDs["groups"], "{approval}": w.ownIDs["approvals"], "{delivery}": ids.New("whd")}
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/refusal.cost", w.own.Key, map[string]any{"require_cost": true})
	env.Must(http.StatusOK, "PUT", "/api/v1/policies/refusal.dim", w.own.Key,
		map[string]any{"required_dimensions": []string{"to"}})
	w.agent = env.Key(w.own, map[string]any{"name": "agent", "preset": "AGENT"})
	w.worker = env.Key(w.own, map[string]any{"name": "worker", "preset": "WORKER", "tools": []string{"send_email@1"}})
	revoked := env.Must(http.StatusCreated, "POST", "/api/v1/keys", w.own.Key, map[string]any{"name": "gone",
		"preset": "AGENT"}).JSON()
	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+revoked["id"].(string), w.own.Key, nil)
	w.revoked = revoked["secret"].(string)
	w.lacking = map[string]string{}
	w.digestQuery = refusalDigestQuery(t, env)
	return w
}

// refusalObjects makes one object of each kind a path names in ws, and
// returns their ids by the path segment before the id, and the lease token
// of its effect.
func refusalObjects(env *apitest.Env, ws apitest.Workspace) (map[string]string, string) {
	t := env.T
	key := ws.Key
	must := func(status int, method, path string, body any) map[string]any {
		return env.Must(status, method, path, key, body).JSON()
	}
	out := map[string]string{}
	out["runs"] = must(http.StatusCreated, "POST", "/api/v1/runs", map[string]any{"name": "r"})["id"].(string)
	step := must(http.StatusCreated, "POST", "/api/v1/runs/"+out["runs"]+"/steps",
		map[string]any{"name": "send_email", "version": "1", "input": map[string]any{}})
	out["steps"] = step["stepId"].(string)
	out["jobs"] = step["jobId"].(string)
	must(http.StatusOK, "PUT", "/api/v1/policies/refusal.appr", map[string]any{"mode": "require_approval"})
	held := must(http.StatusOK, "POST", "/api/v1/effects/begin",
		map[string]any{"effect_type": "refusal.appr", "idempotency_key": "held"})
	out["approvals"] = held["approval_id"].(string)
	eff := must(http.StatusOK, "POST", "/api/v1/effects/begin",
		map[string]any{"effect_type": "email.send", "idempotency_key": "seed"})
	out["effects"] = eff["effect_id"].(string)
	out["endpoints"] = must(http.StatusCreated, "POST", "/api/v1/endpoints", map[string]any{"name": "billing"})["id"].(string)
	out["groups"] = must(http.StatusCreated, "POST", "/api/v1/groups", map[string]any{"name": "g"})["id"].(string)
	out["keys"] = must(http.StatusCreated, "POST", "/api/v1/keys", map[string]any{"name": "a", "preset": "AGENT"})["id"].(string)
	out["webhooks"] = must(http.StatusCreated, "POST", "/api/v1/webhooks",
		map[string]any{"url": "https://example.com/h", "events": []string{"run.finished"}})["id"].(string)
	out["workers"] = must(http.StatusCreated, "POST", "/api/v1/workers/register",
		map[string]any{"tools": []any{map[string]any{"name": "send_email", "version": "1"}}})["workerId"].(string)
	must(http.StatusCreated, "POST", "/api/v1/tools/send_email/contracts",
		map[string]any{"handlerVersion": "1", "inputSchema": map[string]any{"type": "object"}})
	for kind, id := range out {
		require.NotEmpty(t, id, kind)
	}
	lease, _ := eff["lease_token"].(string)
	require.NotEmpty(t, lease)
	return out, lease
}

// refusalDigestQuery builds one query that answers, for every table but
// refusalUntouched's, an md5 of its rows' text in text order (no ctid, no
// physical order).
func refusalDigestQuery(t *testing.T, env *apitest.Env) string {
	var q string
	err := env.App.Pool.QueryRow(context.Background(), `
SELECT string_agg(format(
    'SELECT %L AS t, md5(coalesce(string_agg(x::text, E''\n'' ORDER BY x::text), '''')) AS h FROM %I.%I x',
    table_schema || '.' || table_name, table_schema, table_name), ' UNION ALL ' ORDER BY table_schema, table_name)
FROM information_schema.tables
WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')
  AND table_name <> ALL($1)`, slices.AppendSeq([]string{}, maps.Keys(refusalUntouched))).Scan(&q)
	require.NoError(t, err)
	for _, table := range []string{"public.effects", "public.rate_counters", "public.idempotent_requests"} {
		require.Contains(t, q, "'"+table+"'", "the digest covers every table")
	}
	return q
}

// digest is every table's hash by name.
func (w *refusalWorld) digest(t *testing.T) map[string]string {
	rows, err := w.env.App.Pool.Query(context.Background(), w.digestQuery)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, hash string
		require.NoError(t, rows.Scan(&name, &hash))
		out[name] = hash
	}
	require.NoError(t, rows.Err())
	return out
}

// expectRefused sends c and checks its answer and that no table changed.
func (w *refusalWorld) expectRefused(t *testing.T, c refusal) {
	t.Helper()
	before := w.digest(t)
	e := *w.env
	e.T = t // the OpenAPI check reports to this route's test
	res := e.DoWith(c.method, c.path, c.key, c.header, c.body)
	after := w.digest(t)
	for _, table := range slices.Sorted(maps.Keys(before)) {
		if before[table] != after[table] {
			t.Errorf("%s: %s %s (%d) changed table %s", c.name, c.method, c.path, res.Status, table)
		}
	}
	if msg := refusalMismatch(c, res); msg != "" {
		t.Errorf("%s: %s %s: %s; answered %d %s", c.name, c.method, c.path, msg, res.Status, clip(res.Body))
	}
}

// refusalMismatch says how res differs from what c documents ("" when it
// does not).
func refusalMismatch(c refusal, res *apitest.Response) string {
	if res.Status != c.status {
		return fmt.Sprintf("want status %d", c.status)
	}
	if res.Header.Get("X-Request-Id") == "" {
		return "want an X-Request-Id (API.md §0)"
	}
	if c.status == http.StatusUnauthorized && res.Header.Get("WWW-Authenticate") == "" {
		return "want a WWW-Authenticate header (README: every 401 carries one)"
	}
	if c.slot {
		var m struct {
			Results []struct {
				Error json.RawMessage `json:"error"`
			} `json:"results"`
		}
		if json.Unmarshal(res.Body, &m) != nil || len(m.Results) != 1 || m.Results[0].Error == nil {
			return "want its one slot refused"
		}
		return envelopeMismatch(c, mustJSON(map[string]any{"error": m.Results[0].Error}))
	}
	if c.bodiless {
		if len(res.Body) > 0 {
			return "want no body"
		}
		return ""
	}
	if c.rpcCode != 0 {
		var m struct {
			ID    any `json:"id"`
			Error struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(res.Body, &m) != nil || m.Error.Code != c.rpcCode || m.ID != c.rpcID {
			return fmt.Sprintf("want JSON-RPC error %d with id %v", c.rpcCode, c.rpcID)
		}
		return ""
	}
	body := res.Body
	if c.tool {
		var m struct {
			Result struct {
				IsError           bool            `json:"isError"`
				StructuredContent json.RawMessage `json:"structuredContent"`
			} `json:"result"`
		}
		if json.Unmarshal(res.Body, &m) != nil || !m.Result.IsError {
			return "want a tool error result"
		}
		body = m.Result.StructuredContent
	}
	return envelopeMismatch(c, body)
}

// envelopeMismatch says how an error envelope differs from c's code and
// field ("" when it does not).
func envelopeMismatch(c refusal, body []byte) string {
	var env struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Detail  struct {
				Validation []struct {
					Field   *string `json:"field"`
					Message string  `json:"message"`
				} `json:"validation"`
				Required []string `json:"required"`
				AnyOf    []string `json:"any_of"`
			} `json:"detail"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil || env.Error.Code != c.code || env.Error.Message == "" {
		return fmt.Sprintf("want error %s with a message", c.code)
	}
	if c.required != nil && (!slices.Equal(env.Error.Detail.Required, c.required) ||
		!slices.Equal(env.Error.Detail.AnyOf, c.anyOf)) {
		return fmt.Sprintf("want detail.required %v and detail.any_of %v", c.required, c.anyOf)
	}
	if c.code != "invalid_request" {
		return ""
	}
	var fields []string
	for _, p := range env.Error.Detail.Validation {
		if p.Field == nil || p.Message == "" {
			return "a problem has no field or message"
		}
		fields = append(fields, *p.Field)
	}
	if len(fields) == 0 {
		return "want detail.validation"
	}
	for _, f := range fields {
		if c.field == "" || f == c.field || strings.HasPrefix(f, c.field+".") {
			return ""
		}
	}
	return fmt.Sprintf("want a problem at %q", c.field)
}

func clip(b []byte) string {
	if len(b) > 400 {
		return string(b[:400]) + "…"
	}
	return string(b)
}

// casesFor is every bad request the document lets us derive for one route.
func (w *refusalWorld) casesFor(t *testing.T, method, path string, op map[string]any) []refusal {
	route := method + " " + path
	key := w.keyFor(op)
	base := refusal{method: method, key: key, path: w.ownPath(path)}
	if path == "/api/v1/mcp" {
		return w.mcpCases(t, base, method)
	}
	var cases []refusal
	seed, hasBody := w.seedFor(t, route, op)
	var good any // the valid body, sent where something else is wrong
	if hasBody {
		good = mustJSON(seed)
	}
	if key == w.own.Key {
		cases = append(cases, queryCases(base, op, good)...)
	}
	if hasBody {
		schema, _ := apitest.At(op, "requestBody", "content", "application/json", "schema").(map[string]any)
		cases = append(cases, bodyCases(base, seed, schema, refusalBatches[route])...)
		if hdr := refusalIdempotencyHeader(op); hdr {
			cases = append(cases, idempotencyCases(base, seed)...)
		}
	}
	cases = append(cases, w.pathCases(base, path, good)...)
	cases = append(cases, w.bodyIDCases(base, route)...)
	cases = append(cases, w.ruleCases(base, route)...)
	if key != "" {
		cases = append(cases, unauthorized(base, good, nil))
	}
	if key == w.own.Key {
		cases = append(cases, w.scopeCases(t, base, op, good)...)
	}
	return cases
}

// scopeCases: the whole valid request, on the caller's own objects (under an
// Idempotency-Key where the route takes one), from a key that holds every
// scope but one the route requires (each in turn), or none of the scopes
// one of which it requires, is 403 forbidden naming
// what the key lacks (API.md §1, §5: detail.required; README: detail.any_of
// for the alternatives) and changes nothing (security review: TestScopeMatrix
// sent {} to ids that name nothing, so a route that acted before its scope
// check, or on a body, would have passed it).
func (w *refusalWorld) scopeCases(t *testing.T, base refusal, op map[string]any, good any) []refusal {
	var out []refusal
	var header http.Header
	if refusalIdempotencyHeader(op) {
		// Under an Idempotency-Key: no claim is recorded either.
		header = http.Header{"Idempotency-Key": {"refusal-scope"}}
	}
	lacking := func(name string, missing, required, anyOf []string) {
		c := base
		c.name, c.key, c.body, c.header = name, w.lackingKey(t, missing), good, header
		c.status, c.code, c.required, c.anyOf = http.StatusForbidden, "forbidden", required, anyOf
		out = append(out, c)
	}
	required := docStrings(op["x-required-scopes"])
	for _, s := range required {
		lacking("a key without "+s, []string{s}, []string{s}, nil)
	}
	if anyOf := docStrings(op["x-any-of-scopes"]); len(anyOf) > 0 {
		lacking("a key with none of "+strings.Join(anyOf, ", "), anyOf, anyOf[:1], anyOf)
	}
	return out
}

// docStrings reads a list of strings of the OpenAPI document.
func docStrings(v any) []string {
	raw, _ := v.([]any)
	out := make([]string, 0, len(raw))
	for _, s := range raw {
		out = append(out, s.(string))
	}
	return out
}

// lackingKey is a key of the caller's workspace holding every scope but
// missing, minted the first time it is asked for.
func (w *refusalWorld) lackingKey(t *testing.T, missing []string) string {
	name := strings.Join(missing, " ")
	if key, ok := w.lacking[name]; ok {
		return key
	}
	var scopes []string
	for _, s := range auth.AllScopes {
		if !slices.Contains(missing, s) {
			scopes = append(scopes, s)
		}
	}
	e := *w.env
	e.T = t
	key := e.Key(w.own, map[string]any{"name": "lacking", "scopes": scopes})
	w.lacking[name] = key
	return key
}

// unauthorized is base sent with the valid body under a credential that
// is none (API.md §0 and §5: 401 unauthorized, the cron route's too).
func unauthorized(base refusal, body any, header http.Header) refusal {
	c := base
	c.name, c.key, c.body, c.header = "a wrong credential", "rk_not_a_key", body, header
	c.status, c.code = http.StatusUnauthorized, "unauthorized"
	return c
}

// keyFor is the credential the route takes: the caller's operator key, the
// cron secret, or none for a public route.
func (w *refusalWorld) keyFor(op map[string]any) string {
	sec, _ := op["security"].([]any)
	for _, s := range sec {
		m, _ := s.(map[string]any)
		if _, ok := m["cron"]; ok {
			return w.env.App.Config.CronSecret
		}
		if _, ok := m["bearer"]; ok {
			return w.own.Key
		}
	}
	return ""
}

// ownPath fills a path's parameters with the caller's own objects.
func (w *refusalWorld) ownPath(path string) string {
	return fillPath(path, w.ownValue)
}

// ownValue is the caller's own object for a path parameter.
func (w *refusalWorld) ownValue(segment, param string) string {
	switch param {
	case "effect_type":
		return "email.send"
	case "name":
		return "send_email"
	}
	return w.ownIDs[segment]
}

// fillPath replaces each {param} of path with value(the segment before it,
// param).
func fillPath(path string, value func(segment, param string) string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		if strings.HasPrefix(p, "{") && strings.HasSuffix(p, "}") && i > 0 {
			parts[i] = value(parts[i-1], strings.Trim(p, "{}"))
		}
	}
	return strings.Join(parts, "/")
}

// seedFor is the route's valid body with the caller's own ids filled in,
// and whether the route takes a body at all.
func (w *refusalWorld) seedFor(t *testing.T, route string, op map[string]any) (map[string]any, bool) {
	if _, ok := op["requestBody"]; !ok {
		return nil, false
	}
	raw, ok := refusalSeeds[route]
	if !ok {
		if req, _ := apitest.At(op, "requestBody", "content", "application/json", "schema", "required").([]any); len(req) > 0 {
			t.Errorf("%s: its body requires %v; add a valid body to refusalSeeds", route, req)
			return nil, false
		}
		raw = `{}`
	}
	for k, v := range w.subst {
		raw = strings.ReplaceAll(raw, k, v)
	}
	var seed map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &seed), route)
	return seed, true
}

// queryCases: a parameter the route does not take, and each documented one
// given badly (API.md §5, README: a query parameter it does not take or
// given twice is 400 naming it), with the route's valid body, if any.
func queryCases(base refusal, op map[string]any, body any) []refusal {
	out := []refusal{invalid(base, "unknown query parameter", "zz_unknown", body, "?zz_unknown=1")}
	params, _ := op["parameters"].([]any)
	for _, p := range params {
		p, _ := p.(map[string]any)
		if p["in"] != "query" {
			continue
		}
		name, _ := p["name"].(string)
		schema, _ := p["schema"].(map[string]any)
		out = append(out,
			invalid(base, name+" given twice", name, body, "?"+name+"=1&"+name+"=1"),
			invalid(base, name+" with a bad % escape", name, body, "?"+name+"=%ZZ"))
		for _, v := range badQueryValues(name, schema) {
			out = append(out, invalid(base, name+"="+v, name, body, "?"+name+"="+v))
		}
	}
	return out
}

// badQueryValues are values a parameter's schema refuses.
func badQueryValues(name string, schema map[string]any) []string {
	var out []string
	if schema["type"] == "integer" {
		out = append(out, "abc", "1.5", "")
		if n, ok := schema["minimum"].(float64); ok {
			out = append(out, strconv.FormatInt(int64(n)-1, 10))
		}
		if n, ok := schema["maximum"].(float64); ok {
			out = append(out, strconv.FormatInt(int64(n)+1, 10))
		}
	}
	if _, ok := schema["enum"]; ok {
		out = append(out, "NOT_A_VALUE")
	}
	if _, ok := schema["pattern"]; ok {
		out = append(out, "-bad")
	}
	if n, ok := schema["maxLength"].(float64); ok {
		out = append(out, strings.Repeat("a", int(n)+1))
	}
	if name == "cursor" {
		out = append(out, "!!")
	}
	return out
}

// invalid is a 400 invalid_request case at field; body and query are
// added to base's.
func invalid(base refusal, name, field string, body any, query string) refusal {
	c := base
	c.name, c.status, c.code, c.field, c.body = name, http.StatusBadRequest, "invalid_request", field, body
	c.path += query
	return c
}

// pathCases: an id this caller cannot see, in every form (API.md §0: a
// cross-tenant or unknown id is always 404 not_found), with the route's
// valid body, so that nothing but the id is wrong; and a name that cannot
// be one (a malformed effect type or tool name).
func (w *refusalWorld) pathCases(base refusal, path string, body any) []refusal {
	var out []refusal
	fillPath(path, func(segment, param string) string {
		variants := w.badPathValues(segment, param)
		for _, v := range slices.Sorted(maps.Keys(variants)) {
			c := base
			c.name, c.body = "path "+param+": "+v, body
			c.path = fillPath(path, func(seg, p string) string {
				if p == param {
					return variants[v]
				}
				return w.ownValue(seg, p)
			})
			if ownID := w.ownIDs[segment]; ownID != "" {
				c.status, c.code = http.StatusNotFound, "not_found"
			} else {
				c.status, c.code, c.field = http.StatusBadRequest, "invalid_request", param
			}
			out = append(out, c)
		}
		return ""
	})
	return out
}

// refusalBodyIDs are bodies naming an object by id at {id}; the rest of
// each body is valid. README: an id in the body that names nothing this
// caller may see is answered as a well-formed id of nothing is, whatever
// its form (404 not_found; in a batch report, in its slot); only an empty
// one is a 400 at its field.
var refusalBodyIDs = []struct {
	route, kind, field, body string
	batch                    bool
}{
	{"POST /api/v1/effects/begin", "runs", "run_id",
		`{"effect_type":"email.send","idempotency_key":"refusal","run_id":"{id}"}`, false},
	{"POST /api/v1/effects/begin", "groups", "group_id",
		`{"effect_type":"email.send","idempotency_key":"refusal","group_id":"{id}"}`, false},
	{"POST /api/v1/effects/begin", "effects", "compensates_effect_id",
		`{"effect_type":"email.send","idempotency_key":"refusal","group_id":"{group}","compensates_effect_id":"{id}"}`, false},
	{"POST /api/v1/runs/{id}/steps", "steps", "afterStepId",
		`{"name":"send_email","version":"1","afterStepId":"{id}","afterStatus":"SUCCEEDED"}`, false},
	{"POST /api/v1/jobs/report", "jobs", "jobId",
		`{"reports":[{"jobId":"{id}","leaseToken":"t","status":"SUCCEEDED"}]}`, true},
}

// bodyIDCases are route's refusalBodyIDs, each id in every form this
// caller cannot see.
func (w *refusalWorld) bodyIDCases(base refusal, route string) []refusal {
	var out []refusal
	for _, b := range refusalBodyIDs {
		if b.route != route {
			continue
		}
		values := w.badPathValues(b.kind, "id")
		values["empty"] = ""
		for _, what := range slices.Sorted(maps.Keys(values)) {
			body := strings.ReplaceAll(b.body, "{group}", w.ownIDs["groups"])
			c := base
			c.name, c.body = b.field+": "+what, strings.ReplaceAll(body, "{id}", values[what])
			switch {
			case b.batch && what == "empty":
				c.status, c.slot, c.code, c.field = http.StatusOK, true, "invalid_request", b.field
			case b.batch:
				c.status, c.slot, c.code = http.StatusOK, true, "not_found"
			case what == "empty":
				c.status, c.code, c.field = http.StatusBadRequest, "invalid_request", b.field
			default:
				c.status, c.code = http.StatusNotFound, "not_found"
			}
			out = append(out, c)
		}
	}
	return out
}

// refusalRules are well-formed bodies that break a rule the route checks
// against what is stored, each answered as API.md or the OpenAPI document
// says, nothing done. The world sets refusal.cost to require a cost and
// refusal.dim to require the dimension "to".
var refusalRules = []struct {
	route, name, body string
	status            int
	code, field       string
}{
	{"POST /api/v1/effects/begin", "no cost where the policy requires one",
		`{"effect_type":"refusal.cost","idempotency_key":"rule"}`, http.StatusBadRequest, "cost_required", ""},
	{"POST /api/v1/effects/begin", "no dimension where the policy requires one",
		`{"effect_type":"refusal.dim","idempotency_key":"rule"}`, http.StatusBadRequest, "dimension_required", ""},
	{"PUT /api/v1/policies/{effect_type}", "an approval threshold above the ceiling",
		`{"max_cost_micros":5,"approval_above_micros":6}`, http.StatusBadRequest, "approval_threshold_above_ceiling",
		"approval_above_micros"},
	{"POST /api/v1/endpoints", "a longest delay under the first",
		`{"name":"rule","preset":"CUSTOM","initialDelayMs":5000,"maxDelayMs":1000,"maxAttempts":3,"multiplier":2,"jitterPercent":0}`,
		http.StatusBadRequest, "invalid_request", "maxDelayMs"},
	{"PUT /api/v1/endpoints/{id}/policy", "a stale expectedVersion",
		`{"expectedVersion":99,"preset":"RELAXED"}`, http.StatusConflict, "version_conflict", ""},
	{"POST /api/v1/effects/{id}/report", "another lease token",
		`{"lease_token":"not-the-token","outcome":"succeeded"}`, http.StatusConflict, "lease_lost", ""},
	{"POST /api/v1/effects/{id}/resolve", "a leased effect", `{"outcome":"succeeded"}`,
		http.StatusConflict, "invalid_state", ""},
	{"POST /api/v1/steps/{id}/replay", "a duplicate risk not acknowledged", `{"acknowledgeDuplicateRisk":false}`,
		http.StatusBadRequest, "invalid_request", "acknowledgeDuplicateRisk"},
	{"POST /api/v1/steps/{id}/replay", "a queued step", `{"acknowledgeDuplicateRisk":true}`,
		http.StatusConflict, "invalid_state", ""},
	{"POST /api/v1/tools/{name}/contracts", "an input schema that is none",
		`{"handlerVersion":"2","inputSchema":{"type":"nonsense"}}`, http.StatusBadRequest, "invalid_request", "inputSchema"},
	{"POST /api/v1/runs/{id}/steps", "a contract version the tool lacks",
		`{"name":"send_email","version":"1","contractVersion":7}`, http.StatusBadRequest, "invalid_request",
		"contractVersion"},
}

// ruleCases are route's refusalRules.
func (w *refusalWorld) ruleCases(base refusal, route string) []refusal {
	var out []refusal
	for _, r := range refusalRules {
		if r.route != route {
			continue
		}
		c := base
		c.name, c.body, c.status, c.code, c.field = "rule: "+r.name, r.body, r.status, r.code, r.field
		out = append(out, c)
	}
	return out
}

// refusalBadNames are names a path's effect type or tool name cannot be:
// an effect type begins with a letter or digit, a tool name holds no '@'.
// Each takes at most 200 characters.
var refusalBadNames = map[string]string{"effect_type": "-bad", "name": "a@b"}

// badPathValues are the values of a path parameter this caller cannot
// name, by what each is.
func (w *refusalWorld) badPathValues(segment, param string) map[string]string {
	own := w.ownIDs[segment]
	if own == "" {
		return map[string]string{"not a name": refusalBadNames[param], "too long": strings.Repeat("a", 201)}
	}
	prefix, _, _ := strings.Cut(own, "_")
	otherKind := w.ownIDs["runs"]
	if segment == "runs" {
		otherKind = w.ownIDs["effects"]
	}
	return map[string]string{
		"malformed":              "nope",
		"an id of another kind":  otherKind,
		"an id of nothing":       ids.New(prefix),
		"another workspace's id": w.otherIDs[segment],
		"a prefix alone":         prefix + "_",
	}
}

// mustJSON is v, a value the test built, as JSON.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// with is seed with key set to value.
func with(seed map[string]any, key string, value any) []byte {
	return edited(seed, []string{key}, value, false)
}

// edited is seed with the member at path (keys, and list indexes in
// decimal) set to value, or removed.
func edited(seed map[string]any, path []string, value any, remove bool) []byte {
	dec := json.NewDecoder(bytes.NewReader(mustJSON(seed)))
	dec.UseNumber() // 1000000 stays an integer literal
	var clone map[string]any
	if err := dec.Decode(&clone); err != nil {
		panic(err)
	}
	var node any = clone
	for _, step := range path[:len(path)-1] {
		switch n := node.(type) {
		case map[string]any:
			node = n[step]
		case []any:
			i, _ := strconv.Atoi(step)
			node = n[i]
		}
	}
	last := path[len(path)-1]
	switch n := node.(type) {
	case map[string]any:
		if remove {
			delete(n, last)
		} else {
			n[last] = value
		}
	case []any:
		i, _ := strconv.Atoi(last)
		n[i] = value
	}
	return mustJSON(clone)
}

// bodyCases: a body that is not one JSON object, and each property of the
// request schema broken in the seed.
func bodyCases(base refusal, seed map[string]any, schema map[string]any, batch string) []refusal {
	good := mustJSON(seed)
	dupKey, dup := "zz_unknown", `{"zz_unknown":1,"zz_unknown":1}`
	if keys := slices.Sorted(maps.Keys(seed)); len(keys) > 0 {
		dupKey = keys[0]
		dup = fmt.Sprintf(`{"%s":%s,%s`, dupKey, mustJSON(seed[dupKey]), good[1:])
	}
	out := []refusal{
		invalid(base, "invalid JSON", "", `{"a":`, ""),
		invalid(base, "trailing garbage", "", string(good)+" x", ""),
		invalid(base, "a second value", "", string(good)+" {}", ""),
		invalid(base, "an array", "", `[]`, ""),
		invalid(base, "a string", "", `"x"`, ""),
		invalid(base, "a number", "", `7`, ""),
		invalid(base, "a boolean", "", `true`, ""),
		invalid(base, "an unknown field", "zz_unknown", with(seed, "zz_unknown", 1), ""),
		invalid(base, "a key named twice", dupKey, dup, ""),
		invalid(base, "a NUL", "", "{\"zz\\u0000\":1}", ""),
		invalid(base, "not UTF-8", "", "{\"zz\xff\":1}", ""),
		invalid(base, "nested too deep", "", `{"zz":`+strings.Repeat("[", 10001)+strings.Repeat("]", 10001)+`}`, ""),
	}
	gz := invalid(base, "gzip Content-Encoding", "Content-Encoding", good, "")
	gz.header = http.Header{"Content-Encoding": {"gzip"}}
	plain := invalid(base, "invalid JSON as text/plain", "", `{"a":`, "")
	plain.header = http.Header{"Content-Type": {"text/plain"}}
	out = append(out, gz, plain)
	huge := append([]byte(`{"zz":"`), append([]byte(strings.Repeat("a", 1<<20)), `"}`...)...)
	for _, body := range []any{huge, bytes.NewReader(huge)} { // the reader is sent chunked
		c := base
		c.name, c.body, c.status, c.code = "over 1 MiB", body, http.StatusRequestEntityTooLarge, "payload_too_large"
		if _, chunked := body.(io.Reader); chunked {
			c.name += ", chunked"
		}
		out = append(out, c)
	}
	for _, b := range brokenProperties(seed, schema) {
		c := invalid(base, b.name, b.field, b.body, "")
		if item, ok := strings.CutPrefix(b.field, batch+".0."); ok && batch != "" {
			// README: a batch report answers each item in its slot, its
			// fields named as the single route names them.
			c.status, c.slot, c.field = http.StatusOK, true, item
		}
		out = append(out, c)
	}
	return out
}

// refusalBatches names the list of a batch route whose items are refused
// each in its slot of a 200 answer (README, jobs/report).
var refusalBatches = map[string]string{"POST /api/v1/jobs/report": "reports"}

// brokenBody is a body with one property broken.
type brokenBody struct {
	name, field string
	body        []byte
}

// brokenProperties are seed with each property of schema broken in each
// way badValues knows, and each required one missing, at every level the
// seed reaches: its objects' members and its lists' first items.
func brokenProperties(seed, schema map[string]any) []brokenBody {
	return brokenUnder(seed, nil, seed, schema)
}

// brokenUnder breaks the members of obj, at path in seed, per its schema.
func brokenUnder(seed map[string]any, path []string, obj, schema map[string]any) []brokenBody {
	var out []brokenBody
	if len(path) > 0 && schema["additionalProperties"] == false {
		at := append(slices.Clone(path), "zz_unknown")
		out = append(out, brokenBody{strings.Join(at, ".") + ": unknown", strings.Join(at, "."),
			edited(seed, at, 1, false)})
	}
	props, _ := schema["properties"].(map[string]any)
	required, _ := schema["required"].([]any)
	for _, k := range slices.Sorted(maps.Keys(props)) {
		p, _ := props[k].(map[string]any)
		at := append(slices.Clone(path), k)
		out = append(out, brokenValues(seed, at, p)...)
		if slices.Contains(required, any(k)) {
			field := strings.Join(at, ".")
			out = append(out, brokenBody{field + ": missing", field, edited(seed, at, nil, true)})
		}
		switch child := obj[k].(type) {
		case map[string]any:
			out = append(out, brokenUnder(seed, at, child, p)...)
			// A map (dimension_limits): its first entry, per its schema.
			entry, _ := p["additionalProperties"].(map[string]any)
			if keys := slices.Sorted(maps.Keys(child)); entry != nil && len(keys) > 0 {
				first := append(slices.Clone(at), keys[0])
				out = append(out, brokenValues(seed, first, entry)...)
				if value, ok := child[keys[0]].(map[string]any); ok {
					out = append(out, brokenUnder(seed, first, value, entry)...)
				}
			}
		case []any:
			items, _ := p["items"].(map[string]any)
			if len(child) == 0 || items == nil {
				continue
			}
			first := append(at, "0")
			if item, ok := child[0].(map[string]any); ok {
				out = append(out, brokenUnder(seed, first, item, items)...)
			} else {
				out = append(out, brokenValues(seed, first, items)...)
			}
		}
	}
	return out
}

// brokenValues are seed with the value at path replaced by each of
// badValues(schema).
func brokenValues(seed map[string]any, path []string, schema map[string]any) []brokenBody {
	field := strings.Join(path, ".")
	bad := badValues(schema)
	var out []brokenBody
	for _, what := range slices.Sorted(maps.Keys(bad)) {
		out = append(out, brokenBody{field + ": " + what, field, edited(seed, path, bad[what], false)})
	}
	return out
}

// badValues are values a property's schema refuses, by what each is.
func badValues(p map[string]any) map[string]any {
	types := schemaTypes(p)
	out := map[string]any{}
	if len(types) == 0 {
		// Free-form (a payload, an input): any JSON but what no JSON
		// reader agrees on.
		out["a NUL inside"] = map[string]any{"a": "x\u0000"}
		out["a number out of a float's range"] = json.RawMessage(`{"a":1e400}`)
		return out
	}
	takes := func(t string) bool {
		return slices.Contains(types, t) || (t == "integer" && slices.Contains(types, "number"))
	}
	for _, c := range []struct {
		t string
		v any
	}{{"string", "x"}, {"integer", 7}, {"boolean", true}, {"object", map[string]any{}}, {"array", []any{}}} {
		if !takes(c.t) {
			out["a "+c.t] = c.v
			break
		}
	}
	if !takes("null") {
		out["null"] = nil
	}
	if enum, ok := p["enum"].([]any); ok && len(enum) > 0 {
		out["not in the enum"] = "NOT_A_VALUE"
	}
	if takes("string") {
		out["a NUL"] = "x\u0000"
		if n, ok := p["maxLength"].(float64); ok {
			out["too long"] = strings.Repeat("a", int(n)+1)
		}
		if n, ok := p["minLength"].(float64); ok && n >= 1 {
			out["empty"] = ""
		}
		if p["format"] == "date-time" {
			out["not a time"] = "yesterday"
		}
		if v, ok := notMatching(p); ok {
			out["not matching its pattern"] = v
		}
	}
	if takes("integer") || takes("number") {
		out["beyond a float"] = json.RawMessage(`1e400`)
		if n, ok := p["minimum"].(float64); ok {
			out["below the minimum"] = json.RawMessage(strconv.FormatInt(int64(n)-1, 10))
		}
		if n, ok := p["maximum"].(float64); ok {
			out["above the maximum"] = json.RawMessage(strconv.FormatInt(int64(n)+1, 10))
		}
	}
	if slices.Contains(types, "integer") && !slices.Contains(types, "number") {
		out["a fraction"] = json.RawMessage(`1.5`)
		out["a float literal"] = json.RawMessage(`1.0`)
	}
	if takes("array") {
		if n, ok := p["minItems"].(float64); ok && n >= 1 {
			out["empty list"] = []any{}
		}
		if n, ok := p["maxItems"].(float64); ok {
			out["too many items"] = slices.Repeat([]any{"x"}, int(n)+1)
		}
	}
	if takes("object") {
		if p["additionalProperties"] == false {
			out["an unknown member"] = map[string]any{"zz_unknown": 1}
		}
		if n, ok := p["maxProperties"].(float64); ok {
			many := map[string]any{}
			for i := range int(n) + 1 {
				many[fmt.Sprintf("k%d", i)] = "x"
			}
			out["too many members"] = many
		}
	}
	return out
}

// notMatching is a short string a property's pattern refuses, if one of a
// few candidates is.
func notMatching(p map[string]any) (string, bool) {
	pattern, _ := p["pattern"].(string)
	re, err := regexp.Compile(pattern)
	if pattern == "" || err != nil {
		return "", false
	}
	for _, v := range []string{"-bad", "a\u0007b", "a@b", " "} {
		if !re.MatchString(v) {
			return v, true
		}
	}
	return "", false
}

// schemaTypes is a schema's "type" as a list ("" when it has none).
func schemaTypes(p map[string]any) []string {
	switch t := p["type"].(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, v := range t {
			s, _ := v.(string)
			out = append(out, s)
		}
		return out
	}
	return nil
}

// refusalIdempotencyHeader says whether the route takes an Idempotency-Key.
func refusalIdempotencyHeader(op map[string]any) bool {
	params, _ := op["parameters"].([]any)
	for _, p := range params {
		if apitest.At(p, "in") == "header" && apitest.At(p, "name") == "Idempotency-Key" {
			return true
		}
	}
	return false
}

// idempotencyCases: a malformed Idempotency-Key with the valid body (README:
// 1–255 printable characters, given once), and a valid one with a bad
// body, which records nothing under the key (README: a request that failed
// changed nothing and frees the key).
func idempotencyCases(base refusal, seed map[string]any) []refusal {
	good := mustJSON(seed)
	var out []refusal
	for _, h := range []struct {
		name   string
		values []string
	}{{"empty", []string{""}}, {"too long", []string{strings.Repeat("k", 256)}}, {"given twice", []string{"k1", "k2"}}} {
		c := invalid(base, "Idempotency-Key "+h.name, "Idempotency-Key", good, "")
		c.header = http.Header{"Idempotency-Key": h.values}
		out = append(out, c)
	}
	c := invalid(base, "a bad body under an Idempotency-Key", "zz_unknown", with(seed, "zz_unknown", 1), "")
	c.header = http.Header{"Idempotency-Key": {"refusal-key"}}
	return append(out, c)
}

// mcpCases: the MCP endpoint refuses a bad envelope as JSON-RPC does, with
// id null and HTTP 400 (README, MCP), a body over 1 MiB, a query parameter
// and a wrong credential as every route does, a Content-Type other than
// JSON, GET and DELETE (405), and each tool's bad arguments (toolCases).
func (w *refusalWorld) mcpCases(t *testing.T, base refusal, method string) []refusal {
	out := []refusal{invalid(base, "unknown query parameter", "zz_unknown", nil, "?zz_unknown=1")}
	if method != http.MethodPost {
		// README, MCP: stateless, so there is no stream to open nor
		// session to end.
		c := base
		c.name, c.status, c.code = "no stream or session", http.StatusMethodNotAllowed, "method_not_allowed"
		return append(out, c)
	}
	// A begin: read as sent, it would change something.
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_begin",` +
		`"arguments":{"effect_type":"email.send","idempotency_key":"refusal"}}}`
	header := http.Header{"Accept": {"application/json, text/event-stream"}}
	for _, b := range []struct {
		name, body string
		code       int
	}{
		{"invalid JSON", `{"jsonrpc":`, -32700},
		{"trailing garbage", call + " x", -32700},
		{"a second message", call + call, -32700},
		{"a member named twice", `{"jsonrpc":"2.0",` + call[1:], -32600},
		{"a params member named twice", strings.Replace(call, `"params":{`, `"params":{"name":"x",`, 1), -32600},
		{"a number", `7`, -32600},
		{"a string", `"x"`, -32600},
		{"an empty batch", `[]`, -32600},
		{"neither request nor response", `{"id":1}`, -32600},
	} {
		c := base
		c.name, c.body, c.header, c.status, c.rpcCode = "JSON-RPC: "+b.name, b.body, header, http.StatusBadRequest, b.code
		out = append(out, c)
	}
	out = append(out, w.mcpProtocolCases(t, base, call, header)...)
	huge := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"zz":"` + strings.Repeat("a", 1<<20) + `"}}`
	c := base
	c.name, c.body, c.header = "over 1 MiB", huge, header
	c.status, c.code = http.StatusRequestEntityTooLarge, "payload_too_large"
	out = append(out, unauthorized(base, call, header))
	plain := invalid(base, "text/plain", "Content-Type", w.toolCall("ratchet_begin", w.toolSeed(t, "ratchet_begin")), "")
	plain.header = http.Header{"Accept": header["Accept"], "Content-Type": {"text/plain"}}
	out = append(out, c, plain)
	for _, tool := range w.mcpTools(t, base.key, header) {
		out = append(out, w.toolCases(t, base, header, tool.Name, tool.InputSchema)...)
	}
	return out
}

// mcpProtocolCases: a message the protocol refuses is answered as README's
// MCP section says, a JSON-RPC error under the request's id when it has one
// the answer can carry (a request's answer, HTTP 200, unless the transport
// refused the message whole, 400), and null otherwise; a notification or a
// response is a 202 without a body; a tool call of a key without the tool's
// scope (an AGENT key, a WORKER key whose tools list names a job tool) is
// the tool's forbidden, and a revoked key is 401 as on every route. call is
// a valid ratchet_begin under id 1, which would change something if run.
func (w *refusalWorld) mcpProtocolCases(t *testing.T, base refusal, call string, header http.Header) []refusal {
	var out []refusal
	rpc := func(name, body string, status, code int, id any, hdr ...string) {
		c := base
		c.name, c.body, c.status, c.rpcCode, c.rpcID = "JSON-RPC: "+name, body, status, code, id
		c.header = header.Clone()
		for i := 0; i+1 < len(hdr); i += 2 {
			c.header.Set(hdr[i], hdr[i+1])
		}
		out = append(out, c)
	}
	const begin = `"method":"tools/call","params":{"name":"ratchet_begin","arguments":` +
		`{"effect_type":"email.send","idempotency_key":"refusal"}}`
	rpc("jsonrpc 1.0", `{"jsonrpc":"1.0","id":1,`+begin+`}`, http.StatusBadRequest, -32600, 1.0)
	rpc("no jsonrpc member", `{"id":1,`+begin+`}`, http.StatusBadRequest, -32600, 1.0)
	rpc("a boolean id", `{"jsonrpc":"2.0","id":true,`+begin+`}`, http.StatusBadRequest, -32600, nil)
	rpc("a null id", `{"jsonrpc":"2.0","id":null,`+begin+`}`, http.StatusBadRequest, -32600, nil)
	rpc("a tool call without an id", `{"jsonrpc":"2.0",`+begin+`}`, http.StatusBadRequest, -32600, nil)
	rpc("a tool call without params", `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`, http.StatusOK, -32602, 1.0)
	rpc("params that are not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}`,
		http.StatusOK, -32602, 1.0)
	rpc("an unknown method", `{"jsonrpc":"2.0","id":1,"method":"effects/begin","params":{}}`, http.StatusOK, -32601, 1.0)
	rpc("a capability not offered", `{"jsonrpc":"2.0","id":"r","method":"resources/list"}`, http.StatusOK, -32601, "r")
	rpc("an unknown tool", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ratchet_begin_x",`+
		`"arguments":{"effect_type":"email.send","idempotency_key":"refusal"}}}`, http.StatusOK, -32602, 1.0)
	rpc("a batch under protocol 2025-06-18", "["+call+"]", http.StatusBadRequest, -32600, nil,
		"MCP-Protocol-Version", "2025-06-18")
	rpc("an unsupported MCP-Protocol-Version", call, http.StatusBadRequest, -32600, 1.0, "MCP-Protocol-Version", "1999-01-01")
	// Protocol 2026-07-28 names the method and the tool in headers too,
	// which a gateway may route or authorize by: a body that says
	// otherwise is refused, not run.
	const meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"}}`
	stateless := strings.Replace(call, `"arguments":`, meta+`,"arguments":`, 1)
	rpc("an Mcp-Name naming another tool", stateless, http.StatusBadRequest, -32020, 1.0,
		"MCP-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/call", "Mcp-Name", "ratchet_get_policy")
	rpc("an Mcp-Method naming another method", stateless, http.StatusBadRequest, -32020, 1.0,
		"MCP-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/list")
	rpc("protocol 2026-07-28 without its _meta", call, http.StatusBadRequest, -32602, 1.0,
		"MCP-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/call", "Mcp-Name", "ratchet_begin")
	rpc("an Accept without JSON", call, http.StatusBadRequest, -32600, nil, "Accept", "text/event-stream")
	rpc("two requests of a batch under one id", "["+call+","+call+"]", http.StatusBadRequest, -32600, nil)
	rpc("an initialize in a batch", "["+call+`,{"jsonrpc":"2.0","id":2,"method":"initialize","params":`+
		`{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}]`,
		http.StatusBadRequest, -32600, nil)
	many := make([]string, mcpserver.MaxBatch+1)
	for i := range many {
		many[i] = strings.Replace(call, `"id":1`, fmt.Sprintf(`"id":%d`, i+1), 1)
	}
	rpc("a batch over MaxBatch", "["+strings.Join(many, ",")+"]", http.StatusBadRequest, -32600, nil)
	for name, body := range map[string]string{
		"a notification of an unknown method": `{"jsonrpc":"2.0","method":"effects/begin","params":{}}`,
		"a cancellation":                      `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`,
		"a response":                          `{"jsonrpc":"2.0","id":1,"result":{}}`,
	} {
		c := base
		c.name, c.body, c.header, c.status, c.bodiless = "JSON-RPC: "+name, body, header, http.StatusAccepted, true
		out = append(out, c)
	}
	cross := base
	cross.name, cross.body, cross.status, cross.code = "a browser page of another origin", call, http.StatusForbidden, "forbidden"
	cross.header = header.Clone()
	cross.header.Set("Sec-Fetch-Site", "cross-site")
	gzipped := invalid(base, "a compressed body", "Content-Encoding", call, "")
	gzipped.header = header.Clone()
	gzipped.header.Set("Content-Encoding", "gzip")
	noType := invalid(base, "no Content-Type", "Content-Type", call, "")
	noType.header = header.Clone()
	noType.header["Content-Type"] = nil
	revoked := unauthorized(base, call, header)
	revoked.name, revoked.key = "a revoked key", w.revoked
	out = append(out, cross, gzipped, noType, revoked)
	args := w.toolSeed(t, "ratchet_resolve")
	for _, k := range []struct{ name, key, tool string }{
		{"an AGENT key resolves", w.agent, "ratchet_resolve"},
		{"an AGENT key decides its approval", w.agent, "ratchet_decide_approval"},
		{"a WORKER key with a tools list begins", w.worker, "ratchet_begin"},
	} {
		if k.tool != "ratchet_resolve" {
			args = w.toolSeed(t, k.tool)
		}
		c := base
		c.name, c.key, c.header, c.body = k.name, k.key, header, w.toolCall(k.tool, args)
		c.status, c.tool, c.code = http.StatusOK, true, "forbidden"
		out = append(out, c)
	}
	// Each tool from a key holding every scope but the one its REST call
	// needs (mcpserver.ToolScopes): the tool's forbidden naming it, nothing
	// done (only three tools had such a case).
	scopes := mcpserver.ToolScopes()
	for _, tool := range slices.Sorted(maps.Keys(scopes)) {
		c := base
		c.name, c.key, c.header = tool+" from a key without "+scopes[tool], w.lackingKey(t, []string{scopes[tool]}), header
		c.body = w.toolCall(tool, w.toolSeed(t, tool))
		c.status, c.tool, c.code, c.required = http.StatusOK, true, "forbidden", []string{scopes[tool]}
		out = append(out, c)
	}
	c := base
	c.name, c.header, c.body = "arguments that are not an object", header, w.toolCall("ratchet_begin", []any{1})
	c.status, c.tool, c.code, c.field = http.StatusOK, true, "invalid_request", "arguments"
	return append(out, c)
}

// refusalToolSeeds are valid arguments of the MCP tools that require some
// ({effect}, {lease} and {approval} stand for the caller's own).
var refusalToolSeeds = map[string]string{
	"ratchet_begin":           `{"effect_type":"email.send","idempotency_key":"refusal"}`,
	"ratchet_decide_approval": `{"approval_id":"{approval}","decision":"approve"}`,
	"ratchet_get_effect":      `{"effect_id":"{effect}"}`,
	"ratchet_get_policy":      `{"effect_type":"email.send"}`,
	"ratchet_heartbeat":       `{"effect_id":"{effect}","lease_token":"{lease}"}`,
	"ratchet_report":          `{"effect_id":"{effect}","lease_token":"{lease}","outcome":"succeeded"}`,
	"ratchet_resolve":         `{"effect_id":"{effect}","outcome":"failed"}`,
}

// refusalToolIDs maps an MCP tool argument holding an id to the kind of
// object it names.
var refusalToolIDs = map[string]string{"effect_id": "effects", "approval_id": "approvals"}

type mcpTool struct {
	Name        string         `json:"name"`
	InputSchema map[string]any `json:"inputSchema"`
}

// mcpTools are the tools the MCP endpoint lists.
func (w *refusalWorld) mcpTools(t *testing.T, key string, header http.Header) []mcpTool {
	e := *w.env
	e.T = t
	res := e.DoWith("POST", "/api/v1/mcp", key, header, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	var m struct {
		Result struct {
			Tools []mcpTool `json:"tools"`
		} `json:"result"`
	}
	res.Decode(t, &m)
	require.NotEmpty(t, m.Result.Tools, "tools/list")
	return m.Result.Tools
}

// toolSeed is a tool's valid arguments with the caller's own ids.
func (w *refusalWorld) toolSeed(t *testing.T, tool string) map[string]any {
	raw, ok := refusalToolSeeds[tool]
	if !ok {
		raw = `{}`
	}
	for k, v := range w.subst {
		raw = strings.ReplaceAll(raw, k, v)
	}
	var seed map[string]any
	require.NoError(t, json.Unmarshal([]byte(raw), &seed), tool)
	return seed
}

// toolCall is a tools/call message of tool with args.
func (w *refusalWorld) toolCall(tool string, args any) []byte {
	return mustJSON(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": args}})
}

// toolCases: the MCP tools' arguments are the REST body's, refused as REST
// refuses them (README, MCP), as a tool error result: each argument broken
// in the tool's seed, an unknown one, and an id of an object this caller
// cannot see.
func (w *refusalWorld) toolCases(t *testing.T, base refusal, header http.Header, tool string,
	schema map[string]any) []refusal {
	if req, _ := schema["required"].([]any); len(req) > 0 && refusalToolSeeds[tool] == "" {
		t.Errorf("MCP tool %s requires %v; add valid arguments to refusalToolSeeds", tool, req)
		return nil
	}
	seed := w.toolSeed(t, tool)
	call := func(name, field, code string, args []byte) refusal {
		c := base
		c.name, c.header, c.body = tool+" "+name, header, w.toolCall(tool, json.RawMessage(args))
		c.status, c.tool, c.code, c.field = http.StatusOK, true, code, field
		return c
	}
	out := []refusal{call("an unknown argument", "zz_unknown", "invalid_request", with(seed, "zz_unknown", 1))}
	for _, b := range brokenProperties(seed, schema) {
		out = append(out, call(b.name, b.field, "invalid_request", b.body))
	}
	props, _ := schema["properties"].(map[string]any)
	for _, k := range slices.Sorted(maps.Keys(props)) {
		if kind, ok := refusalToolIDs[k]; ok {
			values := w.badPathValues(kind, "id")
			for _, what := range slices.Sorted(maps.Keys(values)) {
				out = append(out, call(k+": "+what, "", "not_found", with(seed, k, values[what])))
			}
		}
	}
	return out
}

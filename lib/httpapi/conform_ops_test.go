package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/ids"
)

// API.md §0: "Authorization: Bearer <key> on every route except POST
// /api/v1/workspaces, GET /api/v1/health and the discovery documents", and
// §4/§5: the cron sweep takes Bearer $CRON_SECRET, 401 without it. Over the
// whole route table (TestConformanceRoutesExist checks only API.md's own
// list), so a route added without a key check fails here.
func TestConformanceOnlyThePublicRoutesTakeNoKey(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	public := map[string]bool{}
	for _, r := range httpapi.Routes() {
		path := pathFor(r.Pattern)
		switch r.Auth {
		case httpapi.AuthNone:
			public[r.Method+" "+r.Pattern] = true
			continue
		case httpapi.AuthCron:
			require.Equal(t, "/api/cron/sweep", r.Pattern)
		}
		for _, key := range []string{"", "wrong"} {
			res := env.Do(r.Method, path, key, "{}")
			require.Equal(t, http.StatusUnauthorized, res.Status, "%s %s with %q: %s", r.Method, path, key, res.Body)
			require.Equal(t, apierr.CodeUnauthorized, res.ErrorCode(), "%s %s", r.Method, path)
			require.NotEmpty(t, res.Header.Get("X-Request-Id"), "%s %s", r.Method, path)
		}
	}
	require.Equal(t, map[string]bool{
		"POST /api/v1/workspaces": true, "GET /api/v1/health": true, "GET /api/v1/openapi.json": true,
		"GET /llms.txt": true, "GET /.well-known/ratchet.json": true,
	}, public)
}

// API.md §0: an unknown field in a request body is 400 invalid_request, a
// body over 1 MiB 413 payload_too_large, on every route: a read's and a
// public route's too, and a query parameter that is not text is refused
// alike. Each answer passes apitest's check against the OpenAPI document,
// so a route that answers a code its x-error-codes leave out fails here
// (GET /api/v1/health listed neither 400 nor 413).
func TestConformanceEveryRouteRefusesWhatItDoesNotRead(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	operator := env.Signup().Key
	big := `"` + strings.Repeat("x", httpapi.MaxBodyBytes+1) + `"`
	for _, r := range httpapi.Routes() {
		if r.Raw != nil || r.Method == http.MethodHead {
			continue // a protocol endpoint reads its own body and query
		}
		key := map[httpapi.AuthMode]string{httpapi.AuthKey: operator, httpapi.AuthCron: "test-cron-secret"}[r.Auth]
		path := pathFor(r.Pattern)
		refused := func(status int, code string, path string, body any) {
			t.Helper()
			res := env.Do(r.Method, path, key, body)
			require.Equal(t, status, res.Status, "%s %s: %s", r.Method, path, res.Body)
			require.Equal(t, code, res.ErrorCode(), "%s %s", r.Method, path)
		}
		refused(http.StatusBadRequest, apierr.CodeInvalidRequest, path+"?x=%ff", nil)
		if r.Request == nil {
			refused(http.StatusBadRequest, apierr.CodeInvalidRequest, path, `{"x":1}`)
		}
		if r.Auth != httpapi.AuthKey { // a keyed one may first look up its path's object, as none here
			refused(http.StatusRequestEntityTooLarge, apierr.CodePayloadTooLarge, path, big)
		}
	}
}

// API.md §0: effect-gate routes use snake_case, durable-job routes
// camelCase, never mixed within a route. Checked on the path and query
// parameters and the field names of every route's request body and success
// answers as the OpenAPI document states them (apitest holds every answer of every test to that document). The
// capability manifest is left out: it carries the MCP tool definitions,
// whose field names (inputSchema, readOnlyHint...) the MCP specification
// fixes.
func TestConformanceEveryRouteKeepsItsSectionsFieldCasing(t *testing.T) {
	t.Parallel()
	camelTags := map[string]bool{"jobs": true, "workers": true, "endpoints": true, "contracts": true}
	snakeTags := map[string]bool{"workspaces": true, "keys": true, "effects": true, "policies": true, "approvals": true,
		"circuits": true, "groups": true, "reconcile": true, "webhooks": true}
	doc := httpapi.OpenAPI()
	raw, err := json.Marshal(doc)
	require.NoError(t, err)
	var d struct {
		Paths map[string]map[string]struct {
			Tags       []string `json:"tags"`
			Parameters []struct {
				Name string `json:"name"`
				In   string `json:"in"`
			} `json:"parameters"`
			RequestBody struct {
				Content map[string]struct {
					Schema any `json:"schema"`
				} `json:"content"`
			} `json:"requestBody"`
			Responses map[string]struct {
				Content map[string]struct {
					Schema any `json:"schema"`
				} `json:"content"`
			} `json:"responses"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	checked := 0
	for _, r := range httpapi.Routes() {
		if r.Pattern == "/.well-known/ratchet.json" {
			continue
		}
		op := d.Paths[r.Pattern][strings.ToLower(r.Method)]
		var names []string
		collect := func(s any) { names = append(names, propertyNames(s)...) }
		collect(op.RequestBody.Content["application/json"].Schema)
		for _, p := range op.Parameters {
			if p.In != "header" {
				names = append(names, p.Name)
			}
		}
		for st, res := range op.Responses {
			if strings.HasPrefix(st, "2") {
				collect(res.Content["application/json"].Schema)
			}
		}
		var snake, camel []string
		for _, n := range names {
			if strings.Contains(n, "_") {
				snake = append(snake, n)
			}
			if strings.ToLower(n) != n {
				camel = append(camel, n)
			}
		}
		require.False(t, len(snake) > 0 && len(camel) > 0, "%s %s mixes %v and %v", r.Method, r.Pattern, snake, camel)
		tag := r.Tag
		if r.Pattern == "/api/v1/queue/health" {
			tag = "jobs" // §4, over §3's queues
		}
		switch {
		case camelTags[tag]:
			require.Empty(t, snake, "%s %s is a durable-job route", r.Method, r.Pattern)
		case snakeTags[tag]:
			require.Empty(t, camel, "%s %s is an effect-gate route", r.Method, r.Pattern)
		default:
			continue
		}
		checked++
	}
	require.Greater(t, checked, 60)
}

// propertyNames lists every property name of a JSON schema, nested ones
// included.
func propertyNames(s any) []string {
	m, ok := s.(map[string]any)
	if !ok {
		if l, ok := s.([]any); ok {
			var out []string
			for _, x := range l {
				out = append(out, propertyNames(x)...)
			}
			return out
		}
		return nil
	}
	var out []string
	if props, ok := m["properties"].(map[string]any); ok {
		for name, sub := range props {
			out = append(out, name)
			out = append(out, propertyNames(sub)...)
		}
	}
	for _, k := range []string{"items", "additionalProperties", "anyOf", "oneOf", "allOf"} {
		out = append(out, propertyNames(m[k])...)
	}
	return out
}

// API.md §5 "Success statuses": creating routes answer 201, every action and
// read 200, as the route table (and so the router and the OpenAPI
// document) states them.
func TestConformanceSuccessStatuses(t *testing.T) {
	t.Parallel()
	want := map[string]int{
		"workspaces.create": 201, "keys.create": 201, "runs.create": 201, "runs.enqueue": 201, "groups.create": 201,
		"endpoints.create": 201, "contracts.publish": 201, "webhooks.create": 201, "workers.register": 201,
		"approvals.approve": 200, "approvals.reject": 200, "groups.commit": 200, "groups.unwind": 200,
		"endpoints.pause": 200, "endpoints.resume": 200, "runs.finish": 200, "steps.cancel": 200, "steps.replay": 200,
		"effects.report": 200, "jobs.report": 200, "effects.heartbeat": 200, "jobs.heartbeat": 200,
		"effects.resolve": 200, "keys.revoke": 200,
	}
	for _, r := range httpapi.Routes() {
		if st, ok := want[r.Name]; ok {
			require.Equal(t, st, r.Status, r.Name)
			delete(want, r.Name)
			continue
		}
		if r.Method == "GET" && r.Raw == nil { // MCP's GET is its transport's 405
			require.Equal(t, 200, r.Status, "a read: %s", r.Name)
		}
	}
	require.Empty(t, want, "routes API.md §5 names")
}

// API.md §0: a request body larger than 1 MiB is 413 payload_too_large, on
// every route that takes a body (those without one read it to refuse its
// fields, MCP's endpoint included), for a key that may call the route; one
// of exactly 1 MiB is read (and refused, if at all, for what it says).
func TestConformanceEveryRouteRefusesABodyOverOneMiB(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	over := `{"name":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `"}`
	exact := `{"name":"` + strings.Repeat("x", httpapi.MaxBodyBytes-len(`{"name":""}`)) + `"}`
	require.Len(t, exact, httpapi.MaxBodyBytes)
	checked := 0
	for _, r := range httpapi.Routes() {
		if r.Method == "GET" {
			continue
		}
		key := ws.Key
		switch r.Auth {
		case httpapi.AuthNone:
			key = ""
		case httpapi.AuthCron:
			key = "test-cron-secret"
		}
		path := wellFormedPath(r.Pattern)
		res := env.Do(r.Method, path, key, over)
		if r.Status == http.StatusMethodNotAllowed {
			continue // MCP's GET and DELETE answer 405 whatever they carry
		}
		require.Equal(t, http.StatusRequestEntityTooLarge, res.Status, "%s %s: %.300s", r.Method, path, res.Body)
		require.Equal(t, apierr.CodePayloadTooLarge, res.ErrorCode(), "%s %s", r.Method, path)
		at := env.Do(r.Method, path, key, exact)
		require.NotEqual(t, http.StatusRequestEntityTooLarge, at.Status, "%s %s: 1 MiB exactly is read", r.Method, path)
		checked++
	}
	require.Greater(t, checked, 40)
}

// wellFormedPath fills a pattern's ids with well-formed ids of nothing of
// their kind (so a route gets past its path to its body), and its names with
// a valid one.
func wellFormedPath(pattern string) string {
	kinds := map[string]string{"effects": ids.Effect, "approvals": ids.Approval, "keys": ids.Key, "groups": ids.Group,
		"webhooks": ids.Webhook, "runs": ids.Run, "steps": ids.Step, "workers": ids.Worker, "jobs": ids.Job,
		"endpoints": ids.Endpoint}
	parts := strings.Split(pattern, "/")
	for i, p := range parts {
		if strings.HasPrefix(p, "{") {
			parts[i] = "a.b"
			if kind, ok := kinds[parts[i-1]]; ok {
				parts[i] = ids.New(kind)
			}
		}
	}
	return strings.Join(parts, "/")
}

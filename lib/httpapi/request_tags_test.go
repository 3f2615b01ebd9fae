package httpapi_test

import (
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/schematags"
	"github.com/getratchet/ratchet/lib/toolname"
)

// customPolicy is a complete CUSTOM retry policy whose delays leave every
// field's bounds reachable: initialDelayMs at its least, maxDelayMs at its
// most, so neither bound of one is refused for the other's sake.
func customPolicy() map[string]any {
	return map[string]any{"maxAttempts": 5, "initialDelayMs": 1, "multiplier": 2, "maxDelayMs": jobs.MaxDelayLimitMs,
		"jitterPercent": 10}
}

// An endpoint's name and policy fields, a contract's retry policy and the
// PUT's expectedVersion state in the OpenAPI document the bounds, values
// and nullability their handlers check (QA, session 31: the document
// stated no bound for them, and allowed null for fields the handlers
// refuse as null; verification QA: the name's length was enforced, not
// stated); apitest.CheckRequestTags holds each tag to its handler.
func TestEndpointAndContractPolicyTagsAgreeWithTheHandlers(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)

	// A body for POST /endpoints: the custom fields come with a complete
	// CUSTOM policy, the preset CUSTOM with the fields it needs.
	custom := customPolicy()
	endpointBody := func(field string) map[string]any {
		if _, ok := custom[field]; ok {
			return merged(customPolicy(), map[string]any{"preset": jobs.PresetCustom})
		}
		return map[string]any{}
	}
	withCustom := func(body map[string]any) map[string]any {
		if body["preset"] == jobs.PresetCustom {
			return merged(customPolicy(), body)
		}
		return body
	}
	// The name is the probe's own when it is the field under test, else a
	// new one.
	create := reflect.TypeFor[jobs.CreateEndpointRequest]()
	checked := apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: create,
		Base: endpointBody,
		Send: func(body map[string]any) *apitest.Response {
			body = withCustom(body)
			if _, ok := body["name"]; !ok {
				body["name"] = apitest.Unique("tags endpoint ")
			}
			return e.Do("POST", "/api/v1/endpoints", e.ws.Key, body)
		},
	})
	require.Greater(t, checked, 40, "the endpoint policy's bounds are tagged")
	name, ok := create.FieldByName("Name")
	require.True(t, ok)
	require.Equal(t, map[string]string{"minLength": "1", "maxLength": "200", "printable": ""}, schematags.Rules(name),
		"the name states its length, probed above, and its characters")
	for _, bad := range []string{"a\nb", "a\u00a0b", "a\u200bb"} {
		r := e.Do("POST", "/api/v1/endpoints", e.ws.Key, map[string]any{"name": bad})
		require.Equal(t, http.StatusBadRequest, r.Status, "%q: %s", bad, r.Body)
		require.Contains(t, string(r.Body), `"field":"name"`, "%q", bad)
	}

	// PUT …/policy takes the same fields and requires expectedVersion, a
	// version read (0 or more).
	ep := e.endpoint("Tags")
	put := func(body map[string]any) *apitest.Response {
		return e.Do("PUT", "/api/v1/endpoints/"+ep["id"].(string)+"/policy", e.ws.Key, body)
	}
	for _, body := range []map[string]any{{}, {"expectedVersion": nil}, {"expectedVersion": -1}} {
		require.Equal(t, []string{"expectedVersion"}, validationFields(t, put(body)), "%v", body)
	}
	require.Equal(t, http.StatusOK, put(map[string]any{"expectedVersion": ep["version"]}).Status)

	// A contract's retry policy: its fields are required (a CUSTOM policy
	// is complete), its preset may only say CUSTOM.
	publish := func(body map[string]any) *apitest.Response {
		if body["retryPreset"] == jobs.PresetCustom && body["retryPolicy"] == nil {
			body["retryPolicy"] = customPolicy()
		}
		return e.Do("POST", "/api/v1/tools/"+apitest.Unique("tags_tool_")+"/contracts", e.ws.Key, body)
	}
	contract := func(string) map[string]any { return map[string]any{"handlerVersion": "1", "inputSchema": true} }
	checked = apitest.CheckRequestTags(t, apitest.TagProbe{
		Type:   reflect.TypeFor[jobs.ContractRetryPolicy](),
		Prefix: "retryPolicy.",
		Base:   func(string) map[string]any { return customPolicy() },
		Send: func(body map[string]any) *apitest.Response {
			return publish(merged(contract(""), map[string]any{"retryPreset": jobs.PresetCustom,
				"retryPolicy": body}))
		},
	})
	require.Greater(t, checked, 20, "the contract's retry policy is tagged")
	checked = apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: reflect.TypeFor[jobs.PublishContractRequest](),
		Base: contract,
		Send: publish,
	})
	require.Greater(t, checked, 10, "the contract's fields are tagged")
}

// merged answers a copy of base with extra's fields set over it.
func merged(base, extra map[string]any) map[string]any {
	out := maps.Clone(base)
	maps.Copy(out, extra)
	return out
}

// A key's, a run's and an enqueue's bounds and values in the OpenAPI
// document are the ones their handlers check (the document stated none).
func TestKeyRunAndEnqueueTagsAgreeWithTheHandlers(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	checked := apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: reflect.TypeFor[auth.CreateKeyRequest](),
		Base: func(field string) map[string]any {
			if field == "preset" {
				return map[string]any{"name": "tags"}
			}
			return map[string]any{"name": "tags", "preset": "AGENT"}
		},
		Send: func(body map[string]any) *apitest.Response {
			if body["preset"] == "WORKER" {
				body["tools"] = []string{"send_email@1"}
			}
			return e.Do("POST", "/api/v1/keys", e.ws.Key, body)
		},
	})
	require.Greater(t, checked, 15, "a key's bounds are tagged")

	checked = apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: reflect.TypeFor[jobs.CreateRunRequest](),
		Base: func(string) map[string]any { return map[string]any{"name": "tags"} },
		Send: func(body map[string]any) *apitest.Response { return e.Do("POST", "/api/v1/runs", e.ingest, body) },
	})
	require.Greater(t, checked, 10, "a run's bounds are tagged")

	// contractVersion 1 names this contract; afterStatus comes with a step
	// of the run to wait for.
	e.Must(http.StatusCreated, "POST", "/api/v1/tools/send_email/contracts", e.ws.Key,
		map[string]any{"handlerVersion": "1", "inputSchema": true})
	runID := e.run()
	first := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{}})
	checked = apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: reflect.TypeFor[jobs.EnqueueRequest](),
		Base: func(string) map[string]any {
			return map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"n": apitest.Unique("")}}
		},
		Send: func(body map[string]any) *apitest.Response {
			if _, ok := body["afterStatus"].(string); ok {
				body["afterStepId"] = first["stepId"]
			}
			return e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ingest, body)
		},
	})
	require.Greater(t, checked, 20, "an enqueue's bounds are tagged")
}

// A replay's bounds in the document are its handler's. Each probe replays
// a step of its own, cancelled before any claim (attempt 0, so
// expectedAttempt's least value names it).
func TestReplayTagsAgreeWithTheHandler(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	// targetContractVersion 1 names this contract, the steps' own (a
	// same-version replay), and comes with what a target takes.
	e.Must(http.StatusCreated, "POST", "/api/v1/tools/send_email/contracts", e.ws.Key,
		map[string]any{"handlerVersion": "1", "inputSchema": true})
	runID := e.run()
	checked := apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: reflect.TypeFor[jobs.ReplayRequest](),
		Base: func(string) map[string]any { return map[string]any{"acknowledgeDuplicateRisk": true} },
		Send: func(body map[string]any) *apitest.Response {
			if body["targetContractVersion"] != nil {
				body["expectedHandlerVersion"], body["acknowledgeVersionChange"] = "1", true
			}
			// The step's handler version is the expectedHandlerVersion
			// sent, when it can be one: its length's bounds are probed.
			version := "1"
			if v, ok := body["expectedHandlerVersion"].(string); ok && toolname.ValidVersion(v) {
				version = v
			}
			step := e.enqueue(runID, map[string]any{"name": "send_email", "version": version,
				"input": map[string]any{"n": apitest.Unique("")}})["stepId"].(string)
			e.Must(http.StatusOK, "POST", "/api/v1/steps/"+step+"/cancel", e.ws.Key, nil)
			return e.Do("POST", "/api/v1/steps/"+step+"/replay", e.ws.Key, body)
		},
	})
	require.Greater(t, checked, 10, "a replay's bounds are tagged")
}

// A list's query parameter that takes only some values states them in the
// OpenAPI document (contract QA: a plain string), and the handler takes
// exactly those: each is answered 200, another word 400 at the parameter.
func TestQueryEnumsAgreeWithTheHandlers(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	checked := 0
	e.eachFilter(e.run(), func(q httpapi.Param) bool { return q.Enum != nil }, func(r httpapi.Route, q httpapi.Param, path string) {
		for _, v := range q.Enum {
			e.Must(http.StatusOK, r.Method, path+"?"+q.Name+"="+url.QueryEscape(v), e.ws.Key, nil)
			checked++
		}
		require.Equal(t, []string{q.Name}, validationFields(t, e.Do(r.Method, path+"?"+q.Name+"=bogus", e.ws.Key, nil)),
			r.Pattern)
	})
	require.Greater(t, checked, 20, "the lists' filters are stated")
}

// eachFilter calls check with each query parameter keep takes of every
// route, and the route's path with its id (the run runID's steps, a new
// endpoint's attempts).
func (e *jobsEnv) eachFilter(runID string, keep func(httpapi.Param) bool,
	check func(r httpapi.Route, q httpapi.Param, path string)) {
	e.T.Helper()
	endpoint := e.Must(http.StatusCreated, "POST", "/api/v1/endpoints", e.ws.Key,
		map[string]any{"name": "filters"}).JSON()["id"].(string)
	ids := map[string]string{"/api/v1/runs/{id}/steps": runID, "/api/v1/endpoints/{id}/attempts": endpoint}
	for _, r := range httpapi.Routes() {
		for _, q := range r.Query {
			if !keep(q) {
				continue
			}
			path := r.Pattern
			if id, ok := ids[path]; ok {
				path = strings.Replace(path, "{id}", id, 1)
			}
			require.NotContains(e.T, path, "{", "a path for %s", r.Pattern)
			check(r, q, path)
		}
	}
}

// A workspace's name states in the document the bounds signup checks
// (contract QA: a plain string).
func TestSignupTagsAgreeWithTheHandler(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	checked := apitest.CheckRequestTags(t, apitest.TagProbe{
		Type: reflect.TypeFor[httpapi.SignupRequest](),
		Base: func(string) map[string]any { return map[string]any{} },
		Send: func(body map[string]any) *apitest.Response { return env.Do("POST", "/api/v1/workspaces", "", body) },
	})
	require.GreaterOrEqual(t, checked, 5, "a workspace's name is tagged")
}

// A list's filter given empty (?state=, ?effect_type=) is refused at the
// parameter, on every route whose filter takes only some values or a form
// (Enum, Pattern): it filtered nothing, and the list answered every row, the
// one a client that left its filter blank asked for among them (QA: the MCP
// tools refused it themselves; REST listed every effect, run and approval).
func TestAnEmptyFilterIsRefused(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{}})
	e.Must(http.StatusOK, "POST", "/api/v1/effects/begin", e.ws.Key, map[string]any{"effect_type": "a.b",
		"idempotency_key": "k"})
	checked := 0
	e.eachFilter(runID, func(q httpapi.Param) bool { return q.Enum != nil || q.Pattern != "" },
		func(r httpapi.Route, q httpapi.Param, path string) {
			before := string(e.Must(http.StatusOK, r.Method, path, e.ws.Key, nil).Body)
			for _, query := range []string{q.Name + "=", q.Name} {
				got := e.Do(r.Method, path+"?"+query, e.ws.Key, nil)
				require.Equal(t, []string{q.Name}, validationFields(t, got), "%s?%s: %s", r.Pattern, query, got.Body)
			}
			require.Equal(t, before, string(e.Must(http.StatusOK, r.Method, path, e.ws.Key, nil).Body))
			checked++
		})
	require.GreaterOrEqual(t, checked, 7, "the lists' filters are stated")
}

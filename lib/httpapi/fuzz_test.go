package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// fuzzRoute is a route whose body FuzzBodies sends; {run}, {effect} and
// {endpoint} stand for ids of the fuzzing workspace's own, {lease} (in a
// seed) for the effect's lease token.
type fuzzRoute struct {
	method, path string
	key          string // "op" (the operator key) or "" (none)
	seed         string // a body the route takes
}

var fuzzRoutes = []fuzzRoute{
	{"POST", "/api/v1/workspaces", "", `{"name":"acme"}`},
	{"POST", "/api/v1/effects/begin", "op", `{"effect_type":"email.send","idempotency_key":"k1","payload":{"to":"a@b.c"},"cost_micros":5}`},
	{"POST", "/api/v1/effects/{effect}/report", "op", `{"lease_token":"{lease}","outcome":"succeeded","result":{"id":"msg_1"}}`},
	{"PUT", "/api/v1/policies/email.send", "op", `{"mode":"allow","daily_budget_micros":1000000,"dimension_limits":{"to":{"daily_count":3}}}`},
	{"POST", "/api/v1/keys", "op", `{"name":"agent","preset":"AGENT"}`},
	{"POST", "/api/v1/runs", "op", `{"name":"r","budgetMicros":100}`},
	{"POST", "/api/v1/runs/{run}/steps", "op", `{"name":"send_email","version":"1","input":{"a":1},"maxAttempts":3}`},
	{"POST", "/api/v1/tools/send_email/contracts", "op", `{"handlerVersion":"1","inputSchema":{"type":"object"},"outputSchema":true}`},
	{"POST", "/api/v1/tools/send_email/test", "op", `{"version":"1","input":{"a":1}}`},
	{"POST", "/api/v1/workers/register", "op", `{"tools":[{"name":"send_email","version":"1"}]}`},
	{"POST", "/api/v1/jobs/report", "op", `{"reports":[{"jobId":"job_x","leaseToken":"t","status":"SUCCEEDED"}]}`},
	{"PUT", "/api/v1/endpoints/{endpoint}/policy", "op", `{"expectedVersion":1,"preset":"RELAXED"}`},
	{"POST", "/api/v1/groups", "op", `{"name":"g"}`},
	{"POST", "/api/v1/reconcile", "op", `{"effect_type":"email.send","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","records":[]}`},
	{"POST", "/api/v1/webhooks", "op", `{"url":"https://example.com/h","events":["run.finished"]}`},
}

// FuzzBodies sends arbitrary bytes as the body of routes that read one,
// on the real service over the real database: the answer is never a 5xx
// (nor a panic); a refusal is a 4xx with the error envelope of API.md §0
// (code, message, detail; a 400 invalid_request lists its problems in
// detail.validation), and every answer is one the OpenAPI document lists
// for the route, with its schema (apitest checks each). Each input costs a
// request and a transaction: run it briefly, with -parallel=1.
func FuzzBodies(f *testing.F) {
	env := apitest.Start(f)
	ws := env.Signup()
	ids := map[string]string{"op": ws.Key}
	run := env.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key, map[string]any{"name": "r"}).JSON()
	ids["{run}"] = run["id"].(string)
	eff := env.Must(http.StatusOK, "POST", "/api/v1/effects/begin", ws.Key,
		map[string]any{"effect_type": "email.send", "idempotency_key": "seed"}).JSON()
	ids["{effect}"], _ = eff["effect_id"].(string)
	lease, _ := eff["lease_token"].(string)
	end := env.Must(http.StatusCreated, "POST", "/api/v1/endpoints", ws.Key, map[string]any{"name": "billing"}).JSON()
	ids["{endpoint}"] = end["id"].(string)
	for k, v := range ids {
		require.NotEmpty(f, v, k)
	}

	for i, r := range fuzzRoutes {
		f.Add(uint8(i), []byte(strings.ReplaceAll(r.seed, "{lease}", lease)))
	}
	for i, s := range []string{``, `null`, `{}`, `[]`, `{"a":1}`, `{"name":"\u0000"}`, "{\"name\":\"\xff\"}",
		`{"name":1e400}`, `{} {}`, `{"name":"x","name":"y"}`, `{"":0}`, `{"a":` + strings.Repeat("[", 200)} {
		f.Add(uint8(i*5+2), []byte(s))
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		r := fuzzRoutes[int(which)%len(fuzzRoutes)]
		path := r.path
		for k, v := range ids {
			path = strings.ReplaceAll(path, k, v)
		}
		e := *env
		e.T = t // the OpenAPI check reports to this input's test
		res := e.Do(r.method, path, ids[r.key], body)
		if res.Status >= 500 {
			t.Fatalf("%s %s %q: %d %s", r.method, r.path, body, res.Status, res.Body)
		}
		if res.Header.Get("X-Request-Id") == "" || res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("%s %s %q: headers %v", r.method, r.path, body, res.Header)
		}
		if res.Status < 400 {
			return
		}
		var env struct {
			Error *struct {
				Code    string         `json:"code"`
				Message string         `json:"message"`
				Detail  map[string]any `json:"detail"`
			} `json:"error"`
		}
		if err := json.Unmarshal(res.Body, &env); err != nil || env.Error == nil || env.Error.Code == "" ||
			env.Error.Message == "" || env.Error.Detail == nil {
			t.Fatalf("%s %s %q: %d with body %s", r.method, r.path, body, res.Status, res.Body)
		}
		if env.Error.Code != "invalid_request" {
			return
		}
		problems, _ := env.Error.Detail["validation"].([]any)
		if res.Status != http.StatusBadRequest || len(problems) == 0 {
			t.Fatalf("%s %s %q: %d %s", r.method, r.path, body, res.Status, res.Body)
		}
		for _, p := range problems {
			p, _ := p.(map[string]any)
			if _, ok := p["field"].(string); !ok { // "" names a key sent empty
				t.Fatalf("%s %s %q: problem %v names no field", r.method, r.path, body, p)
			}
			if msg, _ := p["message"].(string); msg == "" {
				t.Fatalf("%s %s %q: problem %v has no message", r.method, r.path, body, p)
			}
		}
	})
}

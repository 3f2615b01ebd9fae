package sdktest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// What the Python and TypeScript SDKs send, against the OpenAPI document, as
// TestGoSDKRequestBodiesMatchTheOpenAPIDocument holds the Go SDK's: a script
// of each (testdata/requests.py, testdata/requests.mjs) calls every method
// with every option set against a recorder that answers {} to everything,
// and each request is compared with its route's operation. Their answer
// types are held to the document by their own suites (test_types.py,
// answers.test.js), which read it served.

// sentRequest is one request as the recorder saw it.
type sentRequest struct {
	method, path string
	query        map[string]string // its query parameters' values
	keyed        bool              // it carried an Idempotency-Key
	body         any
}

// requestRecorder answers every request 200 {} and keeps what was sent.
type requestRecorder struct {
	mu   sync.Mutex
	sent []sentRequest
}

func (r *requestRecorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.record(req)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte("{}"))
}

// record keeps req as sent, and returns it.
func (r *requestRecorder) record(req *http.Request) sentRequest {
	var body any
	if b, err := io.ReadAll(req.Body); err == nil && len(b) > 0 {
		if json.Unmarshal(b, &body) != nil {
			body = "not JSON: " + string(b)
		}
	}
	query := map[string]string{}
	for name, values := range req.URL.Query() {
		query[name] = strings.Join(values, ",")
	}
	s := sentRequest{req.Method, strings.TrimPrefix(req.URL.Path, "/api/v1"), query,
		req.Header.Get("Idempotency-Key") != "", body}
	r.mu.Lock()
	r.sent = append(r.sent, s)
	r.mu.Unlock()
	return s
}

// otherSDKRequestFieldsNotSent: request schema fields an SDK sends by no
// method, each with its reason ("route field"), beside goRequestFieldsNotSent.
var otherSDKRequestFieldsNotSent = map[string]map[string]string{
	"python":     {},
	"typescript": {},
}

// requests is what was sent.
func (r *requestRecorder) requests() []sentRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sent)
}

// sentRecorder answers the requests of a script and keeps what was sent.
type sentRecorder interface {
	http.Handler
	requests() []sentRequest
}

// recordSDKRequests runs the script (name args) in dir against rec and
// answers what it sent.
func recordSDKRequests(t *testing.T, rec sentRecorder, dir string, env []string, name string, args ...string) []sentRequest {
	t.Helper()
	srv := httptest.NewServer(rec)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "RATCHET_RECORDER_URL="+srv.URL, "PYTHONDONTWRITEBYTECODE=1"), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %v failed:\n%s", name, args, out)
	return rec.requests()
}

// sdkRequestDrift is each way sent differs from doc: a body field, or a
// query parameter, the route does not take (or a value its enum does
// not hold); a request to a route marked
// Idempotent without an Idempotency-Key; a route of the Go SDK's no request
// was sent to; a body field or query parameter of a route called that no
// request sent (unless notSent gives its reason).
func sdkRequestDrift(t *testing.T, doc map[string]any, sent []sentRequest, notSent map[string]string) []string {
	t.Helper()
	var problems []string
	sentNames := map[string]bool{} // "route field", body fields at any depth and query parameters
	called := map[string]bool{}
	for _, s := range sent {
		route := routeOf(t, doc, s.method, s.path)
		called[route] = true
		op := operation(t, doc, route)
		query, keyed := map[string]map[string]any{}, false
		for _, p := range anySlice(op["parameters"]) {
			p := p.(map[string]any)
			switch {
			case p["in"] == "query":
				query[p["name"].(string)], _ = p["schema"].(map[string]any)
			case p["in"] == "header" && p["name"] == "Idempotency-Key":
				keyed = true
			}
		}
		for q, v := range s.query {
			schema, ok := query[q]
			if !ok {
				problems = append(problems, route+" ?"+q+": sent, not a query parameter of the route")
			} else if enum := anySlice(schema["enum"]); enum != nil && !slices.Contains(enum, any(v)) {
				problems = append(problems, fmt.Sprintf("%s ?%s=%s: not one of the parameter's values %v", route, q, v, enum))
			}
			sentNames[route+" ?"+q] = true
		}
		if keyed && !s.keyed {
			problems = append(problems, route+": takes an Idempotency-Key, sent without one")
		}
		schema := bodySchema(op["requestBody"])
		if schema == nil {
			if s.body != nil {
				problems = append(problems, route+": takes no body, sent one")
			}
			continue
		}
		problems = append(problems, sentDrift(route, "", s.body, schema, sentNames)...)
	}
	for route := range called {
		op := operation(t, doc, route)
		var want []string
		if _, ok := goCallersFields[route]; !ok {
			want = schemaFieldPaths("", bodySchema(op["requestBody"]))
		}
		for _, p := range anySlice(op["parameters"]) {
			if p := p.(map[string]any); p["in"] == "query" {
				want = append(want, "?"+p["name"].(string))
			}
		}
		for _, field := range want {
			where := route + " " + field
			_, goReason := goRequestFieldsNotSent[where]
			if _, ok := notSent[where]; !ok && !goReason && !sentNames[where] {
				problems = append(problems, where+": taken by the route, sent by no method")
			}
		}
	}
	for _, r := range goAnswerRoutes {
		if !called[r[0]] {
			problems = append(problems, r[0]+": called by the Go SDK, by no method here")
		}
	}
	for where, why := range notSent {
		if sentNames[where] {
			problems = append(problems, where+" ("+why+") is listed as not sent, but is")
		}
	}
	sort.Strings(problems)
	return slices.Compact(problems)
}

func TestPythonSDKRequestsMatchTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	sent := recordSDKRequests(t, &requestRecorder{}, "testdata", []string{"PYTHONPATH=../" + pythonSDK}, pythonInterpreter(t), "requests.py")
	require.Empty(t, sdkRequestDrift(t, openAPIDoc(t), sent, otherSDKRequestFieldsNotSent["python"]),
		"what the Python SDK sends differs from the OpenAPI document")
}

func TestTypeScriptSDKRequestsMatchTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	sent := recordSDKRequests(t, &requestRecorder{}, "testdata", nil, nodeInterpreter(t), "requests.mjs")
	require.Empty(t, sdkRequestDrift(t, openAPIDoc(t), sent, otherSDKRequestFieldsNotSent["typescript"]),
		"what the TypeScript SDK sends differs from the OpenAPI document")
}

// The comparison reports each kind of drift: a query parameter the route
// does not take, or a value outside its enum, a body field it does not take
// (or a value outside its enum), a keyed route sent without a
// key, what a route called takes that nothing sent, a route of the Go SDK's
// not called, and a field listed as not sent that is.
func TestSDKRequestComparisonCatchesDrift(t *testing.T) {
	t.Parallel()
	doc := openAPIDoc(t)
	problems := sdkRequestDrift(t, doc, []sentRequest{
		{method: "GET", path: "/effects", query: map[string]string{"effectType": "e", "limit": "1", "cursor": "c",
			"state": "INDETERMINATE"}},
		{method: "POST", path: "/circuits/e/close", body: map[string]any{}},
		{method: "POST", path: "/approvals/a/approve", keyed: true, body: map[string]any{"notes": "n"}},
		{method: "POST", path: "/jobs/j/report", body: map[string]any{"leaseToken": "lt", "status": "DONE"}},
	}, map[string]string{"GET /effects ?limit": "why"})
	require.Subset(t, problems, []string{
		"GET /effects ?effectType: sent, not a query parameter of the route",
		"GET /effects ?effect_type: taken by the route, sent by no method",
		"GET /effects ?limit (why) is listed as not sent, but is",
		"GET /effects ?state=INDETERMINATE: not one of the parameter's values [leased succeeded failed indeterminate awaiting_approval denied]",
		"POST /circuits/{effect_type}/close: takes an Idempotency-Key, sent without one",
		"POST /approvals/{id}/approve notes: sent, not in the request schema",
		"POST /approvals/{id}/approve note: taken by the route, sent by no method",
		"POST /runs: called by the Go SDK, by no method here",
		"POST /jobs/{id}/report status=DONE: not one of the field's values [SUCCEEDED FAILED]",
	})
	for _, p := range problems {
		require.NotContains(t, p, "GET /effects ?cursor", "a query parameter sent is not reported")
		require.NotContains(t, p, "GET /effects ?state:", "a query parameter sent is not reported")
	}
}

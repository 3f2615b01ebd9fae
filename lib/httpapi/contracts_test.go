package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/jobs"
)

// customerSchema requires {customerId: string} and nothing else.
var customerSchema = map[string]any{
	"type":                 "object",
	"required":             []string{"customerId"},
	"properties":           map[string]any{"customerId": map[string]any{"type": "string", "minLength": 3}},
	"additionalProperties": false,
}

// receiptSchema requires an output {messageId: string}.
var receiptSchema = map[string]any{
	"type":       "object",
	"required":   []string{"messageId"},
	"properties": map[string]any{"messageId": map[string]any{"type": "string"}},
}

func contractBody(handler string, extra map[string]any) map[string]any {
	b := map[string]any{"handlerVersion": handler, "inputSchema": customerSchema, "outputSchema": receiptSchema}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func (e *jobsEnv) publish(name string, body map[string]any) map[string]any {
	e.T.Helper()
	return e.Must(http.StatusCreated, "POST", "/api/v1/tools/"+name+"/contracts", e.ws.Key, body).JSON()
}

func (e *jobsEnv) contracts(name string) []any {
	e.T.Helper()
	return e.Must(http.StatusOK, "GET", "/api/v1/tools/"+name+"/contracts", e.ingest, nil).JSON()["data"].([]any)
}

func (e *jobsEnv) stepOf(stepID string) map[string]any {
	e.T.Helper()
	return e.Must(http.StatusOK, "GET", "/api/v1/steps/"+stepID, e.ws.Key, nil).JSON()
}

func errorDetail(r interface{ JSON() map[string]any }) map[string]any {
	d, _ := r.JSON()["error"].(map[string]any)["detail"].(map[string]any)
	return d
}

func TestContractPublicationAndList(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	c1 := e.publish("send_email", contractBody("1", nil))
	require.EqualValues(t, 1, c1["contractVersion"], "the first contract of a tool is 1")
	require.Equal(t, "send_email", c1["name"])
	require.Equal(t, "1", c1["handlerVersion"])
	require.Equal(t, "STANDARD", c1["retryPreset"])
	require.Nil(t, c1["retryPolicy"], "built-in presets read retryPolicy null")
	require.EqualValues(t, 30000, c1["timeoutMs"])
	require.Equal(t, "ACTIVE", c1["status"])
	require.NotEmpty(t, c1["createdAt"])
	require.Equal(t, "object", c1["inputSchema"].(map[string]any)["type"])

	custom := map[string]any{"preset": "CUSTOM", "maxAttempts": 6, "initialDelayMs": 10000, "multiplier": 2,
		"maxDelayMs": 600000, "jitterPercent": 20}
	c2 := e.publish("send_email", contractBody("2", map[string]any{"retryPreset": "CUSTOM", "retryPolicy": custom,
		"timeoutMs": 5000, "status": "FORBIDDEN"}))
	require.EqualValues(t, 2, c2["contractVersion"])
	require.Equal(t, "CUSTOM", c2["retryPreset"])
	require.Equal(t, map[string]any{"preset": "CUSTOM", "maxAttempts": 6.0, "initialDelayMs": 10000.0,
		"multiplier": 2.0, "maxDelayMs": 600000.0, "jitterPercent": 20.0}, c2["retryPolicy"])
	require.Equal(t, "FORBIDDEN", c2["status"])
	require.EqualValues(t, 5000, c2["timeoutMs"])
	// The preset inside retryPolicy may be omitted; versions are per tool.
	delete(custom, "preset")
	other := e.publish("charge_card", contractBody("7", map[string]any{"retryPreset": "CUSTOM", "retryPolicy": custom}))
	require.EqualValues(t, 1, other["contractVersion"])
	require.Equal(t, "AGGRESSIVE", e.publish("send_email", contractBody("1",
		map[string]any{"retryPreset": "AGGRESSIVE", "inputSchema": true}))["retryPreset"])

	list := e.contracts("send_email")
	require.Len(t, list, 3)
	for i, c := range list {
		require.EqualValues(t, i+1, c.(map[string]any)["contractVersion"])
	}
	page := e.Must(http.StatusOK, "GET", "/api/v1/tools/send_email/contracts?limit=2", e.ws.Key, nil).JSON()
	require.Len(t, page["data"], 2)
	require.Equal(t, "2", page["nextCursor"])
	page = e.Must(http.StatusOK, "GET", "/api/v1/tools/send_email/contracts?limit=2&cursor=2", e.ws.Key, nil).JSON()
	require.Len(t, page["data"], 1)
	require.Nil(t, page["nextCursor"])
	require.Empty(t, e.contracts("unknown_tool"))
	// A cursor is a version as the API writes it: another spelling of one
	// is a mistyped cursor, refused as any other (QA: "+2" and "02" read
	// the page after 2, "0" the first).
	for _, cursor := range []string{"99999999999", "0", "02", "%2B2", "-1", "x"} {
		require.Equal(t, []string{"cursor"}, validationFields(t, e.Do("GET",
			"/api/v1/tools/send_email/contracts?cursor="+cursor, e.ws.Key, nil)), cursor)
	}

	// Without an outputSchema (or with null) any output is accepted: true.
	for _, out := range []any{nil, "omit"} {
		body := contractBody("9", nil)
		if out == "omit" {
			delete(body, "outputSchema")
		} else {
			body["outputSchema"] = out
		}
		require.Equal(t, true, e.publish("no_output", body)["outputSchema"])
	}

	// Another workspace sees none of them and numbers its own from 1.
	ws2 := e.Signup()
	require.Empty(t, e.Must(http.StatusOK, "GET", "/api/v1/tools/send_email/contracts", ws2.Key, nil).JSON()["data"])
	require.EqualValues(t, 1, e.Must(http.StatusCreated, "POST", "/api/v1/tools/send_email/contracts", ws2.Key,
		contractBody("1", nil)).JSON()["contractVersion"])
}

// A tool's name is one segment of /tools/{name}, a '/' in it sent as %2F:
// a name with dot or empty parts between its slashes reaches its contracts
// (security QA: they answered 404, though the tool could be enqueued), on
// /api/v1 and on the /v1 alias. A name that is itself a dot segment, which
// a client sends as it is, is refused wherever a tool is named, and so is
// "/", whose %2F Go's router reads as a trailing slash (fuzz QA: 404).
func TestEveryToolNameReachesItsContracts(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	for _, name := range []string{"x/..", "../x", "./x", "x/.", "a//b", "/a", "a/", "//", "..."} {
		c := e.publish(url.PathEscape(name), contractBody("1", nil))
		require.Equal(t, name, c["name"])
		list := e.contracts(url.PathEscape(name))
		require.Len(t, list, 1, name)
		alias := e.Must(http.StatusOK, "GET", "/v1/tools/"+url.PathEscape(name)+"/contracts", e.ws.Key, nil).JSON()
		require.Len(t, alias["data"], 1, "%s on /v1", name)
	}
	runID := e.run()
	for _, name := range []string{".", "..", "/"} {
		fields := validationFields(t, e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ws.Key,
			map[string]any{"name": name, "version": "1", "input": map[string]any{}}))
		require.Equal(t, []string{"name"}, fields, "enqueue %q", name)
		fields = validationFields(t, e.Do("POST", "/api/v1/keys", e.ws.Key,
			map[string]any{"name": "w", "preset": "WORKER", "tools": []string{name + "@1"}}))
		require.Equal(t, []string{"tools.0"}, fields, "key for %q", name)
		fields = validationFields(t, e.Do("POST", "/api/v1/workers/register", e.worker,
			map[string]any{"tools": []map[string]any{{"name": name, "version": "1"}}}))
		require.Equal(t, []string{"tools.0.name"}, fields, "register %q", name)
	}
	require.Empty(t, e.Must(http.StatusOK, "GET", "/api/v1/runs/"+runID+"/steps", e.ws.Key, nil).JSON()["data"])
}

func TestContractPublicationValidation(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	full := map[string]any{"maxAttempts": 6, "initialDelayMs": 10000, "multiplier": 2, "maxDelayMs": 600000,
		"jitterPercent": 20}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for a, b := range full {
			m[a] = b
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name   string
		body   map[string]any
		fields []string
	}{
		{"no handler", map[string]any{"inputSchema": true, "outputSchema": true}, []string{"handlerVersion"}},
		{"no schemas", map[string]any{"handlerVersion": "1"}, []string{"inputSchema"}},
		{"schema not compiling", contractBody("1", map[string]any{"inputSchema": map[string]any{"type": 5}}),
			[]string{"inputSchema.type"}}, // one problem, though the meta-schema's "type" has two alternatives
		{"schema not a schema", contractBody("1", map[string]any{"outputSchema": 42}), []string{"outputSchema"}},
		{"bad regexp", contractBody("1", map[string]any{"outputSchema": map[string]any{"pattern": "("}}),
			[]string{"outputSchema.pattern"}},
		{"external ref", contractBody("1", map[string]any{"inputSchema": map[string]any{"$ref": "file:///etc/passwd"}}),
			[]string{"inputSchema"}},
		{"remote ref", contractBody("1", map[string]any{"inputSchema": map[string]any{"$ref": "https://example.com/s.json"}}),
			[]string{"inputSchema"}},
		{"custom without policy", contractBody("1", map[string]any{"retryPreset": "CUSTOM"}), []string{"retryPolicy"}},
		{"built-in with policy", contractBody("1", map[string]any{"retryPreset": "STANDARD", "retryPolicy": full}),
			[]string{"retryPolicy"}},
		{"default preset with policy", contractBody("1", map[string]any{"retryPolicy": full}), []string{"retryPolicy"}},
		{"incomplete custom", contractBody("1", map[string]any{"retryPreset": "CUSTOM",
			"retryPolicy": with("initialDelayMs", nil)}), []string{"retryPolicy.initialDelayMs"}},
		{"custom attempts", contractBody("1", map[string]any{"retryPreset": "CUSTOM",
			"retryPolicy": with("maxAttempts", 11)}), []string{"retryPolicy.maxAttempts"}},
		{"custom max below initial", contractBody("1", map[string]any{"retryPreset": "CUSTOM",
			"retryPolicy": with("maxDelayMs", 5000)}), []string{"retryPolicy.maxDelayMs"}},
		{"custom policy preset", contractBody("1", map[string]any{"retryPreset": "CUSTOM",
			"retryPolicy": with("preset", "STANDARD")}), []string{"retryPolicy.preset"}},
		{"unknown preset", contractBody("1", map[string]any{"retryPreset": "SOMETIMES"}), []string{"retryPreset"}},
		{"timeout", contractBody("1", map[string]any{"timeoutMs": 999}), []string{"timeoutMs"}},
		{"status", contractBody("1", map[string]any{"status": "RETIRED"}), []string{"status"}},
	}
	for _, c := range cases {
		r := e.Do("POST", "/api/v1/tools/send_email/contracts", e.ws.Key, c.body)
		require.Equal(t, c.fields, validationFields(t, r), c.name)
	}
	// Unknown fields are refused (the shared decoder names them).
	require.Len(t, validationFields(t, e.Do("POST", "/api/v1/tools/send_email/contracts", e.ws.Key,
		contractBody("1", map[string]any{"retryPreset": "CUSTOM", "retryPolicy": with("bogus", 1)}))), 1)
	require.Equal(t, []string{"name"}, validationFields(t, e.Do("POST", "/api/v1/tools/a@b/contracts", e.ws.Key,
		contractBody("1", nil))))
	// A schema nests at most jobs.MaxSchemaDepth levels (QA: compiling a
	// chain of thousands took seconds of CPU past the request's deadline),
	// counted over objects and arrays, whatever the keywords.
	nested := func(levels int, wrap func(inner string) string) json.RawMessage {
		doc := "{}"
		for range levels - 1 {
			doc = wrap(doc)
		}
		return json.RawMessage(doc)
	}
	not := func(inner string) string { return `{"not":` + inner + `}` }
	props := func(inner string) string { return `{"properties":{"a":` + inner + `}}` }
	for _, field := range []string{"inputSchema", "outputSchema"} {
		for _, deep := range []json.RawMessage{nested(jobs.MaxSchemaDepth+1, not), nested(jobs.MaxSchemaDepth/2+1, props),
			json.RawMessage(`{"enum":[` + strings.Repeat("[", jobs.MaxSchemaDepth) + strings.Repeat("]", jobs.MaxSchemaDepth) + `]}`)} {
			require.Equal(t, []string{field}, validationFields(t, e.Do("POST", "/api/v1/tools/send_email/contracts",
				e.ws.Key, contractBody("1", map[string]any{field: deep}))), "%s of %d bytes", field, len(deep))
		}
	}
	// At most jobs.MaxSchemaParts objects and booleans (the compiler's time
	// grows with the square of their number), and a schema whose $refs
	// reach the same parts again and again is refused before any enqueue
	// pays for it (QA: 27 levels each applying the next twice, 1.7 kB).
	allOf := func(n int, part string) json.RawMessage {
		return json.RawMessage(`{"allOf":[` + strings.TrimSuffix(strings.Repeat(part+",", n), ",") + `]}`)
	}
	doubling := func(levels int) json.RawMessage {
		defs := make([]string, levels)
		for i := range levels - 1 {
			defs[i] = fmt.Sprintf(`"a%d":{"allOf":[{"$ref":"#/$defs/a%d"},{"$ref":"#/$defs/a%d"}]}`, i, i+1, i+1)
		}
		defs[levels-1] = fmt.Sprintf(`"a%d":{"type":"object"}`, levels-1)
		return json.RawMessage(`{"$ref":"#/$defs/a0","$defs":{` + strings.Join(defs, ",") + `}}`)
	}
	for name, wide := range map[string]json.RawMessage{"objects": allOf(jobs.MaxSchemaParts, "{}"),
		"booleans": allOf(jobs.MaxSchemaParts, "true"), "doubling refs": doubling(16)} {
		require.Equal(t, []string{"inputSchema"}, validationFields(t, e.Do("POST", "/api/v1/tools/send_email/contracts",
			e.ws.Key, contractBody("1", map[string]any{"inputSchema": wide}))), name)
	}
	// Nothing was published, and the first real publication is still 1.
	require.Empty(t, e.contracts("send_email"))
	require.EqualValues(t, 1, e.publish("send_email", contractBody("1", nil))["contractVersion"])
	// At the bound, in either shape, a schema is published; brackets inside
	// strings do not count.
	deepest := `{"properties":{"a":` + strings.Repeat(`{"properties":{"a":`, jobs.MaxSchemaDepth/2-2) + `{"description":"[[[[{{{{","properties":{}}` +
		strings.Repeat(`}}`, jobs.MaxSchemaDepth/2-2) + `}}`
	require.True(t, json.Valid([]byte(deepest)))
	require.EqualValues(t, 2, e.publish("send_email", contractBody("1", map[string]any{"inputSchema": json.RawMessage(deepest),
		"outputSchema": nested(jobs.MaxSchemaDepth, not)}))["contractVersion"])
	// At the bounds: as many parts as allowed, and refs shared a few times.
	require.EqualValues(t, 3, e.publish("send_email", contractBody("1", map[string]any{
		"inputSchema": allOf(jobs.MaxSchemaParts-1, "{}"), "outputSchema": doubling(10)}))["contractVersion"])
}

func TestConcurrentPublicationsGetDistinctVersions(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	const n = 8
	var mu sync.Mutex
	var got []int
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.Do("POST", "/api/v1/tools/send_email/contracts", e.ws.Key, contractBody(fmt.Sprint(i), nil))
			if r.Status == http.StatusCreated {
				mu.Lock()
				got = append(got, int(r.JSON()["contractVersion"].(float64)))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Ints(got)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6, 7, 8}, got)
}

func TestEnqueueSelectsContract(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	e.publish("send_email", contractBody("1", nil))                                   // 1
	e.publish("send_email", contractBody("2", nil))                                   // 2
	e.publish("send_email", contractBody("1", map[string]any{"timeoutMs": 7000}))     // 3: latest ACTIVE for 1
	e.publish("send_email", contractBody("1", map[string]any{"status": "FORBIDDEN"})) // 4
	e.publish("send_email", contractBody("5", map[string]any{"status": "FORBIDDEN"})) // 5: 5's only one
	runID := e.run()
	in := map[string]any{"customerId": "cus_1"}
	enqueue := func(body map[string]any) *struct {
		status int
		code   string
		fields []string
		res    map[string]any
	} {
		r := e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ingest, body)
		out := &struct {
			status int
			code   string
			fields []string
			res    map[string]any
		}{status: r.Status, code: r.ErrorCode(), res: r.JSON()}
		if r.Status == http.StatusBadRequest {
			out.fields = validationFields(t, r)
		}
		return out
	}
	contractOf := func(stepID string) any { return e.stepOf(stepID)["contractVersion"] }

	// Implicit: the latest ACTIVE contract of name@version (4 is FORBIDDEN).
	r := enqueue(map[string]any{"name": "send_email", "version": "1", "input": in})
	require.Equal(t, http.StatusCreated, r.status)
	require.EqualValues(t, 3, contractOf(r.res["stepId"].(string)))
	require.EqualValues(t, 7000, e.stepOf(r.res["stepId"].(string))["durableJob"].(map[string]any)["policy"].(map[string]any)["timeoutMs"])
	// Explicit wins over implicit.
	r = enqueue(map[string]any{"name": "send_email", "version": "1", "input": in, "contractVersion": 1})
	require.Equal(t, http.StatusCreated, r.status)
	require.EqualValues(t, 1, contractOf(r.res["stepId"].(string)))
	// No contract for send_email@3: none, the endpoint policy applies.
	r = enqueue(map[string]any{"name": "send_email", "version": "3", "input": "anything"})
	require.Equal(t, http.StatusCreated, r.status)
	require.Nil(t, contractOf(r.res["stepId"].(string)))
	// Explicit FORBIDDEN contract: 409 invalid_state; implicit, when every
	// contract of name@version is FORBIDDEN, too (jobs QA: it ran under
	// none), on the synthetic test as well.
	r = enqueue(map[string]any{"name": "send_email", "version": "1", "input": in, "contractVersion": 4})
	require.Equal(t, http.StatusConflict, r.status)
	require.Equal(t, "invalid_state", r.code)
	r = enqueue(map[string]any{"name": "send_email", "version": "5", "input": in})
	require.Equal(t, http.StatusConflict, r.status, "%v", r.res)
	require.Equal(t, "invalid_state", r.code)
	tested := e.Do("POST", "/api/v1/tools/send_email/test", e.ws.Key, map[string]any{"version": "5", "input": in})
	require.Equal(t, http.StatusConflict, tested.Status, "%s", tested.Body)
	require.Equal(t, "invalid_state", tested.ErrorCode())
	// Explicit contract for another handler version, or unknown.
	require.Equal(t, []string{"version"}, enqueue(map[string]any{"name": "send_email", "version": "1", "input": in,
		"contractVersion": 2}).fields)
	require.Equal(t, []string{"contractVersion"}, enqueue(map[string]any{"name": "send_email", "version": "1",
		"input": in, "contractVersion": 99}).fields)
	require.Equal(t, []string{"contractVersion"}, enqueue(map[string]any{"name": "send_email", "version": "1",
		"input": in, "contractVersion": int64(1) << 31}).fields)
	require.Len(t, e.getRun(runID)["steps"], 3, "refused enqueues stored nothing")
}

func TestEnqueueValidatesInputAgainstContract(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	e.publish("send_email", contractBody("1", nil))
	runID := e.run()
	bad := func(input any) []string {
		return validationFields(t, e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ingest,
			map[string]any{"name": "send_email", "version": "1", "input": input}))
	}
	require.Equal(t, []string{"input.customerId"}, bad(map[string]any{}))
	require.Equal(t, []string{"input.customerId"}, bad(map[string]any{"customerId": 5}))
	require.Equal(t, []string{"input.customerId"}, bad(map[string]any{"customerId": "ab"}))
	require.Equal(t, []string{"input.extra"}, bad(map[string]any{"customerId": "cus_1", "extra": true}))
	require.Equal(t, []string{"input"}, bad(nil))
	r := e.Do("POST", "/api/v1/runs/"+runID+"/steps", e.ingest, map[string]any{"name": "send_email", "version": "1",
		"input": map[string]any{"customerId": 12345678}})
	require.NotContains(t, string(r.Body), "12345678", "validation messages never quote input values")
	require.Empty(t, e.getRun(runID)["steps"])
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"customerId": "cus_1"}})
}

func TestContractPolicyOverridesEndpointPolicy(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	ep := e.endpoint("Email service")
	e.Must(http.StatusOK, "PUT", "/api/v1/endpoints/"+ep["id"].(string)+"/policy", e.ws.Key, map[string]any{
		"expectedVersion": ep["version"], "preset": "CUSTOM", "maxAttempts": 6, "initialDelayMs": 10000,
		"multiplier": 3, "maxDelayMs": 600000, "jitterPercent": 10, "defaultTimeoutMs": 45000})
	e.publish("send_email", contractBody("1", map[string]any{"timeoutMs": 12000})) // STANDARD
	e.publish("send_email", contractBody("2", map[string]any{"retryPreset": "CUSTOM", "retryPolicy": map[string]any{
		"maxAttempts": 4, "initialDelayMs": 2000, "multiplier": 1.5, "maxDelayMs": 9000, "jitterPercent": 0}}))
	runID := e.run()
	in := map[string]any{"customerId": "cus_1"}
	policy := func(body map[string]any) map[string]any {
		body["endpoint"] = "Email service"
		st := e.stepOf(e.enqueue(runID, body)["stepId"].(string))
		return st["durableJob"].(map[string]any)["policy"].(map[string]any)
	}
	std := policy(map[string]any{"name": "send_email", "version": "1", "input": in})
	require.Equal(t, map[string]any{"preset": "STANDARD", "maxAttempts": 5.0, "initialDelayMs": 30000.0,
		"multiplier": 2.0, "maxDelayMs": 900000.0, "jitterPercent": 20.0, "timeoutMs": 12000.0}, std,
		"a STANDARD contract overrides a CUSTOM endpoint policy")
	count := policy(map[string]any{"name": "send_email", "version": "1", "input": in, "maxAttempts": 2, "idempotencyKey": "k2"})
	require.EqualValues(t, 2, count["maxAttempts"], "enqueue maxAttempts overrides only the count")
	require.Equal(t, "STANDARD", count["preset"])
	require.EqualValues(t, 30000, count["initialDelayMs"])
	tm := policy(map[string]any{"name": "send_email", "version": "1", "input": in, "timeoutMs": 2000, "idempotencyKey": "k3"})
	require.EqualValues(t, 2000, tm["timeoutMs"], "enqueue timeoutMs overrides only the timeout")
	require.Equal(t, "STANDARD", tm["preset"])
	custom := policy(map[string]any{"name": "send_email", "version": "2", "input": in})
	require.Equal(t, map[string]any{"preset": "CUSTOM", "maxAttempts": 4.0, "initialDelayMs": 2000.0,
		"multiplier": 1.5, "maxDelayMs": 9000.0, "jitterPercent": 0.0, "timeoutMs": 30000.0}, custom)
	none := policy(map[string]any{"name": "send_email", "version": "3", "input": in})
	require.Equal(t, "CUSTOM", none["preset"])
	require.EqualValues(t, 6, none["maxAttempts"], "without a contract the endpoint policy applies")
	require.EqualValues(t, 45000, none["timeoutMs"])
}

func TestOutputIsValidatedAgainstContract(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	e.publish("send_email", contractBody("1", nil))
	runID := e.run()
	enq := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1",
		"input": map[string]any{"customerId": "cus_1"}, "maxAttempts": 5})
	wid := e.register("send_email@1")
	job := e.claim(wid, 1)[0]
	bad := map[string]any{"status": "SUCCEEDED", "output": map[string]any{"messageId": 42}}
	r := e.report(job, bad)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, "EXHAUSTED", r.JSON()["status"], "a rejected output is a non-retryable failure")
	require.Nil(t, r.JSON()["nextDueAt"])
	// A repeat of the same report answers the same object.
	again := e.report(job, map[string]any{"status": "SUCCEEDED", "output": map[string]any{"messageId": 42}})
	require.Equal(t, http.StatusOK, again.Status, "%s", again.Body)
	require.Equal(t, r.JSON(), again.JSON())
	// The worker reported a success: a failure with the same token is
	// another outcome, though the record says FAILED.
	other := e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "x"}})
	require.Equal(t, http.StatusConflict, other.Status, "%s", other.Body)
	require.Equal(t, "invalid_state", other.ErrorCode())
	st := e.stepOf(enq["stepId"].(string))
	require.Equal(t, "EXHAUSTED", st["status"])
	require.Nil(t, st["outputPreview"], "a rejected output is not stored")
	att := st["durableJob"].(map[string]any)["attempts"].([]any)[0].(map[string]any)
	require.Equal(t, "FAILED", att["outcome"])
	require.Equal(t, false, att["retryable"])
	require.Contains(t, att["warning"], "output.messageId")
	require.NotContains(t, att["warning"], "42")

	// A valid output succeeds; a missing one is refused too.
	enq2 := e.enqueue(runID, map[string]any{"name": "send_email", "version": "1",
		"input": map[string]any{"customerId": "cus_2"}})
	job = e.claim(wid, 1)[0]
	require.Equal(t, enq2["jobId"], job["jobId"])
	require.Equal(t, "SUCCEEDED", e.report(job, map[string]any{"status": "SUCCEEDED",
		"output": map[string]any{"messageId": "m_1"}}).JSON()["status"])
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"customerId": "cus_3"}})
	job = e.claim(wid, 1)[0]
	require.Equal(t, "EXHAUSTED", e.report(job, map[string]any{"status": "SUCCEEDED"}).JSON()["status"])
	// A job without a contract takes any output.
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "9", "input": 1})
	w9 := e.Must(http.StatusCreated, "POST", "/api/v1/workers/register", e.ws.Key, map[string]any{
		"tools": []map[string]string{{"name": "send_email", "version": "9"}}}).JSON()["workerId"].(string)
	c := e.Must(http.StatusOK, "POST", "/api/v1/workers/"+w9+"/claim", e.ws.Key, map[string]any{}).JSON()["jobs"].([]any)[0].(map[string]any)
	r = e.Do("POST", "/api/v1/jobs/"+c["jobId"].(string)+"/report", e.ws.Key, map[string]any{
		"leaseToken": c["leaseToken"], "status": "SUCCEEDED", "output": "free-form"})
	require.Equal(t, "SUCCEEDED", r.JSON()["status"])
}

func TestBatchReportValidatesOutput(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	e.publish("send_email", contractBody("1", nil))
	runID := e.run()
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"customerId": "cus_1"}})
	e.enqueue(runID, map[string]any{"name": "send_email", "version": "1", "input": map[string]any{"customerId": "cus_2"}})
	wid := e.register("send_email@1")
	jobs := e.claim(wid, 2)
	require.Len(t, jobs, 2)
	r := e.Must(http.StatusOK, "POST", "/api/v1/jobs/report", e.worker, map[string]any{"reports": []map[string]any{
		{"jobId": jobs[0]["jobId"], "leaseToken": jobs[0]["leaseToken"], "status": "SUCCEEDED", "output": map[string]any{"messageId": "m"}},
		{"jobId": jobs[1]["jobId"], "leaseToken": jobs[1]["leaseToken"], "status": "SUCCEEDED", "output": map[string]any{}},
	}}).JSON()["results"].([]any)
	require.Equal(t, "SUCCEEDED", r[0].(map[string]any)["status"])
	require.Equal(t, "EXHAUSTED", r[1].(map[string]any)["status"])
}

func TestSyntheticToolTest(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	e.publish("send_email", contractBody("1", map[string]any{"timeoutMs": 8000}))
	res := e.Must(http.StatusOK, "POST", "/api/v1/tools/send_email/test", e.ws.Key,
		map[string]any{"version": "1", "input": map[string]any{"customerId": "cus_1"}}).JSON()
	require.EqualValues(t, 1, res["maxAttempts"])
	require.EqualValues(t, 1, res["contractVersion"])
	require.Equal(t, "QUEUED", res["status"])
	for _, k := range []string{"runId", "stepId", "jobId"} {
		require.NotEmpty(t, res[k], k)
	}
	run := e.getRun(res["runId"].(string))
	require.Equal(t, true, run["completionRequested"])
	require.Equal(t, true, run["synthetic"])
	require.Equal(t, false, e.getRun(e.run())["synthetic"])
	require.Len(t, run["steps"], 1)
	dj := durable(run, 0)
	require.EqualValues(t, 1, dj["maxAttempts"], "synthetic tests always have one attempt")
	require.EqualValues(t, 8000, dj["policy"].(map[string]any)["timeoutMs"])

	wid := e.register("send_email@1")
	job := e.claim(wid, 1)[0]
	require.Equal(t, res["jobId"], job["jobId"])
	r := e.report(job, map[string]any{"status": "FAILED", "error": map[string]any{"message": "boom", "retryable": true}})
	require.Equal(t, "EXHAUSTED", r.JSON()["status"])
	require.Equal(t, "FAILED", e.getRun(res["runId"].(string))["status"])

	// The contract's input schema applies; a tool without one takes anything.
	require.Equal(t, []string{"input.customerId"}, validationFields(t, e.Do("POST", "/api/v1/tools/send_email/test",
		e.ws.Key, map[string]any{"version": "1", "input": map[string]any{}})))
	require.Equal(t, []string{"version"}, validationFields(t, e.Do("POST", "/api/v1/tools/send_email/test",
		e.ws.Key, map[string]any{"input": 1})))
	free := e.Must(http.StatusOK, "POST", "/api/v1/tools/other/test", e.ws.Key, map[string]any{"version": "1"}).JSON()
	require.Nil(t, free["contractVersion"])
	// Scope: contracts:write.
	r = e.Do("POST", "/api/v1/tools/send_email/test", e.ingest, map[string]any{"version": "1"})
	require.Equal(t, http.StatusForbidden, r.Status)
	require.Equal(t, []any{"contracts:write"}, errorDetail(r)["required"])
}

func TestContractScopes(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	r := e.Do("POST", "/api/v1/tools/send_email/contracts", e.ingest, contractBody("1", nil))
	require.Equal(t, http.StatusForbidden, r.Status)
	require.Equal(t, []any{"contracts:write"}, errorDetail(r)["required"])
	r = e.Do("GET", "/api/v1/tools/send_email/contracts", e.worker, nil)
	require.Equal(t, http.StatusForbidden, r.Status)
	require.Equal(t, []any{"runs:read"}, errorDetail(r)["required"])
	publisher := e.Key(e.ws, map[string]any{"name": "pub", "scopes": []string{"contracts:write"}})
	require.EqualValues(t, 1, e.Must(http.StatusCreated, "POST", "/api/v1/tools/send_email/contracts", publisher,
		contractBody("1", nil)).JSON()["contractVersion"])
}

// A page of contracts ends before it passes what one answer holds
// (answer.Budget), with a cursor to the rest (QA: 14 contracts of two
// 250 KB schemas answered 7 MB, over Lambda's and Vercel's limits).
func TestContractListPagesStayWithinAnAnswersBudget(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	big := map[string]any{"type": "object", "description": strings.Repeat("d", 250_000)}
	for i := range 9 {
		e.publish("bigtool", contractBody(fmt.Sprint(i), map[string]any{"inputSchema": big, "outputSchema": big}))
	}
	first := e.Must(http.StatusOK, "GET", "/api/v1/tools/bigtool/contracts", e.ws.Key, nil)
	require.LessOrEqual(t, len(bytes.TrimSpace(first.Body)), answer.Budget)
	page := first.JSON()
	require.Len(t, page["data"], 7, "seven pairs of schemas fit in 4 MB, eight do not")
	require.Equal(t, "7", page["nextCursor"])
	rest := e.Must(http.StatusOK, "GET", "/api/v1/tools/bigtool/contracts?cursor=7", e.ws.Key, nil).JSON()
	require.Len(t, rest["data"], 2)
	require.Nil(t, rest["nextCursor"])
}

// A count a schema states (a length, a number of items, properties or
// contained items) that an int64 cannot hold is refused at publication:
// the compiler kept its low 64 bits, so {"maxLength": 1e300} refused every
// string as "at most 0 characters" and {"minLength": 2^64} took the empty
// string (contract QA). The largest count an int64 holds still works.
func TestContractCountsBeyondAnInt64AreRefused(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	runID := e.run()
	for _, schema := range []string{
		`{"maxLength":1e300}`, `{"minLength":18446744073709551616}`, `{"maxLength":9223372036854775808}`,
		`{"properties":{"a":{"items":{"maxItems":1e20}}}}`, `{"$defs":{"x":{"minProperties":1e19}},"$ref":"#/$defs/x"}`,
		`{"contains":true,"maxContains":36893488147419103232}`,
	} {
		require.Equal(t, []string{"inputSchema"}, validationFields(t, e.Do("POST",
			"/api/v1/tools/send_email/contracts", e.ws.Key, `{"handlerVersion":"1","inputSchema":`+schema+`}`)),
			"%s", schema)
	}
	require.Empty(t, e.Must(http.StatusOK, "GET", "/api/v1/tools/send_email/contracts", e.ws.Key, nil).JSON()["data"])
	// A count no schema part applies (a constant's data) is not one.
	for _, schema := range []string{`{"maxLength":9223372036854775807,"minItems":9.2e18}`,
		`{"const":{"maxLength":1e300}}`} {
		c := e.Must(http.StatusCreated, "POST", "/api/v1/tools/send_email/contracts", e.ws.Key,
			`{"handlerVersion":"1","inputSchema":`+schema+`}`).JSON()
		input := `"a string"`
		if strings.Contains(schema, "const") {
			input = `{"maxLength":1e300}`
		}
		e.Must(http.StatusCreated, "POST", "/api/v1/runs/"+runID+"/steps", e.ingest,
			fmt.Sprintf(`{"name":"send_email","version":"1","contractVersion":%v,"input":%s}`, c["contractVersion"], input))
	}
}

package main

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

func TestMain(m *testing.M) { os.Exit(apitest.FunctionMain(m, main)) }

// urlEvent is a Function URL request (payload format 2.0) as Lambda sends
// it in buffered mode.
func urlEvent(method, path, query, key, body string, base64Body bool) events.LambdaFunctionURLRequest {
	ev := events.LambdaFunctionURLRequest{
		Version: "2.0", RawPath: path, RawQueryString: query, Body: body, IsBase64Encoded: base64Body,
		Headers: map[string]string{"content-type": "application/json", "host": "abc.lambda-url.us-east-1.on.aws"},
		RequestContext: events.LambdaFunctionURLRequestContext{
			HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: method, Path: path, SourceIP: "203.0.113.9"},
		},
	}
	if key != "" {
		ev.Headers["authorization"] = "Bearer " + key
	}
	return ev
}

// The deployed API function, its real main and lambda.Start included,
// serves the routes through Lambda's Runtime API as the local server does:
// signup, a key, a begin answered execute then in_flight, its report, the
// begin again answered duplicate, a read with a query string, a base64 body,
// and an error in the API's envelope. Each answer carries its request id,
// and the process logs no secret.
func TestTheLambdaFunctionServesTheAPIThroughTheRuntimeAPI(t *testing.T) {
	rt := apitest.NewLambdaRuntime(t)
	logs := rt.StartFunction(t)
	call := func(ev events.LambdaFunctionURLRequest) (int, map[string]any) {
		t.Helper()
		return invoke(t, rt, ev)
	}

	status, health := call(urlEvent("GET", "/api/v1/health", "", "", "", false))
	require.Equal(t, http.StatusOK, status, "%v", health)

	status, signup := call(urlEvent("POST", "/api/v1/workspaces", "", "", `{"name":"lambda"}`, false))
	require.Equal(t, http.StatusCreated, status, "%v", signup)
	root := signup["key"].(map[string]any)["secret"].(string)
	status, agent := call(urlEvent("POST", "/api/v1/keys", "", root, `{"name":"agent","preset":"AGENT"}`, false))
	require.Equal(t, http.StatusCreated, status, "%v", agent)
	key := agent["secret"].(string)

	begin := `{"effect_type":"email.send","idempotency_key":"welcome:lambda","payload":{"to":"u1"}}`
	status, first := call(urlEvent("POST", "/api/v1/effects/begin", "", key, begin, false))
	require.Equal(t, http.StatusOK, status, "%v", first)
	require.Equal(t, "execute", first["decision"])
	// The same begin, its body base64-encoded as a Function URL sends a
	// body it does not take for text.
	status, second := call(urlEvent("POST", "/api/v1/effects/begin", "", key,
		base64.StdEncoding.EncodeToString([]byte(begin)), true))
	require.Equal(t, http.StatusOK, status, "%v", second)
	require.Equal(t, "in_flight", second["decision"])
	require.Equal(t, first["effect_id"], second["effect_id"])

	effect := first["effect_id"].(string)
	report := `{"lease_token":"` + first["lease_token"].(string) + `","outcome":"succeeded","result":{"message_id":"m1"}}`
	status, reported := call(urlEvent("POST", "/api/v1/effects/"+effect+"/report", "", key, report, false))
	require.Equal(t, http.StatusOK, status, "%v", reported)
	status, again := call(urlEvent("POST", "/api/v1/effects/begin", "", key, begin, false))
	require.Equal(t, http.StatusOK, status, "%v", again)
	require.Equal(t, "duplicate", again["decision"])
	require.Equal(t, map[string]any{"message_id": "m1"}, again["result"])

	status, page := call(urlEvent("GET", "/api/v1/effects", "limit=1&state=succeeded", root, "", false))
	require.Equal(t, http.StatusOK, status, "%v", page)
	require.Len(t, page["data"], 1)
	require.Equal(t, effect, page["data"].([]any)[0].(map[string]any)["id"])

	status, refused := call(urlEvent("POST", "/api/v1/effects/begin", "", key, `{"effect_type":`, false))
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "invalid_request", refused["error"].(map[string]any)["code"])
	status, refused = call(urlEvent("GET", "/api/v1/effects", "", "rk_not_a_key", "", false))
	require.Equal(t, http.StatusUnauthorized, status)
	require.Equal(t, "unauthorized", refused["error"].(map[string]any)["code"])

	require.Contains(t, logs(), `"route":"effects.report"`, "served by the function's process")
	for _, secret := range []string{root, key, first["lease_token"].(string)} {
		require.NotContains(t, logs(), secret)
	}
	require.NotContains(t, logs(), "welcome:lambda", "nor an idempotency key")
}

// invoke hands ev to the function and answers its response's status and
// JSON body (nil when it has none), failing on a function error or an
// answer without a request id.
func invoke(t *testing.T, rt *apitest.LambdaRuntime, ev events.LambdaFunctionURLRequest) (int, map[string]any) {
	t.Helper()
	a := rt.Invoke(t, ev)
	require.False(t, a.Error, "a function error: %s", a.Payload)
	var res events.LambdaFunctionURLResponse
	require.NoError(t, json.Unmarshal(a.Payload, &res), "%s", a.Payload)
	require.True(t, strings.HasPrefix(res.Headers["X-Request-Id"], "req_"), "%v", res.Headers)
	body := []byte(res.Body)
	if res.IsBase64Encoded {
		var err error
		body, err = base64.StdEncoding.DecodeString(res.Body)
		require.NoError(t, err)
	}
	var out map[string]any
	if len(body) > 0 {
		require.NoError(t, json.Unmarshal(body, &out), "%s", body)
	}
	return res.StatusCode, out
}

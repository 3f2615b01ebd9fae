package main

import (
	"context"
	"encoding/base64"
	"net/http"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// The deployed API function's process, as Lambda runs it, logs nothing a
// caller chose (lib/sdktest's TestNothingUserControlledIsLogged, through
// the Function URL's events): marked values in the path, query, headers,
// cookies and body, a body that is not base64 and a path that is not one,
// a method no HTTP has, an event that is not a Function URL request, and a
// begin that fails on an error quoting its key (apitest.RefuseMarked).
// Nor does what the function answers the runtime with when it fails
// (Lambda logs a function's error).
func TestTheFunctionLogsNothingUserControlled(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), apitest.Config(t).DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	apitest.RefuseMarked(t, pool)
	rt := apitest.NewLambdaRuntime(t)
	logs := rt.StartFunction(t)
	n := 0
	c := func(label string) string { n++; return apitest.Marked(label, n) }
	var secrets []string
	call := func(ev events.LambdaFunctionURLRequest) (int, map[string]any) {
		t.Helper()
		status, out := invoke(t, rt, ev)
		t.Logf("%s %s → %d %.200v", ev.RequestContext.HTTP.Method, ev.RawPath, status, out)
		return status, out
	}
	marked := func(method, path, key, body string) events.LambdaFunctionURLRequest {
		ev := urlEvent(method, path, "cursor="+c("query")+"&"+c("param")+"=1", key, body, false)
		ev.Headers["x-leak"], ev.Headers["idempotency-key"], ev.Headers["user-agent"] = c("header"), c("idem"), c("agent")
		ev.Cookies = []string{c("cookie") + "=" + c("cookievalue")}
		return ev
	}

	status, signup := call(urlEvent("POST", "/api/v1/workspaces", "", "", `{"name":"`+c("workspace")+`"}`, false))
	require.Equal(t, http.StatusCreated, status, "%v", signup)
	root := signup["key"].(map[string]any)["secret"].(string)
	secrets = append(secrets, root)
	begin := `{"effect_type":"push.send","idempotency_key":"` + c("key") + `","payload":{"to":"` + c("payload") + `"}}`
	status, first := call(urlEvent("POST", "/api/v1/effects/begin", "", root, begin, false))
	require.Equal(t, http.StatusOK, status, "%v", first)
	token := first["lease_token"].(string)
	secrets = append(secrets, token)
	report := `{"lease_token":"` + token + `","outcome":"succeeded","result":{"id":"` + c("result") + `"}}`
	call(urlEvent("POST", "/api/v1/effects/"+first["effect_id"].(string)+"/report", "", root,
		base64.StdEncoding.EncodeToString([]byte(report)), true))
	call(marked("POST", "/api/v1/effects/begin", root, begin))
	unqueried := marked("POST", "/api/v1/effects/begin", root, begin)
	unqueried.RawQueryString = ""
	call(unqueried)
	call(marked("GET", "/api/v1/effects", root, ""))
	call(marked("GET", "/api/v1/effects/"+c("effect"), root, ""))
	call(marked("POST", "/api/v1/"+c("route"), root, `{"x":"`+c("body")+`"}`))
	call(marked(c("METHOD"), "/api/v1/effects", root, ""))
	call(marked("GET", "/api/v1/effects", "rk_live_"+c("badkey"), ""))
	call(marked("POST", "/api/v1/effects/begin", root, `{"effect_type":"`+c("broken")))
	bad := marked("POST", "/api/v1/effects/begin", root, "!"+c("notbase64"))
	bad.IsBase64Encoded = true
	status, _ = call(bad)
	require.Equal(t, http.StatusBadRequest, status)
	bad = marked("GET", "/api/v1/%zz"+c("rawpath"), root, "")
	status, _ = call(bad)
	require.Equal(t, http.StatusBadRequest, status)
	status, _ = call(urlEvent("POST", "/api/v1/effects/begin", "", root,
		`{"effect_type":"push.send","idempotency_key":"`+c("castme")+`"}`, false))
	require.Equal(t, http.StatusInternalServerError, status)

	// Events that are no Function URL request: the function's error.
	for _, ev := range []any{c("event"), map[string]any{"version": 2, "rawPath": 7, "body": c("eventbody")},
		[]any{c("eventlist")}} {
		a := rt.Invoke(t, ev)
		t.Logf("event → error %v %s", a.Error, a.Payload)
		require.True(t, a.Error)
		apitest.RequireNoLeak(t, string(a.Payload), nil, "errorMessage")
	}

	apitest.RequireNoLeak(t, logs(), secrets, `"msg":"request"`, `"method":"other"`, `"msg":"internal error"`,
		`"route":"effects.begin"`, "SQLSTATE 22P02")
}

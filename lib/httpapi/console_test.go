package httpapi_test

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/console"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/lambdaurl"
)

// get sends a bare request (the console is not in the OpenAPI document,
// which apitest's Do checks every answer against).
func get(t *testing.T, env *apitest.Env, method, path string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, env.Server.URL+path, nil)
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := env.Client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(body)
}

func requireConsoleHeaders(t *testing.T, h http.Header, path string) {
	t.Helper()
	for k, v := range console.Headers {
		require.Equal(t, v, h.Get(k), "%s: %s", path, k)
	}
	require.Contains(t, h.Get("Content-Security-Policy"), "script-src 'self';", path)
	require.Contains(t, h.Get("Content-Security-Policy"), "frame-ancestors 'none'", path)
	require.NotEmpty(t, h.Get("X-Request-Id"), path)
}

// The console is served by the router (the local server and Lambda), with
// its security headers, at /console, /console/ and /console/index.html.
func TestConsoleIsServedWithItsHeaders(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	page := string(console.Files()[0].Body)
	require.Contains(t, page, `<script type="module" src="/console/console.js">`)
	for _, path := range []string{"/console", "/console/", "/console/index.html"} {
		res, body := get(t, env, "GET", path, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		require.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"), path)
		require.Equal(t, page, body, path)
		requireConsoleHeaders(t, res.Header, path)
	}
	for _, f := range console.Files()[1:] {
		path := console.Page + "/" + f.Name
		res, body := get(t, env, "GET", path, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		require.Equal(t, f.ContentType, res.Header.Get("Content-Type"), path)
		require.Equal(t, string(f.Body), body, path)
		requireConsoleHeaders(t, res.Header, path)

		// Revalidation costs a 304 and no body.
		res, body = get(t, env, "GET", path, http.Header{"If-None-Match": {res.Header.Get("ETag")}})
		require.Equal(t, http.StatusNotModified, res.StatusCode, path)
		require.Empty(t, body)

		res, body = get(t, env, "HEAD", path, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		require.Empty(t, body)
	}
	js := string(console.Files()[1].Body)
	require.Contains(t, js, "export function start(")
	require.Contains(t, string(console.Files()[2].Body), ":root")
}

// Any other path or method under /console is an unknown route, answered
// as every other one is.
func TestConsoleUnknownPathsAreNotFound(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/console/nope.js", ""},
		{"GET", "/console/static/console.js", ""},
		{"GET", "/consoles", ""},
		{"GET", "/api/v1/console", ""},
		{"POST", "/console", "GET"},
		{"DELETE", "/console/console.js", "GET"},
	} {
		res, body := get(t, env, tc.method, tc.path, nil)
		require.Equal(t, http.StatusNotFound, res.StatusCode, "%s %s", tc.method, tc.path)
		require.Contains(t, body, `"code":"not_found"`, "%s %s", tc.method, tc.path)
		require.Equal(t, tc.allow, res.Header.Get("Allow"), "%s %s", tc.method, tc.path)
		require.Empty(t, res.Header.Get("Content-Security-Policy"), "%s %s", tc.method, tc.path)
	}
}

// The console is pages, not API: the route table, and so the OpenAPI
// document, the manifest and the Vercel functions, leave it out; on Vercel
// its files are public/'s, with the same headers and /console answered.
func TestConsoleOnVercel(t *testing.T) {
	t.Parallel()
	for _, r := range httpapi.Routes() {
		require.False(t, strings.HasPrefix(r.Pattern, console.Page), r.Pattern)
	}
	for _, f := range httpapi.VercelFunctions() {
		require.NotContains(t, f.File, "console")
	}
	static := httpapi.VercelStaticFiles()
	for _, f := range console.Files() {
		require.Equal(t, f.Body, static["public/console/"+f.Name], f.Name)
	}
	var doc struct {
		Rewrites []struct{ Source, Destination string } `json:"rewrites"`
		Headers  []struct {
			Source  string `json:"source"`
			Headers []struct{ Key, Value string }
		} `json:"headers"`
	}
	require.NoError(t, json.Unmarshal(httpapi.VercelJSON(), &doc))
	var sources []string
	for _, h := range doc.Headers {
		sources = append(sources, h.Source)
		got := map[string]string{}
		for _, kv := range h.Headers {
			got[kv.Key] = kv.Value
		}
		require.Equal(t, console.Headers, got, h.Source)
	}
	require.ElementsMatch(t, []string{"/console", "/console/:path*"}, sources)
	n := len(doc.Rewrites)
	require.Equal(t, "/console", doc.Rewrites[n-2].Source, "before the catch-all")
	require.Equal(t, "/console/index.html", doc.Rewrites[n-2].Destination)
}

// Through a Lambda Function URL (every path reaches the API function) the
// console is the same files with the same headers.
func TestConsoleOnLambda(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	for _, f := range console.Files() {
		res, err := lambdaurl.Handler(env.App.Server)(t.Context(), events.LambdaFunctionURLRequest{
			RawPath: console.Page + "/" + f.Name, RequestContext: events.LambdaFunctionURLRequestContext{
				HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: "GET"}}})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode, f.Name)
		require.Equal(t, f.ContentType, res.Headers["Content-Type"], f.Name)
		require.Equal(t, console.Headers["Content-Security-Policy"], res.Headers["Content-Security-Policy"], f.Name)
		body := res.Body
		if res.IsBase64Encoded {
			raw, err := base64.StdEncoding.DecodeString(body)
			require.NoError(t, err)
			body = string(raw)
		}
		require.Equal(t, string(f.Body), body, f.Name)
	}
}

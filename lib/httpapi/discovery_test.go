package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/mcpserver"
)

func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	doc := env.Must(http.StatusOK, "GET", "/api/v1/openapi.json", "", nil).JSON()
	require.Equal(t, "3.1.0", doc["openapi"])
	paths := doc["paths"].(map[string]any)
	for _, r := range httpapi.Routes() {
		ops, ok := paths[r.Pattern].(map[string]any)
		require.True(t, ok, "path %s missing from OpenAPI", r.Pattern)
		op, ok := ops[strings.ToLower(r.Method)].(map[string]any)
		require.True(t, ok, "%s %s missing from OpenAPI", r.Method, r.Pattern)
		require.Equal(t, r.Name, op["operationId"])
		if r.Request != nil {
			require.Contains(t, op, "requestBody", r.Name)
		}
		responses := op["responses"].(map[string]any)
		for _, code := range r.Errors {
			found := false
			for _, resp := range responses {
				codes, _ := resp.(map[string]any)["x-error-codes"].([]any)
				for _, c := range codes {
					found = found || c == code
				}
			}
			require.True(t, found, "%s does not document %s", r.Name, code)
		}
		for st := range r.Bodiless {
			require.Contains(t, responses, fmt.Sprint(st), "%s does not document its %d", r.Name, st)
		}
		// Every response names its headers (contract QA: none did):
		// X-Request-Id on each, WWW-Authenticate on a 401, Retry-After on
		// a 429.
		for st, resp := range responses {
			headers, _ := resp.(map[string]any)["headers"].(map[string]any)
			require.Contains(t, headers, "X-Request-Id", "%s %s", r.Name, st)
			codes, _ := resp.(map[string]any)["x-error-codes"].([]any)
			switch {
			case st == "401":
				require.Contains(t, headers, "WWW-Authenticate", r.Name)
			case st == "429", slices.Contains(codes, any(apierr.CodeRetryRequest)):
				require.Contains(t, headers, "Retry-After", "%s %s", r.Name, st)
			}
		}
		if r.Request == nil && r.Raw == nil && r.Method != "GET" {
			// It still refuses a body with fields (QA: undocumented).
			bad, ok := responses["400"].(map[string]any)
			require.True(t, ok, "%s does not document its 400", r.Name)
			require.Contains(t, bad["x-error-codes"], "invalid_request", r.Name)
		}
	}
	// A denied begin's 403 carries the decision's fields beside the
	// envelope (QA: a generated client dropped effect_id).
	denied := paths["/api/v1/effects/begin"].(map[string]any)["post"].(map[string]any)["responses"].(map[string]any)["403"]
	schema := denied.(map[string]any)["content"].(map[string]any)["application/json"].(map[string]any)["schema"]
	alts := schema.(map[string]any)["anyOf"].([]any)
	require.Len(t, alts, 2)
	props := alts[1].(map[string]any)["properties"].(map[string]any)
	for _, f := range []string{"decision", "effect_id", "state", "attempt", "error"} {
		require.Contains(t, props, f)
	}
	// The error's detail names the fields API.md tells clients to branch
	// on (money QA: it was a bare object).
	errSchema := doc["components"].(map[string]any)["schemas"].(map[string]any)["Error"].(map[string]any)
	detail := errSchema["properties"].(map[string]any)["error"].(map[string]any)["properties"].(map[string]any)["detail"]
	for _, f := range []string{"validation", "required", "resets_at", "dimension", "retry_after_seconds", "outcome"} {
		require.Contains(t, detail.(map[string]any)["properties"], f)
	}
	mcp := paths["/api/v1/mcp"].(map[string]any)["post"].(map[string]any)["responses"].(map[string]any)
	require.Contains(t, mcp, "202", "a notification's answer (QA)")
	require.Contains(t, mcp, "408", "a body late for the route's Timeout (TestMCPBodyLateForTheRoutesTimeIs408)")
	for p := range paths {
		require.True(t, strings.HasPrefix(p, "/api/") || !strings.HasPrefix(p, "/v1/"), "paths are written in full: %s", p)
	}
}

// A request schema requires only what a request must send; fields that may
// be left out (null, a list, raw JSON, omitempty) are optional. A response
// schema lists every field it always writes.
func TestOpenAPIRequiresOnlyWhatARequestMustSend(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(httpapi.OpenAPI())
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]struct {
			RequestBody struct {
				Required bool `json:"required"`
				Content  map[string]struct {
					Schema struct {
						Required []string `json:"required"`
					} `json:"schema"`
				} `json:"content"`
			} `json:"requestBody"`
			Responses map[string]struct {
				Content map[string]struct {
					Schema struct {
						Required []string `json:"required"`
					} `json:"schema"`
				} `json:"content"`
			} `json:"responses"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	required := func(path, method string) []string {
		r := doc.Paths[path][method].RequestBody.Content["application/json"].Schema.Required
		sort.Strings(r)
		return r
	}
	require.Equal(t, []string{"effect_type", "idempotency_key"}, required("/api/v1/effects/begin", "post"))
	require.Equal(t, []string{"lease_token", "outcome"}, required("/api/v1/effects/{id}/report", "post"))
	require.Equal(t, []string{"outcome"}, required("/api/v1/effects/{id}/resolve", "post"))
	require.Empty(t, required("/api/v1/policies/{effect_type}", "put"))
	require.Empty(t, required("/api/v1/approvals/{id}/approve", "post"))
	require.Equal(t, []string{"name"}, required("/api/v1/endpoints", "post"))
	require.Equal(t, []string{"name", "version"}, required("/api/v1/runs/{id}/steps", "post"))
	// Lists and raw JSON may be null in general, but these must be sent.
	require.Equal(t, []string{"effect_type", "from", "records", "to"}, required("/api/v1/reconcile", "post"))
	require.Equal(t, []string{"reports"}, required("/api/v1/jobs/report", "post"))
	require.Equal(t, []string{"tools"}, required("/api/v1/workers/register", "post"))
	require.Equal(t, []string{"events", "url"}, required("/api/v1/webhooks", "post"))
	require.Equal(t, []string{"handlerVersion", "inputSchema"}, required("/api/v1/tools/{name}/contracts", "post"))
	require.Equal(t, []string{"acknowledgeDuplicateRisk"}, required("/api/v1/steps/{id}/replay", "post"))
	// A bool left out reads false: replace_previous may be left out (agent
	// QA: the document required it, and a rotation sending {} or no body,
	// as its summary shows, was answered 200).
	require.Empty(t, required("/api/v1/webhooks/{id}/rotate-secret", "post"))
	require.False(t, doc.Paths["/api/v1/webhooks/{id}/rotate-secret"]["post"].RequestBody.Required)
	// An update may leave out any field, but must send one.
	require.Empty(t, required("/api/v1/webhooks/{id}", "patch"))
	require.True(t, doc.Paths["/api/v1/webhooks/{id}"]["patch"].RequestBody.Required)
	// ...and sent as null they are refused, so their schema has no null.
	var raw map[string]any
	require.NoError(t, json.Unmarshal(b, &raw))
	prop := func(path, name string) map[string]any {
		op := raw["paths"].(map[string]any)[path].(map[string]any)["post"].(map[string]any)
		schema := op["requestBody"].(map[string]any)["content"].(map[string]any)["application/json"].(map[string]any)["schema"]
		return schema.(map[string]any)["properties"].(map[string]any)[name].(map[string]any)
	}
	for path, name := range map[string]string{"/api/v1/jobs/report": "reports", "/api/v1/workers/register": "tools",
		"/api/v1/webhooks": "events", "/api/v1/reconcile": "records"} {
		require.Equal(t, "array", prop(path, name)["type"], "%s %s", path, name)
	}
	require.Equal(t, "boolean", prop("/api/v1/steps/{id}/replay", "acknowledgeDuplicateRisk")["type"])
	update := raw["paths"].(map[string]any)["/api/v1/webhooks/{id}"].(map[string]any)["patch"].(map[string]any)
	schema := update["requestBody"].(map[string]any)["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)
	require.EqualValues(t, 1, schema["minProperties"], "an empty update is refused")
	for name, typ := range map[string]string{"url": "string", "events": "array", "disabled": "boolean"} {
		require.Equal(t, typ, schema["properties"].(map[string]any)[name].(map[string]any)["type"], "%s: never null", name)
	}
	// A body with no required field may be left out; the server reads none as {}.
	require.True(t, doc.Paths["/api/v1/effects/begin"]["post"].RequestBody.Required)
	for _, p := range []string{"/api/v1/approvals/{id}/approve", "/api/v1/workers/{workerId}/claim", "/api/v1/circuits/stop"} {
		require.False(t, doc.Paths[p]["post"].RequestBody.Required, p)
	}
	// Every body is read through the same size limit, signup's too.
	require.Contains(t, doc.Paths["/api/v1/workspaces"]["post"].Responses, "413")
	require.Contains(t, doc.Paths["/api/v1/workspaces"]["post"].Responses, "503", "signup writes to the database")
	begun := doc.Paths["/api/v1/effects/{id}"]["get"].Responses["200"].Content["application/json"].Schema.Required
	require.Contains(t, begun, "result", "a response writes every field, null or not")

	// A duplicate's recorded result is any JSON value, not only null.
	var full map[string]any
	require.NoError(t, json.Unmarshal(b, &full))
	decision := full["paths"].(map[string]any)["/api/v1/effects/begin"].(map[string]any)["post"].(map[string]any)["responses"].(map[string]any)["200"].(map[string]any)["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)
	require.NotEqual(t, map[string]any{"type": []any{"null"}}, decision["properties"].(map[string]any)["result"])
	require.NotContains(t, string(b), `"type":["null"]`, "no field allows only null")
	// A deduplicated create answers 200 with the same body.
	for _, p := range []string{"/api/v1/runs/{id}/steps", "/api/v1/endpoints"} {
		responses := doc.Paths[p]["post"].Responses
		require.Contains(t, responses, "201", p)
		require.Contains(t, responses, "200", p)
		require.Equal(t, responses["201"].Content["application/json"].Schema.Required,
			responses["200"].Content["application/json"].Schema.Required, p)
	}
}

func TestManifestAndLLMsListEveryRoute(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	var m httpapi.Manifest
	env.Must(http.StatusOK, "GET", "/.well-known/ratchet.json", "", nil).Decode(t, &m)
	require.Equal(t, httpapi.Decisions, m.Decisions)
	llms := env.Must(http.StatusOK, "GET", "/llms.txt", "", nil)
	require.True(t, strings.HasPrefix(llms.Header.Get("Content-Type"), "text/plain"))
	listed := map[string]bool{}
	for _, r := range m.Routes {
		listed[r.Method+" "+r.Path] = true
		if r.Name == "groups.get" {
			// Not open to every key: one of two scopes (review: it read "scopes": []).
			require.Equal(t, []string{"effects:read", "effects:begin"}, r.AnyScopes)
		}
	}
	require.Contains(t, string(llms.Body), "GET /api/v1/groups/{id} [effects:read or effects:begin]")
	for _, r := range httpapi.Routes() {
		require.True(t, listed[r.Method+" "+r.Pattern], "manifest lacks %s %s", r.Method, r.Pattern)
		require.Contains(t, string(llms.Body), r.Method+" "+r.Pattern)
	}
}

func TestRouteTableIsWellFormed(t *testing.T) {
	t.Parallel()
	names := map[string]bool{}
	seen := map[string]bool{}
	for _, r := range httpapi.Routes() {
		require.NotEmpty(t, r.Name)
		require.False(t, names[r.Name], "duplicate route name %s", r.Name)
		names[r.Name] = true
		require.False(t, seen[r.Method+" "+r.Pattern], "duplicate route %s %s", r.Method, r.Pattern)
		seen[r.Method+" "+r.Pattern] = true
		require.NotEmpty(t, r.Summary, r.Name)
		require.NotZero(t, r.Status, r.Name)
		require.True(t, r.Handle != nil || r.Raw != nil, r.Name)
	}
}

// The claim's longest wait (20 s) and its last look fit in the route's
// time: the default 15 s cut long polls short, sometimes during that look.
func TestClaimRouteOutlastsTheLongestWait(t *testing.T) {
	t.Parallel()
	for _, r := range httpapi.Routes() {
		if r.Name == "workers.claim" {
			require.GreaterOrEqual(t, r.Timeout, 25*time.Second)
			return
		}
	}
	t.Fatal("no workers.claim route")
}

// Every route answers before its function is stopped: a route's time
// leaves FunctionTimeout a margin to write the answer (QA: the MCP
// endpoint's 30 s was the functions' own, so a slow batch was cut by the
// platform, Vercel's 504 or the Function URL's 502 and a restarted
// instance, instead of answered 503 in the envelope), and FunctionTimeout
// is vercel.json's maxDuration and the API function's Timeout in
// template.yaml.
func TestEveryRouteAnswersWithinTheFunctionsTime(t *testing.T) {
	t.Parallel()
	for _, r := range httpapi.Routes() {
		timeout := r.Timeout
		if timeout == 0 {
			timeout = httpapi.DefaultTimeout
		}
		require.LessOrEqual(t, timeout, httpapi.FunctionTimeout-httpapi.AnswerMargin, "%s %s", r.Method, r.Pattern)
	}
	root := filepath.Join("..", "..")
	var vj struct {
		Functions map[string]struct {
			MaxDuration int `json:"maxDuration"`
		} `json:"functions"`
	}
	b, err := os.ReadFile(filepath.Join(root, "vercel.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &vj))
	require.NotEmpty(t, vj.Functions)
	for glob, f := range vj.Functions {
		require.Equal(t, int(httpapi.FunctionTimeout/time.Second), f.MaxDuration, glob)
	}
	tmpl, err := os.ReadFile(filepath.Join(root, "template.yaml"))
	require.NoError(t, err)
	_, api, ok := strings.Cut(string(tmpl), "\n  ApiFunction:\n")
	require.True(t, ok, "template.yaml has no ApiFunction")
	api, _, _ = strings.Cut(api, "\n\n")
	require.Contains(t, api, fmt.Sprintf("\n      Timeout: %d\n", int(httpapi.FunctionTimeout/time.Second)))
}

// TestVercelFilesMatchRouteTable fails when a route exists in the router but
// not in api/ or vercel.json, or the reverse. Fix: go run ./scripts/genvercel.
func TestVercelFilesMatchRouteTable(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	want := map[string]string{}
	for _, f := range httpapi.VercelFunctions() {
		want[f.File] = httpapi.VercelFileSource(f)
	}
	var have []string
	err := filepath.WalkDir(filepath.Join(root, "api"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		have = append(have, filepath.ToSlash(rel))
		return nil
	})
	require.NoError(t, err)
	sort.Strings(have)
	wantFiles := make([]string, 0, len(want))
	for f := range want {
		wantFiles = append(wantFiles, f)
	}
	sort.Strings(wantFiles)
	require.Equal(t, wantFiles, have, "api/ is out of step with the route table: run go run ./scripts/genvercel")
	for f, src := range want {
		got, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		require.Equal(t, src, string(got), "%s is stale: run go run ./scripts/genvercel", f)
	}
	vj, err := os.ReadFile(filepath.Join(root, "vercel.json"))
	require.NoError(t, err)
	require.Equal(t, string(httpapi.VercelJSON()), string(vj), "vercel.json is stale: run go run ./scripts/genvercel")
	for name, body := range httpapi.VercelStaticFiles() {
		got, err := os.ReadFile(filepath.Join(root, name))
		require.NoError(t, err)
		require.Equal(t, string(body), string(got), "%s is stale: run go run ./scripts/genvercel", name)
	}
	// Vercel rewrites nothing under /.well-known: the manifest is a file,
	// and no function is deployed that nothing reaches (deployment review).
	require.NotContains(t, string(vj), `"/.well-known/`)
	for _, f := range wantFiles {
		require.NotContains(t, f, "well_known")
	}
	// The README's count of functions, which a plan's limit is read against,
	// and every other count of them there and in the guides (README QA: the
	// Vercel guide still said 59 after the bundle grew to 62).
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	require.Contains(t, string(readme), fmt.Sprintf("the bundle is %d functions", len(wantFiles)))
	guides, err := filepath.Glob(filepath.Join(root, "docs", "guides", "*.md"))
	require.NoError(t, err)
	count := regexp.MustCompile(`\b(\d+) functions\b`)
	for _, doc := range append([]string{filepath.Join(root, "README.md")}, guides...) {
		text, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, m := range count.FindAllStringSubmatch(string(text), -1) {
			require.Equal(t, fmt.Sprint(len(wantFiles)), m[1], "%s counts %s", doc, m[0])
		}
	}
	var served httpapi.Manifest
	require.NoError(t, json.Unmarshal(httpapi.VercelStaticFiles()["public/.well-known/ratchet.json"], &served))
	require.Equal(t, httpapi.NewManifest().Routes, served.Routes)
}

// On Vercel a path no route serves reaches the catch-all entry (the last
// rewrite) and is answered 404 in the envelope, as locally: outside /api
// and /v1 too (deployment review: Vercel's own 404 page answered /nope).
func TestVercelCatchAllAnswersTheEnvelope(t *testing.T) {
	t.Parallel()
	var doc struct {
		Rewrites []struct{ Source, Destination string } `json:"rewrites"`
	}
	require.NoError(t, json.Unmarshal(httpapi.VercelJSON(), &doc))
	n := len(doc.Rewrites)
	require.Equal(t, "/:path*", doc.Rewrites[n-1].Source, "the last rewrite takes every path")
	require.Equal(t, "/api/not_found", doc.Rewrites[n-1].Destination)
	for _, rw := range doc.Rewrites[:n-1] {
		require.NotEqual(t, "/api/not_found", rw.Destination, "only the last rewrite is the catch-all")
	}
	env := apitest.Start(t)
	for _, path := range []string{"/api/v1/nope", "/nope", "/"} {
		rec := onVercel(t, env, "GET", path, "", "")
		require.Equal(t, http.StatusNotFound, rec.Code, path)
		require.Contains(t, rec.Body.String(), `"code":"not_found"`, path)
		require.NotEmpty(t, rec.Header().Get("X-Request-Id"), path)
	}
}

// A Vercel deployment publishes no source and uploads no local secrets:
// without a public/ directory Vercel serves the repository root as static
// files, and its CLI does not read .gitignore (deployment review).
func TestVercelDeploymentPublishesNoSource(t *testing.T) {
	t.Parallel()
	files, err := os.ReadDir("../../public")
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		names = append(names, f.Name())
	}
	require.Equal(t, []string{".well-known", "console", "robots.txt"}, names) // .well-known, console: VercelStaticFiles
	for _, dir := range []string{".well-known", "console"} {
		files, err := os.ReadDir(filepath.Join("../../public", dir))
		require.NoError(t, err)
		for _, f := range files {
			_, generated := httpapi.VercelStaticFiles()[path.Join("public", dir, f.Name())]
			require.True(t, generated, "public/%s/%s is not a file genvercel writes", dir, f.Name())
		}
	}
	ignore, err := os.ReadFile("../../.vercelignore")
	require.NoError(t, err)
	lines := strings.Split(string(ignore), "\n")
	for _, must := range []string{"/.data", "/bin"} { // anchored at the root, as in .gitignore
		require.Contains(t, lines, must)
	}
}

// onVercel serves target as the generated entry of pattern does on Vercel,
// with key as the bearer (none when empty).
func onVercel(t *testing.T, env *apitest.Env, method, target, key, pattern string) *httptest.ResponseRecorder {
	t.Helper()
	req, err := http.NewRequest(method, target, nil)
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	rec := newRecorder()
	env.App.Server.ServeRoute(rec, req, pattern)
	return rec
}

// contractNames are the tools a contract list answer names.
func contractNames(t *testing.T, rec *httptest.ResponseRecorder) []string {
	t.Helper()
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var list struct {
		Data []struct{ Name string } `json:"data"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &list))
	var names []string
	for _, c := range list.Data {
		names = append(names, c.Name)
	}
	return names
}

// Vercel serves a function's file before any rewrite: a tool literally
// named like the file's segment reaches the file without ?name=, and is
// still that tool (deployment review: it read as an empty name).
func TestVercelEntryServesALiteralSegment(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	env.Must(http.StatusCreated, "POST", "/api/v1/tools/name/contracts", ws.Key, map[string]any{
		"handlerVersion": "1", "inputSchema": map[string]any{"type": "object"}, "outputSchema": true})
	rec := onVercel(t, env, "GET", "/api/v1/tools/name/contracts", ws.Key, "/api/v1/tools/{name}/contracts")
	require.Equal(t, []string{"name"}, contractNames(t, rec))
}

// A path segment vercel.json copies into the query is read as the path
// segment it was: a tool named c++ is that tool whether its pluses came
// percent-encoded or not (deployment review: ?name=c++ read as "c  ", 400).
func TestVercelEntryReadsARewrittenSegmentAsAPath(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	env.Must(http.StatusCreated, "POST", "/api/v1/tools/"+url.PathEscape("c++")+"/contracts", ws.Key, map[string]any{
		"handlerVersion": "1", "inputSchema": map[string]any{"type": "object"}, "outputSchema": true})
	const pattern = "/api/v1/tools/{name}/contracts"
	for _, q := range []string{"name=c++", "name=c%2B%2B"} {
		rec := onVercel(t, env, "GET", "/api/v1/tools/name/contracts?"+q, ws.Key, pattern)
		require.Equal(t, []string{"c++"}, contractNames(t, rec), q)
	}
	// Another value of the path's parameter in the client's own query is
	// refused, as the same path served locally refuses it.
	rec := onVercel(t, env, "GET", "/api/v1/tools/name/contracts?name=c++&name=other", ws.Key, pattern)
	require.Equal(t, http.StatusBadRequest, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), "the path's own parameter")
}

// TestVercelEntryServesItsRoute drives a generated entry point the way
// Vercel does after a rewrite: the pattern's file with ?id= in the query.
func TestVercelEntryServesRewrittenPath(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	a, b := env.Signup(), env.Signup()
	id := env.Must(http.StatusCreated, "POST", "/api/v1/keys", a.Key, map[string]any{"name": "x", "preset": "AGENT"}).JSON()["id"].(string)
	for _, tc := range []struct {
		key    string
		status int
	}{{b.Key, http.StatusNotFound}, {a.Key, http.StatusOK}} {
		rec := onVercel(t, env, "DELETE", "/api/v1/keys/id?id="+id, tc.key, "/api/v1/keys/{id}")
		require.Equal(t, tc.status, rec.Code, rec.Body.String())
	}

	// A path id the rewrite put in the query undecodable names nothing, as
	// the same path served locally says (review: it was a 400 at id).
	for _, q := range []string{"id=key_a;b", "id=%zz"} {
		rec := onVercel(t, env, "DELETE", "/api/v1/keys/id?"+q, a.Key, "/api/v1/keys/{id}")
		require.Equal(t, http.StatusNotFound, rec.Code, "%s: %s", q, rec.Body.String())
	}

	// A parameter with an underscore in its name, as rewritten by vercel.json.
	req, _ := http.NewRequest("POST", "/api/v1/circuits/effect_type/open?effect_type=email.send",
		strings.NewReader(`{"action": "deny", "reason": "vendor outage"}`))
	req.Header.Set("Authorization", "Bearer "+a.Key)
	rec := newRecorder()
	env.App.Server.ServeRoute(rec, req, "/api/v1/circuits/{effect_type}/open")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var c map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &c))
	require.Equal(t, "email.send", c["effect_type"])
	require.Equal(t, "open", c["state"])
}

// Each MCP tool's description names the scope its REST call needs, and
// that is the route's own (a route changed without its tool fails here).
func TestMCPToolsNameTheScopesOfTheirRoutes(t *testing.T) {
	t.Parallel()
	routeOf := map[string]string{
		"ratchet_begin": "effects.begin", "ratchet_report": "effects.report", "ratchet_heartbeat": "effects.heartbeat",
		"ratchet_resolve": "effects.resolve", "ratchet_get_effect": "effects.get", "ratchet_list_effects": "effects.list",
		"ratchet_get_policy": "policies.get", "ratchet_list_approvals": "approvals.list",
		"ratchet_decide_approval": "approvals.approve",
	}
	scopes := map[string][]string{}
	for _, r := range httpapi.Routes() {
		scopes[r.Name] = r.Scopes
	}
	tools := mcpserver.ToolScopes()
	require.Len(t, tools, len(routeOf))
	for tool, needs := range tools {
		require.Equal(t, []string{needs}, scopes[routeOf[tool]], tool)
	}
}

// The document carries the bounds and enumerations the handlers check, so a
// client generated from it knows them (QA); lib/apitest holds every answer
// to the same schemas.
func TestOpenAPIStatesBoundsAndEnumerations(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(httpapi.OpenAPI())
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	prop := func(path, method, name string) map[string]any {
		t.Helper()
		op := doc["paths"].(map[string]any)[path].(map[string]any)[method].(map[string]any)
		schema := op["requestBody"].(map[string]any)["content"].(map[string]any)["application/json"].(map[string]any)["schema"]
		return schema.(map[string]any)["properties"].(map[string]any)[name].(map[string]any)
	}
	key := prop("/api/v1/effects/begin", "post", "idempotency_key")
	require.EqualValues(t, 1, key["minLength"])
	require.EqualValues(t, 255, key["maxLength"])
	requestID := prop("/api/v1/effects/begin", "post", "request_id")
	require.EqualValues(t, 16, requestID["minLength"], "docs QA: the schema had no bounds")
	require.EqualValues(t, 255, requestID["maxLength"])
	// ...and their characters, which the handler checks (agent QA: a key
	// holding a newline or a no-break space was valid by the document and
	// refused 400).
	require.Equal(t, idemkey.Pattern, key["pattern"])
	require.Equal(t, idemkey.Pattern, requestID["pattern"])
	require.Equal(t, idemkey.Pattern, prop("/api/v1/groups", "post", "idempotency_key")["pattern"])
	require.Equal(t, idemkey.Pattern, prop("/api/v1/runs", "post", "idempotencyKey")["pattern"])
	require.Equal(t, idemkey.Pattern, prop("/api/v1/runs/{id}/steps", "post", "idempotencyKey")["pattern"])
	require.Equal(t, idemkey.Pattern, prop("/api/v1/reconcile", "post", "records")["items"].(map[string]any)["properties"].(map[string]any)["idempotency_key"].(map[string]any)["pattern"])
	require.Equal(t, idemkey.Pattern, prop("/api/v1/endpoints", "post", "name")["pattern"])
	for _, p := range doc["paths"].(map[string]any)["/api/v1/keys"].(map[string]any)["post"].(map[string]any)["parameters"].([]any) {
		if p := p.(map[string]any); p["name"] == "Idempotency-Key" {
			require.Equal(t, idemkey.Pattern, p["schema"].(map[string]any)["pattern"])
		}
	}
	require.EqualValues(t, 1e18, prop("/api/v1/effects/begin", "post", "cost_micros")["maximum"])
	require.Equal(t, []any{"succeeded", "failed"}, prop("/api/v1/effects/{id}/report", "post", "outcome")["enum"])
	require.Equal(t, []any{"SUCCEEDED", "FAILED"}, prop("/api/v1/jobs/{id}/report", "post", "status")["enum"])
	limit := prop("/api/v1/workers/{workerId}/claim", "post", "limit")
	require.EqualValues(t, 1, limit["minimum"])
	require.EqualValues(t, 100, limit["maximum"])
	lease := prop("/api/v1/policies/{effect_type}", "put", "lease_seconds")
	require.EqualValues(t, 5, lease["minimum"])
	require.EqualValues(t, 3600, lease["maximum"])
	require.Equal(t, []any{"succeeded", "failed"}, prop("/api/v1/effects/{id}/resolve", "post", "outcome")["enum"])
	// A request's map field takes null as "not sent", as the decoder does
	// (jsonstrict.takesNull), and a string field does not.
	dims := prop("/api/v1/effects/begin", "post", "dimensions")
	require.Equal(t, []any{"object", "null"}, dims["type"])
	// Its bounds (docs QA: "an object of strings" only; lib/gate holds them
	// to begin's checks).
	require.EqualValues(t, 16, dims["maxProperties"])
	require.Equal(t, map[string]any{"pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$", "maxLength": 64.0}, dims["propertyNames"])
	require.Equal(t, map[string]any{"type": "string", "minLength": 1.0, "maxLength": 255.0}, dims["additionalProperties"])
	listed := prop("/api/v1/policies/{effect_type}", "put", "required_dimensions")
	require.EqualValues(t, 8, listed["maxItems"])
	require.Equal(t, true, listed["uniqueItems"])
	require.Equal(t, map[string]any{"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$", "maxLength": 64.0}, listed["items"])
	limits := prop("/api/v1/policies/{effect_type}", "put", "dimension_limits")
	require.EqualValues(t, 8, limits["maxProperties"])
	require.Equal(t, dims["propertyNames"], limits["propertyNames"])
	require.Equal(t, "string", prop("/api/v1/approvals/{id}/approve", "post", "note")["type"])
	require.EqualValues(t, 2000, prop("/api/v1/effects/{id}/resolve", "post", "note")["maxLength"])
	require.Contains(t, prop("/api/v1/circuits/stop", "post", "action")["enum"], "deny")
	for _, p := range doc["paths"].(map[string]any)["/api/v1/effects"].(map[string]any)["get"].(map[string]any)["parameters"].([]any) {
		if p := p.(map[string]any); p["name"] == "limit" {
			require.Equal(t, map[string]any{"type": "integer", "minimum": 1.0, "maximum": 200.0, "default": 50.0}, p["schema"])
		}
	}
	// An effect type in a path or a filter is held to begin's rule, and the
	// document says so (agent QA: {effect_type} and ?effect_type= read as any
	// string, and "a b" or 101 characters were refused 400).
	effectType := prop("/api/v1/effects/begin", "post", "effect_type")
	seen := 0
	for path, ops := range doc["paths"].(map[string]any) {
		for method, op := range ops.(map[string]any) {
			params, _ := op.(map[string]any)["parameters"].([]any)
			for _, p := range params {
				if p := p.(map[string]any); p["name"] == "effect_type" {
					seen++
					schema := p["schema"].(map[string]any)
					require.Equal(t, effectType["pattern"], schema["pattern"], "%s %s", method, path)
					require.Equal(t, effectType["maxLength"], schema["maxLength"], "%s %s", method, path)
				}
			}
		}
	}
	require.Equal(t, 6, seen, "the policy, structuring and circuit paths and the effects list's filter")
	// A webhook's events, a reconciliation's records and an endpoint's
	// name state the bounds their handlers check (verification QA:
	// enforced, not stated; lib/webhooks, lib/gate and this package's
	// request-tag tests hold them to the handlers).
	subscribed := prop("/api/v1/webhooks", "post", "events")
	require.EqualValues(t, 1, subscribed["minItems"])
	require.EqualValues(t, 50, subscribed["maxItems"])
	var types []any
	for _, typ := range events.Types {
		types = append(types, typ)
	}
	require.Equal(t, map[string]any{"type": "string", "enum": types}, subscribed["items"])
	require.NotContains(t, subscribed, "uniqueItems", "repeats are taken, and stored once")
	records := prop("/api/v1/reconcile", "post", "records")
	require.EqualValues(t, 10000, records["maxItems"])
	require.NotContains(t, records, "minItems", "an empty list is taken")
	endpointName := prop("/api/v1/endpoints", "post", "name")
	require.EqualValues(t, 1, endpointName["minLength"])
	require.EqualValues(t, 200, endpointName["maxLength"])
	// A failure's message may be left out, as the handler lets it.
	errSchema := prop("/api/v1/jobs/{id}/report", "post", "error")
	required, _ := errSchema["required"].([]any)
	require.NotContains(t, required, "message")
	require.Contains(t, errSchema["properties"], "message")
}

// An answer's fields that take one of a named set of values (API.md: a
// circuit's state, opened_by and action, an approval's state, a group's
// states, an attempt's outcome, a denial's code, ...) state that set in the
// document, as a decision and an effect's state do (contract QA: only
// those two and the emergency stop's read did, so a client generated from
// the document read a circuit's state or an approval's as any string). A
// nullable one lists null too. lib/apitest holds every answer to them.
func TestOpenAPIAnswersStateTheirValues(t *testing.T) {
	t.Parallel()
	doc, at := apitest.OpenAPIDoc(t), apitest.At
	answer := func(path, method, status string) any {
		return at(doc, "paths", path, method, "responses", status, "content", "application/json", "schema")
	}
	field := func(schema any, path ...string) []any {
		t.Helper()
		var walk []string
		for _, p := range path {
			if p == "[]" {
				walk = append(walk, "items")
			} else {
				walk = append(walk, "properties", p)
			}
		}
		f, _ := at(schema, walk...).(map[string]any)
		require.NotNil(t, f, "%v", path)
		if items, ok := f["items"].(map[string]any); ok && f["enum"] == nil {
			f = items // a list's values
		}
		values, _ := f["enum"].([]any)
		return values
	}
	list := func(vs ...any) []any { return vs }
	effectStates := list("leased", "succeeded", "failed", "indeterminate", "awaiting_approval", "denied")
	actions := list("monitor", "require_approval", "deny")
	reasons := list("policy_requires_approval", "circuit_open", "cost_at_or_above_threshold")
	groupStates := list("open", "committed", "unwinding", "unwound", "unwind_failed")
	var eventTypes []any
	for _, typ := range events.Types {
		eventTypes = append(eventTypes, typ)
	}
	var scopes []any
	for _, s := range at(doc, "paths", "/api/v1/keys", "post", "requestBody", "content", "application/json", "schema",
		"properties", "scopes", "items", "enum").([]any) {
		scopes = append(scopes, s)
	}
	require.NotEmpty(t, scopes)

	circuit := answer("/api/v1/circuits/{effect_type}/open", "post", "200")
	require.Equal(t, list("closed", "open"), field(circuit, "state"))
	require.Equal(t, list("surge", "manual", "stop", nil), field(circuit, "opened_by"))
	require.Equal(t, append(actions, nil), field(circuit, "action"))
	require.Equal(t, list("closed", "open"), field(answer("/api/v1/circuits", "get", "200"), "data", "[]", "state"))

	approval := answer("/api/v1/approvals/{id}", "get", "200")
	require.Equal(t, list("pending", "approved", "rejected"), field(approval, "state"))
	require.Equal(t, reasons, field(approval, "reason"))
	require.Equal(t, reasons, field(approval, "answers"))

	effect := answer("/api/v1/effects/{id}", "get", "200")
	require.Equal(t, list("succeeded", "failed", "indeterminate", nil), field(effect, "attempts", "[]", "outcome"))
	require.Equal(t, list("policy_denied", "budget_exceeded", "cost_ceiling_exceeded", "run_budget_exceeded",
		"key_budget_exceeded", "dimension_limit_exceeded", "max_attempts_exceeded", "approval_rejected",
		"circuit_open", nil), field(effect, "denial_code"))

	group := answer("/api/v1/groups/{id}", "get", "200")
	require.Equal(t, groupStates, field(group, "state"))
	require.Equal(t, effectStates, field(group, "steps", "[]", "state"))
	unwind := answer("/api/v1/groups/{id}/unwind", "post", "200")
	require.Equal(t, groupStates, field(unwind, "state"))
	require.Equal(t, append(effectStates, nil), field(unwind, "plan", "[]", "compensation_state"))

	reconciled := answer("/api/v1/reconcile", "post", "200")
	require.Equal(t, append(effectStates, nil), field(reconciled, "resolved", "[]", "ratchet_state"))
	require.Equal(t, list("succeeded", "refunded", "failed", "pending", nil), field(reconciled, "resolved", "[]", "vendor_status"))
	// Left out when there is none (omitempty), so never null.
	require.Equal(t, list("succeeded", "failed"), field(reconciled, "resolved", "[]", "outcome"))

	require.Equal(t, list("structuring_threshold_micros", "max_cost_micros", nil),
		field(answer("/api/v1/policies/{effect_type}/structuring", "get", "200"), "threshold_from"))

	require.Equal(t, eventTypes, field(answer("/api/v1/webhooks/{id}", "get", "200"), "events"))
	deliveries := answer("/api/v1/webhooks/{id}/deliveries", "get", "200")
	require.Equal(t, list("pending", "delivered", "failed"), field(deliveries, "data", "[]", "state"))
	require.Equal(t, eventTypes, field(deliveries, "data", "[]", "event_type"))

	require.Equal(t, scopes, field(answer("/api/v1/keys/current", "get", "200"), "scopes"))
	require.Equal(t, scopes, field(answer("/api/v1/workspaces", "post", "201"), "key", "scopes"))

	// A contract's retry preset, as its request's is (SDK QA: the answer's
	// was any string, where the SDKs type it).
	presets := list("STANDARD", "AGGRESSIVE", "RELAXED", "CUSTOM")
	require.Equal(t, presets, field(answer("/api/v1/tools/{name}/contracts", "post", "201"), "retryPreset"))
	require.Equal(t, presets, field(answer("/api/v1/tools/{name}/contracts", "get", "200"), "data", "[]", "retryPreset"))
	require.Equal(t, list("ACTIVE", "FORBIDDEN"), field(answer("/api/v1/tools/{name}/contracts", "post", "201"), "status"))
	// An endpoint's preset, a schedule's (a CUSTOM one's, or a job's
	// snapshot of a built-in's), an endpoint's circuit, a step's
	// dependency and an attempt's outcome (SDK QA: any string, where the
	// request's, the database's and the SDKs' are these).
	require.Equal(t, presets, field(answer("/api/v1/tools/{name}/contracts", "post", "201"), "retryPolicy", "preset"))
	for _, endpoint := range []any{answer("/api/v1/endpoints/{id}/policy", "get", "200"),
		answer("/api/v1/endpoints/{id}/policy", "put", "200"), answer("/api/v1/endpoints", "post", "201"),
		at(answer("/api/v1/endpoints", "get", "200"), "properties", "data", "items")} {
		require.Equal(t, presets, field(endpoint, "policyPreset"))
		require.Equal(t, presets, field(endpoint, "retryPolicy", "preset"))
		require.Equal(t, list("closed", "open"), field(endpoint, "circuit", "state"))
	}
	step := answer("/api/v1/steps/{id}", "get", "200")
	require.Equal(t, presets, field(step, "durableJob", "policy", "preset"))
	require.Equal(t, list("SUCCEEDED", "FAILED", nil), field(step, "afterStatus"))
	require.Equal(t, list("SUCCEEDED", "FAILED", nil), field(step, "durableJob", "attempts", "[]", "outcome"))
	require.Equal(t, list("SUCCEEDED", "FAILED", nil), field(answer("/api/v1/runs/{id}/steps", "get", "200"), "data", "[]", "afterStatus"))
	require.Equal(t, list("SUCCEEDED", "FAILED", nil), field(answer("/api/v1/steps/{id}/attempts", "get", "200"), "data", "[]", "outcome"))
	require.Equal(t, list("SUCCEEDED", "FAILED", nil), field(answer("/api/v1/endpoints/{id}/attempts", "get", "200"), "data", "[]", "outcome"))
}

// Every field an error's detail may carry is documented in the Error
// schema, so a client reading the document knows it (contract QA: a group's
// commit after its unwind answered detail.committed_at, and a webhook's
// rotation detail.previous_secret_expires_at, which README names and the
// document did not). The fields are found where they are set: each
// WithDetail("…") and Detail["…"] = of the source.
func TestEveryErrorDetailIsDocumented(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(httpapi.OpenAPI())
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	documented := doc["components"].(map[string]any)["schemas"].(map[string]any)["Error"].(map[string]any)["properties"].(map[string]any)["error"].(map[string]any)["properties"].(map[string]any)["detail"].(map[string]any)["properties"].(map[string]any)

	set := regexp.MustCompile(`WithDetail\("([A-Za-z_]+)"|Detail\["([A-Za-z_]+)"\] =`)
	found := map[string]string{}
	require.NoError(t, filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range set.FindAllStringSubmatch(string(src), -1) {
			found[m[1]+m[2]] = p
		}
		return nil
	}))
	require.Greater(t, len(found), 20, "the scan finds the detail fields")
	missing := map[string]string{}
	for field, where := range found {
		if _, ok := documented[field]; !ok {
			missing[field] = where
		}
	}
	require.Empty(t, missing, "detail fields set (where) but not documented")
}

// A group's step bound (gate.MaxGroupSteps) is what the documents say: the
// manifest's limits.group_steps_max, the unwind answer's lists' maxItems in
// the OpenAPI document, the refusal's detail, and the README's figure.
func TestGroupStepsMaxIsPublished(t *testing.T) {
	t.Parallel()
	require.Equal(t, int64(10_000), httpapi.Limits["group_steps_max"])
	require.EqualValues(t, gate.MaxGroupSteps, httpapi.NewManifest().Limits["group_steps_max"])
	doc := apitest.OpenAPIDoc(t)
	unwind := apitest.At(doc, "paths", "/api/v1/groups/{id}/unwind", "post", "responses", "200", "content",
		"application/json", "schema", "properties").(map[string]any)
	for _, list := range []string{"unresolved", "irreversible", "reversed"} {
		require.EqualValues(t, gate.MaxGroupSteps, unwind[list].(map[string]any)["maxItems"], list)
	}
	detail := apitest.At(doc, "components", "schemas", "Error", "properties", "error", "properties", "detail",
		"properties").(map[string]any)
	require.EqualValues(t, gate.MaxGroupSteps, detail["steps"].(map[string]any)["maxItems"])
	require.Contains(t, detail, "group_steps_max")
	create := apitest.At(doc, "paths", "/api/v1/groups", "post", "summary")
	require.Contains(t, create, "at most 10000 forward steps")
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	require.Contains(t, string(readme), "**A group takes at most 10 000 forward steps** (`limits.group_steps_max`")
}

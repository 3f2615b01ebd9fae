package apitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/getratchet/ratchet/lib/httpapi"
)

// The OpenAPI document is generated from the route table, and the answers
// from the handlers: nothing but a check of one against the other keeps
// them in step. Every answer a test reads through Env.Do is checked against
// the document: its status must be one the route documents, a JSON body
// must match that status's schema, and an error's code must be one the
// route lists for that status (x-error-codes: the route's own codes and
// those any route of its kind may answer, which the document folds into
// every list). So every API test is a conformance test of the document too.

// openapiURL names the document as a schema resource; its response schemas
// are compiled by JSON pointer and resolve their $refs within it.
const openapiURL = "file:///openapi.json"

type openapiChecker struct {
	mux      *http.ServeMux // finds a request's route pattern
	compiler *jsonschema.Compiler
	doc      map[string]any

	mu      sync.Mutex
	schemas map[string]*jsonschema.Schema // by pointer
}

var (
	checkerOnce sync.Once
	checker     *openapiChecker
	checkerErr  error
)

func loadChecker() (*openapiChecker, error) {
	checkerOnce.Do(func() {
		raw, err := json.Marshal(httpapi.OpenAPI())
		if err != nil {
			checkerErr = err
			return
		}
		res, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			checkerErr = err
			return
		}
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		// API.md §0: every timestamp is an RFC 3339 UTC string. The
		// document marks each one date-time (its only format), and the
		// check holds every answered one to that, in UTC.
		c.RegisterFormat(&jsonschema.Format{Name: "date-time", Validate: utcTimestamp})
		c.AssertFormat()
		if err := c.AddResource(openapiURL, res); err != nil {
			checkerErr = err
			return
		}
		var doc map[string]any
		if err := json.Unmarshal(raw, &doc); err != nil {
			checkerErr = err
			return
		}
		mux := http.NewServeMux()
		for _, r := range httpapi.Routes() {
			mux.Handle(r.Method+" "+r.Pattern, http.NotFoundHandler())
		}
		checker = &openapiChecker{mux: mux, compiler: c, doc: doc, schemas: map[string]*jsonschema.Schema{}}
	})
	return checker, checkerErr
}

// utcTimestamp accepts an RFC 3339 time in UTC ("Z"), what API.md §0 asks
// of every timestamp; a value that is not a string is left to the schema's
// type.
func utcTimestamp(v any) error {
	s, ok := v.(string)
	if !ok {
		return nil
	}
	if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
		return fmt.Errorf("%q is not an RFC 3339 time", s)
	}
	if !strings.HasSuffix(s, "Z") {
		return fmt.Errorf("%q is not in UTC (Z)", s)
	}
	return nil
}

// pointerPart escapes a JSON pointer token (RFC 6901).
func pointerPart(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// check says what of the answer disagrees with the document ("" when
// nothing does). A request on the legacy /v1 alias is checked as the route
// it is served by (Server.ServeHTTP). A request to no route (an unknown
// path or method, a console page) is not checked: the router's own tests
// cover those.
func (c *openapiChecker) check(req *http.Request, status int, header http.Header, body []byte) string {
	if strings.HasPrefix(req.URL.Path, "/v1/") {
		alias := req.Clone(req.Context())
		alias.URL.Path = "/api" + req.URL.Path
		if req.URL.RawPath != "" {
			alias.URL.RawPath = "/api" + req.URL.RawPath
		}
		req = alias
	}
	_, pattern := c.mux.Handler(req)
	method, path, ok := strings.Cut(pattern, " ")
	if !ok || req.Method == http.MethodHead {
		return ""
	}
	op, _ := c.doc["paths"].(map[string]any)[path].(map[string]any)[strings.ToLower(method)].(map[string]any)
	responses, _ := op["responses"].(map[string]any)
	resp, ok := responses[strconv.Itoa(status)].(map[string]any)
	if !ok {
		return fmt.Sprintf("%s %s answered %d, which the OpenAPI document does not list (%s)", method, path,
			status, strings.TrimSpace(string(body)))
	}
	if msg := c.checkErrorCode(method, path, status, resp, header, body); msg != "" {
		return msg
	}
	content, _ := resp["content"].(map[string]any)
	if _, isJSON := content["application/json"]; !isJSON || !strings.HasPrefix(header.Get("Content-Type"), "application/json") {
		return ""
	}
	ptr := "#/paths/" + pointerPart(path) + "/" + strings.ToLower(method) + "/responses/" + strconv.Itoa(status) +
		"/content/application~1json/schema"
	sch, err := c.schema(ptr)
	if err != nil {
		return fmt.Sprintf("%s %s %d: compile %s: %v", method, path, status, ptr, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Sprintf("%s %s %d: the body is not JSON: %v", method, path, status, err)
	}
	if err := sch.Validate(v); err != nil {
		return fmt.Sprintf("%s %s %d: the body does not match the OpenAPI document: %v\nbody: %s", method, path,
			status, err, body)
	}
	return ""
}

// checkErrorCode says so when an error answer's code (a string
// error.code: a protocol body of a route's own, as MCP's JSON-RPC error
// with its numeric code, is left to the schema) is not one resp, the
// route's response at status, lists in x-error-codes.
func (c *openapiChecker) checkErrorCode(method, path string, status int, resp map[string]any, header http.Header, body []byte) string {
	if status < 400 || !strings.HasPrefix(header.Get("Content-Type"), "application/json") {
		return ""
	}
	var answer struct {
		Error struct {
			Code any `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &answer) != nil {
		return "" // not JSON: the schema's check says so
	}
	code, ok := answer.Error.Code.(string)
	if !ok {
		return ""
	}
	listed, _ := resp["x-error-codes"].([]any)
	if slices.Contains(listed, any(code)) {
		return ""
	}
	return fmt.Sprintf("%s %s answered %d %s, which the OpenAPI document does not list for it (x-error-codes %v): %s",
		method, path, status, code, listed, strings.TrimSpace(string(body)))
}

func (c *openapiChecker) schema(ptr string) (*jsonschema.Schema, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.schemas[ptr]; ok {
		return s, nil
	}
	s, err := c.compiler.Compile(openapiURL + ptr)
	if err != nil {
		return nil, err
	}
	c.schemas[ptr] = s
	return s, nil
}

// CheckRequestBody fails t unless body is what the OpenAPI document says
// the route of pattern (as the document spells its path) and method takes.
// Requests are not checked as answers are (Env.DoWith): a test sends bad
// ones on purpose.
func CheckRequestBody(t testing.TB, method, pattern string, body []byte) {
	t.Helper()
	if err := requestBodyProblem(t, method, pattern, body); err != nil {
		t.Errorf("%s %s: the request body does not match the OpenAPI document: %v", method, pattern, err)
	}
}

// RequestBodyFits reports whether body is what the OpenAPI document says
// the route of pattern and method takes, for a test that holds a refusal
// of the handler's to the document's own.
func RequestBodyFits(t testing.TB, method, pattern string, body []byte) bool {
	t.Helper()
	return requestBodyProblem(t, method, pattern, body) == nil
}

// requestBodyProblem is why body does not match the route's request
// schema, nil when it does.
func requestBodyProblem(t testing.TB, method, pattern string, body []byte) error {
	t.Helper()
	c, err := loadChecker()
	if err != nil {
		t.Fatalf("the OpenAPI document: %v", err)
	}
	ptr := "#/paths/" + pointerPart(pattern) + "/" + strings.ToLower(method) + "/requestBody/content/application~1json/schema"
	sch, err := c.schema(ptr)
	if err != nil {
		t.Fatalf("compile %s: %v", ptr, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the body is not JSON: %v", err)
	}
	return sch.Validate(v)
}

// OpenAPIDoc is the OpenAPI document as encoding/json reads it back, for a
// test that walks it (At).
func OpenAPIDoc(t testing.TB) map[string]any {
	t.Helper()
	b, err := json.Marshal(httpapi.OpenAPI())
	if err != nil {
		t.Fatalf("encode the OpenAPI document: %v", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("read the OpenAPI document: %v", err)
	}
	return doc
}

// At is the value under path in v, a document OpenAPIDoc read: nil where a
// key is missing or a value on the way is not an object.
func At(v any, path ...string) any {
	for _, p := range path {
		m, _ := v.(map[string]any)
		v = m[p]
	}
	return v
}

// CheckDelivery fails t unless a webhook delivery, its headers and body as
// its receiver got them, is what the document's webhooks entry for its
// event type says: each header it lists, and the body's schema.
func CheckDelivery(t testing.TB, header http.Header, body []byte) {
	t.Helper()
	c, err := loadChecker()
	if err != nil {
		t.Fatalf("load the OpenAPI document: %v", err)
	}
	var ev struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		t.Fatalf("the delivery is not JSON: %v", err)
	}
	base := "#/webhooks/" + pointerPart(ev.Type) + "/post"
	params, ok := At(c.doc, "webhooks", ev.Type, "post", "parameters").([]any)
	if !ok {
		t.Fatalf("the OpenAPI document's webhooks say nothing of %q", ev.Type)
	}
	validate := func(ptr string, v any, what string) {
		t.Helper()
		sch, err := c.schema(ptr)
		if err != nil {
			t.Fatalf("compile %s: %v", ptr, err)
		}
		if err := sch.Validate(v); err != nil {
			t.Errorf("the delivery's %s does not match the OpenAPI document: %v", what, err)
		}
	}
	for i, p := range params {
		name, _ := At(p, "name").(string)
		value := header.Get(name)
		if value == "" {
			if required, _ := At(p, "required").(bool); required {
				t.Errorf("the delivery has no %s header, which the OpenAPI document requires", name)
			}
			continue
		}
		validate(fmt.Sprintf("%s/parameters/%d/schema", base, i), value, name+" header")
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the delivery is not JSON: %v", err)
	}
	validate(base+"/requestBody/content/application~1json/schema", v, "body")
}

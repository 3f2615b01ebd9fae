package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/jsonstrict"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/schematags"
)

// tool binds one MCP tool to one REST call.
type tool struct {
	name  string
	needs string    // the scope its REST call needs, as the tool's description says
	spec  *mcp.Tool // as tools/list shows it
	add   func(s *mcp.Server, c Caller, defaultAuth string)
}

// readOnly marks a tool that only reads, so that a client may run it
// without asking its user first (the MCP readOnlyHint).
func readOnly(t tool) tool {
	t.spec.Annotations.ReadOnlyHint = true
	return t
}

// idempotent marks a tool whose call repeated with the same arguments has
// no further effect (the MCP idempotentHint): a client may retry it after
// a lost answer (retry-safety QA: report, heartbeat, resolve and an
// approval's decision answer their first outcome again).
func idempotent(t tool) tool {
	t.spec.Annotations.IdempotentHint = true
	return t
}

// define registers a tool whose input In maps to (method, path, body). The
// input schema is inferred from In, and adjust (if any) refines it.
//
// The SDK's typed tools decode arguments through a map[string]any, which
// reads every number as a float64: an integer above 2^53 in a payload, a
// result or cost_micros would reach the API rounded, so the same begin
// through MCP and through REST would fingerprint apart and the stored
// result would not be the vendor's. So the arguments are decoded into In
// as the REST API decodes a body, with numbers kept as written (json.Number
// in the free-form fields), then validated against the schema (on such a
// map, which is fine for validation), and the REST answer is relayed the
// same way.
func define[In any](name, description, needs string, route func(In) (method, path string, body any),
	adjust ...func(*jsonschema.Schema)) tool {
	// An agent reads what its key must hold before it calls (a call
	// without it answers forbidden with detail.required).
	description += " Needs the key's " + needs + " scope."
	schema, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: schema of %s: %v", name, err))
	}
	nullableOptional(schema)
	nonEmptyRequired(schema)
	for _, a := range adjust {
		a(schema)
	}
	resolved, err := schema.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: resolve schema of %s: %v", name, err))
	}
	urlOnly, err := urlArguments(schema, reflect.TypeFor[In]()).Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: resolve URL arguments of %s: %v", name, err))
	}
	// Every tool acts on Ratchet's own records, never the outside world,
	// and none destroys one: a write records a decision or an outcome.
	notDestructive := false
	spec := &mcp.Tool{Name: name, Description: description, InputSchema: schema,
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &notDestructive, OpenWorldHint: &notDestructive}}
	return tool{name: name, needs: needs, spec: spec, add: func(s *mcp.Server, c Caller, defaultAuth string) {
		s.AddTool(spec,
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				ctx, stop := boundToCarrier(ctx)
				defer stop()
				in, err := decodeArguments[In](req.Params.Arguments, resolved, urlOnly)
				if err != nil {
					res := refusedBeforeItsBody(ctx, c, authOf(req, defaultAuth), route, req.Params.Arguments, urlOnly, err)
					if res == nil {
						res = argumentsError(err)
					}
					return fit(ctx, name, res, nil, "")
				}
				method, path, body := route(in)
				return call(ctx, c, req, defaultAuth, method, path, body)
			})
	}}
}

// The schema library's refusals name the properties they descend through,
// then the rule, then quote the value: "validating root: validating
// /properties/compensation: validating
// /properties/compensation/properties/effect_type: pattern: "sk_live_…"
// does not match…". An answer names the argument as the REST API names a
// field (compensation.effect_type) and never the value (review). Only the
// leading chain is read: the value, quoted after it, can hold any text,
// "validating /properties/…" included (review).
var (
	schemaPath    = regexp.MustCompile(`^(?:/properties/[A-Za-z0-9_]+)+$`)
	schemaMissing = regexp.MustCompile(`^ missing properties: \[([^\]]*)\]`)
	// The rules the tool checks itself (urlArguments): REST checks the rest.
	schemaRules = map[string]string{"enum": "is not one of the allowed values", "minLength": "is shorter than allowed"}
)

// schemaRefusal reads the leading chain of a schema refusal: the deepest
// property path it names (dotted, "" for the root), the rule, and the text
// after the rule.
func schemaRefusal(msg string) (field, rule, rest string) {
	const step = "validating "
	for strings.HasPrefix(msg, step) {
		path, after, ok := strings.Cut(msg[len(step):], ": ")
		if !ok {
			return "", "", ""
		}
		if schemaPath.MatchString(path) {
			field = strings.ReplaceAll(strings.TrimPrefix(path, "/properties/"), "/properties/", ".")
		} else if path != "root" {
			return "", "", ""
		}
		msg = after
	}
	rule, rest, _ = strings.Cut(msg, ":")
	return field, rule, rest
}

// schemaProblem answers a schema refusal as the API's invalid_request,
// naming the argument it is about, without its value.
func schemaProblem(err error) *apierr.Error {
	field, rule, rest := schemaRefusal(err.Error())
	if m := schemaMissing.FindStringSubmatch(rest); rule == "required" && m != nil {
		prefix := ""
		if field != "" {
			prefix = field + "."
		}
		var p apierr.Problems
		for _, name := range strings.FieldsFunc(m[1], func(r rune) bool { return r == ' ' || r == ',' }) {
			if name = strings.Trim(name, `"`); name != "" {
				p.Add(prefix+name, "is required")
			}
		}
		if e, ok := apierr.As(p.Err()); ok {
			return e
		}
	}
	if field != "" {
		text, ok := schemaRules[rule]
		if !ok {
			text = "does not match the tool's input schema"
		}
		return apierr.InvalidField(field, "%s", text)
	}
	return apierr.InvalidField("arguments", "do not match the tool's input schema")
}

// nullableOptional lets every optional argument be null, as the REST API
// reads null like an omitted field: the inferred schema typed optional
// strings and objects without null, so MCP refused `"dimensions": null` or
// `"note": null` that REST takes (review).
func nullableOptional(schema *jsonschema.Schema) {
	for name, prop := range schema.Properties {
		if slices.Contains(schema.Required, name) || prop.Type == "" {
			continue
		}
		prop.Types, prop.Type = []string{prop.Type, "null"}, ""
	}
}

// nonEmptyRequired makes every required string argument at least one
// character, as the REST API reads an empty one as missing: an empty
// effect_id is named as the argument it is, not answered as an unknown route.
func nonEmptyRequired(schema *jsonschema.Schema) {
	one := 1
	for _, name := range schema.Required {
		if p := schema.Properties[name]; p != nil && p.Type == "string" {
			p.MinLength = &one
		}
	}
}

// oneOf restricts argument name to values (or null, when it is optional),
// so that a client sees what the REST route takes.
func oneOf(name string, values ...any) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) {
		p := s.Properties[name]
		if slices.Contains(p.Types, "null") {
			values = append(values, nil)
		}
		p.Enum = values
	}
}

// nonEmpty refuses an empty value of the optional URL argument name in the
// tool's schema: "" filters nothing (MCP QA: the REST list answered every
// row; it refuses an empty filter now too, knownQuery).
func nonEmpty(name string) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) {
		one := 1
		s.Properties[name].MinLength = &one
	}
}

func anys(values []string) []any {
	out := make([]any, len(values))
	for i, v := range values {
		out[i] = v
	}
	return out
}

// like gives the arguments that mirror a field of the REST request T the
// bounds its openapi tags state (the same the OpenAPI document shows), so a
// client sees them before it calls.
func like[T any](s *jsonschema.Schema) {
	schematags.Constrain(reflect.TypeFor[T](), s)
}

// pageLimit bounds a list tool's limit as the REST list does (1-200).
func pageLimit(s *jsonschema.Schema) {
	lo, hi := 1.0, 200.0
	s.Properties["limit"].Minimum, s.Properties["limit"].Maximum = &lo, &hi
}

// argumentsError answers arguments the tool refuses as the REST API answers
// a bad body: the error envelope, code invalid_request (with the offending
// field's path when the strict check named one).
func argumentsError(err error) *mcp.CallToolResult {
	e, ok := apierr.As(err)
	if !ok {
		e = schemaProblem(err)
	}
	return errorResult(e.Wire())
}

// urlArguments is what the tool itself checks of the arguments of In that
// form the REST call's URL (tagged mcp:"url", or mcp:"route" for one whose
// value names the route, the decision): what the URL could not carry to the
// REST route. A required one must be given, and none may be empty (an
// empty id would name another route, an empty filter filters nothing); a route's name must be one of its values. Everything
// else of them (a state filter's values, a limit's range, an effect type's
// form) the REST route checks, as it checks the body's, so that it is
// refused in REST's words with every problem of the call listed together
// (MCP review: the schema answered "limit is below its minimum" where REST
// answers "limit must be an integer from 1 to 200", and named only the
// first of two bad filters). The tool's schema still states them all.
func urlArguments(schema *jsonschema.Schema, t reflect.Type) *jsonschema.Schema {
	out := &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{}}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch tag := f.Tag.Get("mcp"); {
			case f.Anonymous && name == "":
				walk(f.Type)
			case tag == "url" || tag == "route":
				p := schema.Properties[name]
				checked := &jsonschema.Schema{MinLength: p.MinLength} // a string's only: a limit's is REST's
				if tag == "route" {
					checked.Enum = p.Enum
				}
				out.Properties[name] = checked
				if slices.Contains(schema.Required, name) {
					out.Required = append(out.Required, name)
				}
			}
		}
	}
	walk(t)
	return out
}

// bodyProbe is the body sent to learn whether a REST route refuses a call
// before it reads its body (refusedBeforeItsBody): one no route takes.
const bodyProbe = "[]"

// refusedBeforeItsBody is the REST route's answer to a call whose
// arguments the tool refused (err, the decoder's refusal of body
// arguments only), when the route refuses that call before it reads a
// body: 401 or 403 for the key (forbidden with detail.required for a scope
// it lacks), 429, 404 for an id that names nothing. REST checks those
// first, so the same body sent to it is answered so (MCP review: a key
// without effects:resolve sending attempt "1" was told invalid_request,
// where REST answers forbidden). The route is sent the URL the arguments
// name and a body it refuses unread (bodyProbe), so nothing acts; nil
// when it reads that body (the tool's refusal is then REST's own, in its
// words), when a URL argument is at fault or the route is not a write.
func refusedBeforeItsBody[In any](ctx context.Context, c Caller, auth string, route func(In) (string, string, any),
	args json.RawMessage, urlOnly *jsonschema.Resolved, err error) *mcp.CallToolResult {
	e, ok := apierr.As(err)
	if !ok {
		return nil
	}
	inURL := urlOnly.Schema().Properties
	problems, _ := e.Detail["validation"].([]apierr.FieldError)
	if len(problems) == 0 {
		return nil
	}
	for _, p := range problems {
		if top, _, _ := strings.Cut(p.Field, "."); inURL[top] != nil {
			return nil
		}
	}
	var object map[string]json.RawMessage
	if json.Unmarshal(args, &object) != nil {
		return nil
	}
	urlArgs := map[string]json.RawMessage{}
	for name, v := range object {
		if inURL[name] != nil && string(bytes.TrimSpace(v)) != "null" {
			urlArgs[name] = v
		}
	}
	raw, merr := jsonx.Marshal(urlArgs)
	var in In
	var check map[string]any
	if merr != nil || jsonstrict.DecodeNumbers(raw, &in) != nil || json.Unmarshal(raw, &check) != nil ||
		urlOnly.Validate(&check) != nil {
		return nil
	}
	method, path, _ := route(in)
	if method != http.MethodPost {
		return nil
	}
	status, resp, cerr := c.Call(ctx, method, path, auth, []byte(bodyProbe))
	if cerr != nil || status == http.StatusBadRequest || (status >= 200 && status < 300) || !fromAPI(status, resp) {
		return nil
	}
	return resultOf(status, resp)
}

// errorResult is a tool's failure, {"error": wire}, as text and structured.
func errorResult(wire any) *mcp.CallToolResult {
	body, _ := json.Marshal(map[string]any{"error": wire})
	var structured map[string]any
	_ = json.Unmarshal(body, &structured)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(body)}},
		StructuredContent: structured, IsError: true}
}

// decodeArguments reads a tool call's arguments as the REST API reads a
// body (jsonstrict.DecodeNumbers: unknown fields, wrong types, repeated keys,
// numbers beyond float64, NUL..., each answered with the field's path and
// the API's wording, never the value), numbers kept as written, and then
// checks them against the tool's schema for what only it knows (required
// arguments, enumerations).
func decodeArguments[In any](args json.RawMessage, resolved, urlOnly *jsonschema.Resolved) (In, error) {
	var in In
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	var object map[string]json.RawMessage
	if err := json.Unmarshal(args, &object); err != nil {
		return in, errors.New("must be a JSON object")
	}
	// The schema checks the arguments without their nulls too (MCP QA: it
	// was given them as sent, and a required URL argument given null was
	// refused as "has the wrong type" instead of as missing).
	args, err := withoutNulls(args, object)
	if err != nil {
		return in, err
	}
	if err := jsonstrict.DecodeNumbers(args, &in); err != nil {
		page, ok := any(&in).(limitRefuser)
		if !ok {
			return in, err
		}
		if args, err = withoutRefusedLimit(err, urlOnly, object); err != nil {
			return in, err
		}
		in = *new(In) // what the refused decode left in it
		if err := jsonstrict.DecodeNumbers(args, &in); err != nil {
			return in, err
		}
		page.refuseLimit()
	}
	var check map[string]any // the schema validates plain values
	if err := json.Unmarshal(args, &check); err != nil {
		return in, errors.New("must be a JSON object")
	}
	if err := resolved.Validate(&check); err != nil {
		// Only the URL's arguments are the tool's to refuse; the REST route
		// answers the body's, with every problem of the call listed
		// together in its words (QA: the schema named only its first).
		if err := urlOnly.Validate(&check); err != nil {
			return in, err
		}
	}
	return in, nil
}

// withoutRefusedLimit answers err, the decoder's refusal of the arguments
// (whose members are object's), unless the decoder refused a list's limit
// (urlOnly's) alone (1.5, "5", 2^63): then it answers the arguments without
// it, to be sent with a limit REST refuses (refuseLimit), so that REST
// answers it in its words for ?limit= (apierr.LimitRule) together with the
// call's other problems (MCP review: a bad cursor or state beside it went
// unnamed, and before that it was told only "must be an integer").
func withoutRefusedLimit(err error, urlOnly *jsonschema.Resolved, object map[string]json.RawMessage) (json.RawMessage, error) {
	e, ok := apierr.As(err)
	if !ok || urlOnly.Schema().Properties["limit"] == nil {
		return nil, err
	}
	if problems, _ := e.Detail["validation"].([]apierr.FieldError); len(problems) != 1 || problems[0].Field != "limit" {
		return nil, err
	}
	delete(object, "limit")
	args, merr := jsonx.Marshal(object)
	if merr != nil {
		return nil, err
	}
	return args, nil
}

// limitRefuser is a list tool's input (Page's), whose limit the decoder
// refused.
type limitRefuser interface{ refuseLimit() }

// withoutNulls is args (whose members are object's) without its members
// that are null: a tool's optional arguments are nullable in its schema
// (nullableOptional), null meaning "not given", while the REST body they
// form takes null only where its own schema does (jsonstrict). The
// arguments as sent are checked first, so a repeated key is still refused
// and not hidden by the re-encoding.
func withoutNulls(args json.RawMessage, object map[string]json.RawMessage) (json.RawMessage, error) {
	nulls := 0
	for name, v := range object {
		if string(bytes.TrimSpace(v)) == "null" {
			delete(object, name)
			nulls++
		}
	}
	if nulls == 0 {
		return args, nil
	}
	if err := jsonstrict.Check(args, nil); err != nil {
		return nil, err
	}
	return json.Marshal(object)
}

// BeginInput mirrors POST /api/v1/effects/begin. An integer field carries
// its REST field's openapi bounds: the decoder words a refusal of 1.5 or
// 2^64 from them (jsonstrict), as REST words it (MCP review: the tool said
// "must be an integer" where REST names the bounds). The tool's schema
// takes the REST body's own (like).
type BeginInput struct {
	EffectType          string             `json:"effect_type" jsonschema:"what kind of effect, e.g. email.send or payment.charge"`
	IdempotencyKey      string             `json:"idempotency_key" jsonschema:"derived from the work, deterministically (refund:order_551:full), never random"`
	Payload             any                `json:"payload,omitempty" jsonschema:"the arguments of the action; the same key with other arguments is refused"`
	CostMicros          *int64             `json:"cost_micros,omitempty" jsonschema:"declared cost in micros of USD" openapi:"min=0,max=1000000000000000000"`
	Dimensions          map[string]string  `json:"dimensions,omitempty" jsonschema:"counterparties such as recipient, for per-destination ceilings"`
	RunID               *string            `json:"run_id,omitempty"`
	GroupID             *string            `json:"group_id,omitempty"`
	Compensation        *CompensationInput `json:"compensation,omitempty" jsonschema:"how to undo it, should the effect's group be rolled back (needs group_id)"`
	CompensatesEffectID *string            `json:"compensates_effect_id,omitempty"`
	LeaseSeconds        *int               `json:"lease_seconds,omitempty" openapi:"min=1"`
	RequestID           *string            `json:"request_id,omitempty" jsonschema:"16-255 random printable characters (a UUID) naming this call: send the same one when retrying a call whose answer was lost, and a lease still running is answered again"`
}

// CompensationInput is a grouped effect's declared undo (gate.Compensation).
type CompensationInput struct {
	EffectType string `json:"effect_type" jsonschema:"the undoing effect's type, e.g. payment.refund"`
	Payload    any    `json:"payload,omitempty" jsonschema:"the undoing effect's arguments (any JSON)"`
}

// ReportInput mirrors POST /api/v1/effects/{id}/report.
type ReportInput struct {
	EffectID   string `json:"effect_id" mcp:"url"`
	LeaseToken string `json:"lease_token"`
	Outcome    string `json:"outcome" jsonschema:"succeeded, or failed only when the action surely did not reach the outside world"`
	Result     any    `json:"result,omitempty" jsonschema:"what the action returned (any JSON), answered to later duplicates"`
}

// HeartbeatInput mirrors POST /api/v1/effects/{id}/heartbeat.
type HeartbeatInput struct {
	EffectID   string `json:"effect_id" mcp:"url"`
	LeaseToken string `json:"lease_token"`
}

// ResolveInput mirrors POST /api/v1/effects/{id}/resolve (its attempt's
// bounds as BeginInput's lease_seconds).
type ResolveInput struct {
	EffectID string `json:"effect_id" mcp:"url"`
	Outcome  string `json:"outcome" jsonschema:"what the vendor's own record shows: succeeded or failed"`
	Result   any    `json:"result,omitempty" jsonschema:"what the vendor's record shows the action returned (any JSON)"`
	Note     string `json:"note,omitempty"`
	Attempt  *int   `json:"attempt,omitempty" openapi:"min=1" jsonschema:"the attempt you verified (the effect's latest unknown attempt, as ratchet_get_effect shows it); send it: the resolve then applies only to that attempt, so a retried resolve can never settle a later one (409 invalid_state names the attempt unresolved now)"`
}

// EffectInput names one effect.
type EffectInput struct {
	EffectID string `json:"effect_id" mcp:"url"`
}

// ListEffectsInput filters GET /api/v1/effects.
type ListEffectsInput struct {
	State      string `json:"state,omitempty" jsonschema:"leased, succeeded, failed, indeterminate, awaiting_approval or denied" mcp:"url"`
	EffectType string `json:"effect_type,omitempty" mcp:"url" openapi:"pattern=^[A-Za-z0-9][A-Za-z0-9._:-]*$,maxLength=100"`
	Page
}

// Page is a list's page: limit (1-200, default 50) rows after cursor (the
// previous page's next_cursor).
type Page struct {
	Limit  *int   `json:"limit,omitempty" jsonschema:"rows per page, 1-200 (default 50); a page ends early, with next_cursor, when its rows would pass what one answer holds" mcp:"url"`
	Cursor string `json:"cursor,omitempty" jsonschema:"the previous page's next_cursor" mcp:"url"`
	// refused is set when the decoder refused the limit (not an integer
	// of Go's int): it is sent as a value REST refuses, as it refuses
	// that one, in the same words (withoutRefusedLimit).
	refused bool
}

// notALimit is the limit sent for one the decoder refused: REST answers
// every value that is not an integer from 1 to 200 in the same words, and
// never quotes it.
const notALimit = "not-an-integer"

func (p *Page) refuseLimit() { p.refused = true }

func (p Page) params() map[string]string {
	out := map[string]string{"cursor": p.Cursor}
	switch {
	case p.refused:
		out["limit"] = notALimit
	case p.Limit != nil:
		out["limit"] = strconv.Itoa(*p.Limit) // out of range: the API's 400
	}
	return out
}

// PolicyInput names an effect type.
type PolicyInput struct {
	EffectType string `json:"effect_type" mcp:"url" openapi:"pattern=^[A-Za-z0-9][A-Za-z0-9._:-]*$,maxLength=100"`
}

// ListApprovalsInput filters GET /api/v1/approvals.
type ListApprovalsInput struct {
	State string `json:"state,omitempty" jsonschema:"pending, approved or rejected" mcp:"url"`
	Page
}

// DecideInput approves or rejects a held effect.
type DecideInput struct {
	ApprovalID string `json:"approval_id" mcp:"url"`
	Decision   string `json:"decision" jsonschema:"approve or reject" mcp:"route"`
	Note       string `json:"note,omitempty"`
}

func query(params map[string]string) string {
	v := url.Values{}
	for k, p := range params {
		if p != "" {
			v.Set(k, p)
		}
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

// tools are the nine MCP tools.
var tools = []tool{
	define(beginTool, "Ask before you act. Returns decision: execute, duplicate, in_flight, blocked, "+
		"approval_required or denied. "+Instructions, "effects:begin",
		func(in BeginInput) (string, string, any) { return "POST", beginPath, in },
		like[gate.BeginRequest]),
	idempotent(define("ratchet_report", "Report what happened after an execute decision: succeeded (with its "+
		"result) or failed, only when the action surely did not happen; if unsure, report nothing (the lease "+
		"lapses and the outcome reads unknown). lease_expired or lease_lost: not recorded; do not act again.",
		"effects:report",
		func(in ReportInput) (string, string, any) {
			return "POST", "/api/v1/effects/" + pathEscape(in.EffectID) + "/report",
				map[string]any{"lease_token": in.LeaseToken, "outcome": in.Outcome, "result": in.Result}
		}, like[gate.ReportRequest])),
	idempotent(define("ratchet_heartbeat", "Extend a held lease while a long action is still running.", "effects:report",
		func(in HeartbeatInput) (string, string, any) {
			return "POST", "/api/v1/effects/" + pathEscape(in.EffectID) + "/heartbeat", map[string]any{"lease_token": in.LeaseToken}
		})),
	// Not marked idempotent: a resolve without attempt settles whatever
	// attempt is unknown when it runs, so the same call repeated after the
	// key's next attempt lapsed settled that attempt too (MCP review: a
	// retried failed resolve recorded attempt 2, which may have happened,
	// as failed). Only one naming its attempt answers its first outcome again.
	define("ratchet_resolve", "Record what the vendor shows for an indeterminate effect; unblocks its key. "+
		"Send attempt: a resolve naming it, repeated, answers its first outcome again, where one without it "+
		"settles whatever attempt is unknown when it runs, a later one included.", "effects:resolve",
		func(in ResolveInput) (string, string, any) {
			body := map[string]any{"outcome": in.Outcome, "result": in.Result, "note": in.Note}
			if in.Attempt != nil {
				body["attempt"] = *in.Attempt
			}
			return "POST", "/api/v1/effects/" + pathEscape(in.EffectID) + "/resolve", body
		}, like[gate.ResolveRequest]),
	readOnly(define("ratchet_get_effect", "Read one effect with its attempts.", "effects:read",
		func(in EffectInput) (string, string, any) {
			return "GET", "/api/v1/effects/" + pathEscape(in.EffectID), nil
		})),
	readOnly(define("ratchet_list_effects", "List effects, e.g. state=indeterminate to find what needs verifying.", "effects:read",
		func(in ListEffectsInput) (string, string, any) {
			q := in.params()
			q["state"], q["effect_type"] = in.State, in.EffectType
			return "GET", "/api/v1/effects" + query(q), nil
		}, oneOf("state", anys(gate.States)...), nonEmpty("state"), nonEmpty("effect_type"), pageLimit, like[ListEffectsInput])),
	readOnly(define("ratchet_get_policy", "Read the policy that governs an effect type.", "policies:read",
		func(in PolicyInput) (string, string, any) {
			return "GET", "/api/v1/policies/" + pathEscape(in.EffectType), nil
		}, like[PolicyInput])),
	readOnly(define("ratchet_list_approvals", "List approvals, e.g. state=pending.", "approvals:write",
		func(in ListApprovalsInput) (string, string, any) {
			q := in.params()
			q["state"] = in.State
			return "GET", "/api/v1/approvals" + query(q), nil
		}, oneOf("state", gate.ApprovalPending, gate.ApprovalApproved, gate.ApprovalRejected), nonEmpty("state"), pageLimit)),
	idempotent(define("ratchet_decide_approval", "Approve or reject a held effect (operator keys only).", "approvals:write",
		func(in DecideInput) (string, string, any) {
			// The decision names the route: nothing but the exact words
			// reaches one (the schema refuses others, and the router would
			// answer 404), so a misspelt "REJECT" never approves.
			return "POST", "/api/v1/approvals/" + pathEscape(in.ApprovalID) + "/" + pathEscape(in.Decision),
				map[string]any{"note": in.Note}
		},
		oneOf("decision", "approve", "reject"), like[gate.DecideRequest])),
}

// ToolScopes maps each tool to the scope its REST call needs.
func ToolScopes() map[string]string {
	m := make(map[string]string, len(tools))
	for _, t := range tools {
		m[t.name] = t.needs
	}
	return m
}

// ToolDefinitions lists the tools as tools/list answers them (name,
// description, input schema, annotations), for the capability manifest,
// which a client reads without a key. They are shared: read them only.
func ToolDefinitions() []*mcp.Tool {
	specs := make([]*mcp.Tool, len(tools))
	for i, t := range tools {
		specs[i] = t.spec
	}
	return specs
}

// ToolNames lists the tools (for the capability manifest and tests).
func ToolNames() []string {
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.name
	}
	return names
}

package httpapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/jsonstrict"
	"github.com/getratchet/ratchet/lib/schematags"
)

// Version is the API and manifest version.
const Version = "1.0.0"

var (
	openapiOnce sync.Once
	openapiDoc  map[string]any
)

// OpenAPI returns the OpenAPI 3.1 document generated from the route table.
func OpenAPI() map[string]any {
	openapiOnce.Do(func() { openapiDoc = buildOpenAPI(Routes()) })
	return openapiDoc
}

// commonErrors apply to every authenticated route (invalid_request: a query
// parameter it does not take, knownQuery).
var commonErrors = []string{apierr.CodeUnauthorized, apierr.CodeForbidden, apierr.CodeInvalidRequest,
	apierr.CodeRateLimited, apierr.CodeRequestTimeout, apierr.CodePayloadTooLarge, apierr.CodeInternal,
	apierr.CodeDatabaseUnavailable}

func buildOpenAPI(routes []Route) map[string]any {
	paths := map[string]map[string]any{}
	for _, r := range routes {
		ops, ok := paths[r.OpenAPIPath()]
		if !ok {
			ops = map[string]any{}
			paths[r.OpenAPIPath()] = ops
		}
		ops[strings.ToLower(r.Method)] = operation(r)
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":   "Ratchet API",
			"version": Version,
			"description": "Ratchet is a reliability layer for side effects: ask POST /api/v1/effects/begin before " +
				"acting, then report. Durable jobs run customer-owned workers over leases. Every failure is " +
				"{\"error\": {\"code\", \"message\", \"detail\"}}; branch on code.",
		},
		"servers":  []any{map[string]any{"url": "/"}},
		"paths":    paths,
		"webhooks": webhookDeliveries(),
		"components": map[string]any{
			"securitySchemes": map[string]any{
				"bearer": map[string]any{"type": "http", "scheme": "bearer", "description": "An API key (rk_...)."},
				"cron":   map[string]any{"type": "http", "scheme": "bearer", "description": "CRON_SECRET."},
			},
			"schemas": map[string]any{"Error": errorSchema(), "WebhookEvent": webhookEventSchema()},
			"headers": map[string]any{
				"RequestId": map[string]any{"description": "Every response's id, as the server logs it; quote it " +
					"when reporting a problem.", "schema": map[string]any{"type": "string"}},
				"RetryAfter": map[string]any{"description": "Seconds to wait before trying again (as " +
					"detail.retry_after_seconds).", "schema": map[string]any{"type": "integer", "minimum": 1}},
				"WWWAuthenticate": map[string]any{"description": "Bearer: the request needs an API key.",
					"schema": map[string]any{"type": "string"}},
			},
		},
	}
}

func errorSchema() map[string]any {
	codes := make([]string, 0, len(apierr.Statuses))
	for c := range apierr.Statuses {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	return map[string]any{
		"type":     "object",
		"required": []string{"error"},
		"properties": map[string]any{
			"error": map[string]any{
				"type":     "object",
				"required": []string{"code", "message", "detail"},
				"properties": map[string]any{
					"code":    map[string]any{"type": "string", "enum": codes},
					"message": map[string]any{"type": "string"},
					"detail":  errorDetailSchema(),
				},
			},
		},
	}
}

// errorDetailSchema names the detail fields clients branch on (API.md §0
// and §5, and what this server adds); which ones an error carries depends on
// its code, and others may be added.
func errorDetailSchema() map[string]any {
	str := func(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }
	integer := func(desc string) map[string]any { return map[string]any{"type": "integer", "description": desc} }
	return map[string]any{
		"type":                 "object",
		"additionalProperties": true,
		"properties": map[string]any{
			"validation": map[string]any{"type": "array", "maxItems": apierr.MaxProblems, "description": "invalid_request (and " +
				"approval_threshold_above_ceiling): each problem, field named by its dotted path from the body root; " +
				fmt.Sprintf("the first %d found, when there are more.", apierr.MaxProblems),
				"items": map[string]any{"type": "object", "required": []string{"field", "message"},
					"properties": map[string]any{"field": map[string]any{"type": "string"},
						"message": map[string]any{"type": "string"}}}},
			"required": map[string]any{"type": "array", "items": map[string]any{"type": "string"},
				"description": "forbidden: the scopes (or tool:<name>@<version>) the key lacks; empty when no scope would " +
					"lift the refusal (see reason)."},
			"reason": map[string]any{"type": "string", "enum": []string{"capped_key", "signup_closed", "cross_origin"},
				"description": "forbidden with an empty required: capped_key (a key with a spend ceiling or rate limit " +
					"mints no key), signup_closed (SIGNUP_MODE=closed), cross_origin (the MCP endpoint, a browser page " +
					"of another origin)."},
			"any_of": map[string]any{"type": "array", "items": map[string]any{"type": "string"},
				"description": "forbidden, where holding one of several scopes is enough: each of them."},
			"resets_at": map[string]any{"type": "string", "format": "date-time",
				"description": "budget_exceeded, key_budget_exceeded, dimension_limit_exceeded: the next UTC midnight."},
			"dimension": str("dimension_limit_exceeded: the dimension whose limit would be breached."),
			"dimensions": map[string]any{"type": "array", "items": map[string]any{"type": "string"},
				"description": "dimension_required: the required dimensions the begin left out."},
			"effect_id": str("cost_required, dimension_required (a key begun before its type required it): the key's " +
				"effect, which a begin of the key cannot change (its fingerprint): resolve it or use a new key."),
			"run_id":              str("run_budget_exceeded: the run whose wallet refused."),
			"budget_micros":       integer("run_budget_exceeded: the run's budget."),
			"spent_micros":        integer("run_budget_exceeded: what the run has spent."),
			"max_cost_micros":     integer("cost_ceiling_exceeded: the type's ceiling."),
			"retry_after_seconds": integer("rate_limited (also in Retry-After), retry_request: when to try again."),
			"outcome": map[string]any{"type": "string", "enum": []string{apierr.OutcomeNotApplied, apierr.OutcomeUnknown},
				"description": "database_unavailable: whether the request may have been applied."},
			"request_id":            str("internal_error, database_unavailable: the request's id, as in X-Request-Id."),
			"current_version":       integer("version_conflict (a policy): the version to re-read."),
			"currentVersion":        integer("version_conflict (an endpoint's policy): the version to re-read."),
			"currentHandlerVersion": str("version_conflict (a replay's expectedHandlerVersion): the step's handler version."),
			"state":                 str("invalid_state and others: the state that refused the request."),
			"attempt": integer("lease_lost (an effect's or a job's report): the attempt this token held; " +
				"a replay's invalid_state: the job's last attempt; a resolve's invalid_state: the attempt this key " +
				"resolved with this outcome, when it did (see resolved_outcome; with the resolve's attempt sent, " +
				"only that attempt)."),
			"reported_outcome": str("lease_lost (an effect): what the token's attempt was reported as, when it was."),
			"resolved_outcome": str("invalid_state (a resolve): this key resolved the effect's attempt with this " +
				"outcome already, and the key was begun again since; the repeat landed the first time."),
			"unresolved_attempt": integer("invalid_state (a resolve that sent attempt): the attempt whose outcome " +
				"is unknown now, the one a resolve settles; the resolve named another and changed nothing."),
			"reportedOutcome": str("lease_lost (a job): what the token's attempt was reported as, when it was."),
			"status":          str("invalid_state (a job's report): the status the job ended in."),
			"leaseLapsed": map[string]any{"type": "boolean", "description": "invalid_state (a job's report): " +
				"the job ended because this attempt, its last, lapsed unreported (the outcome is the one lost)."},
			"attempts":    integer("max_attempts_exceeded: the attempts the key has used."),
			"approval_id": str("approval_rejected: the approval that was rejected."),
			"opened_by": map[string]any{"type": "string", "enum": []string{gate.OpenedBySurge, gate.OpenedByManual, gate.OpenedByStop},
				"description": "circuit_open: what opened the breaker that denied."},
			"opened_at":   map[string]any{"type": "string", "format": "date-time", "description": "circuit_open: when that breaker opened."},
			"closes_at":   map[string]any{"type": []string{"null", "string"}, "format": "date-time", "description": "circuit_open: when it closes by itself (null: only by hand)."},
			"limit_bytes": integer("payload_too_large: the limit exceeded."),
			"steps": map[string]any{"type": "array", "maxItems": gate.MaxGroupSteps, "description": "invalid_state " +
				"(a group's commit): the steps that have not succeeded, each {effect_id, state}: every one (a group " +
				"takes at most limits.group_steps_max).", "items": map[string]any{"type": "object",
				"properties": map[string]any{"effect_id": map[string]any{"type": "string"}, "state": map[string]any{"type": "string"}}}},
			"unresolved": map[string]any{"type": "array", "maxItems": gate.MaxGroupSteps, "items": map[string]any{"type": "string"},
				"description": "invalid_state (a compensating begin, or a new attempt at a compensation, while the " +
					"rollback has not reached its step): the effects with unknown outcomes the rollback waits for; " +
					"verify them (resolve), then unwind again."},
			"group_steps_max": integer("invalid_state (a begin of a new forward step in a full group): the most " +
				"forward steps a group takes (limits.group_steps_max); nothing was kept: start a new group."),
			"compensating_effect_id": str("invalid_state (a compensation begun again): the step's compensating effect."),
			"committed_at": map[string]any{"type": "string", "format": "date-time", "description": "invalid_state " +
				"(a commit of a group whose unwind began since it was committed): when it was committed, so a " +
				"retried commit learns the first one landed."},
			"key_id": str("forbidden, invalid_state (a revoke with ?include_minted=true): the key of the tree that " +
				"refused it, the revoked key or one minted from it (forbidden: its own revoke's refusal; invalid_state: " +
				"the first of the workspace's last root keys); nothing was revoked."),
			"previous_secret_expires_at": map[string]any{"type": "string", "format": "date-time", "description": "invalid_state " +
				"(a webhook's rotate-secret while a previous secret still signs): when that secret stops signing; " +
				"send replace_previous: true to stop it at once."},
		},
	}
}

func operation(r Route) map[string]any {
	op := map[string]any{
		"operationId": r.Name,
		"summary":     r.Summary,
		"tags":        []string{r.Tag},
	}
	switch r.Auth {
	case AuthKey:
		op["security"] = []any{map[string]any{"bearer": []string{}}}
		if len(r.Scopes) > 0 {
			op["x-required-scopes"] = r.Scopes
		}
		if len(r.AnyScopes) > 0 {
			op["x-any-of-scopes"] = r.AnyScopes
		}
		if r.Settles {
			op["x-rate-limit"] = "settling" // its own bucket: auth.AuthenticateSettling
		}
	case AuthCron:
		op["security"] = []any{map[string]any{"cron": []string{}}}
	default:
		op["security"] = []any{}
	}
	var params []any
	for _, p := range r.PathParams() {
		schema := map[string]any{"type": "string"}
		if p == "effect_type" { // begin's rule (agent QA: the path read as any string)
			schema["pattern"], schema["maxLength"] = gate.EffectTypePattern, gate.EffectTypeMaxLength
		}
		params = append(params, map[string]any{"name": p, "in": "path", "required": true, "schema": schema})
	}
	for _, p := range r.Query {
		t := p.Type
		if t == "" {
			t = "string"
		}
		schema := map[string]any{"type": t}
		if p.Min != nil {
			schema["minimum"] = *p.Min
		}
		if p.Max != nil {
			schema["maximum"] = *p.Max
		}
		if p.Default != nil {
			schema["default"] = *p.Default
		}
		if p.Enum != nil {
			schema["enum"] = p.Enum
		}
		if p.Pattern != "" {
			schema["pattern"] = p.Pattern
		}
		if p.MaxLength > 0 {
			schema["maxLength"] = p.MaxLength
		}
		params = append(params, map[string]any{"name": p.Name, "in": "query", "description": p.Description, "schema": schema})
	}
	if r.Idempotent {
		params = append(params, map[string]any{"name": idempotency.Header, "in": "header", "required": false,
			"description": "1-255 printable characters. The success of this request is kept for 24 hours and " +
				"answered again, with " + ReplayedHeader + ": true and " + OriginalRequestHeader + " naming the " +
				"request that acted, to the same request (route, path and body bytes) sent with the same key by " +
				"the same API key. Another request under an answered key is 409 idempotency_key_reuse; any " +
				"request sent while the first is still acting is 409 retry_request (wait " +
				"detail.retry_after_seconds, also in Retry-After); one sent as the first records its answer " +
				"waits the moment it takes to commit and is given that answer. The request's work and its answer commit " +
				"together: a request that failed (a 4xx, a 500, a 503 with detail.outcome not_applied) changed " +
				"nothing and frees the key (or its claim lapses within 30 seconds). One whose COMMIT went " +
				"unanswered finds out whether it landed and answers so (its success, or a 503 not_applied that " +
				"frees the key); one that cannot (a 503 with detail.outcome unknown) holds the key for 30 " +
				"seconds, after which a retry gets the answer if the commit landed and acts if it did not. An answer " +
				"that showed a secret is erased when its key is revoked (a key's create) or its webhook deleted " +
				"(a webhook's create, a rotation): the same request is then answered 404 not_found, with " +
				ReplayedHeader + ": true and " + OriginalRequestHeader + ", and acts no more.",
			"schema": map[string]any{"type": "string", "minLength": 1, "maxLength": idemkey.MaxRunes, "pattern": idemkey.Pattern}})
	}
	if params != nil {
		op["parameters"] = params
	}
	codes := append([]string{}, r.Errors...)
	if r.Idempotent {
		codes = append(codes, apierr.CodeIdempotencyKeyReuse, apierr.CodeRetryRequest, apierr.CodeInvalidRequest)
	}
	switch {
	case r.Request != nil:
		schema := requestSchemaOf(r.Request)
		// A body whose every field is optional may be left out (the server
		// reads none as {}), so only one with a required field is required,
		// or one that must send some of its fields (a PATCH).
		fields, _ := schema.(map[string]any)["required"].([]any)
		if _, batch := r.Request.(batchOf); batch {
			fields = []any{"a message or a batch"}
		}
		least := 0
		if m, ok := r.Request.(interface{ MinProperties() int }); ok {
			least = m.MinProperties()
			schema.(map[string]any)["minProperties"] = least
		}
		op["requestBody"] = map[string]any{
			"required": len(fields) > 0 || least > 0,
			"content":  map[string]any{"application/json": map[string]any{"schema": schema}},
		}
	case takesNoBody(r):
		// An action without a body still reads one sent, and refuses any
		// field in it (Server.run): nothing or {}.
		op["requestBody"] = map[string]any{
			"required": false,
			"content": map[string]any{"application/json": map[string]any{
				"schema": map[string]any{"type": "object", "maxProperties": 0},
			}},
		}
		codes = append(codes, apierr.CodeInvalidRequest)
	}
	responses := map[string]any{}
	status := r.Status
	if status == 0 {
		status = 200
	}
	success := map[string]any{"description": http.StatusText(status)}
	switch {
	case r.ContentType != "":
		success["content"] = map[string]any{strings.Split(r.ContentType, ";")[0]: map[string]any{"schema": map[string]any{"type": "string"}}}
	case r.Response != nil:
		success["content"] = map[string]any{"application/json": map[string]any{"schema": schemaOf(r.Response)}}
	}
	if r.Idempotent {
		success["headers"] = map[string]any{
			ReplayedHeader: map[string]any{"description": "Present on an answer given again for an Idempotency-Key.",
				"schema": map[string]any{"type": "string", "enum": []string{"true"}}},
			OriginalRequestHeader: map[string]any{"description": "On an answer given again: the X-Request-Id of " +
				"the request that acted.", "schema": map[string]any{"type": "string"}},
		}
	}
	responses[fmt.Sprint(status)] = success
	if r.DedupOK {
		dedup := maps.Clone(success)
		dedup["description"] = "Found, not created: the existing one, unchanged"
		responses["200"] = dedup
	}
	for st, why := range r.Bodiless {
		responses[fmt.Sprint(st)] = map[string]any{"description": why}
	}
	if r.Auth == AuthKey {
		for _, c := range commonErrors {
			// A protocol endpoint reads its own body: within its route's
			// time when it declares one (MCP), else outside any.
			if c != apierr.CodeRequestTimeout || r.Raw == nil || r.Timeout != 0 {
				codes = append(codes, c)
			}
		}
	} else {
		codes = append(codes, apierr.CodeInternal)
		if r.Raw == nil {
			// Every route reads its query as text (textParams) and a body
			// sent, a read's too (refusesAnyField), through the same limit,
			// within the request's time: GET /api/v1/health with {"x":1}
			// was 400, with 2 MiB 413, and listed neither.
			codes = append(codes, apierr.CodeInvalidRequest, apierr.CodePayloadTooLarge, apierr.CodeRequestTimeout)
		}
	}
	byStatus := map[int][]string{}
	for _, c := range codes {
		st := apierr.Statuses[c]
		if st == 0 || contains(byStatus[st], c) {
			continue
		}
		byStatus[st] = append(byStatus[st], c)
	}
	for st, cs := range byStatus {
		sort.Strings(cs)
		var schema any = map[string]any{"$ref": "#/components/schemas/Error"}
		if body, ok := r.ErrorBodies[st]; ok {
			schema = map[string]any{"anyOf": []any{schema, schemaOf(bodyOf(body))}}
		}
		responses[fmt.Sprint(st)] = map[string]any{
			"description":   strings.Join(cs, ", "),
			"content":       map[string]any{"application/json": map[string]any{"schema": schema}},
			"x-error-codes": cs,
		}
	}
	// A status the route answers only with a body of its own, never with
	// an error code of the API's (MCP's -32601 under protocol 2026-07-28,
	// HTTP 404: it was answered, and not listed).
	for st, body := range r.ErrorBodies {
		if _, listed := responses[fmt.Sprint(st)]; listed {
			continue
		}
		why := http.StatusText(st)
		if d, ok := body.(describedBody); ok {
			why = d.Why
		}
		responses[fmt.Sprint(st)] = map[string]any{"description": why,
			"content": map[string]any{"application/json": map[string]any{"schema": schemaOf(bodyOf(body))}}}
	}
	for st, resp := range responses {
		headers, _ := resp.(map[string]any)["headers"].(map[string]any)
		if headers == nil {
			headers = map[string]any{}
		}
		headers[RequestIDHeader] = map[string]any{"$ref": "#/components/headers/RequestId"}
		codes, _ := resp.(map[string]any)["x-error-codes"].([]string)
		switch {
		case st == "401":
			headers["WWW-Authenticate"] = map[string]any{"$ref": "#/components/headers/WWWAuthenticate"}
		case st == "429", slices.Contains(codes, apierr.CodeRetryRequest):
			headers["Retry-After"] = map[string]any{"$ref": "#/components/headers/RetryAfter"}
		}
		resp.(map[string]any)["headers"] = headers
	}
	op["responses"] = responses
	return op
}

// takesNoBody is true of an action route without a request body type: it
// accepts nothing or {} (Server.run).
func takesNoBody(r Route) bool {
	return r.Request == nil && r.Raw == nil && r.Method != http.MethodGet && r.Method != http.MethodHead
}

// refusesAnyField is true of a route whose body, when one is sent, may only
// be {}: an action without a body type (takesNoBody) and a read alike.
func refusesAnyField(r Route) bool {
	return r.Request == nil && r.Raw == nil && r.Method != http.MethodHead
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// schemaOf reflects a Go body type into JSON Schema, mapping time.Time to a
// date-time string, raw JSON to any value, and Optional[T] to T-or-null.
// Every field of a response is required: it is always written, null or not
// (but for one left out when empty, which is never null: omittedNotNull).
func schemaOf(v any) any {
	if b, ok := v.(batchOf); ok {
		return b.schema(schemaOf)
	}
	return schemaFor(reflect.TypeOf(v), omittedNotNull)
}

// batchOf is a body that is one value like One or a JSON array of 1 to Max
// of them: a JSON-RPC message or a batch of them, and its answer (QA: the
// MCP endpoint's document showed one message alone, while README has it
// take and answer batches).
type batchOf struct {
	One any
	Max int
}

// schema is the body's: of is schemaOf or requestSchemaOf.
func (b batchOf) schema(of func(any) any) any {
	one := of(b.One)
	return map[string]any{"anyOf": []any{one,
		map[string]any{"type": "array", "items": one, "minItems": 1, "maxItems": b.Max}}}
}

// requestSchemaOf is schemaOf for a request body, where a field may be left
// out when it can be null (a pointer, a map, a list, raw JSON, an Optional)
// or is tagged omitempty; the others are required.
func requestSchemaOf(v any) any {
	if b, ok := v.(batchOf); ok {
		return b.schema(requestSchemaOf)
	}
	s := schemaFor(reflect.TypeOf(v), relaxRequired)
	if a, ok := v.(interface{ OneOfRequired() []string }); ok {
		// A body that must send exactly one of some fields, each alone
		// optional.
		var one []any
		for _, name := range a.OneOfRequired() {
			one = append(one, map[string]any{"required": []any{name}})
		}
		s.(map[string]any)["oneOf"] = one
	}
	return s
}

func schemaFor(t reflect.Type, adjust func(reflect.Type, *jsonschema.Schema)) any {
	opts := &jsonschema.ForOptions{IgnoreInvalidTypes: true, TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[time.Time]():                {Type: "string", Format: "date-time"},
		reflect.TypeFor[json.RawMessage]():          {},
		reflect.TypeFor[gate.DimensionLimitInput](): dimensionLimitInputSchema(),
	}}
	collectOptionals(t, opts.TypeSchemas, map[reflect.Type]bool{})
	s, err := jsonschema.ForType(t, opts)
	if err != nil {
		return map[string]any{"type": "object", "description": "schema unavailable: " + err.Error()}
	}
	anyForNullOnly(s)
	schematags.Constrain(t, s)
	if adjust != nil {
		adjust(t, s)
	}
	var out any
	b, _ := json.Marshal(s)
	_ = json.Unmarshal(b, &out)
	return out
}

// dimensionLimitInputSchema states a policy PUT's limit, which its handler
// reads raw (gate.DimensionLimitInput), as the limit it is: a policy's
// gate.DimensionLimit with its bounds, either field of which may be left out
// but not both (a limit that sets neither is refused too: the schema says
// less than the handler checks, never more).
func dimensionLimitInputSchema() *jsonschema.Schema {
	t := reflect.TypeFor[gate.DimensionLimit]()
	s, err := jsonschema.ForType(t, &jsonschema.ForOptions{IgnoreInvalidTypes: true})
	if err != nil {
		panic(fmt.Sprintf("openapi: dimension limit: %v", err))
	}
	schematags.Constrain(t, s)
	one := 1
	s.Required, s.MinProperties = nil, &one
	return s
}

// collectOptionals registers a schema for each jsonx.Optional[T] reachable
// from t: T's schema, also allowing null.
func collectOptionals(t reflect.Type, into map[reflect.Type]*jsonschema.Schema, seen map[reflect.Type]bool) {
	if t == nil || seen[t] {
		return
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Map:
		collectOptionals(t.Elem(), into, seen)
	case reflect.Struct:
		if strings.HasPrefix(t.Name(), "Optional[") && t.NumField() == 3 {
			inner := t.Field(2).Type
			collectOptionals(inner, into, seen)
			s, err := jsonschema.ForType(inner, &jsonschema.ForOptions{IgnoreInvalidTypes: true, TypeSchemas: into})
			if err == nil {
				typ := s.Type
				if typ != "" {
					s.Type = ""
					s.Types = []string{typ, "null"}
				}
				into[t] = s
			}
			return
		}
		for i := 0; i < t.NumField(); i++ {
			collectOptionals(t.Field(i).Type, into, seen)
		}
	}
}

// relaxRequired leaves in Required only the fields of struct t (and of the
// structs below it) that a request must send: those that cannot be null,
// but a bool, which reads false when left out (agent QA: a rotation's
// replace_previous was required, and {} was answered 200), unless tagged
// required.
func relaxRequired(t reflect.Type, s *jsonschema.Schema) {
	if s == nil {
		return
	}
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		if t.Kind() == reflect.Map {
			relaxRequired(t.Elem(), s.AdditionalProperties)
			return
		}
		t = t.Elem()
		if s.Items != nil {
			s = s.Items
		}
	}
	if t.Kind() != reflect.Struct || s.Properties == nil {
		return
	}
	fields := jsonstrict.ExactFields(t)
	must := mustSend(t)
	required := s.Required[:0]
	for _, name := range s.Required {
		if ft, ok := fields[name]; ok && ((!schematags.Nullable(ft) && ft.Kind() != reflect.Bool) || must[name]) {
			required = append(required, name)
		}
	}
	s.Required = required
	for name, ft := range fields {
		switch {
		case must[name]:
			schematags.NotNull(s.Properties[name]) // sent, and refused as null (a batch's reports)
		case ft.Kind() == reflect.Map:
			orNull(s.Properties[name]) // null is "not sent" (jsonstrict.takesNull); inference says object
		}
		relaxRequired(ft, s.Properties[name])
	}
}

// omittedNotNull drops null from the schema of each list, map or pointer
// field of struct t (and of the structs below it) tagged omitempty or
// omitzero: encoding/json leaves such a field out when it is nil, so in an
// answer it is never null when present (conformance QA: a manifest route's
// any_scopes, and an MCP tool's icons and their sizes, which no openapi tag
// can reach, read "array or null"; a group's deduplicated and a batch
// result's error read "or null"). A type that writes itself
// (json.RawMessage, which may hold null) keeps null, but a time, which is
// always written as a string (TypeScript SDK QA: begin's lease_expires_at
// read "or null"). The fields of an embedded struct are the object's own
// (TypeScript SDK QA: a commit's deduplicated, a denial's probe read "or
// null").
func omittedNotNull(t reflect.Type, s *jsonschema.Schema) {
	omittedNotNullIn(t, s, map[*jsonschema.Schema]bool{})
}

func omittedNotNullIn(t reflect.Type, s *jsonschema.Schema, seen map[*jsonschema.Schema]bool) {
	for s != nil && (t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice ||
		t.Kind() == reflect.Array || t.Kind() == reflect.Map) {
		switch t.Kind() {
		case reflect.Map:
			s = s.AdditionalProperties
		case reflect.Slice, reflect.Array:
			s = s.Items
		}
		t = t.Elem()
	}
	if s == nil || seen[s] || t.Kind() != reflect.Struct || s.Properties == nil {
		return
	}
	seen[s] = true
	omittedFieldsNotNull(t, s, seen)
}

// omittedFieldsNotNull is omittedNotNullIn for the fields of struct t,
// whose schema is s: an embedded struct's fields are read into the same s,
// which seen holds already.
func omittedFieldsNotNull(t reflect.Type, s *jsonschema.Schema, seen map[*jsonschema.Schema]bool) {
	marshaler := reflect.TypeFor[json.Marshaler]()
	if t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler) {
		return // it writes its fields itself, omitempty or not
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				omittedFieldsNotNull(et, s, seen) // its fields are this object's
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		p := s.Properties[name]
		if p == nil || !f.IsExported() || name == "-" {
			continue
		}
		opt := strings.Split(opts, ",")
		omitted := slices.Contains(opt, "omitempty") || slices.Contains(opt, "omitzero")
		nilable := f.Type.Kind() == reflect.Slice || f.Type.Kind() == reflect.Map || f.Type.Kind() == reflect.Pointer
		writesItself := (f.Type.Implements(marshaler) || reflect.PointerTo(f.Type).Implements(marshaler)) &&
			f.Type != reflect.TypeFor[*time.Time]()
		if omitted && nilable && !writesItself {
			c := *p // inference may share one schema between fields of a type
			schematags.NotNull(&c)
			s.Properties[name], p = &c, &c
		}
		omittedNotNullIn(f.Type, p, seen)
	}
}

// orNull adds null to a schema's one type.
func orNull(s *jsonschema.Schema) {
	if s == nil || s.Type == "" {
		return
	}
	s.Types, s.Type = []string{s.Type, "null"}, ""
}

// mustSend lists the fields of struct t tagged openapi:"required": fields
// that could hold null (a list, raw JSON, a pointer) but that the request
// must send all the same (a batch's reports, a contract's schemas).
func mustSend(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		if _, ok := schematags.Rules(f)["required"]; ok {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			out[name] = true
		}
	}
	return out
}

// anyForNullOnly undoes what inference makes of a pointer to raw JSON
// (*json.RawMessage, "any value or null"): it adds null to the element's
// types, and the element, any value, has none, so the result allowed only
// null (a duplicate's recorded result is an object).
func anyForNullOnly(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if s.Type == "" && len(s.Types) == 1 && s.Types[0] == "null" {
		s.Types = nil
	}
	for _, p := range s.Properties {
		anyForNullOnly(p)
	}
	anyForNullOnly(s.Items)
	anyForNullOnly(s.AdditionalProperties)
}

// describedBody is a body of Route.ErrorBodies with what its status means,
// for a status the route answers with no error code of the API's.
type describedBody struct {
	Why  string
	Body any
}

// bodyOf is the body an ErrorBodies entry describes.
func bodyOf(b any) any {
	if d, ok := b.(describedBody); ok {
		return d.Body
	}
	return b
}

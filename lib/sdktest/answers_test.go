package sdktest

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/httpapi"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// The Go SDK's answer types against the server's own account of them: the
// OpenAPI document it serves (httpapi.OpenAPI, generated from the server's
// Go types). Each Client method's answer struct, and each struct inside it,
// must name by its json tags the fields the route's response schema names,
// no more and no fewer; a field is a pointer (nil: null, or absent) where
// the schema allows null, and a value where the schema says it is always
// there and never null; a field of a JSON type the schema names (string,
// number, boolean, list, object). Lists (slices) and maps are compared by
// their elements; a slice or map holds null as nil, and json.RawMessage or
// any holds every JSON value. The TypeScript SDK's answers.test.js and the
// Python SDK's test_types.py hold theirs to the same document.

// goAnswerRoutes: which route each Client method calls, and where in its
// answer the value it returns is: the whole body, or the property named
// second, which the method takes from it.
var goAnswerRoutes = map[string][2]string{
	"StartRun":                      {"POST /runs"},
	"Enqueue":                       {"POST /runs/{id}/steps"},
	"FinishRun":                     {"POST /runs/{id}/finish"},
	"GetRun":                        {"GET /runs/{id}"},
	"ListRuns":                      {"GET /runs"},
	"ListRunSteps":                  {"GET /runs/{id}/steps"},
	"GetStep":                       {"GET /steps/{id}"},
	"ListStepAttempts":              {"GET /steps/{id}/attempts"},
	"ListStepReplays":               {"GET /steps/{id}/replays"},
	"CancelStep":                    {"POST /steps/{id}/cancel"},
	"CancelStepWithKey":             {"POST /steps/{id}/cancel"},
	"ReplayPreview":                 {"GET /steps/{id}/replay"},
	"Replay":                        {"POST /steps/{id}/replay"},
	"Begin":                         {"POST /effects/begin"},
	"ReportEffect":                  {"POST /effects/{id}/report"},
	"HeartbeatEffect":               {"POST /effects/{id}/heartbeat", "lease_expires_at"},
	"GetEffect":                     {"GET /effects/{id}"},
	"ResolveEffect":                 {"POST /effects/{id}/resolve"},
	"ListEffects":                   {"GET /effects"},
	"ListEffectPolicies":            {"GET /policies"},
	"GetEffectPolicy":               {"GET /policies/{effect_type}"},
	"GetPolicyStructuring":          {"GET /policies/{effect_type}/structuring"},
	"UpdateEffectPolicy":            {"PUT /policies/{effect_type}"},
	"UpdateEffectPolicyWithKey":     {"PUT /policies/{effect_type}"},
	"ListApprovals":                 {"GET /approvals"},
	"GetApproval":                   {"GET /approvals/{id}"},
	"Approve":                       {"POST /approvals/{id}/approve"},
	"Reject":                        {"POST /approvals/{id}/reject"},
	"ListCircuits":                  {"GET /circuits"},
	"OpenCircuit":                   {"POST /circuits/{effect_type}/open"},
	"OpenCircuitWithKey":            {"POST /circuits/{effect_type}/open"},
	"CloseCircuit":                  {"POST /circuits/{effect_type}/close"},
	"CloseCircuitWithKey":           {"POST /circuits/{effect_type}/close"},
	"EmergencyStop":                 {"POST /circuits/stop"},
	"EmergencyStopWithKey":          {"POST /circuits/stop"},
	"GetEmergencyStop":              {"GET /circuits/stop"},
	"ReleaseEmergencyStop":          {"POST /circuits/release"},
	"ReleaseEmergencyStopWithKey":   {"POST /circuits/release"},
	"CreateGroup":                   {"POST /groups"},
	"CreateGroupWithKey":            {"POST /groups"},
	"GetGroup":                      {"GET /groups/{id}"},
	"ListGroupSteps":                {"GET /groups/{id}/steps"},
	"CommitGroup":                   {"POST /groups/{id}/commit"},
	"UnwindGroup":                   {"POST /groups/{id}/unwind"},
	"CreateWebhook":                 {"POST /webhooks"},
	"CreateWebhookWithKey":          {"POST /webhooks"},
	"ListWebhooks":                  {"GET /webhooks"},
	"GetWebhook":                    {"GET /webhooks/{id}"},
	"UpdateWebhook":                 {"PATCH /webhooks/{id}"},
	"UpdateWebhookWithKey":          {"PATCH /webhooks/{id}"},
	"DeleteWebhook":                 {"DELETE /webhooks/{id}"},
	"ListWebhookDeliveries":         {"GET /webhooks/{id}/deliveries"},
	"RetryWebhookDeliveries":        {"POST /webhooks/{id}/deliveries/retry", "deliveries"},
	"RetryWebhookDeliveriesWithKey": {"POST /webhooks/{id}/deliveries/retry", "deliveries"},
	"RotateWebhookSecret":           {"POST /webhooks/{id}/rotate-secret"},
	"CreateKey":                     {"POST /keys"},
	"CreateKeyWithKey":              {"POST /keys"},
	"ListKeys":                      {"GET /keys"},
	"ListKeysMintedBy":              {"GET /keys"},
	"CurrentKey":                    {"GET /keys/current"},
	"RevokeKey":                     {"DELETE /keys/{id}"},
	"RevokeKeyWithMinted":           {"DELETE /keys/{id}"},
	"ListEndpoints":                 {"GET /endpoints"},
	"CreateEndpoint":                {"POST /endpoints"},
	"GetEndpoint":                   {"GET /endpoints/{id}/policy"},
	"UpdateEndpointPolicy":          {"PUT /endpoints/{id}/policy"},
	"PauseEndpoint":                 {"POST /endpoints/{id}/pause"},
	"PauseEndpointWithKey":          {"POST /endpoints/{id}/pause"},
	"ResumeEndpoint":                {"POST /endpoints/{id}/resume"},
	"ResumeEndpointWithKey":         {"POST /endpoints/{id}/resume"},
	"CloseEndpointCircuit":          {"POST /endpoints/{id}/circuit/close"},
	"CloseEndpointCircuitWithKey":   {"POST /endpoints/{id}/circuit/close"},
	"ListEndpointAttempts":          {"GET /endpoints/{id}/attempts"},
	"PublishContract":               {"POST /tools/{name}/contracts"},
	"ListContracts":                 {"GET /tools/{name}/contracts"},
	"TestTool":                      {"POST /tools/{name}/test"},
	"TestToolWithKey":               {"POST /tools/{name}/test"},
	"Reconcile":                     {"POST /reconcile"},
	"ListQueueHealth":               {"GET /queue/health"},
	"RegisterWorker":                {"POST /workers/register", "workerId"},
	"Claim":                         {"POST /workers/{workerId}/claim", "jobs"},
	"ClaimKeyed":                    {"POST /workers/{workerId}/claim", "jobs"},
	"HeartbeatJob":                  {"POST /jobs/{id}/heartbeat"},
	"ReportJob":                     {"POST /jobs/{id}/report"},
	"ReportJobs":                    {"POST /jobs/report", "results"},
}

// goClientSide: the Client methods whose answer the SDK makes itself, and
// why they are not compared.
var goClientSide = map[string]string{
	"String":   "no call: the client's own description",
	"GoString": "no call: the client's own description",
}

// goDeliberate: where the SDK's type differs from the schema it mirrors on
// purpose, each with its reason, keyed by type and JSON name ("Type.field":
// a field only one of them has; "Type.-GoName": a field of the SDK's own,
// json:"-"), with what differs after a space ("Type.field pointer": a
// pointer for a field always there and never null; "omitempty": omitempty
// where the schema requires the field, or none where it does not; "map": a
// map for an object whose properties the schema names).
var goDeliberate = map[string]string{
	"BeginResponse.error":   "a denial's error envelope (HTTP 403) is BeginResponse.Denial, an *Error made from it",
	"BeginResponse.-Denial": "the SDK's: a denial's error (HTTP 403), the body's error made an *Error",
	"BatchJobResult.error": "the *Error the single report would have answered, made by the SDK from the result's " +
		"error envelope (BatchJobResult.Err)",
	"BatchJobResult.Err": "the SDK's: the result's error envelope made an *Error (the SDK builds BatchJobResult, " +
		"it never decodes one)",
	"BatchJobResult.status omitempty": "JobReportResult's, where a single report always has it: a batch's " +
		"refused report has none (its Err says why)",
	"BatchJobResult.attempt omitempty": "JobReportResult's, where a single report always has it: a batch's " +
		"refused report has none (its Err says why)",
	"EffectAttempt.lease_expires_at pointer": "a *time.Time, kept so code that reads it compiles: " +
		"never nil",
	"Step.createdAt pointer": "a *time.Time, kept so code that reads it compiles: never nil",
	"PlanItem.compensation map": "a map[string]any (effect_type and payload), kept so code that " +
		"indexes it compiles",
	"APIKey.minted_revoked": "only a revoke with ?include_minted=true answers it, which RevokeKeyWithMinted " +
		"sends and reads (RevokedAPIKey); RevokeKey's plain revoke answers the key alone",
}

// goEnum names the SDK's constants for a field the schema gives an enum:
// those whose name begins with prefix (and no longer prefix of goEnums:
// ApprovalReason* are not Approval*), whose values are the enum's, or,
// superset, among whose values are all the enum's.
type goEnum struct {
	prefix   string
	superset bool
}

// goEnums: each answer field with an enum, by "Type.field" ("Type.field[]"
// for a list's items), and its constants. Every field with an enum has
// constants.
var goEnums = map[string]goEnum{
	"BeginResponse.decision":      {prefix: "Decision"},
	"BeginResponse.state":         {prefix: "Effect"},
	"Effect.state":                {prefix: "Effect"},
	"GroupStep.state":             {prefix: "Effect"},
	"PlanItem.compensation_state": {prefix: "Effect"},
	"ReconcileItem.ratchet_state": {prefix: "Effect"},
	"EffectAttempt.outcome":       {prefix: "Effect", superset: true},
	"ReconcileItem.outcome":       {prefix: "Outcome"},
	"Effect.denial_code":          {prefix: "Code", superset: true},
	"Approval.state":              {prefix: "Approval"},
	"Circuit.action":              {prefix: "Breaker"},
	"StopState.action":            {prefix: "Breaker"},
	"Policy.surge_action":         {prefix: "Breaker"},
	"ReconcileItem.vendor_status": {prefix: "Vendor"},
	"WebhookDelivery.event_type":  {prefix: "Event"},
	"WebhookEvent.type":           {prefix: "Event"},
	"WebhookDelivery.state":       {prefix: "Delivery"},
	"Approval.reason":             {prefix: "ApprovalReason"},
	"Circuit.state":               {prefix: "Circuit"},
	"StopState.state":             {prefix: "Circuit"},
	"Circuit.opened_by":           {prefix: "CircuitOpenedBy"},
	"Group.state":                 {prefix: "Group"},
	"GroupCommit.state":           {prefix: "Group"},
	"Unwind.state":                {prefix: "Group"},
	"Policy.mode":                 {prefix: "PolicyMode"},
	"Policy.on_indeterminate":     {prefix: "OnIndeterminate"},
	"Structuring.threshold_from":  {prefix: "ThresholdFrom"},
	"Run.status":                  {prefix: "Run"},
	"RunSummary.status":           {prefix: "Run"},
	"Step.status":                 {prefix: "Job"},
	"DurableJob.status":           {prefix: "Job"},
	"EnqueueResult.status":        {prefix: "Job"},
	"ReplayPreview.status":        {prefix: "Job"},
	"ReplayResult.status":         {prefix: "Job", superset: true},
	"ToolTest.status":             {prefix: "Job"},
	"JobReportResult.status":      {prefix: "Job"},
	"BatchJobResult.status":       {prefix: "Job"},
	"JobReplay.priorStatus":       {prefix: "Job", superset: true},
	"Contract.status":             {prefix: "Contract"},
	"Contract.retryPreset":        {prefix: "RetryPreset"},
	"Endpoint.policyPreset":       {prefix: "RetryPreset"},
	"RetrySchedule.preset":        {prefix: "RetryPreset"},
	"RetryPolicy.preset":          {prefix: "RetryPreset"},
	"EndpointCircuit.state":       {prefix: "Circuit"},
	"Step.afterStatus":            {prefix: "After"},
	"JobAttempt.outcome":          {prefix: "Report"},
	"EndpointAttempt.outcome":     {prefix: "Report"},
	"ReplayUpgrade.status":        {prefix: "Contract"},
	"Approval.answers[]":          {prefix: "ApprovalReason"},
	"Webhook.events[]":            {prefix: "Event"},
	"APIKey.scopes[]":             {prefix: "Scope"},
	"NewAPIKey.scopes[]":          {prefix: "Scope"},
	"RevokedAPIKey.scopes[]":      {prefix: "Scope"},
	"NewWebhook.events[]":         {prefix: "Event"},
	"RotatedWebhook.events[]":     {prefix: "Event"},
}

// goRequestRoutes: the SDK's exported request types (sent as they are, by
// their json tags) and the route whose request schema each mirrors, and
// where in it: the whole body, or the property named second (a list's items
// for a list).
var goRequestRoutes = map[reflect.Type][2]string{
	reflect.TypeFor[ratchet.BeginRequest]():     {"POST /effects/begin"},
	reflect.TypeFor[ratchet.ResolveRequest]():   {"POST /effects/{id}/resolve"},
	reflect.TypeFor[ratchet.JobReport]():        {"POST /jobs/{id}/report"},
	reflect.TypeFor[ratchet.BatchJobReport]():   {"POST /jobs/report", "reports"},
	reflect.TypeFor[ratchet.KeySpec]():          {"POST /keys"},
	reflect.TypeFor[ratchet.ReconcileRequest](): {"POST /reconcile"},
	reflect.TypeFor[ratchet.ReplayOptions]():    {"POST /steps/{id}/replay"},
	reflect.TypeFor[ratchet.ToolRef]():          {"POST /workers/register", "tools"},
}

// goRequestDeliberate: a request schema's fields the SDK's request type
// does not send, each with its reason ("Type.field").
var goRequestDeliberate = map[string]string{}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

// goField is one JSON field of a Go struct as encoding/json reads it.
type goField struct {
	name   string // its JSON name
	goName string
	typ    reflect.Type
	omit   bool // omitempty or omitzero
}

// jsonFields is t's fields as encoding/json names them, an embedded
// struct's (untagged) fields as t's own; fields tagged "-" are in skipped
// by their Go name.
func jsonFields(t reflect.Type) (fields []goField, skipped []string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if tag == "-" {
			skipped = append(skipped, f.Name)
			continue
		}
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				inner, innerSkipped := jsonFields(et)
				fields = append(fields, inner...)
				skipped = append(skipped, innerSkipped...)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		o := strings.Split(opts, ",")
		fields = append(fields, goField{name: name, goName: f.Name, typ: f.Type,
			omit: slices.Contains(o, "omitempty") || slices.Contains(o, "omitzero")})
	}
	return fields, skipped
}

// openAPIDoc is the document the server serves, as JSON reads it.
func openAPIDoc(t *testing.T) map[string]any {
	t.Helper()
	b, err := json.Marshal(httpapi.OpenAPI())
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	return doc
}

// operation is route's operation in doc ("POST /runs").
func operation(t *testing.T, doc map[string]any, route string) map[string]any {
	t.Helper()
	method, path, _ := strings.Cut(route, " ")
	paths := doc["paths"].(map[string]any)
	item, _ := paths["/api/v1"+path].(map[string]any)
	op, _ := item[strings.ToLower(method)].(map[string]any)
	require.NotNil(t, op, "no %s in the OpenAPI document", route)
	return op
}

// bodySchema is the JSON schema of content (a response or request body),
// the route's own where it is one of several (anyOf with the Error
// envelope), nil without one.
func bodySchema(content any) map[string]any {
	c, _ := content.(map[string]any)
	media, _ := c["content"].(map[string]any)
	j, _ := media["application/json"].(map[string]any)
	s, _ := j["schema"].(map[string]any)
	for _, alt := range anySlice(s["anyOf"]) {
		if a, _ := alt.(map[string]any); a != nil && a["$ref"] == nil {
			return a
		}
	}
	return s
}

func anySlice(v any) []any { s, _ := v.([]any); return s }

// answerSchema is route's success answer (its 2xx JSON answers, the same).
func answerSchema(t *testing.T, doc map[string]any, route string) map[string]any {
	t.Helper()
	responses := operation(t, doc, route)["responses"].(map[string]any)
	var statuses []string
	for st := range responses {
		if strings.HasPrefix(st, "2") {
			statuses = append(statuses, st)
		}
	}
	sort.Strings(statuses)
	var first map[string]any
	for _, st := range statuses {
		s := bodySchema(responses[st])
		if s == nil {
			continue
		}
		if first == nil {
			first = s
		}
		require.Equal(t, first, s, "%s's success answers differ", route)
	}
	require.NotNil(t, first, "%s answers no JSON", route)
	return first
}

// schemaTypes is s's JSON types, null aside.
func schemaTypes(s map[string]any) []string {
	var out []string
	switch ty := s["type"].(type) {
	case string:
		out = []string{ty}
	case []any:
		for _, x := range ty {
			out = append(out, x.(string))
		}
	}
	return slices.DeleteFunc(out, func(x string) bool { return x == "null" })
}

// schemaAny is whether s allows any JSON value (raw JSON: true, or {}).
func schemaAny(s any) bool {
	m, ok := s.(map[string]any)
	if !ok {
		return s == true
	}
	for _, k := range []string{"type", "anyOf", "oneOf", "properties", "$ref", "enum"} {
		if _, ok := m[k]; ok {
			return false
		}
	}
	return true
}

// schemaNullable is whether s admits null.
func schemaNullable(s any) bool {
	m, ok := s.(map[string]any)
	if !ok || schemaAny(s) {
		return true
	}
	if ty, _ := m["type"].([]any); slices.Contains(ty, any("null")) || m["type"] == "null" {
		return true
	}
	if slices.Contains(anySlice(m["enum"]), nil) {
		return true
	}
	for _, alt := range append(anySlice(m["anyOf"]), anySlice(m["oneOf"])...) {
		if schemaNullable(alt) {
			return true
		}
	}
	return false
}

// answerComparison compares Go types with the schemas of the server's
// answers.
type answerComparison struct {
	doc        map[string]any
	deliberate map[string]string
	used       map[string]bool // the deliberate differences met
	seen       map[string]bool // type and schema pairs compared
	source     sdkSource
	problems   []string
}

func (c *answerComparison) resolve(s any) any {
	m, ok := s.(map[string]any)
	if !ok {
		return s
	}
	if ref, ok := m["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/schemas/")
		return c.doc["components"].(map[string]any)["schemas"].(map[string]any)[name]
	}
	return m
}

func (c *answerComparison) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// compare adds each way Go type t differs from schema s; at names the place.
func (c *answerComparison) compare(t reflect.Type, s any, at string) {
	s = c.resolve(s)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawType || t.Kind() == reflect.Interface {
		return // any JSON value
	}
	if schemaAny(s) {
		c.problem("%s: any JSON value per the schema, typed %s", at, t)
		return
	}
	m := s.(map[string]any)
	types := schemaTypes(m)
	want := map[reflect.Kind][]string{
		reflect.String: {"string"}, reflect.Bool: {"boolean"},
		reflect.Int: {"integer"}, reflect.Int64: {"integer"}, reflect.Int32: {"integer"},
		reflect.Float64: {"number", "integer"},
		reflect.Slice:   {"array"}, reflect.Map: {"object"}, reflect.Struct: {"object"},
	}[t.Kind()]
	if t == timeType {
		want = []string{"string"}
		if m["format"] != "date-time" {
			c.problem("%s: a time.Time, the schema's format is %v", at, m["format"])
		}
	}
	if len(types) == 0 {
		return // no type named (anyOf...): nothing to compare
	}
	if !slices.ContainsFunc(types, func(x string) bool { return slices.Contains(want, x) }) {
		c.problem("%s: typed %s, the schema says %v", at, t, types)
		return
	}
	switch {
	case t == timeType:
	case t.Kind() == reflect.Slice:
		c.compare(t.Elem(), m["items"], at+"[]")
	case t.Kind() == reflect.Map:
		if m["properties"] != nil {
			c.problem("%s: a map, the schema names its properties", at)
			return
		}
		extra := m["additionalProperties"]
		if extra == nil {
			extra = true
		}
		c.compare(t.Elem(), extra, at+"{}")
	case t.Kind() == reflect.Struct:
		c.compareStruct(t, m, at)
	}
}

// compareStruct compares the fields of struct t with the properties of
// object schema s.
func (c *answerComparison) compareStruct(t reflect.Type, s map[string]any, at string) {
	name := t.Name()
	if name == "" {
		name = at
	}
	b, _ := json.Marshal(s)
	key := t.String() + " " + string(b)
	if c.seen[key] {
		return
	}
	c.seen[key] = true
	// A generic type (GatePage[ratchet.Policy]) is named by its own name.
	name, _, _ = strings.Cut(name, "[")
	props, _ := s["properties"].(map[string]any)
	if props == nil {
		c.problem("%s (%s): a struct, the schema names no properties", at, t)
		return
	}
	required := anySlice(s["required"])
	fields, skipped := jsonFields(t)
	names := map[string]bool{}
	for _, f := range fields {
		names[f.name] = true
		where := name + "." + f.name
		if c.excused(where) {
			continue
		}
		p, ok := props[f.name]
		if !ok {
			c.problem("%s (%s): not in the schema", where, at)
			continue
		}
		p = c.resolve(p)
		nullable := schemaNullable(p)
		always := slices.Contains(required, any(f.name))
		switch k := f.typ.Kind(); {
		case f.typ == rawType || k == reflect.Interface || k == reflect.Slice || k == reflect.Map:
			// nil is null; any JSON value
		case k == reflect.Pointer && !nullable && always:
			if !c.excused(where + " pointer") {
				c.problem("%s (%s): a pointer, the schema says always there and never null", where, at)
			}
		case k != reflect.Pointer && nullable:
			c.problem("%s (%s): a %s, the schema allows null", where, at, f.typ)
		}
		if f.omit == always && !c.excused(where+" omitempty") {
			if always {
				c.problem("%s (%s): omitempty, the schema requires it", where, at)
			} else {
				c.problem("%s (%s): no omitempty, the schema does not require it", where, at)
			}
		}
		pm, _ := p.(map[string]any)
		if f.typ.Kind() == reflect.Map && pm["properties"] != nil && c.excused(where+" map") {
			continue
		}
		if pm["enum"] != nil {
			c.compareEnum(where, anySlice(pm["enum"]))
		}
		if items, _ := c.resolve(pm["items"]).(map[string]any); items["enum"] != nil {
			c.compareEnum(where+"[]", anySlice(items["enum"])) // a list of enum values
		}
		c.compare(f.typ, p, where)
	}
	for _, goName := range skipped {
		if !c.excused(name + ".-" + goName) {
			c.problem("%s.%s (%s): the SDK's own field (json:\"-\"), with no stated reason", name, goName, at)
		}
	}
	for prop := range props {
		if !names[prop] && !c.excused(name+"."+prop) {
			c.problem("%s.%s (%s): in the schema, not in the SDK's type", name, prop, at)
		}
	}
}

// compareEnum compares a field's enum (null aside) with the values of the
// SDK's constants for it (goEnums): every field with an enum has them.
func (c *answerComparison) compareEnum(where string, enum []any) {
	var documented []string
	for _, v := range enum {
		if v != nil {
			documented = append(documented, v.(string))
		}
	}
	sort.Strings(documented)
	e, ok := goEnums[where]
	if !ok {
		c.problem("%s: an enum %v with no constants of the SDK's (goEnums)", where, documented)
		return
	}
	c.used[where+" enum"] = true
	var declared []string
	for name, v := range c.source.constants {
		if constantPrefix(name) == e.prefix && (!e.superset || slices.Contains(documented, v)) {
			declared = append(declared, v)
		}
	}
	sort.Strings(declared)
	if !slices.Equal(declared, documented) {
		c.problem("%s: the SDK's %s* constants are %v, the schema's enum is %v", where, e.prefix, declared, documented)
	}
}

// constantPrefix is the longest prefix of goEnums that constant name
// begins with ("ApprovalReason" for ApprovalReasonCircuitOpen, not
// "Approval"), "" for none.
func constantPrefix(name string) string {
	longest := ""
	for _, e := range goEnums {
		if strings.HasPrefix(name, e.prefix) && len(e.prefix) > len(longest) {
			longest = e.prefix
		}
	}
	return longest
}

// excused is whether where is a deliberate difference, and notes it met.
func (c *answerComparison) excused(where string) bool {
	_, ok := c.deliberate[where]
	if ok {
		c.used[where] = true
	}
	return ok
}

func newAnswerComparison(t *testing.T, deliberate map[string]string) *answerComparison {
	return &answerComparison{doc: openAPIDoc(t), deliberate: deliberate, used: map[string]bool{},
		seen: map[string]bool{}, source: readSDKSource(t)}
}

// sdkSource is what reflection cannot see of the Go SDK, read from its
// source (sdk/go): it names an enum's values as untyped constants.
type sdkSource struct {
	constants map[string]string // exported string constants: name → value
}

func readSDKSource(t *testing.T) sdkSource {
	t.Helper()
	files, err := filepath.Glob("../../sdk/go/*.go")
	require.NoError(t, err)
	src := sdkSource{constants: map[string]string{}}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
		require.NoError(t, err)
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, spec := range g.Specs {
				spec, ok := spec.(*ast.ValueSpec)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for i, name := range spec.Names {
					lit, ok := valueAt(spec.Values, i).(*ast.BasicLit)
					if name.IsExported() && ok && lit.Kind == token.STRING {
						src.constants[name.Name], err = strconv.Unquote(lit.Value)
						require.NoError(t, err)
					}
				}
			}
		}
	}
	require.Equal(t, "execute", src.constants["DecisionExecute"], "the SDK's constants were not read")
	return src
}

func valueAt(values []ast.Expr, i int) ast.Expr {
	if i < len(values) {
		return values[i]
	}
	return nil
}

// goSDKAnswers is each Client method that answers, by name, with the type
// of its answer.
func goSDKAnswers() map[string]reflect.Type {
	errType := reflect.TypeFor[error]()
	out := map[string]reflect.Type{}
	ct := reflect.TypeFor[*ratchet.Client]()
	for i := range ct.NumMethod() {
		m := ct.Method(i)
		switch n := m.Type.NumOut(); {
		case n == 0, n == 1 && m.Type.Out(0) == errType:
			// no answer
		default:
			out[m.Name] = m.Type.Out(0)
		}
	}
	return out
}

// Every Client method's answer is what its route's schema says.
func TestGoSDKAnswerTypesMatchTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	answers := goSDKAnswers()
	require.Greater(t, len(answers), 60)
	var unmapped []string
	for name, answer := range answers {
		_, mapped := goAnswerRoutes[name]
		_, own := goClientSide[name]
		if !mapped && !own {
			unmapped = append(unmapped, fmt.Sprintf("Client.%s (%s)", name, answer))
		}
	}
	sort.Strings(unmapped)
	require.Empty(t, unmapped, "methods that answer with no route in this test (goAnswerRoutes), "+
		"nor a reason in goClientSide")
	for name := range goAnswerRoutes {
		_, ok := answers[name]
		require.True(t, ok, "Client.%s is mapped but answers nothing", name)
	}
	for name := range goClientSide {
		_, ok := answers[name]
		require.True(t, ok, "Client.%s is listed but answers nothing", name)
	}

	c := newAnswerComparison(t, goDeliberate)
	for _, name := range slices.Sorted(maps.Keys(goAnswerRoutes)) {
		route, field := goAnswerRoutes[name][0], goAnswerRoutes[name][1]
		s := answerSchema(t, c.doc, route)
		if name == "Begin" {
			s = beginAnswerSchema(t, c.doc, s)
		}
		if field != "" {
			props, _ := s["properties"].(map[string]any)
			require.Contains(t, props, field, "%s answers no %s", route, field)
			require.Contains(t, anySlice(s["required"]), any(field), "%s may leave out %s", route, field)
			s = props[field].(map[string]any)
			if k := answers[name].Kind(); schemaNullable(s) && k != reflect.Pointer && k != reflect.Slice &&
				k != reflect.Map && answers[name] != rawType {
				c.problem("Client.%s: answers a %s, the schema of %s allows null", name, answers[name], field)
			}
		}
		c.compare(answers[name], s, "Client."+name)
	}
	// A webhook delivery's body.
	event := c.doc["components"].(map[string]any)["schemas"].(map[string]any)["WebhookEvent"]
	c.compare(reflect.TypeFor[ratchet.WebhookEvent](), event, "VerifyWebhook")

	sort.Strings(c.problems)
	require.Empty(t, c.problems, "the Go SDK's answer types differ from the OpenAPI document")
	for where, why := range goDeliberate {
		require.True(t, c.used[where], "%s (%s) is listed as deliberate but was not met", where, why)
	}
	for where, e := range goEnums {
		require.True(t, c.used[where+" enum"], "%s (%s*) is listed in goEnums but has no enum", where, e.prefix)
	}
}

// beginAnswerSchema is begin's answer as the SDK reads it: its 200
// decision, with the 403 denial's error beside the decision fields (not
// required: only a denial has it).
func beginAnswerSchema(t *testing.T, doc map[string]any, decision map[string]any) map[string]any {
	t.Helper()
	denial := bodySchema(operation(t, doc, "POST /effects/begin")["responses"].(map[string]any)["403"])
	props, _ := denial["properties"].(map[string]any)
	require.NotNil(t, props["error"], "no denial body beside the error envelope of begin's 403")
	merged := map[string]any{}
	for k, v := range decision {
		merged[k] = v
	}
	p := map[string]any{"error": props["error"]}
	for k, v := range decision["properties"].(map[string]any) {
		p[k] = v
	}
	merged["properties"] = p
	return merged
}

// The SDK's exported request types send the fields their route's request
// schema names, and no other.
func TestGoSDKRequestTypesMatchTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	doc := openAPIDoc(t)
	var problems []string
	used := map[string]bool{}
	for rt, route := range goRequestRoutes {
		s := bodySchema(operation(t, doc, route[0])["requestBody"])
		require.NotNil(t, s, "%s takes no JSON body", route[0])
		if route[1] != "" {
			s = s["properties"].(map[string]any)[route[1]].(map[string]any)
			if items, ok := s["items"].(map[string]any); ok {
				s = items // a list of them
			}
		}
		problems = append(problems, requestDrift(rt, s, route[0], goRequestDeliberate, used)...)
	}
	sort.Strings(problems)
	require.Empty(t, problems, "the Go SDK's request types differ from the OpenAPI document")
	for where, why := range goRequestDeliberate {
		require.True(t, used[where], "%s (%s) is listed as deliberate but was not met", where, why)
	}
}

// requestDrift is each way request type rt's fields (by json tag, at any
// depth) differ from request schema s by name: a field sent that s does
// not name, or one s names that rt cannot send, unless deliberate lists it
// ("Type.field"; used notes those met).
func requestDrift(rt reflect.Type, s any, at string, deliberate map[string]string, used map[string]bool) []string {
	m, _ := s.(map[string]any)
	for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice {
		if rt.Kind() == reflect.Slice {
			m, _ = m["items"].(map[string]any)
		}
		rt = rt.Elem()
	}
	if rt.Kind() != reflect.Struct || rt == timeType || m == nil {
		return nil
	}
	var problems []string
	props, _ := m["properties"].(map[string]any)
	fields, _ := jsonFields(rt)
	names := map[string]bool{}
	for _, f := range fields {
		names[f.name] = true
		if p, ok := props[f.name]; ok {
			problems = append(problems, requestDrift(f.typ, p, at, deliberate, used)...)
		} else {
			problems = append(problems, fmt.Sprintf("%s.%s (%s): sent, not in the request schema", rt.Name(), f.name, at))
		}
	}
	for prop := range props {
		where := rt.Name() + "." + prop
		if _, ok := deliberate[where]; ok {
			used[where] = true
		} else if !names[prop] {
			problems = append(problems, fmt.Sprintf("%s (%s): in the request schema, not in the SDK's type", where, at))
		}
	}
	return problems
}

type driftInner struct {
	A int `json:"a"`
}

type driftOuter struct {
	ID    int          `json:"id"`
	Note  string       `json:"note"`
	Extra int          `json:"extra"`
	Inner *driftInner  `json:"inner"`
	Items []driftInner `json:"items,omitempty"`
	State string       `json:"state"`
	Own   string       `json:"-"`
}

// The comparisons report each kind of drift: a field missing, one the
// server does not send, a pointer for a field always there, a value for
// one that may be null, omitempty where the field is always there or none
// where it may be absent, a JSON type of another kind, an enum with no
// constants, an SDK field of its own with no reason; a request
// field the route does not take, and one it takes that is not sent.
func TestGoSDKAnswerComparisonCatchesDrift(t *testing.T) {
	t.Parallel()
	var schema map[string]any
	require.NoError(t, json.Unmarshal([]byte(`{"type": "object", "required": ["id", "inner", "items", "state"],
		"properties": {"id": {"type": "string"}, "note": {"type": ["null", "string"]}, "gone": {"type": "integer"},
		"inner": {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}},
		"items": {"type": "array", "items": {"type": "object", "required": ["a", "b"],
			"properties": {"a": {"type": "integer"}, "b": {}}}},
		"state": {"type": "string", "enum": ["the one", "the other", "a third"]}}}`), &schema))
	c := newAnswerComparison(t, map[string]string{})
	c.compare(reflect.TypeFor[driftOuter](), schema, "x")
	require.ElementsMatch(t, []string{
		"driftOuter.id: typed int, the schema says [string]",
		"driftOuter.note (x): a string, the schema allows null",
		"driftOuter.note (x): no omitempty, the schema does not require it",
		"driftOuter.extra (x): not in the schema",
		"driftOuter.inner (x): a pointer, the schema says always there and never null",
		"driftOuter.items (x): omitempty, the schema requires it",
		"driftInner.b (driftOuter.items[]): in the schema, not in the SDK's type",
		"driftOuter.state: an enum [a third the one the other] with no constants of the SDK's (goEnums)",
		"driftOuter.Own (x): the SDK's own field (json:\"-\"), with no stated reason",
		"driftOuter.gone (x): in the schema, not in the SDK's type",
	}, c.problems)

	used := map[string]bool{}
	require.ElementsMatch(t, []string{
		"driftOuter.extra (r): sent, not in the request schema",
		"driftOuter.gone (r): in the request schema, not in the SDK's type",
		"driftInner.b (r): in the request schema, not in the SDK's type",
	}, requestDrift(reflect.TypeFor[driftOuter](), schema, "r", map[string]string{"driftOuter.note": "why"}, used))
	require.True(t, used["driftOuter.note"])

	// A body as sent: a field the schema does not name, at any depth.
	sent := map[string]bool{}
	require.ElementsMatch(t, []string{"R x: sent, not in the request schema", "R items[].c: sent, not in the request schema"},
		sentDrift("R", "", map[string]any{"id": "1", "x": 1, "items": []any{map[string]any{"a": 1, "c": 2}}}, schema, sent))
	require.Equal(t, map[string]bool{"R id": true, "R items": true, "R items[].a": true}, sent)
	require.ElementsMatch(t, []string{"id", "note", "gone", "inner", "inner.a", "items", "items[].a", "items[].b", "state"},
		schemaFieldPaths("", schema))
}

// bodyRecorder answers every request {} and keeps what was sent: the
// route's path and its JSON body.
type bodyRecorder struct {
	mu   sync.Mutex
	sent []sentBody
}

type sentBody struct {
	method, path string
	body         any
}

func (r *bodyRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var body any
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		if len(b) > 0 {
			if err := json.Unmarshal(b, &body); err != nil {
				return nil, err
			}
		}
	}
	r.mu.Lock()
	r.sent = append(r.sent, sentBody{req.Method, strings.TrimPrefix(req.URL.Path, "/api/v1"), body})
	r.mu.Unlock()
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

// goRequestFieldsNotSent: request schema fields no Client method sends,
// each with its reason ("route field", a nested one by its path).
var goRequestFieldsNotSent = map[string]string{
	"POST /tools/{name}/contracts retryPolicy.preset": "ContractSpec.RetryPreset is sent as retryPreset; a " +
		"CUSTOM schedule's own preset could only repeat it (ContractSpec's doc says it is not sent)",
}

// goCallersFields: the routes whose body's fields are the caller's, a
// PolicyUpdate map sent as it is (the SDK adds only the expected version):
// the fields the caller does not set here are not reported unsent.
var goCallersFields = map[string]string{
	"PUT /policies/{effect_type}": "UpdateEffectPolicy's PolicyUpdate",
	"POST /endpoints":             "CreateEndpoint's PolicyUpdate",
	"PUT /endpoints/{id}/policy":  "UpdateEndpointPolicy's PolicyUpdate",
}

// What each Client method sends, every option set, names only fields its
// route's request schema names (the SDK's unexported bodies included, which
// TestGoSDKRequestTypesMatchTheOpenAPIDocument cannot reach), and every
// field a route takes is sent by some method, or listed with a reason.
func TestGoSDKRequestBodiesMatchTheOpenAPIDocument(t *testing.T) {
	t.Parallel()
	doc := openAPIDoc(t)
	rec := &bodyRecorder{}
	c, err := ratchet.NewClient(ratchet.Config{BaseURL: "http://ratchet.test", APIKey: "rk_test",
		HTTPClient: &http.Client{Transport: rec}})
	require.NoError(t, err)
	ctx := context.Background()
	version, attempt, seconds := int64(3), 2, 90*time.Second
	url, disabled := "https://example.com/hook", true
	effectPolicy, endpointPolicy := ratchet.PolicyUpdate{"max_attempts": 3}, ratchet.PolicyUpdate{"maxAttempts": 3}
	report := ratchet.JobReport{LeaseToken: "lt", Status: ratchet.ReportFailed, Output: json.RawMessage(`{}`),
		Error: &ratchet.JobError{Message: "m", Retryable: true, RetryAfterMs: ratchet.Micros(2000)}}
	calls := []func() error{
		func() error {
			_, err := c.StartRun(ctx, "run", ratchet.WithIdempotencyKey("k"), ratchet.WithBudgetMicros(5))
			return err
		},
		func() error {
			_, err := c.Enqueue(ctx, "r", map[string]int{"a": 1}, ratchet.EnqueueOptions{Name: "n", Version: "1",
				Endpoint: "e", IdempotencyKey: "k", Timeout: time.Second, MaxAttempts: 2, ContractVersion: 1,
				AfterStepID: "s", AfterStatus: ratchet.AfterSucceeded, Delay: time.Second})
			return err
		},
		func() error { _, err := c.FinishRun(ctx, "r"); return err },
		func() error { _, err := c.CancelStep(ctx, "s"); return err },
		func() error {
			_, err := c.Replay(ctx, "s", ratchet.ReplayOptions{AcknowledgeDuplicateRisk: true, MaxAttempts: 1,
				Reason: "r", TargetContractVersion: 2, ExpectedHandlerVersion: "1", AcknowledgeVersionChange: true,
				ExpectedAttempt: &attempt})
			return err
		},
		func() error {
			_, err := c.Begin(ctx, ratchet.BeginRequest{EffectType: "e", IdempotencyKey: "k", Payload: 1,
				CostMicros: ratchet.Micros(1), Dimensions: map[string]string{"d": "v"}, RunID: "r", GroupID: "g",
				Compensation: &ratchet.Compensation{EffectType: "u", Payload: 1}, CompensatesEffectID: "x",
				LeaseSeconds: 5, RequestID: "0123456789abcdef"})
			return err
		},
		func() error { _, err := c.ReportEffect(ctx, "e", "lt", ratchet.OutcomeSucceeded, 1); return err },
		func() error { _, err := c.HeartbeatEffect(ctx, "e", "lt"); return err },
		func() error {
			_, err := c.ResolveEffect(ctx, "e", ratchet.ResolveRequest{Outcome: ratchet.OutcomeSucceeded, Result: 1, Note: "n",
				Attempt: 1})
			return err
		},
		func() error { _, err := c.UpdateEffectPolicy(ctx, "e", &version, effectPolicy); return err },
		func() error { _, err := c.Approve(ctx, "a", "n"); return err },
		func() error { _, err := c.Reject(ctx, "a", "n"); return err },
		func() error { _, err := c.OpenCircuit(ctx, "e", ratchet.BreakerDeny, "r"); return err },
		func() error { _, err := c.CloseCircuit(ctx, "e"); return err },
		func() error { _, err := c.EmergencyStop(ctx, ratchet.BreakerDeny, "r"); return err },
		func() error { _, err := c.ReleaseEmergencyStop(ctx); return err },
		func() error { _, err := c.CreateGroupWithKey(ctx, "g", "k"); return err },
		func() error { _, err := c.CommitGroup(ctx, "g"); return err },
		func() error { _, err := c.UnwindGroup(ctx, "g"); return err },
		func() error {
			_, err := c.CreateWebhookWithKey(ctx, url, []string{ratchet.EventRunFinished}, "k")
			return err
		},
		func() error {
			_, err := c.UpdateWebhook(ctx, "w", ratchet.WebhookUpdate{URL: &url, Events: []string{ratchet.EventRunFinished}, Disabled: &disabled})
			return err
		},
		func() error { _, err := c.DeleteWebhook(ctx, "w"); return err },
		func() error { _, err := c.RetryWebhookDeliveriesWithKey(ctx, "w", []string{"d"}, "k"); return err },
		func() error {
			_, err := c.RotateWebhookSecret(ctx, "w", ratchet.RotateSecretOptions{PreviousExpiresIn: &seconds,
				ReplacePrevious: true, IdempotencyKey: "k"})
			return err
		},
		func() error {
			_, err := c.CreateKeyWithKey(ctx, ratchet.KeySpec{Name: "n", Preset: "WORKER", Scopes: []string{"jobs:work"},
				Tools: []string{"t@1"}, DailySpendCeilingMicros: ratchet.Micros(1), RateLimitPerMinute: &attempt}, "k")
			return err
		},
		func() error { _, err := c.RevokeKey(ctx, "k"); return err },
		func() error { _, err := c.CreateEndpoint(ctx, "e", endpointPolicy); return err },
		func() error { _, err := c.UpdateEndpointPolicy(ctx, "e", 1, endpointPolicy); return err },
		func() error { _, err := c.PauseEndpoint(ctx, "e"); return err },
		func() error { _, err := c.ResumeEndpoint(ctx, "e"); return err },
		func() error { _, err := c.CloseEndpointCircuit(ctx, "e"); return err },
		func() error {
			_, err := c.PublishContract(ctx, "t", ratchet.ContractSpec{HandlerVersion: "1",
				InputSchema: json.RawMessage(`{}`), OutputSchema: json.RawMessage(`{}`), Timeout: time.Second,
				RetryPreset: "CUSTOM", RetryPolicy: &ratchet.RetrySchedule{MaxAttempts: 2, InitialDelayMs: 1,
					Multiplier: 2, MaxDelayMs: 2, JitterPercent: 1}, Status: ratchet.ContractActive, IdempotencyKey: "k"})
			return err
		},
		func() error { _, err := c.TestToolWithKey(ctx, "t", "1", 1, "k"); return err },
		func() error {
			_, err := c.Reconcile(ctx, ratchet.ReconcileRequest{EffectType: "e", From: time.Now(), To: time.Now(),
				Records: []ratchet.ReconcileRecord{{IdempotencyKey: "k", Status: ratchet.VendorSucceeded,
					AmountMicros: ratchet.Micros(1)}}, IdempotencyKey: "k"})
			return err
		},
		func() error {
			_, err := c.RegisterWorker(ctx, []ratchet.ToolRef{{Name: "t", Version: "1"}})
			return err
		},
		func() error { _, err := c.ClaimKeyed(ctx, "w", "c", 1, 1); return err },
		func() error { _, err := c.HeartbeatJob(ctx, "j", "lt"); return err },
		func() error { _, err := c.ReportJob(ctx, "j", report); return err },
		func() error {
			_, err := c.ReportJobs(ctx, []ratchet.BatchJobReport{{JobID: "j", JobReport: report}})
			return err
		},
	}
	for _, call := range calls {
		// Only the request matters: an answer of {} may not satisfy the
		// method (a batch report's results), and a call that sent nothing
		// leaves its route uncalled, which is reported below.
		_ = call()
	}

	var problems []string
	sentNames := map[string]bool{} // "route field" at any depth
	bodied := map[string]bool{}    // the routes called that take a body
	for _, s := range rec.sent {
		route := routeOf(t, doc, s.method, s.path)
		schema := bodySchema(operation(t, doc, route)["requestBody"])
		if schema == nil {
			require.Nil(t, s.body, "%s takes no body", route)
			continue
		}
		bodied[route] = true
		problems = append(problems, sentDrift(route, "", s.body, schema, sentNames)...)
	}
	// Every field of each route's request schema was sent by some call.
	for route := range bodied {
		if _, ok := goCallersFields[route]; ok {
			continue
		}
		schema := bodySchema(operation(t, doc, route)["requestBody"])
		for _, field := range schemaFieldPaths("", schema) {
			where := route + " " + field
			if _, ok := goRequestFieldsNotSent[where]; !ok && !sentNames[where] {
				problems = append(problems, where+": taken by the route, sent by no method")
			}
		}
	}
	for route, why := range goCallersFields {
		require.True(t, bodied[route], "%s (%s) is listed, but no call sent it a body", route, why)
	}
	for where, why := range goRequestFieldsNotSent {
		require.False(t, sentNames[where], "%s (%s) is listed as not sent, but is", where, why)
	}
	// Every method of goAnswerRoutes whose route takes a body was called.
	for name, r := range goAnswerRoutes {
		if bodySchema(operation(t, doc, r[0])["requestBody"]) != nil && !bodied[r[0]] {
			problems = append(problems, "Client."+name+" ("+r[0]+"): takes a body, not called here")
		}
	}
	sort.Strings(problems)
	require.Empty(t, slices.Compact(problems), "what the Go SDK sends differs from the OpenAPI document")
}

// routeOf is the route ("POST /runs/{id}/steps") of method and path.
func routeOf(t *testing.T, doc map[string]any, method, path string) string {
	t.Helper()
	got := strings.Split(path, "/")
	for template, item := range doc["paths"].(map[string]any) {
		want := strings.Split(strings.TrimPrefix(template, "/api/v1"), "/")
		if len(want) != len(got) || item.(map[string]any)[strings.ToLower(method)] == nil {
			continue
		}
		match := true
		for i := range want {
			if want[i] != got[i] && !strings.HasPrefix(want[i], "{") {
				match = false
				break
			}
		}
		if match {
			return method + " " + strings.TrimPrefix(template, "/api/v1")
		}
	}
	t.Fatalf("no route for %s %s", method, path)
	return ""
}

// sentDrift is each field of body (at path, within route's request)
// schema s does not name, and each string sent that its field's enum does
// not hold; sent notes each field sent, by route and path.
func sentDrift(route, path string, body any, s any, sent map[string]bool) []string {
	m, _ := s.(map[string]any)
	var problems []string
	switch v := body.(type) {
	case map[string]any:
		props, _ := m["properties"].(map[string]any)
		if props == nil {
			return nil // a map (dimensions), or any JSON (a payload)
		}
		for k, x := range v {
			p, ok := props[k]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s %s%s: sent, not in the request schema", route, path, k))
				continue
			}
			sent[route+" "+path+k] = true
			problems = append(problems, sentDrift(route, path+k+".", x, p, sent)...)
		}
	case []any:
		for _, x := range v {
			problems = append(problems, sentDrift(route, strings.TrimSuffix(path, ".")+"[].", x, m["items"], sent)...)
		}
	case string:
		if enum := anySlice(m["enum"]); enum != nil && !slices.Contains(enum, any(v)) {
			problems = append(problems, fmt.Sprintf("%s %s=%s: not one of the field's values %v", route,
				strings.TrimSuffix(path, "."), v, enum))
		}
	}
	return problems
}

// schemaFieldPaths is every property of request schema s, nested ones by
// their path ("reports[].leaseToken").
func schemaFieldPaths(path string, s any) []string {
	m, _ := s.(map[string]any)
	if items, ok := m["items"]; ok {
		return schemaFieldPaths(strings.TrimSuffix(path, ".")+"[].", items)
	}
	var out []string
	props, _ := m["properties"].(map[string]any)
	for k, p := range props {
		out = append(out, path+k)
		out = append(out, schemaFieldPaths(path+k+".", p)...)
	}
	return out
}

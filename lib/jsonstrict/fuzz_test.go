package jsonstrict_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/jsonstrict"
	"github.com/getratchet/ratchet/lib/mcpserver"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// fuzzTarget is one request type a route (or an MCP tool) decodes.
type fuzzTarget struct {
	name    string
	new     func() any // a pointer to a zero request
	numbers bool       // decoded with DecodeNumbers (the MCP tools)
}

func target[T any](name string, numbers bool) fuzzTarget {
	return fuzzTarget{name: name, new: func() any { return new(T) }, numbers: numbers}
}

// fuzzTargets are the request bodies of every route that decodes one, and
// two MCP tool inputs. The index is the fuzz input's first argument.
var fuzzTargets = []fuzzTarget{
	target[gate.BeginRequest]("gate.BeginRequest", false),
	target[gate.ReportRequest]("gate.ReportRequest", false),
	target[gate.HeartbeatRequest]("gate.HeartbeatRequest", false),
	target[gate.ResolveRequest]("gate.ResolveRequest", false),
	target[gate.PutPolicyRequest]("gate.PutPolicyRequest", false),
	target[gate.DecideRequest]("gate.DecideRequest", false),
	target[gate.OpenCircuitRequest]("gate.OpenCircuitRequest", false),
	target[gate.CreateGroupRequest]("gate.CreateGroupRequest", false),
	target[gate.ReconcileRequest]("gate.ReconcileRequest", false),
	target[jobs.PublishContractRequest]("jobs.PublishContractRequest", false),
	target[jobs.ToolTestRequest]("jobs.ToolTestRequest", false),
	target[jobs.ReplayRequest]("jobs.ReplayRequest", false),
	target[jobs.CreateRunRequest]("jobs.CreateRunRequest", false),
	target[jobs.EnqueueRequest]("jobs.EnqueueRequest", false),
	target[jobs.RegisterRequest]("jobs.RegisterRequest", false),
	target[jobs.ClaimRequest]("jobs.ClaimRequest", false),
	target[jobs.HeartbeatRequest]("jobs.HeartbeatRequest", false),
	target[jobs.ReportRequest]("jobs.ReportRequest", false),
	target[jobs.BatchReportRequest]("jobs.BatchReportRequest", false),
	target[jobs.CreateEndpointRequest]("jobs.CreateEndpointRequest", false),
	target[jobs.UpdatePolicyRequest]("jobs.UpdatePolicyRequest", false),
	target[auth.CreateKeyRequest]("auth.CreateKeyRequest", false),
	target[webhooks.CreateRequest]("webhooks.CreateRequest", false),
	target[struct {
		Name string `json:"name"`
	}]("httpapi.SignupRequest", false),
	target[struct{}]("empty body", false),
	target[mcpserver.BeginInput]("mcpserver.BeginInput", true),
	target[mcpserver.ListEffectsInput]("mcpserver.ListEffectsInput", true),
}

// knownMessage is every message the decoder may give a field; anything else
// (a custom decoder's text) may echo input.
var knownMessage = regexp.MustCompile(`^(` + strings.Join([]string{
	`must be UTF-8 \(JSON text is\)`,
	`is a number beyond the range of a 64-bit float`,
	`is a number with an exponent beyond ±999`,
	`is a number of more than \d+ characters`,
	`is repeated: an object may name each key once`,
	`is not a known field( \(field names are case-sensitive\))?`,
	`must not contain NUL characters \(\\u0000\)`,
	`must not contain a lone UTF-16 surrogate \(\\u[0-9a-f]{4}\)`,
	`must be a single JSON object`,
	`is not valid JSON \(offset \d+\)`,
	`is not valid JSON \(unexpected end\)`,
	`nests arrays and objects more than 10000 levels deep`,
	`must be (a string|a boolean|an integer|a number|an array|an object)`,
	`must be an integer from [-0-9^]+ to [-0-9^]+( \(micros of USD\))?`, // a type's, a tag's or money.Rule
}, "|") + `)$`)

func FuzzDecode(f *testing.F) {
	seeds := []string{
		``, `{}`, `null`, `[]`, `{"a":1}`, `{} {}`, `{}]`,
		`{"effect_type":"email.send","idempotency_key":"k","payload":{"b":1,"a":[1.0,"x"]},"cost_micros":5,"dimensions":{"to":"a"}}`,
		`{"effect_type":"e","payload":{"x":1,"x":2}}`,
		`{"EFFECT_TYPE":"e"}`,
		`{"cost_micros":1.0}`, `{"cost_micros":1e3}`, `{"cost_micros":9223372036854775808}`,
		`{"payload":1e400}`, `{"payload":"\u0000"}`, `{"payload":"\ud800"}`, `{"payload":"\ud83d\ude00"}`,
		`{"dimensions":{"to":5}}`,
		`{"mode":null,"max_attempts":3,"dimension_limits":{"to":{"max":1}},"required_dimensions":["to"]}`,
		`{"records":[{"idempotency_key":"k","status":"ok","amount_micros":1},{"amount_micros":"x"}]}`,
		`{"tools":[{"name":"a","version":"1"},{"name":1}]}`,
		`{"reports":[{"jobId":"j","error":{"message":"m","retryAfterMs":1.5}}]}`,
		`{"expectedVersion":1,"preset":"CUSTOM","maxAttempts":3,"multiplier":2.0}`,
		`{"retryPolicy":{"preset":"CUSTOM","maxAttempts":"x"},"inputSchema":{},"outputSchema":{}}`,
		`{"name":"k","scopes":["effects:begin"],"rate_limit_per_minute":-1}`,
		`{"url":"https://x","events":["a",1]}`,
		`{"limit":1.5,"cursor":"c","state":"leased"}`,
		"{\"name\":\"\xff\"}",
		`{"a":{"b":{"c":[[[{"d":1}]]]}}}`,
	}
	for i, s := range seeds {
		f.Add(uint8(i%len(fuzzTargets)), []byte(s))
		f.Add(uint8((i*7+3)%len(fuzzTargets)), []byte(s))
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		tg := fuzzTargets[int(which)%len(fuzzTargets)]
		decode := jsonstrict.Decode
		if tg.numbers {
			decode = jsonstrict.DecodeNumbers
		}
		dst := tg.new()
		err := decode(body, dst)
		if err != nil {
			checkRefusal(t, tg.name, body, err)
			return
		}
		checkAccepted(t, tg.name, body)
		// What was accepted re-encodes to a body that is accepted again
		// and decodes to the same value.
		m1, merr := json.Marshal(dst)
		if merr != nil {
			t.Fatalf("%s: accepted %q but cannot re-encode it: %v", tg.name, body, merr)
		}
		again := tg.new()
		if err := decode(m1, again); err != nil {
			t.Fatalf("%s: accepted %q, its re-encoding %s refused: %v", tg.name, body, m1, err)
		}
		m2, _ := json.Marshal(again)
		if !bytes.Equal(m1, m2) {
			t.Fatalf("%s: %q decodes to %s, which decodes to %s", tg.name, body, m1, m2)
		}
	})
}

// checkRefusal: a 400 invalid_request whose every field is "body" or a
// path that names a node of the body, with one of the decoder's messages.
func checkRefusal(t *testing.T, name string, body []byte, err error) {
	ae, ok := apierr.As(err)
	if !ok {
		t.Fatalf("%s: %q: not an apierr: %T %v", name, body, err, err)
	}
	if ae.Code != apierr.CodeInvalidRequest || ae.Status != 400 {
		t.Fatalf("%s: %q: %d %s", name, body, ae.Status, ae.Code)
	}
	problems, ok := ae.Detail["validation"].([]apierr.FieldError)
	if !ok || len(problems) == 0 || len(problems) > 20 {
		t.Fatalf("%s: %q: validation %#v", name, body, ae.Detail["validation"])
	}
	tree, treeErr := parseTree(body)
	for _, p := range problems {
		if !knownMessage.MatchString(p.Message) {
			t.Fatalf("%s: %q: unexpected message %q at %q", name, body, p.Message, p.Field)
		}
		if p.Field == "body" {
			continue
		}
		// An empty key is named "" (its path from the root), as the body
		// spells it: resolves accepts it.
		if treeErr != nil {
			t.Fatalf("%s: %q: field %q named in a body that is not JSON (%v)", name, body, p.Field, treeErr)
		}
		if !resolves(tree, p.Field) {
			t.Fatalf("%s: %q: field %q (%s) names no node of the body; problems %#v", name, body, p.Field, p.Message, problems)
		}
	}
}

// member is one key of an object and its value, in document order.
type member struct {
	key   string
	value any
}

// parseTree reads body (empty: {}) as one JSON value, numbers as written,
// an object as its members in order, a repeated key each time it occurs
// (the value of its first occurrence may hold the problem a refusal names).
func parseTree(body []byte) (any, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return []member{}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var read func() (any, error)
	read = func() (any, error) {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		d, ok := tok.(json.Delim)
		if !ok {
			return tok, nil
		}
		if d == '[' {
			arr := []any{}
			for dec.More() {
				v, err := read()
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token()
			return arr, err
		}
		obj := []member{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := read()
			if err != nil {
				return nil, err
			}
			obj = append(obj, member{k.(string), v})
		}
		_, err = dec.Token()
		return obj, err
	}
	return read()
}

// resolves reports whether dotted path names a node of v (keys may hold
// dots themselves, so each split is tried).
func resolves(v any, path string) bool {
	switch n := v.(type) {
	case []member:
		for _, m := range n {
			if path == m.key {
				return true
			}
			if rest, ok := strings.CutPrefix(path, m.key+"."); ok && resolves(m.value, rest) {
				return true
			}
		}
	case []any:
		seg, rest, more := strings.Cut(path, ".")
		i, err := strconv.Atoi(seg)
		if err != nil || i < 0 || i >= len(n) || strconv.Itoa(i) != seg {
			return false
		}
		return !more || resolves(n[i], rest)
	}
	return false
}

// checkAccepted re-checks, independently of jsonstrict, what an accepted
// body must not hold: a repeated key, a NUL, a lone surrogate or invalid
// UTF-8 (both read as U+FFFD), a number beyond float64, trailing data.
func checkAccepted(t *testing.T, name string, body []byte) {
	if len(bytes.TrimSpace(body)) == 0 {
		return
	}
	if !utf8.Valid(body) {
		t.Fatalf("%s: accepted invalid UTF-8 %q", name, body)
	}
	literalFFFD := bytes.Contains(body, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`))
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		obj       bool
		seen      map[string]bool
		expectKey bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: accepted %q which does not tokenize: %v", name, body, err)
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.expectKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				continue
			}
			k := tok.(string)
			checkString(t, name, body, k, literalFFFD)
			if top.seen[k] {
				t.Fatalf("%s: accepted repeated key %q in %q", name, k, body)
			}
			top.seen[k] = true
			top.expectKey = false
			continue
		}
		// A value (or an array's end).
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				stack = append(stack, &frame{obj: true, seen: map[string]bool{}, expectKey: true})
			case '[':
				stack = append(stack, &frame{})
			default:
				stack = stack[:len(stack)-1]
			}
			if v == '{' || v == '[' {
				if top != nil && top.obj {
					top.expectKey = true // set now; the child's frame is on top
				}
				continue
			}
		case string:
			checkString(t, name, body, v, literalFFFD)
		case json.Number:
			if fl, err := strconv.ParseFloat(string(v), 64); err != nil && math.IsInf(fl, 0) {
				t.Fatalf("%s: accepted number %s beyond float64 in %q", name, v, body)
			}
		}
		if top != nil && top.obj {
			top.expectKey = true
		}
	}
}

func checkString(t *testing.T, name string, body []byte, s string, literalFFFD bool) {
	if strings.ContainsRune(s, 0) {
		t.Fatalf("%s: accepted a NUL in %q", name, body)
	}
	if strings.ContainsRune(s, utf8.RuneError) && !literalFFFD {
		t.Fatalf("%s: accepted a lone surrogate in %q", name, body)
	}
}

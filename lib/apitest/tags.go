package apitest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/schematags"
)

// TagProbe sends request bodies of one type for CheckRequestTags.
type TagProbe struct {
	// Type is the request struct whose openapi tags are checked (the
	// fields of an embedded struct are its own).
	Type reflect.Type
	// Prefix is put before a field's name in the validation errors a
	// refusal names ("retryPolicy." for a nested object).
	Prefix string
	// Base answers a body the handler accepts, before the field under
	// test is set in it or taken out of it; a new map for each call.
	Base func(field string) map[string]any
	// Send sends the body and answers the handler's response.
	Send func(body map[string]any) *Response
	// Text, when set, answers a string of n characters the handler takes
	// for field but for its length (a URL); nil: n k's.
	Text func(field string, n int) string
}

// CheckRequestTags holds a request type's openapi tags, which the OpenAPI
// document and the MCP tools' schemas state (lib/schematags), to the
// handler that checks them, for the rules it can probe with one field's
// value: each min and max, and each minLength and maxLength (a string of as
// many k's, or Text's), is sent at the bound (accepted) and one past it
// (refused, naming the field), each enum value is accepted and another word
// refused, a field tagged required is refused when left out, and null is
// refused exactly where the document says the field cannot be null (QA,
// session 31: the document allowed null for eight policy fields the PUT
// refuses). Patterns and the rules of maps and lists are left to their own
// tests. It answers how many rules it checked.
func CheckRequestTags(t *testing.T, p TagProbe) int {
	t.Helper()
	checked := 0
	for _, f := range requestFields(p.Type) {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		rules := schematags.Rules(f)
		try := func(what string, value any, omit bool) (bool, []string) {
			t.Helper()
			body := p.Base(name)
			delete(body, name)
			if !omit {
				body[name] = value
			}
			r := p.Send(body)
			if r.Status == http.StatusOK || r.Status == http.StatusCreated {
				return true, nil
			}
			require.Equal(t, http.StatusBadRequest, r.Status, "%s%s %s: %s", p.Prefix, name, what, r.Body)
			return false, ValidationFields(t, r)
		}
		accepted := func(what string, value any) {
			t.Helper()
			ok, fields := try(what, value, false)
			require.True(t, ok, "%s%s %s (%s) is refused: %v", p.Prefix, name, what, shown(value), fields)
			checked++
		}
		refused := func(what string, value any, omit bool) {
			t.Helper()
			ok, fields := try(what, value, omit)
			require.False(t, ok, "%s%s %s (%s) is accepted", p.Prefix, name, what, shown(value))
			require.Contains(t, fields, p.Prefix+name, "%s%s %s", p.Prefix, name, what)
			checked++
		}

		text := func(n int64) any { return strings.Repeat("k", int(n)) }
		if p.Text != nil {
			text = func(n int64) any { return p.Text(name, int(n)) }
		}
		for _, b := range []struct {
			rule  string
			step  int64           // from the bound to one past it
			value func(int64) any // what is sent for a bound of n
		}{
			{"min", -1, func(n int64) any { return n }}, {"max", 1, func(n int64) any { return n }},
			{"minLength", -1, text}, {"maxLength", 1, text},
		} {
			v, ok := rules[b.rule]
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err, "%s %s", name, b.rule)
			accepted(b.rule, b.value(n))
			if past := n + b.step; past >= 0 || b.rule == "min" {
				refused("past "+b.rule, b.value(past), false)
			}
		}
		if values, ok := rules["enum"]; ok {
			for _, v := range strings.Split(values, "|") {
				accepted("enum", v)
			}
			refused("outside the enum", "other", false)
		}
		_, required := rules["required"]
		if required {
			refused("left out", nil, true)
		}
		_, notNull := rules["notNull"]
		if required || notNull || !schematags.Nullable(f.Type) {
			refused("null", nil, false)
		} else {
			accepted("null", nil)
		}
	}
	return checked
}

// shown is how a failure names a value sent: a long string by its length.
func shown(v any) string {
	if s, ok := v.(string); ok && len(s) > 40 {
		return fmt.Sprintf("a string of %d characters", len(s))
	}
	return fmt.Sprint(v)
}

// requestFields are t's JSON fields, an embedded struct's flattened.
func requestFields(t reflect.Type) []reflect.StructField {
	var out []reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && name == "":
			out = append(out, requestFields(f.Type)...)
		case f.IsExported() && name != "-":
			out = append(out, f)
		}
	}
	return out
}

// ValidationFields are the fields a 400 invalid_request names (it requires
// the code).
func ValidationFields(t *testing.T, r *Response) []string {
	t.Helper()
	var env struct {
		Error struct {
			Code   string `json:"code"`
			Detail struct {
				Validation []struct {
					Field string `json:"field"`
				} `json:"validation"`
			} `json:"detail"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &env), "%s", r.Body)
	require.Equal(t, "invalid_request", env.Error.Code, "%s", r.Body)
	var out []string
	for _, v := range env.Error.Detail.Validation {
		out = append(out, v.Field)
	}
	return out
}

// unique numbers the names Unique answers.
var unique atomic.Int64

// Unique answers prefix followed by a number no earlier call answered, for
// names a probe must not repeat (a new endpoint or effect type per request).
func Unique(prefix string) string { return fmt.Sprint(prefix, unique.Add(1)) }

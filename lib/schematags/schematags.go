// Package schematags reads the openapi struct tags that state the bounds a
// handler checks (enum=a|b, min=N, max=N, minLength=N, maxLength=N,
// pattern=RE, printable (lib/idemkey's rule), toolname (lib/toolname's characters), format=F, default=JSON, required, notNull; for a map, maxProperties=N, keyPattern=RE,
// keyMaxLength=N, valueMinLength=N, valueMaxLength=N, valueNotNull; for an array,
// minItems=N, maxItems=N, itemEnum=a|b, itemPattern=RE, itemMaxLength=N,
// uniqueItems) and adds them to a JSON Schema inferred from the
// type: one reading for the OpenAPI document (lib/httpapi), the MCP tools'
// input schemas (lib/mcpserver) and the tests that hold each tag to its
// handler.
package schematags

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/toolname"
)

// Constrain adds to s what the openapi tags of t's fields say of their
// values, the bounds the handlers check (QA: clients generated from the
// document knew no enum or range): enum=a|b, min=N, max=N, minLength=N,
// maxLength=N, pattern=RE, format=F (date-time: an RFC 3339 timestamp),
// default=JSON (the value the handler takes for a field left out),
// notNull (a field a request may leave out but
// never send as null, such as a policy's mode, or an answer's list the
// server always writes, [] when empty), for a map maxProperties=N, keyPattern=RE,
// keyMaxLength=N, valueMinLength=N, valueMaxLength=N, valueNotNull (each
// value, a list, is never null: the manifest's presets), and for an array
// minItems=N, maxItems=N, itemEnum=a|b, itemPattern=RE, itemMaxLength=N,
// uniqueItems (rules are split
// on commas: a pattern holds none). A value the tags allow may still be refused for
// what only the handler knows; one they refuse always is. Answers are held
// to the same tags by lib/apitest, so a tag cannot drift from the code.
func Constrain(t reflect.Type, s *jsonschema.Schema) {
	for s != nil && (t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array ||
		t.Kind() == reflect.Map) {
		if t.Kind() == reflect.Map {
			s = s.AdditionalProperties
		} else if t.Kind() != reflect.Pointer {
			s = s.Items
		}
		t = t.Elem()
	}
	if s == nil || t.Kind() != reflect.Struct || s.Properties == nil {
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			Constrain(f.Type, s) // its fields are this object's
			continue
		}
		p := s.Properties[name]
		if p == nil || !f.IsExported() {
			continue
		}
		if rules := Rules(f); len(rules) > 0 {
			c := *p // inference may share one schema between fields of a type
			for key, val := range rules {
				applyRule(&c, key, val)
			}
			s.Properties[name], p = &c, &c
		}
		Constrain(f.Type, p)
	}
}

// Rules reads a struct field's openapi tag: rule → value ("" for a
// bare rule such as required). Tests hold each rule to its handler's check.
func Rules(f reflect.StructField) map[string]string {
	tag := f.Tag.Get("openapi")
	if tag == "" {
		return nil
	}
	out := map[string]string{}
	for _, rule := range strings.Split(tag, ",") {
		key, val, _ := strings.Cut(rule, "=")
		out[key] = val
	}
	return out
}

// applyRule sets one openapi tag rule on s; "required" is for the caller
// (lib/httpapi lists such fields as required even when they may be null).
func applyRule(s *jsonschema.Schema, key, val string) {
	num := func() *float64 {
		f, err := strconv.ParseFloat(val, 64)
		if err != nil {
			panic(fmt.Sprintf("openapi tag %s=%q: %v", key, val, err))
		}
		return &f
	}
	length := func() *int { n := int(*num()); return &n }
	switch key {
	case "required":
	case "notNull":
		NotNull(s)
	case "valueNotNull":
		NotNull(values(s))
	case "min":
		s.Minimum = num()
	case "max":
		s.Maximum = num()
	// A value's allowed values and a string's rules, and the same for a
	// part: a map's keys (key…) or values (value…), an array's items
	// (item…).
	case "enum", "itemEnum":
		p := part(s, key)
		p.Enum = nil
		for _, v := range strings.Split(val, "|") {
			p.Enum = append(p.Enum, v)
		}
		if slices.Contains(p.Types, "null") {
			p.Enum = append(p.Enum, nil)
		}
	case "minLength", "valueMinLength":
		part(s, key).MinLength = length()
	case "maxLength", "keyMaxLength", "valueMaxLength", "itemMaxLength":
		part(s, key).MaxLength = length()
	case "pattern", "keyPattern", "itemPattern":
		part(s, key).Pattern = val
	case "printable": // lib/idemkey's rule (agent QA: a key's newline passed the schema)
		s.Pattern = idemkey.Pattern
	case "toolname": // a tool's name or version (lib/toolname): "send email" passed the schema
		s.Pattern = toolname.Pattern
	case "format":
		s.Format = val
	case "default":
		if !json.Valid([]byte(val)) {
			panic(fmt.Sprintf("openapi tag default=%q: not JSON", val))
		}
		s.Default = json.RawMessage(val)
	// How many entries a map, or items an array, may hold.
	case "maxProperties":
		s.MaxProperties = length()
	case "minItems":
		s.MinItems = length()
	case "maxItems":
		s.MaxItems = length()
	case "uniqueItems":
		s.UniqueItems = true
	default:
		panic(fmt.Sprintf("openapi tag: unknown rule %q", key))
	}
}

// Nullable reports whether a request field of type t may be null, and so
// be left out: it decodes from null (or absence) to a value the handler
// reads as "not sent" (a pointer, map, list, raw JSON or jsonx.Optional),
// unless its tags say required or notNull.
func Nullable(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface:
		return true
	case reflect.Struct:
		return strings.HasPrefix(t.Name(), "Optional[")
	}
	return false
}

// NotNull drops null from a schema's types and enum: inference allows it
// for every list, pointer and Optional, and enum=… adds it when the type
// allows it (so either rule may be applied first).
func NotNull(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if len(s.Types) > 0 {
		types := slices.DeleteFunc(slices.Clone(s.Types), func(t string) bool { return t == "null" })
		if len(types) == 1 {
			s.Type, s.Types = types[0], nil
		} else {
			s.Types = types
		}
	}
	if s.Enum != nil {
		s.Enum = slices.DeleteFunc(slices.Clone(s.Enum), func(v any) bool { return v == nil })
	}
}

// part is the schema a rule applies to: s itself, or the part of s its
// name begins with (keys, values, items).
func part(s *jsonschema.Schema, rule string) *jsonschema.Schema {
	switch {
	case strings.HasPrefix(rule, "key"):
		return keys(s)
	case strings.HasPrefix(rule, "value"):
		return values(s)
	case strings.HasPrefix(rule, "item"):
		return items(s)
	}
	return s
}

// keys is s's propertyNames schema, values its additionalProperties schema
// and items its items schema, each copied first (own): inference may share
// one schema between the values of several maps or the items of several
// arrays.
func keys(s *jsonschema.Schema) *jsonschema.Schema { return own(&s.PropertyNames) }

func values(s *jsonschema.Schema) *jsonschema.Schema { return own(&s.AdditionalProperties) }

func items(s *jsonschema.Schema) *jsonschema.Schema { return own(&s.Items) }

// own replaces *sub with a copy of itself (an empty schema when it has
// none) and answers the copy.
func own(sub **jsonschema.Schema) *jsonschema.Schema {
	c := &jsonschema.Schema{}
	if *sub != nil {
		v := **sub
		c = &v
	}
	*sub = c
	return c
}

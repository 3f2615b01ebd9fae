package jsonstrict

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/money"
	"github.com/getratchet/ratchet/lib/schematags"
)

// Decode reads a JSON object into dst as the API reads a request body:
// unknown fields, trailing data, wrong types and malformed JSON are 400
// invalid_request naming the field (its dotted path from the root), and
// Check's rules apply. An empty body decodes as {}, and so does null
// (what some clients send for "no body"). The REST handlers
// (httpapi) and the MCP tools read their input with it, so both answer
// the same field and wording.
func Decode(body []byte, dst any) error { return decode(body, dst, false) }

// DecodeNumbers is Decode with the numbers of free-form (any) fields kept
// as written (json.Number), not read as float64.
func DecodeNumbers(body []byte, dst any) error { return decode(body, dst, true) }

func decode(body []byte, dst any, numbers bool) error {
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	if !utf8.Valid(body) && json.Valid(body) {
		// Named where the bytes are, before encoding/json reads them as
		// U+FFFD and names a key the client never sent (fuzz QA).
		// Untyped: the body has not been decoded, so its keys and nulls
		// are not yet known good; the typed check runs after decoding.
		if err := Check(body, nil); err != nil {
			return err
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if numbers {
		dec.UseNumber()
	}
	if err := dec.Decode(dst); err != nil {
		return decodeError(err, body, dst)
	}
	if err := Check(body, reflect.TypeOf(dst)); err != nil {
		return err
	}
	if dec.More() {
		return apierr.InvalidField("body", "must be a single JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return apierr.InvalidField("body", "must be a single JSON object")
	}
	return nil
}

// maxDecodeDepth is encoding/json's nesting limit (its maxNestingDepth).
const maxDecodeDepth = 10000

func decodeError(err error, body []byte, dst any) error {
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &syn) && strings.HasSuffix(syn.Error(), "exceeded max depth"):
		// encoding/json's own limit: valid JSON, nested too deep (QA: it
		// read as invalid JSON).
		return apierr.InvalidField("body", "nests arrays and objects more than %d levels deep", maxDecodeDepth)
	case errors.As(err, &syn):
		return apierr.InvalidField("body", "is not valid JSON (offset %d)", syn.Offset)
	case errors.As(err, &typ):
		field := plainJSONPath(reflect.TypeOf(dst), typ.Field)
		if field == "" {
			field = "body"
		} else if path := typeErrorPath(body, reflect.TypeOf(dst), field); path != "" {
			// encoding/json's path leaves out array indices (tools.name);
			// the contract's names the element (tools.0.name).
			field = path
		}
		return withEveryProblem(apierr.FieldError{Field: field,
			Message: kindRule(numberDescription(typ.Value), typ.Type, reflect.TypeOf(dst), field)},
			body, reflect.TypeOf(dst))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return apierr.InvalidField("body", "is not valid JSON (unexpected end)")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		// encoding/json names only the key; the contract wants its dotted
		// path from the body root (retryPolicy.extra), so find it.
		if path := unknownFieldPath(body, reflect.TypeOf(dst), name); path != "" {
			name = path
		}
		return withEveryProblem(apierr.FieldError{Field: name, Message: "is not a known field"}, body, reflect.TypeOf(dst))
	default:
		var ae *apierr.Error
		if errors.As(err, &ae) {
			return ae
		}
		return apierr.InvalidField("body", "is invalid: %s", safeMessage(err))
	}
}

// maxFieldProblems bounds the problems one refusal lists, so a body with
// ten thousand unknown keys is answered in a few hundred bytes; the walk
// stops there rather than collect what apierr.Invalid would drop.
const maxFieldProblems = apierr.MaxProblems

// withEveryProblem answers the problem encoding/json stopped at (first)
// together with every other unknown key and mistyped value in the body, in
// key order: a client fixing its request learns all of them at once.
func withEveryProblem(first apierr.FieldError, body []byte, t reflect.Type) *apierr.Error {
	var problems apierr.Problems
	w := pathWalk{max: maxFieldProblems, exact: true, folded: map[string]bool{}}
	w.match = func(v any, ft reflect.Type, path, _ string) bool {
		switch {
		case ft == nil && w.folded[path]:
			problems.Add(path, "is not a known field (field names are case-sensitive)")
		case ft == nil:
			problems.Add(path, "is not a known field")
		case mistyped(v, ft):
			problems.Add(path, "%s", kindRule(v, ft, t, path))
		default:
			return false
		}
		return true
	}
	if !w.run(body, t) {
		problems = nil
	}
	listed := false
	for _, p := range problems {
		// Listed as it is, or as the case-folded key it is at or under:
		// the decoder names the field ("count" for "COUNT", "inner.kind"
		// for "Inner": {"kind": 1}), which the body does not hold.
		// The decoder's path has no array indices (tools.name for
		// tools.0.NAME), so the walk's is compared without them.
		f, d := strings.ToLower(withoutIndices(p.Field)), strings.ToLower(withoutIndices(first.Field))
		listed = listed || p.Field == first.Field || (w.folded[p.Field] && (f == d || strings.HasPrefix(d, f+".")))
	}
	if !listed {
		// The problem the decoder reported is always listed, though the
		// walk missed it (a custom decoder's refusal, a walk that could
		// not run).
		problems = append(apierr.Problems{first}, problems...)
		problems = problems[:min(len(problems), maxFieldProblems)]
	}
	return apierr.Invalid(problems...)
}

// withoutIndices drops a dotted path's array indices (tools.0.name →
// tools.name).
func withoutIndices(path string) string {
	segs := strings.Split(path, ".")
	return strings.Join(slices.DeleteFunc(segs, func(s string) bool {
		_, err := strconv.Atoi(s)
		return err == nil
	}), ".")
}

// plainJSONPath drops from encoding/json's field path the Go names of
// embedded structs (PolicyFields.maxAttempts → maxAttempts): their fields are
// promoted, so on the wire they sit at the embedding struct's level.
func plainJSONPath(t reflect.Type, field string) string {
	if field == "" {
		return ""
	}
	var out []string
	for _, seg := range strings.Split(field, ".") {
		if t != nil {
			t, _ = ElemType(t)
			for t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
				t, _ = ElemType(t.Elem())
			}
		}
		if t != nil && t.Kind() == reflect.Struct {
			if f, ok := t.FieldByName(seg); ok && f.Anonymous && f.Tag.Get("json") == "" {
				t = f.Type
				continue
			}
			t = jsonFields(t)[seg]
		} else {
			t = nil
		}
		out = append(out, seg)
	}
	return strings.Join(out, ".")
}

// unknownFieldPath returns the dotted path (from the body root, array
// elements by index) of the first object key named name that type t does not
// declare, or "" when none is found. It only runs on a failed decode.
func unknownFieldPath(body []byte, t reflect.Type, name string) string {
	return findPath(body, t, func(v any, t reflect.Type, path, plain string) bool {
		return t == nil && (path == name || strings.HasSuffix(path, "."+name))
	})
}

// typeErrorPath returns the indexed path of the value that encoding/json
// reports as mistyped at field (its path without array indices), or "".
func typeErrorPath(body []byte, t reflect.Type, field string) string {
	if path := findPath(body, t, func(v any, t reflect.Type, path, plain string) bool {
		return t != nil && plain == field && mistyped(v, t)
	}); path != "" {
		return path
	}
	// encoding/json names a map by its field alone ("dimensions" for a
	// number in {"dimensions": {"to": 5}}): the mistyped value is one of its
	// entries.
	return findPath(body, t, func(v any, t reflect.Type, path, plain string) bool {
		return t != nil && strings.HasPrefix(plain, field+".") && mistyped(v, t)
	})
}

// findPath walks the body's JSON alongside type t and returns the path of
// the first node (in key order) that match accepts. Unknown object keys are
// visited with a nil type.
func findPath(body []byte, t reflect.Type, match func(v any, t reflect.Type, path, plain string) bool) string {
	w := pathWalk{match: match, max: 1}
	if w.run(body, t); len(w.found) > 0 {
		return w.found[0]
	}
	return ""
}

// pathWalk walks a body's JSON alongside a type, collecting the paths of
// up to max nodes match accepts; a node match accepts is not descended into.
type pathWalk struct {
	match func(v any, t reflect.Type, path, plain string) bool
	max   int
	found []string
	// exact matches keys as the contract does, exactly: a key that names
	// a field only through encoding/json's case-folding is visited as
	// unknown, its path put in folded. Otherwise keys fold, as the decoder
	// whose errors the walk locates folds them.
	exact  bool
	folded map[string]bool
}

// run walks body, its numbers as written (json.Number), so that 1.0 or -1
// are told from an integer field's 1 (mistyped). Only error messages
// depend on the walk: a type it cannot reflect on costs the precise names
// (it finds nothing, and says so), never the request.
func (w *pathWalk) run(body []byte, t reflect.Type) (ok bool) {
	defer func() {
		if recover() != nil {
			w.found, ok = nil, false
		}
	}()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return false
	}
	w.walk(v, t, "", "")
	return true
}

// walk visits v (of type t; nil for an unknown key) at path, plain being
// the path without array indices, and reports whether the walk is done.
func (w *pathWalk) walk(v any, t reflect.Type, path, plain string) (done bool) {
	join := JoinPath
	if t != nil {
		var ok bool
		if t, ok = ElemType(t); !ok {
			return false
		}
	}
	if path != "" && w.match(v, t, path, plain) {
		w.found = append(w.found, path)
		return len(w.found) >= w.max
	}
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return false
		}
		fields := jsonFields(t)
		var exact map[string]reflect.Type
		if w.exact {
			exact = ExactFields(t)
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			ft, ok := fields[k]
			if !ok {
				ft = fields[strings.ToLower(k)]
			}
			if _, named := exact[k]; w.exact && !named && ft != nil {
				ft, w.folded[join(path, k)] = nil, true
			}
			if w.walk(obj[k], ft, join(path, k), join(plain, k)) {
				return true
			}
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			if w.walk(obj[k], t.Elem(), join(path, k), join(plain, k)) {
				return true
			}
		}
	case reflect.Slice, reflect.Array:
		arr, ok := v.([]any)
		if !ok {
			return false
		}
		for i, e := range arr {
			if w.walk(e, t.Elem(), join(path, strconv.Itoa(i)), plain) {
				return true
			}
		}
	}
	return false
}

// mistyped reports whether JSON value v cannot decode into t (null always can).
func mistyped(v any, t reflect.Type) bool {
	if v == nil {
		return false
	}
	switch t.Kind() {
	case reflect.String:
		_, ok := v.(string)
		return !ok
	case reflect.Bool:
		_, ok := v.(bool)
		return !ok
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		// An integer literal within the kind's range and sign: 1.0, 1e3
		// and -1 for an unsigned field are refused as encoding/json
		// refuses them.
		n, ok := v.(json.Number)
		if !ok {
			return true
		}
		var err error
		if t.Kind() >= reflect.Uint {
			_, err = strconv.ParseUint(string(n), 10, t.Bits())
		} else {
			_, err = strconv.ParseInt(string(n), 10, t.Bits())
		}
		return err != nil
	case reflect.Float32, reflect.Float64:
		_, ok := v.(json.Number)
		return !ok
	case reflect.Struct, reflect.Map:
		_, ok := v.(map[string]any)
		return !ok
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			_, ok := v.(string)
			return !ok
		}
		_, ok := v.([]any)
		return !ok
	case reflect.Array:
		_, ok := v.([]any)
		return !ok
	}
	return false
}

// jsonFields maps the JSON names of struct t (and, lower-cased, for
// encoding/json's case-insensitive match) to their types, promoting the
// fields of untagged embedded structs.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	exact := ExactFields(t)
	out := maps.Clone(exact)
	for name, ft := range exact {
		if _, ok := out[strings.ToLower(name)]; !ok {
			out[strings.ToLower(name)] = ft
		}
	}
	return out
}

// safeMessage keeps custom unmarshalers' messages short and free of input.
func safeMessage(err error) string {
	m := err.Error()
	if len(m) > 120 {
		m = m[:120]
	}
	return m
}

// kindRule is the message for a value that a field of type t cannot hold:
// v is the JSON value (a json.Number for a number) or, from encoding/json's
// error, a description of it (a numberDescription such as "number 1e3").
// An integer literal that an integer field cannot hold is out of the
// type's range (or negative for an unsigned one): its message says the
// range, not that it must be an integer (QA: 2^63 was told it was none).
// An amount of money (a field named …_micros or …Micros, API.md §0) is
// told the amounts' own range, which is narrower than its type's (QA: 10^19
// was told "from -2^63 to 2^63-1" where 9·10^18 was told "0 to 10^18").
// Any other field whose openapi tag bounds it (min=, max=; root is the
// body's type, path the field's) is told those bounds in place of the
// type's, as its handler tells a value in the type's range (QA: a rotation's
// 10^20 seconds was told "-2^63 to 2^63-1" where 10^9 was told "0 to
// 604800").
// A number that is no integer (1.5, 1.0, 1e3) in an integer field whose
// tag bounds it, or in an amount of money, is told the bounds too, as a
// list's limit is (apierr.LimitRule) and an MCP tool's argument (ops QA:
// maxAttempts 1.5 was told only "must be an integer", 11 "from 1 to 10");
// in a field bounded by its type alone it must be an integer.
// A string is a string, whatever it holds ("30" must be an integer).
func kindRule(v any, t, root reflect.Type, path string) string {
	var literal string
	number := false
	switch v := v.(type) {
	case json.Number:
		literal, number = string(v), true
	case numberDescription:
		literal, number = strings.CutPrefix(string(v), "number ")
	}
	if !integerKind(t.Kind()) || !number {
		return "must be " + jsonKind(t.Kind().String())
	}
	if name := path[strings.LastIndex(path, ".")+1:]; strings.HasSuffix(name, "_micros") || strings.HasSuffix(name, "Micros") {
		return money.Rule
	}
	lo, hi := fmt.Sprintf("-2^%d", t.Bits()-1), fmt.Sprintf("2^%d-1", t.Bits()-1)
	if t.Kind() >= reflect.Uint {
		lo, hi = "0", fmt.Sprintf("2^%d-1", t.Bits())
	}
	tagged := false
	if f, ok := fieldAt(root, path); ok {
		rules := schematags.Rules(f)
		if v, ok := rules["min"]; ok {
			lo, tagged = v, true
		}
		if v, ok := rules["max"]; ok {
			hi, tagged = v, true
		}
	}
	if !integerLiteral.MatchString(literal) && !tagged {
		return "must be an integer"
	}
	return apierr.IntegerRule(lo, hi)
}

// fieldAt finds the struct field a body's dotted path (array elements and
// map values by any segment) ends at, through pointers, jsonx.Optional and
// untagged embedded structs, naming fields exactly as the contract does.
func fieldAt(root reflect.Type, path string) (reflect.StructField, bool) {
	t := root
	var field reflect.StructField
	found := false
	for _, seg := range strings.Split(path, ".") {
		if t == nil {
			return reflect.StructField{}, false
		}
		t, _ = ElemType(t)
		switch t.Kind() {
		case reflect.Slice, reflect.Array, reflect.Map:
			t, found = t.Elem(), false
			continue
		case reflect.Struct:
			field, found = jsonStructFields(t)[seg]
			if !found {
				return reflect.StructField{}, false
			}
			t = field.Type
		default:
			return reflect.StructField{}, false
		}
	}
	return field, found
}

// numberDescription is encoding/json's description of a value it could not
// decode ("number 1e3", "string", "object").
type numberDescription string

// integerLiteral matches a JSON number written as an integer.
var integerLiteral = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// integerKind reports whether k is one of Go's integer kinds.
func integerKind(k reflect.Kind) bool { return k >= reflect.Int && k <= reflect.Uint64 }

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	default:
		return "of another type"
	}
}

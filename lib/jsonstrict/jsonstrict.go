// Package jsonstrict checks a JSON request body against the Go type it
// decoded into, for what encoding/json accepts and the API does not: field
// names matched only by case-folding, keys repeated in one object, NUL and
// lone surrogates, numbers beyond float64, bytes that are not UTF-8. The REST
// router and the MCP tools both use it, so a body is refused the same way
// whichever door it came in by.
package jsonstrict

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jsonx"
)

// Check refuses, in one pass over a body that has already decoded into t,
// what encoding/json accepts and the contract does not:
//   - null for a field whose type has no "not sent" (takesNull);
//   - a key that names a struct field only through encoding/json's
//     case-folding ("PRESET" for "preset"): the contract's names are exact;
//   - a key repeated in one object, at any depth, free-form payloads and
//     inputs included: encoding/json keeps the last, other parsers the first,
//     so the service and a worker or a proxy would each read another request;
//   - a NUL in any string (JSON's \u0000): PostgreSQL stores no NUL in text
//     or jsonb, so it is refused here rather than failing the statement;
//   - bytes that are not UTF-8, which encoding/json would read as U+FFFD.
//
// The body is well-formed up to the end of its first value (it decoded), so
// the scan does not validate; it only reads keys and skips over values.
func Check(body []byte, t reflect.Type) *apierr.Error {
	// encoding/json reads invalid bytes as U+FFFD, so two different keys
	// ("k\xff1", "k\xfe1") would name one effect. The scan names the
	// string that holds them (fuzz QA: every such body was refused at
	// "body").
	s := bodyScan{b: body, utf8: !utf8.Valid(body), keys: make([][]byte, 0, 8)}
	s.value(t, nil)
	if s.err == nil && s.utf8 {
		return notUTF8("body")
	}
	return s.err
}

func notUTF8(field string) *apierr.Error {
	return apierr.InvalidField(field, "must be UTF-8 (JSON text is)")
}

// place is where a value stands in the body: a link to its parent's place
// and its own key or index (nil: the root). The dotted name is built only
// for a refusal: building it at every level made a deeply nested body cost
// memory and time quadratic in its depth (fuzzing: 10 000 levels under the
// 1 MiB limit took 4 GB). Places are taken from chunks of the scan's
// (bodyScan.child), and a key is the body's own bytes (decoded only when
// escaped): a place and a key string allocated per key were most of a small
// body's allocations.
type place struct {
	up  *place
	key []byte
}

// placeChunk is how many places a scan takes at once. A chunk is never
// grown in place, so a place's address holds while the scan runs.
const placeChunk = 8

// child is the place of key (or index) under up.
func (s *bodyScan) child(up *place, key []byte) *place {
	if len(s.places) == cap(s.places) {
		s.places = make([]place, 0, placeChunk)
	}
	s.places = append(s.places, place{up: up, key: key})
	return &s.places[len(s.places)-1]
}

// field is the place's dotted path from the body root ("body" for the root).
func (p *place) field() string {
	if p == nil {
		return "body"
	}
	var keys []string
	for q := p; q != nil; q = q.up {
		keys = append(keys, string(q.key))
	}
	slices.Reverse(keys)
	return strings.Join(keys, ".")
}

type bodyScan struct {
	b      []byte
	i      int
	err    *apierr.Error
	utf8   bool     // the body holds bytes that are not UTF-8: each string is checked
	places []place  // the chunk child takes places from
	keys   [][]byte // the keys read so far of the objects open, outermost first (keySet)
}

func (s *bodyScan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// Deferred is a value Check leaves to a decode of its own: one item of a
// batch whose items are refused one by one (the batch report), so that a
// NUL, a repeated key or an unreadable number inside one item is that
// item's refusal, in its slot, and not the whole body's. Its syntax is
// checked with the body's, and bytes that are not UTF-8 anywhere still
// refuse the body (it is not JSON text).
type Deferred json.RawMessage

// UnmarshalJSON keeps the item's bytes, as json.RawMessage does.
func (d *Deferred) UnmarshalJSON(b []byte) error {
	*d = append((*d)[:0], b...)
	return nil
}

var deferredType = reflect.TypeFor[Deferred]()

// value scans one value of type t (nil: free-form) at at.
func (s *bodyScan) value(t reflect.Type, at *place) {
	if t == deferredType {
		s.skip()
		return
	}
	if t != nil && at != nil {
		s.space()
		if s.i < len(s.b) && s.b[s.i] == 'n' && !takesNull(t) { // the type is looked at only for a null
			s.err = apierr.InvalidField(at.field(), "must not be null")
			return
		}
	}
	if t != nil {
		var ok bool
		if t, ok = ElemType(t); !ok || t.Kind() == reflect.Interface {
			t = nil // an opaque decoder (json.RawMessage) or any: free-form
		}
	}
	s.space()
	if s.i >= len(s.b) {
		return
	}
	switch s.b[s.i] {
	case '{':
		s.object(t, at)
	case '[':
		s.array(t, at)
	case '"':
		s.str(at)
	default:
		start := s.i
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				s.number(s.b[start:s.i], at)
				return
			}
			s.i++
		}
		s.number(s.b[start:s.i], at)
	}
}

// maxNumberChars bounds a number's literal: far more digits than a float64
// tells apart (17), and little enough that no parser downstream (a
// contract's JSON Schema checks numbers as exact rationals) spends long on
// one.
const maxNumberChars = 1000

// number refuses a number beyond float64's range (1e400), which a worker or
// client in most languages reads as Infinity or fails on, and two literals
// no float64 needs: an exponent beyond ±999 (1e-400 reads as 0 and passes,
// 1e-1000001 does not) and a literal over maxNumberChars. Those two kept a
// contract's schema check busy or made it panic (fuzzing: the validator
// turns 1e-1000001 into a nil rational, and spends 23 ms on each
// 1e-999999). Only a number with an exponent or more digits than any
// float64 holds is looked at; true, false, null and ordinary numbers pass
// at a glance.
func (s *bodyScan) number(lit []byte, at *place) {
	if len(lit) == 0 || (lit[0] != '-' && (lit[0] < '0' || lit[0] > '9')) {
		return // true, false, null
	}
	if len(lit) < 309 && !bytes.ContainsAny(lit, "eE") {
		return
	}
	switch {
	case len(lit) > maxNumberChars:
		s.err = apierr.InvalidField(at.field(), "is a number of more than %d characters", maxNumberChars)
	case exponentDigits(lit) > 3:
		s.err = apierr.InvalidField(at.field(), "is a number with an exponent beyond ±999")
	default:
		if f, err := strconv.ParseFloat(string(lit), 64); err != nil && math.IsInf(f, 0) {
			s.err = apierr.InvalidField(at.field(), "is a number beyond the range of a 64-bit float")
		}
	}
}

// exponentDigits counts the significant digits of a number literal's
// exponent (0 without one).
func exponentDigits(lit []byte) int {
	e := bytes.IndexAny(lit, "eE")
	if e < 0 {
		return 0
	}
	return len(bytes.TrimLeft(bytes.TrimLeft(lit[e+1:], "+-"), "0"))
}

func (s *bodyScan) object(t reflect.Type, path *place) {
	var fields map[string]reflect.Type
	if t != nil && t.Kind() == reflect.Struct {
		fields = ExactFields(t)
	}
	seen := keySet{start: len(s.keys)}
	s.i++ // {
	for s.err == nil {
		s.space()
		if s.i >= len(s.b) || s.b[s.i] == '}' {
			s.i++
			s.keys = s.keys[:seen.start]
			return
		}
		if s.b[s.i] == ',' {
			s.i++
			continue
		}
		key := s.str(path) // a bad key is named by its object
		if s.err != nil {
			return
		}
		at := s.child(path, key)
		if !seen.add(&s.keys, key) {
			s.err = apierr.InvalidField(at.field(), "is repeated: an object may name each key once")
			return
		}
		var ft reflect.Type
		switch {
		case fields != nil:
			var ok bool
			if ft, ok = fields[string(key)]; !ok {
				// The body decoded with unknown fields disallowed, so the
				// key matched a field only by case-folding.
				s.err = apierr.InvalidField(at.field(), "is not a known field (field names are case-sensitive)")
				return
			}
		case t != nil && t.Kind() == reflect.Map:
			ft = t.Elem()
		}
		s.space()
		s.i++ // :
		s.value(ft, at)
	}
}

func (s *bodyScan) array(t reflect.Type, path *place) {
	var et reflect.Type
	if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		et = t.Elem()
	}
	s.i++ // [
	for n := 0; s.err == nil; {
		s.space()
		if s.i >= len(s.b) || s.b[s.i] == ']' {
			s.i++
			return
		}
		if s.b[s.i] == ',' {
			s.i++
			continue
		}
		var index []byte
		if n < len(smallIndices) {
			index = smallIndices[n]
		} else {
			index = strconv.AppendInt(nil, int64(n), 10)
		}
		s.value(et, s.child(path, index))
		n++
	}
}

// skip passes over the value at s.i without looking inside it (a
// Deferred): the body decoded, so it is well-formed JSON.
func (s *bodyScan) skip() { s.i = jsonx.SkipValue(s.b, s.i) }

// str reads the string at s.i and answers it decoded (only keys need the
// text; a value's is discarded): the body's own bytes unless it holds an
// escape. A refusal inside it is named by path ("body" at the root).
func (s *bodyScan) str(path *place) []byte {
	start := s.i
	s.i++ // opening quote
	escaped := false
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '\\':
			escaped = true
			if s.i+1 < len(s.b) && s.b[s.i+1] == 'u' {
				if s.err = s.unicodeEscape(path); s.err != nil {
					return nil
				}
				continue
			}
			s.i += 2 // the escape and the character it escapes
			continue
		case '"':
			s.i++
			raw := s.b[start:s.i]
			if s.utf8 && !utf8.Valid(raw) {
				s.err = notUTF8(path.field())
				return nil
			}
			if !escaped {
				return raw[1 : len(raw)-1]
			}
			var v string
			_ = json.Unmarshal(raw, &v) // well-formed: the body decoded
			return []byte(v)
		}
		s.i++
	}
	return nil
}

// unicodeEscape reads the \uXXXX escape at s.i (a pair, for a surrogate
// pair) and refuses what encoding/json would not read back as written: a
// NUL, which PostgreSQL cannot store, and a lone surrogate, which it reads
// as U+FFFD (so "k\ud800" and "k\udbff" would be one key).
func (s *bodyScan) unicodeEscape(at *place) *apierr.Error {
	r := s.hex4(s.i + 2)
	s.i += 6
	switch {
	case r == 0:
		return apierr.InvalidField(at.field(), `must not contain NUL characters (\u0000)`)
	case r >= 0xDC00 && r <= 0xDFFF:
		return apierr.InvalidField(at.field(), "must not contain a lone UTF-16 surrogate (\\u%04x)", r)
	case r >= 0xD800 && r <= 0xDBFF:
		if s.i+1 < len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
			if low := s.hex4(s.i + 2); low >= 0xDC00 && low <= 0xDFFF {
				s.i += 6
				return nil
			}
		}
		return apierr.InvalidField(at.field(), "must not contain a lone UTF-16 surrogate (\\u%04x)", r)
	}
	return nil
}

// hex4 reads four hex digits at i (-1 when they are not there; the body
// decoded, so they are).
func (s *bodyScan) hex4(i int) rune {
	if i+4 > len(s.b) {
		return -1
	}
	v, err := strconv.ParseUint(string(s.b[i:i+4]), 16, 32)
	if err != nil {
		return -1
	}
	return rune(v)
}

// smallIndices are the array indices a place names without allocating.
var smallIndices = func() [][]byte {
	out := make([][]byte, 128)
	for i := range out {
		out[i] = strconv.AppendInt(nil, int64(i), 10)
	}
	return out
}()

// keySet holds an object's keys: while the object is small (a request's own
// objects) in the scan's stack of open objects' keys from start on, a map
// once it is not (a free-form payload may hold a hundred thousand keys, and
// a linear look per key made that quadratic: eleven seconds of CPU for one
// 1 MiB body). The keys are the body's bytes (bodyScan.str), copied only
// into the map; one stack for the scan, not a slice per object, spares a
// small body's objects their allocations.
type keySet struct {
	start int
	many  map[string]struct{}
}

const keySetSliceMax = 32

// add records k and reports whether it was new.
// add records k and reports whether it was new; stack is the scan's keys
// (the object's from ks.start on).
func (ks *keySet) add(stack *[][]byte, k []byte) bool {
	if ks.many != nil {
		if _, dup := ks.many[string(k)]; dup {
			return false
		}
		ks.many[string(k)] = struct{}{}
		return true
	}
	few := (*stack)[ks.start:]
	for _, x := range few {
		if bytes.Equal(x, k) {
			return false
		}
	}
	*stack = append(*stack, k)
	if few = (*stack)[ks.start:]; len(few) > keySetSliceMax {
		ks.many = make(map[string]struct{}, 2*len(few))
		for _, x := range few {
			ks.many[string(x)] = struct{}{}
		}
		*stack = (*stack)[:ks.start]
	}
	return true
}

// JoinPath joins a dotted path from the body root and one more key or
// index ("tools" and "1" make "tools.1").
func JoinPath(base, k string) string {
	if base == "" {
		return k
	}
	return base + "." + k
}

// exactFields caches ExactFields per type: the request types are few and
// fixed, and the walk runs on every request.
var exactFields sync.Map // reflect.Type → map[string]reflect.Type

// ExactFields maps the JSON names of struct t's fields (embedded structs'
// promoted) to their types, spelled exactly as the tags spell them. The map
// is shared: do not change it.
func ExactFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := exactFields.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	f := exactJSONFields(t)
	exactFields.Store(t, f)
	return f
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// takesNull reports whether a value of Go type t may be null in a body:
// one that decodes null as "not sent" and whose schema says so (a pointer,
// a map, a list, any value, or a type of its own decoding, such as
// jsonx.Optional or raw JSON). encoding/json reads null into a string,
// number, bool or struct as its zero value, which the API would take for a
// value sent (QA: {"note": null} approved, an error message of null was
// recorded), while its OpenAPI schema refuses null there.
func takesNull(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface:
		return true
	}
	return reflect.PointerTo(t).Implements(unmarshalerType)
}

// elemType strips pointers and jsonx.Optional (which decodes its Value);
// other custom decoders are opaque (ok false).
func ElemType(t reflect.Type) (reflect.Type, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		if t.Kind() != reflect.Struct {
			return t, false // json.RawMessage and other opaque decoders
		}
		f, ok := t.FieldByName("Value")
		if _, set := t.FieldByName("Set"); !ok || !set {
			return t, false
		}
		return ElemType(f.Type)
	}
	return t, true
}

// exactJSONFields maps the JSON names of t's fields (embedded structs'
// promoted) to their types, spelled exactly as the tags spell them.
func exactJSONFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for name, f := range jsonStructFields(t) {
		out[name] = f.Type
	}
	return out
}

// jsonStructFields maps the JSON names of t's fields (embedded structs'
// promoted, an outer field before a promoted one) to the fields, spelled
// exactly as the tags spell them: ExactFields' walk, with each field's tags.
func jsonStructFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			et := f.Type
			for et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range jsonStructFields(et) {
					if _, ok := out[k]; !ok {
						out[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f
	}
	return out
}

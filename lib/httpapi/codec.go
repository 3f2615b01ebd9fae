package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonstrict"
)

// MaxBodyBytes is the published request body limit.
const MaxBodyBytes = 1 << 20

// Decode reads the JSON body into dst strictly: unknown fields, trailing
// data, wrong types and malformed JSON are 400 invalid_request naming the
// field; an oversized body is 413. An empty body decodes as {}.
func (c *Call) Decode(dst any) error {
	body, err := io.ReadAll(c.R.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return apierr.PayloadTooLarge(MaxBodyBytes)
		}
		return apierr.InvalidField("body", "could not be read")
	}
	return DecodeJSON(body, dst)
}

// DecodeJSON is Decode over bytes.
func DecodeJSON(body []byte, dst any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return decodeError(err, body, dst)
	}
	if err := jsonstrict.Check(body, reflect.TypeOf(dst)); err != nil {
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

func decodeError(err error, body []byte, dst any) error {
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
	)
	switch {
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
		return apierr.InvalidField(field, "must be %s", jsonKind(typ.Type.Kind().String()))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return apierr.InvalidField("body", "is not valid JSON (unexpected end)")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		// encoding/json names only the key; the contract wants its dotted
		// path from the body root (retryPolicy.extra), so find it.
		if path := unknownFieldPath(body, reflect.TypeOf(dst), name); path != "" {
			name = path
		}
		return apierr.InvalidField(name, "is not a known field")
	default:
		var ae *apierr.Error
		if errors.As(err, &ae) {
			return ae
		}
		return apierr.InvalidField("body", "is invalid: %s", safeMessage(err))
	}
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
			t, _ = jsonstrict.ElemType(t)
			for t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
				t, _ = jsonstrict.ElemType(t.Elem())
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
func findPath(body []byte, t reflect.Type, match func(v any, t reflect.Type, path, plain string) bool) (path string) {
	// Only error messages depend on this walk: a type it cannot reflect on
	// must cost the precise name, never the request.
	defer func() {
		if recover() != nil {
			path = ""
		}
	}()
	var v any
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	return walkPath(v, t, "", "", match)
}

func walkPath(v any, t reflect.Type, path, plain string, match func(any, reflect.Type, string, string) bool) string {
	join := jsonstrict.JoinPath
	if t != nil {
		var ok bool
		if t, ok = jsonstrict.ElemType(t); !ok {
			return ""
		}
	}
	if path != "" && match(v, t, path, plain) {
		return path
	}
	if t == nil {
		return ""
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				ft = fields[strings.ToLower(k)]
			}
			if p := walkPath(obj[k], ft, join(path, k), join(plain, k), match); p != "" {
				return p
			}
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p := walkPath(obj[k], t.Elem(), join(path, k), join(plain, k), match); p != "" {
				return p
			}
		}
	case reflect.Slice, reflect.Array:
		arr, ok := v.([]any)
		if !ok {
			return ""
		}
		for i, e := range arr {
			if p := walkPath(e, t.Elem(), join(path, strconv.Itoa(i)), plain, match); p != "" {
				return p
			}
		}
	}
	return ""
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
		f, ok := v.(float64)
		return !ok || f != float64(int64(f))
	case reflect.Float32, reflect.Float64:
		_, ok := v.(float64)
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
	exact := jsonstrict.ExactFields(t)
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

// PathID returns path parameter name, answering 404 when it is not a
// well-formed id with prefix (so malformed ids cost no query).
func (c *Call) PathID(name, prefix string) (string, error) {
	v := c.R.PathValue(name)
	if !ids.Valid(prefix, v) {
		return "", apierr.NotFound(strings.TrimSuffix(name, "Id"))
	}
	return v, nil
}

// ListParams parses ?limit= (1-200, default 50) and ?cursor=. A cursor is
// what the list's own nextCursor held: valid says whether it can be one
// (an id of the listed kind, an effect type), so a mistyped cursor is 400
// rather than a silently different page; nil where the list's service
// parses its cursor itself.
func (c *Call) ListParams(valid func(string) bool) (limit int, cursor string, err error) {
	q := c.R.URL.Query()
	limit = 50
	if s := q.Get("limit"); s != "" || q.Has("limit") {
		n, perr := strconv.Atoi(s)
		if perr != nil || n < 1 || n > 200 {
			return 0, "", apierr.InvalidField("limit", "must be an integer from 1 to 200")
		}
		limit = n
	}
	cursor = q.Get("cursor")
	if len(cursor) > 200 || (cursor != "" && valid != nil && !valid(cursor)) { // text without NUL: textParams
		return 0, "", apierr.InvalidField("cursor", "is not a cursor from this API")
	}
	return limit, cursor, nil
}

// idCursor accepts an id of one kind as a cursor.
func idCursor(prefix string) func(string) bool {
	return func(s string) bool { return ids.Valid(prefix, s) }
}

// Page is the list envelope of snake_case routes.
type Page[T any] struct {
	Data       []T     `json:"data"`
	NextCursor *string `json:"next_cursor"`
}

// CamelPage is the list envelope of camelCase (durable-job) routes.
type CamelPage[T any] struct {
	Data       []T     `json:"data"`
	NextCursor *string `json:"nextCursor"`
}

// NewPage builds a page from items fetched with limit+1, using cursorOf on
// the last returned item when there are more.
func NewPage[T any](items []T, limit int, cursorOf func(T) string) Page[T] {
	p := Page[T]{Data: items}
	if p.Data == nil {
		p.Data = []T{}
	}
	if len(items) > limit {
		p.Data = items[:limit]
		next := cursorOf(items[limit-1])
		p.NextCursor = &next
	}
	return p
}

// NewCamelPage is NewPage for camelCase routes.
func NewCamelPage[T any](items []T, limit int, cursorOf func(T) string) CamelPage[T] {
	p := NewPage(items, limit, cursorOf)
	return CamelPage[T]{Data: p.Data, NextCursor: p.NextCursor}
}

// errorBody is the envelope of every failure.
type errorBody struct {
	Error apierr.Wire `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	b, err := json.Marshal(body)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal_error","message":"Internal error.","detail":{}}}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
	_, _ = w.Write([]byte("\n"))
}

// WriteOutsideError answers e for an entry point that could not reach the
// router (a Vercel instance that failed to start, a Lambda event that is not
// a request): a fresh request id in the header, and in the body's detail for
// a 5xx, as the router answers them.
func WriteOutsideError(w http.ResponseWriter, e *apierr.Error) {
	reqID := ids.New(ids.Request)
	w.Header().Set("X-Request-Id", reqID)
	if e.Status >= 500 {
		e = e.WithDetail("request_id", reqID)
	}
	writeError(w, e)
}

func writeError(w http.ResponseWriter, e *apierr.Error) {
	if e.Status == http.StatusTooManyRequests {
		if s, ok := e.Detail["retry_after_seconds"].(int); ok {
			w.Header().Set("Retry-After", fmt.Sprint(s))
		}
	}
	writeJSON(w, e.Status, errorBody{Error: e.Wire()})
}

// Package jsonx holds small JSON helpers shared by request types and the
// writers of API bodies.
package jsonx

import (
	"bytes"
	"encoding/json"
)

// Optional distinguishes a field that was omitted from one sent as null, which
// merge-style PUTs need: omitted keeps the stored value, null clears it.
type Optional[T any] struct {
	Set   bool // the field was present in the body
	Null  bool // the field was present and null
	Value T
}

// UnmarshalJSON records presence and nullness.
func (o *Optional[T]) UnmarshalJSON(b []byte) error {
	o.Set = true
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		o.Null = true
		return nil
	}
	return json.Unmarshal(b, &o.Value)
}

// MarshalJSON writes null when unset or null.
func (o Optional[T]) MarshalJSON() ([]byte, error) {
	if !o.Set || o.Null {
		return []byte("null"), nil
	}
	return json.Marshal(o.Value)
}

// Ptr returns the value as a pointer: nil when unset or null.
func (o Optional[T]) Ptr() *T {
	if !o.Set || o.Null {
		return nil
	}
	v := o.Value
	return &v
}

// Apply merges o into dst: unset leaves dst, null clears it, a value sets it.
func (o Optional[T]) Apply(dst **T) {
	switch {
	case !o.Set:
	case o.Null:
		*dst = nil
	default:
		v := o.Value
		*dst = &v
	}
}

// Marshal is json.Marshal without HTML escaping: API bodies are JSON, never
// HTML, and escaping writes each <, > and & as six bytes, so a body the API
// measures against its limits (a claim's inputs, a relayed MCP argument)
// would grow up to six times on the way (review, MCP QA).
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil // Encode ends the document with a newline
}

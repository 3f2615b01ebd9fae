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

// UnmarshalJSON records presence and nullness. Each call says it anew: of
// a key sent twice the last value counts, as for a pointer (fuzzing: after
// {"n":null,"n":2} the field stayed null, holding 2). Request bodies
// refuse repeated keys (jsonstrict); this is for any other reader.
func (o *Optional[T]) UnmarshalJSON(b []byte) error {
	o.Set = true
	o.Null = bytes.Equal(bytes.TrimSpace(b), []byte("null"))
	if o.Null {
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
// would grow up to six times on the way (review, MCP QA). The encoder also
// writes U+2028 and U+2029 as six-byte escapes (for JSONP, which no answer
// is) whatever it is told; they are written back as their three bytes of
// UTF-8, so a re-encoded body is never longer than the JSON it was read
// from (MCP QA: a result REST took was payload_too_large through MCP,
// after the agent had acted).
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	out := bytes.TrimSuffix(buf.Bytes(), []byte("\n")) // Encode ends the document with a newline
	return unescapeLineSeparators(out), nil
}

// unescapeLineSeparators rewrites the encoder's \u2028 and \u2029 escapes
// in b as the characters. Only an escape is rewritten: a backslash the
// encoder escaped (\\u2028 is the text \u2028) is skipped with the byte
// it escapes, and the escapes occur only inside strings.
func unescapeLineSeparators(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u202`)) {
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 == len(b) {
			out = append(out, b[i])
			continue
		}
		if b[i+1] == 'u' && i+6 <= len(b) && (string(b[i+2:i+6]) == "2028" || string(b[i+2:i+6]) == "2029") {
			if b[i+5] == '8' {
				out = append(out, "\u2028"...)
			} else {
				out = append(out, "\u2029"...)
			}
			i += 5
			continue
		}
		out = append(out, b[i], b[i+1])
		i++
	}
	return out
}

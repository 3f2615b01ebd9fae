// Package redact turns stored JSON (inputs, outputs, payloads) into previews
// that are safe to list and show: the shape stays (object keys, array
// lengths up to a bound), every value becomes a type placeholder. Keys are
// kept because they name fields, not data; values never leave in clear.
package redact

import (
	"bytes"
	"encoding/json"
	"fmt"
)

const (
	maxDepth = 8
	maxItems = 20
	maxKeys  = 50
)

// Preview returns the redacted form of raw JSON. Invalid JSON previews as
// "<invalid>" rather than failing, since a preview is informational.
func Preview(raw []byte) any {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "<invalid>"
	}
	return value(v, 0)
}

// PreviewJSON is Preview encoded as JSON (for storing in a jsonb column).
func PreviewJSON(raw []byte) []byte {
	b, _ := json.Marshal(Preview(raw))
	return b
}

func value(v any, depth int) any {
	switch t := v.(type) {
	case nil:
		return nil
	case bool:
		return "<boolean>"
	case json.Number:
		return "<number>"
	case string:
		return "<string>"
	case []any:
		if depth >= maxDepth {
			return "<array>"
		}
		out := make([]any, 0, min(len(t), maxItems+1))
		for i, e := range t {
			if i == maxItems {
				out = append(out, fmt.Sprintf("<%d more>", len(t)-maxItems))
				break
			}
			out = append(out, value(e, depth+1))
		}
		return out
	case map[string]any:
		if depth >= maxDepth {
			return "<object>"
		}
		out := make(map[string]any, min(len(t), maxKeys))
		n := 0
		for k, e := range t {
			if n == maxKeys {
				out["…"] = fmt.Sprintf("<%d more keys>", len(t)-maxKeys)
				break
			}
			out[k] = value(e, depth+1)
			n++
		}
		return out
	default:
		return "<value>"
	}
}

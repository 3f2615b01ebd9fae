// Package canonjson produces canonical JSON: object keys sorted, array order
// kept, no insignificant white space, numbers in their shortest exact form.
// Fingerprints and generated idempotency keys hash it, so equivalent requests
// agree whatever order their producer wrote the keys in.
package canonjson

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
)

// Marshal returns the canonical encoding of v (any JSON-marshalable value,
// including json.RawMessage).
func Marshal(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("canonjson: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, fmt.Errorf("canonjson: %w", err)
	}
	var buf bytes.Buffer
	if err := write(&buf, tree); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func write(buf *bytes.Buffer, v any) error {
	switch t := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			buf.Write(kb)
			buf.WriteByte(':')
			if err := write(buf, t[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := write(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case json.Number:
		buf.WriteString(normalizeNumber(t))
	default:
		b, err := json.Marshal(t)
		if err != nil {
			return fmt.Errorf("canonjson: %w", err)
		}
		buf.Write(b)
	}
	return nil
}

// normalizeNumber writes integers exactly and other numbers in Go's shortest
// float form, so 1.0 and 1 hash alike (JavaScript's rule).
func normalizeNumber(n json.Number) string {
	if i, err := n.Int64(); err == nil {
		return fmt.Sprint(i)
	}
	if f, err := n.Float64(); err == nil {
		if f == float64(int64(f)) && f < 1e18 && f > -1e18 {
			return fmt.Sprint(int64(f))
		}
		b, _ := json.Marshal(f)
		return string(b)
	}
	return n.String()
}

// Hash returns hex SHA-256 of the canonical encoding of v.
func Hash(v any) (string, error) {
	b, err := Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

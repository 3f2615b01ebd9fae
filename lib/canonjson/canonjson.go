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
	"strconv"
	"unicode/utf8"
)

// Canonical is JSON already in canonical form: a result of Marshal. Inside
// a value given to Marshal or Hash (as the value itself or an element of a
// []any) it is copied as it is rather than parsed again: canonical JSON is
// its own canonical form, so the bytes are the same, and an input
// canonicalised once is not re-parsed for every hash that includes it.
// Bytes that are not a Marshal result must not be converted to Canonical.
type Canonical []byte

// Marshal returns the canonical encoding of v (any JSON-marshalable value,
// including json.RawMessage and Canonical).
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := encode(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// encode writes the canonical encoding of v: a Canonical as it is, a []any
// element by element, a valid string, a bool, an integer (or a pointer to a
// string or an integer) or nil directly, anything else
// through encoding/json and back (so that object keys come out sorted and
// numbers normalised).
func encode(buf *bytes.Buffer, v any) error {
	switch t := v.(type) {
	case Canonical:
		buf.Write(t)
		return nil
	case nil, bool:
		return write(buf, t)
	case string:
		// encoding/json gives a valid string back unchanged (an invalid one
		// comes back with U+FFFD in place of its bad bytes).
		if utf8.ValidString(t) {
			return write(buf, t)
		}
	case *string:
		if t == nil {
			return write(buf, nil)
		}
		return encode(buf, *t)
	case int:
		buf.WriteString(strconv.Itoa(t))
		return nil
	case int32:
		buf.WriteString(strconv.FormatInt(int64(t), 10))
		return nil
	case int64:
		buf.WriteString(strconv.FormatInt(t, 10))
		return nil
	case *int, *int32, *int64:
		// An operation's optional numbers (a timeout, a contract version).
		return encode(buf, derefInt(t))
	case []any:
		return writeArray(buf, t, encode)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("canonjson: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return fmt.Errorf("canonjson: %w", err)
	}
	return write(buf, tree)
}

// derefInt is the integer p points to, or nil for a nil pointer.
func derefInt(p any) any {
	switch t := p.(type) {
	case *int:
		if t != nil {
			return *t
		}
	case *int32:
		if t != nil {
			return *t
		}
	case *int64:
		if t != nil {
			return *t
		}
	}
	return nil
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
		return writeArray(buf, t, write)
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

// writeArray writes elems as a JSON array, each element with elem.
func writeArray(buf *bytes.Buffer, elems []any, elem func(*bytes.Buffer, any) error) error {
	buf.WriteByte('[')
	for i, e := range elems {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := elem(buf, e); err != nil {
			return err
		}
	}
	buf.WriteByte(']')
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

// Package redact turns sensitive JSON documents (effect payloads, job inputs
// and outputs) into previews that listings and dashboards may show: the shape
// survives, the values do not.
package redact

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Limits keep a preview small whatever the document: deeper objects collapse
// to "<object>", and an object with more keys keeps only the first ones in
// document order plus a "…" entry counting the rest.
const (
	MaxDepth = 4
	MaxKeys  = 50
)

// PreviewJSON returns the redacted preview of a JSON document, as JSON (for
// a jsonb column or a response): object keys are kept, every other value is
// replaced by a placeholder naming its type ("<string>", "<number>",
// "<boolean>", "<array>"), null stays null. Invalid JSON and an empty
// document preview as null.
func PreviewJSON(doc []byte) []byte {
	if len(bytes.TrimSpace(doc)) == 0 {
		return []byte("null")
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var buf bytes.Buffer
	if err := preview(dec, &buf, 0); err != nil {
		return []byte("null")
	}
	return buf.Bytes()
}

// preview reads one value from dec and writes its redaction to buf.
func preview(dec *json.Decoder, buf *bytes.Buffer, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			if depth >= MaxDepth {
				buf.WriteString(`"<object>"`)
				return skipRest(dec)
			}
			return previewObject(dec, buf, depth)
		case '[':
			buf.WriteString(`"<array>"`)
			return skipRest(dec)
		}
		return fmt.Errorf("redact: unexpected %v", t)
	case string:
		buf.WriteString(`"<string>"`)
	case json.Number:
		buf.WriteString(`"<number>"`)
	case bool:
		buf.WriteString(`"<boolean>"`)
	case nil:
		buf.WriteString("null")
	}
	return nil
}

func previewObject(dec *json.Decoder, buf *bytes.Buffer, depth int) error {
	buf.WriteByte('{')
	n := 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		if n >= MaxKeys {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return err
			}
			n++
			continue
		}
		if n > 0 {
			buf.WriteByte(',')
		}
		kb, _ := json.Marshal(key)
		buf.Write(kb)
		buf.WriteByte(':')
		if err := preview(dec, buf, depth+1); err != nil {
			return err
		}
		n++
	}
	if n > MaxKeys {
		fmt.Fprintf(buf, `,"…":"<%d more keys>"`, n-MaxKeys)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return err
	}
	buf.WriteByte('}')
	return nil
}

// skipRest consumes the rest of the object or array whose opening delimiter
// was just read.
func skipRest(dec *json.Decoder) error {
	for depth := 1; depth > 0; {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				depth++
			default:
				depth--
			}
		}
	}
	return nil
}

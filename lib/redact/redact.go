// Package redact turns sensitive JSON documents (effect payloads, job inputs
// and outputs) into previews that listings and dashboards may show: the shape
// survives, the values do not.
package redact

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Limits keep a preview small whatever the document: deeper objects collapse
// to "<object>", an object with more keys keeps only the first ones in
// document order plus a "…" entry counting the rest, a key longer than
// MaxKeyRunes is cut (ending in "…"), and once the preview has MaxBytes no
// further key is kept (each open object counts the rest). Without the last
// two a preview could outgrow its document (fuzzing: four levels of 50 keys
// previewed 2.5 times larger), and listings return up to 200 of them.
const (
	MaxDepth    = 4
	MaxKeys     = 50
	MaxKeyRunes = 64
	MaxBytes    = 8 << 10
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
	n, kept, sawMore := 0, 0, false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		if n >= MaxKeys || buf.Len() >= MaxBytes {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return err
			}
			n++
			continue
		}
		if kept > 0 {
			buf.WriteByte(',')
		}
		if key == moreKey {
			sawMore = true
		}
		kb, _ := json.Marshal(cutKey(key))
		buf.Write(kb)
		buf.WriteByte(':')
		if err := preview(dec, buf, depth+1); err != nil {
			return err
		}
		n++
		kept++
	}
	if n > kept {
		// The document's own "…" key, kept above, would be named twice.
		marker := moreKey
		if sawMore {
			marker = moreKey + moreKey
		}
		if kept > 0 {
			buf.WriteByte(',')
		}
		fmt.Fprintf(buf, `%q:"<%d more keys>"`, marker, n-kept)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return err
	}
	buf.WriteByte('}')
	return nil
}

// moreKey names the entry counting an object's keys left out.
const moreKey = "…"

// cutKey shortens a key to MaxKeyRunes, marking the cut.
func cutKey(key string) string {
	if utf8.RuneCountInString(key) <= MaxKeyRunes {
		return key
	}
	return string([]rune(key)[:MaxKeyRunes-1]) + moreKey
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

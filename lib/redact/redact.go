// Package redact turns sensitive JSON documents (effect payloads, job inputs
// and outputs) into previews that listings and dashboards may show: the shape
// survives, the values do not. It also writes errors as logs may hold them
// (ErrorText, Logger): what an error quotes of a value is withheld.
package redact

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"unicode/utf8"

	"github.com/getratchet/ratchet/lib/jsonx"
)

// Limits keep a preview small whatever the document: deeper objects collapse
// to "<object>", an object with more keys keeps only the first ones in
// document order plus a "…" entry counting the rest, a key longer than
// MaxKeyRunes is cut (ending in "…"), and once the preview has MaxBytes no
// further key is kept (each open object counts the rest). Without the last
// two a preview could outgrow its document (fuzzing: four levels of 50 keys
// previewed 2.5 times larger), and listings return up to 200 of them. A cut
// key that would repeat a key its object already shows is cut shorter and
// followed, after the "…", by 8 hex digits of its full key's hash, so that
// two long keys sharing their first runes both survive a jsonb column.
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
	if p, ok := previewPlain(doc); ok {
		return p
	}
	return previewDecoded(doc)
}

// previewDecoded is PreviewJSON through encoding/json's token reader: every
// document previewPlain leaves to it (and the reference its tests hold
// previewPlain to, byte for byte).
func previewDecoded(doc []byte) []byte {
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
	// shown maps each key written so far to the document key it stands for:
	// a cut key must not repeat another's, or jsonb keeps only one. (A short
	// key spelled exactly like an earlier cut one still repeats it: a preview
	// is written as it is read, and the document's own key is not renamed.)
	shown := make(map[string]string)
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
		out := cutKey(key, shown)
		shown[out] = key
		kb, _ := json.Marshal(out)
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

// hashDigits is how many hex digits of a cut key's hash tell it apart.
const hashDigits = 8

// cutKey shortens a key to MaxKeyRunes, marking the cut with "…". shown maps
// the keys its object already shows to the keys they stand for; when the cut
// would repeat one of another key, the cut is hashDigits runes shorter and
// followed by hex digits of key's hash: deterministic (the same document
// previews the same) and still within MaxKeyRunes and no more bytes than the
// plain cut, so MaxBytes holds as before.
// A repeated document key is left to repeat, as a short one is.
func cutKey(key string, shown map[string]string) string {
	if utf8.RuneCountInString(key) <= MaxKeyRunes {
		return key
	}
	runes := []rune(key)
	cut := string(runes[:MaxKeyRunes-1]) + moreKey
	// Another salt only on a hash collision (or a document key spelled like
	// a hashed cut): at most MaxKeys keys are shown, so this ends quickly.
	for salt := uint32(0); ; salt++ {
		if from, taken := shown[cut]; !taken || from == key {
			return cut
		}
		cut = string(runes[:MaxKeyRunes-1-hashDigits]) + moreKey + keyHash(key, salt)
	}
}

// keyHash is hashDigits hex digits of FNV-1a over salt and key: stable
// across processes and releases, unlike hash/maphash.
func keyHash(key string, salt uint32) string {
	h := fnv.New32a()
	if salt > 0 {
		fmt.Fprintf(h, "%d:", salt)
	}
	h.Write([]byte(key))
	return fmt.Sprintf("%0*x", hashDigits, h.Sum32())
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

// previewPlain previews a document without encoding/json's token reader,
// which allocated for every key and value (and an error for each scalar
// it read: 16 allocations for {"n":1234}), when that is plainly the same:
// the document is one valid JSON value, and every key the preview shows is
// printable ASCII that encoding/json writes back unchanged (no escape, no
// HTML character), at most MaxKeyRunes long, and no object needs its keys
// counted (MaxKeys, MaxBytes). Otherwise ok is false and PreviewJSON reads
// the document with the token reader, as it always did: cut keys, escapes,
// bytes beyond ASCII and oversized objects stay its work.
func previewPlain(doc []byte) (out []byte, ok bool) {
	if !json.Valid(doc) {
		return nil, false
	}
	w := plainWalk{b: doc, out: make([]byte, 0, 64)}
	w.value(0)
	if w.bail {
		return nil, false
	}
	return w.out, true
}

// plainWalk is previewPlain's pass over a valid document.
type plainWalk struct {
	b    []byte
	i    int
	out  []byte
	bail bool // a key or an object previewPlain leaves to the token reader
}

func (w *plainWalk) space() {
	for w.i < len(w.b) && (w.b[w.i] == ' ' || w.b[w.i] == '\t' || w.b[w.i] == '\n' || w.b[w.i] == '\r') {
		w.i++
	}
}

// value previews the value at w.i, depth objects deep, as preview does.
func (w *plainWalk) value(depth int) {
	w.space()
	switch c := w.b[w.i]; {
	case c == '{':
		if depth >= MaxDepth {
			w.out = append(w.out, `"<object>"`...)
			w.skip()
			return
		}
		w.object(depth)
	case c == '[':
		w.out = append(w.out, `"<array>"`...)
		w.skip()
	case c == '"':
		w.out = append(w.out, `"<string>"`...)
		w.skip()
	case c == 't' || c == 'f':
		w.out = append(w.out, `"<boolean>"`...)
		w.skip()
	case c == 'n':
		w.out = append(w.out, "null"...)
		w.skip()
	default:
		w.out = append(w.out, `"<number>"`...)
		w.skip()
	}
}

func (w *plainWalk) object(depth int) {
	w.out = append(w.out, '{')
	w.i++ // {
	for kept := 0; !w.bail; {
		w.space()
		switch w.b[w.i] {
		case '}':
			w.i++
			w.out = append(w.out, '}')
			return
		case ',':
			w.i++
			continue
		}
		if kept >= MaxKeys || len(w.out) >= MaxBytes {
			w.bail = true // the rest is counted under "…"
			return
		}
		start := w.i + 1
		w.skip()
		key := w.b[start : w.i-1]
		if len(key) > MaxKeyRunes || !plainKey(key) {
			w.bail = true
			return
		}
		if kept > 0 {
			w.out = append(w.out, ',')
		}
		w.out = append(w.out, '"')
		w.out = append(w.out, key...)
		w.out = append(w.out, '"', ':')
		w.space()
		w.i++ // :
		w.value(depth + 1)
		kept++
	}
}

// plainKey reports whether json.Marshal writes key back as it is: printable
// ASCII without a quote, a backslash or an HTML character (<, >, &).
func plainKey(key []byte) bool {
	for _, c := range key {
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// skip passes over the valid value at w.i (after any space).
func (w *plainWalk) skip() { w.i = jsonx.SkipValue(w.b, w.i) }

// Package jsonx holds small JSON helpers shared by request types and the
// writers of API bodies.
package jsonx

import (
	"bytes"
	"encoding/json"
	"sync"
	"unicode/utf8"
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

// Encoder writes JSON as Marshal does, a piece at a time into one buffer,
// so that an answer can be measured as it is built and cut before it passes
// its budget, each value encoded once (httpapi.NewPage).
type Encoder struct {
	buf bytes.Buffer
	enc *json.Encoder
}

// NewEncoder is an empty Encoder.
func NewEncoder() *Encoder {
	e := &Encoder{}
	e.enc = json.NewEncoder(&e.buf)
	e.enc.SetEscapeHTML(false)
	return e
}

// Raw appends JSON text as it is.
func (e *Encoder) Raw(s string) { e.buf.WriteString(s) }

// Value appends v as Marshal writes it.
func (e *Encoder) Value(v any) error {
	if err := e.enc.Encode(v); err != nil {
		return err
	}
	e.buf.Truncate(e.buf.Len() - 1) // Encode ends each value with a newline
	return nil
}

// encoders keeps Encoders for Borrow: Marshal makes a json.Encoder and
// grows a fresh buffer from nothing for every answer, a few allocations
// and copies each (pprof of the gate's begin and report: writeJSON).
var encoders = sync.Pool{New: func() any { return NewEncoder() }}

// maxKept bounds the buffer Release keeps: one grown by a large answer (a
// claim's inputs, a page, up to answer.Budget) is let go, not held by the
// pool for every small answer after it.
const maxKept = 64 << 10

// Borrow is an empty Encoder from a pool, for an answer written at once
// and let go: Release it when what Bytes answered is no longer used.
func Borrow() *Encoder { return encoders.Get().(*Encoder) }

// Release empties e and gives it back to Borrow's pool. Neither e nor what
// its Bytes answered may be used after.
func (e *Encoder) Release() {
	if e.buf.Cap() > maxKept {
		return
	}
	e.buf.Reset()
	encoders.Put(e)
}

// Len is how many bytes are written so far: at least what Bytes answers.
func (e *Encoder) Len() int { return e.buf.Len() }

// Truncate drops what was written after the first n bytes.
func (e *Encoder) Truncate(n int) { e.buf.Truncate(n) }

// Bytes is what was written, as Marshal would answer it.
func (e *Encoder) Bytes() []byte { return unescapeLineSeparators(e.buf.Bytes()) }

// unescapeLineSeparators rewrites the encoder's \u2028 and \u2029 escapes
// in b as the characters. Only an escape is rewritten: a backslash the
// encoder escaped (\\u2028 is the text \u2028) is skipped with the byte
// it escapes, and the escapes occur only inside strings.
func unescapeLineSeparators(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u202`)) {
		return b
	}
	return unescape(b, lineSeparators)
}

// Unescaped rewrites the escapes an encoder writes for JSONP and HTML
// (\u2028, \u2029, \u003c, \u003e and \u0026) in the JSON document b as the
// characters themselves, which say the same in fewer bytes: an answer's
// size is what it costs (answer.Budget), and encoding/json writes each <, >
// and & of a json.RawMessage it is given as six bytes whatever it is told
// (the MCP SDK's batches and tool results). As unescapeLineSeparators, only
// an escape is rewritten. b is returned as it is when it holds none.
func Unescaped(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u202`)) && !bytes.Contains(b, []byte(`\u00`)) {
		return b
	}
	return unescape(b, plainEscapes)
}

// unescape rewrites in b the \u escapes set names (by their hex digits, as
// encoding/json writes them) as the characters they stand for.
func unescape(b []byte, set map[string]string) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 == len(b) {
			out = append(out, b[i])
			continue
		}
		if b[i+1] == 'u' && i+6 <= len(b) {
			if r, ok := set[string(b[i+2:i+6])]; ok {
				out = append(out, r...)
				i += 5
				continue
			}
		}
		out = append(out, b[i], b[i+1])
		i++
	}
	return out
}

var (
	lineSeparators = map[string]string{"2028": "\u2028", "2029": "\u2029"}
	plainEscapes   = map[string]string{"2028": "\u2028", "2029": "\u2029", "003c": "<", "003e": ">", "0026": "&"}
)

// StringLen is the length of s as Marshal writes it, quotes included,
// without writing it: a quote or a backslash takes two bytes, a control
// character two (\b, \f, \n, \r, \t) or six (\u00XX), an invalid UTF-8 byte
// six (\ufffd), any other character its UTF-8 bytes. An answer is measured
// by it against its budget before it is encoded (a reconciliation's).
func StringLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t':
				n += 2
			case c < 0x20:
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			n += 6
		} else {
			n += size
		}
		i += size
	}
	return n
}

// OutsideStrings calls visit with each byte of JSON document doc that is
// not inside a string (nor a string's quotes), until visit answers true: a
// scan of a document's structure without decoding it.
func OutsideStrings(doc []byte, visit func(c byte) (stop bool)) {
	inString, escaped := false, false
	for _, c := range doc {
		switch {
		case !inString:
			if c == '"' {
				inString = true
			} else if visit(c) {
				return
			}
		case escaped:
			escaped = false
		case c == '\\':
			escaped = true
		case c == '"':
			inString = false
		}
	}
}

// SkipValue answers the index just past the JSON value at b[i:] (after any
// whitespace before it), which must be well-formed (decoded, or json.Valid):
// past a string's closing quote or a container's closing bracket, at the
// character after a scalar. It does not validate; it only passes over.
func SkipValue(b []byte, i int) int {
	for i < len(b) && isJSONSpace(b[i]) {
		i++
	}
	depth := 0
	for ; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // a scalar's end: its container's close
			}
			if depth--; depth == 0 {
				return i + 1
			}
		default:
			if depth == 0 && (c == ',' || c == ':' || isJSONSpace(c)) {
				return i // a scalar's end
			}
		}
	}
	return i
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

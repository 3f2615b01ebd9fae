package jsonx

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzMarshal: Marshal writes what encoding/json writes, read back as the
// same value, never longer, with <, >, &, U+2028 and U+2029 as themselves
// and no trailing newline, whatever the strings hold (keys too, and text
// that looks like an escape: \u2028 written out, backslashes before it).
func FuzzMarshal(f *testing.F) {
	for _, s := range []string{"", "plain", "<a href='x'>&</a>", "a\u2028b\u2029c", `\u2028`, `\\u2029`,
		"\\\u2028", "x\\", "\u2028\u2028", `"\u2028"`, "\u2027\u202a\u20281", "\xff\xfe", "\x00\x1f\x7f",
		"\ud7ff\ue000\U0010ffff", `\`, `\\\u2028`, `\u202`, "é😀"} {
		f.Add(s, s+"k")
	}
	f.Fuzz(func(t *testing.T, s, k string) {
		for _, v := range []any{s, map[string]any{k: s, "n": []any{s, 1.5, nil, true}}, []string{k, s}} {
			got, err := Marshal(v)
			if err != nil {
				t.Fatalf("%#v: %v", v, err)
			}
			std, _ := json.Marshal(v)
			if !json.Valid(got) {
				t.Fatalf("%#v: %q is not JSON", v, got)
			}
			if len(got) > len(std) || bytes.HasSuffix(got, []byte("\n")) {
				t.Fatalf("%#v: %q (encoding/json: %q)", v, got, std)
			}
			var back, want any
			if err := json.Unmarshal(got, &back); err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal(std, &want)
			if !reflect.DeepEqual(back, want) {
				t.Fatalf("%#v: %q reads as %#v, encoding/json's %q as %#v", v, got, back, std, want)
			}
			for _, esc := range []string{`\u003c`, `\u003e`, `\u0026`, `\u2028`, `\u2029`} {
				// Outside escaped backslashes, an escape for one of these
				// would be the encoder's.
				if bytes.Count(got, []byte(esc)) > bytes.Count(got, []byte(`\`+esc)) {
					t.Fatalf("%#v: %q holds the escape %s", v, got, esc)
				}
			}
		}
	})
}

// optionals is a body with an Optional of each kind a request uses.
type optionals struct {
	I Optional[int64]          `json:"i"`
	S Optional[string]         `json:"s"`
	F Optional[float64]        `json:"f"`
	M Optional[map[string]int] `json:"m"`
}

// plain is the same body with pointers, which encoding/json decodes alike
// but for null and omission.
type plain struct {
	I *int64          `json:"i"`
	S *string         `json:"s"`
	F *float64        `json:"f"`
	M *map[string]int `json:"m"`
}

// FuzzOptional: an Optional takes what a pointer of its type takes, is set
// exactly when the key was sent, null exactly when it was null, and holds
// the pointer's value; Ptr, Apply and MarshalJSON agree with that.
func FuzzOptional(f *testing.F) {
	for _, s := range []string{`{}`, `{"i":null}`, `{"i":7,"s":"x","f":1.5,"m":{"a":1}}`, `{"i":"7"}`,
		`{"i": null }`, `{"s":null,"m":null,"f":null}`, `{"i":1e3}`, `{"i":9223372036854775808}`,
		`{"f":-0}`, `{"s":"\u2028<&>"}`, `{"m":{"a":null}}`, `{"i":1,"i":null}`, `{"I":3}`, `{"i":nul}`,
		`{"i":null,"i":2}`, `{"f":1e400}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var o optionals
		var p plain
		errO := json.Unmarshal(body, &o)
		errP := json.Unmarshal(body, &p)
		if (errO == nil) != (errP == nil) {
			t.Fatalf("%q: Optional %v, pointer %v", body, errO, errP)
		}
		if errO != nil {
			return
		}
		sent := members(body)
		checkOptional(t, body, "i", o.I, p.I, sent)
		checkOptional(t, body, "s", o.S, p.S, sent)
		checkOptional(t, body, "f", o.F, p.F, sent)
		checkOptional(t, body, "m", o.M, p.M, sent)
	})
}

func checkOptional[T any](t *testing.T, body []byte, name string, o Optional[T], p *T, sent []member) {
	t.Helper()
	raw, wasSent := lastMatch(sent, name)
	isNull := wasSent && bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
	if o.Set != wasSent || o.Null != isNull {
		t.Fatalf("%q: %s Set=%v Null=%v, sent %v null %v", body, name, o.Set, o.Null, wasSent, isNull)
	}
	if !reflect.DeepEqual(o.Ptr(), p) {
		t.Fatalf("%q: %s Ptr %#v, a pointer decodes %#v", body, name, o.Ptr(), p)
	}
	stored := new(T)
	o.Apply(&stored)
	switch {
	case !o.Set && stored == nil, o.Null && stored != nil, o.Set && !o.Null && !reflect.DeepEqual(stored, p):
		t.Fatalf("%q: %s Apply gave %#v", body, name, stored)
	}
	got, err := o.MarshalJSON()
	want, _ := json.Marshal(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%q: %s marshals as %s (%v), a pointer as %s", body, name, got, err, want)
	}
}

// member is one key of a body's object, in document order.
type member struct {
	key string
	raw json.RawMessage
}

// members lists the keys of the object body holds, in order, repeats too.
func members(body []byte) []member {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var out []member
	for dec.More() {
		k, _ := dec.Token()
		var raw json.RawMessage
		_ = dec.Decode(&raw)
		out = append(out, member{k.(string), raw})
	}
	return out
}

// lastMatch is the value encoding/json gives field name: that of the
// last key naming it, exactly or folding case.
func lastMatch(sent []member, name string) (json.RawMessage, bool) {
	for i := len(sent) - 1; i >= 0; i-- {
		if bytes.EqualFold([]byte(sent[i].key), []byte(name)) {
			return sent[i].raw, true
		}
	}
	return nil, false
}

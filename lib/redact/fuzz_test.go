package redact

import (
	"bytes"
	"encoding/json"
	"regexp"
	"testing"
)

var placeholder = regexp.MustCompile(`^<(string|number|boolean|array|object|\d+ more keys)>$`)

// FuzzPreviewJSON: whatever the document, the preview is valid JSON of the
// documented shape: objects at most MaxDepth deep, each with at most MaxKeys
// keys (plus the "…" count), every other value a placeholder or null, and
// about MaxBytes at most.
func FuzzPreviewJSON(f *testing.F) {
	for _, s := range []string{``, `null`, `"s"`, `1`, `[1,{"a":2}]`, `{"a":{"b":{"c":{"d":{"e":"x"}}}}}`,
		`{"to":"alice@example.com","amount":12.5,"ok":true,"n":null,"tags":["a"],"addr":{"zip":1}}`,
		`{"a":1} {"b":2}`, `{"a":`, `{"a":1,"a":2}`, "{\"\xff\":1}", `{"\u0000":"\ud800"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		p := PreviewJSON(doc)
		if string(p) == "null" {
			return
		}
		if !json.Valid(p) {
			t.Fatalf("%q previews as invalid JSON %q", doc, p)
		}
		if len(p) > MaxBytes+2<<10 {
			t.Fatalf("%d-byte document previews in %d bytes", len(doc), len(p))
		}
		dec := json.NewDecoder(bytes.NewReader(p))
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		checkShape(t, doc, p, v, 0)
	})
}

func checkShape(t *testing.T, doc, p []byte, v any, depth int) {
	switch n := v.(type) {
	case nil:
	case string:
		if !placeholder.MatchString(n) {
			t.Fatalf("%q: preview %s holds %q", doc, p, n)
		}
	case map[string]any:
		if depth >= MaxDepth {
			t.Fatalf("%q: preview %s deeper than %d", doc, p, MaxDepth)
		}
		if len(n) > MaxKeys+1 {
			t.Fatalf("%q: preview %s has %d keys", doc, p, len(n))
		}
		for _, c := range n {
			checkShape(t, doc, p, c, depth+1)
		}
	default:
		t.Fatalf("%q: preview %s holds %v", doc, p, v)
	}
}

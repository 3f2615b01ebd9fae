package redact

import (
	"fmt"
	"strings"
	"testing"
)

// previewPlain answers what the token reader answers, byte for byte, for
// every document it takes, and leaves to it the ones it must: keys
// encoding/json would escape or a preview would cut, objects whose keys a
// preview counts, documents that are not one valid value.
func TestPreviewPlainIsTheDecodersPreview(t *testing.T) {
	t.Parallel()
	keys := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf(`"k%d":%d`, i, i)
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	for doc, plain := range map[string]bool{
		`{"n":1234}`: true,
		` { "to" : "a@b.c" , "amount":-12.5e3,"ok":true,"no":false,"n":null,"tags":["a",{"b":1}],` +
			`"addr":{"street":"1 \"Main\"\\","zip":12345} } `: true,
		`{"a":{"b":{"c":{"d":{"e":"x"}}}}}`:          true,
		`{"a":{"b":{"c":{"d":[1,{"e":2}],"f":{}}}}}`: true,
		`{"a":1,"a":2,"":3,"x y":{}}`:                true,
		`"secret"`:                                   true,
		`[1,{"a":2}]`:                                true,
		`-0.5`:                                       true,
		`null`:                                       true,
		`{"s":"\u00e9\ud83d\ude00<&>","u":"\u0000"}`: true, // escapes in values only
		keys(MaxKeys):     true,
		keys(MaxKeys + 1): false, // counted under "…"
		`{"a<b":1}`:       false, // written \u003c
		`{"a&b":1}`:       false,
		`{"\u0061":1}`:    false,
		`{"é":1}`:         false,
		"{\"\x7f\":1}":    false,
		"{\"\xff\":1}":    false,
		`{"` + strings.Repeat("k", MaxKeyRunes) + `":1}`:   true,
		`{"` + strings.Repeat("k", MaxKeyRunes+1) + `":1}`: false, // cut
		`{"a":1} {"b":2}`: false,
		`{"a":1}x`:        false,
		`{"a":`:           false,
	} {
		got, ok := previewPlain([]byte(doc))
		if ok != plain {
			t.Errorf("%.80q: taken %v, want %v", doc, ok, plain)
		}
		if want := previewDecoded([]byte(doc)); ok && string(got) != string(want) {
			t.Errorf("%.80q: previews %s, the token reader %s", doc, got, want)
		}
		if want := string(previewDecoded([]byte(doc))); string(PreviewJSON([]byte(doc))) != want {
			t.Errorf("%.80q: PreviewJSON %s, the token reader %s", doc, PreviewJSON([]byte(doc)), want)
		}
	}
	// Past MaxBytes the preview counts the rest (each object within
	// MaxKeys): left to the token reader.
	level := func(inner string) string {
		parts := make([]string, 40)
		for i := range parts {
			parts[i] = fmt.Sprintf(`"%s%02d":%s`, strings.Repeat("k", 60), i, inner)
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	wide := []byte(level(level("1")))
	if _, ok := previewPlain(wide); ok {
		t.Errorf("a document past MaxBytes taken")
	}
	if !strings.Contains(string(PreviewJSON(wide)), "more keys") {
		t.Errorf("a document past MaxBytes previews without its count: %.200s", PreviewJSON(wide))
	}
}

// FuzzPreviewPlainIsTheDecodersPreview: whatever the document, previewPlain
// either leaves it or answers the token reader's preview.
func FuzzPreviewPlainIsTheDecodersPreview(f *testing.F) {
	for _, s := range []string{``, `null`, `"s"`, `1`, `[1,{"a":2}]`, `{"a":{"b":{"c":{"d":{"e":"x"}}}}}`,
		`{"to":"alice@example.com","amount":12.5,"ok":true,"n":null,"tags":["a"],"addr":{"zip":1}}`,
		`{"a":1} {"b":2}`, `{"a":`, `{"a":1,"a":2}`, "{\"\xff\":1}", `{"\u0000":"\ud800"}`, `{"a<":1}`,
		` {"a" : [ {"b":"\"}"} ] , "c":{}} `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		got, ok := previewPlain(doc)
		if !ok {
			return
		}
		if want := previewDecoded(doc); string(got) != string(want) {
			t.Fatalf("%q: previews %s, the token reader %s", doc, got, want)
		}
	})
}

func BenchmarkPreviewJSON(b *testing.B) {
	for name, doc := range map[string]string{
		"enqueue_input": `{"n":1234}`,
		"report_output": `{"ok":true}`,
		"payload":       `{"to":"alice@example.com","amount":12.5,"ok":true,"n":null,"tags":["a","b"],"addr":{"street":"1 Main","zip":12345}}`,
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				PreviewJSON([]byte(doc))
			}
		})
	}
}

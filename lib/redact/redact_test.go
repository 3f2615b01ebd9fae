package redact

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestPreviewKeepsKeysAndHidesValues(t *testing.T) {
	t.Parallel()
	got := PreviewJSON([]byte(`{"to":"alice@example.com","amount":12.5,"ok":true,"n":null,
		"tags":["a","b"],"addr":{"street":"1 Main","zip":12345}}`))
	require.JSONEq(t, `{"to":"<string>","amount":"<number>","ok":"<boolean>","n":null,
		"tags":"<array>","addr":{"street":"<string>","zip":"<number>"}}`, string(got))
	require.NotContains(t, string(got), "alice")
	require.NotContains(t, string(got), "12345")
}

func TestPreviewScalarsAndInvalid(t *testing.T) {
	t.Parallel()
	require.Equal(t, `"<string>"`, string(PreviewJSON([]byte(`"secret"`))))
	require.Equal(t, `"<array>"`, string(PreviewJSON([]byte(`[1,{"a":2}]`))))
	require.Equal(t, `null`, string(PreviewJSON(nil)))
	require.Equal(t, `null`, string(PreviewJSON([]byte(`{"a":`))))
}

func TestPreviewBoundsDepthAndKeys(t *testing.T) {
	t.Parallel()
	got := PreviewJSON([]byte(`{"a":{"b":{"c":{"d":{"e":"x"}}}}}`))
	require.JSONEq(t, `{"a":{"b":{"c":{"d":"<object>"}}}}`, string(got))

	var sb strings.Builder
	sb.WriteString("{")
	for i := 0; i < MaxKeys+3; i++ {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `"k%03d":%d`, i, i)
	}
	sb.WriteString("}")
	got = PreviewJSON([]byte(sb.String()))
	require.Contains(t, string(got), `"<3 more keys>"`)
	require.NotContains(t, string(got), `"k050"`)
}

// A preview stays small whatever the document: long keys are cut, and past
// MaxBytes every open object only counts its other keys (fuzzing: four
// levels of 50 keys previewed 2.5 times larger than the document). Its
// "more keys" entry never repeats a key the document kept.
func TestPreviewBoundsItsSize(t *testing.T) {
	t.Parallel()
	level := func(inner string) string {
		parts := make([]string, 50)
		for i := range parts {
			parts[i] = fmt.Sprintf(`"k%d":%s`, i, inner)
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	doc := level(level(level("1")))
	got := PreviewJSON([]byte(doc))
	require.LessOrEqual(t, len(got), MaxBytes+4<<10, "doc %d bytes, preview %d", len(doc), len(got))
	require.True(t, json.Valid(got))
	require.Contains(t, string(got), "more keys>")

	long := strings.Repeat("é", 500)
	got = PreviewJSON([]byte(`{"` + long + `":1}`))
	var m map[string]any
	require.NoError(t, json.Unmarshal(got, &m))
	for k := range m {
		require.Equal(t, MaxKeyRunes, utf8.RuneCountInString(k))
		require.True(t, strings.HasPrefix(long, strings.TrimSuffix(k, "…")))
	}

	var sb strings.Builder
	sb.WriteString(`{"…":1`)
	for i := range MaxKeys + 2 {
		fmt.Fprintf(&sb, `,"k%d":1`, i)
	}
	sb.WriteString("}")
	got = PreviewJSON([]byte(sb.String()))
	dec := json.NewDecoder(strings.NewReader(string(got)))
	seen := map[string]bool{}
	_, _ = dec.Token()
	for dec.More() {
		tok, err := dec.Token()
		require.NoError(t, err)
		k := tok.(string)
		require.False(t, seen[k], "key %q twice in %s", k, got)
		seen[k] = true
		var skip json.RawMessage
		require.NoError(t, dec.Decode(&skip))
	}
}

// Two long keys sharing their first MaxKeyRunes-1 runes were both cut to the
// same key, and a jsonb column kept only one of them. The second and third
// are now told apart by hex digits of their full key's hash after the "…",
// the same in every process.
func TestPreviewKeepsLongKeysWithACommonPrefixApart(t *testing.T) {
	t.Parallel()
	prefix := strings.Repeat("é", MaxKeyRunes-1)
	doc := `{"` + prefix + `-first":1,"` + prefix + `-second":{"a":1},"` + prefix + `-third":true,"short":1}`
	got := PreviewJSON([]byte(doc))

	short := string([]rune(prefix)[:MaxKeyRunes-1-8])
	// The hashes are FNV-1a 32 of the full keys, computed outside Go, so the
	// expectation pins the preview across processes and releases.
	want := `{"` + prefix + `…":"<number>",` +
		`"` + short + `…50d90c88":{"a":"<number>"},` +
		`"` + short + `…033afa3d":"<boolean>",` +
		`"short":"<number>"}`
	require.Equal(t, want, string(got))
	require.Equal(t, string(got), string(PreviewJSON([]byte(doc))))

	var m map[string]any
	require.NoError(t, json.Unmarshal(got, &m))
	require.Len(t, m, 4, "every key survives a jsonb column: %s", got)
	for k := range m {
		require.LessOrEqual(t, utf8.RuneCountInString(k), MaxKeyRunes)
	}

	// A document key repeated is still shown as the document has it, long
	// or short; and a key spelled like a hashed cut does not hide one.
	dup := `{"` + prefix + `-x":1,"` + prefix + `-x":2}`
	require.Equal(t, `{"`+prefix+`…":"<number>","`+prefix+`…":"<number>"}`, string(PreviewJSON([]byte(dup))))
	spoof := `{"` + prefix + `…":1,"` + short + `…50d90c88":2,"` + prefix + `-second":3}`
	m = nil
	require.NoError(t, json.Unmarshal(PreviewJSON([]byte(spoof)), &m))
	require.Len(t, m, 3, "%s", PreviewJSON([]byte(spoof)))
}

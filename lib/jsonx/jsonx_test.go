package jsonx

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

type body struct {
	N Optional[int64] `json:"n"`
}

func TestOptionalDistinguishesOmittedNullAndValue(t *testing.T) {
	t.Parallel()
	var omitted, null, value body
	require.NoError(t, json.Unmarshal([]byte(`{}`), &omitted))
	require.NoError(t, json.Unmarshal([]byte(`{"n":null}`), &null))
	require.NoError(t, json.Unmarshal([]byte(`{"n":7}`), &value))

	stored := int64(3)
	dst := &stored
	omitted.N.Apply(&dst)
	require.Equal(t, int64(3), *dst, "omitted keeps")
	value.N.Apply(&dst)
	require.Equal(t, int64(7), *dst, "a value sets")
	null.N.Apply(&dst)
	require.Nil(t, dst, "null clears")

	require.Nil(t, omitted.N.Ptr())
	require.Nil(t, null.N.Ptr())
	require.Equal(t, int64(7), *value.N.Ptr())
}

func TestOptionalRejectsWrongType(t *testing.T) {
	t.Parallel()
	var b body
	require.Error(t, json.Unmarshal([]byte(`{"n":"x"}`), &b))
}

func TestMarshalWritesMarkupAsIs(t *testing.T) {
	b, err := Marshal(map[string]any{"html": "<a href='x'>&</a>"})
	require.NoError(t, err)
	require.Equal(t, `{"html":"<a href='x'>&</a>"}`, string(b), "unescaped, with no trailing newline")
}

// U+2028 and U+2029 are written as their UTF-8 (three bytes), not the
// encoder's six-byte escapes, so re-encoding never makes a body longer
// (MCP QA); the text \u2028, a backslash and five letters, stays that.
func TestMarshalWritesLineSeparatorsAsIs(t *testing.T) {
	for _, s := range []string{"a\u2028b\u2029c", `\u2028`, `\\u2029`, "\\\u2028", "x\\", "\u2028\u2028", `"\u2028"`,
		"\u2027\u202a\u20281"} {
		b, err := Marshal(map[string]any{"s": s})
		require.NoError(t, err)
		var back map[string]string
		require.NoError(t, json.Unmarshal(b, &back), "%s", b)
		require.Equal(t, s, back["s"], "%q → %s", s, b)
		require.NotContains(t, string(b), `"\u2028`)
		std, _ := json.Marshal(map[string]any{"s": s})
		require.LessOrEqual(t, len(b), len(std))
	}
	b, err := Marshal(map[string]any{"s": "a\u2028b"})
	require.NoError(t, err)
	require.Equal(t, "{\"s\":\"a\u2028b\"}", string(b))
}

// StringLen is what Marshal writes for a string, escapes and all, so that
// an answer measured by it (a reconciliation's) is measured exactly.
func TestStringLenIsWhatMarshalWrites(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "plain", `"quoted" \ back`, "\b\f\n\r\t", "\x00\x01\x1f\x7f", "<a&b>",
		"é漢字🙂", "\u2028\u2029", "bad \xff\xfe utf-8", string([]byte{0xe2, 0x82}), "key:" + string(rune(0x10FFFF))} {
		b, err := Marshal(s)
		require.NoError(t, err)
		require.Equal(t, len(b), StringLen(s), "%q", s)
	}
}

// Unescaped writes the HTML and JSONP escapes encoding/json puts in a
// RawMessage as the characters, and leaves an escaped backslash's text.
func TestUnescapedRewritesHTMLEscapesOnly(t *testing.T) {
	t.Parallel()
	raw, err := json.Marshal([]json.RawMessage{json.RawMessage(`{"a":"<b>&\u2028","c":"\\u003c"}`)})
	require.NoError(t, err)
	require.Contains(t, string(raw), `\u003c`, "encoding/json escapes a RawMessage's markup")
	out := Unescaped(raw)
	require.Equal(t, "[{\"a\":\"<b>&\u2028\",\"c\":\"\\\\u003c\"}]", string(out))
	var back, want []map[string]string
	require.NoError(t, json.Unmarshal(out, &back))
	require.NoError(t, json.Unmarshal(raw, &want))
	require.Equal(t, want, back, "the same JSON")
	plain := []byte(`{"a":"\u0001"}`)
	require.Equal(t, plain, Unescaped(plain), "other escapes stay")
}

// SkipValue passes over one well-formed value, whatever it holds, and
// stops at what follows it.
func TestSkipValuePassesOverOneValue(t *testing.T) {
	t.Parallel()
	for doc, rest := range map[string]string{
		`  "a\"b\\",1`:                    `,1`,
		`{"a":[1,{"b":"}]"}],"c":"\""} x`: ` x`,
		`[[],{}]]`:                        `]`,
		`-1.5e3}`:                         `}`,
		`true :`:                          ` :`,
		`null`:                            ``,
		`"k":1`:                           `:1`,
		"12\n,":                           "\n,",
	} {
		if got := doc[SkipValue([]byte(doc), 0):]; got != rest {
			t.Errorf("%q: left %q, want %q", doc, got, rest)
		}
	}
}

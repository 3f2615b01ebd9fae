package canonjson

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMarshalSortsKeysKeepsArrays(t *testing.T) {
	t.Parallel()
	got, err := Marshal(json.RawMessage(`{"b": [3, 1, {"z":1,"a":2}], "a": "x", "n": 1.0}`))
	require.NoError(t, err)
	require.Equal(t, `{"a":"x","b":[3,1,{"a":2,"z":1}],"n":1}`, string(got))
}

func TestHashIgnoresKeyOrderButNotArrayOrder(t *testing.T) {
	t.Parallel()
	h1, err := Hash(json.RawMessage(`{"a":1,"b":2}`))
	require.NoError(t, err)
	h2, err := Hash(json.RawMessage(`{"b":2,"a":1}`))
	require.NoError(t, err)
	h3, err := Hash(json.RawMessage(`{"a":[1,2]}`))
	require.NoError(t, err)
	h4, err := Hash(json.RawMessage(`{"a":[2,1]}`))
	require.NoError(t, err)
	require.Equal(t, h1, h2)
	require.NotEqual(t, h3, h4)
}

func TestLargeIntegersStayExact(t *testing.T) {
	t.Parallel()
	got, err := Marshal(json.RawMessage(`{"n": 9007199254740993}`))
	require.NoError(t, err)
	require.Equal(t, `{"n":9007199254740993}`, string(got))
}

// A Canonical element must hash exactly as the raw JSON it came from did:
// generated idempotency keys already stored depend on it.
func TestCanonicalEncodesAsItsSource(t *testing.T) {
	t.Parallel()
	for _, src := range []string{
		`null`, `"x"`, `1.0`, `-0`, `1e3`, `9007199254740993`, `[]`, `{}`,
		`{"b": [3, 1, {"z":1,"a":2}], "a": "x", "n": 1.50}`,
		`{"html": "<a href=\"x\">&</a>", "u": "\u00e9\u2028", "e": "\ud83d\ude00"}`,
		`[{"k": null}, true, false, 0.1, -2.5e-7]`,
	} {
		canon, err := Marshal(json.RawMessage(src))
		require.NoError(t, err, src)
		want, err := Hash([]any{"run", "tool", nil, json.RawMessage(src), 7})
		require.NoError(t, err, src)
		got, err := Hash([]any{"run", "tool", nil, Canonical(canon), 7})
		require.NoError(t, err, src)
		require.Equal(t, want, got, src)

		again, err := Marshal(Canonical(canon))
		require.NoError(t, err, src)
		require.Equal(t, string(canon), string(again), src)
	}
}

// legacyMarshal is Marshal as it was before encode's shortcuts: the whole
// value through encoding/json and back. Stored keys were hashed this way.
func legacyMarshal(t *testing.T, v any) string {
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	require.NoError(t, dec.Decode(&tree))
	var buf bytes.Buffer
	require.NoError(t, write(&buf, tree))
	return buf.String()
}

func TestShortcutsEncodeAsBefore(t *testing.T) {
	t.Parallel()
	n, s := 3, "<b>&</b>"
	n32, n64, big := int32(-12), int64(1)<<62, int64(-1)<<63
	for _, v := range []any{
		[]any{&n32, &n64, &big, n32, n64, big, (*int)(nil), (*int32)(nil), (*int64)(nil), 0, -0},
		[]any{&s, (*string)(nil), strPtr("\xff"), strPtr("\u2028")},
		[]any{"plain", "<b>&</b>", "\xff bad \xfe", "\u2028\u00e9", "", nil, true, false, 1, 2.50, int64(-7)},
		[]any{&n, &s, (*string)(nil), []any{"nested", []any{}}, map[string]any{"b": 1, "a": []any{"x"}}},
		[]any{json.RawMessage(`{"z": 1, "a": [1.0, "\u00e9"]}`), json.Number("1.0")},
		"\xff", "ok", nil, true, []any{},
	} {
		got, err := Marshal(v)
		require.NoError(t, err)
		require.Equal(t, legacyMarshal(t, v), string(got), "%#v", v)
	}
}

func strPtr(s string) *string { return &s }

func TestMarshalRefusesInvalidJSONInsideArrays(t *testing.T) {
	t.Parallel()
	_, err := Marshal([]any{"a", json.RawMessage(`{"a":`)})
	require.Error(t, err)
}

// The enqueue path hashes the canonical input twice (the generated key and
// the fingerprint): passing it as Canonical skips parsing it again.
func BenchmarkHashInput(b *testing.B) {
	src := json.RawMessage(`{"to": "ada@example.com", "template": "welcome", "vars": {"name": "Ada", "plan": "pro",
		"items": [1, 2, 3, 4, 5, 6, 7, 8], "nested": {"a": 1.5, "b": "two", "c": [true, false, null]}}}`)
	canon, err := Marshal(src)
	require.NoError(b, err)
	b.Run("raw", func(b *testing.B) {
		for b.Loop() {
			if _, err := Hash([]any{"run", "tool", "v1", nil, json.RawMessage(canon)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("canonical", func(b *testing.B) {
		for b.Loop() {
			if _, err := Hash([]any{"run", "tool", "v1", nil, Canonical(canon)}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

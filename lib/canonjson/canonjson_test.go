package canonjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
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
		json.RawMessage(` {"b": "<x>&\u003c", "a": ["\u2028", "` + "\u2029\xff" + `", 1e3, -0.0]} `),
		json.RawMessage(`"\ud800"`), json.RawMessage(nil), json.RawMessage(`null`),
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

// legacyNormalize is normalizeNumber before exact decimals: every number
// through its nearest float64. Stored fingerprints and keys were made so.
func legacyNormalize(n json.Number) string {
	if i, err := n.Int64(); err == nil {
		return fmt.Sprint(i)
	}
	if f, err := n.Float64(); err == nil {
		if f == float64(int64(f)) && f < 1e18 && f > -1e18 {
			return fmt.Sprint(int64(f))
		}
		b, _ := json.Marshal(f)
		return string(b)
	}
	return n.String()
}

// Numbers a float64 cannot hold keep their identity: two account ids or
// amounts that differ only beyond double precision are two operations
// (QA), while spellings of one value still hash alike.
func TestNumbersBeyondDoublePrecisionStayDistinct(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]string{
		{`0.1`, `0.10000000000000000001`},
		{`18446744073709551615`, `18446744073709551614`},
		{`12345678901234567890`, `12345678901234567891`},
		{`1e400`, `1e401`},
		{`1e-9223372036854775800`, `1e9223372036854775800`},
		{`1.000000000000000000001e-9223372036854775808`, `1.000000000000000000001e9223372036854775808`},
	} {
		a, err := Hash(json.RawMessage(`{"n":` + pair[0] + `}`))
		require.NoError(t, err)
		b, err := Hash(json.RawMessage(`{"n":` + pair[1] + `}`))
		require.NoError(t, err)
		require.NotEqual(t, a, b, "%s vs %s", pair[0], pair[1])
	}
	// Beyond 17 digits, an integer an int64 holds is itself however it is
	// spelled; up to 17, a spelling with a fraction or an exponent stays its
	// float64's, as stored keys were made (review: 3.7814675137385e+17 is
	// Python's output for a float).
	for _, spelling := range []string{`1234567890123456789.0`, `1.234567890123456789e18`,
		`12345678901234567890e-1`} {
		got, err := Marshal(json.RawMessage(spelling))
		require.NoError(t, err)
		require.Equal(t, `1234567890123456789`, string(got), spelling)
	}
	for _, src := range []string{`3.7814675137385e+17`, `9007199254740993.0`, `9.007199254740993e15`} {
		got, err := Marshal(json.RawMessage(src))
		require.NoError(t, err)
		require.Equal(t, legacyNormalize(json.Number(src)), string(got), src)
	}
	// Up to 17 digits, a literal is a spelling of its float64, as before.
	a, err := Hash(json.RawMessage(`0.10000000000000001`))
	require.NoError(t, err)
	b, err := Hash(json.RawMessage(`0.1`))
	require.NoError(t, err)
	require.Equal(t, a, b)
	for src, want := range map[string]string{
		`0.10000000000000000001`:         `1.0000000000000000001e-1`,
		`9223372036854775808`:            `9223372036854776000`, // its float64's exact value: as before
		`1.000000000000000000010e2`:      `1.00000000000000000001e2`,
		`18446744073709551615`:           `1.8446744073709551615e19`,
		`-1.8446744073709551615E19`:      `-1.8446744073709551615e19`,
		`-184467440737095516150e-1`:      `-1.8446744073709551615e19`,
		`0.0000000000000000000000001`:    `1e-25`,                          // a float64's own value: as before
		`1.00000000000000000001e-100000`: `1.00000000000000000001e-100000`, // linear, not 10^100000 wide
	} {
		got, err := Marshal(json.RawMessage(src))
		require.NoError(t, err)
		require.Equal(t, want, string(got), src)
	}
	// Every number a float64 holds is encoded as before.
	for _, src := range []string{`0.1`, `1.0`, `1.50`, `1e3`, `1e21`, `1E22`, `-2.5e-7`, `0.30000000000000004`,
		`100000000000000000000`, `1.7976931348623157e308`, `5e-324`, `9007199254740993`, `-0`, `123.456`,
		`9223372036854775808`, `1e18`, `-1e18`} {
		got, err := Marshal(json.RawMessage(src))
		require.NoError(t, err)
		require.Equal(t, legacyNormalize(json.Number(src)), string(got), src)
	}
}

// Random literals of at most 17 significant digits, spelled as encoders
// print floats (mantissa and exponent, a trailing .0, a decimal point
// anywhere), all encode as before: stored fingerprints and keys depend on
// it (review: a first version changed 2 % of them).
func TestShortLiteralsKeepTheirEncoding(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewSource(1))
	for range 50_000 {
		digits := strconv.FormatInt(1+rng.Int63n(1e17-1), 10)
		digits = digits[:1+rng.Intn(len(digits))]
		var lit string
		switch rng.Intn(4) {
		case 0:
			lit = digits[:1] + "." + digits[1:] + "0e+" + strconv.Itoa(rng.Intn(30))
		case 1:
			lit = digits + ".0"
		case 2:
			p := rng.Intn(len(digits) + 1)
			lit = "0" + digits[:p] + "." + digits[p:] + "0"
			lit = strings.TrimLeft(lit[:len(lit)-1], "0")
			if strings.HasPrefix(lit, ".") {
				lit = "0" + lit
			}
			lit += "0"
		case 3:
			lit = digits + "e-" + strconv.Itoa(rng.Intn(30))
		}
		if rng.Intn(2) == 0 {
			lit = "-" + lit
		}
		got, err := Marshal(json.RawMessage(lit))
		require.NoError(t, err, lit)
		require.Equal(t, legacyNormalize(json.Number(lit)), string(got), lit)
	}
}

// What an enqueue canonicalises (lib/jobs): its input, then the identity
// its generated key hashes (ids, names, absent options and the canonical
// input); the benchmark's own input, no key sent.
func BenchmarkMarshalEnqueue(b *testing.B) {
	input := json.RawMessage(`{"n":1234}`)
	canon, err := Marshal(input)
	require.NoError(b, err)
	var none *string
	var noInt *int64
	b.Run("input", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Marshal(input); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("identity", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Marshal([]any{"run_01KBN3ZQ0C9Y5T8W2M4R6H7J1E", "bench_noop", "1", noInt, "bench_noop", none,
				none, Canonical(canon), noInt, noInt, "6b1c0e1f0ad3b5c2a6e2b1f3d0c4e5a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d"}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// writeString writes every string as encoding/json does: stored keys and
// fingerprints hash its bytes. Every single byte, the characters
// encoding/json escapes, and random strings of them.
func TestWriteStringIsEncodingJSONs(t *testing.T) {
	t.Parallel()
	same := func(s string) {
		t.Helper()
		var buf bytes.Buffer
		writeString(&buf, s)
		want, err := json.Marshal(s)
		require.NoError(t, err)
		require.Equal(t, string(want), buf.String(), "%q", s)
	}
	var pieces []string
	for c := range 256 {
		pieces = append(pieces, string([]byte{byte(c)}))
	}
	pieces = append(pieces, "\u2028", "\u2029", "\u2027", "\u202a", "é", "😀", "\ufffd", "\xe2\x80", "\xed\xa0\x80",
		"\xf4\x90\x80\x80", "plain", "run_01KBN3ZQ0C9Y5T8W2M4R6H7J1E", "", "\x7f")
	for _, p := range pieces {
		same(p)
		same("a" + p + "z")
	}
	rng := rand.New(rand.NewSource(1))
	for range 5000 {
		var sb strings.Builder
		for range rng.Intn(6) {
			sb.WriteString(pieces[rng.Intn(len(pieces))])
		}
		same(sb.String())
	}
}

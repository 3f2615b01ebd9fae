package jsonstrict

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
)

type decodeInner struct {
	Kind string `json:"kind"`
}

type decodeTarget struct {
	Count   uint            `json:"count"`
	Small   int8            `json:"small"`
	Ratio   float64         `json:"ratio"`
	Preset  string          `json:"preset"`
	Name    string          `json:"name"`
	Inner   *decodeInner    `json:"inner"`
	Items   []decodeInner   `json:"items"`
	Tags    map[string]int  `json:"tags"`
	Payload any             `json:"payload"`
	Raw     json.RawMessage `json:"raw"`
	Lease   *int64          `json:"lease" openapi:"min=5,max=3600"`
	Floor   *int32          `json:"floor" openapi:"min=1"`
	Nested  []decodeBounded `json:"nested"`
}

type decodeBounded struct {
	Tries int32 `json:"tries" openapi:"min=1,max=10"`
}

func decodeProblems(t *testing.T, body string) []apierr.FieldError {
	t.Helper()
	err := Decode([]byte(body), &decodeTarget{})
	ae, ok := apierr.As(err)
	require.True(t, ok, "%s: %v", body, err)
	require.Equal(t, apierr.CodeInvalidRequest, ae.Code)
	return ae.Detail["validation"].([]apierr.FieldError)
}

// Every unknown key and mistyped value is listed, in key order, not only the
// one encoding/json stopped at; free-form and opaque fields hold anything.
func TestDecodeListsEveryProblem(t *testing.T) {
	t.Parallel()
	got := decodeProblems(t, `{"zeta":1,"name":5,"inner":{"kind":true,"colour":"red"},
		"items":[{"kind":"a"},{"kind":1,"x":{"deep":1}}],"tags":{"a":1,"b":"two"},
		"payload":{"anything":[1,"x"]},"raw":{"whatever":true},"alpha":null}`)
	require.Equal(t, []apierr.FieldError{
		{Field: "alpha", Message: "is not a known field"},
		{Field: "inner.colour", Message: "is not a known field"},
		{Field: "inner.kind", Message: "must be a string"},
		{Field: "items.1.kind", Message: "must be a string"},
		{Field: "items.1.x", Message: "is not a known field"},
		{Field: "name", Message: "must be a string"},
		{Field: "tags.b", Message: "must be an integer"},
		{Field: "zeta", Message: "is not a known field"},
	}, got)
}

// What encoding/json refuses and the walk would not call mistyped (a
// negative number for an unsigned field) is still listed, first.
func TestDecodeListsTheDecodersOwnProblem(t *testing.T) {
	t.Parallel()
	require.Equal(t, []apierr.FieldError{
		{Field: "count", Message: "must be an integer from 0 to 2^64-1"},
		{Field: "name", Message: "must be a string"},
	}, decodeProblems(t, `{"count":-1,"name":2}`))
}

// An integer beyond its type's range in a field whose tag bounds it is told
// those bounds, as a value in range is by its handler (QA: 10^20 was told
// the type's range); a side the tag leaves open is the type's.
func TestDecodeTellsAnOverflowTheFieldsBounds(t *testing.T) {
	t.Parallel()
	require.Equal(t, []apierr.FieldError{
		{Field: "floor", Message: "must be an integer from 1 to 2^31-1"},
		{Field: "lease", Message: "must be an integer from 5 to 3600"},
		{Field: "nested.1.tries", Message: "must be an integer from 1 to 10"},
	}, decodeProblems(t, `{"lease":100000000000000000000,"floor":-3000000000,"nested":[{"tries":1},{"tries":5000000000}]}`))
	require.Equal(t, []apierr.FieldError{{Field: "lease", Message: "must be an integer from 5 to 3600"}},
		decodeProblems(t, `{"lease":-9223372036854775809}`))
}

// A number that is no integer in a field whose tag bounds it is told the
// bounds, as an integer out of them is (ops QA: 1.5 read only "must be an
// integer"), whether the decoder (alone) or the walk (beside an unknown
// key) found it; a field bounded by its type alone must be an integer, and
// a string is a string.
func TestDecodeTellsANonIntegerTheFieldsBounds(t *testing.T) {
	t.Parallel()
	for _, extra := range []string{"", `,"zzz":1`} {
		got := decodeProblems(t, `{"lease":1.5,"floor":2e0,"nested":[{"tries":1.0}],"count":1.5,"small":"3"`+extra+`}`)
		require.Subset(t, got, []apierr.FieldError{
			{Field: "lease", Message: "must be an integer from 5 to 3600"},
		}, extra)
		if extra == "" {
			continue // the decoder stops at its first problem
		}
		require.Equal(t, []apierr.FieldError{
			{Field: "count", Message: "must be an integer"},
			{Field: "floor", Message: "must be an integer from 1 to 2^31-1"},
			{Field: "lease", Message: "must be an integer from 5 to 3600"},
			{Field: "nested.0.tries", Message: "must be an integer from 1 to 10"},
			{Field: "small", Message: "must be an integer"},
			{Field: "zzz", Message: "is not a known field"},
		}, got)
	}
	require.Equal(t, []apierr.FieldError{{Field: "nested.0.tries", Message: "must be an integer from 1 to 10"}},
		decodeProblems(t, `{"nested":[{"tries":2.5}]}`))
	require.Equal(t, []apierr.FieldError{{Field: "lease", Message: "must be an integer"}},
		decodeProblems(t, `{"lease":"30"}`))
}

// What the walk over the body as JSON values could not tell is listed too
// (review): integer fields written 1.0 or 1e3, a negative or out-of-range
// integer, a key naming a field only through case-folding. Whichever the
// decoder stopped at, the others are listed with it.
func TestDecodeListsNumberAndCaseProblems(t *testing.T) {
	t.Parallel()
	require.Equal(t, []apierr.FieldError{
		{Field: "PRESET", Message: "is not a known field (field names are case-sensitive)"},
		{Field: "count", Message: "must be an integer"},
		{Field: "name", Message: "must be a string"},
		{Field: "small", Message: "must be an integer from -2^7 to 2^7-1"},
		{Field: "zzz", Message: "is not a known field"},
	}, decodeProblems(t, `{"zzz":1,"count":1e3,"small":300,"PRESET":"x","name":2,"ratio":1.5e3}`))
	require.Equal(t, []apierr.FieldError{
		{Field: "bogus", Message: "is not a known field"},
		{Field: "count", Message: "must be an integer from 0 to 2^64-1"},
		{Field: "items.0.kind", Message: "must be a string"},
	}, decodeProblems(t, `{"bogus":1,"count":-1,"items":[{"kind":1.0}]}`))
	require.Equal(t, []apierr.FieldError{
		{Field: "count", Message: "must be an integer"},
		{Field: "zzz", Message: "is not a known field"},
	}, decodeProblems(t, `{"zzz":1,"count":1.0}`))
	// A case-folded key with a mistyped value is named as written only.
	require.Equal(t, []apierr.FieldError{
		{Field: "COUNT", Message: "is not a known field (field names are case-sensitive)"},
	}, decodeProblems(t, `{"COUNT":"x"}`))
	require.Equal(t, []apierr.FieldError{
		{Field: "Inner", Message: "is not a known field (field names are case-sensitive)"},
	}, decodeProblems(t, `{"Inner":{"kind":1}}`))
	// Also inside an array, where the decoder's own path has no index
	// (fuzzing: items.kind was listed too, a field the body does not hold).
	require.Equal(t, []apierr.FieldError{
		{Field: "items.0.KIND", Message: "is not a known field (field names are case-sensitive)"},
	}, decodeProblems(t, `{"items":[{"KIND":1}]}`))
}

// A body of many unknown keys is answered with a bounded list.
func TestDecodeBoundsTheProblems(t *testing.T) {
	t.Parallel()
	keys := make([]string, 0, 50)
	for i := range 50 {
		keys = append(keys, fmt.Sprintf(`"k%02d":1`, i))
	}
	got := decodeProblems(t, "{"+strings.Join(keys, ",")+"}")
	require.Len(t, got, maxFieldProblems)
	require.Equal(t, "k00", got[0].Field)
	require.Equal(t, fmt.Sprintf("k%02d", maxFieldProblems-1), got[maxFieldProblems-1].Field)
}

// A body must be an object; an empty one and null (what some clients send
// for "no body") read as {}, on every route alike.
func TestDecodeRefusesABodyThatIsNotAnObject(t *testing.T) {
	t.Parallel()
	for _, body := range []string{"[]", `"x"`, "1", "true"} {
		require.Equal(t, []apierr.FieldError{{Field: "body", Message: "must be an object"}},
			decodeProblems(t, body), "%q", body)
	}
	for _, body := range []string{"", " \n", "null", " null\n"} {
		d := decodeTarget{Name: "kept"}
		require.NoError(t, Decode([]byte(body), &d), "%q", body)
		require.Equal(t, decodeTarget{Name: "kept"}, d)
	}
}

// Nesting beyond encoding/json's limit is said so, not called invalid JSON
// (QA).
func TestDecodeSaysWhenABodyNestsTooDeep(t *testing.T) {
	t.Parallel()
	deep := `{"payload":` + strings.Repeat("[", maxDecodeDepth+1) + strings.Repeat("]", maxDecodeDepth+1) + `}`
	require.Equal(t, []apierr.FieldError{{Field: "body", Message: "nests arrays and objects more than 10000 levels deep"}},
		decodeProblems(t, deep))
	ok := `{"payload":` + strings.Repeat("[", maxDecodeDepth-2) + strings.Repeat("]", maxDecodeDepth-2) + `}`
	require.NoError(t, Decode([]byte(ok), &decodeTarget{}))
}

// null is "not sent" where the field's type has such a value (a pointer, a
// list, a map, any value, raw JSON) and refused elsewhere, naming the field:
// encoding/json read it into a string, number or struct as a zero value the
// API took for one sent (QA). A null body is still {}.
func TestDecodeRefusesNullWhereTheTypeHasNoNotSent(t *testing.T) {
	t.Parallel()
	var ok decodeTarget
	require.NoError(t, Decode([]byte(`{"inner":null,"items":null,"tags":null,"payload":null,"raw":null}`), &ok))
	require.NoError(t, Decode([]byte(`null`), &ok))
	require.NoError(t, Decode([]byte(`{"payload":{"a":null,"b":[null]},"raw":[null]}`), &ok))
	for body, field := range map[string]string{
		`{"name":null}`:                  "name",
		`{"count":null}`:                 "count",
		`{"ratio":null}`:                 "ratio",
		`{"inner":{"kind":null}}`:        "inner.kind",
		`{"items":[{"kind":"a"},null]}`:  "items.1",
		`{"tags":{"a":null}}`:            "tags.a",
		`{"name":"x", "preset" :  null}`: "preset",
	} {
		err := Decode([]byte(body), &decodeTarget{})
		ae, isAPI := apierr.As(err)
		require.True(t, isAPI, "%s: %v", body, err)
		require.Equal(t, []apierr.FieldError{{Field: field, Message: "must not be null"}},
			ae.Detail["validation"].([]apierr.FieldError), body)
	}
}

// Bytes that are not UTF-8 are refused at the string that holds them, a
// key's at its object, before encoding/json reads them as U+FFFD and names
// a key the client never sent (fuzz QA: every such body was refused at
// "body", and a key as "k\ufffd", unknown).
func TestDecodeNamesTheStringThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	for body, field := range map[string]string{
		"{\"name\":\"a\xffb\"}":                   "name",
		"{\"inner\":{\"kind\":\"\xfe\"}}":         "inner.kind",
		"{\"payload\":{\"x\":[\"ok\",\"\xff\"]}}": "payload.x.1",
		"{\"k\xff\":1}":                           "body",
		"{\"inner\":{\"k\xff\":1}}":               "inner",
	} {
		err := Decode([]byte(body), &decodeTarget{})
		ae, ok := apierr.As(err)
		require.True(t, ok, "%q: %v", body, err)
		require.Equal(t, []apierr.FieldError{{Field: field, Message: "must be UTF-8 (JSON text is)"}},
			ae.Detail["validation"].([]apierr.FieldError), "%q", body)
	}
}

// An unknown key beside bytes that are not UTF-8 is not told it matched a
// field only by case (review): the UTF-8 check before decoding knows no type.
func TestDecodeOfABodyNotUTF8WithAnUnknownKey(t *testing.T) {
	t.Parallel()
	err := Decode([]byte("{\"bogus\":1,\"name\":\"a\xff\"}"), &decodeTarget{})
	ae, ok := apierr.As(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, []apierr.FieldError{{Field: "name", Message: "must be UTF-8 (JSON text is)"}},
		ae.Detail["validation"].([]apierr.FieldError))
}

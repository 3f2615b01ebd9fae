package jsonstrict

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/getratchet/ratchet/lib/apierr"
)

type limit struct {
	Name  string          `json:"name"`
	Extra json.RawMessage `json:"extra"`
}

// Check answers the path of the first problem, or nil; the body has already
// decoded into the type (as the router and the MCP tools call it).
func TestCheck(t *testing.T) {
	t.Parallel()
	many := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf(`"k%d":%d`, i, i)
		}
		return strings.Join(parts, ",")
	}
	deep := func(n int) string { // n objects, each inside the last
		return strings.Repeat(`{"kkkk":`, n) + "1" + strings.Repeat("}", n)
	}
	for body, want := range map[string]string{
		`{"name":"a","extra":{"x":1}}`:                         "",
		`{"name":"a","extra":{"x":1,"x":2}}`:                   "extra.x",
		`{"NAME":"a"}`:                                         "NAME",
		`{"name":"a","name":"b"}`:                              "name",
		`{"extra":[{"y":1},{"y":2,"y":3}]}`:                    "extra.1.y",
		`{"extra":{` + many(40) + `}}`:                         "", // past the slice, into the map
		`{"extra":{` + many(40) + `,"k39":0}}`:                 "extra.k39",
		`{"extra":{"n":1e400}}`:                                "extra.n",
		`{"extra":{"n":1e-300,"z":0e-999,"b":true,"f":false}}`: "",
		`{"extra":{"n":1e-400,"m":1e-0000999}}`:                "", // reads as 0, as JSON allows
		`{"extra":{"n":1e-1000}}`:                              "extra.n",
		`{"extra":[0,1e-1000001]}`:                             "extra.1",
		`{"extra":1` + strings.Repeat("0", 1100) + `e-1100}`:   "extra", // 1, but too long to be a float's
		`{"extra":` + deep(9990) + `}`:                         "",
		`{"extra":` + deep(100)[:len(deep(100))-100] + `1,"kkkk":2` + strings.Repeat("}", 100) + `}`: "extra" +
			strings.Repeat(".kkkk", 100),
		`{"extra":"a\u0000b"}`:                              "extra",
		`{"extra":"\ud800"}`:                                "extra",
		`{"extra":{"k\ud800":1}}`:                           "extra", // a bad key is named by its object
		`{"extra":"\ud83d\ude00","name":"\\u0000 is text"}`: "",
		// An object's keys are kept on one stack for the scan: a nested
		// object's keys are its own, and its parent's resume after it.
		`{"extra":{"a":{"b":1,"c":2},"c":3,"b":{"a":4}}}`:            "",
		`{"extra":{"a":{"b":1},"b":2,"a":3}}`:                        "extra.a",
		`{"extra":{"a":[{"a":1},{"a":2,"a":3}]}}`:                    "extra.a.1.a",
		`{"extra":{` + many(40) + `,"z":{"k1":1},"k1":2}}`:           "extra.k1",
		`{"extra":{"z":{` + many(40) + `},"k1":1,"z":2}}`:            "extra.z",
		`{"extra":[` + strings.Repeat("0,", 200) + `{"y":1,"y":2}]}`: "extra.200.y",
		`{"extra":{"\u0061":1,"a":2}}`:                               "extra.a",
	} {
		err := Check([]byte(body), reflect.TypeFor[limit]())
		got := ""
		if err != nil {
			got = err.Detail["validation"].([]apierr.FieldError)[0].Field
		}
		if got != want {
			t.Errorf("%s: problem at %q, want %q (%v)", body, got, want, err)
		}
	}
}

// A deeply nested body costs memory in proportion to its size, not to its
// depth squared: the path of every level was built as it was entered, so
// 10 000 levels of 90-character keys (under the 1 MiB limit) took 4 GB.
func TestCheckOfADeepBodyStaysSmall(t *testing.T) {
	key := strings.Repeat("k", 90)
	n := 9990
	body := []byte(`{"extra":` + strings.Repeat(`{"`+key+`":`, n) + "1" + strings.Repeat("}", n) + `}`)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := Check(body, reflect.TypeFor[limit]()); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if used := after.TotalAlloc - before.TotalAlloc; used > 16<<20 {
		t.Fatalf("checking a %d-byte body allocated %d bytes", len(body), used)
	}
}

type batch struct {
	Items []Deferred `json:"items"`
	After string     `json:"after"`
}

// A Deferred item is left to its own decode: what Check would refuse inside
// it is not the body's refusal, and the body around it is still checked,
// after the item too (so the scan found the item's end).
func TestDeferredItemsAreLeftToTheirOwnDecode(t *testing.T) {
	items := []string{
		`{"output": "a\u0000b"}`,
		`{"k": 1, "k": 2}`,
		`{"n": 1e99999}`,
		`"a string with \" ] } , [ { inside"`,
		`[1, [2, {"x": "]"}], "\\"]`,
		`12.5e3`, `-0`, `true`, `null`, `{}`, `[]`, `"\ud800"`,
	}
	for _, item := range items {
		for _, sep := range []string{"", " ", "\n\t"} {
			body := `{"items": [` + sep + item + sep + `,` + sep + item + sep + `], "after": "ok"}`
			var b batch
			require := func(cond bool, format string, args ...any) {
				t.Helper()
				if !cond {
					t.Fatalf(format, args...)
				}
			}
			require(Decode([]byte(body), &b) == nil, "%s: refused", body)
			require(len(b.Items) == 2 && string(b.Items[0]) == item, "%s: items %q", body, b.Items)

			bad := `{"items": [` + sep + item + sep + `], "after": "x\u0000"}`
			err := Decode([]byte(bad), &b)
			var ae *apierr.Error
			require(errorsAs(err, &ae) && fieldOf(ae) == "after", "%s: the field after the item: %v", bad, err)
			repeated := `{"items": [` + item + `], "items": []}`
			err = Decode([]byte(repeated), &b)
			require(errorsAs(err, &ae) && fieldOf(ae) == "items", "%s: the repeated key: %v", repeated, err)
		}
	}
	// Not UTF-8 is no JSON text: the whole body, wherever it is.
	var b batch
	err := Decode([]byte("{\"items\": [\"\xff\"]}"), &b)
	var ae *apierr.Error
	if !errorsAs(err, &ae) || fieldOf(ae) != "items.0" {
		t.Fatalf("bytes that are not UTF-8: %v", err)
	}
}

func errorsAs(err error, target **apierr.Error) bool { return errors.As(err, target) }

// fieldOf is the first field a refusal names.
func fieldOf(e *apierr.Error) string {
	return e.Detail["validation"].([]apierr.FieldError)[0].Field
}

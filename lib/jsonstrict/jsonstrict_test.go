package jsonstrict

import (
	"encoding/json"
	"fmt"
	"reflect"
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
	for body, want := range map[string]string{
		`{"name":"a","extra":{"x":1}}`:                      "",
		`{"name":"a","extra":{"x":1,"x":2}}`:                "extra.x",
		`{"NAME":"a"}`:                                      "NAME",
		`{"name":"a","name":"b"}`:                           "name",
		`{"extra":[{"y":1},{"y":2,"y":3}]}`:                 "extra.1.y",
		`{"extra":{` + many(40) + `}}`:                      "", // past the slice, into the map
		`{"extra":{` + many(40) + `,"k39":0}}`:              "extra.k39",
		`{"extra":{"n":1e400}}`:                             "extra.n",
		`{"extra":{"n":1e-400,"b":true,"f":false}}`:         "",
		`{"extra":"a\u0000b"}`:                              "extra",
		`{"extra":"\ud800"}`:                                "extra",
		`{"extra":{"k\ud800":1}}`:                           "extra", // a bad key is named by its object
		`{"extra":"\ud83d\ude00","name":"\\u0000 is text"}`: "",
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

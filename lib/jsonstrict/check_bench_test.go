package jsonstrict

import (
	"encoding/json"
	"reflect"
	"testing"
)

// BenchmarkCheck is Check over bodies of the measured paths, after their
// decode: a batch report's item (each of up to 100 per request) and an
// enqueue's body.
func BenchmarkCheck(b *testing.B) {
	type reportItem struct {
		JobID      string          `json:"jobId"`
		LeaseToken string          `json:"leaseToken"`
		Status     string          `json:"status"`
		Output     json.RawMessage `json:"output,omitempty"`
	}
	type enqueue struct {
		Name    string          `json:"name"`
		Version string          `json:"version"`
		Input   json.RawMessage `json:"input"`
	}
	for _, c := range []struct {
		name string
		body string
		t    reflect.Type
	}{
		{"report_item", `{"jobId":"job_01m8mgjek0ze8ys743sv5h6qz5","leaseToken":"0123456789abcdef0123456789abcdef",` +
			`"status":"SUCCEEDED","output":{"ok":true}}`, reflect.TypeFor[*reportItem]()},
		{"enqueue", `{"name":"bench_noop","version":"1","input":{"n":1234}}`, reflect.TypeFor[*enqueue]()},
	} {
		b.Run(c.name, func(b *testing.B) {
			body := []byte(c.body)
			b.ReportAllocs()
			for b.Loop() {
				if err := Check(body, c.t); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

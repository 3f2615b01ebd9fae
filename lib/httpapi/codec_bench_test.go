package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/jobs"
)

// BenchmarkDecodeBegin decodes a typical begin body strictly (unknown
// fields, exact names, repeated keys, NUL): the work every begin does before
// it reaches the database.
func BenchmarkDecodeBegin(b *testing.B) {
	body := []byte(`{"effect_type":"email.send","idempotency_key":"welcome-email:user_123",` +
		`"payload":{"to":"user_123@example.com","template":"welcome","vars":{"name":"Ada","plan":"pro"}},` +
		`"cost_micros":2500,"dimensions":{"recipient":"user_123"},"lease_seconds":60}`)
	b.ReportAllocs()
	for b.Loop() {
		var req gate.BeginRequest
		if err := httpapi.DecodeJSON(body, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeEnqueueLargeInput decodes an enqueue whose input is about
// 200 KiB of free-form JSON.
func BenchmarkDecodeEnqueueLargeInput(b *testing.B) {
	item := `{"sku":"A-1","qty":2,"price_micros":1999000,"tags":["x","y"]},`
	body := []byte(`{"name":"send_email","version":"1","input":{"items":[` +
		strings.Repeat(item, 3000) + `{"sku":"end"}]}}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var req jobs.EnqueueRequest
		if err := httpapi.DecodeJSON(body, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeManyKeys decodes a 1 MiB input of one object with ~90 000
// keys: the repeated-key check must stay linear in them.
func BenchmarkDecodeManyKeys(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"name":"send_email","version":"1","input":{`)
	for i := 0; sb.Len() < httpapi.MaxBodyBytes-64; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `"k%d":1`, i)
	}
	sb.WriteString(`}}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		var req jobs.EnqueueRequest
		if err := httpapi.DecodeJSON(body, &req); err != nil {
			b.Fatal(err)
		}
	}
}

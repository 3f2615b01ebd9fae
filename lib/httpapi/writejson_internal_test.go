package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/stretchr/testify/require"
)

// writeJSONAsBefore is writeJSON as it was before it encoded in a pooled
// buffer and assigned its headers' shared values: jsonx.Marshal, then
// writeEncoded as it was.
func writeJSONAsBefore(w http.ResponseWriter, status int, body any) {
	b, err := jsonx.Marshal(body)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal_error","message":"Internal error.","detail":{}}}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
	_, _ = w.Write(newline)
}

// TestWriteJSONAnswersAsMarshalDid holds the pooled encoding to the bytes,
// status and headers jsonx.Marshal gave, for answers of every shape, in an
// order where a large answer's buffer is reused for small ones after it.
func TestWriteJSONAnswersAsMarshalDid(t *testing.T) {
	type item struct {
		ID      string            `json:"id"`
		Note    *string           `json:"note,omitempty"`
		Tags    []string          `json:"tags"`
		Meta    map[string]any    `json:"meta"`
		At      time.Time         `json:"at"`
		Headers map[string]string `json:"headers,omitempty"`
	}
	note := "a <b> & \"c\" \u2028 line \u2029 para \\u2028 not one \x01 \xff"
	at := time.Date(2026, 12, 6, 20, 0, 0, 123456789, time.UTC)
	page, err := NewPage(context.Background(), []item{{ID: "a", Note: &note, At: at}, {ID: "b"}, {ID: "c"}}, 2,
		func(i item) string { return i.ID })
	require.NoError(t, err)
	bodies := []any{
		item{ID: "eff_1", Note: &note, Tags: []string{"<x>", "y&z"}, Meta: map[string]any{"z": 1, "a": []int{}, "m": nil}, At: at},
		errorBody{Error: apierr.Unauthorized("Missing, malformed, or revoked key.").Wire()},
		errorBody{Error: apierr.InvalidField("payload", "must be an object <here>").Wire()},
		map[string]any{"jsonrpc": "2.0", "id": 7, "error": map[string]any{"code": -32600, "message": "bad & worse"}},
		strings.Repeat("\u2028<&>", 30_000), // past what the pool keeps
		item{ID: "after the large one"},
		page,
		rawAnswer(`{"data":[],"next_cursor":null}`),
		[]item{},
		nil,
		map[string]any{"unencodable": make(chan int)}, // answered 500 internal_error
		func() {},
		item{ID: "after a failure"},
		"",
	}
	for round := range 2 {
		for i, body := range bodies {
			want, got := httptest.NewRecorder(), httptest.NewRecorder()
			for _, h := range []http.Header{want.Header(), got.Header()} {
				h.Set(RequestIDHeader, "req_1")
				h.Set("Cache-Control", "private") // replaced
			}
			writeJSONAsBefore(want, 201, body)
			writeJSON(got, 201, body)
			require.Equal(t, want.Code, got.Code, "round %d body %d", round, i)
			require.Equal(t, want.Header(), got.Header(), "round %d body %d", round, i)
			require.Equal(t, want.Body.String(), got.Body.String(), "round %d body %d", round, i)
			// The shared values are not changed by an answer's header
			// changed after it.
			got.Header().Add("Cache-Control", "max-age=0")
			got.Header().Set("Content-Type", "text/plain")
		}
		require.Equal(t, []string{"application/json; charset=utf-8"}, jsonContentType)
		require.Equal(t, []string{"no-store"}, noStore)
	}
}

// discardWriter is a ResponseWriter that keeps its headers and drops the
// body, so that a benchmark counts the encoding's allocations alone.
type discardWriter struct{ h http.Header }

func (d discardWriter) Header() http.Header       { return d.h }
func (discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (discardWriter) WriteHeader(int)             {}

// BenchmarkWriteJSON is a begin-sized answer written as before (Marshal)
// and pooled (writeJSON).
func BenchmarkWriteJSON(b *testing.B) {
	body := map[string]any{"effect_id": "eff_01jexample0000000000000000", "state": "started",
		"lease_expires_at": "2026-12-06T20:00:00.123456Z", "duplicate": false, "attempt": 1,
		"payload": map[string]any{"to": "user_123@example.com", "template": "welcome"}}
	for _, c := range []struct {
		name  string
		write func(http.ResponseWriter, int, any)
	}{{"Marshal", writeJSONAsBefore}, {"pooled", writeJSON}} {
		b.Run(c.name, func(b *testing.B) {
			w := discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				c.write(w, 200, body)
			}
		})
	}
}

package gate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/canonjson"
	"github.com/getratchet/ratchet/lib/keyedhash"
	"github.com/getratchet/ratchet/lib/seal"
)

// CPU-only benchmarks of what begin and report do in the process around
// their one statement each (no database): allocs/op is the figure to read.
//
//	go test ./lib/gate -run '^$' -bench 'Prepare|ReportCPU|Args' -benchmem

func cpuService(tb testing.TB) *Service {
	sl, err := seal.New(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		tb.Fatal(err)
	}
	k := keyedhash.New([]byte("test-key-hash-secret-0123456789"))
	return New(nil, sl, func(v string) []byte { return k.Sum([]byte(v)) }, time.Now, nil)
}

func cpuPrincipal() *auth.Principal {
	return &auth.Principal{WorkspaceID: "ws_01", KeyID: "key_01",
		Scopes: []string{auth.ScopeEffectsBegin, auth.ScopeEffectsReport}}
}

func cpuBeginRequest() BeginRequest {
	return BeginRequest{EffectType: "email.send", IdempotencyKey: "bench:0123456789",
		Payload: []byte(`{"to":"user_123","template":"welcome"}`), Dimensions: map[string]string{"recipient": "user_123"}}
}

func BenchmarkPrepare(b *testing.B) {
	s, p, req := cpuService(b), cpuPrincipal(), cpuBeginRequest()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := s.prepare(p, req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBeginArgs(b *testing.B) {
	s := cpuService(b)
	in, err := s.prepare(cpuPrincipal(), cpuBeginRequest())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = in.args()
	}
}

// BenchmarkReportCPU is a report's work in the process but its statement:
// the checks, the sealed result, and the answer built from the row.
func BenchmarkReportCPU(b *testing.B) {
	s := cpuService(b)
	now := time.Now().UTC()
	exp := now.Add(time.Minute)
	row := effectRow{ID: "eff_01", WorkspaceID: "ws_01", EffectType: "email.send", IdempotencyKey: "k",
		Fingerprint: "k1:00", State: StateSucceeded, Attempt: 1, LeaseSeconds: 60, LeaseExpiresAt: &exp,
		CreatedAt: now, UpdatedAt: now}
	atts, _ := json.Marshal([]Attempt{{Attempt: 1, Outcome: ptr(StateSucceeded), StartedAt: now,
		LeaseExpiresAt: exp, ReportedAt: &now, BeganByKeyID: "key_01", ReportedByKeyID: ptr("key_01")}})
	result := json.RawMessage(`{"message_id":"m_1"}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, _, err := s.sealedResult(row.ID, result); err != nil {
			b.Fatal(err)
		}
		_ = tokenHash("0123456789abcdef0123456789abcdef")
		if _, err := s.reported(&row, atts, now, result); err != nil {
			b.Fatal(err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestHashedDimensionsAsJSONMarshal: the dimensions column is written as
// json.Marshal wrote the map of names to hex digests it was built from
// before, for names of every character dimensionRe lets through.
func TestHashedDimensionsAsJSONMarshal(t *testing.T) {
	s := cpuService(t)
	for _, dims := range []map[string]string{
		nil, {}, {"recipient": "user_123"},
		{"a": "1", "B.c_d-e": "x<y>&\"z\u2028", "0": "é", "Zz": strings.Repeat("v", 255),
			strings.Repeat("n", 64): "\xff bad utf-8"},
	} {
		want := map[string]string{}
		for k, v := range dims {
			want[k] = fmt.Sprintf("%x", s.hash("dimension:"+k+":"+v))
		}
		wantJSON, err := json.Marshal(want)
		require.NoError(t, err)
		in, err := s.prepare(cpuPrincipal(), BeginRequest{EffectType: "t", IdempotencyKey: "k", Dimensions: dims})
		require.NoError(t, err)
		require.Equal(t, string(wantJSON), in.dims)
	}
}

// TestCanonicalOperationAsTheMap: a begin's operation, which its stored
// fingerprint hashes, is byte for byte what canonjson.Marshal wrote for the
// map of its four fields, which every fingerprint stored so far was made
// of: a payload of any shape, escapes, numbers and bad UTF-8, any cost and
// dimensions. A difference would answer idempotency_key_reuse to the
// retry of every effect begun before it.
func TestCanonicalOperationAsTheMap(t *testing.T) {
	payloads := []string{"", "null", "{}", "[]", "0", `"s"`, "true",
		`{"to":"user_123","template":"welcome"}`,
		` { "b" : [1, 1.0, 1e3, -0, 0.10000000000000001, 18446744073709551615, 1E-400, 12345678901234567890123],
		   "a" : {"z":null,"y":false,"x":"<&>\u2028\u2029\"\\\n\t é 😀"} } `,
		"{\"bad\":\"\xff\xfe ok\",\"\xc3\":1}", `{"a":1,"a":2}`, `[{"k":[[[]]]},"\u0000",3.14159265358979323846]`,
		`"` + strings.Repeat("x<", 500) + `"`,
	}
	costs := []*int64{nil, ptr(int64(0)), ptr(int64(1500)), ptr(int64(1_000_000_000_000_000_000))}
	dimss := []map[string]string{{}, {"recipient": "user_123"},
		{"b": "<&>", "a": "é\u2028", "c": "\xff", "A.b_c-9": strings.Repeat("v", 255), "d": "\"\\\x00\t"},
		{"z": "1", "Z": "2", "0": "3", "_": "4", ".": "5"}}
	for _, raw := range payloads {
		for _, cost := range costs {
			for _, dims := range dimss {
				payload := nullJSON(json.RawMessage(raw))
				want, werr := canonjson.Marshal(map[string]any{
					"effect_type": "email.send", "payload": rawOrNull(payload), "cost_micros": cost, "dimensions": dims,
				})
				got, gerr := canonicalOperation("email.send", payload, cost, sortedKeys(dims), dims)
				require.Equal(t, werr != nil, gerr != nil, "payload %q: %v, %v", raw, werr, gerr)
				require.Equal(t, string(want), string(got), "payload %q", raw)
			}
		}
	}
	_, err := canonicalOperation("t", json.RawMessage(`{"a":`), nil, nil, map[string]string{})
	require.Error(t, err)
}

// TestEffectRowColumns: the scan targets' count, which sizes the slices
// scans build, is effectColumns'.
func TestEffectRowColumns(t *testing.T) {
	require.Len(t, effectColumns, effectRowColumns)
	require.Len(t, (&effectRow{}).dest(), effectRowColumns)
	require.Equal(t, effectRowColumns, cap((&effectRow{}).dest()))
}

package jobs

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/seal"
)

// BenchmarkEnqueuePrepare is what the process does for an enqueue between
// its decoded request and its statement's arguments: validation (the
// canonical input, the generated key), the request hashes, the sealed input
// and its preview. The input is the benchmark's (scripts/benchratchet), no
// key sent, as the enqueue figure's.
func BenchmarkEnqueuePrepare(b *testing.B) {
	sealer, err := seal.New(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		b.Fatal(err)
	}
	s := New(nil, sealer, "bench-key-hash-secret-0123456789", 10000, nil, nil)
	runID := ids.New(ids.Run)
	req := EnqueueRequest{Name: "bench_noop", Version: "1", Input: json.RawMessage(`{"n":1234}`)}
	b.ReportAllocs()
	for b.Loop() {
		op, err := req.validate(runID)
		if err != nil {
			b.Fatal(err)
		}
		hash, keyedKey, keyedHash := s.enqueueHashes(op)
		jobID := ids.NewAt(ids.Job, time.Time{})
		sealed, preview := sealer.Seal(op.input, seal.AAD(jobID, "input")), redact.PreviewJSON(op.input)
		if len(hash) == 0 || keyedKey == nil || len(keyedHash) == 0 || len(sealed) == 0 || len(preview) == 0 {
			b.Fatal("nothing prepared")
		}
	}
}

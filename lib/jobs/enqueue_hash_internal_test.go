package jobs

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/canonjson"
	"github.com/getratchet/ratchet/lib/ids"
)

// legacyWithDelay, legacyIdentity and legacyFingerprint are how an
// enqueue's generated key and request hash were encoded before they were
// built from one shared head (enqueueOp.hashed): stored keys and hashes
// were made so.
func legacyWithDelay(op enqueueOp, fields []any) []any {
	if op.delayMs == nil {
		return fields
	}
	return append(fields, map[string]any{"delayMs": *op.delayMs})
}

func legacyIdentity(t *testing.T, op enqueueOp) []byte {
	b, err := canonjson.Marshal(legacyWithDelay(op, []any{op.runID, op.name, op.version, op.contractVersion,
		op.endpoint, op.afterStepID, op.afterStatus, canonjson.Canonical(op.canon)}))
	require.NoError(t, err)
	return b
}

func legacyFingerprint(t *testing.T, op enqueueOp) []byte {
	b, err := canonjson.Marshal(legacyWithDelay(op, []any{op.runID, op.name, op.version, op.contractVersion,
		op.endpoint, op.afterStepID, op.afterStatus, canonjson.Canonical(op.canon), op.timeoutMs, op.maxAttempts,
		op.key}))
	require.NoError(t, err)
	return b
}

// An enqueue's generated key and both its request hashes (the plain and
// the keyed key's) are byte for byte what they were when each was
// canonjson.Marshal of its own []any: a step enqueued before the change,
// sent again after it, must be found by its key and told a duplicate.
func TestEnqueueHashesEncodeAsBefore(t *testing.T) {
	t.Parallel()
	n := func(v int64) *int64 { return &v }
	str := func(v string) *string { return &v }
	step := ids.New(ids.Step)
	runID := ids.New(ids.Run)
	reqs := []EnqueueRequest{
		{Name: "bench_noop", Version: "1", Input: json.RawMessage(`{"n":1234}`)},
		{Name: "send_email", Version: "2024-01-01.beta", Input: nil},
		{Name: "send_email", Version: "1", Input: json.RawMessage(` {"b": [3, 1.0, {"z":1,"a":2}], "a": "<x&y>"} `),
			TimeoutMs: n(5000), MaxAttempts: n(3), ContractVersion: n(7), Endpoint: str("mail-eu")},
		{Name: "send_email", Version: "1", Input: json.RawMessage(`"\u2028 \ud83d\ude00 \\ \""`), DelayMs: n(60000)},
		{Name: "send_email", Version: "1", Input: json.RawMessage(`[null,true,false,-0,1e3]`), DelayMs: n(1),
			TimeoutMs: n(1000), MaxAttempts: n(10)},
		{Name: "send_email", Version: "1", Input: json.RawMessage(`{}`), DelayMs: n(0), AfterStepID: &step,
			AfterStatus: str("FAILED")},
		{Name: "send_email", Version: "1", Input: json.RawMessage(`1`), AfterStepID: str("not a step id"),
			AfterStatus: str("SUCCEEDED"), MaxAttempts: n(1)},
		{Name: "send_email", Version: "1", Input: json.RawMessage(`{"k":"v"}`), IdempotencyKey: str("order-42:<email>")},
		{Name: "send_email", Version: "1", Input: json.RawMessage(`{"k":"v"}`), IdempotencyKey: str("k"),
			DelayMs: n(2592000000), ContractVersion: n(1), TimeoutMs: n(86400000)},
	}
	for _, req := range reqs {
		op, err := req.validate(runID)
		require.NoError(t, err, "%+v", req)
		if req.IdempotencyKey == nil {
			require.Equal(t, string(legacyIdentity(t, op)), string(op.identity), "%+v", req)
		} else {
			require.Nil(t, op.identity)
		}
		require.Equal(t, string(legacyFingerprint(t, op)), string(op.fingerprint()), "%+v", req)
		keyed := op
		keyed.key = "keyed-" + op.key
		require.Equal(t, string(legacyFingerprint(t, keyed)), string(keyed.fingerprint()), "%+v", req)
	}
}

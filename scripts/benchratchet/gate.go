package main

import "context"

// Gate figures (issue 6, item 1). TODO(lead, after the gate merge): replace
// each b.todo with the measurement; keep the emitted names, scripts/bench's
// ratio table (scripts/benchrun/ratios.go) already refers to them.
//
// Suggested shape, with the harness in harness.go:
//
//	in, _ := b.instance(ctx, nil)              // default config: DB_MAX_CONNS=4, exec mode
//	defer in.Close()
//	_, op, _ := in.Signup(ctx)
//	agent, _ := in.MintKey(ctx, op, map[string]any{"name": "bench", "preset": "AGENT"})
//	// seed b.scale.History finished effects straight into the table, then ANALYZE
//	var begins []time.Duration                 // per-op slice indexed by i, no lock needed
//	res, err := load(ctx, b.scale.Clients, b.scale.Requests, func(ctx context.Context, i int) error {
//		t := time.Now()
//		// POST /api/v1/effects/begin {effect_type, idempotency_key: fmt.Sprint("k", i), payload}
//		begins[i] = time.Since(t)
//		// POST /api/v1/effects/{id}/report {lease_token, outcome: "succeeded", result}
//	})
//	b.emit("ratchet.gate.cycles_per_s", res.Rate())
//	b.emit("ratchet.gate.begin_p50_ms", ms(percentile(begins, 50)))
//	b.emit("ratchet.gate.begin_p99_ms", ms(percentile(begins, 99)))

// gateCycles: begin→report cycles/s over HTTP at b.scale.Clients clients,
// with p50/p99 of begin alone.
func gateCycles(ctx context.Context, b *bench) error {
	b.todo("ratchet.gate.cycles_per_s", "gate not merged yet (emit also ratchet.gate.begin_p50_ms, ratchet.gate.begin_p99_ms)")
	return nil
}

// gateDuplicateBegins: begins/s on keys that already succeeded (decision
// duplicate, the recorded result returned), b.scale.Clients clients.
func gateDuplicateBegins(ctx context.Context, b *bench) error {
	b.todo("ratchet.gate.duplicate_begins_per_s", "gate not merged yet")
	return nil
}

package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Gate figures (issue 6, item 1), measured over HTTP on the wire contract
// (API.md §2), so they need no Go package of the gate. A build without the
// gate routes prints `# TODO` lines instead of values.

// gateEffectType has no starter policy: the default policy applies (no cost
// requirement, no surge rule, no approval), as for most agent tools.
const gateEffectType = "email.send"

// gateWarm is how many real begin→report cycles seed a workspace before
// they are cloned into history; the duplicate figure replays these keys.
const gateWarm = 200

type beginAnswer struct {
	Decision   string `json:"decision"`
	EffectID   string `json:"effect_id"`
	LeaseToken string `json:"lease_token"`
}

func beginBody(key string) map[string]any {
	return map[string]any{"effect_type": gateEffectType, "idempotency_key": key,
		"payload": map[string]any{"to": "user_123", "template": "welcome"}}
}

// gateSession is one instance with a workspace whose effects table holds
// seeded history, and an AGENT key (effects:begin + effects:report).
type gateSession struct {
	in          *instance
	workspaceID string
	agent       string
	seeded      int
}

// cycle runs begin (new key) → report succeeded and returns begin's latency.
func (s *gateSession) cycle(ctx context.Context, key string) (time.Duration, error) {
	var d beginAnswer
	t := time.Now()
	if err := s.in.Expect(ctx, http.StatusOK, "POST", "/api/v1/effects/begin", s.agent, beginBody(key), &d); err != nil {
		return 0, err
	}
	begin := time.Since(t)
	if d.Decision != "execute" {
		return 0, fmt.Errorf("begin on a new key: decision %q, want execute", d.Decision)
	}
	return begin, s.in.Expect(ctx, http.StatusOK, "POST", "/api/v1/effects/"+d.EffectID+"/report", s.agent,
		map[string]any{"lease_token": d.LeaseToken, "outcome": "succeeded", "result": map[string]any{"message_id": "m_" + key}}, nil)
}

// gateSetup starts an instance, signs up, and seeds b.scale.History finished
// effects: gateWarm real cycles over HTTP, cloned with their attempts, then
// ANALYZE. ok is false when this build has no gate routes.
// The instance serves every client at once (b.serverInstance).
func (b *bench) gateSetup(ctx context.Context) (s *gateSession, ok bool, err error) {
	in, err := b.serverInstance(ctx, "ratchet.gate", nil)
	if err != nil {
		return nil, false, err
	}
	defer func() {
		if !ok || err != nil {
			in.Close()
		}
	}()
	ws, operator, err := in.Signup(ctx)
	if err != nil {
		return nil, false, err
	}
	if status, _, err := in.Do(ctx, "POST", "/api/v1/effects/begin", operator, []byte(`{}`)); err != nil {
		return nil, false, err
	} else if status == http.StatusNotFound {
		return nil, false, nil
	}
	agent, err := in.MintKey(ctx, operator, map[string]any{"name": "bench-agent", "preset": "AGENT"})
	if err != nil {
		return nil, false, err
	}
	s = &gateSession{in: in, workspaceID: ws, agent: agent}
	warm := min(gateWarm, max(b.scale.History, 1))
	if _, err := load(ctx, b.scale.Clients, warm, func(ctx context.Context, i int) error {
		_, err := s.cycle(ctx, "hist-"+strconv.Itoa(i))
		return err
	}); err != nil {
		return nil, false, fmt.Errorf("warm-up cycles: %w", err)
	}
	copies := (b.scale.History - 1) / warm // ceil((History-warm)/warm): History rows in all
	pool := in.App.Pool
	n, err := cloneRows(ctx, pool, "effects", copies, "s.workspace_id = $1",
		map[string]string{"id": "s.id || '-h' || g", "idempotency_key": "s.idempotency_key || ':h' || g"}, ws)
	if err != nil {
		return nil, false, err
	}
	if _, err := cloneRows(ctx, pool, "effect_attempts", copies, "s.workspace_id = $1",
		map[string]string{"effect_id": "s.effect_id || '-h' || g"}, ws); err != nil {
		return nil, false, err
	}
	if err := analyze(ctx, pool, "effects", "effect_attempts"); err != nil {
		return nil, false, err
	}
	s.seeded = warm + int(n)
	return s, true, nil
}

// gateCycles: begin→report cycles/s over HTTP at b.scale.Clients clients on
// new keys, with p50/p99 of begin alone; wall-clock over all b.scale.Requests
// cycles, then every one is checked succeeded in the database.
func gateCycles(ctx context.Context, b *bench) error {
	s, ok, err := b.gateSetup(ctx)
	if err != nil {
		return err
	}
	if !ok {
		b.todo("ratchet.gate.cycles_per_s", "no gate routes in this build (also ratchet.gate.begin_p50_ms, ratchet.gate.begin_p99_ms)")
		return nil
	}
	defer s.in.Close()
	begins := make([]time.Duration, b.scale.Requests)
	res, err := load(ctx, b.scale.Clients, b.scale.Requests, func(ctx context.Context, i int) error {
		d, err := s.cycle(ctx, "cycle-"+strconv.Itoa(i))
		begins[i] = d
		return err
	})
	if err != nil {
		return err
	}
	var succeeded int
	if err := s.in.App.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE workspace_id = $1 AND state = 'succeeded'`,
		s.workspaceID).Scan(&succeeded); err != nil {
		return err
	}
	if want := s.seeded + b.scale.Requests; succeeded != want {
		return fmt.Errorf("%d effects succeeded after the run, want %d", succeeded, want)
	}
	res.CPU.report(b.out, "ratchet.gate.cycles", res.N)
	b.emit("ratchet.gate.cycles_per_s", res.Rate())
	b.emit("ratchet.gate.begin_p50_ms", ms(percentile(begins, 50)))
	b.emit("ratchet.gate.begin_p99_ms", ms(percentile(begins, 99)))
	return nil
}

// gateDuplicateBegins: begins/s at b.scale.Clients clients on keys that
// already succeeded (decision duplicate, the recorded result returned), the
// retry storm the gate exists to absorb.
func gateDuplicateBegins(ctx context.Context, b *bench) error {
	s, ok, err := b.gateSetup(ctx)
	if err != nil {
		return err
	}
	if !ok {
		b.todo("ratchet.gate.duplicate_begins_per_s", "no gate routes in this build")
		return nil
	}
	defer s.in.Close()
	warm := min(gateWarm, max(b.scale.History, 1))
	res, err := load(ctx, b.scale.Clients, b.scale.Requests, func(ctx context.Context, i int) error {
		var d beginAnswer
		if err := s.in.Expect(ctx, http.StatusOK, "POST", "/api/v1/effects/begin", s.agent,
			beginBody("hist-"+strconv.Itoa(i%warm)), &d); err != nil {
			return err
		}
		if d.Decision != "duplicate" {
			return fmt.Errorf("begin on a succeeded key: decision %q, want duplicate", d.Decision)
		}
		return nil
	})
	if err != nil {
		return err
	}
	b.emit("ratchet.gate.duplicate_begins_per_s", res.Rate())
	return nil
}

package gate_test

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/gate"
)

// Benchmarks run against real Postgres through apitest:
//
//	DATABASE_URL=... go test ./lib/gate/ -run '^$' -bench . -benchtime 3s
//
// The Service ones measure the gate and its SQL; the HTTP ones add auth,
// JSON and the loopback server. DB_QUERY_EXEC_MODE picks the pool's query
// mode (exec, the default, plans every statement; cache_statement reuses
// server-side prepared statements where no transaction pooler is in between).

func benchSetup(b *testing.B) (*apitest.Env, *auth.Principal, *gate.Service, string) {
	env := apitest.Start(b, apitest.WithConfig(func(c *config.Config) {
		if m := os.Getenv("DB_QUERY_EXEC_MODE"); m != "" {
			c.DBQueryExecMode = m
		}
	}))
	ws := env.Signup()
	return env, &auth.Principal{WorkspaceID: ws.ID, KeyID: keyID(ws.Key)}, env.App.Server.Gate, ws.Key
}

func benchReq(k string) gate.BeginRequest {
	return gate.BeginRequest{EffectType: "email.send", IdempotencyKey: k,
		Payload: []byte(`{"to":"user_123","template":"welcome"}`), Dimensions: map[string]string{"recipient": "user_123"}}
}

// beginReport is one full cycle on a new key: execute, then succeeded.
func beginReport(b *testing.B, g *gate.Service, p *auth.Principal, req gate.BeginRequest) {
	ctx := context.Background()
	d, err := g.Begin(ctx, p, req)
	if err != nil || d.Decision != gate.DecisionExecute {
		b.Fatal(d.Decision, err)
	}
	if _, err := g.Report(ctx, p, d.EffectID, gate.ReportRequest{LeaseToken: d.LeaseToken, Outcome: "succeeded",
		Result: []byte(`{"message_id":"m_1"}`)}); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkServiceBeginReportNewKey(b *testing.B) {
	_, p, g, _ := benchSetup(b)
	prefix := key("bench")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		beginReport(b, g, p, benchReq(prefix+strconv.Itoa(i)))
	}
}

func BenchmarkServiceBeginDuplicate(b *testing.B) {
	_, p, g, _ := benchSetup(b)
	ctx := context.Background()
	req := benchReq(key("dup"))
	beginReport(b, g, p, req)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := g.Begin(ctx, p, req)
		if err != nil || d.Decision != gate.DecisionDuplicate {
			b.Fatal(d.Decision, err)
		}
	}
}

func BenchmarkServiceBeginDuplicateParallel(b *testing.B) {
	_, p, g, _ := benchSetup(b)
	ctx := context.Background()
	req := benchReq(key("dup"))
	beginReport(b, g, p, req)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if d, err := g.Begin(ctx, p, req); err != nil || d.Decision != gate.DecisionDuplicate {
				b.Error(d.Decision, err)
				return
			}
		}
	})
}

func BenchmarkHTTPBeginReportNewKey(b *testing.B) {
	env, _, _, secret := benchSetup(b)
	prefix := key("bench")
	var n atomic.Int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		status, d, err := post(env, "/api/v1/effects/begin", secret, email(prefix+strconv.FormatInt(n.Add(1), 10)))
		if err != nil || status != http.StatusOK || d["decision"] != "execute" {
			b.Fatal(status, d, err)
		}
		status, _, err = post(env, "/api/v1/effects/"+str(d["effect_id"])+"/report", secret,
			map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded", "result": map[string]any{"id": 1}})
		if err != nil || status != http.StatusOK {
			b.Fatal(status, err)
		}
	}
}

func BenchmarkHTTPBeginDuplicate(b *testing.B) {
	env, _, _, secret := benchSetup(b)
	body := email(key("dup"))
	_, d, err := post(env, "/api/v1/effects/begin", secret, body)
	if err != nil {
		b.Fatal(err)
	}
	if status, _, err := post(env, "/api/v1/effects/"+str(d["effect_id"])+"/report", secret,
		map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded"}); err != nil || status != 200 {
		b.Fatal(status, err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		status, d, err := post(env, "/api/v1/effects/begin", secret, body)
		if err != nil || status != http.StatusOK || d["decision"] != "duplicate" {
			b.Fatal(status, d, err)
		}
	}
}

package jobs_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/jsonx"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// bundle is one workspace over the real service, driven without HTTP.
type bundle struct {
	env    *apitest.Env
	svc    *jobs.Service
	clock  *apitest.Clock
	ws     string
	op     string // the workspace's operator key, for a request over HTTP
	worker *auth.Principal
	looks  *lookCounter
}

func setup(t testing.TB, tools ...string) *bundle {
	t.Helper()
	c := apitest.NewClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	env := apitest.Start(t, apitest.WithNow(c.Now))
	ws := env.Signup()
	if tools == nil {
		tools = []string{"send_email@1"}
	}
	secret := env.Key(ws, map[string]any{"name": "worker", "preset": "WORKER", "tools": tools})
	p, err := env.App.Server.Auth.Authenticate(context.Background(), secret)
	require.NoError(t, err)
	b := &bundle{env: env, svc: env.App.Server.Jobs, clock: c, ws: ws.ID, op: ws.Key, worker: p, looks: &lookCounter{n: map[string]int{}}}
	jobs.OnLook(b.svc, b.looks.add)
	return b
}

func (b *bundle) run(t testing.TB) string {
	t.Helper()
	r, err := b.svc.CreateRun(context.Background(), b.ws, jobs.CreateRunRequest{Name: "r"})
	require.NoError(t, err)
	return r.ID
}

func (b *bundle) register(t testing.TB, tools ...jobs.Tool) string {
	t.Helper()
	if tools == nil {
		tools = []jobs.Tool{{Name: "send_email", Version: "1"}}
	}
	r, err := b.svc.RegisterWorker(context.Background(), b.worker, jobs.RegisterRequest{Tools: tools})
	require.NoError(t, err)
	return r.WorkerID
}

func ptr[T any](v T) *T { return &v }

func opt[T any](v T) jsonx.Optional[T] { return jsonx.Optional[T]{Set: true, Value: v} }

func null[T any]() jsonx.Optional[T] { return jsonx.Optional[T]{Set: true, Null: true} }

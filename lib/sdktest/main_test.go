// Package sdktest runs the Go SDK (sdk/go) against the real service: the
// project's router in-process over real Postgres. It lives in the main module
// so the SDK module itself stays free of dependencies.
package sdktest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// bundle is one service instance with a workspace and SDK clients for each
// role.
type bundle struct {
	env      *apitest.Env
	ws       apitest.Workspace
	producer *ratchet.Client // INGEST key
	operator *ratchet.Client // every scope: reads runs, effects; replays
}

func setup(t *testing.T, opts ...apitest.Option) *bundle {
	t.Helper()
	env := apitest.Start(t, opts...)
	ws := env.Signup()
	b := &bundle{env: env, ws: ws}
	b.producer = b.client(t, env.Key(ws, map[string]any{"name": "producer", "preset": "INGEST"}), nil)
	b.operator = b.client(t, ws.Key, nil)
	return b
}

// client returns an SDK client for key over the test server; transport, when
// set, wraps the server's.
func (b *bundle) client(t *testing.T, key string, wrap func(http.RoundTripper) http.RoundTripper) *ratchet.Client {
	t.Helper()
	hc := b.env.Server.Client()
	if wrap != nil {
		hc = &http.Client{Transport: wrap(hc.Transport)}
	}
	c, err := ratchet.NewClient(ratchet.Config{BaseURL: b.env.Server.URL, APIKey: key, HTTPClient: hc})
	require.NoError(t, err)
	return c
}

// workerKey mints a WORKER key for exactly the given name@version pairs.
func (b *bundle) workerKey(t *testing.T, tools ...string) string {
	t.Helper()
	return b.env.Key(b.ws, map[string]any{"name": "worker", "preset": "WORKER", "tools": tools})
}

// errs collects a worker's OnError calls.
type errs struct {
	mu   sync.Mutex
	list []error
}

func (e *errs) add(err error) {
	e.mu.Lock()
	e.list = append(e.list, err)
	e.mu.Unlock()
}

func (e *errs) find(target any) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, err := range e.list {
		if errors.As(err, target) {
			return true
		}
	}
	return false
}

// start starts w with a short poll interval (tests must not wait 30 s for a
// claim) and stops it gracefully when the test ends.
func start(t *testing.T, w *ratchet.Worker, concurrency int) *errs {
	t.Helper()
	e := &errs{}
	require.NoError(t, w.Start(context.Background(), ratchet.StartOptions{
		Concurrency: concurrency, PollInterval: 100 * time.Millisecond, OnError: e.add}))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})
	return e
}

// waitRun reads the run until done says so, failing after a minute.
func waitRun(t *testing.T, c *ratchet.Client, runID string, done func(*ratchet.Run) bool) *ratchet.Run {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		run, err := c.GetRun(context.Background(), runID)
		require.NoError(t, err)
		if done(run) {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never reached the expected state; last: %+v", runID, run)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// step returns the run's step with id.
func step(t *testing.T, run *ratchet.Run, id string) ratchet.Step {
	t.Helper()
	for _, s := range run.Steps {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("run %s has no step %s: %+v", run.ID, id, run.Steps)
	return ratchet.Step{}
}

// stepIs waits until the step's status is one of statuses.
func stepIs(t *testing.T, c *ratchet.Client, runID, stepID string, statuses ...string) ratchet.Step {
	t.Helper()
	run := waitRun(t, c, runID, func(r *ratchet.Run) bool {
		for _, s := range r.Steps {
			if s.ID == stepID {
				for _, want := range statuses {
					if s.Status == want {
						return true
					}
				}
			}
		}
		return false
	})
	return step(t, run, stepID)
}

// severable is a transport that can be cut, to simulate a worker process
// that died: nothing it sends arrives any more.
type severable struct {
	cut  atomic.Bool
	next http.RoundTripper
}

func (s *severable) RoundTrip(r *http.Request) (*http.Response, error) {
	if s.cut.Load() {
		return nil, errors.New("severed")
	}
	return s.next.RoundTrip(r)
}

// counting counts claim requests.
type counting struct {
	mu     sync.Mutex
	claims int
	next   http.RoundTripper
	read   chan struct{} // gets a value as the SDK closes a claim's answer
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	claim := strings.HasSuffix(r.URL.Path, "/claim")
	if claim {
		c.mu.Lock()
		c.claims++
		c.mu.Unlock()
	}
	res, err := c.next.RoundTrip(r)
	if claim && err == nil && c.read != nil {
		res.Body = &closeSignal{ReadCloser: res.Body, read: c.read}
	}
	return res, err
}

// closeSignal sends on read when its body is first closed: the SDK has
// read the answer and acts on it next.
type closeSignal struct {
	io.ReadCloser
	once sync.Once
	read chan struct{}
}

func (b *closeSignal) Close() error {
	b.once.Do(func() {
		select {
		case b.read <- struct{}{}:
		default:
		}
	})
	return b.ReadCloser.Close()
}

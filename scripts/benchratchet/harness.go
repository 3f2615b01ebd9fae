package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/getratchet/ratchet/lib/app"
	"github.com/getratchet/ratchet/lib/config"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// instance is one Ratchet instance served over loopback HTTP: the same App
// every entry point builds, behind a real listener, so request figures pay
// for HTTP, JSON, authentication and the pool exactly as a deployment does.
type instance struct {
	App    *app.App
	URL    string
	Client *http.Client
	srv    *http.Server
}

// instance starts a fresh instance with the bench configuration, edited by
// edit when set. Close it when the figure is done.
func (b *bench) instance(ctx context.Context, edit func(*config.Config)) (*instance, error) {
	return b.instanceWrapped(ctx, edit, nil)
}

// serverInstance is instanceWrapped for the request-rate and job figures,
// where one instance serves every client at once. That is the local server's
// situation (or that of as many serverless instances as there are clients,
// each with its own pool), so the pool is sized like the local server's:
// config.ServerDBMaxConns unless DB_MAX_CONNS is set; the serverless default
// of 4 is for an instance serving one request at a time. DB_MAX_CONNS=4
// gives the figures at that default. The pool size is printed once per
// figure under label.
func (b *bench) serverInstance(ctx context.Context, label string, wrap func(http.Handler) http.Handler) (*instance, error) {
	in, err := b.instanceWrapped(ctx, (*config.Config).SizeForServer, wrap)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(b.out, "# %s db_max_conns=%d\n", label, in.App.Pool.Config().MaxConns)
	return in, nil
}

// instanceWrapped is instance with the app's handler wrapped by wrap (when
// set), e.g. to count requests where the server sees them.
func (b *bench) instanceWrapped(ctx context.Context, edit func(*config.Config), wrap func(http.Handler) http.Handler) (*instance, error) {
	cfg := *b.cfg
	if edit != nil {
		edit(&cfg)
	}
	a, err := app.New(ctx, &cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		a.Close()
		return nil, err
	}
	var h http.Handler = a.Server
	if wrap != nil {
		h = wrap(h)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	// Enough idle connections that a burst of clients reuses them instead
	// of exhausting ephemeral ports.
	tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute}
	return &instance{App: a, URL: "http://" + ln.Addr().String(), Client: &http.Client{Transport: tr, Timeout: time.Minute}, srv: srv}, nil
}

// SDK is a Go SDK client for key over the instance's loopback transport.
func (in *instance) SDK(key string) (*ratchet.Client, error) {
	return ratchet.NewClient(ratchet.Config{BaseURL: in.URL, APIKey: key, HTTPClient: in.Client})
}

// Close stops the server, then the pool.
func (in *instance) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = in.srv.Shutdown(ctx)
	in.Client.CloseIdleConnections()
	in.App.Close()
}

// Do sends one JSON request with an optional bearer key and returns the
// status and body. body may be nil, a []byte sent as is, or a value to
// marshal.
func (in *instance) Do(ctx context.Context, method, path, key string, body any) (int, []byte, error) {
	var rdr io.Reader
	switch v := body.(type) {
	case nil:
	case []byte:
		rdr = bytes.NewReader(v)
	default:
		raw, err := json.Marshal(v)
		if err != nil {
			return 0, nil, err
		}
		rdr = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, in.URL+path, rdr)
	if err != nil {
		return 0, nil, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if rdr != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := in.Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	return res.StatusCode, raw, err
}

// Expect sends a request, requires the status and decodes the body into out
// (when out is not nil).
func (in *instance) Expect(ctx context.Context, status int, method, path, key string, body, out any) error {
	got, raw, err := in.Do(ctx, method, path, key, body)
	if err != nil {
		return err
	}
	if got != status {
		return fmt.Errorf("%s %s: status %d, want %d: %.300s", method, path, got, status, raw)
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// Signup creates a workspace and returns its id and OPERATOR secret.
func (in *instance) Signup(ctx context.Context) (workspaceID, key string, err error) {
	var out struct {
		WorkspaceID string `json:"workspace_id"`
		Key         struct {
			Secret string `json:"secret"`
		} `json:"key"`
	}
	err = in.Expect(ctx, http.StatusCreated, "POST", "/api/v1/workspaces", "", map[string]any{"name": "bench"}, &out)
	return out.WorkspaceID, out.Key.Secret, err
}

// MintKey creates a key from body (e.g. {"name":"a","preset":"AGENT"}) with
// the operator key and returns its secret.
func (in *instance) MintKey(ctx context.Context, operatorKey string, body map[string]any) (string, error) {
	var out struct {
		Secret string `json:"secret"`
	}
	err := in.Expect(ctx, http.StatusCreated, "POST", "/api/v1/keys", operatorKey, body, &out)
	return out.Secret, err
}

// loadResult is the outcome of load: every operation timed, and the
// wall-clock of the whole batch.
type loadResult struct {
	N         int
	Elapsed   time.Duration
	Latencies []time.Duration // one per operation, unsorted
	CPU       cpuSpan
}

// Rate is operations per second over the whole batch.
func (r loadResult) Rate() float64 { return float64(r.N) / r.Elapsed.Seconds() }

// Percentile returns the p-th percentile (0-100) of the latencies.
func (r loadResult) Percentile(p float64) time.Duration { return percentile(r.Latencies, p) }

// load runs n operations from clients goroutines (op(i) for i in [0,n)),
// timing each and the whole batch. The first error stops every client and is
// returned: a figure with a failed operation is not a figure.
func load(ctx context.Context, clients, n int, op func(ctx context.Context, i int) error) (loadResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
		lat      = make([]time.Duration, n)
	)
	cpu := startCPUWindow()
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t := time.Now()
				if err := op(ctx, i); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
				lat[i] = time.Since(t)
			}
		})
	}
	wg.Wait()
	res := loadResult{N: n, Elapsed: time.Since(start), Latencies: lat, CPU: cpu.stop()}
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return res, firstErr
}

// percentile uses the nearest-rank method on a sorted copy.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := int(p/100*float64(len(s)) + 0.999999)
	return s[min(max(rank, 1), len(s))-1]
}

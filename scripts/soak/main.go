// Command soak drives mixed traffic at a running local server for a while
// and samples, every -every, what would grow without bound under steady
// traffic: the server's goroutines and heap (from its pprof, when -pprof is
// given: the address the server's RATCHET_PPROF_ADDR serves), its RSS and
// open fds (-pid), the database's connections per application_name and the
// main tables' live and dead rows, the traffic's latency and 5xx, and the
// same of this process (whose Go SDK worker claims and reports the jobs).
package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/getratchet/ratchet/lib/redact"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

func main() {
	base := flag.String("base", "http://127.0.0.1:8893", "the server")
	pprof := flag.String("pprof", "", "the server's pprof address (host:port): start the local server with "+
		"RATCHET_PPROF_ADDR set to it (README, \"Profiling the local server\")")
	pid := flag.Int("pid", 0, "the server's process id, for its RSS and fds")
	dbURL := flag.String("db", os.Getenv("DATABASE_URL"), "the server's database")
	dur := flag.Duration("for", 8*time.Minute, "how long to drive traffic")
	every := flag.Duration("every", 30*time.Second, "how often to sample")
	busy := flag.Duration("busy", 90*time.Second, "traffic between idle periods")
	idle := flag.Duration("idle", 20*time.Second, "each idle period")
	backlog := flag.Int("backlog", 0, "approval requests made at the start in "+fmt.Sprint(backlogSpaces)+
		" more workspaces, whose webhooks all fail (answered 500, late, refused), and a twentieth of it again "+
		"every 5 s of traffic: a backlog of about 6 times as many failing deliveries, retried with backoff")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *dur)
	defer cancel()
	d := &driver{base: *base, lat: map[string][]time.Duration{}, status: map[string]int{}}
	d.httpc = &http.Client{Transport: d, Timeout: 30 * time.Second}
	d.setUp(ctx)
	db, err := sql.Open("pgx", *dbURL)
	if err != nil {
		log.Fatal(redact.ErrorText(err))
	}
	defer db.Close()
	if *backlog > 0 {
		d.setUpBacklog(ctx, *backlog)
	}

	d.awake.Store(true)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { d.gateLoop(ctx, i) })
	}
	wg.Go(func() { d.approvalLoop(ctx) })
	wg.Go(func() { d.producerLoop(ctx) })
	wg.Go(func() { d.readLoop(ctx) })
	wg.Go(func() { d.mcpLoop(ctx) })
	wg.Go(func() { d.rudeLoop(ctx) })
	wg.Go(func() { d.watchConns(ctx, db) })
	if *backlog > 0 {
		wg.Go(func() { d.backlogLoop(ctx, *backlog/20) })
	}
	wg.Go(func() {
		for ctx.Err() == nil {
			if sleep(ctx, *busy); ctx.Err() != nil {
				break // the run's end is no idle period
			}
			d.awake.Store(false)
			fmt.Println("# idle")
			sleep(ctx, *idle)
			d.awake.Store(true)
			fmt.Println("# busy")
		}
	})
	began := time.Now()
	d.sample(ctx, db, *pprof, *pid, 0)
	tick := time.NewTicker(*every)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			d.sample(ctx, db, *pprof, *pid, time.Since(began))
		}
	}
	wg.Wait()
	stop, cancelStop := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelStop()
	if err := d.worker.Stop(stop); err != nil {
		fmt.Println("# worker stop:", redact.ErrorText(err))
	}
	d.client.CloseIdleConnections()
	time.Sleep(2 * time.Second) // let the server see the closes
	d.sample(context.Background(), db, *pprof, *pid, time.Since(began))
}

type driver struct {
	base   string
	httpc  *http.Client
	client *http.Transport
	awake  atomic.Bool

	operator, agent, producer *ratchet.Client
	limited, rudeWorker       *ratchet.Client // a rate-limited agent; a worker whose claims are cut
	operatorKey               string
	worker                    *ratchet.Worker

	mu     sync.Mutex
	lat    map[string][]time.Duration // per route kind, since the last sample
	status map[string]int             // "5xx", "4xx code", "transport" since the start
	keys   []string                   // gate keys used, for duplicates
	seq    atomic.Int64
	hooked atomic.Int64 // webhook deliveries received

	receiver string            // the webhook receivers' host:port
	backlog  []*ratchet.Client // the backlog workspaces' agents (-backlog)
	// peakPass and peakBusy are the most of the server's connections seen
	// at once (watchConns) since the last sample running a delivery pass's
	// statements, and running any.
	peakPass, peakBusy atomic.Int64
}

// RoundTrip times every call the SDK clients make and counts its status.
func (d *driver) RoundTrip(r *http.Request) (*http.Response, error) {
	t0 := time.Now()
	res, err := d.client.RoundTrip(r)
	kind := routeKind(r.Method, r.URL.Path)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		if r.Context().Err() == nil {
			d.status["transport "+kind]++
		}
		return res, err
	}
	d.lat[kind] = append(d.lat[kind], time.Since(t0))
	if res.StatusCode >= 400 {
		d.status[fmt.Sprint(res.StatusCode, " ", kind)]++
	}
	return res, err
}

func routeKind(method, path string) string {
	parts := strings.Split(strings.TrimPrefix(path, "/api/v1/"), "/")
	for i, p := range parts {
		if strings.Contains(p, "_") && len(p) > 8 {
			parts[i] = "{id}"
		}
	}
	if len(parts) > 3 {
		parts = parts[:3]
	}
	return method + " " + strings.Join(parts, "/")
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// pause holds a loop while the traffic is idle.
func (d *driver) pause(ctx context.Context) {
	for ctx.Err() == nil && !d.awake.Load() {
		sleep(ctx, 200*time.Millisecond)
	}
}

func must(err error) {
	if err != nil {
		log.Fatal(redact.ErrorText(err))
	}
}

func (d *driver) sdk(key string) *ratchet.Client {
	c, err := ratchet.NewClient(ratchet.Config{BaseURL: d.base, APIKey: key, HTTPClient: d.httpc})
	must(err)
	return c
}

// signUp signs a workspace named name up and answers its first key.
func (d *driver) signUp(name string) string {
	body, err := json.Marshal(map[string]string{"name": name})
	must(err)
	res, err := http.Post(d.base+"/api/v1/workspaces", "application/json", bytes.NewReader(body))
	must(err)
	defer res.Body.Close()
	var signup struct {
		Key struct {
			Secret string `json:"secret"`
		} `json:"key"`
	}
	must(json.NewDecoder(res.Body).Decode(&signup))
	return signup.Key.Secret
}

// setUp signs a workspace up with its keys, policies, an endpoint, two
// webhooks (one receiver answers 200, the other 500) and a worker.
func (d *driver) setUp(ctx context.Context) {
	d.client = http.DefaultTransport.(*http.Transport).Clone()
	d.client.MaxIdleConnsPerHost = 32
	d.operatorKey = d.signUp("soak")
	d.operator = d.sdk(d.operatorKey)
	key := func(spec ratchet.KeySpec) string {
		k, err := d.operator.CreateKey(ctx, spec)
		must(err)
		return k.Secret
	}
	d.agent = d.sdk(key(ratchet.KeySpec{Name: "agent", Preset: "AGENT"}))
	d.producer = d.sdk(key(ratchet.KeySpec{Name: "producer", Preset: "INGEST"}))
	workerKey := key(ratchet.KeySpec{Name: "worker", Preset: "WORKER", Tools: []string{"soak_job@1"}})
	perMinute := 300
	d.limited = d.sdk(key(ratchet.KeySpec{Name: "limited", Preset: "AGENT", RateLimitPerMinute: &perMinute}))
	d.rudeWorker = d.sdk(key(ratchet.KeySpec{Name: "rude", Preset: "WORKER", Tools: []string{"soak_job@1"}}))
	must(d.operator.Request(ctx, "PUT", "/policies/soak.email", map[string]any{
		"on_indeterminate": "retry", "lease_seconds": 5, "max_attempts": 5, "retention_days": 1}, nil, ratchet.RequestOptions{}))
	must(d.operator.Request(ctx, "PUT", "/policies/soak.pay", map[string]any{
		"on_indeterminate": "block", "lease_seconds": 10, "max_cost_micros": 100_000,
		"approval_above_micros": 50_000, "daily_budget_micros": 20_000_000}, nil, ratchet.RequestOptions{}))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			d.hooked.Add(1)
			switch {
			case strings.HasSuffix(r.URL.Path, "/fail"):
				w.WriteHeader(http.StatusInternalServerError)
			case strings.HasSuffix(r.URL.Path, "/slow"):
				time.Sleep(12 * time.Second) // past the server's send timeout
			}
		}))
	}()
	d.receiver = ln.Addr().String()
	for _, url := range []string{"http://" + d.receiver + "/ok", "http://" + d.receiver + "/fail",
		"http://" + d.receiver + "/slow", refused() + "/gone"} {
		_, err := d.operator.CreateWebhook(ctx, url, hookEvents)
		must(err)
	}

	d.worker = ratchet.NewWorker(d.sdk(workerKey))
	must(ratchet.RegisterTool(d.worker, ratchet.Tool[map[string]int, map[string]int]{Name: "soak_job", Version: "1",
		Handler: func(ctx context.Context, in map[string]int, job ratchet.JobContext) (map[string]int, error) {
			sleep(ctx, time.Duration(rand.IntN(20))*time.Millisecond)
			switch n := rand.IntN(100); {
			case n < 15:
				return nil, ratchet.Retryable("soak: flaky", time.Second)
			case n < 18:
				return nil, ratchet.NonRetryable("soak: refused")
			case n < 20:
				return nil, errors.New("soak: plain error")
			}
			return in, nil
		}}))
	must(d.worker.Start(context.Background(), ratchet.StartOptions{Concurrency: 4, WaitSeconds: 5,
		PollInterval: time.Second, OnError: func(error) {}}))
}

var hookEvents = []string{"effect.indeterminate", "approval.requested", "approval.decided", "run.finished", "step.exhausted"}

// refused is a URL's scheme and host where nothing listens: connection refused.
func refused() string {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	must(closed.Close())
	return "http://" + closed.Addr().String()
}

// backlogSpaces is how many workspaces -backlog signs up: a pass sends at
// most 40 of one workspace's deliveries at once, and 100 in all.
const backlogSpaces = 3

// setUpBacklog signs up backlogSpaces workspaces, each with six webhooks
// that fail (two answered 500, two late past the server's send timeout, two
// refused) and a type every begin of which asks for approval, and makes n
// approval requests among them: 6n failing deliveries.
func (d *driver) setUpBacklog(ctx context.Context, n int) {
	for range backlogSpaces {
		op := d.sdk(d.signUp("soak backlog"))
		must(op.Request(ctx, "PUT", "/policies/soak.backlog", map[string]any{
			"on_indeterminate": "block", "max_cost_micros": 1000, "approval_above_micros": 0}, nil, ratchet.RequestOptions{}))
		for _, url := range []string{"http://" + d.receiver + "/fail?n=1", "http://" + d.receiver + "/fail?n=2",
			"http://" + d.receiver + "/slow?n=1", "http://" + d.receiver + "/slow?n=2", refused() + "/gone", refused() + "/gone"} {
			_, err := op.CreateWebhook(ctx, url, hookEvents)
			must(err)
		}
		k, err := op.CreateKey(ctx, ratchet.KeySpec{Name: "agent", Preset: "AGENT"})
		must(err)
		d.backlog = append(d.backlog, d.sdk(k.Secret))
	}
	t0 := time.Now()
	d.askApprovals(ctx, n)
	fmt.Printf("# backlog: %d approval requests in %d workspaces in %s\n", n, backlogSpaces, time.Since(t0).Round(time.Millisecond))
}

// askApprovals begins n soak.backlog effects, 8 at a time, in turn among
// the backlog workspaces: each asks for approval.
func (d *driver) askApprovals(ctx context.Context, n int) {
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n) && ctx.Err() == nil; i = next.Add(1) {
				_, _ = d.backlog[i%backlogSpaces].Begin(ctx, ratchet.BeginRequest{EffectType: "soak.backlog",
					IdempotencyKey: fmt.Sprint("backlog:", d.seq.Add(1)), Payload: map[string]any{}, CostMicros: ratchet.Micros(1)})
			}
		})
	}
	wg.Wait()
}

// backlogLoop keeps the backlog growing: n more approval requests every 5 s
// of traffic.
func (d *driver) backlogLoop(ctx context.Context, n int) {
	for ctx.Err() == nil {
		sleep(ctx, 5*time.Second)
		d.pause(ctx)
		d.askApprovals(ctx, max(1, n))
	}
}

// watchConns samples the server's connections every 100 ms, between the
// sample lines' snapshots: the most at once running a webhook delivery
// pass's statements (its claim, its records of outcomes, its check of held
// secrets), and running any statement.
func (d *driver) watchConns(ctx context.Context, db *sql.DB) {
	for ctx.Err() == nil {
		var pass, busy int64
		err := db.QueryRowContext(ctx, `SELECT
			count(*) FILTER (WHERE ltrim(query, E' \t\n') LIKE 'UPDATE webhook\_deliveries%'
			                    OR ltrim(query, E' \t\n') LIKE 'WITH busy AS%'
			                    OR ltrim(query, E' \t\n') LIKE 'SELECT w.id, substring(w.secret%'),
			count(*)
			FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'ratchet'
			  AND state <> 'idle'`).Scan(&pass, &busy)
		if err == nil {
			for p := d.peakPass.Load(); pass > p && !d.peakPass.CompareAndSwap(p, pass); p = d.peakPass.Load() {
			}
			for p := d.peakBusy.Load(); busy > p && !d.peakBusy.CompareAndSwap(p, busy); p = d.peakBusy.Load() {
			}
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

// gateLoop begins effects: most succeed, some heartbeat through a slow
// action, some die mid-action (their leases lapse: indeterminate), some are
// duplicates of keys already used, and soak.pay ones meet approvals and the
// daily budget.
func (d *driver) gateLoop(ctx context.Context, n int) {
	for ctx.Err() == nil {
		d.pause(ctx)
		i := d.seq.Add(1)
		typ, cost := "soak.email", int64(0)
		if i%4 == 0 {
			typ, cost = "soak.pay", int64(rand.IntN(80_000))
		}
		key := fmt.Sprintf("%s:%d:%d", typ, n, i)
		d.mu.Lock()
		if len(d.keys) > 0 && rand.IntN(10) == 0 {
			key = d.keys[rand.IntN(len(d.keys))]
			typ, _, _ = strings.Cut(key, ":")
			cost, _ = strconv.ParseInt(key[strings.LastIndex(key, "=")+1:], 10, 64)
		} else {
			key = fmt.Sprintf("%s=%d", key, cost)
			if len(d.keys) < maxKeys {
				d.keys = append(d.keys, key)
			} else {
				d.keys[rand.IntN(maxKeys)] = key // the driver's own memory stays flat
			}
		}
		d.mu.Unlock()
		dies, slow := rand.IntN(30) == 0, rand.IntN(40) == 0
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		agent := d.agent
		if n == 0 {
			agent = d.limited // meets 429s
		}
		_, _ = ratchet.DoEffect(c, agent, ratchet.BeginRequest{EffectType: typ, IdempotencyKey: key,
			Payload: map[string]any{"k": key}, CostMicros: ratchet.Micros(cost)},
			func(actx context.Context, l ratchet.Lease) (map[string]any, error) {
				if dies {
					return nil, errors.New("soak: died")
				}
				if slow {
					sleep(actx, 4*time.Second) // past a third of the 5 s lease: heartbeats
				}
				return map[string]any{"ok": true}, nil
			})
		cancel()
		sleep(ctx, time.Duration(20+rand.IntN(40))*time.Millisecond)
	}
}

// rudeLoop makes calls their callers give up mid-way: long-polling claims
// and begins cut after a few milliseconds, as a killed client leaves them.
func (d *driver) rudeLoop(ctx context.Context) {
	id, err := d.rudeWorker.RegisterWorker(ctx, []ratchet.ToolRef{{Name: "soak_job", Version: "1"}})
	must(err)
	for i := 0; ctx.Err() == nil; i++ {
		d.pause(ctx)
		c, cancel := context.WithTimeout(ctx, time.Duration(5+rand.IntN(300))*time.Millisecond)
		if i%2 == 0 {
			_, _ = d.rudeWorker.Claim(c, id, 1, 10)
		} else {
			_, _ = d.agent.Begin(c, ratchet.BeginRequest{EffectType: "soak.email", IdempotencyKey: fmt.Sprint("rude:", i),
				Payload: map[string]any{}})
		}
		cancel()
		sleep(ctx, 100*time.Millisecond)
	}
}

// maxKeys bounds the gate keys kept for duplicates.
const maxKeys = 5000

// approvalLoop approves or rejects the pending approvals now and then.
func (d *driver) approvalLoop(ctx context.Context) {
	for ctx.Err() == nil {
		sleep(ctx, 3*time.Second)
		d.pause(ctx)
		page, err := d.operator.ListApprovals(ctx, ratchet.ApprovalQuery{State: "pending", Limit: 50})
		if err != nil {
			continue
		}
		for _, a := range page.Data {
			if rand.IntN(2) == 0 {
				_, _ = d.operator.Approve(ctx, a.ID, "soak")
			} else {
				_, _ = d.operator.Reject(ctx, a.ID, "soak")
			}
		}
	}
}

// producerLoop starts runs of 10 jobs (a few enqueued twice) and finishes them.
func (d *driver) producerLoop(ctx context.Context) {
	for r := 0; ctx.Err() == nil; r++ {
		d.pause(ctx)
		run, err := d.producer.StartRun(ctx, fmt.Sprint("soak-", r))
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		for j := range 10 {
			opts := ratchet.EnqueueOptions{Name: "soak_job", Version: "1", MaxAttempts: 3}
			_, _ = d.producer.Enqueue(ctx, run.ID, map[string]int{"j": j}, opts)
			if j%5 == 0 {
				_, _ = d.producer.Enqueue(ctx, run.ID, map[string]int{"j": j}, opts) // deduplicated
			}
		}
		_, _ = d.producer.FinishRun(ctx, run.ID)
		sleep(ctx, 500*time.Millisecond)
	}
}

// readLoop reads what an operator and the console read.
func (d *driver) readLoop(ctx context.Context) {
	paths := []string{"/effects?limit=50", "/effects?state=indeterminate", "/runs?limit=20", "/approvals?state=pending",
		"/queue/health", "/webhooks", "/policies", "/circuits", "/keys", "/health"}
	for ctx.Err() == nil {
		sleep(ctx, 300*time.Millisecond)
		d.pause(ctx)
		for _, p := range paths {
			_ = d.operator.Request(ctx, "GET", p, nil, nil, ratchet.RequestOptions{})
		}
		var hooks ratchet.GatePage[ratchet.Webhook]
		if d.operator.Request(ctx, "GET", "/webhooks", nil, &hooks, ratchet.RequestOptions{}) == nil {
			for _, h := range hooks.Data {
				_ = d.operator.Request(ctx, "GET", "/webhooks/"+h.ID+"/deliveries?limit=20", nil, nil, ratchet.RequestOptions{})
			}
		}
		d.get(ctx, "/console", "")
	}
}

// get reads a path outside the API's JSON (the console page).
func (d *driver) get(ctx context.Context, path, key string) {
	req, _ := http.NewRequestWithContext(ctx, "GET", d.base+path, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if res, err := d.httpc.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
}

// mcpLoop calls MCP tools over streamable HTTP: initialize, tools/list, reads.
func (d *driver) mcpLoop(ctx context.Context) {
	calls := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"soak","version":"1"}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ratchet_list_effects","arguments":{"limit":20}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"ratchet_get_policy","arguments":{"effect_type":"soak.pay"}}}`,
		`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"ratchet_list_approvals","arguments":{}}}`,
	}
	for ctx.Err() == nil {
		sleep(ctx, 500*time.Millisecond)
		d.pause(ctx)
		for _, body := range calls {
			req, _ := http.NewRequestWithContext(ctx, "POST", d.base+"/api/v1/mcp", bytes.NewBufferString(body))
			req.Header.Set("Authorization", "Bearer "+d.operatorKey)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if res, err := d.httpc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}
	}
}

// sample prints one line of figures.
func (d *driver) sample(ctx context.Context, db *sql.DB, pprof string, pid int, at time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "t=%s", at.Round(time.Second))
	if pprof != "" {
		fmt.Fprintf(&b, " srv_goroutines=%s srv_heap=%s", pprofFigure(pprof, "goroutine?debug=1", "goroutine profile: total "),
			pprofFigure(pprof, "heap?debug=1", "# HeapAlloc = "))
	}
	if pid > 0 {
		fmt.Fprintf(&b, " srv_rss_kb=%s srv_fds=%d srv_threads=%s", procStatus(pid, "VmRSS:"), fds(pid), procStatus(pid, "Threads:"))
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(&b, " drv_goroutines=%d sdk_goroutines=%d drv_heap=%d drv_rss_kb=%s drv_fds=%d", runtime.NumGoroutine(),
		sdkGoroutines(), ms.HeapAlloc,
		procStatus(os.Getpid(), "VmRSS:"), fds(os.Getpid()))
	rows, err := db.QueryContext(ctx, `select coalesce(application_name,''), state, count(*) from pg_stat_activity
		where datname = current_database() and pid <> pg_backend_pid() group by 1, 2 order by 1, 2`)
	if err == nil {
		for rows.Next() {
			var app, state string
			var n int
			_ = rows.Scan(&app, &state, &n)
			fmt.Fprintf(&b, " conns[%s/%s]=%d", app, strings.ReplaceAll(state, " ", "_"), n)
		}
		rows.Close()
	}
	d.mu.Lock()
	var all []time.Duration
	var slowest string // the route kind of the window's slowest call, top its time
	var top time.Duration
	claims := 0
	for k, l := range d.lat {
		if strings.HasSuffix(k, "/claim") {
			claims += len(l) // long polls: they wait for a job up to their wait_seconds
			continue
		}
		all = append(all, l...)
		if m := slices.Max(l); m > top {
			top, slowest = m, k
		}
	}
	slices.Sort(all)
	if len(all) > 0 {
		fmt.Fprintf(&b, " calls=%d p50=%s p95=%s p99=%s max=%s max_route=%q claims=%d", len(all), all[len(all)/2],
			all[len(all)*95/100], all[len(all)*99/100], all[len(all)-1], slowest, claims)
	}
	fmt.Fprintf(&b, " hooks=%d peak_pass_conns=%d peak_busy_conns=%d errs=%v", d.hooked.Load(),
		d.peakPass.Swap(0), d.peakBusy.Swap(0), d.status)
	d.lat = map[string][]time.Duration{}
	d.mu.Unlock()
	fmt.Println(b.String())

	rows, err = db.QueryContext(ctx, `select relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid)
		from pg_stat_user_tables where n_live_tup + n_dead_tup > 0 order by pg_total_relation_size(relid) desc limit 14`)
	if err == nil {
		var t strings.Builder
		for rows.Next() {
			var name string
			var live, dead, size int64
			_ = rows.Scan(&name, &live, &dead, &size)
			fmt.Fprintf(&t, " %s=%d/%d/%dk", name, live, dead, size/1024)
		}
		rows.Close()
		fmt.Println("  tables(live/dead/size):" + t.String())
	}
}

// sdkGoroutines counts this process's goroutines running the Go SDK's code
// (the worker's loop, claims, handlers, reports; the gate's heartbeats).
func sdkGoroutines() int {
	var all bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&all, 2) // every stack, as a panic prints them
	n := 0
	for _, stack := range strings.Split(all.String(), "\n\n") {
		if strings.Contains(stack, "getratchet/ratchet/sdk/go.") {
			n++
		}
	}
	return n
}

func pprofFigure(addr, path, prefix string) string {
	res, err := http.Get("http://" + addr + "/debug/pprof/" + path)
	if err != nil {
		return "?"
	}
	defer res.Body.Close()
	s := bufio.NewScanner(res.Body)
	s.Buffer(make([]byte, 1<<20), 1<<24)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), prefix); ok {
			return v
		}
	}
	return "?"
}

func procStatus(pid int, field string) string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			return strings.Fields(v)[0]
		}
	}
	return "?"
}

func fds(pid int) int {
	es, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(es)
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// The product's core promise under crashes (crash QA): retries never
// double-charge, crashes never lose the record, nothing acknowledged is ever
// lost. TestCrashesLoseNothingAcknowledged runs the real local server as a
// process of its own (this test binary re-executed into main, sweeper and
// all) over the package's test database, drives producers, two workers and
// gate callers at it through the Go SDK, and SIGKILLs it a few times during
// the traffic, at moments drawn from a seeded RNG (CRASH_SEED replays one),
// restarting it on the same port each time while the clients retry as the
// SDK does. Once the last server has settled, the database and the API
// must hold every acknowledged enqueue and report, and the gate must never
// have run a key's action again while an attempt's outcome was unknown.

// crashServer is the local server run as a child process that can be
// killed and started again on the same port and database.
type crashServer struct {
	t      *testing.T
	run    string // the test that re-executes into main
	addr   string
	logs   *apitest.LockedBuffer
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
}

// start runs the server and returns once it listens.
func (s *crashServer) start() {
	t := s.t
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+s.run+"$")
	cmd.Env = append(os.Environ(), "RATCHET_LOCAL_MAIN=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s.cmd, s.exited = cmd, make(chan struct{})
	s.starts++
	listening := make(chan bool, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		said := false
		for lines.Scan() {
			fmt.Fprintf(s.logs, "[server %d] %s\n", s.starts, lines.Text())
			if !said && strings.Contains(lines.Text(), "listening on http://localhost:") {
				said = true
				listening <- true
			}
		}
		if !said {
			listening <- false
		}
	}()
	go func() { _ = cmd.Wait(); close(s.exited) }()
	select {
	case ok := <-listening:
		require.True(t, ok, "server %d exited before it listened:\n%s", s.starts, s.logs.String())
	case <-time.After(time.Minute):
		t.Fatalf("server %d did not listen within a minute:\n%s", s.starts, s.logs.String())
	}
}

// kill ends the server with SIGKILL, as a crash, an OOM kill or a pulled
// plug would: nothing runs after it, no drain, no deferred close.
func (s *crashServer) kill() {
	s.t.Helper()
	require.NoError(s.t, s.cmd.Process.Kill())
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		s.t.Fatal("the killed server did not exit")
	}
}

// freePort is a loopback port nothing listens on now: every server of the
// test listens there, as a restarted service keeps its address.
func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// crashGrant is an attempt: an effect's or a job's.
type crashGrant struct {
	id      string
	attempt int
}

// crashLog is what the clients' transport saw of the answers the promises
// are about.
type crashLog struct {
	next http.RoundTripper

	mu          sync.Mutex
	enqueued    map[string]map[string]bool // idempotency key → job ids answered 2xx
	executes    map[string]crashGrant      // begin answered execute: lease token → attempt
	gateReports map[string]string          // effect report answered 2xx: lease token → outcome
	jobReports  map[crashGrant]bool        // job report answered 2xx (alone or in a batch)
	failures    map[string]int             // answers not 2xx by status and code; transport errors
	// transportErrs are the transport errors' texts (test traffic: no user's values).
	transportErrs []string
	leaky5xx      []string // 5xx answers carrying more than their request id
}

func newCrashLog(next http.RoundTripper) *crashLog {
	return &crashLog{next: next, enqueued: map[string]map[string]bool{}, executes: map[string]crashGrant{},
		gateReports: map[string]string{}, jobReports: map[crashGrant]bool{}, failures: map[string]int{}}
}

var (
	crashEnqueuePath    = regexp.MustCompile(`^/api/v1/runs/[^/]+/steps$`)
	crashGateReportPath = regexp.MustCompile(`^/api/v1/effects/[^/]+/report$`)
	crashJobReportPath  = regexp.MustCompile(`^/api/v1/jobs/([^/]+/)?report$`)
	crashIDs            = regexp.MustCompile(`(eff|job|run|wkr)_[A-Za-z0-9]+`)
)

func (l *crashLog) RoundTrip(r *http.Request) (*http.Response, error) {
	began := time.Now()
	return apitest.Tee(l.next, r, func(r *http.Request, req []byte, res *http.Response, body []byte) {
		l.note(r.URL.Path, req, res, body)
	}, func(err error) {
		what := "transport error"
		switch {
		case errors.Is(r.Context().Err(), context.Canceled):
			// A call its caller gave up (a worker's claim cut by its Stop
			// as the traffic ends) is not the server failing to answer it
			// (CI: the database crash test counted one as such).
			what = "cancelled by its caller"
		case errors.Is(r.Context().Err(), context.DeadlineExceeded) && cutByCaller(r, began):
			// Nor is one cut by a deadline of its caller's own shorter
			// than the HTTP client's time-out (the Go SDK cuts a heartbeat
			// once a third of its lease is left).
			what = "cut by its caller's deadline"
		}
		l.mu.Lock()
		l.failures[what]++
		l.transportErrs = append(l.transportErrs, fmt.Sprintf("%s %s after %s: %s: %v", r.Method,
			crashIDs.ReplaceAllString(r.URL.Path, "…"), time.Since(began).Round(time.Millisecond), what, err))
		l.mu.Unlock()
	})
}

// crashClientTimeout is the HTTP client's time-out in these tests: a call
// cut by it is a call the server did not answer in time.
const crashClientTimeout = 15 * time.Second

// cutByCaller reports whether r's deadline, which ended it, was its
// caller's, set shorter than the HTTP client's time-out.
func cutByCaller(r *http.Request, began time.Time) bool {
	deadline, ok := r.Context().Deadline()
	return ok && deadline.Sub(began) < crashClientTimeout-time.Second
}

func (l *crashLog) note(path string, req []byte, res *http.Response, body []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		var env struct {
			Error struct {
				Code   string         `json:"code"`
				Detail map[string]any `json:"detail"`
			} `json:"error"`
		}
		_ = json.Unmarshal(body, &env)
		l.failures[fmt.Sprint(res.StatusCode, " ", env.Error.Code, " ", crashIDs.ReplaceAllString(path, "…"))]++
		if res.StatusCode >= 500 && !onlyRequestID(res.Header.Get("X-Request-Id"), env.Error.Code, env.Error.Detail) {
			l.leaky5xx = append(l.leaky5xx, fmt.Sprintf("%s: %d %s", path, res.StatusCode, body))
		}
		return
	}
	switch {
	case crashEnqueuePath.MatchString(path):
		var e ratchet.EnqueueResult
		if json.Unmarshal(body, &e) == nil {
			if l.enqueued[e.IdempotencyKey] == nil {
				l.enqueued[e.IdempotencyKey] = map[string]bool{}
			}
			l.enqueued[e.IdempotencyKey][e.JobID] = true
		}
	case path == "/api/v1/effects/begin":
		var b ratchet.BeginResponse
		if json.Unmarshal(body, &b) == nil && b.Decision == ratchet.DecisionExecute {
			l.executes[b.LeaseToken] = crashGrant{b.EffectID, b.Attempt}
		}
	case crashGateReportPath.MatchString(path):
		var q struct {
			LeaseToken string `json:"lease_token"`
			Outcome    string `json:"outcome"`
		}
		if json.Unmarshal(req, &q) == nil {
			l.gateReports[q.LeaseToken] = q.Outcome
		}
	case crashJobReportPath.MatchString(path):
		for _, a := range apitest.AcknowledgedJobReports(body) {
			l.jobReports[crashGrant{a.JobID, a.Attempt}] = true
		}
	}
}

// onlyRequestID says whether a 5xx's error carries nothing but its request
// id (the one in X-Request-Id) and, for database_unavailable, whether it
// may have been applied.
func onlyRequestID(header, code string, detail map[string]any) bool {
	if header == "" || detail["request_id"] != header {
		return false
	}
	for k := range detail {
		if k != "request_id" && !(k == "outcome" && code == "database_unavailable") {
			return false
		}
	}
	return code == "internal_error" || code == "database_unavailable"
}

// crashRuns records what ran outside: per idempotency key (a gate key, a
// job id) the attempts an action or handler started.
type crashRuns struct {
	mu  sync.Mutex
	ran map[string][]crashGrant
}

func (r *crashRuns) add(key string, g crashGrant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ran == nil {
		r.ran = map[string][]crashGrant{}
	}
	r.ran[key] = append(r.ran[key], g)
}

// crashOut is a job's input and output and an effect's result.
type crashOut struct {
	Key string `json:"key"`
}

const crashEffectType = "crash.charge"

// crashTrafficFor is how long new keys are handed out; the kills all fall
// within it.
const crashTrafficFor = 6 * time.Second

func TestCrashesLoseNothingAcknowledged(t *testing.T) {
	if os.Getenv("RATCHET_LOCAL_MAIN") == "1" {
		main()
		return
	}
	rng, seed := crashRNG(t)
	srv := startCrashServer(t, "TestCrashesLoseNothingAcknowledged")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("CRASH_SEED=%d; the servers' logs:\n%s", seed, srv.logs.String())
		}
	})
	began := time.Now()
	base := "http://" + srv.addr
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	seen := newCrashLog(&http.Transport{MaxIdleConnsPerHost: 32})
	set := setUpCrashTraffic(t, ctx, base, seen, "crash")
	c, run, operatorKey, wsID := set.clients, set.run, set.operatorKey, set.wsID
	stopWorkers := set.stopWorkers
	defer stopWorkers()

	stopNew := make(chan struct{})
	trafficDone := c.drive(stopNew)
	kills := killDuring(t, srv, rng)
	c.awaitADeath(t)
	close(stopNew)
	trafficDone()
	require.NoError(t, ctx.Err(), "the traffic finished: every call was answered")
	t.Logf("traffic done at %s", time.Since(began).Round(time.Millisecond))

	// Settle: the run ends once every job has (a lease a crash took lapses
	// and is claimed again); then the workers stop, and every gate lease
	// has lapsed or been reported and the sweeper has made it durable.
	_, err := c.producer.FinishRun(ctx, run.ID)
	require.NoError(t, err)
	waitRunEnded(t, ctx, c.producer, run.ID)
	stopWorkers()
	t.Logf("run finished at %s", time.Since(began).Round(time.Millisecond))
	// The checks read the API past the log, which they hold locked.
	reader, err := ratchet.NewClient(ratchet.Config{BaseURL: base, APIKey: operatorKey})
	require.NoError(t, err)
	check := &crashCheck{t: t, ctx: ctx, ws: wsID, db: connect(t, ctx), api: reader}
	check.settled()
	t.Logf("settled at %s", time.Since(began).Round(time.Millisecond))

	seen.mu.Lock()
	defer seen.mu.Unlock()
	t.Logf("%d kills; answers not 2xx: %v; calls made again after the SDK gave up: %d; gate keys blocked: %d",
		kills, seen.failures, c.gaveUp.Load(), c.blocked.Load())
	require.Positive(t, seen.failures["transport error"], "the crashes cut calls")
	require.Empty(t, seen.leaky5xx, "a 5xx carries nothing but its request id")
	check.jobs(run.ID, c.jobKeys.list, seen, &c.handled)
	check.gate(c.gateKeys.list, seen, &c.acted, &c.died)
	for _, line := range strings.Split(srv.logs.String(), "\n") {
		for _, bad := range []string{"panic", "DATA RACE", "level=ERROR"} {
			require.NotContains(t, line, bad, "a server logged what a crash of another must not cause")
		}
	}
}

// crashSetup is what a crash test's traffic starts with.
type crashSetup struct {
	operatorKey, wsID string
	operator          *ratchet.Client
	clients           *crashClients
	run               *ratchet.Run
	// stopWorkers and workersRunning are startCrashWorkers'.
	stopWorkers    func()
	workersRunning func() bool
}

// setUpCrashTraffic makes a workspace on the server at base, its policy
// for crashEffectType, an agent and a producer (crashClients), a run
// started under an idempotency key named for the test, and two workers
// (startCrashWorkers); every SDK client's calls go through transport.
func setUpCrashTraffic(t *testing.T, ctx context.Context, base string, transport http.RoundTripper,
	name string) *crashSetup {
	sdk := func(key string) *ratchet.Client {
		c, err := ratchet.NewClient(ratchet.Config{BaseURL: base, APIKey: key,
			HTTPClient: &http.Client{Transport: transport, Timeout: crashClientTimeout}})
		require.NoError(t, err)
		return c
	}
	set := &crashSetup{}
	set.operatorKey, set.wsID = crashSignup(t, base)
	set.operator = sdk(set.operatorKey)
	newKey := func(body map[string]any) string {
		var k struct {
			Secret string `json:"secret"`
		}
		require.NoError(t, set.operator.Request(ctx, "POST", "/keys", body, &k, ratchet.RequestOptions{}))
		return k.Secret
	}
	// The documented default, said outright: an attempt whose outcome is
	// unknown blocks its key until an operator resolves it.
	require.NoError(t, set.operator.Request(ctx, "PUT", "/policies/"+crashEffectType, map[string]any{
		"on_indeterminate": "block", "lease_seconds": 5, "max_attempts": 5}, nil, ratchet.RequestOptions{}))
	c := &crashClients{ctx: ctx, someDied: make(chan struct{}), agent: sdk(newKey(map[string]any{"name": "agent", "preset": "AGENT"})),
		producer: sdk(newKey(map[string]any{"name": "producer", "preset": "INGEST"}))}
	run, err := c.producer.StartRun(ctx, name, ratchet.WithIdempotencyKey(name+"-run"))
	require.NoError(t, err)
	c.runID = run.ID
	set.clients, set.run = c, run
	set.stopWorkers, set.workersRunning = startCrashWorkers(t, ctx,
		sdk(newKey(map[string]any{"name": "worker", "preset": "WORKER", "tools": []string{"crash_job@1"}})), &c.handled)
	return set
}

// crashRNG is the kill schedule's generator: seeded from the clock, or from
// CRASH_SEED to replay a run, the seed logged either way.
func crashRNG(t *testing.T) (*rand.Rand, uint64) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CRASH_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "CRASH_SEED")
	}
	t.Logf("CRASH_SEED=%d replays this test's kill schedule", seed)
	return rand.New(rand.NewPCG(seed, seed)), seed
}

// startCrashServer starts the first server on a free port over the
// package's database, sweeping every 100 ms and with a 1 s job lease grace,
// and ends the last one when the test does.
func startCrashServer(t *testing.T, run string) *crashServer {
	localEnv(t)
	port := freePort(t)
	t.Setenv("PORT", strconv.Itoa(port))
	t.Setenv("SWEEP_INTERVAL", "100ms")
	t.Setenv("JOB_LEASE_GRACE_MS", "1000") // a lease a crash took lapses within the test
	srv := &crashServer{t: t, run: run, addr: fmt.Sprint("127.0.0.1:", port), logs: &apitest.LockedBuffer{}}
	srv.start()
	t.Cleanup(func() {
		_ = srv.cmd.Process.Kill() // the last server; gone already if a start failed
		<-srv.exited
	})
	return srv
}

// killDuring SIGKILLs the server 3 to 5 times within crashTrafficFor, at
// moments drawn from rng, starting it again on the same port after each, a
// moment or two later; it returns how many kills there were.
func killDuring(t *testing.T, srv *crashServer, rng *rand.Rand) int {
	kills := 3 + rng.IntN(3)
	long := rng.IntN(kills)
	gap := crashTrafficFor / time.Duration(kills+1)
	for k := range kills {
		time.Sleep(gap/2 + time.Duration(rng.Int64N(int64(gap))))
		srv.kill()
		// Down for up to a second, and once for longer than the gate's
		// 2 s leases: the leases held then lapse, their keys' outcomes
		// unknown.
		down := time.Duration(rng.IntN(1000)) * time.Millisecond
		if k == long {
			down = 2500*time.Millisecond + time.Duration(rng.IntN(500))*time.Millisecond
		}
		killed := time.Now()
		time.Sleep(down)
		srv.start()
		t.Logf("kill %d of %d: server %d killed, down %s, back after %s", k+1, kills, srv.starts-1, down,
			time.Since(killed).Round(time.Millisecond))
	}
	time.Sleep(gap / 2)
	return kills
}

// startCrashWorkers starts two workers of crash_job@1 recording each
// handler run in handled: one whose reports an outage holds up past their
// leases may see the other claim those jobs again (at-least-once). stop
// stops them, requiring every report recorded; running says whether each
// is still working (none gave up).
func startCrashWorkers(t *testing.T, ctx context.Context, client *ratchet.Client, handled *crashRuns) (stop func(),
	running func() bool) {
	var workers []*ratchet.Worker
	for range 2 {
		w := ratchet.NewWorker(client)
		require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[crashOut, crashOut]{Name: "crash_job", Version: "1",
			Handler: func(ctx context.Context, in crashOut, job ratchet.JobContext) (crashOut, error) {
				handled.add(job.JobID, crashGrant{job.JobID, job.Attempt})
				time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
				return in, nil
			}}))
		require.NoError(t, w.Start(ctx, ratchet.StartOptions{Concurrency: 2, PollInterval: 50 * time.Millisecond,
			WaitSeconds: 1, OnError: func(error) {}}))
		workers = append(workers, w)
	}
	running = func() bool {
		for _, w := range workers {
			select {
			case <-w.Done():
				return false
			default:
			}
		}
		return true
	}
	stopped := false
	return func() {
		if stopped {
			return
		}
		stopped = true
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, w := range workers {
			require.NoError(t, w.Stop(sctx), "every report recorded")
		}
	}, running
}

// waitRunEnded reads the run until it ends, requiring it succeeded.
func waitRunEnded(t *testing.T, ctx context.Context, c *ratchet.Client, runID string) {
	for {
		r, err := c.GetRun(ctx, runID)
		require.NoError(t, err)
		if r.Status != ratchet.RunRunning {
			require.Equal(t, ratchet.RunSucceeded, r.Status, "every job ended well")
			return
		}
		require.NoError(t, ctx.Err(), "the run never finished: %+v", r)
		time.Sleep(100 * time.Millisecond)
	}
}

// crashClients are the test's producers and gate callers, and what they
// recorded.
type crashClients struct {
	ctx             context.Context
	agent, producer *ratchet.Client
	runID           string

	jobKeys, gateKeys crashKeys
	acted, handled    crashRuns // gate actions by key; job handler runs by job id
	died              sync.Map  // gate keys whose first caller died mid-action
	someDied          chan struct{}
	firstDeath        sync.Once // closes someDied
	blocked, gaveUp   atomic.Int64
}

// awaitADeath holds the traffic until some gate caller has died
// mid-action, so that the checks always meet a key whose outcome stayed
// unknown: each caller's eighth key dies, and on a loaded machine the
// crashes' schedule could end before any caller reached it (CI: none had,
// and the check that some key stayed unknown failed).
func (c *crashClients) awaitADeath(t *testing.T) {
	t.Helper()
	select {
	case <-c.someDied:
	case <-c.ctx.Done():
		t.Fatal("no gate caller died mid-action before the test's deadline")
	}
}

// drive hands out keys until stop closes: producers enqueue under stable
// keys (every third key twice at once) and gate callers do effects on new
// keys (every fourth by two callers at once, some slow). The returned wait
// returns once every key handed out was answered.
func (c *crashClients) drive(stop chan struct{}) (wait func()) {
	var traffic sync.WaitGroup
	for p := range 2 {
		traffic.Go(func() {
			c.jobKeys.hand(stop, fmt.Sprint("crash-job:", p), 3, func(key string, _ int) {
				c.enqueue(key)
				time.Sleep(20 * time.Millisecond) // a pace the workers keep up with
			})
		})
	}
	for g := range 6 {
		traffic.Go(func() {
			c.gateKeys.hand(stop, fmt.Sprint("crash:", g), 4, func(key string, i int) {
				c.doEffect(key, i%5 == 1, i%10 == 7) // never a key two callers do at once
			})
		})
	}
	return traffic.Wait
}

// doEffect does key's effect through DoEffect, made again as a client would
// when the SDK gives up, until it is answered: done, or blocked. A caller
// that dies mid-action (its action returns without a report, as a process
// that crashed would leave it) is started again on the same key: that
// key's outcome is unknown whatever the server's crashes hit.
func (c *crashClients) doEffect(key string, slow, dies bool) {
	for c.ctx.Err() == nil {
		// A short lease: a crash outlasts some, and their keys' outcomes
		// turn unknown (an action cut off before its report, a report
		// lost), which is what on_indeterminate block is about.
		_, err := ratchet.DoEffect(c.ctx, c.agent, ratchet.BeginRequest{EffectType: crashEffectType,
			IdempotencyKey: key, Payload: crashOut{Key: key}, CostMicros: ratchet.Micros(1000), LeaseSeconds: 2},
			func(actx context.Context, l ratchet.Lease) (crashOut, error) {
				c.acted.add(key, crashGrant{l.EffectID, l.Attempt})
				if dies {
					dies = false
					c.died.Store(key, true)
					c.firstDeath.Do(func() { close(c.someDied) })
					return crashOut{}, errors.New("the caller died mid-action")
				}
				took := time.Duration(rand.IntN(10)) * time.Millisecond
				if slow {
					took = 300 * time.Millisecond // more likely to span a crash
				}
				select {
				case <-time.After(took):
				case <-actx.Done():
					return crashOut{}, context.Cause(actx) // the lease was lost: report nothing
				}
				return crashOut{Key: key}, nil
			})
		if err == nil {
			return
		}
		if errors.Is(err, ratchet.ErrBlocked) {
			c.blocked.Add(1) // an attempt's outcome is unknown: an operator's to resolve
			return
		}
		c.gaveUp.Add(1)
		time.Sleep(100 * time.Millisecond)
	}
}

// enqueue enqueues key's job, made again as a client would when the SDK
// gives up, until it is answered.
func (c *crashClients) enqueue(key string) {
	for c.ctx.Err() == nil {
		_, err := c.producer.Enqueue(c.ctx, c.runID, crashOut{Key: key}, ratchet.EnqueueOptions{Name: "crash_job",
			Version: "1", IdempotencyKey: key, Timeout: 2 * time.Second, MaxAttempts: 10})
		if err == nil {
			return
		}
		c.gaveUp.Add(1)
		time.Sleep(100 * time.Millisecond)
	}
}

// crashKeys are the keys handed out to the traffic.
type crashKeys struct {
	mu   sync.Mutex
	list []string
}

// hand calls do with new keys under prefix, one after the other, until stop
// closes; every twice-th key is done by two callers at once.
func (k *crashKeys) hand(stop chan struct{}, prefix string, twice int, do func(key string, i int)) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		key := fmt.Sprint(prefix, ":", i)
		k.mu.Lock()
		k.list = append(k.list, key)
		k.mu.Unlock()
		if i%twice == 0 {
			var both sync.WaitGroup
			both.Go(func() { do(key, i) })
			do(key, i)
			both.Wait()
		} else {
			do(key, i)
		}
	}
}

// crashSignup makes the test's workspace and returns its operator key and id.
func crashSignup(t *testing.T, base string) (string, string) {
	res, err := http.Post(base+"/api/v1/workspaces", "application/json", strings.NewReader(`{"name":"crash"}`))
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	var signup struct {
		WorkspaceID string `json:"workspace_id"`
		Key         struct {
			Secret string `json:"secret"`
		} `json:"key"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&signup))
	return signup.Key.Secret, signup.WorkspaceID
}

func connect(t *testing.T, ctx context.Context) *pgx.Conn {
	conn, err := pgx.Connect(ctx, apitest.DatabaseURL(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// crashCheck reads what the last server left, from the database and the API.
type crashCheck struct {
	t   *testing.T
	ctx context.Context
	ws  string
	db  *pgx.Conn
	api *ratchet.Client
}

// settled waits until no gate attempt is open (each reported, or lapsed
// and made durable by the sweeper) and no job holds a lease or runs.
func (c *crashCheck) settled() {
	for {
		var open int
		require.NoError(c.t, c.db.QueryRow(c.ctx, `
SELECT (SELECT count(*) FROM effect_attempts WHERE workspace_id = $1 AND outcome IS NULL)
     + (SELECT count(*) FROM effects WHERE workspace_id = $1 AND state = 'leased')
     + (SELECT count(*) FROM jobs WHERE workspace_id = $1 AND status = 'RUNNING')
     + (SELECT count(*) FROM job_executions WHERE workspace_id = $1 AND outcome IS NULL)`, c.ws).Scan(&open))
		if open == 0 {
			return
		}
		require.NoError(c.t, c.ctx.Err(), "%d leases never settled", open)
		time.Sleep(100 * time.Millisecond)
	}
}

// jobs holds the durable jobs' promises: every acknowledged enqueue is one
// job that succeeded; a handler ran a job again only after an attempt whose
// lease a crash took; every acknowledged report is recorded.
func (c *crashCheck) jobs(runID string, keys []string, seen *crashLog, handled *crashRuns) {
	t := c.t
	type job struct{ id, status string }
	rows, err := c.db.Query(c.ctx, `SELECT idempotency_key, id, status FROM jobs WHERE run_id = $1`, runID)
	require.NoError(t, err)
	jobs := map[string]job{}
	for rows.Next() {
		var key string
		var j job
		require.NoError(t, rows.Scan(&key, &j.id, &j.status))
		_, twice := jobs[key]
		require.False(t, twice, "one job per key: %s", key)
		jobs[key] = j
	}
	require.NoError(t, rows.Err())
	for key, ids := range seen.enqueued {
		j, ok := jobs[key]
		require.True(t, ok, "the acknowledged enqueue %s has its job", key)
		require.Equal(t, map[string]bool{j.id: true}, ids, "every answer for %s names its one job", key)
		require.Equal(t, "SUCCEEDED", j.status, key)
	}
	for _, key := range keys {
		require.NotEmpty(t, seen.enqueued[key], "every enqueue was acknowledged in the end: %s", key)
	}
	require.Equal(t, len(keys), len(jobs), "a job for every key enqueued, and no other")

	type execution struct {
		outcome, warning *string
	}
	xrows, err := c.db.Query(c.ctx, `SELECT x.job_id, x.attempt, x.outcome, x.warning FROM job_executions x
JOIN jobs j ON j.id = x.job_id WHERE j.run_id = $1`, runID)
	require.NoError(t, err)
	execs := map[crashGrant]execution{}
	for xrows.Next() {
		var g crashGrant
		var x execution
		require.NoError(t, xrows.Scan(&g.id, &g.attempt, &x.outcome, &x.warning))
		execs[g] = x
	}
	require.NoError(t, xrows.Err())
	for g := range seen.jobReports {
		x, ok := execs[g]
		require.True(t, ok, "the acknowledged report of %+v is recorded", g)
		require.Equal(t, "SUCCEEDED", deref(x.outcome), "the acknowledged report of %+v is recorded", g)
	}
	again := 0
	for _, key := range keys {
		j := jobs[key]
		succeeded := 0
		for g, x := range execs {
			if g.id != j.id {
				continue
			}
			if deref(x.outcome) == "SUCCEEDED" {
				succeeded++
			} else {
				require.NotNil(t, x.warning, "%s attempt %d failed only by a lapsed lease", key, g.attempt)
			}
		}
		require.Equal(t, 1, succeeded, "one successful attempt of %s", key)
		runs := handled.ran[j.id]
		require.NotEmpty(t, runs, "%s was worked", key)
		attempts := map[int]bool{}
		for i, g := range runs {
			require.False(t, attempts[g.attempt], "%s attempt %d was handed to a handler twice", key, g.attempt)
			attempts[g.attempt] = true
			x, ok := execs[g]
			require.True(t, ok, "%s ran attempt %d, which is recorded", key, g.attempt)
			if i < len(runs)-1 || deref(x.outcome) != "SUCCEEDED" {
				// At-least-once: a handler runs again only after an
				// attempt whose lease lapsed unreported (its report lost
				// to a crash), recorded failed with the side-effect warning.
				require.NotNil(t, x.warning, "%s ran again after attempt %d, whose lease was not lost", key, g.attempt)
			}
		}
		again += len(runs) - 1
	}
	t.Logf("jobs: %d keys, %d acknowledged reports, %d handler runs again after a lease lost to a crash",
		len(keys), len(seen.jobReports), again)
}

// gate holds the gate's promises under on_indeterminate block (README "The
// effect gate"): one effect per key; a key is granted execute again only
// after a failed report or an operator's resolve, and this test makes
// neither, so each key has one attempt and its action ran at most once (a
// grant whose answer a crash lost is never acted on, and the key then
// stays blocked); every acknowledged report is recorded with its outcome;
// a key succeeded only if its action ran.
func (c *crashCheck) gate(keys []string, seen *crashLog, acted *crashRuns, died *sync.Map) {
	t := c.t
	type attempt struct {
		effectID, state string
		attempt         int
		outcome         *string
	}
	rows, err := c.db.Query(c.ctx, `SELECT e.idempotency_key, e.id, e.state, a.attempt, a.outcome
FROM effects e JOIN effect_attempts a ON a.effect_id = e.id
WHERE e.workspace_id = $1 AND e.effect_type = $2 ORDER BY a.attempt`, c.ws, crashEffectType)
	require.NoError(t, err)
	byKey := map[string][]attempt{}
	for rows.Next() {
		var key string
		var a attempt
		require.NoError(t, rows.Scan(&key, &a.effectID, &a.state, &a.attempt, &a.outcome))
		byKey[key] = append(byKey[key], a)
	}
	require.NoError(t, rows.Err())
	require.Len(t, byKey, len(keys), "an effect for every key begun, and no other")
	byGrant := map[crashGrant]attempt{}
	unacted, unknown := 0, 0
	for _, key := range keys {
		attempts := byKey[key]
		if len(attempts) != 1 {
			var seen []string
			for _, a := range attempts {
				seen = append(seen, fmt.Sprintf("attempt %d %s", a.attempt, deref(a.outcome)))
			}
			t.Fatalf("%s was granted execute again while an attempt's outcome was unknown: %s", key,
				strings.Join(seen, ", "))
		}
		a := attempts[0]
		byGrant[crashGrant{a.effectID, a.attempt}] = a
		ran := acted.ran[key]
		require.LessOrEqual(t, len(ran), 1, "the action of %s ran twice: %+v", key, ran)
		if len(ran) == 1 {
			require.Equal(t, crashGrant{a.effectID, a.attempt}, ran[0], "%s acted on the attempt recorded", key)
		} else {
			unacted++
			require.NotEqual(t, "succeeded", a.state, "%s succeeded though its action never ran", key)
		}
		if _, ok := died.Load(key); ok {
			unknown++
			require.Equal(t, "indeterminate", a.state, "%s, whose caller died mid-action, stays unknown", key)
		}
		switch deref(a.outcome) {
		case "succeeded":
			require.Equal(t, "succeeded", a.state, key)
			e, err := c.api.GetEffect(c.ctx, a.effectID)
			require.NoError(t, err)
			require.JSONEq(t, fmt.Sprintf(`{"key":%q}`, key), string(e.Result), "the recorded result of %s", key)
		case "indeterminate":
			require.Equal(t, "indeterminate", a.state, key)
		default:
			t.Fatalf("%s attempt %d ended %s: only a report or a lapse ends an attempt here", key, a.attempt,
				deref(a.outcome))
		}
	}
	for token, g := range seen.executes {
		_, ok := byGrant[g]
		require.True(t, ok, "the execute answered for %+v is recorded", g)
		if outcome, reported := seen.gateReports[token]; reported {
			require.Equal(t, outcome, deref(byGrant[g].outcome), "the acknowledged report of %+v is recorded", g)
		}
	}
	require.Positive(t, unknown, "some keys' outcomes were unknown, and stayed blocked")
	t.Logf("gate: %d keys, %d acknowledged reports, %d grants never acted on (their answers lost to a crash), "+
		"%d keys whose caller died mid-action", len(keys), len(seen.gateReports), unacted, unknown)
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ratchet "github.com/getratchet/ratchet/sdk/go"
)

// A batch of reports whose successes' outputs the server's one check budget
// cannot cover together is refused whole (400 invalid_request at reports,
// nothing recorded: lib/jobs outputChecks), and every worker SDK must send
// it again report by report, each then checked from the whole budget, so
// that no outcome is lost and no job runs twice. Each SDK's worker runs
// against the real service behind budgetProxy, which holds report requests
// until released so that two costly successes' reports queue up and go as
// one batch.

// costlyOutputSchema is an array whose items cost 4 991 evaluations each
// (lib/jobs costlyOutputs), its anyOf's first branch accepting every
// item, so the check itself is quick.
func costlyOutputSchema() json.RawMessage {
	branches := []string{"{}"}
	for i := 1; i < 4_990; i++ {
		branches = append(branches, `{"type":"string","minLength":`+strconv.Itoa(i)+`}`)
	}
	return json.RawMessage(`{"type":"array","items":{"anyOf":[` + strings.Join(branches, ",") + `]}}`)
}

// costlyItems is the length of a costly output: about 800 000 evaluations,
// more than half the budget, so two in one batch are over it.
const costlyItems = 160

// budgetProxy forwards to the service, holding each report request (single
// or batch) until released, and records what the report routes answered.
// /__state tells a script how many are held and recorded; /__release
// releases them.
type budgetProxy struct {
	forward  *httputil.ReverseProxy
	release  chan struct{}
	once     sync.Once
	held     atomic.Int32
	claims   atomic.Int32
	recorded atomic.Int32 // reports the service recorded (200)
	mu       sync.Mutex
	answers  []budgetAnswer
}

type budgetAnswer struct {
	path    string
	status  int
	reports int    // a batch's reports
	body    string // a refusal's
}

func newBudgetProxy(t *testing.T, target string) *httptest.Server {
	u, err := url.Parse(target)
	require.NoError(t, err)
	p := &budgetProxy{forward: httputil.NewSingleHostReverseProxy(u), release: make(chan struct{})}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	t.Cleanup(p.releaseAll)
	budgetProxies.Store(srv.URL, p)
	return srv
}

var budgetProxies sync.Map // URL → *budgetProxy

func proxyOf(srv *httptest.Server) *budgetProxy {
	p, _ := budgetProxies.Load(srv.URL)
	return p.(*budgetProxy)
}

func (p *budgetProxy) releaseAll() { p.once.Do(func() { close(p.release) }) }

func (p *budgetProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/__state":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int32{"held": p.held.Load(), "recorded": p.recorded.Load()})
		return
	case "/__release":
		p.releaseAll()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/claim") {
		p.claims.Add(1)
	}
	if !strings.HasPrefix(r.URL.Path, "/api/v1/jobs/") || !strings.HasSuffix(r.URL.Path, "/report") {
		p.forward.ServeHTTP(w, r)
		return
	}
	sent, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(sent))
	select {
	case <-p.release:
	default:
		p.held.Add(1)
		select {
		case <-p.release:
		case <-r.Context().Done():
			return
		}
	}
	rec := httptest.NewRecorder()
	p.forward.ServeHTTP(rec, r)
	a := budgetAnswer{path: r.URL.Path, status: rec.Code}
	batch := r.URL.Path == "/api/v1/jobs/report"
	if batch {
		var body struct{ Reports []json.RawMessage }
		_ = json.Unmarshal(sent, &body)
		a.reports = len(body.Reports)
	}
	switch {
	case rec.Code == http.StatusOK && batch:
		var answer struct{ Results []struct{ Error any } }
		_ = json.Unmarshal(rec.Body.Bytes(), &answer)
		for _, x := range answer.Results {
			if x.Error == nil {
				p.recorded.Add(1)
			}
		}
	case rec.Code == http.StatusOK:
		p.recorded.Add(1)
	default:
		a.body = rec.Body.String()
	}
	p.mu.Lock()
	p.answers = append(p.answers, a)
	p.mu.Unlock()
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// waitFor polls cond (the proxy's or a handler's state) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("timed out waiting for %s", what)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// budgetScenario publishes tool@1's costly contract, enqueues n jobs of
// it, and answers the run's id.
func budgetScenario(t *testing.T, b *bundle, tool string, n int) string {
	t.Helper()
	ctx := context.Background()
	_, err := b.operator.PublishContract(ctx, tool, ratchet.ContractSpec{HandlerVersion: "1",
		InputSchema: json.RawMessage(`{}`), OutputSchema: costlyOutputSchema()})
	require.NoError(t, err)
	run, err := b.producer.StartRun(ctx, "budget-"+tool)
	require.NoError(t, err)
	for i := range n {
		_, err := b.producer.Enqueue(ctx, run.ID, map[string]int{"i": i}, ratchet.EnqueueOptions{Name: tool, Version: "1",
			MaxAttempts: 3})
		require.NoError(t, err)
	}
	return run.ID
}

// requireFellBack checks that a batch of at least two reports was refused
// whole at reports, and that every one of the run's n steps succeeded on
// its first attempt (nothing lost, nothing run twice).
func requireFellBack(t *testing.T, b *bundle, p *budgetProxy, runID string, n int) {
	t.Helper()
	ctx := context.Background()
	var run *ratchet.Run
	waitFor(t, "every step to settle", func() bool {
		var err error
		run, err = b.producer.GetRun(ctx, runID)
		require.NoError(t, err)
		for _, s := range run.Steps {
			if s.Status == ratchet.JobQueued || s.Status == ratchet.JobRunning {
				return false
			}
		}
		return len(run.Steps) == n
	})
	p.mu.Lock()
	answers := append([]budgetAnswer(nil), p.answers...)
	p.mu.Unlock()
	var log []string
	refusedWhole := 0
	for _, a := range answers {
		log = append(log, fmt.Sprintf("%s %d (%d reports) %s", a.path, a.status, a.reports, a.body))
		if a.path == "/api/v1/jobs/report" && a.status == http.StatusBadRequest && a.reports >= 2 &&
			strings.Contains(a.body, `"invalid_request"`) && strings.Contains(a.body, `"field":"reports"`) {
			refusedWhole++
		}
	}
	t.Logf("report answers:\n%s", strings.Join(log, "\n"))
	require.Positive(t, refusedWhole, "no batch was refused whole: the scenario did not test the fallback")
	for _, s := range run.Steps {
		require.Equal(t, ratchet.JobSucceeded, s.Status, "step %s", s.ID)
		require.Equal(t, 1, s.DurableJob.Attempt, "step %s ran again", s.ID)
	}
}

func TestEachWorkerSendsABatchRefusedWholeReportByReport(t *testing.T) {
	t.Parallel()
	t.Run("go", func(t *testing.T) {
		t.Parallel()
		// The Go reporter keeps three deliveries in flight and gathers for
		// 10 ms, neither settable from here: three fillers' reports are
		// held (the three in flight), then the first of three costly
		// reports gathers what comes within its 10 ms and waits for a slot,
		// the others queueing behind it, and they go once released: split
		// anywhere, two of the three costly reports share a batch.
		b := setup(t)
		const tool, n = "budget_go", 6
		runID := budgetScenario(t, b, tool, n)
		proxy := newBudgetProxy(t, b.env.Server.URL)
		p := proxyOf(proxy)
		c, err := ratchet.NewClient(ratchet.Config{BaseURL: proxy.URL, APIKey: b.workerKey(t, tool+"@1")})
		require.NoError(t, err)
		w := ratchet.NewWorker(c)
		var calls, claimsAfterLast atomic.Int32
		claimsAfterLast.Store(-1)
		require.NoError(t, ratchet.RegisterTool(w, ratchet.Tool[json.RawMessage, any]{Name: tool, Version: "1",
			Handler: func(context.Context, json.RawMessage, ratchet.JobContext) (any, error) {
				switch k := calls.Add(1); {
				case k <= 3:
					waitFor(t, "the fillers' reports to be held", func() bool { return p.held.Load() >= k-1 })
					return []int{}, nil
				case k == 4:
					waitFor(t, "three reports to be held", func() bool { return p.held.Load() >= 3 })
				case k == n:
					claimsAfterLast.Store(p.claims.Load())
				}
				return make([]int, costlyItems), nil
			}}))
		e := &errs{}
		ctx := context.Background()
		require.NoError(t, w.Start(ctx, ratchet.StartOptions{Concurrency: 1, PollInterval: 50 * time.Millisecond, OnError: e.add}))
		// A claim after the last handler returned: its slot was freed, so its
		// report is queued.
		waitFor(t, "the last report to be queued", func() bool {
			last := claimsAfterLast.Load()
			return last >= 0 && p.claims.Load() > last
		})
		p.releaseAll()
		requireFellBack(t, b, p, runID, n)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(sctx))
		require.Empty(t, e.reportErrors())
	})
	script := func(t *testing.T, dir, name string, args ...string) {
		b := setup(t)
		tool := "budget_" + filepath.Ext(args[len(args)-1])[1:]
		const n = 3
		runID := budgetScenario(t, b, tool, n)
		proxy := newBudgetProxy(t, b.env.Server.URL)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "BUDGET_BASE_URL="+proxy.URL, "BUDGET_KEY="+b.workerKey(t, tool+"@1"),
			"BUDGET_TOOL="+tool, "BUDGET_JOBS="+strconv.Itoa(n), "BUDGET_ITEMS="+strconv.Itoa(costlyItems),
			"PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		t.Logf("%s printed:\n%s", name, out)
		require.NoError(t, err)
		requireFellBack(t, b, proxyOf(proxy), runID, n)
		require.NotContains(t, string(out), "not recorded")
	}
	t.Run("python", func(t *testing.T) {
		t.Parallel()
		s, err := filepath.Abs("testdata/budget_worker.py")
		require.NoError(t, err)
		script(t, pythonSDK, pythonInterpreter(t), s)
	})
	t.Run("typescript", func(t *testing.T) {
		t.Parallel()
		script(t, ".", nodeInterpreter(t), "testdata/budget_worker.mjs")
	})
}

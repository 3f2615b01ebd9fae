package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// The durable jobs' state machine checked against a model (as lib/gate's
// model_test.go checks the effect gate's): from a seed, a random sequence
// of enqueues (a new step, one waiting for another, the same step again:
// deduplicated, or the same key with another operation:
// idempotency_key_reuse; after the run's finish, only the repeat is
// answered), claims by workers each serving its own exact name@version set
// (with a claimId or not, and sent again under the last one, as when its
// answer was lost), heartbeats and reports (by the single route or in a
// batch) with the current lease token, a superseded one or none of the
// job's (successes with an output, failures retryable or not, with or
// without a retryAfterMs floor), cancels, replays, finishes, endpoint
// pauses and resumes, clock moves (to and past a lease's end, past a
// retry's due time, past the sweeper's requeue delay), sweeps and reads (a
// run, a step, the list of runs), over two runs of a dozen steps of three
// handlers on two endpoints (one CUSTOM policy without jitter, one STANDARD
// with its 20 %, the jitter's draw fixed per seed), and among them the
// operations of model_gates_test.go: endpoint policy PUTs setting
// maxConcurrent, rateLimitPerMinute and the circuit breaker (whose room
// decides each claim's grants, and a requeued job's revival), circuit
// closes and endpoint reads; mdl_charge's contracts (its outputs checked,
// enqueues its contracts refuse, replays onto another handler version,
// whose jobs only that version's worker claims and only a key listing it
// heartbeats and reports); and a second WORKER key, rate limited, revoked
// and minted again (its claims past its limit 429; a revoked key's claims,
// heartbeats and reports 401, changing nothing). Every answer is
// compared with what a plain Go model of API.md §3 and §5 and README
// "Durable jobs" predicts: the status code and error code (and lease_lost's
// and invalid_state's detail), a step's and its job's status, attempt,
// maxAttempts, dueAt (of a job waiting for it), leaseExpiresAt, output,
// each attempt's outcome, retryable, retryAfterMs, warning and reportedAt,
// a claim's jobs (the longest due first) and leases, a heartbeat's lease
// and cancelRequested, a report's status and nextDueAt (per the job's
// retry policy snapshot), and the runs' statuses. A failure names the seed
// and the trace; MODEL_SEED, MODEL_SEEDS and MODEL_OPS work as for
// lib/gate's (apitest.ModelRuns).
//
// Not parallel, nor are its seeds: a sweep (one of the operations) acts on
// every workspace at its own clock, and one at a clock past another
// test's leases would lapse them.
func TestJobsModelSequential(t *testing.T) {
	apitest.ModelRuns(t, 8, 100, runJobsModel)
	var model []string
	for k, v := range jmCovered.n {
		if strings.HasPrefix(k, "model: ") {
			model = append(model, fmt.Sprintf("%s: %d", k, v))
		}
	}
	slices.Sort(model)
	t.Logf("the model's branches taken, all seeds:\n  %s", strings.Join(model, "\n  "))
}

// jmTool is a handler: a tool's exact name@version.
type jmTool struct{ name, version string }

func (tl jmTool) ref() string { return tl.name + "@" + tl.version }

var jmTools = []jmTool{{"mdl_send", "1"}, {"mdl_send", "2"}, {"mdl_charge", "1"}}

// jmWorkers are the handler sets the workers register (indexes of jmTools).
var jmWorkers = [][]int{{0}, {1, 2}, {0, 1, 2}}

// jmPolicy is an endpoint's retry policy and default timeout, as the model
// knows it (README "Retries").
type jmPolicy struct {
	maxAttempts int
	initialMs   int64
	multiplier  float64
	maxDelayMs  int64
	jitterPct   float64
	timeoutMs   int64
}

// The endpoints (named by the tools: enqueue's default) and their policies.
var jmEndpoints = map[string]struct {
	pol  jmPolicy
	body map[string]any
}{
	"mdl_send": {jmPolicy{3, 2000, 2, 5000, 0, 5000}, map[string]any{"name": "mdl_send", "preset": "CUSTOM",
		"maxAttempts": 3, "initialDelayMs": 2000, "multiplier": 2, "maxDelayMs": 5000, "jitterPercent": 0,
		"defaultTimeoutMs": 5000}},
	// STANDARD: 5 attempts, 30 s doubling, cap 15 min, ±20 %.
	"mdl_charge": {jmPolicy{5, 30_000, 2, 900_000, 20, 20_000}, map[string]any{"name": "mdl_charge",
		"preset": "STANDARD", "defaultTimeoutMs": 20_000}},
}

// jmSpec is a step of the sequence: its run, tool, whether the producer
// names its key, and the enqueue's overrides (0: none).
type jmSpec struct {
	run, tool   int
	keyed       bool
	timeoutMs   int64
	maxAttempts int
	delayMs     int64
	// after is the step this one waits for (1 + its index; 0 for none),
	// afterStatus how it must end for this one to run.
	after       int
	afterStatus string
}

var jmSpecs = []jmSpec{
	{run: 0, tool: 0, keyed: true},
	{run: 0, tool: 0, maxAttempts: 2},
	{run: 0, tool: 1, keyed: true, timeoutMs: 3000},
	{run: 0, tool: 2, keyed: true},
	{run: 1, tool: 0, keyed: true, maxAttempts: 1},
	{run: 1, tool: 2, maxAttempts: 3},
	{run: 1, tool: 1, keyed: true, delayMs: 4000},
	{run: 1, tool: 0, keyed: true, maxAttempts: 4},
	{run: 0, tool: 2, keyed: true, after: 1, afterStatus: "SUCCEEDED"},
	{run: 0, tool: 0, keyed: true, after: 1, afterStatus: "FAILED"},
	{run: 0, tool: 1, after: 9, afterStatus: "SUCCEEDED"}, // below the one before: a chain
	{run: 1, tool: 0, keyed: true, after: 5, afterStatus: "FAILED", maxAttempts: 2},
}

const jmGrace = 10 * time.Second // apitest.Config's JobLeaseGraceMs

// jmAttempt is one claim of a job.
type jmAttempt struct {
	token    string
	started  time.Time
	exp      time.Time
	outcome  string // "" while open; SUCCEEDED | FAILED
	lapsed   bool   // failed as lapsed (the lapse warning), not reported
	refused  bool   // a success whose output the contract refused (its warning)
	late     bool   // reported after it lapsed and was failed or requeued (a warning)
	reported bool
	sent     string // the status its worker reported
	// retryable and retryAfter as recorded for a reported failure.
	retryable  *bool
	retryAfter *int64
	answer     jmReport // the report's answer, which a repeat gets again
}

// jmReport is a report's answer.
type jmReport struct {
	status string
	next   *time.Time
}

// jmStep is the model's view of one step and its job.
type jmStep struct {
	spec    jmSpec
	i       int
	run     *jmRun
	exists  bool
	stepID  string
	jobID   string
	key     string
	status  string
	attempt int
	max     int
	due     time.Time
	lease   time.Duration
	pol     jmPolicy
	atts    []*jmAttempt
	// held is the cancelled attempt that may still run (it neither
	// reported nor was failed as lapsed since its cancel), 0 for none: a
	// replay's claim waits for it.
	held int
	// requeued: the sweeper queued the job again after its lease lapsed
	// (its token cleared); replayed: a replay queued it (token cleared):
	// both until the next claim.
	requeued, replayed bool
	output             string // the last success's output (canonical JSON), "" for none
	// upgraded is the handler version a replay onto another contract
	// made the job's, "" for none.
	upgraded string
}

type jmRun struct {
	i         int
	id        string
	status    string
	requested bool
	steps     []*jmStep
}

type jobsModel struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	env  *apitest.Env
	ws   apitest.Workspace
	// keys are the WORKER keys (the second one revocable), workers the
	// registered workers' ids and workerKey the key each registered under.
	keys      []jmKey
	workers   []string
	workerKey []int
	clock     *apitest.Clock
	jitter    float64
	runs      []*jmRun
	steps     []*jmStep
	last      *jmStep
	trace     *apitest.ModelTrace
	outputs   int
	seen      map[string]int
	ops       int
	// lastClaim is each worker's last claimId, claimed what each claimId
	// leased.
	lastClaim map[int]string
	claimed   map[string][]jmLeased
	// gates are the endpoints by name (model_gates_test.go).
	gates map[string]*jmGate
}

func runJobsModel(t *testing.T, seed uint64, ops int) {
	m := newJobsModel(t, seed, ops)
	for i := 0; i < ops && !t.Failed(); i++ {
		m.step()
	}
	for _, r := range m.runs {
		if !t.Failed() {
			m.readRun(r)
		}
	}
	if !t.Failed() {
		checkEventLedger(t, m.env, m.ws.ID)
	}
	t.Logf("covered: %v", m.seen)
	jmCovered.add(m.seen)
}

// jmCovered adds up what every seed covered, for -v.
var jmCovered = &jmCoverage{n: map[string]int{}}

type jmCoverage struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *jmCoverage) add(seen map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range seen {
		c.n[k] += v
	}
}

func newJobsModel(t *testing.T, seed uint64, ops int) *jobsModel {
	clock := apitest.NewClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	env := apitest.Start(t, apitest.WithNow(clock.Now))
	rng := rand.New(rand.NewPCG(seed, 0x6a6f6273))
	m := &jobsModel{t: t, seed: seed, rng: rng, env: env, ws: env.Signup(), clock: clock, seen: map[string]int{},
		ops: ops, jitter: []float64{0, 0.5, 0.999}[rng.IntN(3)], lastClaim: map[int]string{},
		claimed: map[string][]jmLeased{},
		trace:   apitest.NewModelTrace(t, fmt.Sprintf("MODEL_SEED=%d MODEL_OPS=%d go test -run 'TestJobsModelSequential' ./lib/jobs", seed, ops))}
	jobs.SetJitter(env.App.Server.Jobs, m.jitter)
	jmContracts(env, m.ws)
	worker, workers, endpoints := jmWorkspace(env, m.ws)
	m.gates = jmGates(env, m.ws, endpoints)
	second, workerB := jmSecondKey(env, m.ws, jmKeyRate)
	second.counted(m.now()) // its worker's registration
	m.keys, m.workers = []jmKey{{secret: worker, tools: jmTools}, second}, append(workers, workerB)
	m.workerKey = append(make([]int, len(workers)), 1)
	for i := range 2 {
		r := env.Must(http.StatusCreated, "POST", "/api/v1/runs", m.ws.Key, map[string]any{"name": fmt.Sprintf("model %d", i)})
		m.runs = append(m.runs, &jmRun{i: i, id: r.JSON()["id"].(string), status: jobs.RunRunning})
	}
	for i, spec := range jmSpecs {
		s := &jmStep{spec: spec, i: i, run: m.runs[spec.run]}
		if spec.keyed {
			s.key = fmt.Sprintf("mdl-%d-%d", seed, i)
		}
		m.steps = append(m.steps, s)
	}
	return m
}

// jmWorkspace sets the workspace up for the model: a WORKER key for every
// tool (its secret), a worker registered for each of jmWorkers' sets (their
// ids), and the endpoints with their policies.
func jmWorkspace(env *apitest.Env, ws apitest.Workspace) (string, []string, map[string]string) {
	var refs []string
	for _, tl := range jmTools {
		refs = append(refs, tl.ref())
	}
	secret := env.Key(ws, map[string]any{"name": "worker", "preset": "WORKER", "tools": refs})
	var workers []string
	for _, set := range jmWorkers {
		var tools []map[string]any
		for _, i := range set {
			tools = append(tools, map[string]any{"name": jmTools[i].name, "version": jmTools[i].version})
		}
		r := env.Must(http.StatusCreated, "POST", "/api/v1/workers/register", secret, map[string]any{"tools": tools})
		workers = append(workers, r.JSON()["workerId"].(string))
	}
	endpoints := map[string]string{}
	for _, name := range []string{"mdl_send", "mdl_charge"} {
		r := env.Must(http.StatusCreated, "POST", "/api/v1/endpoints", ws.Key, jmEndpoints[name].body)
		endpoints[name] = r.JSON()["id"].(string)
	}
	return secret, workers, endpoints
}

// fail reports a mismatch with the seed and the trace so far.
func (m *jobsModel) fail(format string, args ...any) {
	m.t.Helper()
	m.trace.Fail(format, args...)
}

func (m *jobsModel) log(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	m.trace.Add(m.now().Format("15:04:05 ") + line)
	if op, answer, ok := strings.Cut(line, " -> "); ok {
		op, _, _ = strings.Cut(op, " ")
		answer, _, _ = strings.Cut(answer, " [")
		m.seen[op+" "+strings.TrimSpace(answer)]++
	}
}

func (m *jobsModel) now() time.Time { return m.clock.Now() }

func (s *jmStep) name() string { return fmt.Sprintf("step %d (%s)", s.i, s.handler().ref()) }

// handler is the name@version the step's job runs as: its enqueue's, or
// the one a replay onto another contract made it (model_gates_test.go).
func (s *jmStep) handler() jmTool {
	if s.upgraded != "" {
		return jmTool{jmTools[s.spec.tool].name, s.upgraded}
	}
	return jmTools[s.spec.tool]
}

func (s *jmStep) latest() *jmAttempt {
	if len(s.atts) == 0 {
		return nil
	}
	return s.atts[len(s.atts)-1]
}

// cancelledOpen says whether a, the job's latest attempt, is a cancelled
// attempt that may still run: its job cancelled, or replayed while it ran
// (cancelled again since or not), and the attempt neither reported nor,
// under a replay, failed as lapsed (README: its heartbeat answers
// cancelRequested, its report is recorded on the attempt).
func (s *jmStep) cancelledOpen(a *jmAttempt) bool {
	if a.reported || s.status != jobs.StatusCancelled && !(s.status == jobs.StatusQueued && s.replayed) {
		return false
	}
	return s.current() || s.requeued || a.outcome == ""
}

// current says whether the job's latest attempt's token is the job's: a
// requeue and a replay clear it.
func (s *jmStep) current() bool { return !s.requeued && !s.replayed }

func (m *jobsModel) step() {
	s := m.last
	if s == nil || m.rng.IntN(2) == 0 {
		s = m.steps[m.rng.IntN(len(m.steps))]
		if !s.exists && s.run.requested && m.rng.IntN(4) != 0 {
			s = m.steps[m.rng.IntN(len(m.steps))] // its enqueue is refused: more often another step
		}
	}
	m.last = s
	switch r := m.rng.IntN(112); {
	case r >= 100:
		m.gateStep(s) // model_gates_test.go
	case s.requeued && s.status == jobs.StatusQueued && r < 40:
		// The worker of a requeued job's lapsed lease, still at work: its
		// heartbeat takes the job back, or its report lands (README).
		if r < 25 {
			m.heartbeat(s)
		} else {
			m.report(s)
		}
	case r < 14 || !s.exists:
		m.enqueue(s, s.exists && m.rng.IntN(6) == 0)
	case r < 30:
		m.claim(m.rng.IntN(len(m.workers)), []int{1, 1, 10}[m.rng.IntN(3)])
	case r < 46:
		m.report(s)
	case r < 54:
		m.heartbeat(s)
	case r < 66:
		m.moveClock(s)
	case r < 70:
		m.sweep()
	case r < 75:
		m.cancel(s)
	case r < 80:
		m.replay(s)
	case r < 82:
		m.finish(s.run)
	case r < 84:
		m.pause(jmTools[s.spec.tool].name)
	case r < 88:
		m.readStep(s)
	case r < 94:
		m.readRun(s.run)
	default:
		m.listRuns()
	}
}

// moveClock moves the clock to, or past, a time that matters to the step:
// its lease's end, its due time, the sweeper's requeue delay; or a little.
func (m *jobsModel) moveClock(s *jmStep) {
	now := m.now()
	var to time.Time
	switch m.rng.IntN(5) {
	case 0:
		if a := s.latest(); a != nil {
			to = a.exp
		}
	case 1:
		if s.exists {
			to = s.due
		}
	case 2:
		if a := s.latest(); a != nil {
			to = a.exp.Add(jobs.RequeueLapsedAfter)
		}
	case 3:
		to = now.Add(time.Duration(1+m.rng.IntN(20)) * time.Second)
	}
	d := to.Sub(now)
	if d <= 0 {
		d = time.Duration(1+m.rng.IntN(3)) * time.Second
	}
	if m.rng.IntN(3) == 0 {
		d += time.Second // past it
	}
	m.clock.Add(d)
	m.log("clock +%s", d)
}

// --- enqueue

func (m *jobsModel) enqueueBody(s *jmStep, other bool) map[string]any {
	tl := jmTools[s.spec.tool]
	b := map[string]any{"name": tl.name, "version": tl.version, "input": map[string]any{"step": s.i, "seed": m.seed}}
	if s.key != "" {
		b["idempotencyKey"] = s.key
	}
	if s.spec.timeoutMs > 0 {
		b["timeoutMs"] = s.spec.timeoutMs
	}
	if s.spec.maxAttempts > 0 {
		b["maxAttempts"] = s.spec.maxAttempts
	}
	if s.spec.delayMs > 0 {
		b["delayMs"] = s.spec.delayMs
	}
	if d := m.dep(s); d != nil {
		b["afterStepId"], b["afterStatus"] = d.stepID, s.spec.afterStatus
	}
	if other {
		// Another operation under the key: another input under the key the
		// producer named; under a generated one (which the input makes),
		// other settings (README: maxAttempts is not part of it).
		if s.key != "" {
			b["input"] = map[string]any{"step": s.i, "other": true}
		} else {
			b["maxAttempts"] = 5
		}
	}
	return b
}

// dep is the step s waits for, nil for none.
func (m *jobsModel) dep(s *jmStep) *jmStep {
	if s.spec.after == 0 {
		return nil
	}
	return m.steps[s.spec.after-1]
}

func (m *jobsModel) enqueue(s *jmStep, other bool) {
	if d := m.dep(s); d != nil && !d.exists {
		m.enqueue(d, false) // a step names its dependency by its id
		return
	}
	now := m.now()
	status, code := http.StatusCreated, ""
	switch {
	case s.exists && other:
		status, code = http.StatusConflict, "idempotency_key_reuse"
	case s.exists:
		status = http.StatusOK
	case s.run.requested:
		status, code = http.StatusConflict, "invalid_state"
	}
	r := m.env.Do("POST", "/api/v1/runs/"+s.run.id+"/steps", m.ws.Key, m.enqueueBody(s, other))
	var got struct {
		StepID, JobID, IdempotencyKey, Status string
		DueAt                                 *time.Time
		Deduplicated                          bool
	}
	_ = json.Unmarshal(r.Body, &got)
	m.log("enqueue %s other=%v -> %d %s %s", s.name(), other, r.Status, r.ErrorCode(), got.Status)
	if r.Status != status || r.ErrorCode() != code {
		m.fail("enqueue %s other=%v: %d %q, model %d %q: %s", s.name(), other, r.Status, r.ErrorCode(), status, code, r.Body)
		return
	}
	if code != "" {
		return
	}
	if !s.exists {
		s.exists, s.stepID, s.jobID, s.status = true, got.StepID, got.JobID, jobs.StatusQueued
		if s.key == "" {
			s.key = got.IdempotencyKey
		}
		ep := jmEndpoints[jmTools[s.spec.tool].name].pol
		s.pol, s.max = ep, ep.maxAttempts
		if s.spec.maxAttempts > 0 {
			s.max = s.spec.maxAttempts
		}
		timeout := ep.timeoutMs
		if s.spec.timeoutMs > 0 {
			timeout = s.spec.timeoutMs
		}
		s.lease = time.Duration(timeout)*time.Millisecond + jmGrace
		s.due = now.Add(time.Duration(s.spec.delayMs) * time.Millisecond)
		if d := m.dep(s); d != nil {
			// WAITING until its dependency ends; decided at once if it has.
			s.status = jobs.StatusWaiting
			if ended(d.status) {
				s.status = jobs.StatusSkipped
				if afterHolds(s.spec.afterStatus, d.status) {
					s.status = jobs.StatusQueued
				}
			}
		}
		s.run.steps = append(s.run.steps, s)
		m.settleRun(s.run)
	}
	if got.StepID != s.stepID || got.JobID != s.jobID || got.IdempotencyKey != s.key || got.Status != s.status ||
		got.Deduplicated != (status == http.StatusOK) {
		m.fail("enqueue %s: %s, model step %s job %s key %s status %s", s.name(), r.Body, s.stepID, s.jobID, s.key, s.status)
		return
	}
	if s.queued() && (got.DueAt == nil || !got.DueAt.Equal(s.due)) {
		m.fail("enqueue %s: dueAt %v, model %v", s.name(), got.DueAt, s.due)
	}
}

// queued says whether the job waits for its due time to be claimed.
func (s *jmStep) queued() bool {
	return s.status == jobs.StatusQueued || s.status == jobs.StatusRetryScheduled
}

// --- claim

// claimable says whether a claim now may take the step's job, and the time
// it has been due since (claims take the longest due first).
func (s *jmStep) claimable(now time.Time) (time.Time, bool) {
	switch {
	case !s.exists:
		return time.Time{}, false
	case s.queued():
		// A replayed job waits for its cancelled attempt that may still run.
		if s.held > 0 && s.atts[s.held-1].exp.After(now) {
			return time.Time{}, false
		}
		return s.due, !s.due.After(now)
	case s.status == jobs.StatusRunning && s.attempt < s.max:
		exp := s.latest().exp
		return exp, !exp.After(now)
	}
	return time.Time{}, false
}

type jmClaimed struct {
	JobID, StepID, RunID, Name, Version, LeaseToken, IdempotencyKey string
	Attempt, MaxAttempts                                            int
	LeaseExpiresAt                                                  time.Time
	LeaseMs, TimeoutMs                                              int64
	Input                                                           json.RawMessage
}

func (m *jobsModel) claim(w, limit int) {
	now := m.now()
	var cands []*jmStep
	for _, s := range m.steps {
		// Only exact name@version jobs are claimed (API.md §3.1).
		if _, ok := s.claimable(now); ok && slices.Contains(m.serves(w), s.handler()) && m.admits(s, now) {
			cands = append(cands, s)
		}
	}
	// A claimId: none, a new one, or the worker's last one again (its
	// answer lost, README).
	body := map[string]any{"limit": limit}
	claimID := ""
	switch m.rng.IntN(4) {
	case 0:
		claimID = fmt.Sprintf("c%d-%d", m.seed, m.trace.Len())
	case 1:
		claimID = m.lastClaim[w]
	}
	var again []*jmStep // what a claim sent again answers
	if claimID != "" {
		body["claimId"] = claimID
		m.lastClaim[w] = claimID
		for _, l := range m.claimed[claimID] {
			s, a := l.s, l.s.atts[l.attempt-1]
			if s.status == jobs.StatusRunning && s.attempt == l.attempt && a.exp.After(now) &&
				a.started.After(now.Add(-s.lease)) {
				again = append(again, s)
			}
		}
	}
	key := &m.keys[m.workerKey[w]]
	r := m.env.Do("POST", "/api/v1/workers/"+m.workers[w]+"/claim", key.secret, body)
	var got struct{ Jobs []jmClaimed }
	_ = json.Unmarshal(r.Body, &got)
	var names []string
	for _, j := range got.Jobs {
		names = append(names, fmt.Sprintf("%s#%d", m.byJob(j.JobID).name(), j.Attempt))
	}
	m.log("claim worker %d limit %d claimId %q (again %d) -> %d %s jobs=%d %v", w, limit, claimID, len(again), r.Status,
		r.ErrorCode(), len(got.Jobs), names)
	if key.revoked {
		m.refusedRevoked("claim", r.Status, r.ErrorCode(), r.Body)
		return
	}
	if wait := key.counted(now); wait > 0 {
		// Past its key's limit: refused, nothing leased (README "Rate limits").
		m.seen["model: a claim past its key's rate limit"]++
		if r.Status != http.StatusTooManyRequests || r.ErrorCode() != "rate_limited" ||
			jmDetail(r)["retry_after_seconds"] != float64(wait) {
			m.fail("claim worker %d past its key's limit: %d %s, model 429 rate_limited after %ds", w, r.Status, r.Body, wait)
		}
		return
	}
	if r.Status != http.StatusOK {
		m.fail("claim: %d: %s", r.Status, r.Body)
		return
	}
	if len(again) > 0 {
		m.claimAgain(w, again, got.Jobs, r.Body)
		return
	}
	if !m.checkGrants(w, limit, cands, got.Jobs, r.Body) {
		return
	}
	var leased []*jmStep
	for _, j := range got.Jobs {
		leased = append(leased, m.byJob(j.JobID))
	}
	m.countGrants(leased, now) // before the claim changes what needs a slot
	for _, j := range got.Jobs {
		s := m.byJob(j.JobID)
		// The claim takes a lapsed attempt's job, or a replayed job's
		// cancelled attempt, over: that attempt failed as lapsed.
		if a := s.latest(); a != nil && s.status == jobs.StatusRunning && a.outcome == "" {
			a.outcome, a.lapsed = jobs.OutcomeFailed, true
			m.seen["model: claim takes a lapsed lease"]++
		}
		if s.held > 0 && s.atts[s.held-1].outcome == "" {
			m.seen["model: claim takes a replayed job over its cancelled attempt"]++
			a := s.atts[s.held-1]
			a.outcome, a.lapsed = jobs.OutcomeFailed, true
		}
		if s.upgraded != "" {
			m.seen["model: claim of a job replayed onto handler version "+s.upgraded]++
		}
		s.held, s.requeued, s.replayed = 0, false, false
		s.status, s.attempt = jobs.StatusRunning, s.attempt+1
		s.atts = append(s.atts, &jmAttempt{token: j.LeaseToken, exp: now.Add(s.lease), started: now})
		if claimID != "" {
			m.claimed[claimID] = append(m.claimed[claimID], jmLeased{s: s, attempt: s.attempt})
		}
		tl := s.handler()
		if j.StepID != s.stepID || j.RunID != s.run.id || j.Name != tl.name || j.Version != tl.version ||
			j.Attempt != s.attempt || j.MaxAttempts != s.max || !j.LeaseExpiresAt.Equal(now.Add(s.lease)) ||
			j.LeaseMs != s.lease.Milliseconds() || j.TimeoutMs != (s.lease-jmGrace).Milliseconds() ||
			j.IdempotencyKey != s.key || j.LeaseToken == "" ||
			apitest.Canonical(j.Input) != apitest.CanonicalOf(m.enqueueBody(s, false)["input"]) {
			m.fail("claim of %s: %+v, model attempt %d of %d, lease until %v (%s)", s.name(), j, s.attempt, s.max,
				now.Add(s.lease), s.lease)
		}
	}
}

// jmLeased is a job a claim leased, and the attempt it leased it for.
type jmLeased struct {
	s       *jmStep
	attempt int
}

// claimAgain checks a claim sent again under a claimId whose leases hold:
// it answers every job the id leased to the worker whose lease holds, and
// was leased within one lease's length (whatever the limit), with the same
// attempt and token, its lease renewed from now as a heartbeat would, and
// leases nothing more (README).
func (m *jobsModel) claimAgain(w int, again []*jmStep, got []jmClaimed, body []byte) {
	now := m.now()
	m.seen["model: a claim sent again answers its leases"]++
	if len(got) != len(again) {
		m.fail("claim worker %d sent again: %d jobs, model %d: %s", w, len(got), len(again), body)
		return
	}
	for _, j := range got {
		s := m.byJob(j.JobID)
		if !slices.Contains(again, s) {
			m.fail("claim worker %d sent again: job %s is none the claim leased: %s", w, j.JobID, body)
			return
		}
		a := s.latest()
		if e := now.Add(s.lease); e.After(a.exp) {
			a.exp = e
		}
		if j.Attempt != s.attempt || j.LeaseToken != a.token || !j.LeaseExpiresAt.Equal(a.exp) ||
			j.LeaseMs != s.lease.Milliseconds() {
			m.fail("claim worker %d sent again: %+v, model attempt %d token %s lease until %v", w, j, s.attempt, a.token, a.exp)
		}
	}
}

func (m *jobsModel) byJob(id string) *jmStep {
	for _, s := range m.steps {
		if s.exists && s.jobID == id {
			return s
		}
	}
	return nil
}

// pickToken picks one of the step's tokens (usually the latest attempt's),
// or one that is none of the job's (i -1).
func (m *jobsModel) pickToken(s *jmStep) (int, string) {
	if len(s.atts) == 0 || m.rng.IntN(15) == 0 {
		return -1, fmt.Sprintf("not-a-token-of-this-job-%d", m.rng.IntN(1000))
	}
	i := len(s.atts) - 1
	if m.rng.IntN(4) == 0 {
		i = m.rng.IntN(len(s.atts))
	}
	return i, s.atts[i].token
}

// leaseLost is lease_lost's detail for attempt i's token (none for a token
// of no attempt): its attempt and what it was reported as (README).
func leaseLost(s *jmStep, i int) map[string]any {
	d := map[string]any{}
	if i >= 0 {
		d["attempt"] = float64(i + 1)
		if a := s.atts[i]; a.reported {
			d["reportedOutcome"] = a.sent
		}
	}
	return d
}

// --- heartbeat

func (m *jobsModel) heartbeat(s *jmStep) {
	if !s.exists {
		m.enqueue(s, false)
		return
	}
	i, token := m.pickToken(s)
	now := m.now()
	var (
		status  = http.StatusOK
		code    string
		cancel  bool
		extend  bool
		revive  bool
		a       *jmAttempt
		latest  = i >= 0 && i == len(s.atts)-1
		wantExp time.Time
	)
	if i >= 0 {
		a = s.atts[i]
	}
	switch {
	case !latest:
		status, code = http.StatusConflict, "lease_lost"
	case s.status == jobs.StatusRunning:
		extend = true
	case s.status == jobs.StatusQueued && s.requeued && m.room(m.gate(s), now).conc == 0:
		// Requeued, and the slot it freed went to another job (README).
		status, code = http.StatusConflict, "lease_lost"
		m.seen["model: heartbeat finds no slot to revive"]++
	case s.status == jobs.StatusQueued && s.requeued:
		// Requeued by the sweeper and claimed by no one since: the
		// heartbeat takes the job back (README).
		revive = true
		m.seen["model: heartbeat revives"]++
	case s.cancelledOpen(a):
		// Told to stop; its lease not extended (README).
		cancel = true
		m.seen[fmt.Sprintf("model: heartbeat of a cancelled attempt (replayed %v, lapsed %v)", s.replayed, a.lapsed)]++
	case a.reported:
		status, code = http.StatusConflict, "invalid_state"
	case !s.current():
		status, code = http.StatusConflict, "lease_lost"
	default:
		status, code = http.StatusConflict, "invalid_state"
	}
	key := m.pickKey()
	r := m.env.Do("POST", "/api/v1/jobs/"+s.jobID+"/heartbeat", key.secret, map[string]any{"leaseToken": token})
	var got struct {
		LeaseExpiresAt  *time.Time
		CancelRequested bool
	}
	_ = json.Unmarshal(r.Body, &got)
	m.log("heartbeat %s token of attempt %d -> %d %s cancel=%v", s.name(), i+1, r.Status, r.ErrorCode(), got.CancelRequested)
	if m.refusedKey(key, s, "heartbeat", r.Status, r.ErrorCode(), r.Body) {
		return
	}
	if r.Status != status || r.ErrorCode() != code {
		m.fail("heartbeat %s attempt %d: %d %q, model %d %q: %s", s.name(), i+1, r.Status, r.ErrorCode(), status, code, r.Body)
		return
	}
	if status != http.StatusOK {
		return
	}
	switch {
	case extend:
		if e := now.Add(s.lease); e.After(a.exp) {
			a.exp = e
		}
	case revive:
		s.status, s.requeued = jobs.StatusRunning, false
		a.exp, a.outcome, a.lapsed = now.Add(s.lease), "", false
	}
	wantExp = a.exp
	if got.LeaseExpiresAt == nil || !got.LeaseExpiresAt.Equal(wantExp) || got.CancelRequested != cancel {
		m.fail("heartbeat %s: lease until %v cancelRequested %v, model %v %v", s.name(), got.LeaseExpiresAt,
			got.CancelRequested, wantExp, cancel)
	}
}

// --- report

func (m *jobsModel) report(s *jmStep) {
	if !s.exists {
		m.enqueue(s, false)
		return
	}
	i, token := m.pickToken(s)
	now := m.now()
	body := map[string]any{"leaseToken": token}
	sent := []string{jobs.StatusSucceeded, jobs.OutcomeFailed}[m.rng.IntN(2)]
	var (
		retryable  *bool
		retryAfter *int64
		output     string
	)
	body["status"] = sent
	// refused: a success whose output its contract's outputSchema refuses
	// (README "Tool contracts and replay": only booleans).
	refused := false
	if sent == jobs.StatusSucceeded {
		m.outputs++
		// A step shows its output's preview, which keeps the keys only.
		key := fmt.Sprintf("out%d", m.outputs)
		body["output"], output = map[string]any{key: true}, apitest.CanonicalOf(map[string]any{key: "<boolean>"})
		if s.spec.tool == jmCharge && m.rng.IntN(3) == 0 {
			refused = true
			body["output"], output = map[string]any{key: "no"}, apitest.CanonicalOf(map[string]any{key: "<string>"})
		}
	} else if m.rng.IntN(4) != 0 {
		e := map[string]any{"message": "model failure"}
		switch m.rng.IntN(4) {
		case 0:
			e["retryable"], retryable = false, ptr(false)
		case 1:
			e["retryable"], retryable = true, ptr(true)
		}
		if (retryable == nil || *retryable) && m.rng.IntN(3) == 0 {
			ms := []int64{1000, 3000, 60_000}[m.rng.IntN(3)]
			e["retryAfterMs"], retryAfter = ms, &ms
		}
		body["error"] = e
	}
	// A failure without a decision is retryable (README).
	rec := ptr(retryable == nil || *retryable)
	if sent == jobs.StatusSucceeded {
		rec = nil
	}

	var a *jmAttempt
	if i >= 0 {
		a = s.atts[i]
	}
	latest := i >= 0 && i == len(s.atts)-1
	status, code := http.StatusOK, ""
	var (
		detail map[string]any
		want   jmReport
		apply  func()
	)
	switch {
	case i < 0:
		status, code, detail = http.StatusConflict, "lease_lost", map[string]any{}
	case !latest:
		status, code, detail = http.StatusConflict, "lease_lost", leaseLost(s, i)
	case a.reported:
		// The same outcome again answers the same object; another is
		// invalid_state (API.md §5; README: a failure's retryable and
		// retryAfterMs are part of its outcome).
		sameAfter := (a.retryAfter == nil) == (retryAfter == nil) &&
			(retryAfter == nil || *a.retryAfter == *retryAfter)
		if a.sent != sent || sent == jobs.OutcomeFailed && (*a.retryable != *rec || !sameAfter) {
			status, code = http.StatusConflict, "invalid_state"
		} else {
			want = a.answer
		}
	case s.cancelledOpen(a):
		// A cancelled attempt's report (the job replayed since or not) is
		// recorded on the attempt; the job stays as it is (README).
		want = jmReport{status: s.status}
		m.seen[fmt.Sprintf("model: report of a cancelled attempt (replayed %v, lapsed %v)", s.replayed, a.lapsed)]++
		apply = func() {
			a.late = a.outcome != "" // the sweeper had failed it as lapsed
			m.record(a, sent, rec, retryAfter, want)
			if s.held == i+1 {
				s.held = 0
			}
			if s.status == jobs.StatusQueued && s.due.After(now) {
				s.due = now // due at the report (README)
			}
			if output != "" {
				s.output = output
			}
		}
	case s.replayed:
		// Replayed after this attempt lapsed unreported (and its job
		// ended): the next claim supersedes it.
		status, code, detail = http.StatusConflict, "lease_lost", map[string]any{}
	case refused && (s.status == jobs.StatusRunning || s.status == jobs.StatusQueued && s.requeued):
		// A refused output is a non-retryable failure: the job EXHAUSTED
		// at once, the output not stored, the attempt warned; the breaker
		// does not count it (README).
		want = jmReport{status: jobs.StatusExhausted}
		m.seen["model: an output refused"]++
		apply = func() {
			m.record(a, sent, ptr(false), nil, want)
			a.outcome, a.refused = jobs.OutcomeFailed, true
			s.status, s.requeued, s.output = want.status, false, ""
			m.settleRun(s.run)
		}
	case s.status == jobs.StatusRunning || s.status == jobs.StatusQueued && s.requeued:
		want = jmReport{status: jobs.StatusSucceeded}
		if s.requeued {
			m.seen["model: report of a requeued job"]++
		}
		if a.exp.Before(now) {
			m.seen["model: report after the lease lapsed"]++
		}
		if sent == jobs.OutcomeFailed {
			want.status = jobs.StatusExhausted
			if *rec && s.attempt < s.max {
				due := m.retryDue(s, now, retryAfter)
				want = jmReport{status: jobs.StatusRetryScheduled, next: &due}
			}
		}
		apply = func() {
			a.late = s.requeued
			m.record(a, sent, rec, retryAfter, want)
			s.status, s.requeued = want.status, false
			if want.next != nil {
				s.due = *want.next
			}
			// The job's output is its latest attempt's: a failure has none
			// (README: a cancelled attempt's is kept until another
			// attempt's report replaces it).
			s.output = output
			m.countReport(s, sent == jobs.StatusSucceeded, sent == jobs.OutcomeFailed && *rec)
			m.settleRun(s.run)
		}
	default:
		// The job ended (its last attempt lapsed unreported: the sweeper or
		// a read exhausted it).
		status, code = http.StatusConflict, "invalid_state"
		detail = map[string]any{"status": s.status, "leaseLapsed": !a.reported}
	}
	batch := m.rng.IntN(3) == 0
	key := m.pickKey()
	r := m.sendReport(key.secret, s.jobID, body, batch)
	got := r.answer
	m.log("report %s token of attempt %d %s refused=%v retryable=%v after=%v batch=%v -> %d %s %s", s.name(), i+1, sent,
		refused, fmtPtr(retryable), fmtPtr(retryAfter), batch, r.status, r.code, got.Status)
	if m.refusedKey(key, s, "report", r.status, r.code, r.body) {
		return
	}
	if r.status != status || r.code != code {
		m.fail("report %s attempt %d %s batch=%v: %d %q, model %d %q: %s", s.name(), i+1, sent, batch, r.status, r.code,
			status, code, r.body)
		return
	}
	if detail != nil && fmt.Sprint(r.detail) != fmt.Sprint(detail) {
		m.fail("report %s attempt %d: %s detail %v, model %v", s.name(), i+1, code, r.detail, detail)
	}
	if status != http.StatusOK {
		return
	}
	if got.JobID != s.jobID || got.Status != want.status || got.Attempt != i+1 || !sameTime(got.NextDueAt, want.next) {
		m.fail("report %s attempt %d: %s, model status %s nextDueAt %v", s.name(), i+1, r.body, want.status, fmtPtr(want.next))
		return
	}
	if apply != nil {
		apply()
	}
}

// jmReportAnswer is a report's answer, by the single route or in its slot
// of a batch (POST /api/v1/jobs/report, which answers a refusal in the
// slot with the single route's code and detail).
type jmReportAnswer struct {
	status int
	code   string
	detail map[string]any
	answer struct {
		JobID     string
		Status    string
		Attempt   int
		NextDueAt *time.Time
	}
	body []byte
}

func (m *jobsModel) sendReport(key, jobID string, body map[string]any, batch bool) jmReportAnswer {
	var out jmReportAnswer
	if !batch {
		r := m.env.Do("POST", "/api/v1/jobs/"+jobID+"/report", key, body)
		out.status, out.code, out.body = r.Status, r.ErrorCode(), r.Body
		_ = json.Unmarshal(r.Body, &out.answer)
		out.detail = jmDetail(r)
		return out
	}
	item := map[string]any{"jobId": jobID}
	for k, v := range body {
		item[k] = v
	}
	r := m.env.Do("POST", "/api/v1/jobs/report", key, map[string]any{"reports": []any{item}})
	var got struct{ Results []json.RawMessage }
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &got) != nil || len(got.Results) != 1 {
		out.status, out.code, out.body = r.Status, r.ErrorCode(), r.Body
		return out
	}
	out.status, out.body = http.StatusOK, got.Results[0]
	var slot struct {
		Error *struct {
			Code   string
			Detail map[string]any
		}
	}
	_ = json.Unmarshal(out.body, &slot)
	_ = json.Unmarshal(out.body, &out.answer)
	if e := slot.Error; e != nil {
		out.status, out.code, out.detail = map[string]int{"lease_lost": http.StatusConflict,
			"invalid_state": http.StatusConflict, "forbidden": http.StatusForbidden}[e.Code], e.Code, e.Detail
		if out.detail == nil {
			out.detail = map[string]any{}
		}
	}
	return out
}

// jmDetail is an error answer's detail (empty for none).
func jmDetail(r *apitest.Response) map[string]any {
	e, _ := r.JSON()["error"].(map[string]any)
	d, _ := e["detail"].(map[string]any)
	if d == nil {
		d = map[string]any{}
	}
	return d
}

func (m *jobsModel) record(a *jmAttempt, sent string, retryable *bool, retryAfter *int64, answer jmReport) {
	a.reported, a.sent, a.outcome, a.lapsed = true, sent, sent, false
	a.retryable, a.retryAfter, a.answer = retryable, retryAfter, answer
}

// retryDue is README "Retries"' due time of the retry after the job's
// current attempt failed: min(maxDelayMs, initialDelayMs × multiplier^(n−1))
// with the jitter, retryAfterMs as an unjittered floor, never beyond 24 h.
func (m *jobsModel) retryDue(s *jmStep, now time.Time, floor *int64) time.Time {
	p := s.pol
	d := math.Min(float64(p.maxDelayMs), float64(p.initialMs)*math.Pow(p.multiplier, float64(s.attempt-1)))
	j := p.jitterPct / 100
	ms := int64(math.Round(d * (1 - j + 2*j*m.jitter)))
	if floor != nil && *floor > ms {
		ms = *floor
	}
	ms = min(ms, 86_400_000)
	return now.Add(time.Duration(ms) * time.Millisecond).Truncate(time.Millisecond)
}

// --- cancel, replay, finish

func (m *jobsModel) cancel(s *jmStep) {
	if !s.exists {
		m.enqueue(s, false)
		return
	}
	status, code := http.StatusOK, ""
	switch s.status {
	case jobs.StatusCancelled:
	case jobs.StatusSucceeded, jobs.StatusExhausted, jobs.StatusSkipped:
		status, code = http.StatusConflict, "invalid_state"
	}
	r := m.env.Do("POST", "/api/v1/steps/"+s.stepID+"/cancel", m.ws.Key, nil)
	m.log("cancel %s (%s) -> %d %s", s.name(), s.status, r.Status, r.ErrorCode())
	if r.Status != status || r.ErrorCode() != code {
		m.fail("cancel %s: %d %q, model %d %q: %s", s.name(), r.Status, r.ErrorCode(), status, code, r.Body)
		return
	}
	if status != http.StatusOK {
		return
	}
	if s.status != jobs.StatusCancelled {
		if s.status == jobs.StatusRunning && s.held == 0 {
			s.held = s.attempt // it may still run: its slot and lease are held
		}
		s.status = jobs.StatusCancelled
		m.settleRun(s.run)
	}
	m.checkStep(s, r.Body, "cancel's answer")
}

func (m *jobsModel) replay(s *jmStep) {
	if !s.exists {
		m.enqueue(s, false)
		return
	}
	now := m.now()
	// The replay's read ends a lapsed last attempt first, as a read of the
	// step does.
	if s.status == jobs.StatusRunning && s.attempt >= s.max {
		m.exhaustLapsed(s.run)
	}
	more := 1 + m.rng.IntN(2)
	status, code := http.StatusOK, ""
	if s.status != jobs.StatusExhausted && s.status != jobs.StatusCancelled {
		status, code = http.StatusConflict, "invalid_state"
	}
	// Not until its dependency ended the way it waits for: it would run
	// before its dependency decided it, or be skipped (README).
	if d := m.dep(s); d != nil && !(ended(d.status) && afterHolds(s.spec.afterStatus, d.status)) {
		status, code = http.StatusConflict, "invalid_state"
	}
	body := map[string]any{"acknowledgeDuplicateRisk": true, "maxAttempts": more, "reason": "model"}
	upgrade := m.replayUpgrade(s, body)
	if upgrade.forbidden && status == http.StatusOK {
		status, code = http.StatusConflict, "invalid_state"
	}
	r := m.env.Do("POST", "/api/v1/steps/"+s.stepID+"/replay", m.ws.Key, body)
	m.log("replay %s (%s) +%d onto %v -> %d %s", s.name(), s.status, more, body["targetContractVersion"], r.Status,
		r.ErrorCode())
	if r.Status != status || r.ErrorCode() != code {
		m.fail("replay %s: %d %q, model %d %q: %s", s.name(), r.Status, r.ErrorCode(), status, code, r.Body)
		return
	}
	if status != http.StatusOK {
		return
	}
	s.status, s.max, s.replayed, s.requeued = jobs.StatusQueued, s.attempt+more, true, false
	s.due = now
	if upgrade.to != "" {
		s.upgraded = upgrade.to
		m.seen["model: a replay onto handler version "+upgrade.to]++
	}
	m.unskip(s)
	if s.held > 0 && s.atts[s.held-1].exp.After(now) {
		s.due = s.atts[s.held-1].exp // it waits for the cancelled attempt (README)
		m.seen["model: replay waits for the cancelled attempt"]++
	}
	// The run is FAILED while another of its steps is.
	if s.run.status == jobs.RunFailed && !slices.ContainsFunc(s.run.steps, func(o *jmStep) bool {
		return o != s && (o.status == jobs.StatusExhausted || o.status == jobs.StatusCancelled)
	}) {
		s.run.status = jobs.RunRunning
	}
	var got struct {
		StepID, JobID, Status, HandlerVersion string
		Attempt, MaxAttempts                  int
	}
	_ = json.Unmarshal(r.Body, &got)
	if got.StepID != s.stepID || got.JobID != s.jobID || got.Status != jobs.StatusQueued || got.Attempt != s.attempt ||
		got.MaxAttempts != s.max || got.HandlerVersion != s.handler().version {
		m.fail("replay %s: %s, model attempt %d maxAttempts %d", s.name(), r.Body, s.attempt, s.max)
	}
}

// pause pauses the endpoint, or resumes it when it is paused.
func (m *jobsModel) pause(name string) {
	g := m.gates[name]
	verb := "pause"
	if g.paused {
		verb = "resume"
	}
	r := m.env.Do("POST", "/api/v1/endpoints/"+g.id+"/"+verb, m.ws.Key, nil)
	m.log("%s %s -> %d %s", verb, name, r.Status, r.ErrorCode())
	if r.Status != http.StatusOK {
		m.fail("%s %s: %d %s", verb, name, r.Status, r.Body)
		return
	}
	g.paused = verb == "pause"
	m.checkEndpoint(g, r.Body, verb+"'s answer")
}

// unskip puts the steps s's end skipped, and those below them, back to
// WAITING: s runs again, and decides them when it ends.
func (m *jobsModel) unskip(s *jmStep) {
	for _, o := range m.steps {
		if o.exists && m.dep(o) == s && o.status == jobs.StatusSkipped {
			o.status = jobs.StatusWaiting
			m.seen["model: a replay unskips"]++
			m.unskip(o)
		}
	}
}

func (m *jobsModel) finish(run *jmRun) {
	r := m.env.Do("POST", "/api/v1/runs/"+run.id+"/finish", m.ws.Key, nil)
	m.log("finish run %d -> %d %s", run.i, r.Status, r.ErrorCode())
	if r.Status != http.StatusOK {
		m.fail("finish run %d: %d: %s", run.i, r.Status, r.Body)
		return
	}
	run.requested = true
	m.settleRun(run)
	m.exhaustLapsed(run) // the answer is the run's read
	m.checkRun(run, r.Body, "finish's answer")
}

// settleRun is the run's status after its steps changed (API.md §3): FAILED
// as soon as a step is EXHAUSTED or CANCELLED, SUCCEEDED once completion
// was requested and every step ended well.
func (m *jobsModel) settleRun(run *jmRun) {
	m.releaseDependents(run)
	if run.status != jobs.RunRunning {
		return
	}
	well := true
	for _, s := range run.steps {
		switch s.status {
		case jobs.StatusExhausted, jobs.StatusCancelled:
			run.status = jobs.RunFailed
			return
		case jobs.StatusSucceeded, jobs.StatusSkipped:
		default:
			well = false
		}
	}
	if run.requested && well {
		run.status = jobs.RunSucceeded
	}
}

// releaseDependents decides the run's WAITING steps whose dependency has
// ended (README "Dependencies"): QUEUED, due now, when it ended the way
// they wait for, else SKIPPED, which decides the steps waiting below them.
func (m *jobsModel) releaseDependents(run *jmRun) {
	for again := true; again; {
		again = false
		for _, s := range run.steps {
			if d := m.dep(s); s.status == jobs.StatusWaiting && ended(d.status) {
				s.status, again = jobs.StatusSkipped, true
				if afterHolds(s.spec.afterStatus, d.status) {
					s.status, s.due = jobs.StatusQueued, m.now()
				}
				m.seen["model: a dependency releases "+s.status]++
			}
		}
	}
}

func ended(status string) bool {
	return slices.Contains([]string{jobs.StatusSucceeded, jobs.StatusExhausted, jobs.StatusCancelled, jobs.StatusSkipped}, status)
}

// afterHolds: afterStatus SUCCEEDED runs after a success, FAILED after an
// EXHAUSTED dependency; any other ending skips the step.
func afterHolds(afterStatus, status string) bool {
	return afterStatus == jobs.StatusSucceeded && status == jobs.StatusSucceeded ||
		afterStatus == "FAILED" && status == jobs.StatusExhausted
}

// --- lapses and sweeps

// exhaustLapsed ends the run's jobs whose lease lapsed on their last
// attempt (a read of the run, or of such a step, does; so does a sweep).
func (m *jobsModel) exhaustLapsed(run *jmRun) {
	now := m.now()
	for _, s := range run.steps {
		if s.status == jobs.StatusRunning && s.attempt >= s.max && !s.latest().exp.After(now) {
			a := s.latest()
			s.status, a.outcome, a.lapsed = jobs.StatusExhausted, jobs.OutcomeFailed, true
			m.seen["model: a lapsed last attempt ends its job"]++
		}
	}
	m.settleRun(run)
}

func (m *jobsModel) sweep() {
	res := m.env.App.Sweeper.RunOnce(context.Background())
	m.log("sweep -> %v", res.Error())
	if res.Error() != nil {
		m.fail("sweep: %v", res.Error())
		return
	}
	now := m.now()
	for _, run := range m.runs {
		m.exhaustLapsed(run)
	}
	for _, s := range m.steps {
		a := s.latest()
		switch {
		case s.status == jobs.StatusRunning && !a.exp.After(now.Add(-jobs.RequeueLapsedAfter)):
			// Lapsed long enough ago: queued again, due when it lapsed.
			s.status, s.requeued, s.due = jobs.StatusQueued, true, a.exp
			a.outcome, a.lapsed = jobs.OutcomeFailed, true
			m.seen["model: sweep requeues"]++
			m.last = s // its worker's heartbeat or report may come next
		case s.held > 0 && !s.atts[s.held-1].exp.After(now):
			// A cancelled attempt whose lease ended unreported: failed as
			// lapsed, its slot freed.
			h := s.atts[s.held-1]
			m.seen["model: sweep frees a cancelled attempt's slot"]++
			if h.outcome == "" {
				h.outcome, h.lapsed = jobs.OutcomeFailed, true
			}
			s.held = 0
		}
	}
}

// --- reads

type jmReadAttempt struct {
	Attempt      int
	Outcome      *string
	Warning      *string
	Retryable    *bool
	RetryAfterMs *int64
	ReportedAt   *time.Time
}

type jmReadStep struct {
	ID            string
	Status        string
	OutputPreview json.RawMessage
	DurableJob    struct {
		ID             string
		Status         string
		Attempt        int
		MaxAttempts    int
		DueAt          *time.Time
		LeaseExpiresAt *time.Time
		Attempts       []jmReadAttempt
	}
}

func (m *jobsModel) readStep(s *jmStep) {
	if !s.exists {
		m.enqueue(s, false)
		return
	}
	if s.status == jobs.StatusRunning && s.attempt >= s.max && !s.latest().exp.After(m.now()) {
		m.exhaustLapsed(s.run)
	}
	r := m.env.Do("GET", "/api/v1/steps/"+s.stepID, m.ws.Key, nil)
	m.log("read %s -> %d %s", s.name(), r.Status, r.JSON()["status"])
	if r.Status != http.StatusOK {
		m.fail("read %s: %d: %s", s.name(), r.Status, r.Body)
		return
	}
	m.checkStep(s, r.Body, "read")
}

func (m *jobsModel) readRun(run *jmRun) {
	m.exhaustLapsed(run)
	r := m.env.Do("GET", "/api/v1/runs/"+run.id, m.ws.Key, nil)
	m.log("read run %d -> %d %s", run.i, r.Status, r.JSON()["status"])
	if r.Status != http.StatusOK {
		m.fail("read run %d: %d: %s", run.i, r.Status, r.Body)
		return
	}
	m.checkRun(run, r.Body, "read")
}

func (m *jobsModel) listRuns() {
	for _, run := range m.runs {
		m.exhaustLapsed(run)
	}
	r := m.env.Do("GET", "/api/v1/runs", m.ws.Key, nil)
	m.log("list runs -> %d", r.Status)
	var got struct {
		Data []struct {
			ID, Status          string
			CompletionRequested bool
		}
	}
	_ = json.Unmarshal(r.Body, &got)
	if r.Status != http.StatusOK || len(got.Data) != len(m.runs) {
		m.fail("list runs: %d: %s", r.Status, r.Body)
		return
	}
	for _, g := range got.Data {
		for _, run := range m.runs {
			if run.id == g.ID && (g.Status != run.status || g.CompletionRequested != run.requested) {
				m.fail("list runs: run %d reads %s requested=%v, model %s %v", run.i, g.Status, g.CompletionRequested,
					run.status, run.requested)
			}
		}
	}
}

func (m *jobsModel) checkRun(run *jmRun, body []byte, what string) {
	var got struct {
		Status              string
		CompletionRequested bool
		FinishedAt          *time.Time
		Steps               []json.RawMessage
	}
	if err := json.Unmarshal(body, &got); err != nil {
		m.fail("%s of run %d: %v", what, run.i, err)
		return
	}
	if got.Status != run.status || got.CompletionRequested != run.requested || len(got.Steps) != len(run.steps) ||
		(got.FinishedAt != nil) != (run.status != jobs.RunRunning) {
		m.fail("%s of run %d: status %s requested %v finishedAt %v, %d steps; model %s %v, %d steps", what, run.i,
			got.Status, got.CompletionRequested, got.FinishedAt, len(got.Steps), run.status, run.requested, len(run.steps))
		return
	}
	for _, raw := range got.Steps {
		var st jmReadStep
		_ = json.Unmarshal(raw, &st)
		for _, s := range run.steps {
			if s.stepID == st.ID {
				m.checkStep(s, raw, what+" of run "+fmt.Sprint(run.i))
			}
		}
	}
}

// checkStep compares a step object with the model.
func (m *jobsModel) checkStep(s *jmStep, body []byte, what string) {
	m.t.Helper()
	var st jmReadStep
	if err := json.Unmarshal(body, &st); err != nil {
		m.fail("%s of %s: %v", what, s.name(), err)
		return
	}
	j := st.DurableJob
	var wantLease *time.Time
	if a := s.latest(); a != nil && (s.status == jobs.StatusRunning || a.outcome == "") {
		wantLease = &a.exp
	}
	var wantDue *time.Time
	if s.queued() {
		wantDue = &s.due
	}
	gotDue := j.DueAt
	if !s.queued() {
		gotDue = nil // dueAt is the due time of a job waiting for it (API.md §5)
	}
	output := ""
	if len(st.OutputPreview) > 0 && string(st.OutputPreview) != "null" {
		output = apitest.Canonical(st.OutputPreview)
	}
	if st.ID != s.stepID || st.Status != s.status || j.ID != s.jobID || j.Status != s.status || j.Attempt != s.attempt ||
		j.MaxAttempts != s.max || !sameTime(gotDue, wantDue) || !sameTime(j.LeaseExpiresAt, wantLease) ||
		output != s.output {
		m.fail("%s of %s: status %s attempt %d/%d dueAt %v leaseExpiresAt %v output %s; model %s %d/%d %v %v %s", what,
			s.name(), j.Status, j.Attempt, j.MaxAttempts, fmtPtr(j.DueAt), fmtPtr(j.LeaseExpiresAt), output,
			s.status, s.attempt, s.max, fmtPtr(wantDue), fmtPtr(wantLease), s.output)
		return
	}
	var got, want []string
	for _, a := range j.Attempts {
		warning := "-"
		if a.Warning != nil {
			switch {
			case *a.Warning == jobs.LapseWarning:
				warning = "lapse"
			case strings.HasPrefix(*a.Warning, "Output rejected by contract "):
				warning = "refused"
			default:
				warning = "late"
			}
		}
		got = append(got, fmt.Sprintf("%d:%s:%s:retryable=%s:after=%s:reported=%v", a.Attempt, fmtPtr(a.Outcome), warning,
			fmtPtr(a.Retryable), fmtPtr(a.RetryAfterMs), a.ReportedAt != nil))
	}
	for n, a := range s.atts {
		outcome, warning := (*string)(nil), "-"
		if a.outcome != "" {
			outcome = &a.outcome
		}
		switch {
		case a.lapsed:
			warning = "lapse"
		case a.refused:
			warning = "refused"
		case a.late:
			warning = "late"
		}
		want = append(want, fmt.Sprintf("%d:%s:%s:retryable=%s:after=%s:reported=%v", n+1, fmtPtr(outcome), warning,
			fmtPtr(a.retryable), fmtPtr(a.retryAfter), a.reported))
	}
	if !slices.Equal(got, want) {
		m.fail("%s of %s: attempts\n    %v\n  model\n    %v", what, s.name(), got, want)
	}
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equal(*b)
}

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "<nil>"
	}
	if t, ok := any(*p).(time.Time); ok {
		return t.UTC().Format("15:04:05.000")
	}
	return fmt.Sprint(*p)
}

// TestJobsModelConcurrent runs workers claiming (now and then with a long
// poll, waitSeconds 1), heartbeating and reporting at once, through two
// instances on one clock, with clock moves, sweeps,
// cancels and replays among them, and checks what holds whatever the
// interleaving: every answer is one API.md names; a heartbeat or report
// with a token a newer claim superseded before it was sent is lease_lost;
// each job's attempts are granted once each, numbered 1, 2, … without a
// gap, and the job's attempt is their count (attempts counted exactly);
// no attempt began before the one before it ended (reported, or its lease,
// as heartbeats left it, expired): no job is held by two live leases; and
// every report answered 200 reads, at the end, as recorded on its attempt
// with the outcome sent (no acknowledged report lost). mdl_send has a
// maxConcurrent of 2, and no read of the run (its steps as of one moment)
// finds more of its jobs RUNNING; a second WORKER key, whose worker claims,
// heartbeats and reports with the others, is revoked halfway: from its
// revocation's answer on its claims are 401 on both instances, and its
// heartbeats and reports on the revoking one (model_gates_test.go). The
// seed fixes each
// goroutine's operations, not their interleaving; MODEL_SEED, MODEL_SEEDS
// and MODEL_OPS (each goroutine's) work as for TestJobsModelSequential.
//
// Not parallel, nor are its seeds: the sweeps act on every workspace.
func TestJobsModelConcurrent(t *testing.T) {
	apitest.ModelRuns(t, 3, 40, func(t *testing.T, seed uint64, ops int) { runConcurrentJobsModel(t, seed, 6, ops) })
}

// cjGrant is one claim of a job as its worker was answered.
type cjGrant struct {
	attempt int
	token   string
	worker  int
}

// cjReport is a report answered 200.
type cjReport struct {
	jobID   string
	attempt int
	status  string
}

type cjJob struct {
	stepID, jobID string
	grants        map[int]cjGrant // by attempt
	latest        int             // the newest attempt granted so far
}

type concurrentJobs struct {
	t    *testing.T
	seed uint64
	envs []*apitest.Env
	ws   apitest.Workspace
	// keys are the WORKER keys' secrets, the second revoked halfway
	// (model_gates_test.go's cjRevocation); workers the worker ids,
	// jmWorkers' sets under the first key, then one under the second.
	keys    []string
	workers []string
	revoke  cjRevocation
	clock   *apitest.Clock
	mu      sync.Mutex
	jobs    map[string]*cjJob
	order   []*cjJob
	acked   []cjReport
	answers map[string]int // what the goroutines were answered, for -v
	peak    int            // the most of cjLimited's jobs a read found RUNNING
	run     string
}

// enqueue adds a step to the run: of each tool in turn, with 2 to 4
// attempts and a timeout of 1 to 3 s.
func (c *concurrentJobs) enqueue(g int, env *apitest.Env) {
	c.mu.Lock()
	i := len(c.order) + g + 1 // unique whether or not another enqueue lands first
	c.mu.Unlock()
	tl := jmTools[i%len(jmTools)]
	r := env.Do("POST", "/api/v1/runs/"+c.run+"/steps", c.ws.Key, map[string]any{"name": tl.name,
		"version": tl.version, "input": map[string]any{"i": i, "g": g}, "maxAttempts": 2 + i%3, "timeoutMs": 1000 + 1000*(i%3)})
	if r.Status != http.StatusCreated {
		c.fail(g, "enqueue: %d %s", r.Status, r.Body)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.job(r.JSON()["jobId"].(string))
	j.stepID = r.JSON()["stepId"].(string)
	c.order = append(c.order, j)
}

// job is what the run knows of job id: a claim may answer a job before its
// enqueue's answer is back. The caller holds mu.
func (c *concurrentJobs) job(id string) *cjJob {
	j := c.jobs[id]
	if j == nil {
		j = &cjJob{jobID: id, grants: map[int]cjGrant{}}
		c.jobs[id] = j
	}
	return j
}

// pick is one of the run's steps.
func (c *concurrentJobs) pick(rng *rand.Rand) *cjJob {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order[rng.IntN(len(c.order))]
}

func (c *concurrentJobs) fail(w int, format string, args ...any) {
	c.t.Helper()
	c.t.Errorf("seed %d goroutine %d (replay the operations: MODEL_SEED=%d go test -run 'TestJobsModelConcurrent' ./lib/jobs): %s",
		c.seed, w, c.seed, fmt.Sprintf(format, args...))
}

func runConcurrentJobsModel(t *testing.T, seed uint64, goroutines, ops int) {
	clock := apitest.NewClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	env1 := apitest.Start(t, apitest.WithNow(clock.Now))
	env2 := apitest.Start(t, apitest.WithNow(clock.Now))
	c := &concurrentJobs{t: t, seed: seed, envs: []*apitest.Env{env1, env2}, ws: env1.Signup(), clock: clock,
		jobs: map[string]*cjJob{}, answers: map[string]int{}}
	worker, workers, endpoints := jmWorkspace(env1, c.ws)
	second, workerB := jmSecondKey(env1, c.ws, 0)
	c.keys, c.workers, c.revoke.id = []string{worker, second.secret}, append(workers, workerB), second.id
	c.limitEndpoints(endpoints)
	c.run = env1.Must(http.StatusCreated, "POST", "/api/v1/runs", c.ws.Key, map[string]any{"name": "concurrent"}).JSON()["id"].(string)
	for range 12 {
		c.enqueue(-1, env1)
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			w := g % len(c.workers)
			var held []cjHeld // the leases this goroutine's worker holds, as it knows them
			for i := range ops {
				if g == 0 && i == ops/2 {
					c.revokeSecond()
				}
				held = c.step(g, w, rng, held)
			}
		}()
	}
	wg.Wait()
	c.checkFinal()
	checkEventLedger(t, c.envs[0], c.ws.ID)
	grants := 0
	for _, j := range c.order {
		grants += len(j.grants)
	}
	t.Logf("%d attempts granted, %d reports acknowledged, at most %d of %s running at once as read; answers: %v", grants,
		len(c.acked), c.peak, cjLimited, c.answers)
}

// cjHeld is a lease a goroutine holds (or held: it may have been superseded).
type cjHeld struct {
	jobID   string
	attempt int
	token   string
}

var (
	cjStatuses   = []string{jobs.StatusQueued, jobs.StatusRunning, jobs.StatusRetryScheduled, jobs.StatusSucceeded, jobs.StatusExhausted, jobs.StatusCancelled}
	cjLeaseCodes = []string{"lease_lost", "invalid_state"}
)

// note counts an answer.
func (c *concurrentJobs) note(what string, res *apitest.Response) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answers[fmt.Sprintf("%s %d %s", what, res.Status, res.ErrorCode())]++
}

func (c *concurrentJobs) step(g, w int, rng *rand.Rand, held []cjHeld) []cjHeld {
	env := c.envs[rng.IntN(len(c.envs))]
	key := c.keyOf(w)
	revoked, everywhere := c.revoke.revokedBefore(c.clock.Now())
	revoked = revoked && key == c.keys[1]
	switch r := rng.IntN(100); {
	case r < 30 || len(held) == 0 && r < 60:
		body := map[string]any{"limit": 1 + rng.IntN(3)}
		if rng.IntN(5) == 0 {
			// A long poll: its later looks meet what the others did
			// meanwhile (README "Durable jobs": waitSeconds).
			body["waitSeconds"] = 1
		}
		res := env.Do("POST", "/api/v1/workers/"+c.workers[w]+"/claim", key, body)
		c.note("claim", res)
		if c.revokedAnswer(g, key, "claim", res, revoked, true) {
			return held
		}
		var got struct{ Jobs []jmClaimed }
		if res.Status != http.StatusOK || json.Unmarshal(res.Body, &got) != nil {
			c.fail(g, "claim: %d %s", res.Status, res.Body)
			return held
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, cj := range got.Jobs {
			if cj.RunID != c.run {
				c.fail(g, "claim: job %s is none of the run's", cj.JobID)
				continue
			}
			j := c.job(cj.JobID)
			if _, twice := j.grants[cj.Attempt]; twice {
				c.fail(g, "claim: attempt %d of %s granted twice", cj.Attempt, cj.JobID)
			}
			j.grants[cj.Attempt] = cjGrant{attempt: cj.Attempt, token: cj.LeaseToken, worker: w}
			j.latest = max(j.latest, cj.Attempt)
			held = append(held, cjHeld{jobID: cj.JobID, attempt: cj.Attempt, token: cj.LeaseToken})
		}
		return held
	case r < 45 && len(held) > 0:
		h := held[rng.IntN(len(held))]
		superseded := c.superseded(h)
		res := env.Do("POST", "/api/v1/jobs/"+h.jobID+"/heartbeat", key, map[string]any{"leaseToken": h.token})
		c.note("heartbeat", res)
		if c.revokedAnswer(g, key, "heartbeat", res, revoked, env == c.envs[0] || everywhere) {
			return held
		}
		c.checkSuperseded(g, res, superseded, "heartbeat", h)
		if res.Status != http.StatusOK && !(res.Status == http.StatusConflict && slices.Contains(cjLeaseCodes, res.ErrorCode())) {
			c.fail(g, "heartbeat %s attempt %d: %d %s", h.jobID, h.attempt, res.Status, res.Body)
		}
	case r < 75 && len(held) > 0:
		k := rng.IntN(len(held))
		h := held[k]
		if rng.IntN(4) != 0 {
			held = slices.Delete(held, k, k+1) // reported: usually not again
		}
		body := map[string]any{"leaseToken": h.token, "status": jobs.StatusSucceeded, "output": map[string]any{"ok": true}}
		if rng.IntN(2) == 0 {
			body = map[string]any{"leaseToken": h.token, "status": jobs.OutcomeFailed,
				"error": map[string]any{"message": "model", "retryable": rng.IntN(3) != 0}}
		}
		superseded := c.superseded(h)
		res := env.Do("POST", "/api/v1/jobs/"+h.jobID+"/report", key, body)
		c.note("report", res)
		if c.revokedAnswer(g, key, "report", res, revoked, env == c.envs[0] || everywhere) {
			return held
		}
		c.checkSuperseded(g, res, superseded, "report", h)
		switch {
		case res.Status == http.StatusOK:
			var got struct {
				Status  string
				Attempt int
			}
			_ = json.Unmarshal(res.Body, &got)
			if got.Attempt != h.attempt || !slices.Contains(cjStatuses, got.Status) {
				c.fail(g, "report %s attempt %d: %s", h.jobID, h.attempt, res.Body)
			}
			c.mu.Lock()
			c.acked = append(c.acked, cjReport{jobID: h.jobID, attempt: h.attempt, status: body["status"].(string)})
			c.mu.Unlock()
		case res.Status == http.StatusConflict && slices.Contains(cjLeaseCodes, res.ErrorCode()):
		default:
			c.fail(g, "report %s attempt %d: %d %s", h.jobID, h.attempt, res.Status, res.Body)
		}
	case r < 85:
		c.clock.Add(time.Duration(1+rng.IntN(8)) * time.Second)
	case r < 89:
		if err := env.App.Sweeper.RunOnce(context.Background()).Error(); err != nil {
			c.fail(g, "sweep: %v", err)
		}
	case r < 91:
		c.enqueue(g, env)
	case r < 94:
		j := c.pick(rng)
		res := env.Do("POST", "/api/v1/steps/"+j.stepID+"/cancel", c.ws.Key, nil)
		c.note("cancel", res)
		if res.Status != http.StatusOK && !(res.Status == http.StatusConflict && res.ErrorCode() == "invalid_state") {
			c.fail(g, "cancel %s: %d %s", j.stepID, res.Status, res.Body)
		}
	case r < 97:
		j := c.pick(rng)
		res := env.Do("POST", "/api/v1/steps/"+j.stepID+"/replay", c.ws.Key, map[string]any{"acknowledgeDuplicateRisk": true})
		c.note("replay", res)
		if res.Status != http.StatusOK && !(res.Status == http.StatusConflict && res.ErrorCode() == "invalid_state") {
			c.fail(g, "replay %s: %d %s", j.stepID, res.Status, res.Body)
		}
	case r < 98:
		j := c.pick(rng)
		if res := env.Do("GET", "/api/v1/steps/"+j.stepID, c.ws.Key, nil); res.Status != http.StatusOK {
			c.fail(g, "read %s: %d %s", j.stepID, res.Status, res.Body)
		}
	default:
		c.checkLimits(g, env)
	}
	return held
}

// superseded says whether a newer claim of h's job was answered before now.
func (c *concurrentJobs) superseded(h cjHeld) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.jobs[h.jobID].latest > h.attempt
}

// checkSuperseded checks that a heartbeat or report with a token a newer
// claim superseded before it was sent is lease_lost (API.md §5).
func (c *concurrentJobs) checkSuperseded(g int, res *apitest.Response, superseded bool, what string, h cjHeld) {
	if superseded && (res.Status != http.StatusConflict || res.ErrorCode() != "lease_lost") {
		c.fail(g, "%s of %s with attempt %d's superseded token: %d %s", what, h.jobID, h.attempt, res.Status, res.Body)
	}
}

// checkFinal reads every step once the goroutines are done.
func (c *concurrentJobs) checkFinal() {
	c.checkLimits(-1, c.envs[0])
	reads := map[string]jmReadStepFull{}
	for _, j := range c.order {
		var st jmReadStepFull
		c.envs[0].Must(http.StatusOK, "GET", "/api/v1/steps/"+j.stepID, c.ws.Key, nil).Decode(c.t, &st)
		reads[j.jobID] = st
		d := st.DurableJob
		if d.Attempt != len(j.grants) || len(d.Attempts) != d.Attempt {
			c.fail(-1, "%s: attempt %d, %d attempts listed, %d granted", j.jobID, d.Attempt, len(d.Attempts), len(j.grants))
			continue
		}
		for i, a := range d.Attempts {
			if a.Attempt != i+1 {
				c.fail(-1, "%s: attempt %d listed %d-th", j.jobID, a.Attempt, i+1)
			}
			if _, ok := j.grants[a.Attempt]; !ok {
				c.fail(-1, "%s: attempt %d was never granted", j.jobID, a.Attempt)
			}
			if i == 0 {
				continue
			}
			prev := d.Attempts[i-1]
			ended := prev.LeaseExpiresAt
			if prev.ReportedAt != nil && prev.ReportedAt.Before(ended) {
				ended = *prev.ReportedAt
			}
			if a.StartedAt.Before(ended) {
				c.fail(-1, "%s: attempt %d started %v while attempt %d held its lease until %v", j.jobID, a.Attempt,
					a.StartedAt, prev.Attempt, ended)
			}
		}
	}
	for _, r := range c.acked {
		d := reads[r.jobID].DurableJob
		if r.attempt > len(d.Attempts) {
			c.fail(-1, "%s: report of attempt %d acknowledged; %d attempts listed", r.jobID, r.attempt, len(d.Attempts))
			continue
		}
		a := d.Attempts[r.attempt-1]
		if a.ReportedAt == nil || a.Outcome == nil || *a.Outcome != r.status {
			c.fail(-1, "%s: report of attempt %d (%s) acknowledged; it reads outcome %s reportedAt %v", r.jobID,
				r.attempt, r.status, fmtPtr(a.Outcome), fmtPtr(a.ReportedAt))
		}
	}
}

// jmReadStepFull is a step read with its attempts' times.
type jmReadStepFull struct {
	DurableJob struct {
		Attempt  int
		Attempts []struct {
			Attempt        int
			Outcome        *string
			StartedAt      time.Time
			LeaseExpiresAt time.Time
			ReportedAt     *time.Time
		}
	}
}

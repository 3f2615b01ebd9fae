package gate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getratchet/ratchet/lib/apitest"
)

// The effect gate's state machine checked against a model: from a seed, a
// random sequence of begins (the same payload or another; with a fresh
// request_id, none, or the one of the key's live lease, as a retry whose
// answer was lost; with a shorter or a longer lease_seconds), reports
// (succeeded, failed, or an outcome the API does not take) and heartbeats
// with the current token, a superseded one or none of the key's, clock
// moves to and past a lease's end, sweeps, resolves (naming an attempt or
// not), approval decisions, policy changes (on_indeterminate, max_attempts)
// and reads, over a handful
// of keys of three effect types (on_indeterminate block with a cost
// ceiling, an approval threshold and a daily budget; retry and probe, each
// with a budget), every answer compared with what a plain Go model of
// API.md §2 and §5 and README "The effect gate" predicts: the decision or
// error code, the state, the attempt, a probe's prior attempt, a
// duplicate's result (and no result with any other decision), a lease's
// end, and each attempt's outcome on the effect's reads and on report's
// and resolve's answers. (A gate report has no retryable flag: a failure
// is known not to have acted, API.md §2.2.) A failure names the seed and
// the trace; MODEL_SEED=<n> replays one seed, MODEL_SEEDS=<n> runs n
// seeds, MODEL_OPS=<n> makes each sequence n operations long (a seed's
// sequence of a given length is a prefix of its longer ones).
//
// Not parallel, nor are its seeds: a sweep (one of the operations) acts on
// every workspace at its own clock, and one at a clock past another run's
// leases would record lapses that run's model has not seen yet (so would
// the package's other tests' sweeps).
func TestGateModelSequential(t *testing.T) {
	runModels(t, "TestGateModelSequential", 8, 100, func() *extRun { return nil })
}

// runModels runs the seeds to run (n by default), one after the other, each
// a sequence of MODEL_OPS (by default ops) operations: the base model's, or,
// when ext makes one, the extended model's.
func runModels(t *testing.T, name string, n, ops int, ext func() *extRun) {
	apitest.ModelRuns(t, n, ops, func(t *testing.T, seed uint64, ops int) { runModel(t, name, seed, ops, ext()) })
}

// mPolicy is one effect type's policy as the model knows it.
type mPolicy struct {
	typ             string
	onIndeterminate string
	maxAttempts     int
	lease           time.Duration
	maxCost         int64  // 0: none
	approvalAbove   int64  // 0: none
	budget          int64  // 0: none
	surgePerHour    int    // 0: none
	surgeAction     string // deny or monitor
	surgeCooldown   int    // seconds
	dimMicros       int64  // the recipient dimension's daily_micros per value (0: none)
	dimCount        int64  // and daily_count (0: none)
}

func (p *mPolicy) body() map[string]any {
	b := map[string]any{"on_indeterminate": p.onIndeterminate, "max_attempts": p.maxAttempts,
		"lease_seconds": int(p.lease / time.Second)}
	if p.maxCost > 0 {
		b["max_cost_micros"] = p.maxCost
	}
	if p.approvalAbove > 0 {
		b["approval_above_micros"] = p.approvalAbove
	}
	if p.budget > 0 {
		b["daily_budget_micros"] = p.budget
	}
	if p.surgePerHour > 0 {
		b["surge_per_hour"], b["surge_action"], b["surge_cooldown_seconds"] = p.surgePerHour, p.surgeAction, p.surgeCooldown
	}
	if p.dimMicros > 0 || p.dimCount > 0 {
		lim := map[string]any{}
		if p.dimMicros > 0 {
			lim["daily_micros"] = p.dimMicros
		}
		if p.dimCount > 0 {
			lim["daily_count"] = p.dimCount
		}
		b["dimension_limits"] = map[string]any{"recipient": lim}
	}
	return b
}

var modelPolicies = []*mPolicy{
	{typ: "mdl.block", onIndeterminate: "block", maxAttempts: 3, lease: 30 * time.Second,
		maxCost: 1000, approvalAbove: 500, budget: 1000},
	{typ: "mdl.retry", onIndeterminate: "retry", maxAttempts: 2, lease: 30 * time.Second, budget: 1500},
	{typ: "mdl.probe", onIndeterminate: "probe", maxAttempts: 3, lease: 30 * time.Second, budget: 450},
}

// mKeySpec is a key of the sequence: its type and declared cost (part of
// the fingerprint, so fixed per key).
type mKeySpec struct {
	pol  *mPolicy
	cost int64
}

var modelKeySpecs = []mKeySpec{
	{modelPolicies[0], 100},  // within every line
	{modelPolicies[0], 400},  // within every line; with the next, over the budget
	{modelPolicies[0], 500},  // at the approval threshold
	{modelPolicies[0], 800},  // above the approval threshold
	{modelPolicies[0], 2000}, // above max_cost_micros (picked less often)
	{modelPolicies[1], 300},
	{modelPolicies[1], 600}, // with the other and two retries, over the budget
	{modelPolicies[2], 200},
	{modelPolicies[2], 300}, // with the other over the budget
}

// mAttempt is one execute grant.
type mAttempt struct {
	token      string
	exp        time.Time
	outcome    string // "" while unknown (live or lapsed), else succeeded | failed
	reported   bool
	probe      bool
	resolved   bool // settled by the operator's resolve
	resolvedAt time.Time
	reportedAt time.Time
	charges    []mCharge // the daily counters it counts on
	day        string    // the UTC day it was granted on
	lease      time.Duration
	request    string // the request_id it was granted to, "" for none
	prior      int    // a probe's prior_attempt
}

// mKey is the model's view of one key's effect.
type mKey struct {
	spec       mKeySpec
	name       string
	exists     bool
	id         string
	state      string // stored state; a lapsed lease reads indeterminate (effState)
	attempt    int
	atts       []*mAttempt
	denial     string
	approvalID string
	approval   string // "" | pending | approved | rejected
	reason     string // why its latest approval was asked for
	variant    int    // the payload the key was first begun with
	result     string // canonical JSON of the recorded result, "" for none
	// Set by the extended model (model_ext_test.go) only.
	group     *mGroup   // the group the key is a step (or a compensation) of
	declares  bool      // a forward step that declared a compensation
	comp      *mKey     // a forward step's compensating effect, once begun
	compOf    *mKey     // the step a compensating effect undoes
	countedAt time.Time // a surge type's key: its latest begin the surge counts
	createdAt time.Time // a surge type's key: its first begin as stamped
	// When a yes last answered each reason (approvals' answers): a
	// breaker's or the stop's only while none holding the type opened or
	// was made stricter since.
	answered map[string]time.Time
	yes      []string // what its latest approval answers, once approved
	// Set by the extended model's limits (model_limits_test.go) only.
	caller string // the API key that begins it: "" for the agent, else a capped one's name
	dim    string // its value of the limited dimension ("" for none declared)
	run    *mRun  // the run it was first begun under (its wallet)
}

type modelRun struct {
	t       *testing.T
	seed    uint64
	rng     *rand.Rand
	env     *apitest.Env
	ws      apitest.Workspace
	agent   string
	clock   *apitest.Clock
	keys    []*mKey
	last    *mKey // the key of the operation before
	pols    []*mPolicy
	spent   map[string]int64 // a daily counter's scope and UTC day (spendKey) -> micros charged
	counts  map[string]int64 // the same -> attempts charged
	trace   *apitest.ModelTrace
	results int
	seen    map[string]int // what the sequence covered: operation and answer
	ops     int
	name    string  // the test, for the replay command
	ext     *extRun // the extended model's state (model_ext_test.go), nil for the base one
}

// runModel runs seed's sequence of ops operations: the base model's, or,
// with ext, the extended one's (groups, breakers, budget days).
func runModel(t *testing.T, name string, seed uint64, ops int, ext *extRun) {
	b := setup(t)
	m := &modelRun{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x6d6f64656c)), env: b.env, ws: b.ws,
		clock: b.clock, spent: map[string]int64{}, counts: map[string]int64{}, seen: map[string]int{}, ops: ops, name: name, ext: ext,
		trace: apitest.NewModelTrace(t, fmt.Sprintf("MODEL_SEED=%d MODEL_OPS=%d go test -run '%s' ./lib/gate", seed, ops, name))}
	m.agent = b.agent()
	// This run's policies: the policy operation changes them.
	pols := map[*mPolicy]*mPolicy{}
	for _, p := range modelPolicies {
		own := *p
		pols[p], m.pols = &own, append(m.pols, &own)
		b.putPolicy(p.typ, p.body())
	}
	for i, spec := range modelKeySpecs {
		spec.pol = pols[spec.pol]
		m.keys = append(m.keys, &mKey{spec: spec, name: fmt.Sprintf("mdl-%d-%d", seed, i)})
	}
	if ext != nil {
		ext.setup(m, b)
	}
	for i := 0; i < ops && !t.Failed(); i++ {
		if ext != nil {
			ext.step(m)
		} else {
			m.step()
		}
	}
	// Every key's effect reads as the model says at the end.
	for _, k := range m.keys {
		if k.exists && !t.Failed() {
			m.read(k)
		}
	}
	t.Logf("covered: %v", m.seen)
}

// fail reports a mismatch with the seed and the trace so far.
func (m *modelRun) fail(format string, args ...any) {
	m.t.Helper()
	m.trace.Fail(format, args...)
}

func (m *modelRun) log(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	m.trace.Add(line)
	if op, answer, ok := strings.Cut(line, " -> "); ok {
		op, rest, _ := strings.Cut(op, " ")
		if _, typ, ok := strings.Cut(rest, "(mdl."); ok {
			typ, _, _ = strings.Cut(typ, " ")
			op += " " + typ
		}
		answer, _, _ = strings.Cut(answer, " state=")
		m.seen[op+" "+strings.TrimSpace(answer)]++
	}
}

func (m *modelRun) now() time.Time { return m.clock.Now() }

// utcDay is the UTC day of t, the day a daily budget counts it on.
func utcDay(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// spendKey names a daily counter (a ceiling's scope, mCeiling) on a UTC day.
func spendKey(scope, day string) string { return scope + " " + day }

// mCharge is what an attempt was charged on one daily counter.
type mCharge struct {
	key    string // spendKey
	micros int64
}

// mCeiling is a daily ceiling on a grant (README "Risk controls and
// circuits": the type's budget, the calling key's ceiling, a dimension
// value's limits), as the gate plans its charges: a counter per scope, a
// grant charged its cost where money is capped and 1 on every counter.
type mCeiling struct {
	scope     string
	label     string // gate_refuse's: the least label of those that do not fit names the denial
	capMicros int64  // 0: none
	capCount  int64  // 0: none
}

// ceilings are the daily ceilings a grant of k is charged on.
func (m *modelRun) ceilings(k *mKey) []mCeiling {
	var cs []mCeiling
	if p := k.spec.pol; p.budget > 0 {
		cs = append(cs, mCeiling{scope: "type:" + p.typ, label: "type", capMicros: p.budget})
	}
	if p := k.spec.pol; p.dimMicros > 0 || p.dimCount > 0 {
		// Each value of the dimension has its own counters.
		cs = append(cs, mCeiling{scope: "dim:" + p.typ + ":recipient:" + k.dim, label: "dim:recipient",
			capMicros: p.dimMicros, capCount: p.dimCount})
	}
	return append(cs, m.ext.ceilings(k)...)
}

// ceilingCode is the denial of a ceiling's label.
func ceilingCode(label string) string {
	switch {
	case label == "type":
		return "budget_exceeded"
	case label == "key":
		return "key_budget_exceeded"
	}
	return "dimension_limit_exceeded"
}

// freeOn says whether a grant now would be a probe that counter scope
// neither checks nor charges: an earlier attempt of unknown outcome was
// charged on it the same UTC day, and already counts the one action the two
// may have taken (README "The effect gate"; a probe on a later day, or by
// another capped key, is charged on that day's or that key's counter).
func (k *mKey) freeOn(scope, es string, now time.Time) bool {
	if es != "indeterminate" || k.spec.pol.onIndeterminate != "probe" {
		return false
	}
	key := spendKey(scope, utcDay(now))
	return slices.ContainsFunc(k.atts, func(a *mAttempt) bool {
		return a.outcome == "" && slices.ContainsFunc(a.charges, func(c mCharge) bool { return c.key == key })
	})
}

// refusedCeiling is the denial of the first daily ceiling (by label) that a
// grant of k now does not fit, "" when all fit; and its detail.
func (m *modelRun) refusedCeiling(k *mKey, es string, now time.Time) (string, map[string]any) {
	label := ""
	for _, c := range m.ceilings(k) {
		key := spendKey(c.scope, utcDay(now))
		fits := (c.capMicros == 0 || m.spent[key]+k.spec.cost <= c.capMicros) && (c.capCount == 0 || m.counts[key]+1 <= c.capCount)
		if !fits && !k.freeOn(c.scope, es, now) && (label == "" || c.label < label) {
			label = c.label
		}
	}
	if label == "" {
		return "", nil
	}
	detail := map[string]any{"resets_at": now.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour).Format(time.RFC3339Nano)}
	if dim, ok := strings.CutPrefix(label, "dim:"); ok {
		detail["dimension"] = dim
	}
	return ceilingCode(label), detail
}

// charge charges a grant of k now on its daily ceilings' counters (none
// where it is a free probe) and answers the charges, for its release.
func (m *modelRun) charge(k *mKey, es string, now time.Time) []mCharge {
	var charges []mCharge
	for _, c := range m.ceilings(k) {
		if k.freeOn(c.scope, es, now) {
			continue
		}
		ch := mCharge{key: spendKey(c.scope, utcDay(now))}
		if c.capMicros > 0 {
			ch.micros = k.spec.cost
		}
		m.spent[ch.key] += ch.micros
		m.counts[ch.key]++
		charges = append(charges, ch)
	}
	return charges
}

// effState is the state as a caller reads it.
func (k *mKey) effState(now time.Time) string {
	if k.state == "leased" && !k.atts[len(k.atts)-1].exp.After(now) {
		return "indeterminate"
	}
	return k.state
}

// latestUnknown is the latest attempt whose outcome is unknown, 0 for none.
func (k *mKey) latestUnknown() int {
	for i := len(k.atts) - 1; i >= 0; i-- {
		if k.atts[i].outcome == "" {
			return i + 1
		}
	}
	return 0
}

func (m *modelRun) step() {
	// Half the operations stay on the key before, so that one key's
	// history runs deep (a lapse, a retry, its report, a resolve) within
	// a short sequence.
	k := m.last
	if k == nil || m.rng.IntN(2) == 0 {
		k = m.keys[m.rng.IntN(len(m.keys))]
		if k.spec.cost > k.spec.pol.maxCost && k.spec.pol.maxCost > 0 && m.rng.IntN(4) != 0 {
			k = m.keys[m.rng.IntN(len(m.keys))] // every answer of that key is the same
		}
	}
	m.last = k
	switch r := m.rng.IntN(100); {
	case r < 30:
		m.beginWith(k, m.beginOptions(k, m.rng.IntN(12) == 0))
	case r < 50:
		m.reportOp(k)
	case r < 60:
		m.heartbeatOp(k)
	case r < 72:
		// Past a lease, to its very end (a lease lapses at its
		// lease_expires_at), or a part of it.
		d := []time.Duration{31 * time.Second, 30 * time.Second, 10 * time.Second}[m.rng.IntN(3)]
		m.clock.Add(d)
		m.log("clock +%s", d)
	case r < 74:
		// The sweeper makes lapses durable: nothing reads otherwise.
		res := m.env.App.Sweeper.RunOnce(context.Background())
		m.log("sweep -> %v", res.Error())
		if res.Error() != nil {
			m.fail("sweep: %v", res.Error())
		}
		m.ext.afterSweep()
	case r < 82:
		m.resolve(k, []string{"succeeded", "failed"}[m.rng.IntN(2)])
	case r < 85:
		m.policy(m.pols[m.rng.IntN(len(m.pols))])
	case r < 93:
		// An approval of any key that has one (a key without one begins).
		var asked []*mKey
		for _, k := range m.keys {
			if k.approvalID != "" {
				asked = append(asked, k)
			}
		}
		if len(asked) > 0 {
			k = asked[m.rng.IntN(len(asked))]
		}
		m.decide(k, []string{"approve", "approve", "reject"}[m.rng.IntN(3)])
	default:
		if k.exists {
			m.read(k)
		} else {
			m.begin(k, false)
		}
	}
}

// policy changes a type's on_indeterminate and max_attempts, which apply
// to the keys begun before as well (README: except that
// max_attempts_exceeded and approval_rejected stay final for a key).
func (m *modelRun) policy(p *mPolicy) {
	p.onIndeterminate = []string{"block", "retry", "probe"}[m.rng.IntN(3)]
	p.maxAttempts = 2 + m.rng.IntN(2)
	r := m.env.Do("PUT", "/api/v1/policies/"+p.typ, m.ws.Key,
		map[string]any{"on_indeterminate": p.onIndeterminate, "max_attempts": p.maxAttempts})
	m.log("policy %s on_indeterminate=%s max_attempts=%d -> %d", p.typ, p.onIndeterminate, p.maxAttempts, r.Status)
	if r.Status != http.StatusOK {
		m.fail("policy %s: %d: %s", p.typ, r.Status, r.Body)
	}
}

// mBegin is how a begin is sent: with the key's payload or another, a
// request_id (none, a fresh one, or that of the request the key's latest
// attempt was granted to: a retry whose answer was lost), and a shorter
// lease than the policy's, or a longer one (capped).
type mBegin struct {
	other   bool
	request string
	lease   int // seconds, 0 for none
	// A group step's begin (model_ext_test.go): another group's id than
	// the step's, or "-" for none.
	group string
	// A begin of a key begun before (model_limits_test.go): another run's
	// id than the key's, or "-" for none.
	run string
}

func (m *modelRun) beginOptions(k *mKey, other bool) mBegin {
	o := mBegin{other: other}
	switch m.rng.IntN(3) {
	case 0:
		o.request = fmt.Sprintf("req-%d-%016x", m.seed, m.rng.Uint64())
	case 1:
		if n := len(k.atts); n > 0 && k.atts[n-1].request != "" {
			o.request = k.atts[n-1].request
		}
	}
	switch m.rng.IntN(6) {
	case 0:
		o.lease = 10
	case 1:
		o.lease = 60
	}
	return o
}

func (m *modelRun) beginBody(k *mKey, o mBegin) map[string]any {
	v := k.variant
	if o.other {
		v = 1 - v
	}
	payload := map[string]any{"key": k.name, "v": v}
	body := map[string]any{"effect_type": k.spec.pol.typ, "idempotency_key": k.name, "payload": payload,
		"cost_micros": k.spec.cost}
	if o.request != "" {
		body["request_id"] = o.request
	}
	if o.lease > 0 {
		body["lease_seconds"] = o.lease
	}
	m.ext.beginBody(k, o, body)
	return body
}

// mAnswer is what the model predicts for begin.
type mAnswer struct {
	status   int
	code     string // error code, for a denial or a refusal
	decision string
	state    string
	attempt  int
	prior    int // prior_attempt.attempt, for blocked and a probe
	probe    bool
	result   string
	approval string
	retry    int // in_flight's retry_after_seconds
	rejoin   *mAttempt
	counted  bool // the surge counts the key's begin (a new key, or an arrival)
	trips    bool // the begin trips the type's surge breaker
	// When the require_approval hold on the key's type (a breaker or the
	// stop) last opened or was made stricter, as this begin leaves it
	// (zero: no such hold): a yes given before it does not answer it.
	hold time.Time
	// Why a new approval is asked for (approvals.reason).
	reason string
	// A ceiling's or a wallet's denial: its detail.
	detail map[string]any
}

func (m *modelRun) begin(k *mKey, otherPayload bool) { m.beginWith(k, mBegin{other: otherPayload}) }

func (m *modelRun) beginWith(k *mKey, o mBegin) {
	otherPayload := o.other
	now := m.now()
	want := m.predictBegin(k, o, now)
	r := m.env.Do("POST", "/api/v1/effects/begin", m.ext.caller(k, m.agent), m.beginBody(k, o))
	got := r.JSON()
	decision := str(got["decision"])
	if got["probe"] == true {
		decision += " (probe)"
	}
	m.log("begin %s (%s cost %d other=%v request=%q lease=%d) -> %d %s %s state=%v attempt=%v", k.name,
		k.spec.pol.typ, k.spec.cost, otherPayload, o.request, o.lease, r.Status, decision, r.ErrorCode(), got["state"], got["attempt"])
	if r.Status != want.status || r.ErrorCode() != want.code {
		m.fail("begin %s: status %d %q, model %d %q: %s", k.name, r.Status, r.ErrorCode(), want.status, want.code, r.Body)
		return
	}
	if want.decision == "" {
		return // a refusal: nothing changed
	}
	var body struct {
		Decision     string     `json:"decision"`
		EffectID     string     `json:"effect_id"`
		State        string     `json:"state"`
		Attempt      int        `json:"attempt"`
		LeaseToken   string     `json:"lease_token"`
		LeaseExpires *time.Time `json:"lease_expires_at"`
		Probe        *bool      `json:"probe"`
		Prior        *struct {
			Attempt        int
			LeaseExpiredAt time.Time `json:"lease_expired_at"`
		} `json:"prior_attempt"`
		Error *struct {
			Detail map[string]any
		}
		Result     json.RawMessage `json:"result"`
		Retry      *int            `json:"retry_after_seconds"`
		ApprovalID string          `json:"approval_id"`
	}
	if err := json.Unmarshal(r.Body, &body); err != nil {
		m.fail("begin %s: %v: %s", k.name, err, r.Body)
		return
	}
	if !slices.Contains([]string{"execute", "duplicate", "in_flight", "blocked", "approval_required", "denied"},
		body.Decision) {
		m.fail("begin %s: decision %q is none API.md names", k.name, body.Decision)
		return
	}
	if k.id != "" && body.EffectID != k.id {
		m.fail("begin %s: effect_id %s, model %s", k.name, body.EffectID, k.id)
		return
	}
	prior := 0
	if body.Prior != nil {
		prior = body.Prior.Attempt
	}
	probe := body.Probe != nil && *body.Probe
	if body.Decision != want.decision || body.State != want.state || body.Attempt != want.attempt ||
		prior != want.prior || probe != want.probe {
		m.fail("begin %s: %s state=%s attempt=%d prior=%d probe=%v, model %s state=%s attempt=%d prior=%d probe=%v: %s",
			k.name, body.Decision, body.State, body.Attempt, prior, probe,
			want.decision, want.state, want.attempt, want.prior, want.probe, r.Body)
		return
	}
	// prior_attempt names the unknown attempt and when its lease ended;
	// max_attempts_exceeded, the attempts used.
	if body.Prior != nil && prior >= 1 && prior <= len(k.atts) && !body.Prior.LeaseExpiredAt.Equal(k.atts[prior-1].exp) {
		m.fail("begin %s: prior_attempt's lease_expired_at %v, model %v", k.name, body.Prior.LeaseExpiredAt,
			k.atts[prior-1].exp)
		return
	}
	if want.code == "circuit_open" && body.Error != nil {
		defer m.ext.checkCircuitDenial(k, body.Error.Detail) // with the breaker the begin tripped
	}
	if want.detail != nil && (body.Error == nil || fmt.Sprint(normDetail(body.Error.Detail)) != fmt.Sprint(want.detail)) {
		m.fail("begin %s: %s detail %v, model %v", k.name, want.code, body.Error, want.detail)
		return
	}
	if want.code == "max_attempts_exceeded" && (body.Error == nil || body.Error.Detail["attempts"] != float64(k.attempt)) {
		m.fail("begin %s: max_attempts_exceeded without detail.attempts %d: %s", k.name, k.attempt, r.Body)
		return
	}
	// A result comes with a duplicate only, and it is the recorded one.
	if (body.Result != nil) != (body.Decision == "duplicate") {
		m.fail("begin %s: %s with result %s", k.name, body.Decision, body.Result)
		return
	}
	if body.Decision == "duplicate" && apitest.Canonical(body.Result) != want.result {
		m.fail("begin %s: duplicate's result %s, model %s", k.name, body.Result, want.result)
		return
	}
	if (body.LeaseToken != "") != (body.Decision == "execute") || (body.Probe != nil) != (body.Decision == "execute") {
		m.fail("begin %s: %s with lease_token %q probe %v", k.name, body.Decision, body.LeaseToken, body.Probe)
		return
	}
	if body.Decision == "in_flight" && (body.Retry == nil || *body.Retry != want.retry) {
		m.fail("begin %s: in_flight retry_after_seconds %v, model %d", k.name, body.Retry, want.retry)
		return
	}
	if body.Decision == "approval_required" && (body.ApprovalID == "" || want.approval != "" && body.ApprovalID != want.approval) {
		m.fail("begin %s: approval_id %q, model %q", k.name, body.ApprovalID, want.approval)
		return
	}
	if want.rejoin != nil {
		if body.LeaseToken != want.rejoin.token || body.LeaseExpires == nil || !body.LeaseExpires.Equal(want.rejoin.exp) {
			m.fail("begin %s: rejoined with token %q expiring %v, model %q expiring %v", k.name, body.LeaseToken,
				body.LeaseExpires, want.rejoin.token, want.rejoin.exp)
		}
		return
	}
	m.applyBegin(k, o, want, body.EffectID, body.LeaseToken, body.ApprovalID, body.LeaseExpires, now)
}

// predictBegin is API.md §2.1's decision for the key as the model holds it.
func (m *modelRun) predictBegin(k *mKey, o mBegin, now time.Time) mAnswer {
	if a, refused := m.ext.admit(k, o, now); refused {
		return a // a group's refusal: before anything else
	}
	if k.exists && o.other {
		return mAnswer{status: http.StatusConflict, code: "idempotency_key_reuse"}
	}
	pol := k.spec.pol
	es := k.effState(now)
	a := mAnswer{status: http.StatusOK, state: es, attempt: k.attempt}
	if k.exists {
		switch es {
		case "succeeded":
			a.decision, a.result = "duplicate", k.result
			return a
		case "leased":
			live := k.atts[len(k.atts)-1]
			if o.request != "" && o.request == live.request {
				// The same request again, its answer lost: the same execute.
				a.decision, a.probe, a.prior, a.rejoin = "execute", live.probe, live.prior, live
				return a
			}
			a.decision = "in_flight"
			a.retry = int(math.Ceil(live.exp.Sub(now).Seconds()))
			return a
		case "awaiting_approval":
			if refusal, refused := m.ext.admitAttempt(k); refused && k.approval == "pending" {
				return refusal // its approval can no longer be given
			}
			if k.approval == "pending" {
				a.decision, a.approval = "approval_required", k.approvalID
				return a
			}
		case "denied":
			if k.denial == "approval_rejected" || k.denial == "max_attempts_exceeded" {
				return deniedAnswer(a, k.denial)
			}
		case "indeterminate":
			if pol.onIndeterminate == "block" {
				a.decision, a.prior = "blocked", k.latestUnknown()
				return a
			}
		}
	}
	// A transition: the key is new, or its state allows another try.
	if refusal, refused := m.ext.admitAttempt(k); refused {
		return refusal
	}
	circuit := m.ext.circuit(k, es, now, &a)
	stays := es // the state a refusal leaves
	if es != "indeterminate" {
		stays = "denied"
	}
	refuse := func(code string) mAnswer {
		a.state = stays
		return deniedAnswer(a, code)
	}
	switch {
	case k.approval == "pending":
		a.decision, a.approval = "approval_required", k.approvalID
		return a
	case k.attempt >= pol.maxAttempts || k.denial == "max_attempts_exceeded":
		return refuse("max_attempts_exceeded")
	case k.approval == "rejected":
		return refuse("approval_rejected")
	case pol.maxCost > 0 && k.spec.cost > pol.maxCost:
		return refuse("cost_ceiling_exceeded")
	case circuit != "" && circuit != circuitApproval:
		// A deny breaker or stop refuses before any question is asked
		// (gate_evaluate: the strictest rule first).
		return refuse(circuit)
	}
	if reason := k.approvalNeeded(circuit == circuitApproval, a.hold); reason != "" {
		if refusal, refused := m.ext.admitGrant(k); refused {
			return refusal // an ended rollback's compensation is asked no approval
		}
		if k.approval == "approved" {
			m.seen["asked again after a yes: "+reason]++
		}
		a.decision, a.reason = "approval_required", reason
		if es != "indeterminate" {
			a.state = "awaiting_approval"
		}
		return a
	}
	if code, detail := m.refusedSpend(k, es, now); code != "" {
		a.detail = detail
		return refuse(code)
	}
	if refusal, refused := m.ext.admitGrant(k); refused {
		return refusal
	}
	a.decision, a.state, a.attempt = "execute", "leased", k.attempt+1
	if es == "indeterminate" && pol.onIndeterminate == "probe" {
		a.probe, a.prior = true, k.latestUnknown()
	}
	return a
}

// Why a key's begin may need an operator's yes, in the order an approval
// names the first (README "Approvals").
const (
	reasonCircuit = "circuit_open"
	reasonAmount  = "cost_at_or_above_threshold"
)

// approvalNeeded is the question a begin of k asks, "" for none: the first
// of the reasons that hold (a require_approval breaker or stop, whose hold
// last opened or was made stricter at hold; an amount at or above the
// threshold) that no yes answers. A yes answers a breaker's or the stop's
// question only when given since its hold (README: one opened or made
// stricter after it asks again); an amount's for good.
func (k *mKey) approvalNeeded(circuit bool, hold time.Time) string {
	var needed []string
	if circuit {
		needed = append(needed, reasonCircuit)
	}
	if p := k.spec.pol; p.approvalAbove > 0 && k.spec.cost >= p.approvalAbove {
		needed = append(needed, reasonAmount)
	}
	for _, r := range needed {
		at, ok := k.answered[r]
		if k.approval != "approved" || !ok || r == reasonCircuit && hold.After(at) {
			return r
		}
	}
	return ""
}

// refusedSpend is the refusal of a grant of k that does not fit what is
// left to spend, "" when it fits, and its detail: the run's wallet first (a
// probe adds nothing to it), then the daily ceilings.
func (m *modelRun) refusedSpend(k *mKey, es string, now time.Time) (string, map[string]any) {
	probe := es == "indeterminate" && k.spec.pol.onIndeterminate == "probe"
	if detail := m.ext.refusedWallet(k, probe); detail != nil {
		return "run_budget_exceeded", detail
	}
	return m.refusedCeiling(k, es, now)
}

func deniedAnswer(a mAnswer, code string) mAnswer {
	a.status, a.code, a.decision = http.StatusForbidden, code, "denied"
	return a
}

func (m *modelRun) applyBegin(k *mKey, o mBegin, want mAnswer, id, token, approvalID string, exp *time.Time, now time.Time) {
	if !k.exists && o.other {
		k.variant = 1 // this key's payload from now on
	}
	now = m.ext.applyBegin(k, want, now)
	es := k.effState(now)
	k.exists, k.id = true, id
	k.state = want.state
	switch want.decision {
	case "execute":
		// A shorter lease asked for is honoured, a longer one capped.
		lease := k.spec.pol.lease
		if asked := time.Duration(o.lease) * time.Second; asked > 0 && asked < lease {
			lease = asked
		}
		if exp == nil || !exp.Equal(now.Add(lease)) {
			m.fail("begin %s: lease_expires_at %v, model %v", k.name, exp, now.Add(lease))
			return
		}
		charges := m.charge(k, es, now) // none where the type has no ceiling
		if want.probe && len(charges) > 0 && slices.ContainsFunc(k.atts, func(a *mAttempt) bool {
			return a.outcome == "" && len(a.charges) > 0
		}) {
			m.seen["probe charged again (a later day, or another counter)"]++
		}
		k.attempt = want.attempt
		k.denial = ""
		k.atts = append(k.atts, &mAttempt{token: token, exp: *exp, probe: want.probe, charges: charges,
			day: utcDay(now), lease: lease, request: o.request, prior: want.prior})
	case "approval_required":
		if k.approval != "pending" {
			// Asked anew: the effect awaits a decision, no longer denied
			// (a key a budget refused, then held by a breaker's question).
			k.approvalID, k.approval, k.denial, k.reason = approvalID, "pending", "", want.reason
			m.checkApproval(k, "the approval asked")
		}
	case "denied":
		k.denial = want.code
	}
}

// reportOp reports with one of the key's tokens (usually the current one),
// or with a token that is none of the key's.
func (m *modelRun) reportOp(k *mKey) {
	if !k.exists || len(k.atts) == 0 {
		m.begin(k, false)
		return
	}
	outcome := []string{"succeeded", "failed"}[m.rng.IntN(2)]
	if m.rng.IntN(15) == 0 {
		outcome = "indeterminate" // not an outcome a report takes
	}
	i := len(k.atts) - 1
	if m.rng.IntN(4) == 0 {
		i = m.rng.IntN(len(k.atts))
	}
	token := k.atts[i].token
	if m.rng.IntN(20) == 0 {
		i, token = -1, "not-a-token-of-this-effect-"+strconv.Itoa(m.rng.IntN(1000))
	}
	m.report(k, i, token, outcome)
}

// report reports outcome with token, the token of attempt i+1 (i < 0: of
// none of the key's attempts).
func (m *modelRun) report(k *mKey, i int, token, outcome string) {
	now := m.now()
	status, code := m.predictReport(k, i, outcome, now)
	m.results++
	result := map[string]any{"n": m.results}
	body := map[string]any{"lease_token": token, "outcome": outcome}
	if outcome == "succeeded" {
		body["result"] = result
	}
	r := m.env.Do("POST", "/api/v1/effects/"+k.id+"/report", m.agent, body)
	m.log("report %s token of attempt %d %s -> %d %s", k.name, i+1, outcome, r.Status, r.ErrorCode())
	if r.Status != status || r.ErrorCode() != code {
		m.fail("report %s attempt %d %s: %d %q, model %d %q: %s", k.name, i+1, outcome, r.Status, r.ErrorCode(),
			status, code, r.Body)
		return
	}
	if status == http.StatusOK {
		defer m.ext.afterStep(k) // a report that answers settles the key's group
	}
	if code == "lease_lost" {
		m.checkLeaseLost(k, i, r, "report")
	}
	if status != http.StatusOK || k.atts[i].reported {
		if status == http.StatusOK {
			m.checkEffect(k, r.JSON(), "report's answer")
		}
		return
	}
	m.applyReport(k, i, outcome, apitest.CanonicalOf(result))
	m.checkEffect(k, r.JSON(), "report's answer")
}

// checkLeaseLost checks lease_lost's detail (README "Honest outcomes"): a
// superseded token's attempt and, when that attempt was reported, its
// outcome; nothing for a token of no attempt.
func (m *modelRun) checkLeaseLost(k *mKey, i int, r *apitest.Response, what string) {
	want := map[string]any{}
	if i >= 0 {
		want["attempt"] = float64(i + 1)
		if a := k.atts[i]; a.reported {
			want["reported_outcome"] = a.outcome
		}
	}
	got, _ := r.JSON()["error"].(map[string]any)["detail"].(map[string]any)
	if got == nil {
		got = map[string]any{}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		m.fail("%s %s: lease_lost detail %v, model %v", what, k.name, got, want)
	}
}

// predictReport is API.md §2.2 and §5's answer to a report with the token of
// attempt i+1 (i < 0: a token of no attempt).
func (m *modelRun) predictReport(k *mKey, i int, outcome string, now time.Time) (int, string) {
	switch {
	case outcome != "succeeded" && outcome != "failed":
		return http.StatusBadRequest, "invalid_request"
	case i < 0 || i+1 < k.attempt:
		return http.StatusConflict, "lease_lost"
	}
	a := k.atts[i]
	switch {
	case a.reported && a.outcome == outcome:
		return http.StatusOK, ""
	case a.reported:
		return http.StatusConflict, "invalid_state"
	case a.outcome != "" || k.effState(now) == "indeterminate":
		return http.StatusConflict, "lease_expired"
	case k.state == "leased":
		return http.StatusOK, ""
	}
	return http.StatusConflict, "invalid_state"
}

func (m *modelRun) applyReport(k *mKey, i int, outcome, result string) {
	a := k.atts[i]
	a.outcome, a.reported, a.reportedAt = outcome, true, m.now()
	if outcome == "succeeded" {
		k.state, k.result = "succeeded", result
		return
	}
	m.release(k, a)
	k.state = "failed"
	for _, earlier := range k.atts[:i] {
		if earlier.outcome != "" {
			continue
		}
		switch {
		case a.probe: // whatever the policy says by now
			// The probe's holder checked the vendor: the unknown attempt
			// before it did not act either.
			earlier.outcome = "failed"
			m.release(k, earlier)
		default:
			// A retry reported failed says nothing of the unknown attempt.
			k.state = "indeterminate"
		}
	}
}

// release gives back what attempt a was charged on its daily counters.
func (m *modelRun) release(k *mKey, a *mAttempt) {
	if len(a.charges) > 0 && a.day != utcDay(m.now()) {
		m.seen["release of an earlier day's charge"]++
	}
	for _, c := range a.charges {
		m.spent[c.key] -= c.micros
		m.counts[c.key]--
	}
	a.charges = nil
}

func (m *modelRun) heartbeatOp(k *mKey) {
	if !k.exists || len(k.atts) == 0 {
		m.begin(k, false)
		return
	}
	// The current token, or one of the key's superseded ones (a
	// heartbeat of a holder that lost its lease), or none of its.
	i := len(k.atts) - 1
	if m.rng.IntN(2) == 0 {
		i = m.rng.IntN(len(k.atts))
	}
	token := ""
	if m.rng.IntN(10) == 0 {
		i, token = -1, "not-a-token-of-this-effect-"+strconv.Itoa(m.rng.IntN(1000))
	}
	now := m.now()
	var (
		status int
		code   string
	)
	switch {
	case i < 0 || i+1 < k.attempt:
		status, code = http.StatusConflict, "lease_lost"
	case k.atts[i].reported:
		status, code = http.StatusConflict, "invalid_state"
	case k.atts[i].outcome != "" || k.effState(now) == "indeterminate":
		status, code = http.StatusConflict, "lease_expired"
	case k.state == "leased":
		status, code = http.StatusOK, ""
	default:
		status, code = http.StatusConflict, "invalid_state"
	}
	if i >= 0 {
		token = k.atts[i].token
	}
	r := m.env.Do("POST", "/api/v1/effects/"+k.id+"/heartbeat", m.agent, map[string]any{"lease_token": token})
	m.log("heartbeat %s token of attempt %d -> %d %s", k.name, i+1, r.Status, r.ErrorCode())
	if r.Status != status || r.ErrorCode() != code {
		m.fail("heartbeat %s attempt %d: %d %q, model %d %q: %s", k.name, i+1, r.Status, r.ErrorCode(), status, code, r.Body)
		return
	}
	if code == "lease_lost" {
		m.checkLeaseLost(k, i, r, "heartbeat")
	}
	if status != http.StatusOK {
		return
	}
	a := k.atts[i]
	if ext := now.Add(a.lease); ext.After(a.exp) {
		a.exp = ext
	}
	var hb struct {
		LeaseExpiresAt time.Time `json:"lease_expires_at"`
	}
	_ = json.Unmarshal(r.Body, &hb)
	if !hb.LeaseExpiresAt.Equal(a.exp) {
		m.fail("heartbeat %s: lease_expires_at %v, model %v", k.name, hb.LeaseExpiresAt, a.exp)
	}
}

func (m *modelRun) resolve(k *mKey, outcome string) {
	if !k.exists {
		m.begin(k, false)
		return
	}
	now := m.now()
	es := k.effState(now)
	// Half the resolves name an attempt (README: it then applies only to
	// the latest unknown one): that one, or any of the key's, or the next.
	named := 0
	switch m.rng.IntN(4) {
	case 0:
		named = k.latestUnknown()
	case 1:
		named = 1 + m.rng.IntN(len(k.atts)+1)
	}
	status, code := http.StatusOK, ""
	resolved := 0   // the latest attempt the operator resolved so, when refused
	unresolved := 0 // the unknown attempt a refused resolve naming another names
	// resolvedSo: the operator resolved attempt i so (only the named one,
	// when one is named).
	resolvedSo := func(i int, a *mAttempt) bool {
		return a.resolved && a.outcome == outcome && (named == 0 || named == i+1)
	}
	if es == "indeterminate" && named != 0 && named != k.latestUnknown() {
		status, code, unresolved = http.StatusConflict, "invalid_state", k.latestUnknown()
		for i, a := range k.atts {
			if resolvedSo(i, a) {
				resolved = i + 1
			}
		}
	}
	if es != "indeterminate" {
		// Only a repeat of the operator's own resolve answers 200, and only
		// while the key was not begun again after it (README: then it is
		// 409 invalid_state naming the attempt it resolved).
		for i, a := range k.atts {
			if resolvedSo(i, a) {
				resolved = i + 1
			}
		}
		// Begun again: a later attempt not reported by the resolve (a
		// retry reported failed before it is no new begin; at one instant
		// of the clock, as the gate, the model takes it for one).
		begun := resolved > 0 && slices.ContainsFunc(k.atts[resolved:], func(a *mAttempt) bool {
			return !a.reported || a.reportedAt.After(k.atts[resolved-1].resolvedAt)
		})
		if resolved == 0 || begun || es != outcome {
			status, code = http.StatusConflict, "invalid_state"
		}
	}
	m.results++
	result := map[string]any{"resolved": m.results}
	body := map[string]any{"outcome": outcome, "note": "model"}
	if outcome == "succeeded" {
		body["result"] = result
	}
	if named != 0 {
		body["attempt"] = named
	}
	r := m.env.Do("POST", "/api/v1/effects/"+k.id+"/resolve", m.ws.Key, body)
	m.log("resolve %s %s attempt %d -> %d %s", k.name, outcome, named, r.Status, r.ErrorCode())
	if r.Status != status || r.ErrorCode() != code {
		m.fail("resolve %s %s attempt %d: %d %q, model %d %q: %s", k.name, outcome, named, r.Status, r.ErrorCode(),
			status, code, r.Body)
		return
	}
	if status == http.StatusOK {
		defer m.ext.afterStep(k) // so does a resolve
	}
	if status != http.StatusOK {
		// The refusal names the state and, when this key had resolved the
		// effect (the named attempt) so, the attempt it resolved; naming
		// another attempt than the unknown one, that one (README).
		want := map[string]any{"state": es}
		if resolved > 0 {
			want["attempt"], want["resolved_outcome"] = float64(resolved), outcome
		}
		if unresolved > 0 {
			want["unresolved_attempt"] = float64(unresolved)
		}
		if got := r.JSON()["error"].(map[string]any)["detail"]; fmt.Sprint(got) != fmt.Sprint(want) {
			m.fail("resolve %s %s: detail %v, model %v", k.name, outcome, got, want)
		}
		return
	}
	if es != "indeterminate" {
		m.checkEffect(k, r.JSON(), "resolve's answer")
		return
	}
	for _, a := range k.atts {
		if a.outcome == "" {
			a.outcome, a.resolved, a.resolvedAt = outcome, true, now
			if outcome == "failed" {
				m.release(k, a)
			}
		}
	}
	k.state = outcome
	if outcome == "succeeded" {
		k.result = apitest.CanonicalOf(result)
		if k.approval == "pending" {
			// Nothing is left to approve (README "Approvals"): the
			// resolution closes the retry's pending approval as rejected.
			k.approval = "rejected"
		}
	}
	// A refused retry's code says nothing once the outcome is known, except
	// max_attempts_exceeded after a failure, which still answers the key
	// (README: final for the key; approval_rejected is kept by the approval).
	if outcome != "failed" || k.denial != "max_attempts_exceeded" {
		k.denial = ""
	}
	m.checkEffect(k, r.JSON(), "resolve's answer")
}

func (m *modelRun) decide(k *mKey, verb string) {
	if k.approvalID == "" {
		m.begin(k, false)
		return
	}
	want := map[string]string{"approve": "approved", "reject": "rejected"}[verb]
	status, code := http.StatusOK, ""
	switch {
	case k.approval != "pending" && k.approval != want:
		status, code = http.StatusConflict, "invalid_state"
	case k.approval == "pending" && want == "approved" && m.ext.rolledBack(k):
		status, code = http.StatusConflict, "group_unwinding"
	}
	r := m.env.Do("POST", "/api/v1/approvals/"+k.approvalID+"/"+verb, m.ws.Key, map[string]any{"note": "model"})
	m.log("%s %s's approval -> %d %s", verb, k.name, r.Status, r.ErrorCode())
	if r.Status != status || r.ErrorCode() != code {
		m.fail("%s %s: %d %q, model %d %q: %s", verb, k.name, r.Status, r.ErrorCode(), status, code, r.Body)
		return
	}
	if status != http.StatusOK {
		return
	}
	if got := str(r.JSON()["state"]); got != want {
		m.fail("%s %s: approval reads %s", verb, k.name, got)
		return
	}
	// An approval answers the reason it was asked for and every other that
	// holds as it is given.
	// holds as it is given (a repeat answers what the yes recorded).
	answers := m.answers(k)
	if k.approval == "approved" {
		answers = k.yes
	}
	wantAnswers := "<nil>"
	if want == "approved" && k.approval != "rejected" {
		wantAnswers = fmt.Sprint(answers)
	}
	if got := fmt.Sprint(r.JSON()["answers"]); got != wantAnswers || r.JSON()["reason"] != k.reason {
		m.fail("%s %s: approval reason %v answers %s, model %s %s", verb, k.name, r.JSON()["reason"], got, k.reason, wantAnswers)
		return
	}
	if want == "rejected" {
		defer m.ext.afterStep(k) // a rejection may end the key's group's rollback
	}
	if k.approval == "pending" {
		k.approval = want
		if want == "approved" {
			if k.answered == nil {
				k.answered = map[string]time.Time{}
			}
			for _, r := range answers {
				k.answered[r] = m.now()
			}
			k.yes = answers
		}
		if want == "rejected" && k.state == "awaiting_approval" {
			// A key that waited indeterminate (or whose outcome was
			// resolved since it was asked) keeps its state and denial
			// code: its next begin answers approval_rejected.
			k.state, k.denial = "denied", "approval_rejected"
		}
	}
}

// answers is what a yes to k's pending approval now answers, in the order
// the gate lists them: the reason it was asked for, a require_approval
// breaker or stop holding the type, an amount at or above the threshold.
func (m *modelRun) answers(k *mKey) []string {
	var out []string
	for _, r := range []string{reasonCircuit, reasonAmount} {
		holds := r == k.reason
		switch p := k.spec.pol; {
		case r == reasonCircuit:
			holds = holds || m.ext.holds(k, m.now())
		default:
			holds = holds || p.approvalAbove > 0 && k.spec.cost >= p.approvalAbove
		}
		if holds {
			out = append(out, r)
		}
	}
	return out
}

// checkApproval reads k's approval and compares its reason with the
// model's (README "Approvals").
func (m *modelRun) checkApproval(k *mKey, what string) {
	r := m.env.Do("GET", "/api/v1/approvals/"+k.approvalID, m.ws.Key, nil)
	if r.Status != http.StatusOK || r.JSON()["reason"] != k.reason || r.JSON()["state"] != "pending" {
		m.fail("%s of %s: %d reason %v state %v, model %s pending: %s", what, k.name, r.Status, r.JSON()["reason"],
			r.JSON()["state"], k.reason, r.Body)
	}
}

func (m *modelRun) read(k *mKey) {
	r := m.env.Do("GET", "/api/v1/effects/"+k.id, m.ws.Key, nil)
	m.log("read %s -> %d state=%v attempt=%v", k.name, r.Status, r.JSON()["state"], r.JSON()["attempt"])
	if r.Status != http.StatusOK {
		m.fail("read %s: %d: %s", k.name, r.Status, r.Body)
		return
	}
	m.checkEffect(k, r.JSON(), "read")
}

// checkEffect compares an effect object (a read, a report's or a resolve's
// answer) with the model: its state, attempt, denial code, result, and
// each attempt's outcome and probe flag.
func (m *modelRun) checkEffect(k *mKey, e map[string]any, what string) {
	m.t.Helper()
	now := m.now()
	var got []string
	for _, a := range e["attempts"].([]any) {
		a := a.(map[string]any)
		got = append(got, fmt.Sprintf("%v:%v:%v", a["attempt"], a["outcome"], a["probe"]))
	}
	var want []string
	for i, a := range k.atts {
		outcome := a.outcome
		switch {
		case outcome == "" && !a.exp.After(now):
			outcome = "indeterminate"
		case outcome == "":
			outcome = "<nil>"
		}
		want = append(want, fmt.Sprintf("%d:%s:%v", i+1, outcome, a.probe))
	}
	denial := "<nil>"
	if k.denial != "" {
		denial = k.denial
	}
	result := ""
	if e["result"] != nil {
		raw, _ := json.Marshal(e["result"])
		result = apitest.Canonical(raw)
	}
	wantResult := ""
	if k.effState(now) == "succeeded" {
		wantResult = k.result
	}
	if str(e["state"]) != k.effState(now) || e["attempt"] != float64(k.attempt) || str(e["denial_code"]) != denial ||
		!slices.Equal(got, want) || result != wantResult {
		m.fail("%s of %s: state=%v attempt=%v denial=%v attempts=%v result=%s, model state=%s attempt=%d denial=%s attempts=%v result=%s",
			what, k.name, e["state"], e["attempt"], e["denial_code"], got, result,
			k.effState(now), k.attempt, denial, want, wantResult)
	}
}

// TestGateModelConcurrent runs random operations from several goroutines
// at once on the same few keys (some begun by a capped key, naming a run
// with a wallet, of a dimension-limited type: model_limits_test.go),
// through two instances on one clock, and checks what holds whatever the
// interleaving: no wallet or daily ceiling admits past what fits; every answer is one API.md
// names; a key's execute grants are numbered 1, 2, … once each, never past
// max_attempts, and each begins only after the one before it ended
// (reported, or its lease lapsed): at most one live lease per key; no
// begin sent after a success was recorded is granted execute, and no
// attempt follows a succeeded one; a report or heartbeat with a token a
// newer grant superseded before it was sent is lease_lost. The seed fixes
// each goroutine's operations, not their interleaving; MODEL_SEED,
// MODEL_SEEDS and MODEL_OPS (each goroutine's) work as for
// TestGateModelSequential.
func TestGateModelConcurrent(t *testing.T) {
	apitest.ModelRuns(t, 3, 40, func(t *testing.T, seed uint64, ops int) {
		t.Parallel()
		runConcurrentModel(t, seed, 4, ops)
	})
}

// cKey is what the concurrent run knows of one key.
type cKey struct {
	spec       mKeySpec
	name       string
	id         string
	tokens     []string
	approvalID string
	granted    map[int]bool // attempts answered execute
	succeeded  bool         // a success was recorded (a report or a resolve answered 200)
	// A limits key's (model_limits_test.go): the API key that begins it
	// ("" for the agent), its dimension value and run.
	caller, dim, run string
}

type concurrentRun struct {
	t     *testing.T
	seed  uint64
	envs  []*apitest.Env
	ws    apitest.Workspace
	agent string
	clock *apitest.Clock
	mu    sync.Mutex
	keys  []*cKey
	lim   cLimits
}

func (c *concurrentRun) fail(worker int, format string, args ...any) {
	c.t.Helper()
	c.t.Errorf("seed %d worker %d (replay the operations: MODEL_SEED=%d go test -run 'TestGateModelConcurrent' ./lib/gate): %s",
		c.seed, worker, c.seed, fmt.Sprintf(format, args...))
}

func runConcurrentModel(t *testing.T, seed uint64, workers, ops int) {
	clock, env1, env2, ws := twoInstances(t)
	b := &bundle{t: t, env: env1, ws: ws, clock: clock}
	c := &concurrentRun{t: t, seed: seed, envs: []*apitest.Env{env1, env2}, ws: ws, agent: b.agent(), clock: clock}
	for _, p := range modelPolicies {
		b.putPolicy(p.typ, p.body())
	}
	// Two keys of each type, all contended.
	for i, spec := range []mKeySpec{modelKeySpecs[0], modelKeySpecs[3], modelKeySpecs[5], modelKeySpecs[6],
		modelKeySpecs[7], modelKeySpecs[8]} {
		c.keys = append(c.keys, &cKey{spec: spec, name: fmt.Sprintf("cmdl-%d-%d", seed, i), granted: map[int]bool{}})
	}
	c.setupLimits(b)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for range ops {
				c.step(w, rng)
			}
		}()
	}
	wg.Wait()
	for _, k := range c.keys {
		if k.id != "" {
			c.checkFinal(k)
		}
	}
	c.checkLimits()
}

var (
	apiDecisions  = []string{"execute", "duplicate", "in_flight", "blocked", "approval_required", "denied"}
	apiDenials    = []string{"policy_denied", "budget_exceeded", "cost_ceiling_exceeded", "run_budget_exceeded", "key_budget_exceeded", "dimension_limit_exceeded", "max_attempts_exceeded", "approval_rejected", "circuit_open"}
	apiLeaseCodes = []string{"lease_expired", "lease_lost", "invalid_state"}
)

func (c *concurrentRun) step(w int, rng *rand.Rand) {
	k := c.keys[rng.IntN(len(c.keys))]
	env := c.envs[rng.IntN(len(c.envs))]
	c.mu.Lock()
	id, approvalID := k.id, k.approvalID
	var token string
	superseded := false // a newer attempt was granted before this request is sent
	if n := len(k.tokens); n > 0 {
		i := n - 1
		if rng.IntN(3) == 0 {
			i = rng.IntN(n)
		}
		token, superseded = k.tokens[i], i < n-1
	}
	c.mu.Unlock()
	switch r := rng.IntN(100); {
	case r < 40 || id == "":
		c.begin(w, env, k, rng.IntN(15) == 0)
	case r < 60 && token != "":
		body := map[string]any{"lease_token": token, "outcome": []string{"succeeded", "failed"}[rng.IntN(2)]}
		res := env.Do("POST", "/api/v1/effects/"+id+"/report", c.agent, body)
		c.superseded(w, k, res, superseded, "report")
		c.settled(w, k, res, body["outcome"].(string), "report")
	case r < 68 && token != "":
		res := env.Do("POST", "/api/v1/effects/"+id+"/heartbeat", c.agent, map[string]any{"lease_token": token})
		c.superseded(w, k, res, superseded, "heartbeat")
		if res.Status != http.StatusOK && !(res.Status == http.StatusConflict && slices.Contains(apiLeaseCodes, res.ErrorCode())) {
			c.fail(w, "heartbeat %s: %d %s", k.name, res.Status, res.Body)
		}
	case r < 78:
		c.clock.Add(time.Duration(5+rng.IntN(30)) * time.Second)
	case r < 88:
		outcome := []string{"succeeded", "failed"}[rng.IntN(2)]
		res := env.Do("POST", "/api/v1/effects/"+id+"/resolve", c.ws.Key, map[string]any{"outcome": outcome,
			"result": map[string]any{"resolved": true}})
		c.settled(w, k, res, outcome, "resolve")
	case r < 96 && approvalID != "":
		verb := []string{"approve", "approve", "reject"}[rng.IntN(3)]
		res := env.Do("POST", "/api/v1/approvals/"+approvalID+"/"+verb, c.ws.Key, nil)
		if res.Status != http.StatusOK && !(res.Status == http.StatusConflict && res.ErrorCode() == "invalid_state") {
			c.fail(w, "%s %s: %d %s", verb, k.name, res.Status, res.Body)
		}
	default:
		res := env.Do("GET", "/api/v1/effects/"+id, c.ws.Key, nil)
		if res.Status != http.StatusOK {
			c.fail(w, "read %s: %d %s", k.name, res.Status, res.Body)
		}
	}
}

// superseded checks that a report or heartbeat with a token whose attempt a
// newer one superseded before it was sent is lease_lost (API.md §5), whatever
// else happened meanwhile.
func (c *concurrentRun) superseded(w int, k *cKey, res *apitest.Response, superseded bool, what string) {
	if superseded && (res.Status != http.StatusConflict || res.ErrorCode() != "lease_lost") {
		c.fail(w, "%s %s with a superseded token: %d %s", what, k.name, res.Status, res.Body)
	}
}

// settled checks a report's or a resolve's answer and notes a recorded
// success.
func (c *concurrentRun) settled(w int, k *cKey, res *apitest.Response, outcome, what string) {
	switch {
	case res.Status == http.StatusOK:
		if got := str(res.JSON()["state"]); outcome == "succeeded" && got != "succeeded" {
			c.fail(w, "%s %s succeeded: the effect reads %s", what, k.name, got)
		}
		if outcome == "succeeded" {
			c.mu.Lock()
			k.succeeded = true
			c.mu.Unlock()
		}
	case res.Status == http.StatusConflict && slices.Contains(apiLeaseCodes, res.ErrorCode()):
	default:
		c.fail(w, "%s %s %s: %d %s", what, k.name, outcome, res.Status, res.Body)
	}
}

func (c *concurrentRun) begin(w int, env *apitest.Env, k *cKey, otherPayload bool) {
	payload := map[string]any{"key": k.name, "v": 0}
	if otherPayload {
		payload["v"] = 1
	}
	c.mu.Lock()
	succeededBefore := k.succeeded
	c.mu.Unlock()
	body := map[string]any{"effect_type": k.spec.pol.typ, "idempotency_key": k.name, "payload": payload,
		"cost_micros": k.spec.cost}
	res := env.Do("POST", "/api/v1/effects/begin", c.limitsBody(k, body), body)
	if res.Status == http.StatusConflict {
		if code := res.ErrorCode(); code != "idempotency_key_reuse" && code != "retry_request" {
			c.fail(w, "begin %s: %d %s", k.name, res.Status, res.Body)
		}
		return
	}
	var d struct {
		Decision   string          `json:"decision"`
		EffectID   string          `json:"effect_id"`
		Attempt    int             `json:"attempt"`
		LeaseToken string          `json:"lease_token"`
		ApprovalID string          `json:"approval_id"`
		Result     json.RawMessage `json:"result"`
		Error      *struct{ Code string }
	}
	if err := json.Unmarshal(res.Body, &d); err != nil || !slices.Contains(apiDecisions, d.Decision) {
		c.fail(w, "begin %s: %d %s", k.name, res.Status, res.Body)
		return
	}
	if (res.Status == http.StatusForbidden) != (d.Decision == "denied") || res.Status != http.StatusOK && res.Status != http.StatusForbidden ||
		d.Decision == "denied" && (d.Error == nil || !slices.Contains(apiDenials, d.Error.Code)) {
		c.fail(w, "begin %s: %d %s", k.name, res.Status, res.Body)
		return
	}
	if d.Attempt > k.spec.pol.maxAttempts {
		c.fail(w, "begin %s: attempt %d past max_attempts %d: %s", k.name, d.Attempt, k.spec.pol.maxAttempts, res.Body)
	}
	if (d.Result != nil) != (d.Decision == "duplicate") {
		c.fail(w, "begin %s: %s with result %s", k.name, d.Decision, d.Result)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if k.id != "" && d.EffectID != k.id {
		c.fail(w, "begin %s: effect %s, was %s", k.name, d.EffectID, k.id)
	}
	k.id = d.EffectID
	switch d.Decision {
	case "execute":
		if succeededBefore {
			c.fail(w, "begin %s: execute (attempt %d) after a success was recorded", k.name, d.Attempt)
		}
		if k.granted[d.Attempt] {
			c.fail(w, "begin %s: attempt %d granted twice", k.name, d.Attempt)
		}
		k.granted[d.Attempt] = true
		k.tokens = append(k.tokens, d.LeaseToken)
	case "approval_required":
		k.approvalID = d.ApprovalID
	}
}

// checkFinal reads the key's effect once every goroutine is done.
func (c *concurrentRun) checkFinal(k *cKey) {
	var e struct {
		State    string
		Attempt  int
		Attempts []struct {
			Attempt        int
			Outcome        *string
			StartedAt      time.Time  `json:"started_at"`
			LeaseExpiresAt time.Time  `json:"lease_expires_at"`
			ReportedAt     *time.Time `json:"reported_at"`
			ResolvedAt     *time.Time `json:"resolved_at"`
		}
	}
	c.envs[0].Must(http.StatusOK, "GET", "/api/v1/effects/"+k.id, c.ws.Key, nil).Decode(c.t, &e)
	if e.Attempt > k.spec.pol.maxAttempts || len(e.Attempts) != e.Attempt || len(k.granted) != e.Attempt {
		c.fail(-1, "%s: attempt %d, %d attempts listed, %d granted, max_attempts %d", k.name, e.Attempt,
			len(e.Attempts), len(k.granted), k.spec.pol.maxAttempts)
		return
	}
	for i, a := range e.Attempts {
		if a.Attempt != i+1 || !k.granted[a.Attempt] {
			c.fail(-1, "%s: attempt %d listed %d-th, granted %v", k.name, a.Attempt, i+1, k.granted[a.Attempt])
		}
		if i == 0 {
			continue
		}
		prev := e.Attempts[i-1]
		// A resolve settles every unknown attempt at once, so an earlier
		// attempt may read succeeded; none began after that was recorded.
		// The clock stands still between moves, so a resolve at the
		// instant an attempt began tells no order (CI: seed 3 read one as
		// after); the begin's own check (succeededBefore) orders them.
		for _, at := range []*time.Time{prev.ReportedAt, prev.ResolvedAt} {
			if prev.Outcome != nil && *prev.Outcome == "succeeded" && at != nil && at.Before(a.StartedAt) {
				c.fail(-1, "%s: attempt %d began after attempt %d's success was recorded", k.name, a.Attempt, prev.Attempt)
			}
		}
		ended := prev.LeaseExpiresAt
		if prev.ReportedAt != nil && prev.ReportedAt.Before(ended) {
			ended = *prev.ReportedAt
		}
		if a.StartedAt.Before(ended) {
			c.fail(-1, "%s: attempt %d started %v while attempt %d held its lease until %v", k.name, a.Attempt,
				a.StartedAt, prev.Attempt, ended)
		}
	}
}

package gate_test

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The extended gate model's spending limits (README "Risk controls and
// circuits"), beside its groups, surge and stop (model_ext_test.go): keys
// begun by the agent or by a capped key (daily_spend_ceiling_micros across
// every type), naming a run with a wallet, one without, or none, of a type
// whose dimension limits cap each recipient's day (micros and count) and of
// the base model's budgeted types. The base model's operations (reports,
// resolves, lapses, probes, approvals, policy and budget changes, midnight)
// act on these keys too, and the model predicts each ceiling's and the
// wallet's charge, release and refusal: a grant is charged its cost on
// every daily counter of its scopes (the type, the calling key, the
// dimension value) and 1 on each, a failed report or resolution gives it
// back, a same-day probe is charged nothing where its unknown attempt was,
// and the refusal names the first ceiling by gate_refuse's label (a
// dimension, then the key, then the type); a run's wallet is checked first,
// counts every attempt of its effects not known to have failed but probes,
// and stays the run the key was first begun under, whichever run (or none)
// a later begin names.

var extDimPolicy = mPolicy{typ: "mdl.dim", onIndeterminate: "probe", maxAttempts: 3, lease: 30 * time.Second,
	dimMicros: 600, dimCount: 4}

// extKeyCeiling is the capped key's daily_spend_ceiling_micros.
const extKeyCeiling = 400

// mRun is a run the limits' keys may name.
type mRun struct {
	id     string
	wallet bool // it has a wallet (budgetMicros)
	budget int64
}

// limits is the extended model's spending limits' state.
type limits struct {
	dimPol *mPolicy
	capped string // the capped key's secret
	runs   []*mRun
	keys   []*mKey
}

// setupLimits configures the dimension-limited type, mints the capped key
// and creates the runs: two wallets and a run without one.
func (e *extRun) setupLimits(b *bundle) {
	m := e.m
	dim := extDimPolicy
	e.lim.dimPol = &dim
	m.pols = append(m.pols, &dim)
	b.putPolicy(dim.typ, dim.body())
	e.lim.capped = b.env.Key(b.ws, map[string]any{"name": "capped", "preset": "AGENT",
		"daily_spend_ceiling_micros": extKeyCeiling})
	for i, budget := range []int64{400, 200, -1} {
		body := map[string]any{"name": fmt.Sprintf("mdl-%d-run%d", m.seed, i)}
		if budget >= 0 {
			body["budgetMicros"] = budget
		}
		r := b.env.Must(http.StatusCreated, "POST", "/api/v1/runs", b.ws.Key, body)
		e.lim.runs = append(e.lim.runs, &mRun{id: str(r.JSON()["id"]), wallet: budget >= 0, budget: budget})
	}
}

// limitsBegin begins a new key of the limits, or one of them again, naming
// sometimes another run than its own, or none.
func (e *extRun) limitsBegin() {
	m := e.m
	e.beginOf(&e.lim.keys, 3, e.newLimitKey, func(k *mKey) mBegin {
		o := m.beginOptions(k, m.rng.IntN(12) == 0)
		switch r := e.lim.runs[m.rng.IntN(len(e.lim.runs))]; m.rng.IntN(4) {
		case 0:
			o.run = "-"
		case 1:
			o.run = r.id
		}
		return o
	})
}

// newLimitKey is a new key of the limits: of the dimension-limited type (for
// one of two recipients) or a budgeted base type, begun by the agent or the
// capped key, under a run with a wallet, one without, or none.
func (e *extRun) newLimitKey() *mKey {
	m := e.m
	k := &mKey{name: e.name("l")}
	switch m.rng.IntN(3) {
	case 0, 1:
		k.spec = mKeySpec{pol: e.lim.dimPol, cost: []int64{0, 100, 250}[m.rng.IntN(3)]}
		k.dim = []string{"alice", "bob"}[m.rng.IntN(2)]
	default:
		k.spec = modelKeySpecs[5+m.rng.IntN(4)] // a retry or probe type's, at its cost
		k.spec.pol = m.pols[slices.IndexFunc(modelPolicies, func(p *mPolicy) bool { return p == k.spec.pol })]
	}
	if m.rng.IntN(2) == 0 {
		k.caller = "capped"
	}
	if i := m.rng.IntN(len(e.lim.runs) + 1); i < len(e.lim.runs) {
		k.run = e.lim.runs[i]
	}
	return k
}

// limitsBody adds a limits key's dimension and run to its begin.
func (e *extRun) limitsBody(k *mKey, o mBegin, body map[string]any) {
	if k.dim != "" {
		body["dimensions"] = map[string]any{"recipient": k.dim}
	}
	switch {
	case o.run == "-":
	case o.run != "":
		body["run_id"] = o.run
	case k.run != nil:
		body["run_id"] = k.run.id
	}
}

// caller is the API key that begins k: the capped one for its keys.
func (e *extRun) caller(k *mKey, agent string) string {
	if e != nil && k.caller != "" {
		return e.lim.capped
	}
	return agent
}

// ceilings are the daily ceilings the extended model adds to a grant of k:
// the capped key's, across every type.
func (e *extRun) ceilings(k *mKey) []mCeiling {
	if e == nil || k.caller == "" {
		return nil
	}
	return []mCeiling{{scope: "key:" + k.caller, label: "key", capMicros: extKeyCeiling}}
}

// walletSpent is what r's wallet has spent: the cost of every attempt of
// its effects not known to have failed, but probes (README "Run wallets":
// at most one of a probe and its unknown attempt acted) and compensations.
func (e *extRun) walletSpent(r *mRun) int64 {
	var spent int64
	for _, k := range e.m.keys {
		if k.run != r || k.compOf != nil {
			continue
		}
		for _, a := range k.atts {
			if a.outcome != "failed" && !a.probe {
				spent += k.spec.cost
			}
		}
	}
	return spent
}

// refusedWallet is run_budget_exceeded's detail when a grant of k does not
// fit what is left of its run's wallet, nil when it fits, has no wallet to
// fit, or is a probe (which adds nothing to it).
func (e *extRun) refusedWallet(k *mKey, probe bool) map[string]any {
	if e == nil || k.run == nil || !k.run.wallet || probe {
		return nil
	}
	spent := e.walletSpent(k.run)
	if k.spec.cost <= k.run.budget-spent {
		return nil
	}
	return map[string]any{"run_id": k.run.id, "budget_micros": float64(k.run.budget), "spent_micros": float64(spent)}
}

// readRun reads a run and compares its wallet with the model's.
func (e *extRun) readRun() {
	m := e.m
	r := e.lim.runs[m.rng.IntN(len(e.lim.runs))]
	res := m.env.Do("GET", "/api/v1/runs/"+r.id, m.ws.Key, nil)
	got := res.JSON()
	m.log("read run %s -> %d budget=%v spent=%v", r.id, res.Status, got["budgetMicros"], got["spentMicros"])
	want := map[string]any{"budgetMicros": nil, "spentMicros": nil}
	if r.wallet {
		want = map[string]any{"budgetMicros": float64(r.budget), "spentMicros": float64(e.walletSpent(r))}
	}
	if res.Status != http.StatusOK || fmt.Sprint(want) != fmt.Sprint(map[string]any{"budgetMicros": got["budgetMicros"],
		"spentMicros": got["spentMicros"]}) {
		m.fail("read run %s: %d budget=%v spent=%v, model %v", r.id, res.Status, got["budgetMicros"], got["spentMicros"], want)
	}
}

// --- the concurrent run's limits ---------------------------------------------

// cLimits is what TestGateModelConcurrent adds of the spending limits:
// keys begun by a capped key, naming a run with a wallet, of the
// dimension-limited type for one recipient, contended with the rest. Once
// every goroutine is done, what the attempts spent (granted, not known to
// have failed, probes aside: a lower bound of every counter) fits each
// ceiling, and the run's spentMicros is exactly its wallet's count: under
// any concurrency a ceiling or a wallet admits only what fits (README).
type cLimits struct {
	capped, cappedID string
	run              string
}

// concurrentWallet is the concurrent run's wallet budget.
const concurrentWallet = 300

func (c *concurrentRun) setupLimits(b *bundle) {
	b.putPolicy(extDimPolicy.typ, extDimPolicy.body())
	c.lim.capped = b.env.Key(b.ws, map[string]any{"name": "capped", "preset": "AGENT",
		"daily_spend_ceiling_micros": extKeyCeiling})
	c.lim.cappedID = keyID(c.lim.capped)
	c.lim.run = str(b.env.Must(http.StatusCreated, "POST", "/api/v1/runs", b.ws.Key,
		map[string]any{"name": "wallet", "budgetMicros": concurrentWallet}).JSON()["id"])
	dim := mKeySpec{pol: &extDimPolicy}
	for i, k := range []cKey{
		{spec: mKeySpec{pol: dim.pol, cost: 250}, caller: c.lim.capped, dim: "alice", run: c.lim.run},
		{spec: mKeySpec{pol: dim.pol, cost: 100}, dim: "alice", run: c.lim.run},
		{spec: mKeySpec{pol: dim.pol, cost: 200}, caller: c.lim.capped, dim: "alice"},
		{spec: modelKeySpecs[8], caller: c.lim.capped, run: c.lim.run},
	} {
		k.name, k.granted = fmt.Sprintf("cmdl-%d-l%d", c.seed, i), map[int]bool{}
		c.keys = append(c.keys, &k)
	}
}

// limitsBody adds a limits key's dimension and run to its begin's body and
// answers the API key that begins it.
func (c *concurrentRun) limitsBody(k *cKey, body map[string]any) string {
	if k.dim != "" {
		body["dimensions"] = map[string]any{"recipient": k.dim}
	}
	if k.run != "" {
		body["run_id"] = k.run
	}
	if k.caller != "" {
		return k.caller
	}
	return c.agent
}

// checkLimits reads every effect begun and checks what its attempts spent
// against the wallet, the capped key's ceiling and the dimension's limits,
// per UTC day.
func (c *concurrentRun) checkLimits() {
	type effect struct {
		EffectType string  `json:"effect_type"`
		RunID      *string `json:"run_id"`
		CostMicros *int64  `json:"cost_micros"`
		Attempts   []struct {
			Outcome      *string
			Probe        bool
			StartedAt    time.Time `json:"started_at"`
			BeganByKeyID string    `json:"began_by_key_id"`
		}
	}
	var wallet int64
	spent, count := map[string]int64{}, map[string]int64{}
	for _, k := range c.keys {
		if k.id == "" {
			continue
		}
		var e effect
		c.envs[0].Must(http.StatusOK, "GET", "/api/v1/effects/"+k.id, c.ws.Key, nil).Decode(c.t, &e)
		for _, a := range e.Attempts {
			if a.Outcome != nil && *a.Outcome == "failed" || a.Probe {
				continue
			}
			cost := *e.CostMicros
			if e.RunID != nil && *e.RunID == c.lim.run {
				wallet += cost
			}
			day := utcDay(a.StartedAt)
			if a.BeganByKeyID == c.lim.cappedID {
				spent["key "+day] += cost
			}
			if e.EffectType == extDimPolicy.typ {
				spent["dim "+day] += cost
				count["dim "+day]++
			}
		}
	}
	for scope, micros := range spent {
		limit, limitCount := int64(extKeyCeiling), int64(math.MaxInt64)
		if strings.HasPrefix(scope, "dim") {
			limit, limitCount = extDimPolicy.dimMicros, extDimPolicy.dimCount
		}
		if micros > limit || count[scope] > limitCount {
			c.fail(-1, "%s: attempts spent %d micros, %d of them counted, past its ceiling %d", scope, micros, count[scope], limit)
		}
	}
	run := c.envs[0].Must(http.StatusOK, "GET", "/api/v1/runs/"+c.lim.run, c.ws.Key, nil).JSON()
	if wallet > concurrentWallet || run["spentMicros"] != float64(wallet) {
		c.fail(-1, "run wallet: its attempts spent %d, it reads %v, budget %d", wallet, run["spentMicros"], concurrentWallet)
	}
}

package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// The gate's model (model_test.go) extended with what the base sequence
// leaves out: effect groups, a type's surge breaker, and daily budgets
// across UTC days. From a seed, a random sequence mixes the base model's
// operations (on its keys and on the keys this one adds) with
//   - groups (API.md §2.6, README "Effect groups and reconciliation"):
//     creates; begins of new forward steps (declaring a compensation or
//     not) and of old ones, in an open, committed, unwinding or ended
//     group; commits; unwinds, whose plan (its order of success, stopping
//     at the first unknown outcome), unresolved, irreversible and reversed
//     lists the model predicts; compensating begins (a step not yet
//     reached, not succeeded, without a compensation, a group not
//     unwinding or ended; and again under their key); group reads, and the
//     rollback's end, settled by the reports and resolves of its effects,
//     by unwind, by a read and by the sweeper;
//   - a surge type (API.md §2.5 and §5, README "Risk controls and
//     circuits") with surge_per_hour and action deny, require_approval or
//     monitor: bursts of new keys that trip the breaker, keys it refused
//     begun again (counted again, as arrivals), the cooldown's end (closed
//     at once, a fresh allowance from its end), an operator's open (any
//     action) and close (a fresh allowance from the close), and the
//     circuits list (state, opener, cooldown end, volume in the trailing
//     hour); a require_approval hold asks (reason circuit_open), a yes
//     carries the key through it, and one opened or given another action
//     after the yes asks again (README "Approvals");
//   - the emergency stop (API.md §2.5 and §5): pulled with an action,
//     re-issued, read (GET /api/v1/circuits/stop), holding every type, one
//     first seen under it included, with the strictest of its and the
//     type's own action (deny: 403 circuit_open naming the circuit the type
//     reads as; require_approval: approval_required, a yes given under it
//     carrying the key through, and answering an amount's question too;
//     monitor: nothing), while the base model's operations, bursts, the
//     surge type's breaker opened and closed, and the limits' begins run
//     under it, and released;
//   - spending limits (model_limits_test.go): run wallets, a capped key's
//     daily ceiling across types, and a dimension's daily limits per value;
//   - clock moves to and across midnight UTC, an hour or a cooldown on, so
//     that daily budgets reset (README: an attempt released on the day it
//     was charged; a probe free only on its unknown attempt's day) and the
//     surge's trailing hour and allowance move.
//
// Each answer is compared with the model as in TestGateModelSequential;
// MODEL_SEED, MODEL_SEEDS and MODEL_OPS work as there. Not parallel, for
// the same reason (a sweep acts on every workspace).
func TestGateModelExtended(t *testing.T) {
	runModels(t, "TestGateModelExtended", 5, 120, func() *extRun { return &extRun{} })
}

var (
	extSurgePolicy = mPolicy{typ: "mdl.surge", onIndeterminate: "retry", maxAttempts: 2, lease: 30 * time.Second,
		budget: 400, surgePerHour: 3, surgeAction: "deny", surgeCooldown: 60}
	extStepPolicy = mPolicy{typ: "mdl.step", onIndeterminate: "retry", maxAttempts: 2, lease: 30 * time.Second,
		approvalAbove: 300}
	extCompPolicy = mPolicy{typ: "mdl.comp", onIndeterminate: "retry", maxAttempts: 2, lease: 30 * time.Second,
		approvalAbove: 50}
)

// mGroup is the model's view of one effect group.
type mGroup struct {
	id, name  string
	key       string // the idempotency key it was created under, if any
	state     string
	committed bool    // committed_at is set
	steps     []*mKey // its forward steps, as begun
}

// mBreaker is the surge type's breaker. A surge breaker whose cooldown
// ended reads closed at once, its fresh allowance measured from that end.
type mBreaker struct {
	open     bool
	by       string    // surge | manual
	action   string    // deny, require_approval or monitor
	openedAt time.Time //
	closesAt time.Time // a surge breaker's cooldown end
	from     time.Time // the allowance's start (zero: none yet)
	updated  time.Time // when it last opened or changed its action
}

// mStop is the emergency stop (README "Risk controls and circuits").
type mStop struct {
	on       bool
	action   string
	reason   string
	openedAt time.Time
	updated  time.Time // when it last opened or changed its action
}

// circuitApproval is circuit's verdict when a require_approval breaker or
// stop holds the type: the begin needs a yes that answers it.
const circuitApproval = "approval"

// extRun is the extended model's state beside modelRun's.
type extRun struct {
	m                   *modelRun
	surge, stepPol, cmp *mPolicy
	breaker             mBreaker
	stop                mStop
	stopPol             *mPolicy // the stop's types: no policy (the safe default)
	surgeKeys           []*mKey
	stopKeys            []*mKey
	groups              []*mGroup
	lim                 limits // run wallets, a capped key, dimension limits (model_limits_test.go)
	n                   int    // keys and groups named so far
}

func (e *extRun) setup(m *modelRun, b *bundle) {
	e.m = m
	// A rollback left unwinding (a compensation never run, an outcome never
	// verified) is ended once the run is over: the package's sweep tests
	// count every workspace's unwinding rollbacks, and one of this run's
	// took a place of their batches (TestSweptRollbacksTakeTurnsAmongWorkspaces).
	m.t.Cleanup(func() {
		_, err := b.env.App.Pool.Exec(context.Background(), `UPDATE effect_groups SET state = 'unwind_failed'
			WHERE workspace_id = $1 AND state = 'unwinding'`, b.ws.ID)
		if err != nil {
			m.t.Errorf("end the run's rollbacks: %v", err)
		}
	})
	stopPol := extStopType
	e.stopPol = &stopPol // no PUT: the default policy, and not in m.pols
	for _, p := range []**mPolicy{&e.surge, &e.stepPol, &e.cmp} {
		own := map[**mPolicy]mPolicy{&e.surge: extSurgePolicy, &e.stepPol: extStepPolicy, &e.cmp: extCompPolicy}[p]
		*p = &own
		m.pols = append(m.pols, &own)
		b.putPolicy(own.typ, own.body())
	}
	e.setupLimits(b)
}

// extStopType is the type the emergency stop's begins use: unconfigured
// (the safe default policy), first seen while the stop is on.
var extStopType = mPolicy{typ: "mdl.stopped", onIndeterminate: "block", maxAttempts: 5, lease: 60 * time.Second}

func (e *extRun) name(kind string) string {
	e.n++
	return fmt.Sprintf("mdl-%d-%s%d", e.m.seed, kind, e.n)
}

func (e *extRun) step(m *modelRun) {
	switch r := m.rng.IntN(100); {
	case r < 44:
		m.step()
	case r < 46:
		e.stopOp()
	case r < 49:
		e.burst()
	case r < 50:
		e.readRun()
	case r < 52:
		e.breakerOp()
	case r < 53:
		e.surgePolicy()
	case r < 55:
		e.readCircuits()
	case r < 58:
		e.clockJump()
	case r < 59:
		e.budgetOp()
	case r < 64:
		e.limitsBegin()
	case r < 66:
		e.createGroup()
	case r < 74:
		e.beginStep()
	case r < 78:
		e.commit(e.pickGroup())
	case r < 84:
		e.unwind(e.pickGroup())
	case r < 94:
		e.compensate()
	default:
		e.readGroup(e.pickGroup())
	}
}

// reportNow reports the lease k was just granted, mostly succeeded, so
// that a group's steps and compensations reach the states a rollback
// walks; its holder may also report nothing.
func (e *extRun) reportNow(k *mKey) {
	m := e.m
	n := len(k.atts)
	if n == 0 || k.effState(m.now()) != "leased" || m.rng.IntN(4) == 0 {
		return
	}
	m.report(k, n-1, k.atts[n-1].token, []string{"succeeded", "succeeded", "succeeded", "failed"}[m.rng.IntN(4)])
}

// --- budgets across days, and the surge's hour -----------------------------

func (e *extRun) clockJump() {
	m := e.m
	now := m.now()
	var d time.Duration
	switch m.rng.IntN(5) {
	case 0: // to midnight UTC exactly
		d = now.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now)
	case 1: // to just before it: the next moves cross it
		d = now.UTC().Truncate(24*time.Hour).Add(24*time.Hour).Sub(now) - 20*time.Second
	case 2:
		d = time.Duration(e.surge.surgeCooldown) * time.Second
	default:
		d = time.Hour
	}
	if d <= 0 {
		d = time.Hour
	}
	m.clock.Add(d)
	m.log("clock +%s (to %s)", d, m.now().UTC().Format(time.RFC3339))
}

// budgetOp clears a type's daily budget, changes it, or sets it anew
// (README "Risk controls and circuits": a ceiling set during the day, set
// anew or again after being cleared, bounds the whole day: the PUT charges
// every attempt of the type granted that UTC day and not known to have
// failed, a probe and the unknown attempt before it once).
func (e *extRun) budgetOp() {
	m := e.m
	var typed []*mPolicy
	for _, p := range m.pols {
		if p != e.stepPol && p != e.cmp {
			typed = append(typed, p)
		}
	}
	p := typed[m.rng.IntN(len(typed))]
	budget := []int64{0, 300, 600, 1000}[m.rng.IntN(4)]
	body := map[string]any{"daily_budget_micros": nil}
	if budget > 0 {
		body["daily_budget_micros"] = budget
	}
	r := m.env.Do("PUT", "/api/v1/policies/"+p.typ, m.ws.Key, body)
	m.log("policy %s daily_budget_micros=%d -> %d", p.typ, budget, r.Status)
	if r.Status != http.StatusOK {
		m.fail("policy %s: %d: %s", p.typ, r.Status, r.Body)
		return
	}
	anew := p.budget == 0 && budget > 0
	p.budget = budget
	if !anew {
		return
	}
	today := utcDay(m.now())
	key := spendKey("type:"+p.typ, today)
	m.spent[key], m.counts[key] = 0, 0
	for _, k := range m.keys {
		if k.spec.pol != p {
			continue
		}
		for _, a := range k.atts {
			if a.day != today {
				continue
			}
			a.charges = slices.DeleteFunc(a.charges, func(c mCharge) bool { return c.key == key })
			charged := a.outcome != "failed"
			if a.probe && a.prior > 0 {
				if u := k.atts[a.prior-1]; u.day == today && u.outcome != "failed" {
					charged = false // counted by the attempt it probed
				}
			}
			if charged {
				a.charges = append(a.charges, mCharge{key: key, micros: k.spec.cost})
				m.spent[key] += k.spec.cost
				m.counts[key]++
			}
		}
	}
	m.seen["budget set anew"]++
}

// --- the surge breaker ------------------------------------------------------

// breakerAt is the breaker as it reads at now: a surge breaker whose
// cooldown ended closed, its allowance from the cooldown's end.
func (e *extRun) breakerAt(now time.Time) *mBreaker {
	b := &e.breaker
	if b.open && b.by == "surge" && !now.Before(b.closesAt) {
		b.open, b.from = false, b.closesAt
	}
	return b
}

// stamp is when a begin at now that the surge counts is recorded: just
// after the allowance's start when the clock reads at or before it.
func (e *extRun) stamp(now time.Time) time.Time {
	if b := e.breakerAt(now); !b.from.IsZero() && !now.After(b.from) {
		return b.from.Add(time.Microsecond)
	}
	return now
}

func (e *extRun) burst() {
	m := e.m
	n := 1 + m.rng.IntN(4)
	m.log("burst of %d", n)
	for range n {
		e.beginOf(&e.surgeKeys, 5, func() *mKey { return e.newKey(e.surge, "s") }, nil)
	}
}

// beginOf begins one of keys again (one time in oneIn), with options
// (nil: none), or a new one that fresh makes, then kept in keys.
func (e *extRun) beginOf(keys *[]*mKey, oneIn int, fresh func() *mKey, options func(k *mKey) mBegin) {
	m := e.m
	if len(*keys) > 0 && m.rng.IntN(oneIn) == 0 {
		k := (*keys)[m.rng.IntN(len(*keys))]
		o := mBegin{}
		if options != nil {
			o = options(k)
		}
		m.beginWith(k, o)
		return
	}
	k := fresh()
	m.beginWith(k, mBegin{})
	if k.exists {
		*keys, m.keys = append(*keys, k), append(m.keys, k)
	}
}

// newKey is a new key of pol costing 100, named after kind.
func (e *extRun) newKey(pol *mPolicy, kind string) *mKey {
	return &mKey{spec: mKeySpec{pol: pol, cost: 100}, name: e.name(kind)}
}

// circuit is the verdict of the circuits holding k's type on a begin of it
// that would transition: "circuit_open", circuitApproval or "". The stop
// holds every type, new ones included, with the strictest of its and the
// type's own action (README "Risk controls and circuits"); a.hold is when
// the require_approval holds last opened or were made stricter (a yes given
// before the latest does not answer them).
func (e *extRun) circuit(k *mKey, es string, now time.Time, a *mAnswer) string {
	if e == nil {
		return ""
	}
	action := ""
	hold := func(act string, at time.Time) {
		if actionRank(act) > actionRank(action) {
			action = act
		}
		if act == "require_approval" && at.After(a.hold) {
			a.hold = at
		}
	}
	if e.stop.on {
		hold(e.stop.action, e.stop.updated)
	}
	if k.spec.pol == e.surge {
		e.surgeHold(k, now, a, hold)
	}
	switch action {
	case "deny":
		return "circuit_open"
	case "require_approval":
		return circuitApproval
	}
	return ""
}

// surgeHold adds the surge type's breaker and surge to a begin's hold
// (README: a new key, or one a breaker refused before its first grant begun
// again, is counted, whatever the decision, unless the type's own breaker
// holds it at least as strictly already, the stop not pausing the count;
// the count over surge_per_hour trips it, and the begin is held by the
// surge's action). a notes whether the begin is counted and trips.
func (e *extRun) surgeHold(k *mKey, now time.Time, a *mAnswer, hold func(string, time.Time)) {
	b := e.breakerAt(now)
	arrival := !k.exists || k.state == "denied" && k.denial == "circuit_open" && k.attempt == 0
	a.counted = arrival
	if b.open {
		hold(b.action, b.updated)
	}
	if b.open && b.action == "deny" || !arrival || e.surge.surgePerHour == 0 ||
		b.open && actionRank(b.action) >= actionRank(e.surge.surgeAction) {
		return // no surge counted: none, or a breaker at least as strict holds the type
	}
	start := now.Add(-time.Hour)
	if b.from.After(start) {
		start = b.from
	}
	volume := 1
	for _, o := range e.surgeKeys {
		if o != k && o.countedAt.After(start) {
			volume++
		}
	}
	if volume <= e.surge.surgePerHour {
		return
	}
	// It opens the breaker, or raises the surge's weaker one; an
	// operator's weaker breaker is left as set (the surge then holds
	// without a breaker of its own, and no yes is older than a hold it
	// never recorded). monitor changes no decision.
	a.trips = !b.open || b.by == "surge"
	var at time.Time
	if a.trips {
		at = e.stamp(now) // opened or raised by this begin (applyBegin): any yes came before
	}
	hold(e.surge.surgeAction, at)
}

// holds says whether a require_approval breaker or the stop holds k's type
// at now (what a yes then answers besides its reason).
func (e *extRun) holds(k *mKey, now time.Time) bool {
	if e == nil {
		return false
	}
	b := e.breakerAt(now)
	return e.stop.on && e.stop.action == "require_approval" ||
		k.spec.pol == e.surge && b.open && b.action == "require_approval"
}

func actionRank(action string) int {
	return slices.Index([]string{"monitor", "require_approval", "deny"}, action)
}

// surgePolicy changes the surge type's surge_per_hour (or turns it off)
// and surge_action (README: turning the surge off closes the surge's
// breaker at once, a higher ceiling leaves it to its cooldown; a new
// action is given to the surge's open breaker at once, its cooldown
// unchanged).
func (e *extRun) surgePolicy() {
	m := e.m
	p := e.surge
	per := []int{3, 3, 5, 0}[m.rng.IntN(4)]
	action := []string{"deny", "deny", "monitor", "require_approval", "require_approval"}[m.rng.IntN(5)]
	body := map[string]any{"surge_per_hour": nil, "surge_action": action}
	if per > 0 {
		body["surge_per_hour"] = per
	}
	r := m.env.Do("PUT", "/api/v1/policies/"+p.typ, m.ws.Key, body)
	m.log("policy %s surge_per_hour=%d surge_action=%s -> %d", p.typ, per, action, r.Status)
	if r.Status != http.StatusOK {
		m.fail("policy %s: %d: %s", p.typ, r.Status, r.Body)
		return
	}
	now := m.now()
	b := e.breakerAt(now)
	switch {
	case !b.open || b.by != "surge":
	case per == 0 && p.surgePerHour > 0:
		b.open, b.from = false, now
	case action != p.surgeAction:
		b.action, b.updated = action, now
	}
	p.surgePerHour, p.surgeAction = per, action
}

// applyBegin records a begin the surge counts and its trip, and answers
// the begin's clock reading: one the surge counts that read at or before
// the allowance's start is moved just after it (its lease runs from there).
func (e *extRun) applyBegin(k *mKey, want mAnswer, now time.Time) time.Time {
	if e == nil || !want.counted {
		return now
	}
	at := e.stamp(now)
	if !k.exists {
		k.createdAt = at
	}
	k.countedAt = at
	switch b := &e.breaker; {
	case !want.trips:
	case b.open: // the surge's own, weaker: raised
		b.action, b.updated = e.surge.surgeAction, at
	default:
		*b = mBreaker{open: true, by: "surge", action: e.surge.surgeAction, openedAt: at, from: b.from, updated: at,
			closesAt: at.Add(time.Duration(e.surge.surgeCooldown) * time.Second)}
	}
	return at
}

func (e *extRun) breakerOp() {
	m := e.m
	now := m.now()
	b := e.breakerAt(now)
	verb := []string{"open", "close", "close"}[m.rng.IntN(3)]
	body := map[string]any{}
	action := []string{"deny", "monitor", "require_approval"}[m.rng.IntN(3)]
	if verb == "open" {
		body = map[string]any{"action": action, "reason": "model"}
		verb += " " + action
	}
	path, _, _ := strings.Cut(verb, " ")
	r := m.env.Do("POST", "/api/v1/circuits/"+e.surge.typ+"/"+path, m.ws.Key, body)
	m.log("%s breaker -> %d %s", verb, r.Status, r.ErrorCode())
	if e.stop.on {
		m.seen[verb+" breaker under the "+e.stop.action+" stop"]++
	}
	if r.Status != http.StatusOK {
		m.fail("%s breaker: %d: %s", verb, r.Status, r.Body)
		return
	}
	switch {
	case path == "open":
		if !b.open {
			b.openedAt = now
		}
		if !b.open || b.action != action {
			// Opening an open breaker again with its action changes
			// nothing a yes answered (README "Approvals").
			b.updated = now
		}
		b.open, b.by, b.action, b.closesAt = true, "manual", action, time.Time{}
	case b.open:
		b.open, b.from = false, now
	}
	e.checkCircuit(r.JSON(), verb+"'s answer", false)
}

// --- the emergency stop -----------------------------------------------------

// stopOp pulls the emergency stop (API.md §2.5, README "Risk controls and
// circuits"), and while it is on runs operations of every kind on every
// type (the base model's, surge bursts, the surge type's breaker opened and
// closed, begins of the limits' keys and of a type first seen under the
// stop), sometimes approves a key it held and begins it again (a yes given
// while the stop holds the type carries the key through it), sometimes
// re-issues it with another action (a stricter one asks again), and
// releases it.
func (e *extRun) stopOp() {
	m := e.m
	e.pullStop([]string{"require_approval", "require_approval", "deny", "monitor"}[m.rng.IntN(4)])
	for range 2 + m.rng.IntN(6) {
		if m.t.Failed() {
			return
		}
		e.heldStep()
	}
	switch approved := e.approveHeld(); {
	case approved != nil:
		// Changed, then back to require_approval, before the key a yes
		// answered is begun: a changed action is a new hold, and the yes
		// given before it no longer answers it (nor would a weaker one's).
		// (A second on: a hold changed at the yes's instant is not after it.)
		m.clock.Add(time.Second)
		m.log("clock +1s")
		e.pullStop([]string{"deny", "monitor"}[m.rng.IntN(2)])
		e.heldStep()
		e.pullStop("require_approval")
		m.beginWith(approved, mBegin{})
	case m.rng.IntN(3) == 0:
		e.pullStop([]string{"require_approval", "deny", "monitor"}[m.rng.IntN(3)])
		e.heldStep()
	}
	if !m.t.Failed() {
		e.releaseStop()
	}
}

// approveHeld approves, half the time, a key a breaker or the stop asked
// about, and then begins it at once or (answered: the key) leaves its yes
// outstanding for what follows.
func (e *extRun) approveHeld() (answered *mKey) {
	m := e.m
	var pending []*mKey
	for _, k := range m.keys {
		if k.approval == "pending" && k.reason == reasonCircuit && !e.rolledBack(k) {
			pending = append(pending, k)
		}
	}
	if len(pending) == 0 || m.rng.IntN(2) == 0 {
		return nil
	}
	k := pending[m.rng.IntN(len(pending))]
	m.decide(k, "approve")
	if m.rng.IntN(2) == 0 {
		return k
	}
	m.beginWith(k, mBegin{})
	return nil
}

// heldStep is one operation while the stop is on.
func (e *extRun) heldStep() {
	switch e.m.rng.IntN(7) {
	case 0:
		e.beginStopKey()
	case 1:
		e.burst()
	case 2:
		e.breakerOp()
	case 3:
		e.limitsBegin()
	case 4:
		e.readCircuits()
	default:
		e.m.step()
	}
}

func (e *extRun) beginStopKey() {
	e.beginOf(&e.stopKeys, 3, func() *mKey { return e.newKey(e.stopPol, "x") }, nil)
}

// pullStop pulls the stop, or re-issues it (README: its action and reason
// change; its opened_at stays; a changed action is a new hold that a yes
// given before does not answer, a repeat is not).
func (e *extRun) pullStop(action string) {
	m := e.m
	now := m.now()
	reason := e.name("incident")
	r := m.env.Do("POST", "/api/v1/circuits/stop", m.ws.Key, map[string]any{"reason": reason, "action": action})
	m.log("stop %s -> %d %s", action, r.Status, r.ErrorCode())
	if r.Status != http.StatusOK {
		m.fail("stop %s: %d: %s", action, r.Status, r.Body)
		return
	}
	s := &e.stop
	if !s.on {
		s.openedAt = now
	}
	if !s.on || s.action != action {
		s.updated = now
	}
	s.on, s.action, s.reason = true, action, reason
	e.checkStop()
}

func (e *extRun) releaseStop() {
	m := e.m
	r := m.env.Do("POST", "/api/v1/circuits/release", m.ws.Key, nil)
	m.log("release -> %d %s", r.Status, r.ErrorCode())
	if r.Status != http.StatusOK {
		m.fail("release: %d: %s", r.Status, r.Body)
		return
	}
	e.stop = mStop{}
	e.checkStop()
}

// checkStop compares GET /api/v1/circuits/stop with the model: open, with
// its action, reason and when it was pulled; or closed, the rest null.
func (e *extRun) checkStop() {
	m := e.m
	r := m.env.Do("GET", "/api/v1/circuits/stop", m.ws.Key, nil)
	if r.Status != http.StatusOK {
		m.fail("read the stop: %d: %s", r.Status, r.Body)
		return
	}
	got := r.JSON()
	want := map[string]any{"state": "closed", "action": nil, "reason": nil, "opened_at": nil}
	if s := e.stop; s.on {
		want = map[string]any{"state": "open", "action": s.action, "reason": s.reason,
			"opened_at": s.openedAt.UTC().Format(time.RFC3339Nano)}
	}
	got = map[string]any{"state": got["state"], "action": got["action"], "reason": got["reason"],
		"opened_at": normTime(got["opened_at"])}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		m.fail("the stop reads %v, model %v", got, want)
	}
}

func (e *extRun) readCircuits() {
	m := e.m
	r := m.env.Do("GET", "/api/v1/circuits", m.ws.Key, nil)
	m.log("read circuits -> %d", r.Status)
	if r.Status != http.StatusOK {
		m.fail("read circuits: %d: %s", r.Status, r.Body)
		return
	}
	for _, c := range r.JSON()["data"].([]any) {
		if c := c.(map[string]any); c["effect_type"] == e.surge.typ {
			e.checkCircuit(c, "the circuits list", true)
			return
		}
	}
	m.fail("read circuits: no %s: %s", e.surge.typ, r.Body)
}

// checkCircuit compares a circuit with the model: its state and, open, who
// opened it, when and when it closes; with volume, the keys of the type
// begun for the first time in the trailing hour and the threshold.
func (e *extRun) checkCircuit(c map[string]any, what string, volume bool) {
	m := e.m
	now := m.now()
	want := map[string]any{"state": "closed"}
	got := map[string]any{"state": c["state"]}
	if v := e.shown(now); v != nil {
		want = v
		got = map[string]any{"state": c["state"], "opened_by": c["opened_by"], "action": c["action"],
			"closes_at": normTime(c["closes_at"]), "opened_at": normTime(c["opened_at"])}
	}
	if volume {
		n := 0
		for _, k := range e.surgeKeys {
			if k.createdAt.After(now.Add(-time.Hour)) {
				n++
			}
		}
		want["volume_last_hour"], want["threshold"] = float64(n), any(nil)
		if e.surge.surgePerHour > 0 {
			want["threshold"] = float64(e.surge.surgePerHour)
		}
		got["volume_last_hour"], got["threshold"] = c["volume_last_hour"], c["threshold"]
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		m.fail("%s: circuit %v, model %v", what, got, want)
	}
}

// shown is the surge type's circuit as it reads at now (nil: closed): its
// own breaker when stricter than the stop, else the stop when it is on
// (README "Circuits": the list shows the stop on the types it holds, a
// type's own stricter breaker instead).
func (e *extRun) shown(now time.Time) map[string]any {
	b := e.breakerAt(now)
	stopRank := -1
	if e.stop.on {
		stopRank = actionRank(e.stop.action)
	}
	switch {
	case b.open && actionRank(b.action) > stopRank:
		closes := any(nil)
		if b.by == "surge" {
			closes = b.closesAt.UTC().Format(time.RFC3339Nano)
		}
		return map[string]any{"state": "open", "opened_by": b.by, "action": b.action, "closes_at": closes,
			"opened_at": b.openedAt.UTC().Format(time.RFC3339Nano)}
	case e.stop.on:
		return map[string]any{"state": "open", "opened_by": "stop", "action": e.stop.action, "closes_at": nil,
			"opened_at": e.stop.openedAt.UTC().Format(time.RFC3339Nano)}
	}
	return nil
}

// normDetail is an error's detail with its times written as the model
// writes them.
func normDetail(detail map[string]any) map[string]any {
	out := map[string]any{}
	for f, v := range detail {
		out[f] = normTime(v)
	}
	return out
}

// normTime writes an RFC 3339 time as the model does, nil as nil.
func normTime(v any) any {
	s, ok := v.(string)
	if !ok {
		return v
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return s
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// checkCircuitDenial compares a circuit_open denial's detail with the
// circuit that denied (README): the one the type's circuit reads as (its
// own breaker when stricter than the stop, else the stop), its opener, when
// it opened and when it closes; a surge over its ceiling under an
// operator's weaker breaker names the surge alone.
func (e *extRun) checkCircuitDenial(k *mKey, detail map[string]any) {
	if e == nil {
		return
	}
	now := e.m.now()
	want := map[string]any{"opened_by": "surge"}
	if k.spec.pol != e.surge && e.stop.on {
		want = map[string]any{"opened_by": "stop", "opened_at": e.stop.openedAt.UTC().Format(time.RFC3339Nano),
			"closes_at": nil}
	} else if v := e.shown(now); v != nil && v["action"] == "deny" {
		want = map[string]any{"opened_by": v["opened_by"], "opened_at": v["opened_at"], "closes_at": v["closes_at"]}
	}
	if got := normDetail(detail); fmt.Sprint(got) != fmt.Sprint(want) {
		e.m.fail("begin %s: circuit_open detail %v, model %v", k.name, got, want)
	}
}

// --- groups -----------------------------------------------------------------

func (e *extRun) pickGroup() *mGroup {
	if len(e.groups) == 0 || e.m.rng.IntN(6) == 0 {
		e.createGroup()
	}
	return e.groups[e.m.rng.IntN(len(e.groups))]
}

// createGroup creates a group, under an idempotency key or none; or sends
// a keyed create again (README: a retry whose answer was lost gets the
// group the key opened, with its steps; the key with another name is
// idempotency_key_reuse).
func (e *extRun) createGroup() {
	m := e.m
	var keyed []*mGroup
	for _, g := range e.groups {
		if g.key != "" {
			keyed = append(keyed, g)
		}
	}
	if len(keyed) > 0 && m.rng.IntN(4) == 0 {
		g := keyed[m.rng.IntN(len(keyed))]
		name, status, code := g.name, http.StatusOK, ""
		if m.rng.IntN(3) == 0 {
			name, status, code = g.name+"-other", http.StatusConflict, "idempotency_key_reuse"
		}
		e.settle(g)
		r := m.env.Do("POST", "/api/v1/groups", m.agent, map[string]any{"name": name, "idempotency_key": g.key})
		m.log("create group again (%s) -> %d %s state=%v", g.id, r.Status, r.ErrorCode(), r.JSON()["state"])
		switch {
		case r.Status != status || r.ErrorCode() != code:
			m.fail("create group %s again: %d %q, model %d %q: %s", g.id, r.Status, r.ErrorCode(), status, code, r.Body)
		case status == http.StatusOK && (r.JSON()["id"] != g.id || r.JSON()["deduplicated"] != true):
			m.fail("create group %s again: %s", g.id, r.Body)
		case status == http.StatusOK:
			e.checkGroup(g, r.JSON(), "a create sent again")
		}
		return
	}
	g := &mGroup{name: e.name("grp"), state: "open"}
	body := map[string]any{"name": g.name}
	if m.rng.IntN(2) == 0 {
		g.key = "work:" + g.name
		body["idempotency_key"] = g.key
	}
	r := m.env.Do("POST", "/api/v1/groups", m.agent, body)
	m.log("create group -> %d state=%v id=%v", r.Status, r.JSON()["state"], r.JSON()["id"])
	if r.Status != http.StatusCreated || r.JSON()["state"] != "open" {
		m.fail("create group: %d: %s", r.Status, r.Body)
		return
	}
	g.id = str(r.JSON()["id"])
	e.groups = append(e.groups, g)
}

// beginStep begins a new forward step of a group (declaring a compensation
// or not) or one of its steps again.
func (e *extRun) beginStep() {
	m := e.m
	g := e.pickGroup()
	// Mostly an open group: its steps' retries after a lapse are what an
	// unwind later finds unknown.
	var open []*mGroup
	for _, o := range e.groups {
		if o.state == "open" {
			open = append(open, o)
		}
	}
	if len(open) > 0 && m.rng.IntN(4) != 0 {
		g = open[m.rng.IntN(len(open))]
	}
	if len(g.steps) > 0 && (len(g.steps) >= 4 || m.rng.IntN(2) == 0) {
		k := g.steps[m.rng.IntN(len(g.steps))]
		o := m.beginOptions(k, m.rng.IntN(12) == 0)
		switch m.rng.IntN(8) {
		case 0: // without group_id: the key's own group still decides
			o.group = "-"
		case 1: // naming another group
			if other := e.groups[m.rng.IntN(len(e.groups))]; other != g {
				o.group = other.id
			}
		}
		m.beginWith(k, o)
		e.reportNow(k)
		return
	}
	// A step's cost is fixed by its key: some at the approval threshold.
	k := &mKey{spec: mKeySpec{pol: e.stepPol, cost: []int64{100, 100, 100, 100, 100, 300}[m.rng.IntN(6)]}, name: e.name("g"),
		group: g, declares: m.rng.IntN(4) != 0}
	m.beginWith(k, m.beginOptions(k, false))
	if k.exists {
		g.steps, m.keys = append(g.steps, k), append(m.keys, k)
		e.reportNow(k)
	}
}

// compensate begins the compensation of one of a group's steps, under the
// key unwind suggests: anew, or again.
func (e *extRun) compensate() {
	m := e.m
	// Mostly a step of a group whose rollback began.
	var steps, unwinding []*mKey
	for _, g := range e.groups {
		steps = append(steps, g.steps...)
		if g.state == "unwinding" {
			unwinding = append(unwinding, g.steps...)
		}
	}
	if len(unwinding) > 0 && m.rng.IntN(5) != 0 {
		steps = unwinding
	}
	if len(steps) == 0 {
		e.beginStep()
		return
	}
	st := steps[m.rng.IntN(len(steps))]
	if st.comp != nil && m.rng.IntN(6) != 0 {
		m.beginWith(st.comp, m.beginOptions(st.comp, m.rng.IntN(12) == 0))
		e.reportNow(st.comp)
		return
	}
	name := "compensate:" + st.id
	if st.comp != nil {
		name += ":" + e.name("again") // a second compensation of the step
	}
	k := &mKey{spec: mKeySpec{pol: e.cmp, cost: []int64{10, 10, 50}[m.rng.IntN(3)]}, name: name,
		group: st.group, compOf: st}
	m.beginWith(k, m.beginOptions(k, m.rng.IntN(8) == 0)) // sometimes not the declared compensation
	if k.exists {
		st.comp, m.keys = k, append(m.keys, k)
		e.reportNow(k)
	}
}

func compensationPayload(step *mKey) map[string]any { return map[string]any{"undo": step.name} }

func (e *extRun) beginBody(k *mKey, o mBegin, body map[string]any) {
	switch {
	case e == nil:
	case k.compOf != nil:
		body["payload"] = compensationPayload(k.compOf)
		if o.other {
			body["payload"] = map[string]any{"undo": k.compOf.name, "v": 1}
		}
		body["compensates_effect_id"] = k.compOf.id
	case k.group == nil:
		e.limitsBody(k, o, body)
	default:
		switch o.group {
		case "":
			body["group_id"] = k.group.id
		case "-":
		default:
			body["group_id"] = o.group
		}
		// Declared again (a step keeps the one it was first begun with),
		// but not without group_id, where a compensation is refused (400).
		if k.declares && o.group != "-" {
			body["compensation"] = map[string]any{"effect_type": e.cmp.typ, "payload": compensationPayload(k)}
		}
	}
}

// forwardRefusal is a group's refusal of a new forward step, or of a new
// attempt at one, when it is not open (README: committed takes no new step;
// unwinding and ended ones answer group_unwinding).
func forwardRefusal(g *mGroup) (mAnswer, bool) {
	switch g.state {
	case "open":
		return mAnswer{}, false
	case "committed":
		return mAnswer{status: http.StatusConflict, code: "invalid_state"}, true
	}
	return mAnswer{status: http.StatusConflict, code: "group_unwinding"}, true
}

// admit is a group's refusal of a begin before anything is decided: a new
// forward step of a group that is not open; a new compensation of a step
// that declared none, of a group whose rollback has not begun or has ended,
// of a step that did not succeed, or of one the rollback has not reached.
func (e *extRun) admit(k *mKey, o mBegin, now time.Time) (mAnswer, bool) {
	switch {
	case e == nil || k.group == nil:
		return mAnswer{}, false
	case k.exists && o.group != "" && o.group != "-":
		// A step's key begun naming another group (README: answered only
		// as a step of its own group).
		return mAnswer{status: http.StatusConflict, code: "idempotency_key_reuse"}, true
	case k.exists:
		return mAnswer{}, false
	case k.compOf == nil:
		return forwardRefusal(k.group)
	}
	st, g := k.compOf, k.group
	refused := mAnswer{status: http.StatusConflict, code: "invalid_state"}
	switch {
	case !st.declares || g.state != "unwinding" || st.effState(now) != "succeeded" ||
		slices.Contains(e.rollback(g, now).held, st):
		return refused, true
	case st.comp != nil && st.comp != k:
		// A second compensation of the step, under another key: one
		// compensating effect a step (README).
		return refused, true
	case o.other:
		// Not the compensation the step declared.
		return mAnswer{status: http.StatusBadRequest, code: "invalid_request"}, true
	}
	return mAnswer{}, false
}

// admitAttempt is a group's refusal of a new attempt at (or a fresh
// evaluation of) a forward step: its group must be open.
func (e *extRun) admitAttempt(k *mKey) (mAnswer, bool) {
	if e == nil || k.group == nil || k.compOf != nil {
		return mAnswer{}, false
	}
	return forwardRefusal(k.group)
}

// rolledBack says k's pending approval can no longer be given: it is a
// forward step of a group whose unwind began, or a compensation of one
// whose rollback ended (README "Approvals").
func (e *extRun) rolledBack(k *mKey) bool {
	switch {
	case e == nil || k.group == nil:
		return false
	case k.compOf != nil:
		return groupEnded(k.group.state)
	}
	return k.group.state == "unwinding" || groupEnded(k.group.state)
}

// admitGrant is a group's refusal of a compensation's grant once the
// rollback ended: its record is final.
func (e *extRun) admitGrant(k *mKey) (mAnswer, bool) {
	if e == nil || k.compOf == nil || !groupEnded(k.group.state) {
		return mAnswer{}, false
	}
	return mAnswer{status: http.StatusConflict, code: "invalid_state"}, true
}

func groupEnded(state string) bool { return state == "unwound" || state == "unwind_failed" }

// mRollback is what remains of a group's rollback (README: the plan in
// reverse order of success, stopping at the first unknown outcome).
type mRollback struct {
	plan                               []*mKey // steps to compensate, in order
	unresolved, irreversible, reversed []string
	held                               []*mKey // steps behind an unknown outcome
}

// succeededAt is when a succeeded step succeeded: its report, or for an
// outcome found later (resolve) the end of that attempt's lease.
func succeededAt(k *mKey) time.Time {
	var at time.Time
	for _, a := range k.atts {
		if a.outcome != "succeeded" {
			continue
		}
		t := a.exp
		if a.reported {
			t = a.reportedAt
		}
		if t.After(at) {
			at = t
		}
	}
	return at
}

// finalDenial says a compensation will never succeed: finally denied, or
// failed or denied with no attempt left under its type's max_attempts, or
// failed after a refusal max_attempts_exceeded while its outcome was
// unknown, or with its retry rejected.
func finalDenial(c *mKey) bool {
	return (c.state == "failed" || c.state == "denied") && c.attempt >= c.spec.pol.maxAttempts ||
		c.state == "failed" && (c.denial == "max_attempts_exceeded" || c.approval == "rejected") ||
		c.state == "denied" && (c.denial == "approval_rejected" || c.denial == "max_attempts_exceeded")
}

func (e *extRun) rollback(g *mGroup, now time.Time) mRollback {
	type entry struct {
		st                  *mKey
		at                  time.Time
		maybe, stop, lapsed bool
	}
	r := mRollback{unresolved: []string{}, irreversible: []string{}, reversed: []string{}}
	var walk []entry
	for _, st := range g.steps {
		switch st.effState(now) {
		case "succeeded":
			c := st.comp
			switch {
			case !st.declares || c != nil && (finalDenial(c) || groupEnded(g.state) && c.state != "succeeded"):
				r.irreversible = append(r.irreversible, st.id)
				continue
			case c != nil && c.state == "succeeded":
				r.reversed = append(r.reversed, st.id)
				continue
			}
			en := entry{st: st, at: succeededAt(st)}
			if c != nil {
				if cs := c.effState(now); cs == "leased" || cs == "indeterminate" {
					en.stop, en.lapsed = true, cs == "indeterminate"
				}
			}
			walk = append(walk, en)
		case "leased", "indeterminate":
			// Where it could have succeeded at the latest: its latest
			// unknown attempt's lease end (not a failed retry's after it).
			at := st.atts[st.latestUnknown()-1].exp
			if !at.Equal(st.atts[len(st.atts)-1].exp) {
				e.m.seen["rollback: an unknown step behind a failed retry"]++
			}
			walk = append(walk, entry{st: st, at: at, maybe: true})
		}
	}
	sort.SliceStable(walk, func(i, j int) bool {
		if !walk[i].at.Equal(walk[j].at) {
			return walk[i].at.After(walk[j].at)
		}
		return walk[i].st.id > walk[j].st.id
	})
	stopped, unknown := false, false
	for _, en := range walk {
		if unknown && !en.maybe {
			r.held = append(r.held, en.st)
		}
		unknown = unknown || en.maybe || en.lapsed
		switch {
		case en.maybe:
			r.unresolved = append(r.unresolved, en.st.id)
			stopped = true
		case en.stop:
			r.unresolved = append(r.unresolved, en.st.comp.id)
			if !stopped {
				r.plan = append(r.plan, en.st)
			}
			stopped = true
		case !stopped:
			r.plan = append(r.plan, en.st)
		}
	}
	return r
}

// settle ends an unwinding group's rollback when nothing is left to do.
func (e *extRun) settle(g *mGroup) {
	if g.state != "unwinding" {
		return
	}
	if r := e.rollback(g, e.m.now()); len(r.plan) == 0 && len(r.unresolved) == 0 {
		g.state = "unwound"
		if len(r.irreversible) > 0 {
			g.state = "unwind_failed"
		}
		e.closeRolledBack(g)
	}
}

// closeRolledBack closes the pending approvals of g's keys that its
// rollback, just begun or ended, keeps from ever running, as the gate does
// then (README "Approvals"): rejected, the effect keeping its state (one
// settled succeeded is a resolution's to close).
func (e *extRun) closeRolledBack(g *mGroup) {
	for _, k := range e.m.keys {
		if k.group == g && k.approval == "pending" && e.rolledBack(k) && k.effState(e.m.now()) != "succeeded" {
			k.approval = "rejected"
		}
	}
}

// afterStep settles the group of an effect a report or resolve answered.
func (e *extRun) afterStep(k *mKey) {
	if e != nil && k.group != nil {
		e.settle(k.group)
	}
}

// afterSweep reads every unwinding group: the sweeper may have ended its
// rollback (groups.settle), as the read does.
func (e *extRun) afterSweep() {
	if e == nil {
		return
	}
	for _, g := range e.groups {
		if g.state == "unwinding" {
			e.readGroup(g)
		}
	}
}

func (e *extRun) commit(g *mGroup) {
	m := e.m
	now := m.now()
	status, code := http.StatusOK, ""
	var pending []string
	switch g.state {
	case "committed":
	case "open":
		for _, st := range g.steps {
			if s := st.effState(now); s != "succeeded" {
				pending = append(pending, st.id+":"+s)
			}
		}
		if pending != nil {
			status, code = http.StatusConflict, "invalid_state"
		}
	default:
		status, code = http.StatusConflict, "invalid_state"
	}
	r := m.env.Do("POST", "/api/v1/groups/"+g.id+"/commit", m.agent, nil)
	m.log("commit group %s (%s) -> %d %s state=%v", g.id, g.state, r.Status, r.ErrorCode(), r.JSON()["state"])
	if r.Status != status || r.ErrorCode() != code {
		m.fail("commit %s: %d %q, model %d %q: %s", g.id, r.Status, r.ErrorCode(), status, code, r.Body)
		return
	}
	if status == http.StatusOK {
		g.state, g.committed = "committed", true
		e.checkGroup(g, r.JSON(), "commit's answer")
		return
	}
	detail, _ := r.JSON()["error"].(map[string]any)["detail"].(map[string]any)
	if pending != nil {
		var got []string
		for _, s := range detail["steps"].([]any) {
			s := s.(map[string]any)
			got = append(got, str(s["effect_id"])+":"+str(s["state"]))
		}
		slices.Sort(pending)
		if !slices.Equal(got, pending) {
			m.fail("commit %s: steps %v, model %v", g.id, got, pending)
		}
		return
	}
	if detail["state"] != g.state || (detail["committed_at"] != nil) != g.committed {
		m.fail("commit %s: detail %v, model state %s committed %v", g.id, detail, g.state, g.committed)
	}
}

func (e *extRun) unwind(g *mGroup) {
	m := e.m
	now := m.now()
	if g.state == "open" || g.state == "committed" {
		g.state = "unwinding"
		e.closeRolledBack(g)
	}
	want := e.rollback(g, now)
	e.settle(g)
	r := m.env.Do("POST", "/api/v1/groups/"+g.id+"/unwind", m.agent, nil)
	got := r.JSON()
	m.log("unwind group %s -> %d %v state=%v plan=%d unresolved=%v", g.id, r.Status, got["state"], got["state"],
		len(anyList(got["plan"])), got["unresolved"])
	if r.Status != http.StatusOK {
		m.fail("unwind %s: %d: %s", g.id, r.Status, r.Body)
		return
	}
	var plan, wantPlan []string
	for _, it := range anyList(got["plan"]) {
		it := it.(map[string]any)
		plan = append(plan, fmt.Sprintf("%v key=%v comp=%v %v", it["compensates_effect_id"], it["suggested_idempotency_key"],
			it["compensation_effect_id"], it["compensation_state"]))
	}
	for _, st := range want.plan {
		comp := "<nil> <nil>"
		if st.comp != nil {
			comp = st.comp.id + " " + st.comp.effState(now)
		}
		wantPlan = append(wantPlan, fmt.Sprintf("%v key=compensate:%s comp=%s", st.id, st.id, comp))
	}
	sortedIDs := func(v any) []string {
		var out []string
		for _, s := range anyList(v) {
			out = append(out, str(s))
		}
		slices.Sort(out)
		return out
	}
	slices.Sort(want.irreversible)
	slices.Sort(want.reversed)
	var unresolved []string
	for _, s := range anyList(got["unresolved"]) {
		unresolved = append(unresolved, str(s))
	}
	if got["state"] != g.state || !slices.Equal(plan, wantPlan) || !slices.Equal(unresolved, nilIfEmpty(want.unresolved)) ||
		!slices.Equal(sortedIDs(got["irreversible"]), nilIfEmpty(want.irreversible)) ||
		!slices.Equal(sortedIDs(got["reversed"]), nilIfEmpty(want.reversed)) {
		m.fail("unwind %s: state=%v plan=%v unresolved=%v irreversible=%v reversed=%v, "+
			"model state=%s plan=%v unresolved=%v irreversible=%v reversed=%v\n%s", g.id, got["state"], plan, unresolved,
			got["irreversible"], got["reversed"], g.state, wantPlan, want.unresolved, want.irreversible, want.reversed,
			e.describe(g, now))
	}
}

// describe writes the group's steps as the model holds them, for a failure.
func (e *extRun) describe(g *mGroup, now time.Time) string {
	var b strings.Builder
	for _, st := range g.steps {
		fmt.Fprintf(&b, "  step %s %s %s declares=%v succeeded_at=%s", st.id, st.name, st.effState(now), st.declares,
			succeededAt(st).Format(time.RFC3339Nano))
		for i, a := range st.atts {
			fmt.Fprintf(&b, " [%d %q exp=%s]", i+1, a.outcome, a.exp.Format(time.TimeOnly))
		}
		if c := st.comp; c != nil {
			fmt.Fprintf(&b, " comp %s %s attempt=%d", c.id, c.effState(now), c.attempt)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func anyList(v any) []any {
	l, _ := v.([]any)
	return l
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func (e *extRun) readGroup(g *mGroup) {
	m := e.m
	e.settle(g)
	r := m.env.Do("GET", "/api/v1/groups/"+g.id, m.agent, nil)
	m.log("read group %s -> %d %v", g.id, r.Status, r.JSON()["state"])
	if r.Status != http.StatusOK {
		m.fail("read group %s: %d: %s", g.id, r.Status, r.Body)
		return
	}
	e.checkGroup(g, r.JSON(), "read")
}

// checkGroup compares a group (a read, a commit's answer) with the model:
// its state, and its steps, forward and compensating, in id order, with
// their states.
func (e *extRun) checkGroup(g *mGroup, got map[string]any, what string) {
	m := e.m
	now := m.now()
	var want, steps []string
	for _, st := range g.steps {
		want = append(want, st.id+":"+st.effState(now))
		if st.comp != nil {
			want = append(want, st.comp.id+":"+st.comp.effState(now))
		}
	}
	slices.Sort(want)
	for _, s := range anyList(got["steps"]) {
		s := s.(map[string]any)
		steps = append(steps, str(s["effect_id"])+":"+str(s["state"]))
	}
	if got["state"] != g.state || !slices.Equal(steps, want) {
		m.fail("%s of group %s: state=%v steps=%v, model state=%s steps=%v", what, g.id, got["state"], steps, g.state, want)
	}
}

package jobs_test

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/jobs"
)

// The jobs model's endpoint gates, tool contracts and revocable worker key
// (model_test.go's claims, heartbeats and reports consult them):
//   - an endpoint's maxConcurrent, rateLimitPerMinute and circuit breaker
//     (README "Durable jobs": Work, Circuit breaker), set by policy PUTs
//     among the other operations, decide what a claim may lease, exactly as
//     README says a claim grants: its candidates are the due jobs of
//     endpoints that are not paused, not out of this minute's allowance,
//     not open before their probe time, and (for a job that needs a new
//     slot) not at their limit, the longest due first up to the limit; each
//     endpoint then leases as many as its room allows, its reclaims (a
//     lapsed job, a replayed job over its cancelled attempt: they need no
//     new slot) first;
//   - mdl_charge@1 runs under a contract (README "Tool contracts and
//     replay"), so its jobs' successes are checked against an outputSchema,
//     and enqueues naming a FORBIDDEN contract, one of another handler
//     version, or an input its inputSchema refuses are refused, changing
//     nothing;
//   - a second WORKER key, with a worker registered under it, claims,
//     heartbeats and reports like the first (but its claims count against
//     its rate_limit_per_minute, README "Rate limits") until it is revoked;
//     then each of those is 401 unauthorized (the instance that revokes a
//     key forgets it at once, README "Key cache and revocation bound") and
//     changes nothing.

// jmGate is the model's view of one endpoint's gates.
type jmGate struct {
	name, id string
	version  int64 // the policy's, sent back as expectedVersion
	paused   bool
	// maxConcurrent and rate (rateLimitPerMinute): 0 for none.
	maxConcurrent, rate int
	// The rate window: the UTC minute it counts, and the claims' grants in
	// it. The server counts them on the endpoint's row only when a claim
	// writes that row (a limit, maxConcurrent or an open circuit); a policy
	// PUT that sets or changes the limit starts it from every attempt
	// started on the endpoint in its minute (README: the limit holds for the
	// minute it is set in), which started counts: the attempts granted in
	// startedMinute.
	windowStart   time.Time
	windowCount   int
	startedMinute time.Time
	started       int
	// The breaker: threshold 0 when off.
	threshold         int
	cooldown          time.Duration
	open              bool
	openedAt, probeAt time.Time
	failures          int
}

// jmUnlimited is a room no claim's limit reaches.
const jmUnlimited = 1 << 30

// jmRoom is what an endpoint may still grant now: by its rate allowance,
// its concurrency slots and its breaker's probe.
type jmRoom struct{ rate, conc, probe int }

func (m *jobsModel) gate(s *jmStep) *jmGate { return m.gates[jmTools[s.spec.tool].name] }

// used is how many concurrency slots the endpoint's jobs hold: each RUNNING
// job (a lapsed one keeps its slot), and each cancelled attempt that may
// still run (README: until its report, or the sweep after its lease's
// expiry, or the replay's claim that takes it over).
func (m *jobsModel) used(g *jmGate) int {
	n := 0
	for _, s := range m.steps {
		if s.exists && m.gate(s) == g && (s.status == jobs.StatusRunning || s.held > 0) {
			n++
		}
	}
	return n
}

// reclaim says whether a claim of the step's job needs no new slot: its
// lapsed attempt's, or its cancelled attempt's, is taken over.
func (s *jmStep) reclaim() bool { return s.status == jobs.StatusRunning || s.held > 0 }

func (m *jobsModel) room(g *jmGate, now time.Time) jmRoom {
	r := jmRoom{rate: jmUnlimited, conc: jmUnlimited, probe: jmUnlimited}
	if g.rate > 0 {
		r.rate = max(0, g.rate-g.windowAt(now))
	}
	if g.maxConcurrent > 0 {
		r.conc = max(0, g.maxConcurrent-m.used(g))
	}
	if g.open {
		r.probe = 0
		if !g.probeAt.After(now) {
			r.probe = 1
		}
	}
	return r
}

// windowAt is the grants counted in now's minute.
func (g *jmGate) windowAt(now time.Time) int {
	if g.windowStart.Before(now.Truncate(time.Minute)) {
		return 0
	}
	return g.windowCount
}

// admits says whether a claim now may offer the step's due job: a paused
// endpoint, one out of this minute's allowance, one whose circuit is open
// before its probe time, and (for a job that needs a new slot) one at its
// limit are passed over, consuming no attempt.
func (m *jobsModel) admits(s *jmStep, now time.Time) bool {
	g := m.gate(s)
	r := m.room(g, now)
	var held string
	switch {
	case g.paused:
		held = "paused"
	case r.rate == 0:
		held = "out of its rate"
	case r.probe == 0:
		held = "circuit open"
	case !s.reclaim() && r.conc == 0:
		held = "at its limit"
	default:
		return true
	}
	m.seen["model: a due job held back, its endpoint "+held]++
	return false
}

// jmGroup is a claim's share of one endpoint: its reclaims or its jobs
// needing a new slot, each group granted the longest due first.
type jmGroup struct {
	g       *jmGate
	reclaim bool
}

// grants is what each endpoint grants of the candidates: its reclaims
// within its rate allowance and probe, then its others within what those
// left and its free slots.
func (m *jobsModel) grants(cands []*jmStep, now time.Time) map[jmGroup]int {
	n := map[jmGroup]int{}
	for _, s := range cands {
		n[jmGroup{m.gate(s), s.reclaim()}]++
	}
	out := map[jmGroup]int{}
	for grp := range n {
		r := m.room(grp.g, now)
		re, fresh := jmGroup{grp.g, true}, jmGroup{grp.g, false}
		out[re] = min(n[re], r.rate, r.probe)
		out[fresh] = min(n[fresh], r.rate-out[re], r.conc, r.probe-out[re])
	}
	return out
}

// checkGrants checks a claim's jobs against the model's due jobs (cands,
// those the gates admit): each one of them, at most once, within limit,
// each group's the longest due of the group (claimedGroups); and as many
// per group as the endpoints grant of the limit's longest due candidates.
// When the candidates tie at the limit across groups (the server breaks
// ready-time ties its own way), the counts are checked against the
// endpoints' room only (withinRoom).
func (m *jobsModel) checkGrants(w, limit int, cands []*jmStep, got []jmClaimed, body []byte) bool {
	now := m.now()
	count, ok := m.claimedGroups(w, limit, cands, got, body)
	if !ok {
		return false
	}
	sorted := slices.Clone(cands)
	slices.SortStableFunc(sorted, func(a, b *jmStep) int { return jmReady(a, now).Compare(jmReady(b, now)) })
	if len(sorted) > limit && jmReady(sorted[limit-1], now).Equal(jmReady(sorted[limit], now)) &&
		!m.oneGroupAt(sorted, limit, now) {
		m.seen["model: claim tied at its limit"]++
		return m.withinRoom(w, count, len(cands), body)
	}
	cut := sorted[:min(limit, len(sorted))]
	if len(got) < len(cut) {
		m.seen[fmt.Sprintf("model: claim granted %d of %d candidates", len(got), len(cut))]++
	}
	for grp, k := range m.grants(cut, now) {
		if count[grp] != k {
			m.fail("claim worker %d limit %d: %d of endpoint %s (reclaims %v), model %d of %d due: %s", w, limit,
				count[grp], grp.g.name, grp.reclaim, k, len(cands), body)
			return false
		}
	}
	m.seen["model: claim granted exactly"]++
	return true
}

// jmReady is the time the step's job has been due since, which orders a
// claim's candidates.
func jmReady(s *jmStep, now time.Time) time.Time {
	t, _ := s.claimable(now)
	return t
}

// claimedGroups counts a claim's jobs by group, checking that each is one
// of the candidates, taken once, no more than limit, and that no candidate
// was left for a later due one of its group.
func (m *jobsModel) claimedGroups(w, limit int, cands []*jmStep, got []jmClaimed, body []byte) (map[jmGroup]int, bool) {
	now := m.now()
	taken := map[*jmStep]bool{}
	count := map[jmGroup]int{}
	for _, j := range got {
		s := m.byJob(j.JobID)
		if s == nil || !slices.Contains(cands, s) || taken[s] {
			m.fail("claim worker %d: job %s is not one the model has due (or twice): %s", w, j.JobID, body)
			return nil, false
		}
		taken[s] = true
		count[jmGroup{m.gate(s), s.reclaim()}]++
	}
	if len(got) > limit {
		m.fail("claim worker %d limit %d: %d jobs", w, limit, len(got))
		return nil, false
	}
	for _, s := range cands {
		for _, o := range cands {
			if taken[o] && !taken[s] && m.gate(o) == m.gate(s) && o.reclaim() == s.reclaim() &&
				jmReady(s, now).Before(jmReady(o, now)) {
				m.fail("claim worker %d: %s (due %v) left for %s due at %v", w, s.name(), jmReady(s, now), o.name(),
					jmReady(o, now))
				return nil, false
			}
		}
	}
	return count, true
}

// withinRoom checks a claim's counts against its endpoints' room, and that
// it leased one job at least (the longest due candidate's endpoint has
// room for it, or for a reclaim before it).
func (m *jobsModel) withinRoom(w int, count map[jmGroup]int, due int, body []byte) bool {
	for grp := range count {
		r := m.room(grp.g, m.now())
		re, fresh := count[jmGroup{grp.g, true}], count[jmGroup{grp.g, false}]
		if re+fresh > min(r.rate, r.probe) || fresh > r.conc {
			m.fail("claim worker %d: %d reclaims and %d new jobs of endpoint %s, past its room %+v: %s", w, re, fresh,
				grp.g.name, r, body)
			return false
		}
	}
	if len(count) == 0 {
		m.fail("claim worker %d: no job of %d due", w, due)
		return false
	}
	return true
}

// oneGroupAt says whether the candidates tied with the limit's last one
// are all of one group: which of them the server takes then changes no
// group's count.
func (m *jobsModel) oneGroupAt(sorted []*jmStep, limit int, now time.Time) bool {
	at := jmReady(sorted[limit-1], now)
	var first *jmStep
	for _, s := range sorted {
		if !jmReady(s, now).Equal(at) {
			continue
		}
		if first == nil {
			first = s
		} else if m.gate(s) != m.gate(first) || s.reclaim() != first.reclaim() {
			return false
		}
	}
	return true
}

// countGrants records a claim's grants on its endpoints: the rate window
// (counted when the claim writes the endpoint's row: it has a limit, or its
// circuit is open), and an open circuit's next probe a cooldown on.
func (m *jobsModel) countGrants(leased []*jmStep, now time.Time) {
	fresh, all := map[*jmGate]int{}, map[*jmGate]int{}
	for _, s := range leased {
		g := m.gate(s)
		all[g]++
		if !s.reclaim() {
			fresh[g]++
		}
	}
	for g, n := range all {
		if minute := now.Truncate(time.Minute); g.startedMinute.Equal(minute) {
			g.started += n
		} else {
			g.startedMinute, g.started = minute, n
		}
		if g.maxConcurrent > 0 && fresh[g] > 0 || g.rate > 0 || g.open {
			g.windowCount = g.windowAt(now) + n
			if minute := now.Truncate(time.Minute); minute.After(g.windowStart) {
				g.windowStart = minute
			}
		}
		if g.open {
			g.probeAt = now.Add(g.cooldown)
			m.seen["model: a probe leased"]++
		}
	}
}

// countReport counts a report that moved its job (not a cancelled
// attempt's, not a refused output) on its endpoint's breaker, if on: a
// success resets the count and closes an open circuit; a retryable failure
// adds one, opening the circuit at the threshold, or restarts an open
// one's cooldown (a failed probe).
func (m *jobsModel) countReport(s *jmStep, success, retryableFailure bool) {
	g, now := m.gate(s), m.now()
	switch {
	case g.threshold == 0:
	case success:
		if g.open {
			m.seen["model: a success closes the circuit"]++
		}
		g.failures, g.open = 0, false
	case retryableFailure:
		g.failures++
		if g.open || g.failures >= g.threshold {
			if !g.open {
				g.open, g.openedAt = true, now
				m.seen["model: failures open the circuit"]++
			}
			g.probeAt = now.Add(g.cooldown)
		}
	}
}

// --- operations

// gateStep is one of the operations on gates, contracts and keys.
func (m *jobsModel) gateStep(s *jmStep) {
	name := jmTools[s.spec.tool].name
	switch r := m.rng.IntN(100); {
	case r < 35:
		m.setPolicy(name)
	case r < 45:
		m.closeCircuit(name)
	case r < 65:
		m.readEndpoint(name)
	case r < 92:
		m.refusedEnqueue(s.run)
	default:
		m.revokeKey()
	}
}

// setPolicy PUTs some of an endpoint's gate fields (a merge: the others
// keep their values), now and then with a stale expectedVersion
// (409 version_conflict, nothing changed).
func (m *jobsModel) setPolicy(name string) {
	g := m.gates[name]
	body := map[string]any{"expectedVersion": g.version}
	stale := g.version > 1 && m.rng.IntN(8) == 0
	if stale {
		body["expectedVersion"] = g.version - 1
	}
	next := *g
	pick := func(field string, to *int, values ...int) {
		if m.rng.IntN(2) == 0 {
			v := values[m.rng.IntN(len(values))]
			*to = v
			body[field] = v
			if v == 0 {
				body[field] = nil
			}
		}
	}
	pick("maxConcurrent", &next.maxConcurrent, 0, 1, 2)
	pick("rateLimitPerMinute", &next.rate, 0, 2, 3)
	pick("circuitFailureThreshold", &next.threshold, 0, 1, 2)
	if m.rng.IntN(3) == 0 {
		next.cooldown = []time.Duration{2 * time.Second, 7 * time.Second}[m.rng.IntN(2)]
		body["circuitCooldownMs"] = next.cooldown.Milliseconds()
	}
	r := m.env.Do("PUT", "/api/v1/endpoints/"+g.id+"/policy", m.ws.Key, body)
	m.log("policy %s %v -> %d %s", name, body, r.Status, r.ErrorCode())
	if stale {
		if r.Status != http.StatusConflict || r.ErrorCode() != "version_conflict" {
			m.fail("policy %s with a stale version: %d %s", name, r.Status, r.Body)
		}
		return
	}
	if r.Status != http.StatusOK {
		m.fail("policy %s: %d %s", name, r.Status, r.Body)
		return
	}
	if next.maxConcurrent != g.maxConcurrent || next.rate != g.rate || next.threshold != g.threshold ||
		next.cooldown != g.cooldown {
		next.version++ // an update that changes nothing makes no new version (README)
	}
	if next.rate > 0 && next.rate != g.rate {
		// A limit set or changed counts the minute's attempts so far.
		minute := m.now().Truncate(time.Minute)
		next.windowStart, next.windowCount = minute, 0
		if g.startedMinute.Equal(minute) {
			next.windowCount = g.started
		}
		if next.windowCount > 0 {
			m.seen["model: a limit set counts the minute's earlier attempts"]++
		}
	}
	if next.threshold == 0 {
		// Turned off (or left off): closed, its count forgotten.
		next.open, next.failures = false, 0
	}
	*g = next
	m.checkEndpoint(g, r.Body, "policy's answer")
}

func (m *jobsModel) closeCircuit(name string) {
	g := m.gates[name]
	r := m.env.Do("POST", "/api/v1/endpoints/"+g.id+"/circuit/close", m.ws.Key, nil)
	m.log("close circuit %s (open %v) -> %d %s", name, g.open, r.Status, r.ErrorCode())
	if r.Status != http.StatusOK {
		m.fail("close circuit %s: %d %s", name, r.Status, r.Body)
		return
	}
	g.open, g.failures = false, 0
	m.checkEndpoint(g, r.Body, "close's answer")
}

func (m *jobsModel) readEndpoint(name string) {
	g := m.gates[name]
	r := m.env.Do("GET", "/api/v1/endpoints/"+g.id+"/policy", m.ws.Key, nil)
	m.log("read endpoint %s -> %d", name, r.Status)
	if r.Status != http.StatusOK {
		m.fail("read endpoint %s: %d %s", name, r.Status, r.Body)
		return
	}
	m.checkEndpoint(g, r.Body, "read")
}

// checkEndpoint compares an endpoint object with the model.
func (m *jobsModel) checkEndpoint(g *jmGate, body []byte, what string) {
	var got jobs.Endpoint
	if err := json.Unmarshal(body, &got); err != nil {
		m.fail("%s of endpoint %s: %v", what, g.name, err)
		return
	}
	state, openedAt, probeAt := jobs.CircuitClosed, (*time.Time)(nil), (*time.Time)(nil)
	if g.open {
		state, openedAt, probeAt = jobs.CircuitOpen, &g.openedAt, &g.probeAt
	}
	c := got.Circuit
	if got.Version != g.version || got.Paused != g.paused || orZero(got.MaxConcurrent) != g.maxConcurrent ||
		orZero(got.RateLimitPerMinute) != g.rate || orZero(got.CircuitFailureThreshold) != g.threshold ||
		got.CircuitCooldownMs != g.cooldown.Milliseconds() || c.State != state || !sameTime(c.OpenedAt, openedAt) ||
		!sameTime(c.ProbeAt, probeAt) || c.ConsecutiveFailures != g.failures {
		m.fail("%s of endpoint %s: %s; model %+v", what, g.name, body, *g)
	}
}

func orZero(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// jmCharge is the tool that runs under a contract; its contracts: 1 ACTIVE
// for its version (the one implicitly selected), 2 FORBIDDEN for it, 3
// ACTIVE for another handler version, jmChargeV2, which only the second
// key's worker serves.
const jmCharge = 2

var jmChargeV2 = jmTool{"mdl_charge", "2"}

// serves is what worker w's registration serves: jmWorkers' set, or for
// the second key's worker every tool and jmChargeV2.
func (m *jobsModel) serves(w int) []jmTool {
	if w >= len(jmWorkers) {
		return append(slices.Clone(jmTools), jmChargeV2)
	}
	var out []jmTool
	for _, i := range jmWorkers[w] {
		out = append(out, jmTools[i])
	}
	return out
}

// jmUpgrade is what a replay's body asks of a contract change: the handler
// version it moves the job to ("" for none), or a FORBIDDEN target.
type jmUpgrade struct {
	to        string
	forbidden bool
}

// replayUpgrade makes half of an mdl_charge step's replays change its
// contract (README "Tool contracts and replay"): onto the other handler
// version's ACTIVE contract (3 from version 1, 1 from version 2), naming
// the step's current handler version and acknowledging the change, or now
// and then onto the FORBIDDEN one (409 invalid_state, nothing changed).
// Only workers of the new exact version claim the job then.
func (m *jobsModel) replayUpgrade(s *jmStep, body map[string]any) jmUpgrade {
	if s.spec.tool != jmCharge || m.rng.IntN(2) == 0 {
		return jmUpgrade{}
	}
	cur := s.handler().version
	body["expectedHandlerVersion"], body["acknowledgeVersionChange"] = cur, true
	if m.rng.IntN(5) == 0 {
		body["targetContractVersion"] = 2
		return jmUpgrade{forbidden: true}
	}
	if cur == "1" {
		body["targetContractVersion"] = 3
		return jmUpgrade{to: "2"}
	}
	body["targetContractVersion"] = 1
	return jmUpgrade{to: "1"}
}

// jmContracts publishes mdl_charge's contracts, before any enqueue: the
// ACTIVE one's timeout and retry policy equal the endpoint's (they replace
// it), so only its schemas tell its jobs apart.
func jmContracts(env *apitest.Env, ws apitest.Workspace) {
	input := map[string]any{"type": "object", "required": []string{"step"},
		"properties": map[string]any{"step": map[string]any{"type": "integer"}}}
	output := map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "boolean"}}
	for _, c := range []map[string]any{
		{"handlerVersion": "1", "status": "ACTIVE"},
		{"handlerVersion": "1", "status": "FORBIDDEN"},
		{"handlerVersion": "2", "status": "ACTIVE"},
	} {
		c["inputSchema"], c["outputSchema"], c["timeoutMs"], c["retryPreset"] = input, output, 20_000, "STANDARD"
		env.Must(http.StatusCreated, "POST", "/api/v1/tools/mdl_charge/contracts", ws.Key, c)
	}
}

// refusedEnqueue sends an enqueue of mdl_charge@1 that its contracts
// refuse: under the FORBIDDEN contract (409 invalid_state), under another
// handler version's (400 on version), or with an input its inputSchema
// refuses (400 on input.step). The run's read afterwards shows no new step.
func (m *jobsModel) refusedEnqueue(run *jmRun) {
	tl := jmTools[jmCharge]
	b := map[string]any{"name": tl.name, "version": tl.version, "input": map[string]any{"step": 1}}
	var status int
	var code, field string
	switch m.rng.IntN(3) {
	case 0:
		b["contractVersion"], status, code = 2, http.StatusConflict, "invalid_state"
	case 1:
		b["contractVersion"], status, code, field = 3, http.StatusBadRequest, "invalid_request", "version"
	default:
		b["input"], status, code, field = map[string]any{"step": "one"}, http.StatusBadRequest, "invalid_request", "input.step"
	}
	if run.requested {
		// The finished run's refusal comes first (README is silent on
		// which; the server decides the run's state first).
		status, code, field = http.StatusConflict, "invalid_state", ""
	}
	r := m.env.Do("POST", "/api/v1/runs/"+run.id+"/steps", m.ws.Key, b)
	m.log("refused enqueue run %d %v -> %d %s", run.i, b, r.Status, r.ErrorCode())
	if r.Status != status || r.ErrorCode() != code || field != "" && !strings.Contains(string(r.Body), `"field":"`+field+`"`) {
		m.fail("refused enqueue run %d: %d %s, model %d %s at %q", run.i, r.Status, r.Body, status, code, field)
	}
}

// jmKey is a WORKER key: its secret and id, the tools it lists, and
// whether it was revoked; its rate limit (0: none) and the requests it
// counted in its window's minute.
type jmKey struct {
	secret, id string
	tools      []jmTool
	revoked    bool
	rate       int
	window     time.Time
	used       int
}

// jmKeyRate is the second keys' rate_limit_per_minute: a claim past it is
// 429 rate_limited; heartbeats and reports are not counted (README "Rate
// limits": they settle what a counted call began).
const jmKeyRate = 4

// counted counts a request the key's limit counts (a refused one too, as
// README says), and answers the seconds to wait when it is past the limit
// (0 when within).
func (k *jmKey) counted(now time.Time) int {
	if k.rate == 0 {
		return 0
	}
	if minute := now.Truncate(time.Minute); !minute.Equal(k.window) {
		k.window, k.used = minute, 0
	}
	if k.used++; k.used <= k.rate {
		return 0
	}
	return int(math.Ceil(k.window.Add(time.Minute).Sub(now).Seconds()))
}

// revokeKey revokes the last worker's key or, when it is revoked
// already, mints another and registers that worker again under it: the
// sequence goes on with a live second key, and the revoked ones stay in
// use now and then.
func (m *jobsModel) revokeKey() {
	w := len(m.workers) - 1
	k := &m.keys[m.workerKey[w]]
	if k.revoked {
		key, worker := jmSecondKey(m.env, m.ws, jmKeyRate)
		key.counted(m.now()) // its worker's registration
		m.keys, m.workers[w], m.workerKey[w] = append(m.keys, key), worker, len(m.keys)
		// A claim sent again answers only its own worker's leases (README):
		// the new worker has sent none.
		delete(m.lastClaim, w)
		m.log("new worker key %d", len(m.keys)-1)
		return
	}
	r := m.env.Do("DELETE", "/api/v1/keys/"+k.id, m.ws.Key, nil)
	m.log("revoke worker key %d -> %d %s", m.workerKey[w], r.Status, r.ErrorCode())
	if r.Status != http.StatusOK {
		m.fail("revoke worker key: %d %s", r.Status, r.Body)
		return
	}
	k.revoked = true
}

// pickKey is a WORKER key for a heartbeat or report: usually the first,
// which is never revoked, else one of the others, revoked or not.
func (m *jobsModel) pickKey() *jmKey {
	if m.rng.IntN(5) == 0 {
		return &m.keys[1+m.rng.IntN(len(m.keys)-1)]
	}
	return &m.keys[0]
}

// refusedRevoked checks the answer to a call with a revoked key:
// 401 unauthorized, and the caller changes nothing.
func (m *jobsModel) refusedRevoked(what string, status int, code string, body []byte) {
	m.seen["model: a revoked key refused"]++
	if status != http.StatusUnauthorized || code != "unauthorized" {
		m.fail("%s with a revoked key: %d %s", what, status, body)
	}
}

// refusedKey says whether the key may not heartbeat or report the step's
// job, checking the refusal: a revoked key is 401; a key that does not list
// the job's handler version (one a replay moved it to) is 403 forbidden
// naming it, even with the job's lease token (README "Durable jobs":
// Work). The caller changes nothing then.
func (m *jobsModel) refusedKey(k *jmKey, s *jmStep, what string, status int, code string, body []byte) bool {
	switch {
	case k.revoked:
		m.refusedRevoked(what, status, code, body)
	case !slices.Contains(k.tools, s.handler()):
		m.seen["model: a key not listing the job's version refused"]++
		if status != http.StatusForbidden || code != "forbidden" || !strings.Contains(string(body), "tool:"+s.handler().ref()) {
			m.fail("%s of %s with a key not listing it: %d %s", what, s.name(), status, body)
		}
	default:
		return false
	}
	return true
}

// jmSecondKey mints the second WORKER key (for every tool and jmChargeV2,
// with a rate limit of rate a minute, 0 for none) and registers a worker
// serving them all under it (a request the limit counts).
func jmSecondKey(env *apitest.Env, ws apitest.Workspace, rate int) (jmKey, string) {
	var refs []string
	var tools []map[string]any
	for _, tl := range append(slices.Clone(jmTools), jmChargeV2) {
		refs = append(refs, tl.ref())
		tools = append(tools, map[string]any{"name": tl.name, "version": tl.version})
	}
	body := map[string]any{"name": "worker b", "preset": "WORKER", "tools": refs}
	if rate > 0 {
		body["rate_limit_per_minute"] = rate
	}
	k := env.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key, body).JSON()
	key := jmKey{secret: k["secret"].(string), id: k["id"].(string), tools: append(slices.Clone(jmTools), jmChargeV2),
		rate: rate}
	r := env.Must(http.StatusCreated, "POST", "/api/v1/workers/register", key.secret, map[string]any{"tools": tools})
	return key, r.JSON()["workerId"].(string)
}

// jmGates reads the endpoints' gates as created.
func jmGates(env *apitest.Env, ws apitest.Workspace, ids map[string]string) map[string]*jmGate {
	out := map[string]*jmGate{}
	for name, id := range ids {
		var got jobs.Endpoint
		env.Must(http.StatusOK, "GET", "/api/v1/endpoints/"+id+"/policy", ws.Key, nil).Decode(env.T, &got)
		out[name] = &jmGate{name: name, id: id, version: got.Version,
			cooldown: time.Duration(got.CircuitCooldownMs) * time.Millisecond}
	}
	return out
}

func (g jmGate) String() string {
	return fmt.Sprintf("{v%d paused=%v max=%d rate=%d window=%s+%d threshold=%d cooldown=%s open=%v opened=%s probe=%s failures=%d}",
		g.version, g.paused, g.maxConcurrent, g.rate, g.windowStart.Format("15:04"), g.windowCount, g.threshold,
		g.cooldown, g.open, g.openedAt.Format("15:04:05"), g.probeAt.Format("15:04:05"), g.failures)
}

// --- the concurrent model's gates and revocation

// cjLimited is the endpoint the concurrent model gives a maxConcurrent of
// cjMaxConcurrent.
const (
	cjLimited       = "mdl_send"
	cjMaxConcurrent = 2
)

// limitEndpoints sets cjLimited's maxConcurrent before any claim.
func (c *concurrentJobs) limitEndpoints(ids map[string]string) {
	env := c.envs[0]
	var e jobs.Endpoint
	env.Must(http.StatusOK, "GET", "/api/v1/endpoints/"+ids[cjLimited]+"/policy", c.ws.Key, nil).Decode(c.t, &e)
	env.Must(http.StatusOK, "PUT", "/api/v1/endpoints/"+e.ID+"/policy", c.ws.Key,
		map[string]any{"expectedVersion": e.Version, "maxConcurrent": cjMaxConcurrent})
}

// checkLimits reads the run (its steps as of one moment, README) and checks
// that no more of cjLimited's jobs run than its maxConcurrent allows:
// claims never hand out more, whatever the interleaving.
func (c *concurrentJobs) checkLimits(g int, env *apitest.Env) {
	var run struct {
		Steps []struct{ Endpoint, Status string }
	}
	res := env.Do("GET", "/api/v1/runs/"+c.run, c.ws.Key, nil)
	if res.Status != http.StatusOK || json.Unmarshal(res.Body, &run) != nil {
		c.fail(g, "read run: %d %s", res.Status, res.Body)
		return
	}
	n := 0
	for _, s := range run.Steps {
		if s.Endpoint == cjLimited && s.Status == jobs.StatusRunning {
			n++
		}
	}
	c.mu.Lock()
	c.peak = max(c.peak, n)
	c.mu.Unlock()
	if n > cjMaxConcurrent {
		c.fail(g, "%d of %s's jobs RUNNING at once, maxConcurrent %d", n, cjLimited, cjMaxConcurrent)
	}
}

// cjRevocation is the second worker key's revocation: started when its
// DELETE is sent; at, once answered, the clock then (UnixNano, 0 before).
type cjRevocation struct {
	id      string
	started atomic.Bool
	at      atomic.Int64
}

// cjKeyCacheTTL is apitest.Config's KeyCacheTTL: how long, by the service's
// clock, another instance may still accept a revoked key's heartbeats and
// reports.
const cjKeyCacheTTL = 5 * time.Second

// revokedBefore says whether the revocation was answered before sent (the
// clock when a call was sent), and whether every instance must refuse the
// key's heartbeats and reports by then: its cache, which held the key at
// most KEY_CACHE_TTL from a look-up made before the revocation, has
// forgotten it.
func (r *cjRevocation) revokedBefore(sent time.Time) (revoked, everywhere bool) {
	at := r.at.Load()
	if at == 0 {
		return false, false
	}
	return true, sent.After(time.Unix(0, at).Add(cjKeyCacheTTL))
}

// keyOf is the key worker w registered under: the second key's worker is
// the last.
func (c *concurrentJobs) keyOf(w int) string {
	if w == len(c.workers)-1 {
		return c.keys[1]
	}
	return c.keys[0]
}

// revokeSecond revokes the second key, on the first instance.
func (c *concurrentJobs) revokeSecond() {
	c.revoke.started.Store(true)
	res := c.envs[0].Do("DELETE", "/api/v1/keys/"+c.revoke.id, c.ws.Key, nil)
	if res.Status != http.StatusOK {
		c.fail(0, "revoke: %d %s", res.Status, res.Body)
	}
	c.revoke.at.Store(c.clock.Now().UnixNano())
}

// revokedAnswer checks a call's answer for the key's revocation and says
// whether it was refused for it (nothing else to check: it changed
// nothing). A 401 only once the revocation was sent; once it was answered
// before the call (revoked), the call must be refused when mustRefuse: a
// claim on any instance (its statement checks the key), a heartbeat or
// report on the revoking instance, which forgets the key at once, or on
// another once KEY_CACHE_TTL has passed (README "Key cache and revocation
// bound"; revokedBefore).
func (c *concurrentJobs) revokedAnswer(g int, key, what string, res *apitest.Response, revoked, mustRefuse bool) bool {
	if key != c.keys[1] {
		return false
	}
	if res.Status == http.StatusUnauthorized {
		if !c.revoke.started.Load() || res.ErrorCode() != "unauthorized" {
			c.fail(g, "%s with the second key before its revocation: %d %s", what, res.Status, res.Body)
		}
		return true
	}
	if revoked && mustRefuse {
		c.fail(g, "%s with the revoked key: %d %s, want 401 unauthorized", what, res.Status, res.Body)
		return true
	}
	return false
}

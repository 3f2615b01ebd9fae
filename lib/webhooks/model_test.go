package webhooks_test

import (
	"bytes"
	"cmp"
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/seal"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// Webhooks checked against a model: from a seed, a random sequence of
// subscription creates, PATCHes (url, events, disabled; now and then a
// body the route refuses), deletes (and deletes again) and secret
// rotations (with and without replace_previous, with the default, no, or a
// short previous secret lifetime), events produced by gate and jobs
// operations (a type's breaker opened and closed, the emergency stop and
// its release, a run finished, an effect's lease lapsing: found by a pass
// or by its late report, never by a read), receivers answering 2xx, 4xx,
// 5xx or slowly as the seed says (or a URL nobody listens on: connection
// refused), clock moves (seconds, minutes, hours, past the events'
// retention, or to the next delivery due), sweeps (the webhook tasks, or
// the sweeper's whole pass with its retention), deliveries' retries and
// reads, creates, rotations and retries under an Idempotency-Key replayed
// or reused, and another workspace's requests, every answer compared with
// what a plain Go model of API.md §2.7 and README "Webhooks" predicts:
// which events were sent to which receiver (each due delivery once a pass,
// none of a disabled, deleted or unsubscribed subscription's, none of an
// event recorded before its creation or while it was disabled, none to
// another workspace's subscription, a delivered one never again unless
// retried), each send's body and signature (signed at the send with the
// then-current secret, and the previous one while it still signs, the
// current one's v1 first), and on the reads each delivery's state,
// attempts, last status and error, next attempt (30 s doubling, capped at
// 6 h, ±20 % jitter; failed after 12 attempts) and delivery time, and
// each subscription's fields. A failure names the seed and the trace;
// MODEL_SEED=<n> replays one seed, MODEL_SEEDS=<n> runs n seeds,
// MODEL_OPS=<n> makes each sequence n operations long (a seed's sequence
// of a given length is a prefix of its longer ones).
//
// Not parallel (TestMain): a pass sweeps the package's shared outbox at
// this run's clock.
func TestWebhooksModelSequential(t *testing.T) {
	apitest.ModelRuns(t, 3, 80, runHookModel)
}

// The receiver paths a subscription's URL may name, and the types whose
// breakers the sequence opens and closes.
var (
	hmPaths = []string{"/r0", "/r1", "/r2"}
	hmTypes = []string{"mdl.a", "mdl.b"}
	// hmEvents are the types a subscription may list: those the sequence
	// produces and one it never does.
	hmEvents = []string{events.CircuitTripped, events.CircuitClosed, events.RunFinished, events.EffectIndeterminate,
		events.StepExhausted}
	// hmModes are what a receiver may answer: a status, and whether it
	// takes a while first.
	hmModes = []hmMode{{200, false}, {204, false}, {200, true}, {400, false}, {410, false}, {500, false},
		{503, false}, {500, true}}
)

// hmRetentionDays is the run's EVENT_RETENTION_DAYS.
const hmRetentionDays = 30

type hmMode struct {
	status int
	slow   bool
}

// hmEvent is one outbox event of the run's workspace.
type hmEvent struct {
	id, typ, subject string
	created          time.Time
	dispatched       bool
	purged           bool // deleted by retention, with its deliveries
}

// hmDelivery is the model's view of one delivery.
type hmDelivery struct {
	id        string
	ev        *hmEvent
	state     string // pending | delivered | failed
	attempts  int
	claims    int       // claims so far (migration 0073): a retry gives attempts back, never these
	next      time.Time // while pending; exact unless window
	window    [2]time.Time
	windowed  bool // next is within window (a failure's jittered backoff), read to learn it
	code      int  // 0: none
	lastError string
	delivered time.Time
	created   time.Time
}

// hmEffect is an effect begun whose lease lapses: the sweeper's pass that
// finds it lapsed, or its first read, records its effect.indeterminate.
type hmEffect struct {
	id, token string
	leaseEnd  time.Time
	evented   bool
	reported  bool // in time: it succeeded, and no lapse is recorded
	ended     time.Time
	gone      bool // deleted by the effects' retention
}

// lapsed answers the effects whose lease has lapsed at now with no
// effect.indeterminate yet, as recorded expects them, and marks them.
func (m *hookModel) lapsed(effects ...*hmEffect) []string {
	var out []string
	for _, e := range effects {
		if !e.evented && !e.reported && !e.leaseEnd.After(m.now()) {
			e.evented = true
			out = append(out, events.EffectIndeterminate+" "+e.id)
		}
	}
	return out
}

// hmHook is the model's view of one subscription.
type hmHook struct {
	id, url    string
	lostKey    bool // its secret is sealed under a key the instance lacks (lose)
	prevLost   bool // its previous secret is: left out of the instance's signatures
	events     []string
	created    time.Time
	disabledAt time.Time // zero while enabled
	lastOff    [2]time.Time
	hasLastOff bool
	deleted    bool
	deleteAns  map[string]any // the delete's answer, given again to a DELETE of it again
	secret     string
	previous   string
	prevUntil  time.Time // zero: none
	dels       []*hmDelivery
}

func (h *hmHook) signing(now time.Time) bool { return !h.prevUntil.IsZero() && h.prevUntil.After(now) }

type hookModel struct {
	t         *testing.T
	seed      uint64
	rng       *rand.Rand
	env       *apitest.Env
	ws        apitest.Workspace
	other     apitest.Workspace // another workspace, with a subscription of its own
	clock     *apitest.Clock
	rcv       *tally
	dead      string // a URL nobody listens on
	mu        sync.Mutex
	modes     map[string]hmMode // receiver path → its answer
	hooks     []*hmHook
	events    []*hmEvent
	open      map[string]bool // breaker (type, or "*" for the stop) → open
	effects   []*hmEffect
	trace     *apitest.ModelTrace
	seen      map[string]int
	ops       int
	keyedReqs []*hmKeyed
	lastKeyed *hmKeyed // the request keyed() sent last, until its answer is known
	lost      *seal.Sealer
	withKey   *apitest.Env // an instance configured with lost's key too, once a secret is sealed under it
	gate      *hmGate      // while hang holds a receiver's sends
}

// hmKeyed is a request sent with an Idempotency-Key and answered 2xx: the
// same request under its key is answered it again, byte for byte (a
// create's or rotation's, which show a secret, 404 once the webhook is
// deleted), another one is 409 idempotency_key_reuse.
type hmKeyed struct {
	what, key, path string
	body            []byte
	hook            *hmHook
	at              time.Time
	status          int
	answer          []byte
	requestID       string
}

// hmLostKey is the key lose seals secrets under: not the instance's.
var hmLostKey = bytes.Repeat([]byte{3}, 32)

// hmConfig is the run's configuration: a pool of 3 or 4 connections, as
// the seed says, so that a pass's claims and records (on its share of
// DB_MAX_CONNS − 2, at least 1) take turns.
func hmConfig(seed uint64) func(*config.Config) {
	return func(cfg *config.Config) {
		cfg.EventRetentionDays = hmRetentionDays
		cfg.DBMaxConns = 3 + int32(seed%2)
	}
}

func runHookModel(t *testing.T, seed uint64, ops int) {
	env, clk := start(t, true, apitest.WithConfig(hmConfig(seed)))
	clk.Set(time.Now().Truncate(time.Second))
	m := &hookModel{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x686f6f6b)), env: env, ws: hammered(t, env),
		clock: clk, modes: map[string]hmMode{}, open: map[string]bool{}, seen: map[string]int{}, ops: ops,
		trace: apitest.NewModelTrace(t, fmt.Sprintf("MODEL_SEED=%d MODEL_OPS=%d go test -run 'TestWebhooksModelSequential' ./lib/webhooks", seed, ops))}
	lost, err := seal.New(hmLostKey)
	require.NoError(t, err)
	m.lost = lost
	m.rcv = newTally(t, func(req *http.Request, event string, _ int) int {
		m.mu.Lock()
		mode := m.modes[receiverOf(req.URL.Path)]
		g := m.gate
		m.mu.Unlock()
		if g != nil {
			if status, ok := g.hold(req, event); ok {
				return status
			}
		}
		if mode.slow {
			time.Sleep(30 * time.Millisecond) // not a timing assertion: what a slow receiver does
		}
		return mode.status
	})
	for _, p := range hmPaths {
		m.modes[p] = hmModes[0]
	}
	// Another workspace, subscribed to every type at a receiver of the
	// run's: it is sent none of this workspace's events, and its key
	// finds none of this workspace's subscriptions.
	m.other = hammered(t, env)
	env.Must(http.StatusCreated, "POST", "/api/v1/webhooks", m.other.Key,
		map[string]any{"url": m.rcv.URL + hmPaths[0] + "/other", "events": events.Types})
	var l net.Listener
	l, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m.dead = "http://" + l.Addr().String() + "/gone"
	require.NoError(t, l.Close())
	t.Cleanup(func() {
		if !t.Failed() {
			t.Logf("covered: %v", m.seen)
		}
	})
	for i := 0; i < ops && !m.trace.Failed(); i++ {
		m.step()
	}
	if !m.trace.Failed() {
		// Everything due goes out and reads as the model says.
		m.sweep()
	}
}

func (m *hookModel) fail(format string, args ...any) {
	m.t.Helper()
	m.trace.Fail(format, args...)
}

// log adds a line to the trace and counts the operation and its answer
// ("op ... -> answer") as covered.
func (m *hookModel) log(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	m.trace.Add(line)
	if op, answer, ok := strings.Cut(line, " -> "); ok {
		op, _, _ = strings.Cut(op, " ")
		answer, _, _ = strings.Cut(answer, " ")
		m.seen[op+" "+answer]++
	}
}

func (m *hookModel) now() time.Time { return m.clock.Now() }

func (m *hookModel) live() []*hmHook {
	var out []*hmHook
	for _, h := range m.hooks {
		if !h.deleted {
			out = append(out, h)
		}
	}
	return out
}

func (m *hookModel) pick(hooks []*hmHook) *hmHook {
	if len(hooks) == 0 {
		return nil
	}
	return hooks[m.rng.IntN(len(hooks))]
}

func (m *hookModel) step() {
	live := m.live()
	switch r := m.rng.IntN(100); {
	case r < 6 || len(live) == 0:
		switch {
		case len(live) < 4:
			m.create()
		case m.rng.IntN(3) == 0:
			m.fill()
		default:
			m.produce()
		}
	case r < 24:
		m.produce()
	case r < 36:
		m.sweep()
	case r < 44:
		m.moveClock()
	case r < 56:
		// The next retry falls due, or every one, and is sent.
		last := m.rng.IntN(2) == 0
		if next := m.nextDue(last); next.After(m.now()) {
			m.clock.Add(next.Sub(m.now()))
			m.log("clock to the next due (last=%v)", last)
		}
		m.sweep()
	case r < 64:
		m.patch(m.pick(live))
	case r < 69:
		m.rotate(m.pick(live))
	case r < 71:
		m.remove(m.pick(m.hooks))
	case r < 77:
		m.retry()
	case r < 79:
		m.replay()
	case r < 80:
		m.foreign(m.pick(m.hooks))
	case r < 81:
		m.crash()
	case r < 85:
		p := hmPaths[m.rng.IntN(len(hmPaths))]
		mode := hmModes[m.rng.IntN(len(hmModes))]
		m.mu.Lock()
		m.modes[p] = mode
		m.mu.Unlock()
		m.log("receiver %s answers %d slow=%v", p, mode.status, mode.slow)
	case r < 86:
		m.lose(m.pick(live))
	case r < 89:
		m.hang()
	default:
		m.read(m.pick(m.hooks))
	}
}

// hookURL is a URL for subscription tag: a receiver's path, or none. The
// tag tells apart the subscriptions sent to one receiver.
func (m *hookModel) hookURL(tag int) string {
	if m.rng.IntN(4) == 0 {
		return m.dead
	}
	return fmt.Sprintf("%s%s/%d", m.rcv.URL, hmPaths[m.rng.IntN(len(hmPaths))], tag)
}

// receiverOf is the receiver a path of hookURL names.
func receiverOf(path string) string {
	i := strings.LastIndexByte(path, '/')
	return path[:max(i, 0)]
}

// eventList is a random list of event types to subscribe to, perhaps with
// a repeat: the subscription stores it sorted, each once.
func (m *hookModel) eventList() (sent, stored []string) {
	for _, e := range hmEvents {
		if m.rng.IntN(2) == 0 {
			sent = append(sent, e)
		}
	}
	if len(sent) == 0 {
		sent = []string{hmEvents[m.rng.IntN(len(hmEvents))]}
	}
	m.rng.Shuffle(len(sent), func(i, j int) { sent[i], sent[j] = sent[j], sent[i] })
	stored = slices.Clone(sent)
	slices.Sort(stored)
	if m.rng.IntN(4) == 0 {
		sent = append(sent, sent[0])
	}
	return sent, stored
}

func (m *hookModel) create() {
	u := m.hookURL(len(m.hooks))
	sent, stored := m.eventList()
	r := m.keyed("create", nil, "/api/v1/webhooks", map[string]any{"url": u, "events": sent})
	m.log("create %s %v -> %d", u, sent, r.Status)
	if len(m.live()) >= webhooks.MaxWebhooks {
		// At most 20 live a workspace: refused, nothing created.
		if r.Status != http.StatusConflict || r.ErrorCode() != "invalid_state" {
			m.fail("create past the workspace's %d webhooks: %d %s, want 409 invalid_state", webhooks.MaxWebhooks,
				r.Status, r.Body)
			return
		}
		m.list()
		return
	}
	if r.Status != http.StatusCreated {
		m.fail("create: %d %s", r.Status, r.Body)
		return
	}
	body := r.JSON()
	h := &hmHook{url: u, events: stored, created: m.now()}
	h.id, _ = body["id"].(string)
	h.secret, _ = body["secret"].(string)
	if k := m.lastKeyed; k != nil && k.what == "create" {
		k.hook = h
	}
	if !strings.HasPrefix(h.secret, "whsec_") {
		m.fail("create: secret %q", h.secret)
	}
	m.hooks = append(m.hooks, h)
	m.checkHook(h, body, "create")
}

// checkHook compares a subscription as an answer shows it with the model.
func (m *hookModel) checkHook(h *hmHook, got map[string]any, what string) {
	m.t.Helper()
	want := map[string]any{"id": h.id, "url": h.url, "events": h.events, "created_at": stamp(h.created),
		"disabled": !h.disabledAt.IsZero(), "disabled_at": nil, "previous_secret_expires_at": nil,
		"secret_unreadable": h.lostKey && !h.deleted}
	if !h.disabledAt.IsZero() {
		want["disabled_at"] = stamp(h.disabledAt)
	}
	if !h.deleted && h.signing(m.now()) {
		want["previous_secret_expires_at"] = stamp(h.prevUntil)
	}
	for k, w := range want {
		g := got[k]
		if s, ok := g.(string); ok && strings.HasSuffix(k, "_at") {
			g = restamp(s)
		}
		if l, ok := g.([]any); ok {
			var ss []string
			for _, v := range l {
				s, _ := v.(string)
				ss = append(ss, s)
			}
			g = ss
		}
		if fmt.Sprint(g) != fmt.Sprint(w) {
			m.fail("%s of %s: %s = %v, want %v (%v)", what, h.id, k, g, w, got)
			return
		}
	}
}

// stamp is how the model writes a time to compare: RFC 3339 in UTC.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// restamp writes an answered time as stamp does.
func restamp(s string) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return "unparsable " + s
	}
	return stamp(t)
}

func (m *hookModel) patch(h *hmHook) {
	if m.rng.IntN(8) == 0 {
		m.refused(h, "PATCH", "/api/v1/webhooks/"+h.id, hmBadPatches)
		return
	}
	body := map[string]any{}
	var sentEvents, stored []string
	var newURL string
	for len(body) == 0 {
		if m.rng.IntN(3) == 0 {
			newURL = m.hookURL(slices.Index(m.hooks, h))
			body["url"] = newURL
		}
		if m.rng.IntN(3) == 0 {
			sentEvents, stored = m.eventList()
			body["events"] = sentEvents
		}
		if m.rng.IntN(2) == 0 {
			body["disabled"] = m.rng.IntN(2) == 0
		}
	}
	r := m.env.Do("PATCH", "/api/v1/webhooks/"+h.id, m.ws.Key, body)
	m.log("patch %s %v -> %d", h.id, body, r.Status)
	if !m.answered(r, h.deleted, "patch") {
		return
	}
	now := m.now()
	if _, ok := body["url"]; ok {
		h.url = newURL
	}
	if _, ok := body["events"]; ok {
		h.events = stored
		for _, d := range h.dels {
			if d.state == "pending" && !slices.Contains(stored, d.ev.typ) {
				d.state, d.lastError = "failed", "event type unsubscribed"
			}
		}
	}
	if off, ok := body["disabled"].(bool); ok {
		switch {
		case off && h.disabledAt.IsZero():
			h.disabledAt = now
		case !off && !h.disabledAt.IsZero():
			h.lastOff, h.hasLastOff = [2]time.Time{h.disabledAt, now}, true
			h.disabledAt = time.Time{}
		}
	}
	m.checkHook(h, r.JSON(), "patch")
}

// answered says whether r is a 200 the model goes on with: gone, it must
// be 404 not_found.
func (m *hookModel) answered(r *apitest.Response, gone bool, what string) bool {
	m.t.Helper()
	if gone {
		m.wantNotFound(r, what+" of a deleted webhook")
		return false
	}
	if r.Status != http.StatusOK {
		m.fail("%s: %d %s", what, r.Status, r.Body)
		return false
	}
	return true
}

func (m *hookModel) wantNotFound(r *apitest.Response, what string) {
	m.t.Helper()
	if r.Status != http.StatusNotFound || r.ErrorCode() != "not_found" {
		m.fail("%s: %d %s, want 404 not_found", what, r.Status, r.Body)
	}
}

func (m *hookModel) rotate(h *hmHook) {
	if m.rng.IntN(8) == 0 {
		m.refused(h, "POST", "/api/v1/webhooks/"+h.id+"/rotate-secret", hmBadRotations)
		return
	}
	body := map[string]any{}
	ttl := 24 * time.Hour
	switch m.rng.IntN(4) {
	case 0:
	case 1:
		ttl = 0
		body["previous_secret_expires_in_seconds"] = 0
	default:
		ttl = time.Duration(60*(1+m.rng.IntN(60))) * time.Second
		body["previous_secret_expires_in_seconds"] = int(ttl / time.Second)
	}
	replace := m.rng.IntN(3) == 0
	if replace {
		body["replace_previous"] = true
	}
	r := m.keyed("rotate", h, "/api/v1/webhooks/"+h.id+"/rotate-secret", body)
	m.log("rotate %s %v -> %d", h.id, body, r.Status)
	if h.deleted {
		m.wantNotFound(r, "rotation of a deleted webhook")
		return
	}
	now := m.now()
	if h.signing(now) && !replace {
		var e struct {
			Error struct {
				Code   string         `json:"code"`
				Detail map[string]any `json:"detail"`
			} `json:"error"`
		}
		_ = json.Unmarshal(r.Body, &e)
		until, _ := e.Error.Detail["previous_secret_expires_at"].(string)
		if r.Status != http.StatusConflict || e.Error.Code != "invalid_state" || restamp(until) != stamp(h.prevUntil) {
			m.fail("rotation while %s's previous secret signs until %s: %d %s, want 409 invalid_state naming it",
				h.id, stamp(h.prevUntil), r.Status, r.Body)
		}
		return
	}
	if r.Status != http.StatusOK {
		m.fail("rotate: %d %s", r.Status, r.Body)
		return
	}
	got := r.JSON()
	secret, _ := got["secret"].(string)
	if !strings.HasPrefix(secret, "whsec_") || secret == h.secret {
		m.fail("rotate: secret %q", secret)
	}
	h.previous, h.prevUntil, h.prevLost = "", time.Time{}, false
	if ttl > 0 {
		// The current secret's ciphertext becomes the previous one, under
		// its key.
		h.previous, h.prevUntil, h.prevLost = h.secret, now.Add(ttl), h.lostKey
	}
	h.secret, h.lostKey = secret, false
	m.checkHook(h, got, "rotate")
}

func (m *hookModel) remove(h *hmHook) {
	r := m.env.Do("DELETE", "/api/v1/webhooks/"+h.id, m.ws.Key, nil)
	m.log("delete %s again=%v -> %d", h.id, h.deleted, r.Status)
	if r.Status != http.StatusOK {
		m.fail("delete: %d %s", r.Status, r.Body)
		return
	}
	if h.deleted {
		// Answered again as the first delete left it.
		if got := r.JSON(); fmt.Sprint(got) != fmt.Sprint(h.deleteAns) {
			m.fail("delete again: %v, want %v", got, h.deleteAns)
		}
		return
	}
	h.deleted = true
	h.secret, h.previous, h.prevUntil = "", "", time.Time{}
	for _, d := range h.dels {
		if d.state == "pending" {
			d.state, d.lastError = "failed", "webhook deleted"
		}
	}
	h.deleteAns = r.JSON()
	m.checkHook(h, h.deleteAns, "delete")
}

// produce runs a gate or jobs operation that records an event, and checks
// that the outbox holds what it recorded.
func (m *hookModel) produce() {
	var typ, subject string
	switch m.rng.IntN(5) {
	case 3:
		if m.open["*"] || len(m.effects) > 40 {
			m.produce()
			return
		}
		// An effect whose lease lapses, to be found by a pass or a read.
		lease := 5 + m.rng.IntN(56) // 5 to 60 s, the default policy's lease at most
		r := m.env.Do("POST", "/api/v1/effects/begin", m.ws.Key, map[string]any{"effect_type": "mdl.lapse",
			"idempotency_key": fmt.Sprintf("lapse-%d", len(m.effects)), "payload": map[string]any{}, "cost_micros": 0,
			"lease_seconds": lease})
		var b struct {
			Decision       string    `json:"decision"`
			EffectID       string    `json:"effect_id"`
			LeaseExpiresAt time.Time `json:"lease_expires_at"`
			LeaseToken     string    `json:"lease_token"`
		}
		_ = json.Unmarshal(r.Body, &b)
		m.log("begin %ds -> %d %s", lease, r.Status, b.Decision)
		if r.Status != http.StatusOK || b.Decision != "execute" ||
			!b.LeaseExpiresAt.Equal(m.now().Add(time.Duration(lease)*time.Second)) {
			m.fail("begin: %d %s", r.Status, r.Body)
			return
		}
		m.effects = append(m.effects, &hmEffect{id: b.EffectID, token: b.LeaseToken, leaseEnd: b.LeaseExpiresAt})
		m.recorded()
		return
	case 4:
		if len(m.effects) == 0 {
			m.produce()
			return
		}
		e := m.effects[m.rng.IntN(len(m.effects))]
		lapsed := !e.leaseEnd.After(m.now())
		if e.gone {
			// Its type's retention (90 days without a policy) took it.
			r := m.env.Do("GET", "/api/v1/effects/"+e.id, m.ws.Key, nil)
			m.log("read-effect %s -> %d", e.id, r.Status)
			m.wantNotFound(r, "read of an effect past its retention")
			return
		}
		if e.reported || m.rng.IntN(2) == 0 {
			// A read shows a lapsed lease indeterminate at once, and
			// records nothing: the sweeper's pass, or a write of the
			// effect (below), records its effect.indeterminate.
			r := m.env.Do("GET", "/api/v1/effects/"+e.id, m.ws.Key, nil)
			state, _ := r.JSON()["state"].(string)
			m.log("read-effect %s -> %d %s", e.id, r.Status, state)
			want := "leased"
			switch {
			case e.reported:
				want = "succeeded"
			case lapsed:
				want = "indeterminate"
			}
			if r.Status != http.StatusOK || state != want {
				m.fail("read effect: %d %s, want %s", r.Status, r.Body, want)
				return
			}
			m.recorded()
			return
		}
		// Its report: in time it succeeds; late, it is 409 lease_expired
		// and records the lapse, if no pass did yet.
		r := m.env.Do("POST", "/api/v1/effects/"+e.id+"/report", m.ws.Key,
			map[string]any{"lease_token": e.token, "outcome": "succeeded"})
		m.log("report %s lapsed=%v -> %d %s", e.id, lapsed, r.Status, r.ErrorCode())
		if lapsed {
			if r.Status != http.StatusConflict || r.ErrorCode() != "lease_expired" {
				m.fail("late report: %d %s, want 409 lease_expired", r.Status, r.Body)
				return
			}
			m.recorded(m.lapsed(e)...)
			return
		}
		if r.Status != http.StatusOK {
			m.fail("report: %d %s", r.Status, r.Body)
			return
		}
		e.reported, e.ended = true, m.now()
		m.recorded()
		return
	case 0:
		run := m.env.Do("POST", "/api/v1/runs", m.ws.Key, map[string]any{"name": "model"})
		if run.Status != http.StatusCreated {
			m.fail("create run: %d %s", run.Status, run.Body)
			return
		}
		subject, _ = run.JSON()["id"].(string)
		r := m.env.Do("POST", "/api/v1/runs/"+subject+"/finish", m.ws.Key, nil)
		m.log("finish-run %s -> %d", subject, r.Status)
		if r.Status != http.StatusOK {
			m.fail("finish run: %d %s", r.Status, r.Body)
			return
		}
		typ = events.RunFinished
	case 1:
		subject = hmTypes[m.rng.IntN(len(hmTypes))]
		verb := "open"
		typ = events.CircuitTripped
		if m.open[subject] {
			verb, typ = "close", events.CircuitClosed
		}
		var body any = map[string]any{"action": "deny", "reason": "model"}
		if verb == "close" {
			body = nil
		}
		r := m.env.Do("POST", "/api/v1/circuits/"+subject+"/"+verb, m.ws.Key, body)
		m.log("circuit-%s %s -> %d", verb, subject, r.Status)
		if r.Status != http.StatusOK {
			m.fail("circuit %s: %d %s", verb, r.Status, r.Body)
			return
		}
		m.open[subject] = !m.open[subject]
	default:
		subject = "*"
		path, typ := "/api/v1/circuits/stop", events.CircuitTripped
		var body any = map[string]any{"action": "deny", "reason": "model"}
		if m.open[subject] {
			path, typ, body = "/api/v1/circuits/release", events.CircuitClosed, nil
		}
		r := m.env.Do("POST", path, m.ws.Key, body)
		m.log("%s -> %d", strings.TrimPrefix(path, "/api/v1/circuits/"), r.Status)
		if r.Status != http.StatusOK {
			m.fail("%s: %d %s", path, r.Status, r.Body)
			return
		}
		m.open[subject] = !m.open[subject]
		m.recorded(typ + " " + subject)
		return
	}
	m.recorded(typ + " " + subject)
}

// recorded checks that the last operation recorded the events want
// ("type subject" each), and adds them to the model.
func (m *hookModel) recorded(want ...string) {
	rows, err := m.env.App.Pool.Query(context.Background(), `SELECT id, type, subject_id, created_at FROM events
		WHERE workspace_id = $1 ORDER BY created_at, id`, m.ws.ID)
	require.NoError(m.t, err)
	defer rows.Close()
	known := map[string]bool{}
	for _, e := range m.events {
		known[e.id] = true
	}
	var fresh []*hmEvent
	for rows.Next() {
		e := &hmEvent{}
		require.NoError(m.t, rows.Scan(&e.id, &e.typ, &e.subject, &e.created))
		if !known[e.id] {
			fresh = append(fresh, e)
		}
	}
	require.NoError(m.t, rows.Err())
	var got []string
	for _, e := range fresh {
		got = append(got, e.typ+" "+e.subject)
	}
	// Those of one operation are recorded at once, in no order.
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		m.fail("recorded %q, want %q", got, want)
		return
	}
	m.events = append(m.events, fresh...)
}

func (m *hookModel) moveClock() {
	var d time.Duration
	switch m.rng.IntN(5) {
	case 0:
		d = time.Duration(1+m.rng.IntN(40)) * time.Second
	case 1:
		d = time.Duration(1+m.rng.IntN(20)) * time.Minute
	case 2:
		d = time.Duration(1+m.rng.IntN(7)) * time.Hour
		if m.rng.IntN(4) == 0 {
			// Past the events' retention.
			d = hmRetentionDays*24*time.Hour + time.Duration(m.rng.IntN(3*24*3600))*time.Second
		}
	default:
		// To the next delivery due (or just before it), so that
		// retries run their course in a short sequence.
		next := m.nextDue(false)
		if next.IsZero() {
			d = time.Duration(1+m.rng.IntN(40)) * time.Second
			break
		}
		d = next.Sub(m.now())
		if m.rng.IntN(5) == 0 {
			d -= time.Millisecond
		}
	}
	d = max(d, 0)
	m.clock.Add(d)
	m.log("clock +%s", d)
}

// nextDue is when the earliest pending delivery of a live, enabled
// subscription falls due (the latest when last); zero when there is none.
func (m *hookModel) nextDue(last bool) time.Time {
	var next time.Time
	for _, h := range m.live() {
		if !h.disabledAt.IsZero() {
			continue
		}
		for _, d := range h.dels {
			if d.state == "pending" && (next.IsZero() || d.next.Before(next) != last) {
				next = d.next
			}
		}
	}
	return next
}

// matches says whether the fan-out makes a delivery of e for h.
func (h *hmHook) matches(e *hmEvent) bool {
	return !h.deleted && slices.Contains(h.events, e.typ) && !h.created.After(e.created) &&
		(h.disabledAt.IsZero() || e.created.Before(h.disabledAt)) &&
		!(h.hasLastOff && !e.created.Before(h.lastOff[0]) && e.created.Before(h.lastOff[1]))
}

// deliveryID is the id the fan-out gives the delivery of event e to
// webhook h.
func deliveryID(hook, event string) string {
	sum := md5.Sum([]byte(hook + event))
	return "dlv_" + hex.EncodeToString(sum[:])[:26]
}

// sweep fans out and runs a delivery pass, as the sweeper does, and
// compares what the receivers were sent and what the deliveries read. Now
// and then, while a secret is sealed under the lost key, the pass is an
// instance's configured with that key too, which sends the deliveries the
// run's own instance holds.
func (m *hookModel) sweep() {
	ctx := context.Background()
	now := m.now()
	withKey := m.anyLost() && m.rng.IntN(2) == 0
	svc := m.env.App.Server.Webhooks
	if withKey {
		svc = m.keyedInstance().App.Server.Webhooks
	}
	// Now and then the sweeper's whole pass (its tasks in their order:
	// the effects' lapses first, recording their effect.indeterminate,
	// the webhooks' fan-out and delivery last, so that the events it
	// records go out in it), else its two webhook tasks. The model then
	// fans out and sends what the pass did.
	n := -1
	whole := !withKey && m.rng.IntN(4) == 0
	if whole {
		res := m.env.App.Sweeper.RunOnce(ctx)
		if len(res.Errors) > 0 {
			m.fail("a pass failed: %v", res.Errors)
			return
		}
		// The pass records an effect.indeterminate for each lease that
		// lapsed, and none of this workspace's other events.
		m.recorded(m.lapsed(m.effects...)...)
	} else {
		m.dispatch(svc, now)
		var err error
		n, err = svc.Deliver(ctx, now)
		require.NoError(m.t, err)
	}
	m.fanOut(now)
	want := m.due(now, withKey)
	got := m.rcv.take()
	m.log("sweep at %s with-key=%v -> %d sent %d received (-1: a whole pass)", stamp(now), withKey, n, len(got))
	if !m.matchSends(got, want, now, withKey) {
		return
	}
	for _, s := range want {
		m.sent(s.d, now, m.answer(s), "")
	}
	if whole {
		m.retention(now)
	}
	for _, h := range m.hooks {
		m.readDeliveries(h)
	}
}

// dispatch runs the fan-out on svc until it has fanned out every event.
func (m *hookModel) dispatch(svc *webhooks.Service, now time.Time) {
	for {
		n, err := svc.Dispatch(context.Background(), now)
		require.NoError(m.t, err)
		if n < svc.DispatchBatch() {
			return
		}
	}
}

// fanOut is the model's fan-out at now: a pending delivery of each event
// not fanned out yet to each subscription it matches.
func (m *hookModel) fanOut(now time.Time) {
	for _, e := range m.events {
		if e.dispatched {
			continue
		}
		e.dispatched = true
		for _, h := range m.hooks {
			if h.matches(e) {
				h.dels = append(h.dels, &hmDelivery{id: deliveryID(h.id, e.id), ev: e, state: "pending", next: now,
					created: now})
			}
		}
	}
}

// hmSend is a delivery a pass sends: to a receiver of the tally, as key
// ("path event id"), or to the URL nobody listens on (key "").
type hmSend struct {
	h   *hmHook
	d   *hmDelivery
	key string
}

// due answers what a pass at now sends: each due delivery of a live,
// enabled subscription, once, but none of a subscription whose secret is
// sealed under the lost key unless withKey (the instance configured with
// it too): they are held.
func (m *hookModel) due(now time.Time, withKey bool) []hmSend {
	var out []hmSend
	for _, h := range m.live() {
		if !h.disabledAt.IsZero() || h.lostKey && !withKey {
			continue
		}
		for _, d := range h.dels {
			if d.state != "pending" || d.next.After(now) {
				continue
			}
			s := hmSend{h: h, d: d}
			if h.url != m.dead {
				u, err := url.Parse(h.url)
				require.NoError(m.t, err)
				s.key = u.Path + " " + d.ev.id
			}
			out = append(out, s)
		}
	}
	return out
}

// answer is what the receiver of s answers (0: connection refused).
func (m *hookModel) answer(s hmSend) int {
	if s.key == "" {
		return 0
	}
	path, _, _ := strings.Cut(s.key, " ")
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.modes[receiverOf(path)].status
}

// matchSends compares the sends the receivers got with want: each of
// want's once (none to a dead URL, which no receiver gets), its body the
// event, signed at at with the current secret, and the previous one while
// it signs (the current one's v1 first), unless the instance cannot open
// it (sealed under the lost key, and not withKey).
func (m *hookModel) matchSends(got []tallySend, want []hmSend, at time.Time, withKey bool) bool {
	m.t.Helper()
	left := map[string]hmSend{}
	for _, s := range want {
		if s.key != "" {
			left[s.key] = s
		}
	}
	for _, s := range got {
		var ev webhooks.Payload
		if err := json.Unmarshal(s.body, &ev); err != nil {
			m.fail("a send's body %q: %v", s.body, err)
			return false
		}
		w, ok := left[s.path+" "+ev.ID]
		if !ok {
			m.fail("%s was sent %s (%s), which the model does not send now", s.path, ev.ID, ev.Type)
			return false
		}
		delete(left, s.path+" "+ev.ID)
		e := w.d.ev
		if ev.Type != e.typ || ev.SubjectID != e.subject || ev.WorkspaceID != m.ws.ID || !ev.CreatedAt.Equal(e.created) {
			m.fail("%s was sent %s", s.path, s.body)
			return false
		}
		secrets := []string{w.h.secret}
		if w.h.signing(at) && (withKey || !w.h.prevLost) {
			secrets = append(secrets, w.h.previous)
		}
		if sig := webhooks.Sign(at, s.body, secrets...); s.signature != sig {
			m.fail("%s's send of %s is signed %q, want %q (the current secret's v1, then the previous one's while "+
				"it signs and this instance can open it: %d)", w.h.id, ev.ID, s.signature, sig, len(secrets))
			return false
		}
	}
	for k := range left {
		m.fail("not sent %s", k)
		return false
	}
	return true
}

// retention applies a whole pass's last tasks at now: a delivery held by
// a disabled subscription and due for the events' retention ends failed,
// "expired while disabled", its attempts untouched
// (webhooks.expire_held); then each event older than the retention, fanned
// out and with no delivery pending, goes with its deliveries
// (events.retention).
func (m *hookModel) retention(now time.Time) {
	// And an effect that ended is deleted once its type's retention_days,
	// 90 without a policy, have passed (effects.retention).
	for _, e := range m.effects {
		e.gone = e.gone || e.reported && e.ended.Before(now.AddDate(0, 0, -90))
	}
	cutoff := now.AddDate(0, 0, -hmRetentionDays)
	pending := map[*hmEvent]bool{}
	for _, h := range m.hooks {
		for _, d := range h.dels {
			if d.state != "pending" {
				continue
			}
			if !h.disabledAt.IsZero() && d.next.Before(cutoff) {
				d.state, d.lastError = "failed", "expired while disabled"
				continue
			}
			pending[d.ev] = true
		}
	}
	for _, e := range m.events {
		if e.dispatched && e.created.Before(cutoff) && !pending[e] {
			e.purged = true
		}
	}
	for _, h := range m.hooks {
		h.dels = slices.DeleteFunc(h.dels, func(d *hmDelivery) bool { return d.ev.purged })
	}
}

// sent applies an attempt claimed and answered at now: code (0: none, and
// failure says why, "connection refused" when empty).
func (m *hookModel) sent(d *hmDelivery, now time.Time, code int, failure string) {
	d.record(d.claim(now), now, code, failure)
}

// hmClaim is what one claim of a delivery counted: its attempt, and its
// claim.
type hmClaim struct{ attempt, claim int }

// claim is a pass's claim of d at now: an attempt and a claim counted, and
// d held for the claim's minute, so that no other pass sends it meanwhile.
func (d *hmDelivery) claim(now time.Time) hmClaim {
	d.attempts++
	d.claims++
	d.next, d.windowed = now.Add(time.Minute), false
	return hmClaim{d.attempts, d.claims}
}

// record applies at now the outcome of claim c's send of d, answered code
// (0: none, failure saying why): delivered on a 2xx (also after a delete
// or an unsubscription ended it while it was sent, or a later claim's
// failure ended it), else retried with
// backoff from c's attempt, or failed once d's attempts reach MaxAttempts;
// an outcome of a delivery that ended meanwhile, or a failure whose claim
// a later claim superseded (d counts more claims, also when a retry gave
// its attempts back in between), changes nothing.
func (d *hmDelivery) record(c hmClaim, now time.Time, code int, failure string) {
	attempt := c.attempt
	if code >= 200 && code < 300 {
		if d.state == "pending" || d.state == "failed" && (d.lastError == "webhook deleted" ||
			d.lastError == "event type unsubscribed" || d.claims > c.claim) {
			d.state, d.delivered, d.code, d.lastError = "delivered", now, code, ""
		}
		return
	}
	if d.state != "pending" || d.claims != c.claim {
		return
	}
	d.code, d.lastError = code, "non-2xx response"
	if code == 0 {
		d.lastError = cmp.Or(failure, "connection refused")
	}
	if d.attempts >= webhooks.MaxAttempts {
		d.state = "failed"
		return
	}
	if attempt >= webhooks.MaxAttempts {
		// A retry gave its attempts back while it was sent: due at once.
		d.next = now
		return
	}
	base := 30 * time.Second << min(attempt-1, 10)
	base = min(base, 6*time.Hour)
	// ±20 %, and the microsecond a stored time is rounded to.
	d.window = [2]time.Time{now.Add(base * 8 / 10).Add(-time.Microsecond), now.Add(base * 12 / 10).Add(time.Microsecond)}
	d.windowed = true
}

// readDeliveries compares a subscription's deliveries, paged, with the
// model's (a deleted one's: 404), and learns the jittered times of
// retries.
func (m *hookModel) readDeliveries(h *hmHook) {
	limit := 200
	if m.rng.IntN(3) == 0 {
		limit = 1 + m.rng.IntN(3)
	}
	var got []map[string]any
	cursor := ""
	for {
		path := fmt.Sprintf("/api/v1/webhooks/%s/deliveries?limit=%d", h.id, limit)
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		r := m.env.Do("GET", path, m.ws.Key, nil)
		if h.deleted {
			m.wantNotFound(r, "deliveries of a deleted webhook")
			return
		}
		if r.Status != http.StatusOK {
			m.fail("deliveries: %d %s", r.Status, r.Body)
			return
		}
		var page struct {
			Data []map[string]any `json:"data"`
			Next *string          `json:"next_cursor"`
		}
		r.Decode(m.t, &page)
		got = append(got, page.Data...)
		if page.Next == nil {
			break
		}
		cursor = *page.Next
	}
	want := slices.Clone(h.dels)
	sort.SliceStable(want, func(i, j int) bool {
		if !want[i].created.Equal(want[j].created) {
			return want[i].created.After(want[j].created)
		}
		return want[i].id > want[j].id
	})
	if len(got) != len(want) {
		m.fail("%s lists %d deliveries, want %d: %v", h.id, len(got), len(want), got)
		return
	}
	for i, d := range want {
		m.checkDelivery(d, got[i], "deliveries of "+h.id)
	}
}

// checkDelivery compares a delivery as an answer shows it with the model.
func (m *hookModel) checkDelivery(d *hmDelivery, g map[string]any, what string) {
	m.t.Helper()
	if d.state == "pending" && d.windowed {
		s, _ := g["next_attempt_at"].(string)
		next, err := time.Parse(time.RFC3339Nano, s)
		if err != nil || next.Before(d.window[0]) || next.After(d.window[1]) {
			m.fail("%s: %s's next_attempt_at %q after attempt %d, want within [%s, %s] (30 s doubling, capped at "+
				"6 h, ±20 %%)", what, d.id, s, d.attempts, stamp(d.window[0]), stamp(d.window[1]))
			return
		}
		d.next, d.windowed = next, false
	}
	outcome := d.state + " " + d.lastError
	if d.attempts >= webhooks.MaxAttempts {
		outcome += " (gave up)"
	}
	m.seen["delivery "+outcome]++

	want := map[string]any{"id": d.id, "event_id": d.ev.id, "event_type": d.ev.typ, "state": d.state,
		"attempts": d.attempts, "last_status_code": nil, "last_error": nil, "next_attempt_at": nil,
		"created_at": stamp(d.created), "delivered_at": nil}
	if d.code != 0 {
		want["last_status_code"] = d.code
	}
	if d.lastError != "" {
		want["last_error"] = d.lastError
	}
	if d.state == "pending" {
		want["next_attempt_at"] = stamp(d.next)
	}
	if d.state == "delivered" {
		want["delivered_at"] = stamp(d.delivered)
	}
	for k, w := range want {
		v := g[k]
		if s, ok := v.(string); ok && strings.HasSuffix(k, "_at") {
			v = restamp(s)
		}
		if f, ok := v.(float64); ok {
			v = int(f)
		}
		if fmt.Sprint(v) != fmt.Sprint(w) {
			m.fail("%s: %s's %s = %v, want %v (%v)", what, d.id, k, v, w, g)
			return
		}
	}
}

// retry sends one to three deliveries of a subscription again, now and
// then naming another's (refused whole, 404).
func (m *hookModel) retry() {
	var with []*hmHook
	for _, h := range m.hooks {
		if len(h.dels) > 0 {
			with = append(with, h)
		}
	}
	h := m.pick(with)
	if h == nil {
		m.read(m.pick(m.hooks))
		return
	}
	var named []*hmDelivery
	for _, i := range m.rng.Perm(len(h.dels))[:1+m.rng.IntN(min(3, len(h.dels)))] {
		named = append(named, h.dels[i])
	}
	m.retryNamed(h, named, m.rng.IntN(6) == 0)
}

// retryNamed sends deliveries of h again (named), and another
// subscription's with them when foreign (refused whole, 404).
func (m *hookModel) retryNamed(h *hmHook, named []*hmDelivery, foreign bool) {
	ids := []string{}
	for _, d := range named {
		ids = append(ids, d.id)
	}
	if foreign {
		foreign = false
		for _, o := range m.hooks {
			if o != h && len(o.dels) > 0 {
				ids, foreign = append(ids, o.dels[0].id), true
				break
			}
		}
	}
	r := m.keyed("retry", h, "/api/v1/webhooks/"+h.id+"/deliveries/retry", map[string]any{"delivery_ids": ids})
	m.log("retry %s %v -> %d", h.id, ids, r.Status)
	if !m.answered(r, h.deleted || foreign, "retry (of another webhook's delivery too)") {
		return
	}
	now := m.now()
	for _, d := range named {
		switch {
		case d.state != "pending":
			*d = hmDelivery{id: d.id, ev: d.ev, state: "pending", next: now, created: d.created, claims: d.claims}
		case d.attempts >= webhooks.MaxAttempts:
			// Its last attempt may be in flight (a claim whose
			// sweeper died, crash): its attempts start over, so that
			// one failing is not the end; it keeps its schedule.
			d.attempts = 0
		}
	}
	var got struct {
		Deliveries []map[string]any `json:"deliveries"`
	}
	r.Decode(m.t, &got)
	sort.SliceStable(named, func(i, j int) bool {
		if !named[i].created.Equal(named[j].created) {
			return named[i].created.After(named[j].created)
		}
		return named[i].id > named[j].id
	})
	if len(got.Deliveries) != len(named) {
		m.fail("retry answered %d deliveries, want %d", len(got.Deliveries), len(named))
		return
	}
	for i, d := range named {
		m.checkDelivery(d, got.Deliveries[i], "retry's answer")
	}
}

// read compares a subscription's reads (one, the list, its deliveries)
// with the model.
func (m *hookModel) read(h *hmHook) {
	if h == nil {
		return
	}
	r := m.env.Do("GET", "/api/v1/webhooks/"+h.id, m.ws.Key, nil)
	m.log("read %s -> %d", h.id, r.Status)
	if h.deleted {
		m.wantNotFound(r, "read of a deleted webhook")
	} else if r.Status != http.StatusOK {
		m.fail("read: %d %s", r.Status, r.Body)
		return
	} else {
		m.checkHook(h, r.JSON(), "read")
	}
	m.list()
	m.readDeliveries(h)
}

// list compares the workspace's list of subscriptions with the model's
// live ones.
func (m *hookModel) list() {
	var list struct {
		Data []map[string]any `json:"data"`
	}
	m.env.Must(http.StatusOK, "GET", "/api/v1/webhooks?limit=50", m.ws.Key, nil).Decode(m.t, &list)
	live := m.live()
	sort.Slice(live, func(i, j int) bool { return live[i].id < live[j].id })
	if len(list.Data) != len(live) {
		m.fail("the list has %d webhooks, want %d", len(list.Data), len(live))
		return
	}
	for i, w := range live {
		m.checkHook(w, list.Data[i], "list")
	}
}

// fill creates subscriptions up to the workspace's 20 (webhooks.MaxWebhooks)
// and one more, refused; now and then a delete then frees room for one.
func (m *hookModel) fill() {
	for len(m.live()) < webhooks.MaxWebhooks && !m.trace.Failed() {
		m.create()
	}
	m.create()
	if m.rng.IntN(2) == 0 && !m.trace.Failed() {
		m.remove(m.pick(m.live()))
		m.create()
	}
}

// anyLost says whether a live subscription's secret is sealed under the
// lost key.
func (m *hookModel) anyLost() bool {
	return slices.ContainsFunc(m.live(), func(h *hmHook) bool { return h.lostKey })
}

// keyedInstance is an instance of the server over the package database,
// on the run's clock and pool size, configured with the lost key besides
// the run's (RESULT_ENCRYPTION_KEYS): it opens every secret.
func (m *hookModel) keyedInstance() *apitest.Env {
	if m.withKey == nil {
		m.withKey = apitest.Start(m.t, apitest.WithNow(m.clock.Now), apitest.WithConfig(hmConfig(m.seed)),
			apitest.WithConfig(func(cfg *config.Config) {
				cfg.WebhookAllowPrivateNetworks = true
				cfg.ResultEncryptionKeys = []string{base64.StdEncoding.EncodeToString(hmLostKey)}
			}))
	}
	return m.withKey
}

// lose seals h's current secret under a key the run's instance is not
// configured with (one taken out of RESULT_ENCRYPTION_KEYS before a
// reseal): its reads say secret_unreadable, and the instance holds its
// deliveries, their attempts untouched, until an instance with the key
// sweeps (keyedInstance) or a rotation seals a new secret.
func (m *hookModel) lose(h *hmHook) {
	if h == nil || h.lostKey {
		m.read(h)
		return
	}
	m.keyedInstance()
	_, err := m.env.App.Pool.Exec(context.Background(), `UPDATE webhooks SET secret = $2 WHERE id = $1`, h.id,
		m.lost.Seal([]byte(h.secret), seal.AAD(h.id, "secret")))
	require.NoError(m.t, err)
	h.lostKey = true
	m.log("lose-key %s -> sealed", h.id)
	m.read(h)
}

// keyed sends a POST, now and then under an Idempotency-Key, and keeps a
// keyed request answered 2xx for replay.
func (m *hookModel) keyed(what string, h *hmHook, path string, body any) *apitest.Response {
	m.lastKeyed = nil
	raw, err := json.Marshal(body)
	require.NoError(m.t, err)
	if m.rng.IntN(3) > 0 {
		return m.env.Do("POST", path, m.ws.Key, raw)
	}
	k := &hmKeyed{what: what, key: fmt.Sprintf("model-%d-%d", m.seed, m.trace.Len()), path: path, body: raw, hook: h,
		at: m.now()}
	r := m.env.DoWith("POST", path, m.ws.Key, http.Header{"Idempotency-Key": {k.key}}, raw)
	if r.Status/100 == 2 {
		k.status, k.answer, k.requestID = r.Status, r.Body, r.Header.Get("X-Request-Id")
		m.keyedReqs = append(m.keyedReqs, k)
		m.lastKeyed = k
	}
	return r
}

// replay sends a keyed request again under its key, the same or with
// another body.
func (m *hookModel) replay() {
	var fresh []*hmKeyed
	for _, k := range m.keyedReqs {
		// Kept 24 hours: replayed well within them.
		if m.now().Sub(k.at) < 23*time.Hour {
			fresh = append(fresh, k)
		}
	}
	if len(fresh) == 0 {
		m.read(m.pick(m.hooks))
		return
	}
	k := fresh[m.rng.IntN(len(fresh))]
	body := k.body
	other := m.rng.IntN(5) == 0
	if other {
		body = append(slices.Clone(body[:len(body)-1]), []byte(`,"x":1}`)...)
	}
	r := m.env.DoWith("POST", k.path, m.ws.Key, http.Header{"Idempotency-Key": {k.key}}, body)
	m.log("replay %s %s other=%v -> %d %s", k.what, k.key, other, r.Status, r.ErrorCode())
	if other {
		if r.Status != http.StatusConflict || r.ErrorCode() != "idempotency_key_reuse" {
			m.fail("another request under %s: %d %s, want 409 idempotency_key_reuse", k.key, r.Status, r.Body)
		}
		return
	}
	if r.Header.Get("Idempotent-Replayed") != "true" || r.Header.Get("Original-Request") != k.requestID {
		m.fail("replay of %s: headers %v, want Idempotent-Replayed: true, Original-Request: %s", k.key, r.Header,
			k.requestID)
		return
	}
	if k.what != "retry" && k.hook != nil && k.hook.deleted {
		// Its answer showed a secret: erased with the webhook.
		m.wantNotFound(r, "replay of a deleted webhook's "+k.what)
		return
	}
	if r.Status != k.status || string(r.Body) != string(k.answer) {
		m.fail("replay of %s: %d %s, want %d %s", k.key, r.Status, r.Body, k.status, k.answer)
	}
}

// hmBad is a request the route refuses, 400 invalid_request naming field,
// changing nothing.
type hmBad struct {
	body, field string
}

var (
	hmBadPatches = []hmBad{{`{}`, "body"}, {`{"url": null}`, "url"}, {`{"disabled": null}`, "disabled"},
		{`{"events": []}`, "events"}, {`{"events": ["run.finished", "run.started"]}`, "events.1"},
		{`{"url": "https://example.com/ x"}`, "url"}, {`{"url": "http://127.0.0.1:/"}`, "url"},
		{`{"disabled": true, "paused": true}`, "paused"}}
	hmBadRotations = []hmBad{{`{"previous_secret_expires_in_seconds": 604801}`, "previous_secret_expires_in_seconds"},
		{`{"previous_secret_expires_in_seconds": -1}`, "previous_secret_expires_in_seconds"},
		{`{"replace_previous": true, "expires": 5}`, "expires"}}
)

// refused sends one of bad to h: 400 invalid_request at its field (404
// for a deleted webhook, whose requests a body check may precede, so
// either), changing nothing.
func (m *hookModel) refused(h *hmHook, method, path string, bad []hmBad) {
	b := bad[m.rng.IntN(len(bad))]
	r := m.env.Do(method, path, m.ws.Key, b.body)
	m.log("refused %s %s %s -> %d %s", method, h.id, b.body, r.Status, r.ErrorCode())
	if h.deleted && r.Status == http.StatusNotFound {
		return
	}
	if r.Status != http.StatusBadRequest {
		m.fail("%s %s %s: %d %s, want 400 invalid_request at %s", method, path, b.body, r.Status, r.Body, b.field)
		return
	}
	if fields := apitest.ValidationFields(m.t, r); !slices.Equal(fields, []string{b.field}) {
		m.fail("%s %s %s: %d %s, want 400 invalid_request at %s", method, path, b.body, r.Status, r.Body, b.field)
	}
}

// foreign sends a request about h with the other workspace's key: 404
// not_found whatever it is, changing nothing.
func (m *hookModel) foreign(h *hmHook) {
	if h == nil {
		return
	}
	reqs := []struct {
		method, path string
		body         any
	}{
		{"GET", "/api/v1/webhooks/" + h.id, nil},
		{"GET", "/api/v1/webhooks/" + h.id + "/deliveries", nil},
		{"PATCH", "/api/v1/webhooks/" + h.id, map[string]any{"disabled": true}},
		{"DELETE", "/api/v1/webhooks/" + h.id, nil},
		{"POST", "/api/v1/webhooks/" + h.id + "/rotate-secret", map[string]any{"replace_previous": true}},
		{"POST", "/api/v1/webhooks/" + h.id + "/deliveries/retry", map[string]any{"delivery_ids": []string{
			deliveryID(h.id, "evt_none")}}},
	}
	q := reqs[m.rng.IntN(len(reqs))]
	if len(h.dels) > 0 && q.method == "POST" && strings.HasSuffix(q.path, "/retry") {
		q.body = map[string]any{"delivery_ids": []string{h.dels[0].id}}
	}
	r := m.env.Do(q.method, q.path, m.other.Key, q.body)
	m.log("foreign %s %s -> %d", q.method, q.path, r.Status)
	m.wantNotFound(r, "another workspace's "+q.method+" "+q.path)
}

// crash claims a due delivery as a sweeper does and leaves it as one that
// died before recording the send: an attempt counted, held for the
// claim's minute, then sent again under the same event id, counting an
// attempt (README: at least once), also past MaxAttempts when the lost
// one was the last.
func (m *hookModel) crash() {
	now := m.now()
	var due []*hmDelivery
	for _, h := range m.live() {
		for _, d := range h.dels {
			if h.disabledAt.IsZero() && d.state == "pending" && !d.next.After(now) {
				due = append(due, d)
			}
		}
	}
	if len(due) == 0 {
		m.sweep()
		return
	}
	d := due[m.rng.IntN(len(due))]
	tag, err := m.env.App.Pool.Exec(context.Background(), `UPDATE webhook_deliveries SET attempts = attempts + 1,
		claims = claims + 1, next_attempt_at = $2::timestamptz + interval '60 seconds' WHERE id = $1 AND state = 'pending'`, d.id, now)
	require.NoError(m.t, err)
	m.log("crash %s at attempt %d -> %d", d.id, d.attempts+1, tag.RowsAffected())
	if tag.RowsAffected() != 1 {
		m.fail("crash: %s is not pending", d.id)
		return
	}
	d.claim(now)
}

// hmGate holds the sends of the deliveries hang names ("path event id")
// at their receiver: the first send of each until release[0] closes, a
// second one (sent again once its claim lapsed) until release[1] does,
// each then answered its status.
type hmGate struct {
	mu       sync.Mutex
	sends    map[string]int // held so far, of each delivery named
	release  [2]chan struct{}
	status   [2]int
	arrived  chan struct{}
	timedOut map[string][2]bool // a send whose client gave up (10 s) before its release
}

func newGate(keys []string, status [2]int) *hmGate {
	g := &hmGate{sends: map[string]int{}, release: [2]chan struct{}{make(chan struct{}), make(chan struct{})},
		status: status, arrived: make(chan struct{}, 2*len(keys)), timedOut: map[string][2]bool{}}
	for _, k := range keys {
		g.sends[k] = 0
	}
	return g
}

// hold holds req's send of event if the gate names it, and answers the
// status to answer it (any when its client gave up first: none reads
// it), and whether it held it.
func (g *hmGate) hold(req *http.Request, event string) (int, bool) {
	key := req.URL.Path + " " + event
	g.mu.Lock()
	n, ok := g.sends[key]
	if ok && n < 2 {
		g.sends[key]++
	}
	g.mu.Unlock()
	if !ok || n >= 2 {
		return 0, false
	}
	g.arrived <- struct{}{}
	select {
	case <-g.release[n]:
		return g.status[n], true
	case <-req.Context().Done():
		g.mu.Lock()
		t := g.timedOut[key]
		t[n] = true
		g.timedOut[key] = t
		g.mu.Unlock()
		return http.StatusServiceUnavailable, true
	}
}

// outcome is the n-th held send of key's answer: its status, or none when
// its client gave up.
func (g *hmGate) outcome(key string, n int) (int, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.timedOut[key][n] {
		return 0, "timed out: no answer within " + webhooks.SendTimeout.String()
	}
	return g.status[n], ""
}

// hang runs a delivery pass (A) whose sends to one receiver hang while
// the model goes on (README: a round goes on for the other webhooks while
// theirs are in flight): a pass (B) while their claims hold, as of up to
// 59 s later, sends none of them again; now and then the clock then
// passes the claims' minute and a pass (C) sends them again, the same
// events under the same ids, counting an attempt (at least once), before
// the first sends are answered. Each answer is recorded as it comes, the
// first sends' first. It needs A to send its whole due set in its first
// round (at most 20 a webhook, 40 a workspace: 30, so that a pass C
// sending them again has room for the rest); a larger one is swept.
func (m *hookModel) hang() {
	now := m.now()
	svc := m.env.App.Server.Webhooks
	m.dispatch(svc, now)
	m.fanOut(now)
	want := m.due(now, false)
	receiver := hmPaths[m.rng.IntN(len(hmPaths))]
	var hung, rest []hmSend
	var keys []string
	perHook := map[*hmHook]int{}
	for _, s := range want {
		perHook[s.h]++
		if path, _, _ := strings.Cut(s.key, " "); s.key != "" && receiverOf(path) == receiver {
			hung, keys = append(hung, s), append(keys, s.key)
		} else {
			rest = append(rest, s)
		}
	}
	if len(hung) == 0 || len(want) > 30 || slices.Max(slices.Collect(maps.Values(perHook))) > 20 {
		m.sweep()
		return
	}
	// The held sends answer as the receiver does, the ones sent again as
	// it may by then.
	status := [2]int{m.answer(hung[0]), hmModes[m.rng.IntN(len(hmModes))].status}
	g := newGate(keys, status)
	m.mu.Lock()
	m.gate = g
	m.mu.Unlock()
	var passes []*hmPass
	defer func() {
		// Failed midway, the passes still end.
		for _, c := range g.release {
			select {
			case <-c:
			default:
				close(c)
			}
		}
		for _, p := range passes {
			p.wait()
		}
		m.mu.Lock()
		m.gate = nil
		m.mu.Unlock()
	}()
	deliver := func(at time.Time) *hmPass {
		p := &hmPass{done: make(chan struct{})}
		go func() {
			defer close(p.done)
			_, p.err = svc.Deliver(context.Background(), at)
		}()
		passes = append(passes, p)
		return p
	}

	// A: every due send goes, those to the receiver held at it.
	arrived := m.rcv.arrived.Load()
	a := deliver(now)
	m.awaitSends(g, len(hung), arrived, len(want)-len(m.deadOf(want)))
	m.awaitRecorded(rest, now.Add(time.Minute))
	got := m.rcv.take()
	m.log("hang %s at %s -> %d sent %d received %d held", receiver, stamp(now), len(want), len(got), len(hung))
	if !m.matchSends(got, want, now, false) {
		return
	}
	for _, s := range rest {
		m.sent(s.d, now, m.answer(s), "")
	}
	attempt := map[*hmDelivery][2]hmClaim{}
	for _, s := range hung {
		attempt[s.d] = [2]hmClaim{s.d.claim(now)}
	}
	// Held, an attempt counted, claimed for a minute.
	for _, h := range m.hooks {
		m.readDeliveries(h)
	}

	// B, while the claims hold (its records at the clock's now).
	b := now.Add(time.Duration(m.rng.IntN(60)) * time.Second)
	_, err := svc.Deliver(context.Background(), b)
	require.NoError(m.t, err)
	wantB := m.due(b, false)
	got = m.rcv.take()
	m.log("pass while held at %s -> %d received", stamp(b), len(got))
	if !m.matchSends(got, wantB, now, false) {
		return
	}
	for _, s := range wantB {
		m.sent(s.d, now, m.answer(s), "")
	}
	for _, h := range m.hooks {
		m.readDeliveries(h)
	}

	// Now and then a retry of held ones while they are in flight: their
	// attempts start over when their last one is in flight, so a later
	// claim (C) may count as few as theirs, yet their failures, superseded,
	// still record nothing (webhooks QA).
	if m.rng.IntN(3) == 0 {
		s := hung[m.rng.IntN(len(hung))]
		var named []*hmDelivery
		for _, o := range hung {
			if o.h == s.h && (o.d == s.d || m.rng.IntN(2) == 0) && len(named) < 3 {
				named = append(named, o.d)
			}
		}
		m.retryNamed(s.h, named, false)
	}

	// C, once the claims' minute has passed: the held ones are sent again
	// (and held again), with whatever else fell due.
	var wantC []hmSend
	lapse := m.rng.IntN(2) == 0 && !m.trace.Failed()
	if lapse {
		m.clock.Add(time.Minute + time.Duration(m.rng.IntN(20))*time.Second)
		wantC = m.due(m.now(), false)
		arrived = m.rcv.arrived.Load()
		deliver(m.now())
		m.awaitSends(g, len(hung), arrived, len(wantC)-len(m.deadOf(wantC)))
		got = m.rcv.take()
		m.log("pass once the claims lapsed at %s -> %d received", stamp(m.now()), len(got))
		if !m.matchSends(got, wantC, m.now(), false) {
			return
		}
		for _, s := range wantC {
			if a, ok := attempt[s.d]; ok {
				attempt[s.d] = [2]hmClaim{a[0], s.d.claim(m.now())}
			}
		}
	}

	// The first sends are answered, then the second ones.
	close(g.release[0])
	if err := a.wait(); err != nil {
		m.fail("pass A: %v", err)
		return
	}
	for _, s := range hung {
		code, failure := g.outcome(s.key, 0)
		s.d.record(attempt[s.d][0], m.now(), code, failure)
	}
	if lapse {
		close(g.release[1])
		if err := passes[1].wait(); err != nil {
			m.fail("pass C: %v", err)
			return
		}
		for _, s := range wantC {
			if a, ok := attempt[s.d]; ok {
				code, failure := g.outcome(s.key, 1)
				s.d.record(a[1], m.now(), code, failure)
			} else {
				m.sent(s.d, m.now(), m.answer(s), "")
			}
		}
	}
	m.log("hang-answered %s %v -> lapse=%v", receiver, status, lapse)
	for _, h := range m.hooks {
		m.readDeliveries(h)
	}
}

// hmPass is a delivery pass run aside.
type hmPass struct {
	done chan struct{}
	err  error
}

// wait waits for the pass to end and answers its error.
func (p *hmPass) wait() error {
	<-p.done
	return p.err
}

// deadOf answers the sends of want to the URL nobody listens on.
func (m *hookModel) deadOf(want []hmSend) []hmSend {
	var out []hmSend
	for _, s := range want {
		if s.key == "" {
			out = append(out, s)
		}
	}
	return out
}

// awaitSends waits for held sends to reach g and for the receivers to
// have been sent n since they had been sent arrived (a bound on failure
// only).
func (m *hookModel) awaitSends(g *hmGate, held int, arrived int32, n int) {
	m.t.Helper()
	deadline := time.After(30 * time.Second)
	for range held {
		select {
		case <-g.arrived:
		case <-deadline:
			m.t.Fatal("held sends never arrived")
		}
	}
	require.Eventually(m.t, func() bool { return int(m.rcv.arrived.Load()-arrived) >= n }, 30*time.Second,
		time.Millisecond, "the pass's sends arrive")
}

// awaitRecorded waits for the outcomes of sends to be recorded: none of
// their deliveries still pending and claimed until until (a bound on
// failure only).
func (m *hookModel) awaitRecorded(sends []hmSend, until time.Time) {
	m.t.Helper()
	ids := []string{}
	for _, s := range sends {
		ids = append(ids, s.d.id)
	}
	require.Eventually(m.t, func() bool {
		var n int
		require.NoError(m.t, m.env.App.Pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_deliveries
			WHERE id = ANY ($1) AND state = 'pending' AND next_attempt_at = $2`, ids, until).Scan(&n))
		return n == 0
	}, 30*time.Second, time.Millisecond, "the pass's outcomes are recorded")
}

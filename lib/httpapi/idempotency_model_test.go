package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// The Idempotency-Key model test (README, "Retrying a call whose answer
// was lost"): random sequences of POSTs with and without the header, over
// the webhook and key creates and a test route whose handler succeeds,
// refuses or fails after writing, from three API keys (two of one
// workspace); requests sent again as they were; the service's clock moved
// (answers kept 24 hours, claims 30 seconds); claims whose request died
// (taken with lib/idempotency's Begin and never answered); webhooks
// deleted and keys revoked (their creates' answers erased). A model
// predicts each answer: a first request acts (a success is kept, a
// failure frees the key), the same request from the same API key is given
// the kept answer byte for byte with Idempotent-Replayed and
// Original-Request, another request under an answered key is 409
// idempotency_key_reuse, any request under a held claim 409 retry_request
// with its Retry-After, and an erased answer 404 not_found; with purges
// (TestIdempotencyKeyModelWithPurges), the sweeper's passes delete exactly
// the answers and claims a day old, and a purged key acts as a new one.
// Seeds:
// MODEL_SEED, MODEL_SEEDS, MODEL_OPS (lib/apitest).

// idemCaller is an API key of the model: its secret, id and workspace.
type idemCaller struct {
	name, secret, id string
	ws               int
}

// idemSend is one request of the model.
type idemSend struct {
	caller int    // index into the callers
	key    string // the header's value; "" none
	path   string
	body   string
}

func (s idemSend) String() string {
	return fmt.Sprintf("caller=%d key=%q POST %s %s", s.caller, s.key, s.path, s.body)
}

// idemEntry is what the model holds for (API key, Idempotency-Key).
type idemEntry struct {
	hash      string // path and body: the request that acted or holds the claim
	claimed   bool   // held by a request that died (until)
	until     time.Time
	created   time.Time
	status    int
	body      string
	requestID string
	resource  string // the webhook or key whose secret the answer shows
	erased    bool
}

// idemModel is the state the model predicts from.
type idemModel struct {
	entries  map[[2]string]*idemEntry
	hooks    []int           // live webhooks per workspace
	resource map[string]bool // resources deleted or revoked
	hits     map[string]int  // how often each prediction was made (logged: the sequence's reach)
}

// live is the entry of (caller, key) still in force at now: an answer
// younger than the TTL, or a claim not yet lapsed.
func (m *idemModel) live(apiKey, key string, now time.Time) *idemEntry {
	e := m.entries[[2]string{apiKey, key}]
	switch {
	case e == nil:
		return nil
	case !e.created.After(now.Add(-idempotency.TTL)):
		return nil // expired
	case e.claimed && !e.until.After(now):
		return nil // lapsed
	}
	return e
}

// retryAfter is the Retry-After of a claim that lapses at until (lib/idempotency's inFlight).
func retryAfter(until, now time.Time) int {
	remaining := until.Sub(now)
	if idempotency.ClaimTTL-remaining < idempotency.ActingTime {
		return 1
	}
	return max(1, int((remaining+time.Second-1)/time.Second))
}

// idemOutcome is what the route itself answers when it acts, by the
// model: the status and code of a failure, or 201 (and whether it makes a
// webhook).
func (m *idemModel) outcome(ws int, s idemSend) (status int, code string, hook bool) {
	switch s.path {
	case "/api/v1/webhooks", "/api/v1/test/ok", "/api/v1/test/refuse", "/api/v1/test/hold":
		if s.path == "/api/v1/webhooks" && strings.Contains(s.body, "zz_unknown") {
			return 400, apierr.CodeInvalidRequest, false
		}
		if m.hooks[ws] >= webhooks.MaxWebhooks {
			return 409, apierr.CodeInvalidState, false
		}
		if s.path == "/api/v1/test/refuse" {
			// Without the header the route runs in no transaction of its
			// own, and the webhook it made before refusing stays.
			return 400, apierr.CodeInvalidRequest, s.key == ""
		}
		return 201, "", true
	case "/api/v1/test/fail":
		return 500, apierr.CodeInternal, false
	case "/api/v1/keys":
		if strings.Contains(s.body, "NOPE") {
			return 400, apierr.CodeInvalidRequest, false
		}
		return 201, "", false
	}
	panic("no route " + s.path)
}

// idemRig is a running model test: the service, its clock and callers.
type idemRig struct {
	t       *testing.T
	env     *apitest.Env
	srv     *httpapi.Server
	clock   *apitest.Clock
	callers []idemCaller
	ws      []apitest.Workspace
	hold    chan chan struct{} // a test/hold request sends its release channel, then waits on it
}

func startIdemRig(t *testing.T) *idemRig { return startIdemRigAt(t, time.Now()) }

// startIdemRigAt is startIdemRig with the service's clock starting at start.
func startIdemRigAt(t *testing.T, start time.Time) *idemRig {
	clock := apitest.NewClock(start)
	env := apitest.Start(t, apitest.WithNow(clock.Now))
	r := &idemRig{t: t, env: env, clock: clock, hold: make(chan chan struct{})}
	r.srv = httpapi.NewWithExtraRoutes(env.App.Server.Deps, []httpapi.Route{{
		Method: "POST", Pattern: "/api/v1/test/{outcome}", Name: "test.create", Status: 201, Idempotent: true,
		// A body of its own (struct{}: none is decoded), so that the
		// server leaves it to runOnce, which compares it as sent.
		Request: struct{}{}, Scopes: []string{auth.ScopeKeysWrite}, Handle: r.handle,
	}})
	a, b := env.Signup(), env.Signup()
	r.ws = []apitest.Workspace{a, b}
	second := env.Key(a, map[string]any{"name": "second", "preset": "OPERATOR"})
	for i, c := range []idemCaller{{name: "a1", secret: a.Key}, {name: "a2", secret: second},
		{name: "b1", secret: b.Key, ws: 1}} {
		rec := r.serve("GET", "/api/v1/keys/current", c.secret, "", "")
		require.Equal(t, 200, rec.Code, "%s", rec.Body)
		var k struct{ ID string }
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &k))
		c.id = k.ID
		r.callers = append(r.callers, c)
		_ = i
	}
	return r
}

// handle is the test route: it makes a webhook (hold: once released),
// then answers it (ok, hold) or refuses (refuse); or fails (fail).
func (r *idemRig) handle(ctx context.Context, c *httpapi.Call) (any, error) {
	outcome := c.R.PathValue("outcome")
	if outcome == "fail" {
		return nil, fmt.Errorf("the handler failed")
	}
	if outcome == "hold" {
		// Held before its write: a webhook's create locks its workspace
		// until the request's transaction ends, which would hold the
		// others' creates.
		release := make(chan struct{})
		r.hold <- release
		<-release
	}
	hook, err := r.env.App.Server.Webhooks.Create(ctx, c.Principal.WorkspaceID, hookBody)
	if err != nil {
		return nil, err
	}
	if outcome == "refuse" {
		return nil, apierr.InvalidField("name", "is taken")
	}
	return hook, nil
}

func (r *idemRig) serve(method, path, secret, key, body string) *httptest.ResponseRecorder {
	var req *http.Request
	if body == "" {
		req = httptest.NewRequest(method, path, nil)
	} else {
		req = httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	if key != "" {
		req.Header.Set(idempotency.Header, key)
	}
	rec := httptest.NewRecorder()
	r.srv.ServeHTTP(rec, req)
	return rec
}

func (r *idemRig) send(s idemSend) *httptest.ResponseRecorder {
	return r.serve("POST", s.path, r.callers[s.caller].secret, s.key, s.body)
}

// liveHooks is how many live webhooks workspace ws holds.
func (r *idemRig) liveHooks(ws int) int {
	rec := r.serve("GET", "/api/v1/webhooks?limit=100", r.ws[ws].Key, "", "")
	require.Equal(r.t, 200, rec.Code, "%s", rec.Body)
	var page struct{ Data []json.RawMessage }
	require.NoError(r.t, json.Unmarshal(rec.Body.Bytes(), &page))
	return len(page.Data)
}

// deleteHooks deletes every live webhook of workspace ws.
func (r *idemRig) deleteHooks(ws int) {
	rec := r.serve("GET", "/api/v1/webhooks?limit=100", r.ws[ws].Key, "", "")
	require.Equal(r.t, 200, rec.Code, "%s", rec.Body)
	var page struct{ Data []struct{ ID string } }
	require.NoError(r.t, json.Unmarshal(rec.Body.Bytes(), &page))
	for _, h := range page.Data {
		del := r.serve("DELETE", "/api/v1/webhooks/"+h.ID, r.ws[ws].Key, "", "")
		require.Equal(r.t, 200, del.Code, "%s", del.Body)
	}
}

// errorOf is an answer's error code and retry_after_seconds.
func errorOf(body []byte) (code string, retry int) {
	var e struct {
		Error struct {
			Code   string
			Detail struct {
				RetryAfterSeconds int `json:"retry_after_seconds"`
			}
		}
	}
	_ = json.Unmarshal(body, &e)
	return e.Error.Code, e.Error.Detail.RetryAfterSeconds
}

// check compares an answer with the model's prediction: status, error
// code, and the replay headers (replayed: the request that acted).
func check(tr *apitest.ModelTrace, rec *httptest.ResponseRecorder, status int, code string, replayed string) {
	got, _ := errorOf(rec.Body.Bytes())
	if rec.Code != status || got != code {
		tr.Fail("got %d %q, model %d %q: %s", rec.Code, got, status, code, apitest.Canonical(rec.Body.Bytes()))
		return
	}
	if g := rec.Header().Get(httpapi.ReplayedHeader); (g == "true") != (replayed != "") {
		tr.Fail("%s %q, model replayed=%v", httpapi.ReplayedHeader, g, replayed != "")
	}
	if g := rec.Header().Get(httpapi.OriginalRequestHeader); g != replayed {
		tr.Fail("%s %q, model %q", httpapi.OriginalRequestHeader, g, replayed)
	}
}

// predictAndSend sends s and compares its answer with the model's, which
// it then updates.
func (r *idemRig) predictAndSend(m *idemModel, tr *apitest.ModelTrace, s idemSend) {
	c := r.callers[s.caller]
	now := r.clock.Now()
	rec := r.send(s)
	tr.Add(fmt.Sprintf("%s -> %d %s", s, rec.Code, rec.Header().Get(httpapi.ReplayedHeader)))
	if s.key != "" && !validModelKey(s.key) {
		m.hits["bad header"]++
		check(tr, rec, 400, apierr.CodeInvalidRequest, "")
		return
	}
	var e *idemEntry
	if s.key != "" {
		e = m.live(c.id, s.key, now)
	}
	hash := s.path + " " + s.body
	if old := m.entries[[2]string{c.id, s.key}]; s.key != "" && e == nil && old != nil {
		m.hits["acts after expiry or lapse"]++
	}
	switch {
	case e != nil && e.claimed:
		m.hits["retry_request"]++
		check(tr, rec, 409, apierr.CodeRetryRequest, "")
		if _, after := errorOf(rec.Body.Bytes()); after != retryAfter(e.until, now) ||
			rec.Header().Get("Retry-After") != fmt.Sprint(after) {
			tr.Fail("retry after %d (header %q), model %d", after, rec.Header().Get("Retry-After"),
				retryAfter(e.until, now))
		}
	case e != nil && e.hash != hash:
		m.hits["reuse"]++
		check(tr, rec, 409, apierr.CodeIdempotencyKeyReuse, "")
	case e != nil && e.erased:
		m.hits["erased"]++
		check(tr, rec, 404, apierr.CodeNotFound, e.requestID)
	case e != nil:
		m.hits["replay"]++
		check(tr, rec, e.status, "", e.requestID)
		if rec.Body.String() != e.body {
			tr.Fail("replayed body differs from the kept answer:\n got %s\nkept %s",
				apitest.Canonical(rec.Body.Bytes()), apitest.Canonical([]byte(e.body)))
		}
	default:
		status, code, hook := m.outcome(c.ws, s)
		m.hits[fmt.Sprintf("acts %d", status)]++
		check(tr, rec, status, code, "")
		if hook {
			m.hooks[c.ws]++
		}
		if s.key == "" {
			return
		}
		k := [2]string{c.id, s.key}
		if status >= 400 {
			delete(m.entries, k) // freed
			return
		}
		var made struct{ ID string }
		_ = json.Unmarshal(rec.Body.Bytes(), &made)
		m.entries[k] = &idemEntry{hash: hash, created: now, status: rec.Code, body: rec.Body.String(),
			requestID: rec.Header().Get("X-Request-Id"), resource: made.ID}
	}
}

// validModelKey is the model's Idempotency-Key rule for the keys it sends.
func validModelKey(k string) bool { return len(k) <= 255 && !strings.ContainsAny(k, "\t\u00a0") }

// idemSends is a random request of the sequence.
func idemSends(rng *rand.Rand, callers int) idemSend {
	s := idemSend{caller: rng.IntN(callers)}
	switch n := rng.IntN(20); {
	case n < 3:
	case n < 4:
		s.key = []string{"bad\tkey", strings.Repeat("k", 256), "nb\u00a0sp"}[rng.IntN(3)]
	default:
		s.key = fmt.Sprintf("k%d", rng.IntN(3))
	}
	switch rng.IntN(7) {
	case 0, 1:
		s.path = "/api/v1/webhooks"
		s.body = []string{`{"url":"https://example.com/a","events":["run.finished"]}`,
			`{"url":"https://example.com/b","events":["run.finished"]}`,
			`{"url":"https://example.com/a","events":["run.finished"],"zz_unknown":1}`}[rng.IntN(3)]
	case 2:
		s.path = "/api/v1/keys"
		s.body = []string{`{"name":"m0","preset":"AGENT"}`, `{"name":"m1","preset":"AGENT"}`,
			`{"name":"m2","preset":"NOPE"}`}[rng.IntN(3)]
	default:
		s.path = "/api/v1/test/" + []string{"ok", "ok", "refuse", "fail"}[rng.IntN(4)]
		s.body = []string{`{}`, `{ }`}[rng.IntN(2)]
	}
	return s
}

func TestIdempotencyKeyModel(t *testing.T) {
	t.Parallel()
	apitest.ModelRuns(t, 3, 80, func(t *testing.T, seed uint64, ops int) {
		runIdemModel(t, startIdemRig(t), seed, ops, false)
	})
}

// TestIdempotencyKeyModelWithPurges is the model with the sweeper's
// passes among its operations (idempotency.expired, with the rest of the
// pass): each purges exactly the answers and claims a day old, which the
// model drops, and what follows is predicted as before, a purged key
// acting as a new one. Not parallel, in an era of its own (purgeEra): a
// pass acts on every API key's answers in the database.
func TestIdempotencyKeyModelWithPurges(t *testing.T) {
	apitest.ModelRuns(t, 5, 120, func(t *testing.T, seed uint64, ops int) {
		runIdemModel(t, startPurgeRig(t), seed, ops, true)
	})
}

// runIdemModel runs one sequence of the model over r (with sweeper passes
// among its operations when purges).
func runIdemModel(t *testing.T, r *idemRig, seed uint64, ops int, purges bool) {
	rng := rand.New(rand.NewPCG(seed, 0x1de))
	m := &idemModel{entries: map[[2]string]*idemEntry{}, hooks: []int{0, 0}, resource: map[string]bool{},
		hits: map[string]int{}}
	defer func() { t.Logf("predictions: %v", m.hits) }()
	name := map[bool]string{false: "TestIdempotencyKeyModel", true: "TestIdempotencyKeyModelWithPurges"}[purges]
	tr := apitest.NewModelTrace(t, fmt.Sprintf("MODEL_SEED=%d MODEL_OPS=%d go test -run '%s$' ./lib/httpapi/", seed, ops, name))
	var sent []idemSend
	for range ops {
		if tr.Failed() {
			return
		}
		switch n := rng.IntN(20); {
		case n < 10 || len(sent) == 0:
			s := idemSends(rng, len(r.callers))
			sent = append(sent, s)
			r.predictAndSend(m, tr, s)
		case n < 14:
			r.predictAndSend(m, tr, sent[rng.IntN(len(sent))]) // sent again as it was
		case n < 16:
			d := []time.Duration{5 * time.Second, 12 * time.Second, 31 * time.Second, 10 * time.Minute,
				12 * time.Hour, idempotency.TTL - time.Minute, idempotency.TTL}[rng.IntN(7)]
			r.clock.Add(d)
			tr.Add(fmt.Sprintf("clock +%s", d))
		case n < 18:
			r.deadClaim(m, tr, sent[rng.IntN(len(sent))])
		case purges && n < 19:
			r.purge(m, tr)
		default:
			r.deleteResource(m, tr, rng)
		}
		if tr.Failed() {
			return
		}
		for ws := range m.hooks {
			if got := r.liveHooks(ws); got != m.hooks[ws] {
				tr.Fail("workspace %d holds %d webhooks, model %d", ws, got, m.hooks[ws])
			}
		}
	}
}

// purge runs a sweeper pass: the rows of answers and claims a day old go
// (an answer, erased or not, or a claim, lapsed since), exactly those the
// model drops.
func (r *idemRig) purge(m *idemModel, tr *apitest.ModelTrace) {
	now := r.clock.Now()
	want := 0
	for k, e := range m.entries {
		if !e.created.After(now.Add(-idempotency.TTL)) {
			delete(m.entries, k)
			want++
		}
	}
	got := r.sweep()
	tr.Add(fmt.Sprintf("sweep -> %d purged", got))
	if got != want {
		tr.Fail("the pass purged %d, model %d", got, want)
	}
	if want > 0 {
		m.hits["purged"] += want
	}
}

// deadClaim claims s's key for a request that dies at once (lib/idempotency's
// Begin, never answered): the key is held until the claim lapses.
func (r *idemRig) deadClaim(m *idemModel, tr *apitest.ModelTrace, s idemSend) {
	c := r.callers[s.caller]
	now := r.clock.Now()
	if s.key == "" || !validModelKey(s.key) || m.live(c.id, s.key, now) != nil {
		return
	}
	tr.Add(fmt.Sprintf("dead claim caller=%d key=%q %s", s.caller, s.key, s.path))
	claim, stored, err := r.env.App.Server.Deps.Idempotency.Begin(context.Background(), idempotency.Request{
		APIKeyID: c.id, Key: s.key, Method: "POST", Path: s.path, Body: []byte(s.body),
		ID: fmt.Sprintf("dead-%d", tr.Len()),
	})
	if err != nil || stored != nil || claim == nil {
		tr.Fail("dead claim: err %v, stored %v: the model holds the key free", err, stored != nil)
		return
	}
	m.entries[[2]string{c.id, s.key}] = &idemEntry{hash: s.path + " " + s.body, claimed: true,
		until: now.Add(idempotency.ClaimTTL), created: now}
}

// deleteResource deletes a webhook or revokes a key whose create's answer
// the model keeps: the answer is erased.
func (r *idemRig) deleteResource(m *idemModel, tr *apitest.ModelTrace, rng *rand.Rand) {
	var made []*idemEntry
	var owners []int
	for k, e := range m.entries {
		if e.resource != "" && !m.resource[e.resource] {
			for i, c := range r.callers {
				if c.id == k[0] {
					made, owners = append(made, e), append(owners, i)
				}
			}
		}
	}
	if len(made) == 0 {
		return
	}
	i := rng.IntN(len(made))
	e, c := made[i], r.callers[owners[i]]
	path := "/api/v1/webhooks/" + e.resource
	if strings.HasPrefix(e.resource, "key_") {
		path = "/api/v1/keys/" + e.resource
	}
	rec := r.serve("DELETE", path, r.ws[c.ws].Key, "", "")
	tr.Add(fmt.Sprintf("DELETE %s -> %d", path, rec.Code))
	if rec.Code != 200 {
		tr.Fail("delete %s: %d %s", path, rec.Code, rec.Body)
		return
	}
	m.resource[e.resource] = true
	if !strings.HasPrefix(e.resource, "key_") {
		m.hooks[c.ws]--
	}
	for _, o := range m.entries {
		if o.resource == e.resource {
			o.erased = true
		}
	}
}

// TestIdempotencyKeyModelConcurrent sends requests under one key together.
// In a held round the first request holds the key while the others are
// sent (its handler waits): those of its API key are told 409
// retry_request (Retry-After as the claim's age says), another API key's
// acts; with the service's clock moved past the claim's 30 seconds the
// first of them takes the key over and acts, and the held request, once
// released, rolls its webhook back and is told 409 retry_request. In a
// free round they race: exactly one acts, each other one is told
// retry_request or given the actor's answer (same request) or
// idempotency_key_reuse (another). Either way the workspaces hold the
// webhooks of the requests that acted, and nothing more.
func TestIdempotencyKeyModelConcurrent(t *testing.T) {
	t.Parallel()
	apitest.ModelRuns(t, 3, 10, func(t *testing.T, seed uint64, rounds int) {
		r := startIdemRig(t)
		rng := rand.New(rand.NewPCG(seed, 0xc0c))
		tr := apitest.NewModelTrace(t, fmt.Sprintf("MODEL_SEED=%d MODEL_OPS=%d go test -run 'TestIdempotencyKeyModelConcurrent$' ./lib/httpapi/", seed, rounds))
		hooks := []int{0, 0}
		for round := range rounds {
			if tr.Failed() {
				return
			}
			key := fmt.Sprintf("c%d", round)
			if rng.IntN(2) == 0 {
				r.heldRound(tr, rng, key, hooks)
			} else {
				r.freeRound(tr, rng, key, hooks)
			}
			for ws := range hooks {
				if got := r.liveHooks(ws); got != hooks[ws] {
					tr.Fail("workspace %d holds %d webhooks, model %d", ws, got, hooks[ws])
				}
				if hooks[ws] > webhooks.MaxWebhooks-8 { // a round makes up to 6
					r.deleteHooks(ws)
					hooks[ws] = 0
				}
			}
			r.clock.Add(time.Minute)
		}
	})
}

// followers are requests sent under a held key: another body, another
// path, or the same request.
func followers(rng *rand.Rand, caller int, key string) []idemSend {
	var out []idemSend
	for range 1 + rng.IntN(4) {
		s := idemSend{caller: caller, key: key, path: "/api/v1/test/ok", body: `{}`}
		switch rng.IntN(4) {
		case 0:
			s.body = `{ }`
		case 1:
			s.path = "/api/v1/webhooks"
			s.body = `{"url":"https://example.com/a","events":["run.finished"]}`
		case 2:
			s.caller = 1 - caller // the other API key of workspace a: a key of its own
		}
		out = append(out, s)
	}
	return out
}

func (r *idemRig) heldRound(tr *apitest.ModelTrace, rng *rand.Rand, key string, hooks []int) {
	caller := rng.IntN(2) // workspace a's API keys
	held := idemSend{caller: caller, key: key, path: "/api/v1/test/hold", body: `{}`}
	start := r.clock.Now()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- r.send(held) }()
	release := <-r.hold // its handler runs: the key is claimed
	age := []time.Duration{0, 25 * time.Second, idempotency.ClaimTTL + time.Second}[rng.IntN(3)]
	r.clock.Add(age)
	tr.Add(fmt.Sprintf("held %s, clock +%s", held, age))
	var taker *idemSend // the follower that took a lapsed claim over
	var other *idemSend // the other API key's first request, which acted
	var takerAnswer, otherAnswer *httptest.ResponseRecorder
	for _, f := range followers(rng, caller, key) {
		rec := r.send(f)
		tr.Add(fmt.Sprintf("  %s -> %d %s", f, rec.Code, rec.Header().Get(httpapi.ReplayedHeader)))
		if f.caller != caller {
			// Another API key's: a key of its own, free at first.
			if other == nil {
				check(tr, rec, 201, "", "")
				hooks[0]++
				other, otherAnswer = &f, rec
			} else {
				r.checkAfterActor(tr, rec, f, *other, otherAnswer)
			}
			continue
		}
		switch {
		case age > idempotency.ClaimTTL && taker == nil:
			check(tr, rec, 201, "", "")
			hooks[0]++
			taker, takerAnswer = &f, rec
		case taker != nil:
			r.checkAfterActor(tr, rec, f, *taker, takerAnswer)
		default:
			check(tr, rec, 409, apierr.CodeRetryRequest, "")
			want := retryAfter(start.Add(idempotency.ClaimTTL), r.clock.Now())
			if _, after := errorOf(rec.Body.Bytes()); after != want || rec.Header().Get("Retry-After") != fmt.Sprint(want) {
				tr.Fail("retry after %d (header %q), model %d", after, rec.Header().Get("Retry-After"), want)
			}
		}
	}
	close(release)
	rec := <-done
	tr.Add(fmt.Sprintf("  released %s -> %d", held, rec.Code))
	if taker != nil {
		check(tr, rec, 409, apierr.CodeRetryRequest, "") // outlived its claim: rolled back
		if _, after := errorOf(rec.Body.Bytes()); after != 1 {
			tr.Fail("the held request's retry after %d, want 1", after)
		}
		again := r.send(held)
		check(tr, again, 409, apierr.CodeIdempotencyKeyReuse, "")
		return
	}
	check(tr, rec, 201, "", "")
	hooks[0]++
	again := r.send(held)
	check(tr, again, 201, "", rec.Header().Get("X-Request-Id"))
	if again.Body.String() != rec.Body.String() {
		tr.Fail("replayed body differs from the held request's answer")
	}
}

func (r *idemRig) freeRound(tr *apitest.ModelTrace, rng *rand.Rand, key string, hooks []int) {
	caller := rng.IntN(len(r.callers))
	n := 2 + rng.IntN(4)
	sends := make([]idemSend, n)
	for i := range sends {
		sends[i] = idemSend{caller: caller, key: key, path: "/api/v1/test/ok", body: `{}`}
		switch rng.IntN(3) {
		case 0:
			sends[i].body = `{ }`
		case 1:
			sends[i].path = "/api/v1/webhooks"
			sends[i].body = `{"url":"https://example.com/a","events":["run.finished"]}`
		}
	}
	recs := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range sends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			recs[i] = r.send(sends[i])
		}()
	}
	close(gate)
	wg.Wait()
	actor := -1
	for i, rec := range recs {
		tr.Add(fmt.Sprintf("  together %s -> %d %s", sends[i], rec.Code, rec.Header().Get(httpapi.ReplayedHeader)))
		if rec.Code == 201 && rec.Header().Get(httpapi.ReplayedHeader) == "" {
			if actor >= 0 {
				tr.Fail("two requests acted under one key")
			}
			actor = i
		}
	}
	if actor < 0 {
		tr.Fail("no request acted")
		return
	}
	hooks[r.callers[caller].ws]++
	for i, rec := range recs {
		switch code, after := errorOf(rec.Body.Bytes()); {
		case i == actor:
		case code == apierr.CodeRetryRequest:
			check(tr, rec, 409, code, "")
			if after != 1 {
				tr.Fail("retry after %d, want 1 (a fresh claim)", after)
			}
		default:
			r.checkAfterActor(tr, rec, sends[i], sends[actor], recs[actor])
		}
	}
}

// checkAfterActor checks the answer to s, sent under a key that actor's
// request answered (answer): the same request is given that answer again,
// another is 409 idempotency_key_reuse.
func (r *idemRig) checkAfterActor(tr *apitest.ModelTrace, rec *httptest.ResponseRecorder, s, actor idemSend,
	answer *httptest.ResponseRecorder) {
	if s != actor {
		check(tr, rec, 409, apierr.CodeIdempotencyKeyReuse, "")
		return
	}
	check(tr, rec, answer.Code, "", answer.Header().Get("X-Request-Id"))
	if rec.Body.String() != answer.Body.String() {
		tr.Fail("replayed body differs from the answer kept: %s", apitest.Canonical(rec.Body.Bytes()))
	}
}

package gate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// TestCeilingCountersMatchTheirAttempts runs, from a seed, a random sequence
// of begins (by the agent or a capped key), reports, lapses, resolves,
// sweeps, midnights and policy PUTs that set, lower, raise and clear a
// type's daily budget and a dimension's limits (count only, money only,
// both, none) and switch on_indeterminate between retry and probe, and
// checks after every operation what the README's "Risk controls and
// circuits" promises of the daily counters: each counter holds exactly the
// charges its attempts recorded and have not given back (an attempt not
// known to have failed), never less than nothing; and while a ceiling is
// set, every attempt of the type granted that UTC day and not known to have
// failed is charged on it (its cost where money is capped), but a probe
// after an attempt of unknown outcome the same day, which adds nothing.
// MODEL_SEED and MODEL_SEEDS, MODEL_OPS as for the model tests. Not
// parallel: a sweep acts on every workspace.
func TestCeilingCountersMatchTheirAttempts(t *testing.T) {
	apitest.ModelRuns(t, 4, 150, runCeilingInvariants)
}

type invKey struct {
	name, id, token, vendor string
	cost                    int64
	capped                  bool
}

func runCeilingInvariants(t *testing.T, seed uint64, ops int) {
	b := setup(t)
	rng := rand.New(rand.NewPCG(seed, 0x696e76))
	const typ = "inv.call"
	capped := b.env.Key(b.ws, map[string]any{"name": "capped", "preset": "AGENT", "daily_spend_ceiling_micros": 900})
	var keys []*invKey
	for i, cost := range []int64{100, 200, 300, 400, 600, 100, 250, 700} {
		keys = append(keys, &invKey{name: fmt.Sprintf("inv-%d-%d-%s", seed, i, key("k")), cost: cost,
			vendor: []string{"acme", "globex"}[i%2], capped: i%3 == 0})
	}
	budget := any(int64(1500))
	limit := any(map[string]any{"daily_micros": 1000, "daily_count": 5})
	onInd := "retry"
	var approvalAbove any
	put := func() *apitest.Response {
		limits := map[string]any{}
		if limit != nil {
			limits["vendor"] = limit
		}
		return b.env.Do("PUT", "/api/v1/policies/"+typ, b.ws.Key, map[string]any{
			"on_indeterminate": onInd, "max_attempts": 50, "lease_seconds": 30, "approval_above_micros": approvalAbove,
			"daily_budget_micros": budget, "dimension_limits": limits})
	}
	var trace []string
	seen := map[string]int{}
	logf := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		trace = append(trace, line)
		if _, rest, ok := strings.Cut(line, " "); ok {
			what, answer, _ := strings.Cut(rest, " -> ")
			what, _, _ = strings.Cut(what, " ")
			answer, _, _ = strings.Cut(answer, " probe=")
			seen[what+" "+answer]++
		}
	}
	failf := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("MODEL_SEED=%d MODEL_OPS=%d: "+format+"\ntrace:\n%s", append(append([]any{seed, ops}, args...),
			strings.Join(trace, "\n"))...)
	}
	r := put()
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	ctx := context.Background()

	for op := 0; op < ops; op++ {
		k := keys[rng.IntN(len(keys))]
		switch n := rng.IntN(100); {
		case n < 35:
			body := map[string]any{"effect_type": typ, "idempotency_key": k.name, "payload": map[string]any{"k": k.name},
				"cost_micros": k.cost, "dimensions": map[string]any{"vendor": k.vendor}}
			secret := b.ws.Key
			if k.capped {
				secret = capped
			}
			r := b.env.Do("POST", "/api/v1/effects/begin", secret, body)
			out := r.JSON()
			if r.Status >= 500 || (r.Status != http.StatusOK && r.Status != http.StatusForbidden) {
				if r.Status == http.StatusBadRequest && strings.Contains(string(r.Body), "dimension_required") {
					break
				}
				failf("begin %s: %d %s", k.name, r.Status, r.Body)
			}
			if id, ok := out["effect_id"].(string); ok {
				k.id = id
			}
			if out["decision"] == "execute" {
				k.token = str(out["lease_token"])
			}
			code := ""
			if e, ok := out["error"].(map[string]any); ok {
				code = str(e["code"])
			}
			logf("%d begin %s (cost %d, %s) -> %v %s probe=%v", op, k.name, k.cost, k.vendor, out["decision"], code, out["probe"])
			if msg := checkGrantOrRefusal(t, b, k, str(out["decision"]), code, budget, limit); msg != "" {
				failf("after op %d: %s", op, msg)
			}
			if out["decision"] == "duplicate" || code == "approval_rejected" || code == "max_attempts_exceeded" {
				// Settled for good: a new key of the same cost takes its place.
				k.name, k.id, k.token = fmt.Sprintf("inv-%d-%d-%s", seed, op, key("k")), "", ""
			}
		case n < 55:
			if k.token == "" {
				break
			}
			outcome := []string{"succeeded", "failed"}[rng.IntN(2)]
			r := b.env.Do("POST", "/api/v1/effects/"+k.id+"/report", b.ws.Key,
				map[string]any{"lease_token": k.token, "outcome": outcome})
			if r.Status >= 500 {
				failf("report: %d %s", r.Status, r.Body)
			}
			logf("%d report %s %s -> %d", op, k.name, outcome, r.Status)
			k.token = ""
		case n < 65:
			d := []time.Duration{31 * time.Second, 10 * time.Second}[rng.IntN(2)]
			b.clock.Add(d)
			logf("%d clock +%s", op, d)
		case n < 75:
			if k.id == "" {
				break
			}
			outcome := []string{"succeeded", "failed"}[rng.IntN(2)]
			r := b.env.Do("POST", "/api/v1/effects/"+k.id+"/resolve", b.ws.Key, map[string]any{"outcome": outcome})
			if r.Status >= 500 {
				failf("resolve: %d %s", r.Status, r.Body)
			}
			logf("%d resolve %s %s -> %d", op, k.name, outcome, r.Status)
		case n < 77:
			res := b.env.App.Sweeper.RunOnce(ctx)
			logf("%d sweep -> %v", op, res.Error())
		case n < 80:
			// The vendor's records of a few keys settle those of unknown outcome.
			var records []map[string]any
			var named []string
			for _, k := range keys {
				if rng.IntN(3) == 0 {
					st := []string{"succeeded", "failed", "pending", "refunded"}[rng.IntN(4)]
					records = append(records, map[string]any{"idempotency_key": k.name, "status": st, "amount_micros": k.cost})
					named = append(named, k.name+"="+st)
				}
			}
			now := b.clock.Now().UTC()
			r := b.env.Do("POST", "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": typ,
				"from": now.Add(-72 * time.Hour).Format(time.RFC3339), "to": now.Add(time.Minute).Format(time.RFC3339),
				"records": append([]map[string]any{}, records...)})
			if r.Status != http.StatusOK {
				failf("reconcile: %d %s", r.Status, r.Body)
			}
			logf("%d reconcile %v -> resolved %d", op, named, len(r.JSON()["resolved"].([]any)))
		case n < 84:
			r := b.env.Must(http.StatusOK, "GET", "/api/v1/approvals?state=pending", b.ws.Key, nil)
			pending, _ := r.JSON()["data"].([]any)
			if len(pending) == 0 {
				break
			}
			a := pending[rng.IntN(len(pending))].(map[string]any)
			verb := []string{"approve", "approve", "reject"}[rng.IntN(3)]
			r = b.env.Do("POST", "/api/v1/approvals/"+str(a["id"])+"/"+verb, b.ws.Key, map[string]any{"note": "inv"})
			if r.Status >= 500 {
				failf("%s: %d %s", verb, r.Status, r.Body)
			}
			logf("%d %s %s -> %d", op, verb, a["effect_id"], r.Status)
		case n < 93:
			switch rng.IntN(4) {
			case 0:
				budget = []any{nil, int64(500), int64(1000), int64(3000)}[rng.IntN(4)]
			case 1:
				limit = []any{nil, map[string]any{"daily_count": 3}, map[string]any{"daily_micros": 800},
					map[string]any{"daily_micros": 1200, "daily_count": 6}}[rng.IntN(4)]
			case 3:
				approvalAbove = []any{nil, int64(600), int64(300)}[rng.IntN(3)]
			default:
				onInd = []string{"retry", "probe"}[rng.IntN(2)]
			}
			r := put()
			logf("%d put budget=%v vendor=%v on_indeterminate=%s approval_above=%v -> %d", op, budget, limit, onInd,
				approvalAbove, r.Status)
			if r.Status != http.StatusOK {
				failf("put: %d %s", r.Status, r.Body)
			}
		default:
			now := b.clock.Now().UTC()
			next := now.Truncate(24 * time.Hour).Add(24*time.Hour - 5*time.Second)
			if next.After(now) {
				b.clock.Add(next.Sub(now))
			} else {
				b.clock.Add(10 * time.Second)
			}
			logf("%d clock -> %s", op, b.clock.Now().UTC().Format(time.RFC3339))
		}
		if msg := checkCeilingInvariants(t, b, typ, budget != nil, limit); msg != "" {
			failf("after op %d: %s", op, msg)
		}
	}
	t.Logf("covered: %v", seen)
}

// checkCeilingInvariants answers what breaks the counters' invariants, ""
// when nothing does.
func checkCeilingInvariants(t *testing.T, b *bundle, typ string, budgetSet bool, limit any) string {
	t.Helper()
	ctx := context.Background()
	pool := b.env.App.Pool
	// 1. Each counter holds the charges of its day's attempts not known to
	// have failed (the sweep deletes counters of days before yesterday).
	bad := countersDisagreeing(t, b.env, b.ws.ID,
		b.clock.Now().UTC().Truncate(24*time.Hour).Add(-24*time.Hour).Format(time.DateOnly))
	if len(bad) > 0 {
		return strings.Join(bad, "; ")
	}
	// 2. While a ceiling is set, today's grants not known to have failed are
	// charged on it, a same-day probe after an unknown attempt excepted.
	var limitMicros bool
	if l, ok := limit.(map[string]any); ok {
		_, limitMicros = l["daily_micros"]
	}
	rows, err := pool.Query(ctx, `
SELECT e.idempotency_key, a.attempt, a.probe, coalesce(a.charges, '[]'), e.cost_micros, e.dimensions ->> 'vendor'
FROM effect_attempts a JOIN effects e ON e.id = a.effect_id
WHERE a.workspace_id = $1 AND e.effect_type = $2 AND a.outcome IS DISTINCT FROM 'failed'
  AND a.started_at >= $3 AND a.started_at < $3 + interval '1 day'
  AND NOT (a.probe AND EXISTS (SELECT 1 FROM effect_attempts u WHERE u.effect_id = a.effect_id
      AND u.attempt < a.attempt AND u.started_at >= $3 AND u.outcome IN ('indeterminate', 'succeeded')))`,
		b.ws.ID, typ, b.clock.Now().UTC().Truncate(24*time.Hour))
	require.NoError(t, err)
	for rows.Next() {
		var (
			k, vendorHash string
			attempt       int
			probe         bool
			charges       []byte
			cost          int64
		)
		require.NoError(t, rows.Scan(&k, &attempt, &probe, &charges, &cost, &vendorHash))
		var cs []struct {
			Scope  string `json:"scope"`
			Micros int64  `json:"micros"`
			Count  int64  `json:"count"`
		}
		require.NoError(t, json.Unmarshal(charges, &cs))
		on := map[string]int64{}
		for _, c := range cs {
			on[c.Scope] = c.Micros
		}
		if m, ok := on["type:"+typ]; budgetSet && (!ok || m != cost) {
			bad = append(bad, fmt.Sprintf("%s attempt %d (probe %v) charges %s: the budget's missing", k, attempt, probe, charges))
		}
		dim := "dim:" + typ + ":vendor:" + vendorHash
		if m, ok := on[dim]; limit != nil && (!ok || (limitMicros && m != cost)) {
			bad = append(bad, fmt.Sprintf("%s attempt %d (probe %v) charges %s: the vendor limit's missing", k, attempt, probe, charges))
		}
	}
	require.NoError(t, rows.Err())
	// 3. A probe is not charged where an attempt of unknown outcome before
	// it the same day already is: of the two, one acted at most.
	rows, err = pool.Query(ctx, `
SELECT e.idempotency_key, a.attempt, c.scope
FROM effect_attempts a JOIN effects e ON e.id = a.effect_id,
    jsonb_to_recordset(a.charges) AS c(scope text)
WHERE a.workspace_id = $1 AND a.probe AND a.outcome IS DISTINCT FROM 'failed'
  AND EXISTS (SELECT 1 FROM effect_attempts u, jsonb_to_recordset(u.charges) AS uc(scope text)
      WHERE u.effect_id = a.effect_id AND u.attempt < a.attempt AND u.charged_on = a.charged_on
        AND uc.scope = c.scope AND u.outcome IN ('indeterminate', 'succeeded'))`, b.ws.ID)
	require.NoError(t, err)
	for rows.Next() {
		var (
			k, scope string
			attempt  int
		)
		require.NoError(t, rows.Scan(&k, &attempt, &scope))
		bad = append(bad, fmt.Sprintf("%s probe %d is charged on %s beside its unknown attempt", k, attempt, scope))
	}
	require.NoError(t, rows.Err())
	return strings.Join(bad, "; ")
}

// checkGrantOrRefusal checks a begin's answer against the counters it left:
// a grant fits every ceiling it was charged on, and a ceiling's refusal
// names one that the key's cost (or one more effect) does not fit.
func checkGrantOrRefusal(t *testing.T, b *bundle, k *invKey, decision, code string, budget, limit any) string {
	t.Helper()
	ctx := context.Background()
	day := b.clock.Now().UTC().Truncate(24 * time.Hour)
	caps := func(scope string) (capMicros, capCount *int64) {
		switch {
		case strings.HasPrefix(scope, "type:"):
			if v, ok := budget.(int64); ok {
				capMicros = &v
			}
		case strings.HasPrefix(scope, "key:"):
			v := int64(900)
			capMicros = &v
		case strings.HasPrefix(scope, "dim:"):
			if l, ok := limit.(map[string]any); ok {
				if v, ok := l["daily_micros"].(int); ok {
					m := int64(v)
					capMicros = &m
				}
				if v, ok := l["daily_count"].(int); ok {
					c := int64(v)
					capCount = &c
				}
			}
		}
		return capMicros, capCount
	}
	counter := func(scope string) (micros, count int64) {
		err := b.env.App.Pool.QueryRow(ctx, `SELECT micros, count FROM gate_spend
			WHERE workspace_id = $1 AND scope = $2 AND day = $3::date`, b.ws.ID, scope, day).Scan(&micros, &count)
		if err != nil {
			return 0, 0
		}
		return micros, count
	}
	switch {
	case decision == "execute":
		var charges []byte
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT coalesce(charges, '[]') FROM effect_attempts
			WHERE effect_id = $1 ORDER BY attempt DESC LIMIT 1`, k.id).Scan(&charges))
		var cs []struct {
			Scope string `json:"scope"`
		}
		require.NoError(t, json.Unmarshal(charges, &cs))
		for _, c := range cs {
			m, n := counter(c.Scope)
			capMicros, capCount := caps(c.Scope)
			if (capMicros != nil && m > *capMicros) || (capCount != nil && n > *capCount) {
				return fmt.Sprintf("%s was granted past %s: %d micros, %d count", k.name, c.Scope, m, n)
			}
		}
	case code == "budget_exceeded" || code == "dimension_limit_exceeded" || code == "key_budget_exceeded":
		var dims []byte
		var keyID string
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT e.dimensions::text, coalesce((SELECT a.began_by_key_id
			FROM effect_attempts a WHERE a.effect_id = e.id ORDER BY a.attempt DESC LIMIT 1), e.created_by_key_id)
			FROM effects e WHERE e.id = $1`, k.id).Scan(&dims, &keyID))
		var d map[string]string
		require.NoError(t, json.Unmarshal(dims, &d))
		scope := map[string]string{"budget_exceeded": "type:inv.call", "dimension_limit_exceeded": "dim:inv.call:vendor:" + d["vendor"]}[code]
		if code == "key_budget_exceeded" {
			if !k.capped {
				return fmt.Sprintf("%s, begun by an uncapped key, was refused %s", k.name, code)
			}
			return "" // the capped key's id is not the effect's creator's when another key began it first
		}
		m, n := counter(scope)
		capMicros, capCount := caps(scope)
		if capMicros == nil && capCount == nil {
			return fmt.Sprintf("%s was refused %s with no such ceiling set", k.name, code)
		}
		if !((capMicros != nil && m+k.cost > *capMicros) || (capCount != nil && n+1 > *capCount)) {
			return fmt.Sprintf("%s was refused %s though %d+%d micros, %d+1 count fit %v/%v", k.name, code, m, k.cost, n,
				deref(capMicros), deref(capCount))
		}
	}
	return ""
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestCeilingCountersMatchTheirAttemptsUnderConcurrency is the sequence's
// concurrent form: workers on two instances begin, report, resolve and
// probe the same keys while another changes the type's ceilings and
// on_indeterminate and moves the clock (across midnight too); once they are
// done the counters hold exactly what their attempts were charged and kept,
// and today's grants are charged on the ceilings set last. The seed fixes
// each worker's operations, not their interleaving.
func TestCeilingCountersMatchTheirAttemptsUnderConcurrency(t *testing.T) {
	apitest.ModelRuns(t, 2, 60, func(t *testing.T, seed uint64, ops int) {
		c := newClock()
		env1 := apitest.Start(t, apitest.WithNow(c.Now))
		env2 := apitest.Start(t, apitest.WithNow(c.Now))
		b := &bundle{t: t, env: env1, ws: env1.Signup(), clock: c}
		envs := []*apitest.Env{env1, env2}
		const typ = "inv.call"
		capped := env1.Key(b.ws, map[string]any{"name": "capped", "preset": "AGENT", "daily_spend_ceiling_micros": 900})
		var (
			mu   sync.Mutex
			keys []*invKey
		)
		for i, cost := range []int64{100, 200, 300, 400, 600, 100, 250, 700} {
			keys = append(keys, &invKey{name: fmt.Sprintf("cinv-%d-%d-%s", seed, i, key("k")), cost: cost,
				vendor: []string{"acme", "globex"}[i%2], capped: i%3 == 0})
		}
		var budget, limit any = int64(1500), map[string]any{"daily_micros": 1000, "daily_count": 5}
		onInd := "retry"
		putPolicy := func(env *apitest.Env) (int, map[string]any, error) {
			limits := map[string]any{}
			if limit != nil {
				limits["vendor"] = limit
			}
			return put(env, "/api/v1/policies/"+typ, b.ws.Key, map[string]any{
				"on_indeterminate": onInd, "max_attempts": 50, "lease_seconds": 30,
				"daily_budget_micros": budget, "dimension_limits": limits})
		}
		status, out, err := putPolicy(env1)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, "%v", out)
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			problems = make(chan string, 100)
		)
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(w)))
				env := envs[w%2]
				<-start
				for op := 0; op < ops; op++ {
					k := keys[rng.IntN(len(keys))]
					mu.Lock()
					id, token := k.id, k.token
					mu.Unlock()
					switch n := rng.IntN(100); {
					case n < 50:
						secret := b.ws.Key
						if k.capped {
							secret = capped
						}
						status, out, err := postBegin(env, secret, map[string]any{"effect_type": typ,
							"idempotency_key": k.name, "payload": map[string]any{"k": k.name}, "cost_micros": k.cost,
							"dimensions": map[string]any{"vendor": k.vendor}})
						if err != nil || (status >= 500 && !outOfTime(status, out)) {
							problems <- fmt.Sprintf("begin %s: %d %v %v", k.name, status, out, err)
							return
						}
						mu.Lock()
						if id, ok := out["effect_id"].(string); ok {
							k.id = id
						}
						if out["decision"] == "execute" {
							k.token = str(out["lease_token"])
						}
						mu.Unlock()
					case n < 80:
						if token == "" {
							continue
						}
						status, out, err := post(env, "/api/v1/effects/"+id+"/report", b.ws.Key,
							map[string]any{"lease_token": token, "outcome": []string{"succeeded", "failed"}[rng.IntN(2)]})
						if err != nil || (status >= 500 && !outOfTime(status, out)) {
							problems <- fmt.Sprintf("report %s: %d %v %v", k.name, status, out, err)
							return
						}
					default:
						if id == "" {
							continue
						}
						status, out, err := post(env, "/api/v1/effects/"+id+"/resolve", b.ws.Key,
							map[string]any{"outcome": []string{"succeeded", "failed"}[rng.IntN(2)]})
						if err != nil || (status >= 500 && !outOfTime(status, out)) {
							problems <- fmt.Sprintf("resolve %s: %d %v %v", k.name, status, out, err)
							return
						}
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 99))
			<-start
			for op := 0; op < ops/3; op++ {
				switch rng.IntN(6) {
				case 0:
					budget = []any{nil, int64(500), int64(1000), int64(3000)}[rng.IntN(4)]
				case 1:
					limit = []any{nil, map[string]any{"daily_count": 3}, map[string]any{"daily_micros": 800},
						map[string]any{"daily_micros": 1200, "daily_count": 6}}[rng.IntN(4)]
				case 2:
					onInd = []string{"retry", "probe"}[rng.IntN(2)]
				case 3:
					c.Add(31 * time.Second) // leases lapse
					continue
				case 4:
					now := c.Now().UTC()
					if next := now.Truncate(24 * time.Hour).Add(24*time.Hour - 2*time.Second); next.After(now) {
						c.Add(next.Sub(now))
					} else {
						c.Add(5 * time.Second)
					}
					continue
				default:
					if err := env1.App.Sweeper.RunOnce(context.Background()).Error(); err != nil {
						problems <- fmt.Sprintf("sweep: %v", err)
					}
					continue
				}
				status, out, err := putPolicy(envs[rng.IntN(2)])
				if err != nil || (status != http.StatusOK && !outOfTime(status, out)) {
					problems <- fmt.Sprintf("put: %d %v %v", status, out, err)
					return
				}
			}
		}()
		close(start)
		wg.Wait()
		close(problems)
		for p := range problems {
			t.Error(p)
		}
		// The policy as written last (a PUT that ran out of time may have
		// committed all the same).
		p := env1.Must(http.StatusOK, "GET", "/api/v1/policies/"+typ, b.ws.Key, nil).JSON()
		var last any
		if l, ok := p["dimension_limits"].(map[string]any)["vendor"].(map[string]any); ok {
			lim := map[string]any{}
			for f, v := range l {
				if v != nil {
					lim[f] = int(v.(float64))
				}
			}
			last = lim
		}
		if msg := checkCeilingInvariants(t, b, typ, p["daily_budget_micros"] != nil, last); msg != "" {
			t.Fatalf("MODEL_SEED=%d MODEL_OPS=%d: %s", seed, ops, msg)
		}
	})
}

package gate_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// ceilingRace is one ceiling hammered alone: racers begin distinct keys
// of varied costs at once from two instances, each charged to one of the
// ceiling's counters (a dimension's value, or the one counter).
type ceilingRace struct {
	code     string // the ceiling's refusal
	capOf    int64  // each counter's cap (micros, or effects when count)
	count    bool   // a daily_count: every grant counts 1
	apiKey   string
	bodyOf   func(i int, k string, cost int64) map[string]any
	counters int // counters racer i is charged to: i % counters
}

// grantTry is one racer's begin and what it was answered.
type grantTry struct {
	counter        int
	cost           int64
	code, id, tokn string
}

// answered records a begin's answer in g: execute with its effect and
// token, or the status and code of a refusal, whose detail it answers.
func (g *grantTry) answered(status int, out map[string]any, err error) (detail map[string]any) {
	switch {
	case err != nil:
		g.code = err.Error()
	case out["decision"] == "execute":
		g.code, g.id, g.tokn = "execute", str(out["effect_id"]), str(out["lease_token"])
	default:
		e, _ := out["error"].(map[string]any)
		g.code = fmt.Sprintf("%d:%v", status, e["code"])
		detail, _ = e["detail"].(map[string]any)
	}
	return detail
}

// costOf spreads racers' costs over 1..50 micros.
func costOf(i int) int64 { return int64(i*37%50 + 1) }

// race begins n keys at once and answers each one's try.
func (r ceilingRace) race(t *testing.T, n int, envs ...*apitest.Env) []grantTry {
	t.Helper()
	tries := make([]grantTry, n)
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for i := range tries {
		env := envs[i%len(envs)]
		tries[i] = grantTry{counter: i % r.counters, cost: costOf(i)}
		body := r.bodyOf(i, key("ceiling"), tries[i].cost)
		wg.Go(func() {
			<-start
			tries[i].answered(postBegin(env, r.apiKey, body))
		})
	}
	close(start)
	wg.Wait()
	return tries
}

// requireFits checks that each counter granted no more than its cap and
// refused only what did not fit beside what it granted (nothing is given
// back during the race, so a refusal means the cost did not fit then, nor
// at the end).
func (r ceilingRace) requireFits(t *testing.T, tries []grantTry) {
	t.Helper()
	granted := make([]int64, r.counters)
	for _, g := range tries {
		if g.code == "execute" {
			granted[g.counter] += r.charge(g)
		}
	}
	for c, sum := range granted {
		require.LessOrEqual(t, sum, r.capOf, "counter %d overspent", c)
	}
	for _, g := range tries {
		switch g.code {
		case "execute":
		case "403:" + r.code:
			require.Greater(t, granted[g.counter]+r.charge(g), r.capOf,
				"counter %d refused %d micros that fit beside its %d", g.counter, g.cost, granted[g.counter])
		default:
			t.Fatalf("unexpected answer %s", g.code)
		}
	}
}

func (r ceilingRace) charge(g grantTry) int64 {
	if r.count {
		return 1
	}
	return g.cost
}

// Each daily ceiling and a run's wallet, hammered alone by 80 begins of
// varied costs from two instances, admits only what fits (API.md §2 and
// README "Risk controls": "Under any concurrency a ceiling admits exactly
// what fits"): no counter passes its cap, and no begin is refused while
// its cost fit. Then the grants' failed reports race a second burst: each
// failure gives back exactly its own charge, so the counters end equal to
// what the attempts not known to have failed hold, and within the caps.
func TestEachCeilingAloneAdmitsExactlyWhatFits(t *testing.T) {
	t.Parallel()
	_, env1, env2, ws := twoInstances(t)
	const racers, ceiling = 80, 500
	vendor := func(effectType string) func(i int, k string, cost int64) map[string]any {
		return func(i int, k string, cost int64) map[string]any {
			body := charge(k, cost)
			body["effect_type"], body["dimensions"] = effectType, map[string]any{"vendor": []string{"acme", "globex"}[i%2]}
			return body
		}
	}
	typed := func(effectType string) func(i int, k string, cost int64) map[string]any {
		return func(_ int, k string, cost int64) map[string]any {
			body := charge(k, cost)
			body["effect_type"] = effectType
			return body
		}
	}
	putPolicy := func(effectType string, policy map[string]any) {
		env1.Must(http.StatusOK, "PUT", "/api/v1/policies/"+effectType, ws.Key, policy)
	}
	run := str(env1.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key,
		map[string]any{"name": "loop", "budgetMicros": ceiling}).JSON()["id"])

	cases := map[string]func() ceilingRace{
		"type daily budget": func() ceilingRace {
			putPolicy("budget.call", map[string]any{"daily_budget_micros": ceiling})
			return ceilingRace{code: "budget_exceeded", capOf: ceiling, apiKey: ws.Key, bodyOf: typed("budget.call"), counters: 1}
		},
		"key daily spend ceiling": func() ceilingRace {
			agent := env1.Key(ws, map[string]any{"name": "capped", "preset": "AGENT", "daily_spend_ceiling_micros": ceiling})
			// The key's ceiling spans every type it begins.
			return ceilingRace{code: "key_budget_exceeded", capOf: ceiling, apiKey: agent, counters: 1,
				bodyOf: func(i int, k string, cost int64) map[string]any {
					return typed([]string{"keyed.call", "keyed.other"}[i%2])(i, k, cost)
				}}
		},
		"dimension daily micros per value": func() ceilingRace {
			putPolicy("dim.call", map[string]any{"dimension_limits": map[string]any{"vendor": map[string]any{"daily_micros": ceiling}}})
			return ceilingRace{code: "dimension_limit_exceeded", capOf: ceiling, apiKey: ws.Key, bodyOf: vendor("dim.call"), counters: 2}
		},
		"dimension daily count per value": func() ceilingRace {
			putPolicy("count.call", map[string]any{"dimension_limits": map[string]any{"vendor": map[string]any{"daily_count": 17}}})
			return ceilingRace{code: "dimension_limit_exceeded", capOf: 17, count: true, apiKey: ws.Key, bodyOf: vendor("count.call"), counters: 2}
		},
		"run wallet": func() ceilingRace {
			return ceilingRace{code: "run_budget_exceeded", capOf: ceiling, apiKey: ws.Key, counters: 1,
				bodyOf: func(i int, k string, cost int64) map[string]any {
					return inRun(run, typed("wallet.call")(i, k, cost))
				}}
		},
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			r := setup()
			first := r.race(t, racers, env1, env2)
			r.requireFits(t, first)
			refused := make([]int, r.counters)
			for _, g := range first {
				if g.code != "execute" {
					refused[g.counter]++
				}
			}
			for c, n := range refused {
				require.Positive(t, n, "counter %d: the burst asked for more than fits", c)
			}

			// The first burst's grants reported failed, each twice at once
			// from both instances (a client's retry), while a second burst
			// races them: each failure gives its charge back once.
			var wg sync.WaitGroup
			for _, g := range first {
				if g.code != "execute" {
					continue
				}
				for _, env := range []*apitest.Env{env1, env2} {
					wg.Go(func() {
						status, out, err := post(env, "/api/v1/effects/"+g.id+"/report",
							r.apiKey, map[string]any{"lease_token": g.tokn, "outcome": "failed"})
						if err != nil || status != http.StatusOK {
							t.Errorf("report: %d %v %v", status, out, err)
						}
					})
				}
			}
			second := r.race(t, racers, env1, env2)
			wg.Wait()
			held := make([]int64, r.counters)
			for _, g := range second {
				require.Contains(t, []string{"execute", "403:" + r.code}, g.code)
				if g.code == "execute" {
					held[g.counter] += r.charge(g)
				}
			}
			for c, sum := range held {
				require.LessOrEqual(t, sum, r.capOf, "counter %d overspent once failures gave back", c)
			}
			requireCountersMatchAttempts(t, env1, ws.ID)
		})
	}
	var spent int64
	require.NoError(t, env1.App.Pool.QueryRow(t.Context(), `SELECT coalesce(sum(e.cost_micros), 0)::bigint
		FROM effect_attempts a JOIN effects e ON e.id = a.effect_id
		WHERE e.run_id = $1 AND a.outcome IS DISTINCT FROM 'failed'`, run).Scan(&spent))
	require.LessOrEqual(t, spent, int64(ceiling))
	runSpent := env1.Must(http.StatusOK, "GET", "/api/v1/runs/"+run, ws.Key, nil).JSON()["spentMicros"]
	require.EqualValues(t, spent, runSpent, "the wallet counts what its attempts not known to have failed declared")
}

// One key begun by many callers at once at a ceiling's edge is charged
// once: with room for its cost exactly, one execute and the rest
// in_flight, the counter at the cap; without room, every begin refused by
// the ceiling, one stored denial and nothing charged. Then the key's
// failure gives the room back, and the refused key begun again by many
// fits once.
func TestOneKeyAtTheCeilingIsChargedOnce(t *testing.T) {
	t.Parallel()
	_, env1, env2, ws := twoInstances(t)
	env1.Must(http.StatusOK, "PUT", "/api/v1/policies/api.call", ws.Key, map[string]any{"daily_budget_micros": 100,
		"dimension_limits": map[string]any{"vendor": map[string]any{"daily_count": 1}}})
	body := func(k string) map[string]any {
		b := charge(k, 100)
		b["dimensions"] = map[string]any{"vendor": "acme"}
		return b
	}
	const racers = 60
	fits, refused := body(key("fits")), body(key("refused"))
	counts, execs := raceBegins(t, racers, ws.Key, fits, env1, env2)
	require.Equal(t, map[string]int{"execute": 1, "in_flight": racers - 1}, counts)
	counts, _ = raceBegins(t, racers, ws.Key, refused, env1, env2)
	require.Len(t, counts, 1, "%v", counts)
	for code := range counts {
		require.Contains(t, []string{"403:budget_exceeded", "403:dimension_limit_exceeded"}, code)
	}
	counters := spendCounters(t, env1, ws.ID)
	require.Len(t, counters, 2)
	for scope, got := range counters {
		want := spendCounter{micros: 0, count: 1} // the vendor's count-only limit
		if scope == "type:api.call" {
			want.micros = 100
		}
		require.Equal(t, want, got, scope)
	}

	r := env2.Do("POST", "/api/v1/effects/"+str(execs[0]["effect_id"])+"/report", ws.Key,
		map[string]any{"lease_token": execs[0]["lease_token"], "outcome": "failed"})
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	counts, _ = raceBegins(t, racers, ws.Key, refused, env1, env2)
	require.Equal(t, map[string]int{"execute": 1, "in_flight": racers - 1}, counts)
	requireCountersMatchAttempts(t, env1, ws.ID)
	var effects, attempts int
	require.NoError(t, env1.App.Pool.QueryRow(t.Context(), `SELECT count(*),
		(SELECT count(*) FROM effect_attempts WHERE workspace_id = $1) FROM effects WHERE workspace_id = $1`,
		ws.ID).Scan(&effects, &attempts))
	require.Equal(t, []int{2, 2}, []int{effects, attempts})
}

// Every ceiling at once: racers begin, from two instances, keys of two
// types — one with a daily budget and a per-vendor limit, begun under a
// capped key by some racers and under the uncapped one by the others; the
// other charged to a run's wallet — so that a grant must fit up to three
// ceilings, and a refusal by one must charge none of the others (the
// grant's statement is undone whole). Each ceiling ends within its cap,
// each refusal names a ceiling the cost did not fit, and once half of the
// grants are reported failed while a second burst races them, the counters
// still hold exactly what the attempts not known to have failed were
// charged, and each ceiling what it holds stays within its cap.
func TestEveryCeilingAtOnceAdmitsOnlyWhatFitsThemAll(t *testing.T) {
	t.Parallel()
	_, env1, env2, ws := twoInstances(t)
	const (
		typeCap, vendorCap, keyCap, walletCap = 400, 250, 150, 350
		racers                                = 80
	)
	env1.Must(http.StatusOK, "PUT", "/api/v1/policies/all.budgeted", ws.Key, map[string]any{
		"daily_budget_micros": typeCap,
		"dimension_limits":    map[string]any{"vendor": map[string]any{"daily_micros": vendorCap}}})
	run := str(env1.Must(http.StatusCreated, "POST", "/api/v1/runs", ws.Key,
		map[string]any{"name": "all", "budgetMicros": walletCap}).JSON()["id"])
	agent := env1.Key(ws, map[string]any{"name": "capped", "preset": "AGENT", "daily_spend_ceiling_micros": keyCap})

	vendor := func(i int) string { return []string{"acme", "globex"}[i/4%2] }
	// ceilings names the ceilings racer i is charged to, by their refusal
	// codes ("dimension_limit_exceeded:<vendor>" for a vendor's).
	ceilings := func(i int) []string {
		switch i % 4 {
		case 1, 3:
			return []string{"run_budget_exceeded"}
		case 0:
			return []string{"key_budget_exceeded", "budget_exceeded", "dimension_limit_exceeded:" + vendor(i)}
		}
		return []string{"budget_exceeded", "dimension_limit_exceeded:" + vendor(i)}
	}
	caps := map[string]int64{"key_budget_exceeded": keyCap, "run_budget_exceeded": walletCap,
		"budget_exceeded": typeCap, "dimension_limit_exceeded:acme": vendorCap,
		"dimension_limit_exceeded:globex": vendorCap}
	apiKeyOf := func(i int) string {
		if i%4 == 0 {
			return agent
		}
		return ws.Key
	}
	bodyOf := func(i int) map[string]any {
		body := charge(key("all"), costOf(i))
		if i%2 == 1 {
			body["effect_type"] = "all.wallet"
			return inRun(run, body)
		}
		body["effect_type"], body["dimensions"] = "all.budgeted", map[string]any{"vendor": vendor(i)}
		return body
	}
	burst := func() []grantTry {
		tries := make([]grantTry, racers)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range tries {
			env := []*apitest.Env{env1, env2}[i/2%2]
			tries[i] = grantTry{counter: i, cost: costOf(i)}
			body := bodyOf(i)
			wg.Go(func() {
				<-start
				if d := tries[i].answered(postBegin(env, apiKeyOf(i), body)); d["dimension"] != nil {
					tries[i].code += ":" + vendor(i)
				}
			})
		}
		close(start)
		wg.Wait()
		return tries
	}
	// totals are what the grants of held hold on each ceiling.
	totals := func(held ...[]grantTry) map[string]int64 {
		out := map[string]int64{}
		for _, tries := range held {
			for _, g := range tries {
				if g.code == "execute" {
					for _, c := range ceilings(g.counter) {
						out[c] += g.cost
					}
				}
			}
		}
		return out
	}
	requireWithin := func(sums map[string]int64, why string) {
		t.Helper()
		for c, sum := range sums {
			require.LessOrEqual(t, sum, caps[c], "%s: %s overspent", why, c)
		}
	}
	// refusedBy checks that each refusal of tries names a ceiling its racer
	// is charged to, and counts them by ceiling.
	refusedBy := func(tries []grantTry) map[string]int {
		t.Helper()
		out := map[string]int{}
		for _, g := range tries {
			if g.code == "execute" {
				continue
			}
			c, ok := strings.CutPrefix(g.code, "403:")
			require.True(t, ok, "unexpected answer %s", g.code)
			require.Contains(t, ceilings(g.counter), c, "racer %d refused by a ceiling it is not charged to", g.counter)
			out[c]++
		}
		return out
	}

	first := burst()
	sums := totals(first)
	requireWithin(sums, "first burst")
	refused := refusedBy(first)
	for _, g := range first {
		if c, ok := strings.CutPrefix(g.code, "403:"); ok {
			require.Greater(t, sums[c]+g.cost, caps[c], "racer %d's %d micros fit %s beside %d", g.counter, g.cost, c, sums[c])
		}
	}
	// The wallet is its racers' only ceiling, so it refuses some of them; a
	// capped key's racers ask for more than the key's cap, so some are
	// refused, by the key's ceiling or, when the type's budget or a vendor's
	// ran out first (the order is the race's), by that one.
	require.Positive(t, refused["run_budget_exceeded"], "the wallet never refused: %v", refused)
	keyRefused := 0
	for _, g := range first {
		if g.counter%4 == 0 && g.code != "execute" {
			keyRefused++
		}
	}
	require.Positive(t, keyRefused, "no racer of the capped key refused: %v", refused)
	require.Positive(t, refused["budget_exceeded"]+refused["dimension_limit_exceeded:acme"]+
		refused["dimension_limit_exceeded:globex"], "%v", refused)
	requireCountersMatchAttempts(t, env1, ws.ID)

	// Half of the grants reported failed, twice at once from both
	// instances, while a second burst races the reports.
	var wg sync.WaitGroup
	kept := make([]grantTry, 0, len(first))
	for n, g := range first {
		if g.code != "execute" {
			continue
		}
		if n%8 < 4 {
			kept = append(kept, g)
			continue
		}
		for _, env := range []*apitest.Env{env1, env2} {
			wg.Go(func() {
				status, out, err := post(env, "/api/v1/effects/"+g.id+"/report", apiKeyOf(g.counter),
					map[string]any{"lease_token": g.tokn, "outcome": "failed"})
				if err != nil || status != http.StatusOK {
					t.Errorf("report: %d %v %v", status, out, err)
				}
			})
		}
	}
	second := burst()
	wg.Wait()
	refusedBy(second)
	held := totals(kept, second)
	requireWithin(held, "once failures gave back")
	requireCountersMatchAttempts(t, env1, ws.ID)
	runSpent := env1.Must(http.StatusOK, "GET", "/api/v1/runs/"+run, ws.Key, nil).JSON()["spentMicros"]
	require.EqualValues(t, held["run_budget_exceeded"], runSpent)
}

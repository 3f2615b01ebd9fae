package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// Hammers of the daily ceilings, run wallets and breakers under concurrency
// and at their boundaries (budgets QA). Each checks its invariants on the
// tables themselves once the hammer is over.

// requireCountersMatchAttempts checks that every ceiling counter of the
// workspace holds exactly what the attempts not known to have failed were
// charged on it, on the day each was charged: a release given twice, or
// not at all, shows here.
func requireCountersMatchAttempts(t *testing.T, env *apitest.Env, workspaceID string) {
	t.Helper()
	require.Empty(t, countersDisagreeing(t, env, workspaceID, "-infinity"),
		"counters that disagree with the attempts' charges")
}

// countersDisagreeing lists the workspace's ceiling counters of days from
// since ('YYYY-MM-DD', or '-infinity') that do not hold exactly what the
// attempts not known to have failed were charged on them, that day.
func countersDisagreeing(t *testing.T, env *apitest.Env, workspaceID, since string) []string {
	t.Helper()
	rows, err := env.App.Pool.Query(context.Background(), `
WITH held AS (
    SELECT a.charged_on AS day, x.scope, sum(x.micros) AS micros, sum(x.count) AS count
    FROM effect_attempts a, jsonb_to_recordset(a.charges) AS x(scope text, micros bigint, count bigint)
    WHERE a.workspace_id = $1 AND a.outcome IS DISTINCT FROM 'failed'
    GROUP BY 1, 2
)
SELECT coalesce(g.scope, h.scope), coalesce(g.day, h.day)::text, coalesce(g.micros, 0), coalesce(h.micros, 0),
    coalesce(g.count, 0), coalesce(h.count, 0)
FROM (SELECT * FROM gate_spend WHERE workspace_id = $1) g
FULL JOIN held h ON h.scope = g.scope AND h.day = g.day
WHERE coalesce(g.day, h.day) >= $2::date
  AND (coalesce(g.micros, 0) <> coalesce(h.micros, 0) OR coalesce(g.count, 0) <> coalesce(h.count, 0))`,
		workspaceID, since)
	require.NoError(t, err)
	var bad []string
	for rows.Next() {
		var (
			scope, day                     string
			micros, held, count, heldCount int64
		)
		require.NoError(t, rows.Scan(&scope, &day, &micros, &held, &count, &heldCount))
		bad = append(bad, fmt.Sprintf("%s %s: counter %d micros / %d, attempts hold %d / %d",
			scope, day, micros, count, held, heldCount))
	}
	require.NoError(t, rows.Err())
	return bad
}

// dayGranted is what the type's attempts granted on the clock's UTC day and
// not known to have failed declared, in all.
func dayGranted(t *testing.T, env *apitest.Env, workspaceID, effectType string, now time.Time) int64 {
	t.Helper()
	day := now.UTC().Truncate(24 * time.Hour)
	var n int64
	require.NoError(t, env.App.Pool.QueryRow(context.Background(), `
SELECT coalesce(sum(e.cost_micros), 0)::bigint FROM effect_attempts a JOIN effects e ON e.id = a.effect_id
WHERE a.workspace_id = $1 AND e.effect_type = $2 AND a.started_at >= $3 AND a.started_at < $4
  AND a.outcome IS DISTINCT FROM 'failed'`, workspaceID, effectType, day, day.Add(24*time.Hour)).Scan(&n))
	return n
}

// A daily budget (or a dimension's limit) set while a runaway's begins are
// in flight bounds the whole day: every grant of the day counts against
// it, those the policy write raced included, so the day's spend never
// passes the budget by more than what was granted before it was set.
func TestABudgetSetDuringABurstCountsEveryGrantOfTheDay(t *testing.T) {
	t.Parallel()
	c := newClock()
	env1 := apitest.Start(t, apitest.WithNow(c.Now))
	env2 := apitest.Start(t, apitest.WithNow(c.Now))
	ws := env1.Signup()
	const budget = 400
	for round := 0; round < 3; round++ {
		typ := fmt.Sprintf("runaway%d.call", round)
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			mu    sync.Mutex
			codes = map[string]int{}
		)
		for i := 0; i < 60; i++ {
			env := []*apitest.Env{env1, env2}[i%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				body := charge(key("burst"), 10)
				body["effect_type"], body["dimensions"] = typ, map[string]any{"vendor": "acme"}
				status, out, err := postBegin(env, ws.Key, body)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					codes[err.Error()]++
				case out["decision"] == "execute":
					codes["execute"]++
				default:
					e, _ := out["error"].(map[string]any)
					codes[fmt.Sprintf("%d:%v", status, e["code"])]++
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ceiling := map[string]any{"daily_budget_micros": budget}
			if round == 1 {
				ceiling = map[string]any{"dimension_limits": map[string]any{"vendor": map[string]any{"daily_micros": budget}}}
			}
			status, _, err := put(env1, "/api/v1/policies/"+typ, ws.Key, ceiling)
			mu.Lock()
			defer mu.Unlock()
			codes[fmt.Sprintf("put %d %v", status, err)]++
		}()
		close(start)
		wg.Wait()
		t.Logf("round %d: %v", round, codes)
		for code := range codes {
			require.Contains(t, []string{"execute", "403:budget_exceeded", "403:dimension_limit_exceeded", "put 200 <nil>"}, code)
		}
		requireCountersMatchAttempts(t, env1, ws.ID)
		var micros int64
		require.NoError(t, env1.App.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(micros), 0)::bigint
			FROM gate_spend WHERE workspace_id = $1 AND (scope = $2 OR scope LIKE $3)`, ws.ID, "type:"+typ,
			"dim:"+typ+":%").Scan(&micros))
		require.Equal(t, dayGranted(t, env1, ws.ID, typ, c.Now()), micros,
			"the ceiling's counter holds every grant of the day")
	}
}

// A failed report at its lease's last microsecond, on an instance whose
// clock says so, races what another instance (a microsecond later, when the
// lease has lapsed) does with the same attempt: the sweeper's lapse, an
// operator's resolve, a reconciliation and a retry. Whichever wins, every
// ceiling gives the attempt's charge back at most once, and only when it is
// known to have failed.
func TestAFailedReportRacingLapseResolveReconcileAndRetryReleasesOnce(t *testing.T) {
	// Not parallel: the sweeper's lapse acts on every workspace.
	c := newClock()
	before, after := apitest.NewClock(c.Now()), apitest.NewClock(c.Now())
	envA := apitest.Start(t, apitest.WithNow(before.Now))
	envB := apitest.Start(t, apitest.WithNow(after.Now))
	ws := envA.Signup()
	envA.Must(http.StatusOK, "PUT", "/api/v1/policies/api.call", ws.Key, map[string]any{
		"daily_budget_micros": 1_000_000, "lease_seconds": 10, "on_indeterminate": "retry", "max_attempts": 50,
		"dimension_limits": map[string]any{"vendor": map[string]any{"daily_micros": 1_000_000, "daily_count": 1000}}})
	agent := envA.Key(ws, map[string]any{"name": "capped", "preset": "AGENT", "daily_spend_ceiling_micros": 1_000_000})
	const n = 24
	type grant struct{ id, token, key string }
	var grants []grant
	start := before.Now()
	for i := 0; i < n; i++ {
		body := charge(key("skew"), 10)
		body["dimensions"] = map[string]any{"vendor": "acme"}
		status, out, err := post(envA, "/api/v1/effects/begin", agent, body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, "%v", out)
		require.Equal(t, "execute", out["decision"])
		grants = append(grants, grant{str(out["effect_id"]), str(out["lease_token"]), str(body["idempotency_key"])})
	}
	expiry := start.Add(10 * time.Second)
	before.Set(expiry.Add(-time.Microsecond))
	after.Set(expiry)

	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		codes = map[string]int{}
		go_   = make(chan struct{})
	)
	note := func(what string, status int, out map[string]any, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			codes[what+" "+err.Error()]++
			return
		}
		code := ""
		if e, ok := out["error"].(map[string]any); ok {
			code = str(e["code"])
		} else if d, ok := out["decision"]; ok {
			code = str(d)
		}
		codes[fmt.Sprintf("%s %d %s", what, status, code)]++
	}
	records := []map[string]any{}
	for _, g := range grants {
		records = append(records, map[string]any{"idempotency_key": g.key, "status": "failed", "amount_micros": 10})
	}
	for i, g := range grants {
		wg.Add(4)
		go func() {
			defer wg.Done()
			<-go_
			status, out, err := post(envA, "/api/v1/effects/"+g.id+"/report", agent,
				map[string]any{"lease_token": g.token, "outcome": "failed"})
			note("report", status, out, err)
		}()
		go func() {
			defer wg.Done()
			<-go_
			status, out, err := post(envB, "/api/v1/effects/"+g.id+"/resolve", ws.Key, map[string]any{"outcome": "failed"})
			note("resolve", status, out, err)
		}()
		go func() {
			defer wg.Done()
			<-go_
			body := charge(g.key, 10)
			body["dimensions"] = map[string]any{"vendor": "acme"}
			status, out, err := postBegin(envB, agent, body)
			note("retry", status, out, err)
			if err == nil && out["decision"] == "execute" && i%2 == 0 {
				status, out, err = post(envB, "/api/v1/effects/"+g.id+"/report", agent,
					map[string]any{"lease_token": out["lease_token"], "outcome": "failed"})
				note("retry-report", status, out, err)
			}
		}()
		go func() {
			defer wg.Done()
			<-go_
			if i%6 == 0 {
				status, out, err := post(envB, "/api/v1/reconcile", ws.Key, map[string]any{"effect_type": "api.call",
					"from": start.Add(-time.Hour).Format(time.RFC3339Nano), "to": expiry.Add(time.Hour).Format(time.RFC3339Nano),
					"records": records})
				note("reconcile", status, out, err)
				return
			}
			_, err := envB.App.Server.Gate.SweepLapsed(context.Background(), after.Now(), 100)
			note("sweep", 200, nil, err)
		}()
	}
	close(go_)
	wg.Wait()
	t.Logf("%v", codes)
	for code := range codes {
		require.Contains(t, []string{"report 200 ", "report 409 lease_expired", "report 409 lease_lost",
			"resolve 200 ", "resolve 409 invalid_state", "retry 200 execute", "retry 200 in_flight",
			"retry-report 200 ", "reconcile 200 ", "sweep 200 "}, code)
	}
	requireCountersMatchAttempts(t, envA, ws.ID)
	// Each effect's attempts: none reported twice, the failed ones failed once.
	var doubly int
	require.NoError(t, envA.App.Pool.QueryRow(context.Background(), `SELECT count(*) FROM effect_attempts
		WHERE workspace_id = $1 AND reported_at IS NOT NULL AND resolved_at IS NOT NULL AND resolve_note IS DISTINCT FROM 'probe'`,
		ws.ID).Scan(&doubly))
	require.Zero(t, doubly, "an attempt both reported and resolved")
}

// A surge breaker opened by a burst trips once, announces it once, and its
// cooldown's end, met by a second burst on both instances at the moment the
// sweeper closes it, closes it once and grants exactly a fresh allowance
// before it trips again, once: new keys and the first burst's refused keys,
// begun again, alike.
func TestASurgeBurstTripsOnceAndItsCooldownGrantsOneAllowance(t *testing.T) {
	// Not parallel: SweepCircuits closes every workspace's lapsed breakers.
	b := setup(t)
	env2 := apitest.Start(t, apitest.WithNow(b.clock.Now))
	b.putPolicy("sms.send", map[string]any{"surge_per_hour": 5, "surge_action": "deny", "surge_cooldown_seconds": 60})
	var refused []string
	counts, _ := raceBodies(t, 30, b.ws.Key, func(int) map[string]any { return sms(key("first")) }, b.env, env2)
	require.Equal(t, map[string]int{"execute": 5, "403:circuit_open": 25}, counts)
	require.Equal(t, 1, b.events("circuit.tripped"))
	rows, err := b.env.App.Pool.Query(context.Background(), `SELECT idempotency_key FROM effects
		WHERE workspace_id = $1 AND state = 'denied' LIMIT 10`, b.ws.ID)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		refused = append(refused, k)
	}
	require.NoError(t, rows.Err())
	require.Len(t, refused, 10)

	// The trip is stamped at the clock plus the real time its begin waited
	// for the surge turn (0028): on a loaded machine over a second, so that
	// 61 s after the burst's clock was before the cooldown's end (the
	// sweeper closed nothing, and the begins met the breaker open until
	// their own waits carried them past it).
	var closesAt time.Time
	require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), `SELECT closes_at FROM gate_circuits
		WHERE workspace_id = $1 AND effect_type = 'sms.send'`, b.ws.ID).Scan(&closesAt))
	b.clock.Set(closesAt.Add(time.Second))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := b.env.App.Server.Gate.SweepCircuits(context.Background(), b.clock.Now(), 500)
		assert.NoError(t, err)
	}()
	counts, _ = raceBodies(t, 40, b.ws.Key, func(i int) map[string]any {
		if i < len(refused) {
			return sms(refused[i])
		}
		return sms(key("second"))
	}, b.env, env2)
	wg.Wait()
	require.Equal(t, map[string]int{"execute": 5, "403:circuit_open": 35}, counts)
	require.Equal(t, 1, b.events("circuit.closed"))
	require.Equal(t, 2, b.events("circuit.tripped"))
	require.Equal(t, "open", b.circuit("sms.send")["state"])
}

// The emergency stop put on and lifted again and again while begins race it
// answers each begin execute or circuit_open (never an error), announces
// each opening and each lifting once, and leaves nothing held once lifted.
func TestTheEmergencyStopTogglingUnderBegins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env2 := apitest.Start(t, apitest.WithNow(b.clock.Now))
	const toggles = 8
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < toggles; i++ {
			b.clock.Add(time.Second)
			status, out, err := post(b.env, "/api/v1/circuits/stop", b.ws.Key, map[string]any{"action": "deny", "reason": "drill"})
			if err != nil || status != http.StatusOK {
				t.Errorf("stop: %d %v %v", status, out, err)
			}
			b.clock.Add(time.Second)
			status, out, err = post(env2, "/api/v1/circuits/release", b.ws.Key, map[string]any{})
			if err != nil || status != http.StatusOK {
				t.Errorf("release: %d %v %v", status, out, err)
			}
		}
	}()
	counts, _ := raceBodies(t, 160, b.ws.Key, func(i int) map[string]any {
		if i%2 == 0 {
			return sms(key("stop"))
		}
		return email(key("stop"))
	}, b.env, env2)
	wg.Wait()
	t.Logf("%v", counts)
	for d := range counts {
		require.Contains(t, []string{"execute", "403:circuit_open"}, d)
	}
	var tripped, closed, open int
	require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), `SELECT
		count(*) FILTER (WHERE type = 'circuit.tripped'), count(*) FILTER (WHERE type = 'circuit.closed'),
		(SELECT count(*) FROM gate_circuits WHERE workspace_id = $1 AND state = 'open')
		FROM events WHERE workspace_id = $1 AND subject_id = '*'`, b.ws.ID).Scan(&tripped, &closed, &open))
	require.Equal(t, []int{toggles, toggles, 0}, []int{tripped, closed, open})
	b.mustBegin("execute", sms(key("after")))
	b.mustBegin("execute", email(key("after")))
}

// Zero and the largest amounts at every ceiling: a zero ceiling admits
// only what declares nothing or zero (a dimension's count still counts),
// and at 10^18 a second grant of 10^18 is refused by the documented code,
// never answered with an error, in a run's wallet too.
func TestCeilingsAtZeroAndAtTheLargestAmount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"daily_budget_micros": 0})
	b.mustBegin("execute", charge(key("zero"), 0))
	b.mustBegin("execute", charge(key("none"), nil))
	b.denialOf("budget_exceeded", charge(key("one"), 1))
	zeroKey := b.env.Key(b.ws, map[string]any{"name": "zero", "preset": "AGENT", "daily_spend_ceiling_micros": 0})
	body := charge(key("k0"), 0)
	body["effect_type"] = "free.call"
	r := b.env.Do("POST", "/api/v1/effects/begin", zeroKey, body)
	require.Equal(t, "execute", r.JSON()["decision"], "%s", r.Body)
	body = charge(key("k1"), 1)
	body["effect_type"] = "free.call"
	errCode(t, b.env.Do("POST", "/api/v1/effects/begin", zeroKey, body), http.StatusForbidden, "key_budget_exceeded")

	const max = 1_000_000_000_000_000_000
	run := b.runWith(max)
	big := func(k string) map[string]any {
		body := inRun(run, charge(k, max))
		body["effect_type"] = "big.call"
		return body
	}
	first := b.mustBegin("execute", big(key("big")))
	e := b.denialOf("run_budget_exceeded", big(key("bigger")))
	require.EqualValues(t, max, e["detail"].(map[string]any)["spent_micros"])
	// Given back, it fits again; zero always fits a full wallet.
	require.Equal(t, http.StatusOK, b.report(str(first["effect_id"]), str(first["lease_token"]), "failed", nil).Status)
	b.mustBegin("execute", big(key("again")))
	zero := inRun(run, charge(key("zero"), 0))
	zero["effect_type"] = "big.call"
	b.mustBegin("execute", zero)
	require.Equal(t, max, b.spent(run))
	requireCountersMatchAttempts(t, b.env, b.ws.ID)
}

// A run's wallet under begins of distinct keys from two instances, half of
// whose grants are reported failed and begun again at once: what the
// wallet counts is exactly what its attempts not known to have failed
// declared, and never more than its budget.
func TestRunWalletUnderFailuresAndRetries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env2 := apitest.Start(t, apitest.WithNow(b.clock.Now))
	run := b.runWith(500)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		codes = map[string]int{}
		start = make(chan struct{})
	)
	for i := 0; i < 80; i++ {
		env := []*apitest.Env{b.env, env2}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			body := inRun(run, charge(key("wallet"), 10))
			for try := 0; try < 3; try++ {
				status, out, err := postBegin(env, b.ws.Key, body)
				mu.Lock()
				if err != nil {
					codes[err.Error()]++
				} else if out["decision"] != "execute" {
					e, _ := out["error"].(map[string]any)
					codes[fmt.Sprintf("%d:%v", status, e["code"])]++
				} else {
					codes["execute"]++
				}
				mu.Unlock()
				if err != nil || out["decision"] != "execute" || i%2 == 1 {
					return
				}
				// A 503 is an instance shedding load (its request's time ran
				// out waiting on a machine running other suites): the client
				// sends the report again under its lease token, which answers
				// what the first did, as the SDKs do.
				report := map[string]any{"lease_token": out["lease_token"], "outcome": "failed"}
				for again := 0; again < 5; again++ {
					status, _, err = post(env, "/api/v1/effects/"+str(out["effect_id"])+"/report", b.ws.Key, report)
					if err != nil || status != http.StatusServiceUnavailable {
						break
					}
				}
				if err != nil || status != http.StatusOK {
					mu.Lock()
					codes[fmt.Sprintf("report %d %v", status, err)]++
					mu.Unlock()
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	t.Logf("%v", codes)
	for code := range codes {
		require.Contains(t, []string{"execute", "403:run_budget_exceeded"}, code)
	}
	var held int64
	require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(e.cost_micros), 0)::bigint
		FROM effect_attempts a JOIN effects e ON e.id = a.effect_id
		WHERE e.run_id = $1 AND a.outcome IS DISTINCT FROM 'failed'`, run).Scan(&held))
	require.LessOrEqual(t, held, int64(500))
	require.EqualValues(t, held, b.spent(run))
}

// Across UTC midnight, with one instance's clock a microsecond before it
// and another's at it: each day admits exactly its budget, and the
// failures of the old day's grants, reported after midnight while the new
// day's begins race, give back to the old day, never to the new.
func TestInFlightGrantsAcrossMidnightReleaseToTheirOwnDay(t *testing.T) {
	t.Parallel()
	c := newClock()
	y, m, d := c.Now().Date()
	midnight := time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
	late, early := apitest.NewClock(midnight.Add(-time.Microsecond)), apitest.NewClock(midnight)
	envOld := apitest.Start(t, apitest.WithNow(late.Now))
	envNew := apitest.Start(t, apitest.WithNow(early.Now))
	ws := envOld.Signup()
	envOld.Must(http.StatusOK, "PUT", "/api/v1/policies/api.call", ws.Key, map[string]any{"daily_budget_micros": 100})
	counts, old := raceBodies(t, 20, ws.Key, func(int) map[string]any { return charge(key("old"), 10) }, envOld)
	require.Equal(t, map[string]int{"execute": 10, "403:budget_exceeded": 10}, counts)

	var wg sync.WaitGroup
	for _, g := range old {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, _, err := post(envNew, "/api/v1/effects/"+str(g["effect_id"])+"/report", ws.Key,
				map[string]any{"lease_token": g["lease_token"], "outcome": "failed"})
			assert.NoError(t, err)
			assert.Equal(t, http.StatusOK, status)
		}()
	}
	counts, _ = raceBodies(t, 20, ws.Key, func(int) map[string]any { return charge(key("new"), 10) }, envNew)
	wg.Wait()
	require.Equal(t, map[string]int{"execute": 10, "403:budget_exceeded": 10}, counts)
	requireCountersMatchAttempts(t, envOld, ws.ID)
	var oldDay, newDay int64
	require.NoError(t, envOld.App.Pool.QueryRow(context.Background(), `SELECT
		coalesce(sum(micros) FILTER (WHERE day < $2::date), 0)::bigint, coalesce(sum(micros) FILTER (WHERE day = $2::date), 0)::bigint
		FROM gate_spend WHERE workspace_id = $1`, ws.ID, midnight.Format("2006-01-02")).Scan(&oldDay, &newDay))
	require.Equal(t, []int64{0, 100}, []int64{oldDay, newDay})
	// The old day, given everything back, admits its budget again.
	counts, _ = raceBodies(t, 12, ws.Key, func(int) map[string]any { return charge(key("old-again"), 10) }, envOld)
	require.Equal(t, map[string]int{"execute": 10, "403:budget_exceeded": 2}, counts)
}

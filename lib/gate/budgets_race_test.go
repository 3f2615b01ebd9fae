package gate_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

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
WHERE coalesce(g.micros, 0) <> coalesce(h.micros, 0) OR coalesce(g.count, 0) <> coalesce(h.count, 0)`, workspaceID)
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
	require.Empty(t, bad, "counters that disagree with the attempts' charges")
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

// A daily budget set while a runaway's begins are in flight bounds the
// whole day: every grant of the day counts against it, those the policy
// write raced included, so the day's spend never passes the budget by more
// than what was granted before it was set.
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
				body["effect_type"] = typ
				status, out, err := post(env, "/api/v1/effects/begin", ws.Key, body)
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
			status, _, err := put(env1, "/api/v1/policies/"+typ, ws.Key, map[string]any{"daily_budget_micros": budget})
			mu.Lock()
			defer mu.Unlock()
			codes[fmt.Sprintf("put %d %v", status, err)]++
		}()
		close(start)
		wg.Wait()
		t.Logf("round %d: %v", round, codes)
		for code := range codes {
			require.Contains(t, []string{"execute", "403:budget_exceeded", "put 200 <nil>"}, code)
		}
		requireCountersMatchAttempts(t, env1, ws.ID)
		var micros int64
		require.NoError(t, env1.App.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(micros), 0)::bigint
			FROM gate_spend WHERE workspace_id = $1 AND scope = $2`, ws.ID, "type:"+typ).Scan(&micros))
		require.Equal(t, dayGranted(t, env1, ws.ID, typ, c.Now()), micros,
			"the budget's counter holds every grant of the day")
	}
}

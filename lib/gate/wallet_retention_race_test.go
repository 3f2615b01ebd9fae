package gate_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
)

// A hammer: begins charging runs' wallets (new keys, two instances) race
// the retention passes of both instances that delete the runs' ended
// effects (effects.retention, a type's retention_days of 1; small batches)
// and the finished runs themselves (jobs.retention, 90 days). Each begin
// answers, as README says, execute (charged to the wallet), 403
// run_budget_exceeded (the wallet is spent), or 404 (its run is gone);
// never a 500 (409 retry_request is sent again at once, as API.md says).
// No wallet grants more than its budget, the spend of the effects
// retention deleted included (migration 0030); a 404 is answered only for
// a run that is gone; each granted begin left one attempt and each other
// none (no charge without a grant); and a run still there reads the spend
// of what it granted. Not parallel, in its own era (1927).
func TestWalletBeginsRaceEffectAndRunRetention(t *testing.T) {
	b := raceEra(t, 1927)
	other := apitest.Start(t, apitest.WithNow(b.clock.Now))
	ctx := context.Background()
	pool := b.env.App.Pool
	b.putPolicy("api.call", map[string]any{"retention_days": 1})
	const (
		runs      = 6
		budget    = 1000
		oldSpend  = 300 // an old effect's, succeeded: retention moves it to run_retired_spend
		cost      = 200
		fits      = (budget - oldSpend) / cost
		perRun    = 6
		retention = 90 * 24 * time.Hour // JOB_RETENTION_DAYS, apitest's default config
	)
	var ids []string
	for range runs {
		run := b.runWith(budget)
		b.executedAs("succeeded", inRun(run, charge(key("old"), oldSpend)))
		b.executedAs("failed", inRun(run, charge(key("failed"), 500))) // gives its cost back
		b.env.Must(http.StatusOK, "POST", "/api/v1/runs/"+run+"/finish", b.ws.Key, nil)
		require.Equal(t, oldSpend, b.spent(run))
		ids = append(ids, run)
	}
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DELETE FROM job_runs WHERE workspace_id = $1`, b.ws.ID)
		require.NoError(t, err)
	})
	b.clock.Add(retention + 24*time.Hour)

	var (
		mu       sync.Mutex
		fail     []string
		granted  = map[string]int{}
		refused  = map[string]int{}
		notFound = map[string]int{}
		keys     = map[string][]string{} // per run: the keys answered other than execute
	)
	failf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fail = append(fail, fmt.Sprintf(format, args...))
	}
	envs := []*apitest.Env{b.env, other}
	stop := make(chan struct{})
	var passes []func() error
	for _, env := range envs {
		passes = append(passes,
			func() error { _, err := env.App.Server.Gate.SweepRetention(ctx, b.clock.Now(), 1); return err },
			func() error {
				_, err := env.App.Server.Jobs.PurgeRetired(ctx, b.clock.Now().Add(-retention), 1)
				return err
			})
	}
	passesDone := passing(stop, failf, passes...)
	var begins sync.WaitGroup
	for _, run := range ids {
		for i := range perRun {
			env := envs[i%2]
			begins.Add(1)
			go func() {
				defer begins.Done()
				k := key("new")
				for {
					r := env.Do("POST", "/api/v1/effects/begin", b.ws.Key, inRun(run, charge(k, cost)))
					switch {
					case r.Status == http.StatusConflict && r.ErrorCode() == "retry_request":
						continue
					case r.Status == http.StatusOK && r.JSON()["decision"] == "execute":
						d := r.JSON()
						mu.Lock()
						granted[run]++
						mu.Unlock()
						rep := env.Do("POST", "/api/v1/effects/"+str(d["effect_id"])+"/report", b.ws.Key,
							map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded"})
						if rep.Status != http.StatusOK {
							failf("report: %d %s", rep.Status, rep.Body)
						}
					case r.Status == http.StatusForbidden:
						d := r.JSON()
						e, _ := d["error"].(map[string]any)
						if d["decision"] != "denied" || e["code"] != "run_budget_exceeded" {
							failf("403: %s", r.Body)
						}
						mu.Lock()
						refused[run]++
						keys[run] = append(keys[run], k)
						mu.Unlock()
					case r.Status == http.StatusNotFound && r.ErrorCode() == "not_found":
						mu.Lock()
						notFound[run]++
						keys[run] = append(keys[run], k)
						mu.Unlock()
					default:
						failf("begin: %d %s", r.Status, r.Body)
					}
					return
				}
			}()
		}
	}
	begins.Wait()
	close(stop)
	passesDone()
	require.Empty(t, fail)

	for _, run := range ids {
		require.LessOrEqual(t, granted[run], fits, "run %s: the wallet granted more than its budget", run)
		require.Equal(t, perRun, granted[run]+refused[run]+notFound[run])
		var gone bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM job_runs WHERE id = $1)`, run).Scan(&gone))
		if notFound[run] > 0 {
			require.True(t, gone, "run %s: a begin was told 404 while the run is kept", run)
		}
		// No charge without a grant: the new keys' attempts are the
		// executes', and a begin refused for a gone run kept no effect.
		var attempts, spending, orphans int
		require.NoError(t, pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM effects e JOIN effect_attempts a ON a.effect_id = e.id
			  WHERE e.workspace_id = $1 AND e.run_id = $2 AND e.idempotency_key LIKE 'new:%'),
			(SELECT count(*) FROM effects e JOIN effect_attempts a ON a.effect_id = e.id
			  WHERE e.workspace_id = $1 AND e.run_id = $2 AND e.idempotency_key = ANY($3) AND a.outcome IS DISTINCT FROM 'failed'),
			(SELECT count(*) FROM run_retired_spend s WHERE s.run_id = $2 AND NOT EXISTS (SELECT 1 FROM job_runs r WHERE r.id = s.run_id))`,
			b.ws.ID, run, keys[run]).Scan(&attempts, &spending, &orphans))
		require.Equal(t, granted[run], attempts, "run %s: one attempt per grant", run)
		require.Zero(t, spending, "run %s: a refused begin charged the wallet", run)
		require.Zero(t, orphans)
		var keptRefused int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE workspace_id = $1 AND idempotency_key = ANY($2)
			AND run_id = $3 AND state <> 'denied'`, b.ws.ID, keys[run], run).Scan(&keptRefused))
		require.Zero(t, keptRefused, "run %s: a refused begin left an effect other than its denial", run)
		if !gone {
			require.Equal(t, oldSpend+cost*granted[run], b.spent(run), "run %s: the wallet's spend", run)
		}
		t.Logf("run %s: %d granted, %d refused, %d not found, gone %v", run, granted[run], refused[run], notFound[run], gone)
	}
}

// A begin charging a run's wallet that passed its read of the run, then
// waited for the wallet's lock (held here by the test, as a begin of the
// run ahead of it holds it) while run retention deleted the run, and with
// it what effect retention had kept of its spend (run_retired_spend,
// migration 0030): it is not granted what the wallet, still there when it
// read the run, had no room for. It answers 404, as a begin naming a run
// that is gone; a begin of a key begun under the run (a retry after a
// failure), waiting the same way, is charged to no wallet, as one sent
// after the delete, and executes (the wallet had no room for it either).
// Before, it read the wallet's spend without the kept part
// and was granted beyond the budget (the hammer above). Not parallel, in
// its own era (1928).
func TestAWalletBeginWaitingWhileItsRunIsDeletedGrantsNothing(t *testing.T) {
	b := raceEra(t, 1928)
	ctx := context.Background()
	pool := b.env.App.Pool
	b.putPolicy("api.call", map[string]any{"retention_days": 1})
	run := b.runWith(1000)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DELETE FROM job_runs WHERE workspace_id = $1`, b.ws.ID)
		require.NoError(t, err)
	})
	b.executedAs("succeeded", inRun(run, charge(key("old"), 300)))
	b.clock.Add(48 * time.Hour)
	n, err := b.env.App.Server.Gate.SweepRetention(ctx, b.clock.Now(), 1000)
	require.NoError(t, err)
	require.Positive(t, n)
	require.Equal(t, 300, b.spent(run), "the deleted effect's spend is kept on the run")
	retried := inRun(run, charge(key("retried"), 200))
	b.executedAs("failed", retried) // gives its cost back
	for range 3 {
		b.executedAs("succeeded", inRun(run, charge(key("new"), 200)))
	}
	require.Equal(t, 900, b.spent(run))
	b.env.Must(http.StatusOK, "POST", "/api/v1/runs/"+run+"/finish", b.ws.Key, nil)
	b.clock.Add(91 * 24 * time.Hour)

	tx, pid := b.holdWallet(run)
	answers := map[string]*apitest.Response{}
	var dones []chan struct{}
	waits := apitest.NewLockWaits(t, pool, pid)
	for what, body := range map[string]map[string]any{"late": inRun(run, charge(key("late"), 200)), "retried": retried} {
		done := make(chan struct{})
		dones = append(dones, done)
		r := new(apitest.Response)
		answers[what] = r
		go func() { defer close(done); *r = *b.begin(body) }()
		waits.Waiting(done, what+" waits for the wallet")
	}
	b.purgeRun(run)
	require.NoError(t, tx.Commit(ctx))
	for _, done := range dones {
		<-done
	}

	r := answers["late"]
	require.NotEqual(t, "execute", r.JSON()["decision"], "granted 200 with 900 of 1000 spent: %s", r.Body)
	errCode(t, r, http.StatusNotFound, "not_found")
	r = answers["retried"]
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, "execute", r.JSON()["decision"], "%s", r.Body)
}

// A grouped begin naming no run finds its key's run's wallet only once it
// holds its group, and is begun again with that wallet locked first
// (chargeEffectWallet); when run retention deletes the run while that
// second begin waits for the wallet (its lock held here by the test), it
// is begun once more, as one sent after the delete: charged to no wallet,
// it executes. Before, that third begin was never made and the begin
// answered 500. Not parallel, in its own era (1929).
func TestAGroupedBeginWhoseWalletsRunIsDeletedWhileItWaitsExecutes(t *testing.T) {
	b := raceEra(t, 1929)
	r, _ := b.groupedBeginWhileItsRunIsDeleted()
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	require.Equal(t, "execute", r.JSON()["decision"], "%s", r.Body)
	require.EqualValues(t, 2, r.JSON()["attempt"], "%s", r.Body)
}

// A Begin makes at most maxWalletMoves begins when its wallet moves; past
// the bound it answers 409 retry_request, having granted and charged
// nothing. With the bound made 2, the grouped begin above moves twice (its
// key's run's wallet found late, then that run deleted while it waited for
// the wallet), so the third begin that would execute it is not made: the
// key keeps its one failed attempt, takes no lease and charges no wallet,
// and the same begin sent again executes it. Without the bound the third
// begin is made and the begin answers 200. Not parallel, in its own era
// (1930).
func TestAGroupedBeginWhoseWalletMovesPastTheBoundIsAskedAgain(t *testing.T) {
	b := raceEra(t, 1930)
	gate.SetMaxWalletMoves(b.env.App.Server.Gate, 2)
	r, step := b.groupedBeginWhileItsRunIsDeleted()
	errCode(t, r, http.StatusConflict, "retry_request")
	var attempts int
	var state string
	require.NoError(t, b.env.App.Pool.QueryRow(context.Background(), `SELECT e.state,
		(SELECT count(*) FROM effect_attempts a WHERE a.effect_id = e.id) FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $2`,
		b.ws.ID, step["idempotency_key"]).Scan(&state, &attempts))
	require.Equal(t, 1, attempts, "the refused begin took an attempt")
	require.Equal(t, "failed", state, "the refused begin moved the key")

	d := b.mustBegin("execute", step)
	require.EqualValues(t, 2, d["attempt"], "%v", d)
}

// groupedBeginWhileItsRunIsDeleted begins, in a group and naming no run, a
// key whose one attempt, charged to a run's wallet, failed, while run
// retention deletes that run (finished, past its days): the begin, which
// finds the key's wallet only once it holds its group, is begun again with
// that wallet locked first, and waits for its lock (held by the test)
// until the run is gone. It answers the begin's answer and body.
func (b *bundle) groupedBeginWhileItsRunIsDeleted() (*apitest.Response, map[string]any) {
	b.t.Helper()
	t := b.t
	ctx := context.Background()
	pool := b.env.App.Pool
	run := b.runWith(1000)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DELETE FROM job_runs WHERE workspace_id = $1`, b.ws.ID)
		require.NoError(t, err)
	})
	step := inRun(run, charge(key("step"), 700))
	step["group_id"] = b.newGroup("g", "")
	b.executedAs("failed", step) // gives its cost back
	delete(step, "run_id")
	b.env.Must(http.StatusOK, "POST", "/api/v1/runs/"+run+"/finish", b.ws.Key, nil)
	b.clock.Add(91 * 24 * time.Hour)

	tx, pid := b.holdWallet(run)
	done := make(chan struct{})
	var r apitest.Response
	go func() { defer close(done); r = *b.begin(step) }()
	apitest.WaitDoneOrBlockedBy(t, pool, pid, done,
		"the grouped begin neither answered nor waited for its key's run's wallet")
	b.purgeRun(run)
	require.NoError(t, tx.Commit(ctx))
	<-done
	return &r, step
}

// holdWallet holds run's wallet lock in a transaction of the test's, as a
// begin of the run ahead holds it, until the test commits it; it answers
// that transaction and its backend's pid, which the begins sent meanwhile
// wait for.
func (b *bundle) holdWallet(run string) (pgx.Tx, int) {
	b.t.Helper()
	tx, err := b.env.App.Pool.Begin(context.Background())
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(context.Background(), `SELECT pg_advisory_xact_lock(hashtextextended('wallet:' || $1::text, 0))`, run)
	require.NoError(b.t, err)
	return tx, apitest.BackendPID(b.t, tx)
}

// purgeRun deletes run, finished and past JOB_RETENTION_DAYS (apitest's 90)
// on the test's clock, with run retention's own pass.
func (b *bundle) purgeRun(run string) {
	b.t.Helper()
	ctx := context.Background()
	purged, err := b.env.App.Server.Jobs.PurgeRetired(ctx, b.clock.Now().AddDate(0, 0, -90), 1000)
	require.NoError(b.t, err)
	require.Positive(b.t, purged)
	var gone bool
	require.NoError(b.t, b.env.App.Pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM job_runs WHERE id = $1)`, run).Scan(&gone))
	require.True(b.t, gone, "run retention deleted the run")
}

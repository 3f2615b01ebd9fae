package gate_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// A run's own wallet (budgetMicros, migration 0024): every begin naming the
// run is charged to it; a new run gets a new wallet.

func (b *bundle) runWith(budget any) string {
	b.t.Helper()
	body := map[string]any{"name": "agent loop"}
	if budget != nil {
		body["budgetMicros"] = budget
	}
	r := b.env.Must(http.StatusCreated, "POST", "/api/v1/runs", b.ws.Key, body).JSON()
	require.Equal(b.t, budget, jsonNumberOrNil(r["budgetMicros"]))
	return str(r["id"])
}

func jsonNumberOrNil(v any) any {
	if f, ok := v.(float64); ok {
		return int(f)
	}
	return v
}

func inRun(run string, body map[string]any) map[string]any {
	body["run_id"] = run
	return body
}

func (b *bundle) spent(run string) any {
	b.t.Helper()
	r := b.env.Must(http.StatusOK, "GET", "/api/v1/runs/"+run, b.ws.Key, nil).JSON()
	return jsonNumberOrNil(r["spentMicros"])
}

func TestRunWalletChargesGrantsAndGivesBackFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.runWith(1000)
	require.Equal(t, 0, b.spent(run))

	a := b.mustBegin("execute", inRun(run, charge(key("a"), 600)))
	over := inRun(run, charge(key("over"), 500))
	e := b.denialOf("run_budget_exceeded", over)
	require.Equal(t, "This cost does not fit in what is left of the run's own wallet; a new run gets a new wallet.", e["message"])
	d := e["detail"].(map[string]any)
	require.Equal(t, run, d["run_id"])
	require.EqualValues(t, 1000, d["budget_micros"])
	require.EqualValues(t, 600, d["spent_micros"])
	require.Equal(t, "run_budget_exceeded", b.get(str(b.mustBegin("denied", over)["effect_id"]))["denial_code"])
	require.Equal(t, 600, b.spent(run))

	// What fits still fits (600 + 400), and an undeclared cost is 0.
	cKey := key("c")
	c := b.mustBegin("execute", inRun(run, charge(cKey, 400)))
	b.mustBegin("execute", inRun(run, charge(key("free"), nil)))
	b.denialOf("run_budget_exceeded", inRun(run, charge(key("one"), 1)))

	// The same key is answered as before: a wait, not a refusal.
	require.Equal(t, "in_flight", b.mustBegin("in_flight", inRun(run, charge(cKey, 400)))["decision"])

	// A failed attempt gives its cost back; the refused key is decided afresh.
	require.Equal(t, http.StatusOK, b.report(str(a["effect_id"]), str(a["lease_token"]), "failed", nil).Status)
	require.Equal(t, 400, b.spent(run))
	o := b.mustBegin("execute", over)
	require.Equal(t, 900, b.spent(run))

	// Succeeded and indeterminate effects keep counting.
	require.Equal(t, http.StatusOK, b.report(str(c["effect_id"]), str(c["lease_token"]), "succeeded", nil).Status)
	b.clock.Add(2 * time.Minute) // over's lease lapses; its late report records it indeterminate
	errCode(t, b.report(str(o["effect_id"]), str(o["lease_token"]), "succeeded", nil), http.StatusConflict, "lease_expired")
	var state string
	require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), `SELECT state FROM effects WHERE id = $1`,
		o["effect_id"]).Scan(&state))
	require.Equal(t, "indeterminate", state)
	b.denialOf("run_budget_exceeded", inRun(run, charge(key("two"), 101)))
	b.mustBegin("execute", inRun(run, charge(key("three"), 100)))

	// A new run gets a new wallet; a run without one, and a begin without a
	// run, are not charged to any.
	b.mustBegin("execute", inRun(b.runWith(1000), charge(key("next"), 1000)))
	b.mustBegin("execute", inRun(b.runWith(nil), charge(key("free-run"), 5000)))
	b.mustBegin("execute", charge(key("no-run"), 5000))
}

// A retry of a failed effect is charged afresh, against what the rest of
// the run spent.
func TestRunWalletRetryIsChargedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.runWith(1000)
	body := inRun(run, charge(key("retry"), 700))
	a := b.mustBegin("execute", body)
	require.Equal(t, http.StatusOK, b.report(str(a["effect_id"]), str(a["lease_token"]), "failed", nil).Status)
	b.mustBegin("execute", inRun(run, charge(key("other"), 300)))
	again := b.mustBegin("execute", body)
	require.EqualValues(t, 2, again["attempt"])
	require.Equal(t, 1000, b.spent(run))
	require.Equal(t, http.StatusOK, b.report(str(again["effect_id"]), str(again["lease_token"]), "failed", nil).Status)
	b.mustBegin("execute", inRun(run, charge(key("x"), 700)))
	b.denialOf("run_budget_exceeded", body)
}

// An attempt whose outcome is unknown keeps counting when its effect is
// tried again (on_indeterminate: retry), as on the daily ceilings: each may
// have spent the money (QA: the wallet counted the effect once, so a run
// could spend max_attempts times its budget). Settled, it counts by its
// outcome.
func TestRunWalletCountsEveryUnknownAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry", "max_attempts": 3})
	run := b.runWith(1000)
	k := inRun(run, charge(key("retry"), 700))
	d := b.mustBegin("execute", k)
	b.clock.Add(2 * time.Minute) // the lease lapses: the outcome is unknown
	e := b.refusal("run_budget_exceeded", "indeterminate", k)
	require.EqualValues(t, 700, e["detail"].(map[string]any)["spent_micros"])
	require.Equal(t, 700, b.spent(run))

	roomy := b.runWith(1400)
	k2 := inRun(roomy, charge(key("retry"), 700))
	b.mustBegin("execute", k2)
	b.clock.Add(2 * time.Minute)
	again := b.mustBegin("execute", k2)
	require.EqualValues(t, 2, again["attempt"])
	require.Equal(t, 1400, b.spent(roomy))
	b.clock.Add(2 * time.Minute)
	b.refusal("run_budget_exceeded", "indeterminate", k2)

	// Resolved failed, the unknown attempt gives its cost back.
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+str(d["effect_id"])+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed"})
	require.Equal(t, 0, b.spent(run))
	b.mustBegin("execute", k)
	require.Equal(t, 700, b.spent(run))
}

// A grouped begin is charged to its run's wallet too.
func TestRunWalletChargesGroupedBegins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.runWith(100)
	group := b.newGroup("g", "")
	first := inRun(run, charge(key("g1"), 60))
	first["group_id"] = group
	b.mustBegin("execute", first)
	second := inRun(run, charge(key("g2"), 60))
	second["group_id"] = group
	b.denialOf("run_budget_exceeded", second)
}

func TestRunBudgetValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, bad := range []any{-1, json.Number("1000000000000000001"), "100", 1.5} {
		r := b.env.Do("POST", "/api/v1/runs", b.ws.Key, map[string]any{"name": "x", "budgetMicros": bad})
		require.Equal(t, []string{"budgetMicros"}, validationFields(t, r), "%v: %s", bad, r.Body)
	}
	r := b.env.Do("POST", "/api/v1/runs", b.ws.Key, map[string]any{"name": "", "budgetMicros": -1})
	require.ElementsMatch(t, []string{"name", "budgetMicros"}, validationFields(t, r))
	var n int
	require.NoError(t, b.env.App.Pool.QueryRow(t.Context(),
		`SELECT count(*) FROM job_runs WHERE workspace_id = $1`, b.ws.ID).Scan(&n))
	require.Zero(t, n, "a refused run is not created")
	// Zero is a wallet that admits only costless effects.
	run := b.runWith(0)
	b.mustBegin("execute", inRun(run, charge(key("free"), nil)))
	b.denialOf("run_budget_exceeded", inRun(run, charge(key("paid"), 1)))
}

// 200 concurrent begins on distinct keys in one run, over two instances,
// each costing 10 against a wallet of 1000: exactly 100 execute and the
// wallet is never overspent.
func TestRunWalletHoldsUnderConcurrentBegins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.runWith(1000)
	other := apitest.Start(t, apitest.WithNow(b.clock.Now))
	counts, _ := raceBodies(t, 200, b.ws.Key, func(i int) map[string]any {
		return inRun(run, charge(key("race"), 10))
	}, b.env, other)
	require.Equal(t, map[string]int{"execute": 100, "403:run_budget_exceeded": 100}, counts)
	require.Equal(t, 1000, b.spent(run))
}

// An effect is charged to the run it was begun under: a new attempt of its
// key, whichever run the begin names, is decided by that run's wallet, the
// one its spend counts against (review: it was checked against the named
// run's wallet and counted in the first run's, which then overspent).
func TestRunWalletChargesTheEffectsOwnRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, second := b.runWith(1000), b.runWith(1000)
	k := key("moved")
	a := b.mustBegin("execute", inRun(first, charge(k, 700)))
	require.Equal(t, http.StatusOK, b.report(str(a["effect_id"]), str(a["lease_token"]), "failed", nil).Status)
	b.mustBegin("execute", inRun(first, charge(key("rest"), 400)))

	// 400 + 700 would overspend the first run's wallet.
	e := b.denialOf("run_budget_exceeded", inRun(second, charge(k, 700)))
	d := e["detail"].(map[string]any)
	require.Equal(t, first, d["run_id"], "the wallet of the run the effect belongs to")
	require.EqualValues(t, 400, d["spent_micros"])
	require.Equal(t, 400, b.spent(first))
	require.Equal(t, 0, b.spent(second))

	// A key begun without a run is charged to no wallet, whichever run a
	// later begin names.
	free := key("free")
	f := b.mustBegin("execute", charge(free, 900))
	require.Equal(t, http.StatusOK, b.report(str(f["effect_id"]), str(f["lease_token"]), "failed", nil).Status)
	b.mustBegin("execute", inRun(second, charge(key("spend"), 1000)))
	b.mustBegin("execute", inRun(second, charge(free, 900)))
	require.Equal(t, 1000, b.spent(second))
}

// A begin naming no run is charged to the wallet of the run its key's
// effect was begun under (review: it was granted unchecked, and that run
// overspent).
func TestRunWalletChargesABeginNamingNoRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.runWith(1000)
	k := key("moved")
	a := b.mustBegin("execute", inRun(run, charge(k, 700)))
	require.Equal(t, http.StatusOK, b.report(str(a["effect_id"]), str(a["lease_token"]), "failed", nil).Status)
	rest := b.mustBegin("execute", inRun(run, charge(key("rest"), 400)))
	require.Equal(t, 400, b.spent(run))

	// The same key again, naming no run: 400 + 700 would overspend.
	e := b.denialOf("run_budget_exceeded", charge(k, 700))
	require.Equal(t, run, e["detail"].(map[string]any)["run_id"])
	require.Equal(t, 400, b.spent(run))
	// Once it fits, it is granted, and counted in that run.
	require.Equal(t, http.StatusOK, b.report(str(rest["effect_id"]), str(rest["lease_token"]), "failed", nil).Status)
	require.EqualValues(t, 2, b.mustBegin("execute", charge(k, 700))["attempt"])
	require.Equal(t, 700, b.spent(run))
}

// A grouped begin naming no run is charged to its key's run's wallet as
// well; it finds that wallet once it holds its group, and is begun again
// with the wallet locked first (chargeEffectWallet).
func TestRunWalletChargesAGroupedBeginNamingNoRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run := b.runWith(1000)
	group := b.newGroup("g", "")
	step := charge(key("step"), 700)
	step["group_id"] = group
	a := b.mustBegin("execute", inRun(run, step))
	require.Equal(t, http.StatusOK, b.report(str(a["effect_id"]), str(a["lease_token"]), "failed", nil).Status)
	rest := b.mustBegin("execute", inRun(run, charge(key("rest"), 400)))

	delete(step, "run_id")
	e := b.denialOf("run_budget_exceeded", step)
	require.Equal(t, run, e["detail"].(map[string]any)["run_id"])
	require.Equal(t, 400, b.spent(run))
	require.Equal(t, http.StatusOK, b.report(str(rest["effect_id"]), str(rest["lease_token"]), "failed", nil).Status)
	require.EqualValues(t, 2, b.mustBegin("execute", step)["attempt"])
	require.Equal(t, 700, b.spent(run))
}

// beginWhileWalletHeld begins body while the run's wallet lock is held
// elsewhere, so that the begin has chosen its wallet and waits on it; runs
// meanwhile; then lets the begin go and answers its status and body.
func (b *bundle) beginWhileWalletHeld(run string, body map[string]any, meanwhile func()) (int, map[string]any) {
	b.t.Helper()
	ctx := b.t.Context()
	conn, err := b.env.App.Pool.Acquire(ctx)
	require.NoError(b.t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('wallet:' || $1::text, 0))`, run)
	require.NoError(b.t, err)
	type res struct {
		status int
		out    map[string]any
		err    error
	}
	done := make(chan res, 1)
	go func() {
		st, out, err := post(b.env, "/api/v1/effects/begin", b.ws.Key, body)
		done <- res{st, out, err}
	}()
	// Until the begin waits on this wallet lock: on the lock this
	// connection holds, not on any advisory lock (another test's wait ended
	// this early, the begin arrived after meanwhile had begun the key under
	// another run, followed it to that run's wallet, and spent it: a flake
	// under a loaded CI run).
	var holder int32
	require.NoError(b.t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder))
	require.Eventually(b.t, func() bool {
		var n int
		_ = b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND $1::int = ANY (pg_blocking_pids(pid))`,
			holder).Scan(&n)
		return n > 0
	}, 5*time.Second, 10*time.Millisecond)
	meanwhile()
	_, err = conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('wallet:' || $1::text, 0))`, run)
	require.NoError(b.t, err)
	r := <-done
	require.NoError(b.t, r.err)
	return r.status, r.out
}

// A key begun under another run between a begin's choice of wallet and its
// decision is charged to that run's wallet, checked under its lock before
// the effect's row lock (review: the retry was checked against the named
// run's wallet and the other run overspent).
func TestRunWalletFollowsAKeyBegunMeanwhileUnderAnotherRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, second := b.runWith(1000), b.runWith(1000)
	k := key("raced")
	status, out := b.beginWhileWalletHeld(second, inRun(second, charge(k, 700)), func() {
		// The first run begins the key, it fails, and the rest of the first
		// run's wallet is spent.
		a := b.mustBegin("execute", inRun(first, charge(k, 700)))
		require.Equal(t, http.StatusOK, b.report(str(a["effect_id"]), str(a["lease_token"]), "failed", nil).Status)
		b.mustBegin("execute", inRun(first, charge(key("rest"), 400)))
		require.Equal(t, 400, b.spent(first))
	})
	require.Equal(t, http.StatusForbidden, status, "%v", out)
	require.Equal(t, "run_budget_exceeded", out["error"].(map[string]any)["code"])
	require.Equal(t, first, out["error"].(map[string]any)["detail"].(map[string]any)["run_id"])
	require.Equal(t, 400, b.spent(first))
	require.Equal(t, 0, b.spent(second))
}

// A begin whose named run's wallet refused it, for a key begun meanwhile
// under no run, is not refused by that wallet: the attempt is charged to no
// run (review: the named run's refusal stood).
func TestRunWalletRefusalDoesNotFollowAKeyBegunMeanwhileUnderNoRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	named := b.runWith(500)
	k := key("runless")
	status, out := b.beginWhileWalletHeld(named, inRun(named, charge(k, 700)), func() {
		a := b.mustBegin("execute", charge(k, 700))
		require.Equal(t, http.StatusOK, b.report(str(a["effect_id"]), str(a["lease_token"]), "failed", nil).Status)
	})
	require.Equal(t, http.StatusOK, status, "%v", out)
	require.Equal(t, "execute", out["decision"])
	require.EqualValues(t, 2, out["attempt"])
	require.Equal(t, 0, b.spent(named))
}

// Two begins whose keys were begun meanwhile under each other's runs do
// not hold both wallets crosswise: each is done again with only its key's
// run's wallet (review: they deadlocked, one answering 500). A begin does
// not retry a deadlock's victim: the victim answers 503, so both answering
// 200 says no deadlock happened.
func TestRunWalletCrossedBeginsDoNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r1, r2 := b.runWith(10000), b.runWith(10000)
	k1, k2 := key("k1"), key("k2")
	ctx := context.Background()
	conn, err := b.env.App.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	defer func() { _, _ = conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`) }()
	for _, r := range []string{r1, r2} {
		_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('wallet:' || $1::text, 0))`, r)
		require.NoError(t, err)
	}
	var holder int
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder))
	waits := apitest.NewLockWaits(t, b.env.App.Pool, holder)
	type res struct {
		st  int
		out map[string]any
	}
	answers := make(chan res, 2)
	for _, body := range []map[string]any{inRun(r1, charge(k1, 100)), inRun(r2, charge(k2, 100))} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			st, out, _ := post(b.env, "/api/v1/effects/begin", b.ws.Key, body)
			answers <- res{st, out}
		}()
		waits.Waiting(done, "the begin waits for its run's wallet")
	}
	// Meanwhile k1 is begun under r2 and k2 under r1, and both fail (simulated:
	// begun under no run, then attached, since the test itself holds both wallets).
	for _, k := range []string{k1, k2} {
		d := b.mustBegin("execute", charge(k, 100))
		require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).Status)
	}
	_, err = b.env.App.Pool.Exec(ctx, `UPDATE effects SET run_id = CASE idempotency_key WHEN $1 THEN $3 ELSE $4 END
		WHERE workspace_id = $5 AND idempotency_key IN ($1, $2)`, k1, k2, r2, r1, b.ws.ID)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	for range 2 {
		a := <-answers
		require.Equal(t, http.StatusOK, a.st, "no deadlock's victim: %v", a.out)
	}
}

// A begin that waited on its run wallet's lock longer than its lease is
// granted a lease measured from when it got the lock, not from its clock
// reading before the wait: it was answered execute with a lease that had
// already lapsed, and under on_indeterminate retry the key's next begin
// was granted too while the first holder acted on its execute (QA).
func TestABeginThatWaitedOnTheWalletGetsAWholeLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "retry"})
	run := b.runWith(1_000_000)
	body := inRun(run, email(key("slow")))
	body["lease_seconds"] = 5
	status, first := b.beginWhileWalletHeld(run, body, func() { b.clock.Add(6 * time.Second) })
	require.Equal(t, http.StatusOK, status, "%v", first)
	require.Equal(t, "execute", first["decision"])
	require.Equal(t, b.clock.Now().Add(5*time.Second).Format(time.RFC3339), first["lease_expires_at"])
	require.Equal(t, "in_flight", b.mustBegin("in_flight", body)["decision"], "the first holder was just told to execute")
}

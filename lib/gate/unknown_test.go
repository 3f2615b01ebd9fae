package gate_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An earlier attempt's unknown outcome is not erased by a later attempt
// reported failed (QA): under on_indeterminate retry the effect stays
// indeterminate — listed, resolvable, holding its ceilings and stopping its
// group's rollback — until an operator resolves it. A failed retry says
// only that the retry did not happen.

func TestAFailedRetryKeepsTheEarlierUnknownOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry", "daily_budget_micros": 2000})
	group := b.newGroup("g", "")
	body := groupStep(group, charge(key("maybe"), 700), map[string]any{"effect_type": "api.undo"})
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute) // attempt 1 lapses: it may have happened
	d2 := b.mustBegin("execute", body)
	id := str(d2["effect_id"])
	require.EqualValues(t, 2, d2["attempt"])

	r := b.report(id, str(d2["lease_token"]), "failed", nil)
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	e := r.JSON()
	require.Equal(t, "indeterminate", e["state"], "attempt 1 may still have happened")
	atts := e["attempts"].([]any)
	require.Equal(t, "indeterminate", atts[0].(map[string]any)["outcome"])
	require.Equal(t, "failed", atts[1].(map[string]any)["outcome"])
	// Repeating the report answers the same.
	require.Equal(t, "indeterminate", b.report(id, str(d2["lease_token"]), "failed", nil).JSON()["state"])

	listed := b.env.Must(http.StatusOK, "GET", "/api/v1/effects?state=indeterminate&effect_type=api.call", b.ws.Key,
		nil).JSON()["data"].([]any)
	require.Len(t, listed, 1)
	unwind := b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+group+"/unwind", b.ws.Key, nil).JSON()
	require.Equal(t, []any{id}, unwind["unresolved"], "a maybe stops the rollback")
	require.NotEqual(t, "unwound", unwind["state"])

	// Attempt 2's charge was given back; attempt 1's still counts.
	b.denialOf("budget_exceeded", charge(key("x"), 1301))
	b.mustBegin("execute", charge(key("y"), 1300))

	// The operator found attempt 1 failed at the vendor: its charge comes
	// back, the key is settled, the group's rollback goes on.
	res := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed"}).JSON()
	require.Equal(t, "failed", res["state"])
	atts = res["attempts"].([]any)
	require.Equal(t, "failed", atts[0].(map[string]any)["outcome"])
	require.NotNil(t, atts[0].(map[string]any)["resolved_at"])
	require.Equal(t, "failed", atts[1].(map[string]any)["outcome"])
	require.Nil(t, atts[1].(map[string]any)["resolved_at"], "the reported attempt was not the operator's to settle")
	b.mustBegin("execute", charge(key("z"), 700))
	unwind = b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+group+"/unwind", b.ws.Key, nil).JSON()
	require.Empty(t, unwind["unresolved"])
	require.Equal(t, "unwound", unwind["state"])
}

// Resolving settles every unknown attempt of the effect, and a failed
// resolution gives back all their charges, however many charged one counter.
func TestResolveSettlesEveryUnknownAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry", "daily_budget_micros": 3000})
	body := charge(key("twice"), 700)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	d3 := b.mustBegin("execute", body)
	id := str(d3["effect_id"])
	require.Equal(t, "indeterminate", b.report(id, str(d3["lease_token"]), "failed", nil).JSON()["state"])
	b.denialOf("budget_exceeded", charge(key("x"), 1601)) // 1400 held by attempts 1 and 2

	res := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key,
		map[string]any{"outcome": "failed"}).JSON()
	require.Equal(t, "failed", res["state"])
	for i, want := range []string{"failed", "failed", "failed"} {
		require.Equal(t, want, res["attempts"].([]any)[i].(map[string]any)["outcome"], "attempt %d", i+1)
	}
	b.mustBegin("execute", charge(key("all"), 3000))
}

// The same through reconciliation: the vendor's record settles the effect
// and every unknown attempt, giving back their charges.
func TestReconcileSettlesAFailedRetrysUnknownAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry", "daily_budget_micros": 1500})
	k := key("recon")
	body := charge(k, 700)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	d2 := b.mustBegin("execute", body)
	id := str(d2["effect_id"])
	require.Equal(t, "indeterminate", b.report(id, str(d2["lease_token"]), "failed", nil).JSON()["state"])
	from := b.clock.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	to := b.clock.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	out := b.env.Must(http.StatusOK, "POST", "/api/v1/reconcile", b.ws.Key, map[string]any{
		"effect_type": "api.call", "from": from, "to": to,
		"records": []any{map[string]any{"idempotency_key": k, "status": "failed", "amount_micros": 700}}}).JSON()
	resolved := out["resolved"].([]any)
	require.Len(t, resolved, 1, "%v", out)
	require.Equal(t, id, resolved[0].(map[string]any)["effect_id"])
	e := b.get(id)
	require.Equal(t, "failed", e["state"], "the vendor says it failed")
	require.Equal(t, "failed", e["attempts"].([]any)[0].(map[string]any)["outcome"])
	b.mustBegin("execute", charge(key("after"), 1500))
}

// A probe settles the unknown attempt before it (its holder checked the
// vendor first), so a later failure is a plain failure.
func TestAProbeSettlesTheUnknownAttemptBeforeIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("email.send", map[string]any{"on_indeterminate": "probe"})
	k := key("probed")
	b.mustBegin("execute", email(k))
	b.clock.Add(2 * time.Minute)
	d2 := b.mustBegin("execute", email(k))
	require.Equal(t, true, d2["probe"])
	id := str(d2["effect_id"])
	require.Equal(t, "failed", b.report(id, str(d2["lease_token"]), "failed", nil).JSON()["state"])
	d3 := b.mustBegin("execute", email(k))
	require.Equal(t, false, d3["probe"])
	require.Equal(t, "failed", b.report(id, str(d3["lease_token"]), "failed", nil).JSON()["state"])
}

// A probe reported failed settles the unknown attempt before it as failed
// (its holder checked the vendor and found nothing), giving back its charge
// as a resolution would (review: it was held until the day ended).
func TestAFailedProbeGivesBackTheUnknownAttemptsCharge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "probe", "daily_budget_micros": 1500})
	body := charge(key("p"), 600)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	d2 := b.mustBegin("execute", body)
	require.Equal(t, true, d2["probe"])
	e := b.report(str(d2["effect_id"]), str(d2["lease_token"]), "failed", nil).JSON()
	require.Equal(t, "failed", e["state"])
	first := e["attempts"].([]any)[0].(map[string]any)
	require.Equal(t, "failed", first["outcome"], "settled by the probe")
	require.NotNil(t, first["resolved_at"])
	b.mustBegin("execute", charge(key("after"), 1500))
}

// After a failed retry the effect is indeterminate because of attempt 1:
// a blocked or probe begin's prior_attempt names attempt 1, the one to
// check at the vendor, not the retry known to have failed (review).
func TestPriorAttemptNamesTheUnknownAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry"})
	body := charge(key("prior"), 10)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	d2 := b.mustBegin("execute", body)
	id := str(d2["effect_id"])
	require.Equal(t, "indeterminate", b.report(id, str(d2["lease_token"]), "failed", nil).JSON()["state"])

	b.putPolicy("api.call", map[string]any{"on_indeterminate": "block"})
	blk := b.mustBegin("blocked", body)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "probe"})
	pr := b.mustBegin("execute", body)
	require.EqualValues(t, 1, blk["prior_attempt"].(map[string]any)["attempt"], "attempt 2 is known failed; 1 is the unknown one")
	require.EqualValues(t, 1, pr["prior_attempt"].(map[string]any)["attempt"], "attempt 2 is known failed; 1 is the unknown one")
}

// An effect a failed retry leaves indeterminate is announced again:
// effect.indeterminate naming the unknown attempt (review: subscribers that
// saw the retry running were never told).
func TestAFailedRetryAnnouncesTheEffectIndeterminateAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry"})
	body := charge(key("evt"), 10)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	d2 := b.mustBegin("execute", body) // attempt 1's lapse recorded here (one event)
	id := str(d2["effect_id"])
	count := func() int {
		var n int
		require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), `SELECT count(*) FROM events
			WHERE subject_id = $1 AND type = 'effect.indeterminate'`, id).Scan(&n))
		return n
	}
	before := count()
	require.Equal(t, "indeterminate", b.report(id, str(d2["lease_token"]), "failed", nil).JSON()["state"])
	require.Equal(t, before+1, count(), "the effect became indeterminate again")
	var data map[string]any
	require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), `SELECT data FROM events WHERE subject_id = $1
		AND type = 'effect.indeterminate' ORDER BY created_at DESC, id DESC LIMIT 1`, id).Scan(&data))
	require.EqualValues(t, 1, data["attempt"], "the attempt whose outcome is unknown")
	// A repeated report records nothing more.
	b.report(id, str(d2["lease_token"]), "failed", nil)
	require.Equal(t, before+1, count())
}

// A step resolved succeeded after a failed retry is ordered in the
// rollback by when its succeeded attempt could have acted (that attempt's
// lease end), not by the failed retry's report (review: the plan undid the
// steps out of order).
func TestRollbackOrdersAResolvedStepByItsSucceededAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry"})
	group := b.newGroup("g", "")
	step := func(k string) map[string]any {
		return groupStep(group, charge(k, 10), map[string]any{"effect_type": "api.undo", "payload": map[string]any{"k": k}})
	}
	a := step(key("A")) // e.g. create the account
	b.mustBegin("execute", a)
	b.clock.Add(2 * time.Minute) // A's attempt 1 lapses at +60s: it happened, as the operator finds later

	bb := step(key("B")) // e.g. charge the account: succeeds at +2m, after A
	db := b.mustBegin("execute", bb)
	require.Equal(t, "succeeded", b.report(str(db["effect_id"]), str(db["lease_token"]), "succeeded", nil).JSON()["state"])

	b.clock.Add(time.Minute)
	da := b.mustBegin("execute", a) // A's retry, at +3m, fails
	aid := str(da["effect_id"])
	require.Equal(t, "indeterminate", b.report(aid, str(da["lease_token"]), "failed", nil).JSON()["state"])
	b.clock.Add(time.Minute)
	require.Equal(t, "succeeded", b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+aid+"/resolve", b.ws.Key,
		map[string]any{"outcome": "succeeded"}).JSON()["state"])

	u := b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+group+"/unwind", b.ws.Key, nil).JSON()
	plan := u["plan"].([]any)
	require.Len(t, plan, 2)
	order := []string{str(plan[0].(map[string]any)["effect_id"]), str(plan[1].(map[string]any)["effect_id"])}
	require.Equal(t, []string{str(db["effect_id"]), aid}, order, "B succeeded after A: undo B first")
}

// A retry past max_attempts is refused, the effect stays indeterminate and
// resolve settles it; resolved failed, max_attempts_exceeded stays, and
// every unknown attempt's charge comes back.
func TestMaxAttemptsAfterFailedRetries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry", "max_attempts": 3, "daily_budget_micros": 3000})
	body := charge(key("max"), 1000)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	for i := 0; i < 2; i++ {
		d := b.mustBegin("execute", body)
		require.Equal(t, "indeterminate", b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).JSON()["state"])
	}
	den := b.mustBegin("denied", body)
	require.Equal(t, "indeterminate", den["state"])
	id := str(den["effect_id"])
	b.denialOf("budget_exceeded", charge(key("x"), 2001))
	res := b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+id+"/resolve", b.ws.Key, map[string]any{"outcome": "failed"}).JSON()
	require.Equal(t, "failed", res["state"])
	require.Equal(t, "max_attempts_exceeded", res["denial_code"])
	b.mustBegin("execute", charge(key("y"), 3000))
}

// Concurrent resolves and reconciliations of the same effects release each
// unknown attempt's charge exactly once.
func TestConcurrentSettlementsReleaseOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry", "daily_budget_micros": 1000000})
	const n = 10
	var keys, effs []string
	for i := 0; i < n; i++ {
		k := key("c")
		body := charge(k, 1000)
		b.mustBegin("execute", body)
		keys = append(keys, k)
	}
	b.clock.Add(2 * time.Minute)
	for _, k := range keys {
		d := b.mustBegin("execute", charge(k, 1000))
		require.Equal(t, "indeterminate", b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil).JSON()["state"])
		effs = append(effs, str(d["effect_id"]))
	}
	var spent int64
	q := `SELECT coalesce(sum(micros),0) FROM gate_spend WHERE workspace_id = $1 AND scope = 'type:api.call'`
	require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), q, b.ws.ID).Scan(&spent))
	require.EqualValues(t, n*1000, spent)
	records := []any{}
	for _, k := range keys {
		records = append(records, map[string]any{"idempotency_key": k, "status": "failed"})
	}
	from := b.clock.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	to := b.clock.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	done := make(chan int, 100)
	// Each round's resolves by a key of its own: a key's repeat of its own
	// resolve answers 200 (leases.go resolvedBy), another key's is refused.
	operators := []string{b.ws.Key, b.env.Key(b.ws, map[string]any{"name": "op2", "preset": "OPERATOR"}),
		b.env.Key(b.ws, map[string]any{"name": "op3", "preset": "OPERATOR"})}
	for r := 0; r < 3; r++ {
		go func() {
			st, _, _ := post(b.env, "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": "api.call", "from": from, "to": to, "records": records})
			done <- st
		}()
		for _, id := range effs {
			go func() {
				st, _, _ := post(b.env, "/api/v1/effects/"+id+"/resolve", operators[r], map[string]any{"outcome": "failed"})
				done <- st
			}()
		}
	}
	codes := map[int]int{}
	for i := 0; i < 3+3*n; i++ {
		codes[<-done]++
	}
	// Reconciliations answer 200; of each effect's resolves at most one wins,
	// the rest find it settled (409).
	require.Equal(t, 3*n+3, codes[http.StatusOK]+codes[http.StatusConflict], "%v", codes)
	require.LessOrEqual(t, codes[http.StatusOK], n+3, "%v", codes)
	require.NoError(t, b.env.App.Pool.QueryRow(t.Context(), q, b.ws.ID).Scan(&spent))
	require.EqualValues(t, 0, spent)
}

// A failed probe gives back the charges of the attempts it settles in one
// statement, locking the counters in one order, as a grant does (review:
// two statements could lock a counter that sorts before one already held,
// and deadlocked against a grant by a capped key). Not parallel: it waits
// for any lock wait in the database.
func TestAFailedProbeReleasesInOneLockOrder(t *testing.T) {
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "probe", "daily_budget_micros": 100000})
	agent := b.env.Key(b.ws, map[string]any{"name": "capped", "preset": "AGENT", "daily_spend_ceiling_micros": 100000})
	body := charge(key("p"), 600)
	r := b.env.Do("POST", "/api/v1/effects/begin", agent, body) // agent: charges {key:..., type:api.call}
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	b.clock.Add(2 * time.Minute)
	d2 := b.mustBegin("execute", body) // a probe (charged nothing) by the admin key
	require.Equal(t, true, d2["probe"])

	ctx := context.Background()
	pool := b.env.App.Pool
	txA, err := pool.Begin(ctx) // stands for a grant by the agent key: key:... then type:api.call
	require.NoError(t, err)
	defer txA.Rollback(ctx)
	_, err = txA.Exec(ctx, `SELECT 1 FROM gate_spend WHERE scope = $1 FOR UPDATE`, "key:"+keyID(agent))
	require.NoError(t, err)

	done := make(chan int, 1)
	go func() {
		var st string
		err := pool.QueryRow(ctx, `SELECT state FROM gate_report($1::text, $2::text,
			(SELECT lease_token_hash FROM effects WHERE id = $1), 'failed', NULL::bytea, NULL::jsonb, $3::timestamptz,
			NULL::text, NULL::text)`, str(d2["effect_id"]), b.ws.ID, b.clock.Now()).Scan(&st)
		if err != nil {
			done <- 500
		} else {
			done <- 200
		}
	}()
	// wait for the report to block on the key counter (in one lock order
	// it holds nothing yet; in another it would hold type:api.call)
	waited := false
	for i := 0; i < 250 && !waited; i++ {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND datname = current_database()`).Scan(&n))
		waited = n > 0
		if !waited {
			time.Sleep(20 * time.Millisecond)
		}
	}
	require.True(t, waited, "the report never waited on the key counter")
	_, errA := txA.Exec(ctx, `UPDATE gate_spend SET micros = micros WHERE scope = 'type:api.call'`)
	txA.Rollback(ctx)
	status := <-done
	require.NoError(t, errA)
	require.Equal(t, http.StatusOK, status)
}

// 6ce8d40's sqlResolve (the previous release, still serving during a rolling
// deploy after 0026 ran), expanded.
const oldResolve = `
WITH upd AS (
    UPDATE effects SET state = $2, updated_at = $3,
        denial_code = CASE WHEN $2 = 'failed' AND denial_code = 'max_attempts_exceeded' THEN denial_code END
    WHERE id = $1 AND state = 'indeterminate'
    RETURNING id, attempt
), upa AS (
    UPDATE effect_attempts a SET outcome = $2, resolved_at = $3, resolve_note = 'old'
    FROM upd WHERE a.effect_id = upd.id AND a.attempt = upd.attempt
    RETURNING a.*
),
rel_rows AS (
    SELECT g.workspace_id, g.scope, g.day, c.micros, c.count
    FROM upa a, jsonb_to_recordset(a.charges) AS c(scope text, micros bigint, count bigint), gate_spend g
    WHERE a.outcome = 'failed' AND g.workspace_id = a.workspace_id AND g.scope = c.scope AND g.day = a.charged_on
    ORDER BY g.scope
    FOR UPDATE OF g
),
rel AS (
    UPDATE gate_spend g SET micros = g.micros - r.micros, count = g.count - r.count
    FROM rel_rows r WHERE g.workspace_id = r.workspace_id AND g.scope = r.scope AND g.day = r.day
)
SELECT count(*) FROM upa`

// An attempt left unknown by a resolution that settled only the current
// attempt (before 0026, and a previous release's instance during a deploy)
// is settled by it all the same: a later failed attempt leaves the effect
// failed (review: it came back indeterminate).
func TestAResolvedAttemptSettlesTheUnknownOnesBeforeIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "retry", "daily_budget_micros": 2000})
	body := charge(key("maybe"), 700)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	d2 := b.mustBegin("execute", body)
	id := str(d2["effect_id"])
	require.Equal(t, "indeterminate", b.report(id, str(d2["lease_token"]), "failed", nil).JSON()["state"])
	spend := func() (m int64) {
		require.NoError(t, b.env.App.Pool.QueryRow(t.Context(),
			`SELECT micros FROM gate_spend WHERE workspace_id = $1 AND scope = 'type:api.call'`, b.ws.ID).Scan(&m))
		return
	}
	require.EqualValues(t, 700, spend(), "attempt 1 holds 700; attempt 2's was given back")
	_, err := b.env.App.Pool.Exec(t.Context(), oldResolve, id, "failed", b.clock.Now())
	require.NoError(t, err)
	var outs []string
	require.NoError(t, b.env.App.Pool.QueryRow(t.Context(),
		`SELECT array_agg(coalesce(outcome,'-') ORDER BY attempt) FROM effect_attempts WHERE effect_id = $1`, id).Scan(&outs))
	require.Equal(t, []string{"indeterminate", "failed"}, outs, "the previous release rewrote the current attempt only")
	require.Equal(t, "failed", b.get(id)["state"])
	// The key is retried after the resolution, and that attempt fails.
	d3 := b.mustBegin("execute", body)
	e := b.report(id, str(d3["lease_token"]), "failed", nil).JSON()
	require.Equal(t, "failed", e["state"], "the operator settled the effect; attempt 1 still reads unknown")
}

// A probe is not charged again on a counter the unknown attempt it checks
// charged the same day: that attempt keeps its charge, and at most one of
// the two acts (the probe's holder reports what it found at the vendor, or
// acts because nothing was done). Charging both counted one action twice,
// and refused a probe whose cost did not fit beside the earlier charge, so
// the key could never be settled by its caller under a tight budget
// (closing notes of sessions 15 and 16).
func TestAProbeIsNotChargedAgainOnTheDailyCeilings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "probe", "daily_budget_micros": 1000})
	body := charge(key("p"), 600)
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute) // the lease lapses: the outcome is unknown
	d2 := b.mustBegin("execute", body)
	require.Equal(t, true, d2["probe"], "600 beside the unknown attempt's 600 would exceed 1000")
	b.clock.Add(2 * time.Minute) // the probe lapses too
	d3 := b.mustBegin("execute", body)
	require.Equal(t, true, d3["probe"])
	require.EqualValues(t, 3, d3["attempt"])
	e := b.report(str(d3["effect_id"]), str(d3["lease_token"]), "succeeded", map[string]any{"found": true}).JSON()
	require.Equal(t, "succeeded", e["state"])

	// One action was counted: 400 fits beside it, 401 does not.
	b.denialOf("budget_exceeded", charge(key("over"), 401))
	b.mustBegin("execute", charge(key("fits"), 400))
}

// probeInRun begins a 700-micro effect in a run with a 1000-micro wallet,
// lets its lease lapse and begins it again: the probe, granted though the
// wallet's 300 left would not fit another 700.
func (b *bundle) probeInRun() (run string, body, probe map[string]any) {
	b.t.Helper()
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "probe"})
	run = b.runWith(1000)
	body = inRun(run, charge(key("p"), 700))
	b.mustBegin("execute", body)
	b.clock.Add(2 * time.Minute)
	probe = b.mustBegin("execute", body)
	require.Equal(b.t, true, probe["probe"])
	return run, body, probe
}

// A run's wallet counts a probed effect once, as the daily ceilings do.
func TestRunWalletCountsAProbedEffectOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run, _, d2 := b.probeInRun()
	require.Equal(t, 700, b.spent(run))
	require.Equal(t, http.StatusOK, b.report(str(d2["effect_id"]), str(d2["lease_token"]), "succeeded", nil).Status)
	require.Equal(t, 700, b.spent(run))
	b.denialOf("run_budget_exceeded", inRun(run, charge(key("over"), 301)))
	b.mustBegin("execute", inRun(run, charge(key("fits"), 300)))
}

// A probe reported failed settles the attempt it checked as failed: the
// wallet gets the effect's whole cost back, and a fresh attempt after it
// is charged again (it is no probe: nothing is unknown any more).
func TestRunWalletAfterAFailedProbe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	run, body, d2 := b.probeInRun()
	require.Equal(t, "failed", b.report(str(d2["effect_id"]), str(d2["lease_token"]), "failed", nil).JSON()["state"])
	require.Equal(t, 0, b.spent(run))
	d3 := b.mustBegin("execute", body)
	require.Equal(t, false, d3["probe"])
	require.Equal(t, 700, b.spent(run))
}

// A probe on a later UTC day is charged on that day's counters: the earlier
// attempt's charge sits on its own day's, and what acts on a day stays
// bounded by that day's ceiling (review: a probe the next day, charged
// nothing, acted past a full budget).
func TestAProbeOnALaterDayIsChargedThatDay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "probe", "daily_budget_micros": 1000})
	body := charge(key("p"), 600)
	b.mustBegin("execute", body)
	b.clock.Add(24 * time.Hour) // the next UTC day; the attempt's outcome is unknown
	b.mustBegin("execute", charge(key("today"), 1000))
	e := b.refusal("budget_exceeded", "indeterminate", body)
	require.Equal(t, "budget_exceeded", e["code"])

	// On a day with room, the probe is charged there.
	b.clock.Add(24 * time.Hour)
	d := b.mustBegin("execute", body)
	require.Equal(t, true, d["probe"])
	b.denialOf("budget_exceeded", charge(key("over"), 401))
	b.mustBegin("execute", charge(key("fits"), 400))
}

// A probe its run's wallet would refuse stands clear of the wallet, and a
// daily ceiling that refuses its grant on a later day is answered as that
// ceiling's denial (review: the refusal escaped as a 500).
func TestAProbeRefusedByALaterDaysCeilingInARun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putPolicy("api.call", map[string]any{"on_indeterminate": "probe", "daily_budget_micros": 1000})
	run := b.runWith(1000)
	body := inRun(run, charge(key("p"), 700))
	b.mustBegin("execute", body)
	b.clock.Add(24 * time.Hour)
	b.mustBegin("execute", charge(key("today"), 1000))
	b.refusal("budget_exceeded", "indeterminate", body)
	b.clock.Add(24 * time.Hour) // a day with room: the probe is granted, the wallet notwithstanding
	d := b.mustBegin("execute", body)
	require.Equal(t, true, d["probe"])
	require.Equal(t, 700, b.spent(run))
}

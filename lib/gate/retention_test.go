package gate_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/testpg"
)

// Retention deletes ended effects once their type's retention_days have
// passed (90 without a policy), never a live or unresolved one. The sweep
// acts on every workspace of the package database, so the clock lives in
// 1990, before any other test's effects (TestSweeperAndLapseRaces is in 1995,
// the rest follow the wall clock).
func TestRetentionPurgesEndedEffectsAfterTheirTypesDays(t *testing.T) {
	b, sweep := inEra(t, 1990)
	c, ctx := b.clock, context.Background()
	exists := func(id string) bool {
		r := b.env.Do("GET", "/api/v1/effects/"+id, b.ws.Key, nil)
		require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, r.Status)
		return r.Status == http.StatusOK
	}
	b.putPolicy("sms.send", map[string]any{"retention_days": 1})

	oldKey := key("kept-90-days")
	old := b.mustBegin("execute", email(oldKey))
	require.Equal(t, http.StatusOK, b.report(str(old["effect_id"]), str(old["lease_token"]), "succeeded",
		map[string]any{"id": 1}).Status)
	sms := email(key("kept-1-day"))
	sms["effect_type"] = "sms.send"
	short := b.mustBegin("execute", sms)
	require.Equal(t, http.StatusOK, b.report(str(short["effect_id"]), str(short["lease_token"]), "failed", nil).Status)
	live := b.mustBegin("execute", email(key("never-reported")))
	// A rejected approval: the effect ends denied and its approval goes with it.
	b.putPolicy("wire.send", map[string]any{"approval_above_micros": 1_000_000, "retention_days": 1})
	gated := b.mustBegin("approval_required", wire(key("rejected")))
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+str(gated["approval_id"])+"/reject", b.ws.Key, nil)
	require.Equal(t, "denied", b.get(str(gated["effect_id"]))["state"])

	require.Zero(t, sweep(), "nothing has passed its retention yet")
	c.Add(25 * time.Hour)
	require.Equal(t, 2, sweep())
	require.False(t, exists(str(short["effect_id"])), "1-day retention passed")
	require.False(t, exists(str(gated["effect_id"])))
	var approvals int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM approvals WHERE effect_id = $1`,
		str(gated["effect_id"])).Scan(&approvals))
	require.Zero(t, approvals)
	require.True(t, exists(str(old["effect_id"])))
	require.True(t, exists(str(live["effect_id"])))

	c.Add(90 * 24 * time.Hour)
	require.Equal(t, 1, sweep())
	require.False(t, exists(str(old["effect_id"])), "the default 90 days passed")
	require.True(t, exists(str(live["effect_id"])), "an unresolved outcome is never purged")
	var attempts int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM effect_attempts WHERE effect_id = ANY($1)`,
		[]string{str(old["effect_id"]), str(short["effect_id"])}).Scan(&attempts))
	require.Zero(t, attempts)
	require.Zero(t, sweep(), "a repeated pass finds nothing")

	// Once purged, the key is new again.
	again := b.mustBegin("execute", email(oldKey))
	require.NotEqual(t, old["effect_id"], again["effect_id"])

	// Leave no lease for TestSweeperAndLapseRaces's global sweep to count.
	require.Equal(t, http.StatusOK, b.report(str(again["effect_id"]), str(again["lease_token"]), "succeeded", nil).Status)
	lapsed, err := b.env.App.Server.Gate.SweepLapsed(ctx, c.Now(), 1000)
	require.NoError(t, err)
	require.Equal(t, 1, lapsed, "only this test's 1990 lease had lapsed")
}

// Retention counts from when an effect ended, not from when it began: an
// effect resolved days after its begin keeps its record (and its key keeps
// answering duplicate) for its whole retention. Not parallel, in its own
// era (1980), like the test above.
func TestRetentionCountsFromTheEnd(t *testing.T) {
	b, sweep := inEra(t, 1980)
	c := b.clock
	b.putPolicy("email.send", map[string]any{"retention_days": 1})
	k := key("slow-resolve")
	d := b.mustBegin("execute", email(k))

	c.Add(48 * time.Hour) // the first lease lapsed long ago
	b.env.Must(http.StatusOK, "POST", "/api/v1/effects/"+str(d["effect_id"])+"/resolve", b.ws.Key,
		map[string]any{"outcome": "succeeded"})
	require.Zero(t, sweep(), "resolved just now")
	b.mustBegin("duplicate", email(k))

	c.Add(25 * time.Hour)
	require.Equal(t, 1, sweep(), "a day after it ended")
	again := b.mustBegin("execute", email(k))
	// Leave no lease for the other tests' global sweeps to count.
	require.Equal(t, http.StatusOK, b.report(str(again["effect_id"]), str(again["lease_token"]), "succeeded", nil).Status)
}

// A committed group can be unwound while its steps are kept: retention
// deletes it, with all its steps in one pass, once every step has passed
// its own type's retention, counted from the commit (before, a committed
// group's steps were kept for ever, and every pass walked past them). A
// retention raised after the commit keeps it longer. An open group keeps
// its steps. Not parallel, in its own era (1974).
func TestRetentionDeletesACommittedGroupOnceAllItsStepsExpired(t *testing.T) {
	b, sweep := inEra(t, 1974)
	ctx := context.Background()
	b.putPolicy("email.send", map[string]any{"retention_days": 1})
	b.putPolicy("charge.card", map[string]any{"retention_days": 3})
	stepOf := func(g, typ, k string) map[string]any {
		s := groupStep(g, email(key(k)), nil)
		s["effect_type"] = typ
		return s
	}
	sagaKey := key("saga")
	committed, open := b.newGroup("order", sagaKey), b.newGroup("order", key("open"))
	mail, charge := stepOf(committed, "email.send", "mail"), stepOf(committed, "charge.card", "charge")
	m, c := b.executedAs("succeeded", mail), b.executedAs("succeeded", charge)
	o := b.executedAs("succeeded", stepOf(open, "email.send", "open-step"))
	b.clock.Add(30 * time.Hour)
	commitAt := b.clock.Now()
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+committed+"/commit", b.ws.Key, nil)
	require.WithinDuration(t, commitAt.Add(72*time.Hour), *b.keepUntil(committed), time.Second, "the charge's three days")

	// Three days since the steps ended, not since the commit: the charge's
	// retention has not passed.
	b.clock.Add(45 * time.Hour)
	sweep() // (its count holds other tests' effects of earlier eras)
	b.env.Must(http.StatusOK, "GET", "/api/v1/effects/"+str(m["effect_id"]), b.ws.Key, nil)
	b.env.Must(http.StatusOK, "GET", "/api/v1/effects/"+str(c["effect_id"]), b.ws.Key, nil)
	require.Equal(t, "committed", b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+committed, b.ws.Key, nil).JSON()["state"])

	// The charge's retention raised to four days since: due, but kept, and
	// not read again before its new day.
	b.putPolicy("charge.card", map[string]any{"retention_days": 4})
	b.clock.Set(commitAt.Add(72*time.Hour + time.Minute))
	sweep()
	b.env.Must(http.StatusOK, "GET", "/api/v1/effects/"+str(c["effect_id"]), b.ws.Key, nil)
	require.WithinDuration(t, commitAt.Add(96*time.Hour), *b.keepUntil(committed), time.Second)

	// Four days since the commit: the group and both its steps go in one
	// pass, though the pass may delete one effect only.
	b.clock.Set(commitAt.Add(96*time.Hour + time.Minute))
	_, err := b.env.App.Server.Gate.SweepRetention(ctx, b.clock.Now(), 1)
	require.NoError(t, err)
	for _, path := range []string{"/api/v1/groups/" + committed, "/api/v1/effects/" + str(m["effect_id"]),
		"/api/v1/effects/" + str(c["effect_id"])} {
		errCode(t, b.env.Do("GET", path, b.ws.Key, nil), http.StatusNotFound, "not_found")
	}
	errCode(t, b.env.Do("POST", "/api/v1/groups/"+committed+"/unwind", b.ws.Key, nil), http.StatusNotFound, "not_found")
	require.Equal(t, "open", b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+open, b.ws.Key, nil).JSON()["state"])
	sweep()
	b.env.Must(http.StatusOK, "GET", "/api/v1/effects/"+str(o["effect_id"]), b.ws.Key, nil) // the open group's step
	// The step's key is new again, outside the group that is gone, and so
	// is the group's own.
	delete(mail, "group_id")
	delete(mail, "compensation")
	b.executedAs("succeeded", mail)
	require.NotEqual(t, committed, b.newGroup("order", sagaKey))
}

// What retention deletes of a run's effects stays spent from its wallet,
// which lasts the run's whole life (QA: a run outliving its types'
// retention got its budget back).
func TestRetentionLeavesARunsWalletSpent(t *testing.T) {
	b, sweep := inEra(t, 1985)
	b.putPolicy("api.call", map[string]any{"retention_days": 1})
	run := b.runWith(1000)
	done := b.executedAs("succeeded", inRun(run, charge(key("done"), 600)))
	failed := b.executedAs("failed", inRun(run, charge(key("failed"), 300)))
	other := b.runWith(1000) // a wallet none of the deleted effects paid from
	require.Equal(t, 600, b.spent(run))

	b.clock.Add(49 * time.Hour)
	sweep() // other tests' eras may leave ended effects this sweep takes too
	for _, d := range []map[string]any{done, failed} {
		require.Equal(t, http.StatusNotFound, b.env.Do("GET", "/api/v1/effects/"+str(d["effect_id"]), b.ws.Key, nil).Status)
	}
	require.Equal(t, 600, b.spent(run), "the success stays spent; the failure gave its cost back")
	require.Equal(t, 0, b.spent(other))
	b.denialOf("run_budget_exceeded", inRun(run, charge(key("over"), 401)))
	// Reported, so that no lease is left behind for TestSweeperAndLapseRaces's sweeps.
	b.executedAs("succeeded", inRun(run, charge(key("fits"), 400)))
	b.executedAs("succeeded", inRun(other, charge(key("fits"), 1000)))
}

// A pass that meets a run being deleted by run retention waits for it and
// skips its wallet, instead of failing whole on the foreign key (review).
func TestRetentionSkipsARunDeletedMeanwhile(t *testing.T) {
	b, _ := inEra(t, 1986)
	b.putPolicy("api.call", map[string]any{"retention_days": 1})
	run := b.runWith(1000)
	d := b.executedAs("succeeded", inRun(run, charge(key("done"), 600)))
	b.clock.Add(49 * time.Hour)

	ctx := context.Background()
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `DELETE FROM job_runs WHERE id = $1`, run)
	require.NoError(t, err)
	swept := make(chan error, 1)
	go func() {
		_, err := b.env.App.Server.Gate.SweepRetention(ctx, b.clock.Now(), 1000)
		swept <- err
	}()
	require.Eventually(t, func() bool { // the pass waits for the run's row
		var waiting int
		err := b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted`).Scan(&waiting)
		return err == nil && waiting > 0
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-swept)
	require.Equal(t, http.StatusNotFound, b.env.Do("GET", "/api/v1/effects/"+str(d["effect_id"]), b.ws.Key, nil).Status)
}

// executedAs begins body, which executes, and reports it with outcome.
func (b *bundle) executedAs(outcome string, body map[string]any) map[string]any {
	b.t.Helper()
	d := b.mustBegin("execute", body)
	require.Equal(b.t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), outcome, nil).Status)
	return d
}

// inEra is a workspace whose clock starts in year (at a random second of
// its first days, so reruns do not meet), and a retention pass at its now.
// The sweep acts on every workspace of the package database: each era
// holds one test's effects only.
func inEra(t *testing.T, year int) (*bundle, func() int) {
	t.Helper()
	era := time.Date(year, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rand.IntN(1e6)) * time.Second)
	c := apitest.NewClock(era)
	b := &bundle{t: t, clock: c, env: apitest.Start(t, apitest.WithNow(c.Now))}
	b.ws = b.env.Signup()
	sweep := func() int {
		n, err := b.env.App.Server.Gate.SweepRetention(context.Background(), c.Now(), 1000)
		require.NoError(t, err)
		return n
	}
	// The sweep acts on every workspace of the package database: what an
	// earlier era left (a test that ran before this one, whichever did
	// depending on -run) goes now, so that the test's counts are its own
	// (a run of -run TestRetention alone counted 2 effects of the 1900s).
	for sweep() > 0 {
	}
	return b, sweep
}

// A rollback that ended is final, however long its compensations are kept:
// once retention deleted a step's compensation (its type kept them a day,
// the step's 90), its key was new and the one-per-step index free again,
// and a retried rollback refunded a second time (retention QA). Since 0038
// retention keeps an ended group whole, so the compensation stays with its
// step; one an earlier release deleted alone still takes no new attempt.
// Not parallel, in its own era (1962).
func TestAnEndedRollbackTakesNoCompensationAfterRetention(t *testing.T) {
	b, sweep := inEra(t, 1962)
	b.putPolicy("email.retract", map[string]any{"retention_days": 1})
	g, _, s := b.groupWithStep("order", "")
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil)
	comp := map[string]any{"effect_type": "email.retract", "idempotency_key": "compensate:" + str(s["effect_id"]),
		"compensates_effect_id": s["effect_id"]}
	c := b.executedAs("succeeded", comp)
	require.Equal(t, "unwound", b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g, b.ws.Key, nil).JSON()["state"])
	b.mustBegin("duplicate", comp)

	b.clock.Add(49 * time.Hour)
	require.Zero(t, sweep(), "the compensation's day passed; its group keeps it with the step")
	b.mustBegin("duplicate", comp)

	// As a pass of a release before 0038 did.
	_, err := b.env.App.Pool.Exec(context.Background(), `
WITH a AS (DELETE FROM effect_attempts WHERE effect_id = $1)
DELETE FROM effects WHERE id = $1`, str(c["effect_id"]))
	require.NoError(t, err)
	r := b.begin(comp)
	errCode(t, r, http.StatusConflict, "invalid_state")
	require.Equal(t, "unwound", r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["state"])
}

// A group whose rollback ended (unwound, unwind_failed) is kept whole, its
// steps with their compensations, until the longest retention among their
// types has passed since the end, then goes in one pass (0038). Before, its
// steps went one by one under their own types' retention and the group was
// kept for ever, reading "unwound" with steps missing. Not parallel, in its
// own era (1956).
func TestRetentionDeletesAnEndedRollbackWhole(t *testing.T) {
	b, sweep := inEra(t, 1956)
	b.putPolicy("email.send", map[string]any{"retention_days": 1})
	b.putPolicy("email.retract", map[string]any{"retention_days": 3})
	b.putPolicy("charge.card", map[string]any{"retention_days": 1})
	groupKey := key("rollback")
	unwound, _, s := b.groupWithStep("order", groupKey)
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+unwound+"/unwind", b.ws.Key, nil)
	c := b.executedAs("succeeded", map[string]any{"effect_type": "email.retract",
		"idempotency_key": "compensate:" + str(s["effect_id"]), "compensates_effect_id": s["effect_id"]})
	endedAt := b.clock.Now()
	require.Equal(t, "unwound", b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+unwound, b.ws.Key, nil).JSON()["state"])
	require.WithinDuration(t, endedAt.Add(72*time.Hour), *b.keepUntil(unwound), time.Second, "the compensation's three days")

	failed := b.newGroup("order", "")
	charge := email(key("charge"))
	charge["effect_type"], charge["group_id"] = "charge.card", failed // no compensation: irreversible
	ch := b.executedAs("succeeded", charge)
	require.Equal(t, "unwind_failed",
		b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+failed+"/unwind", b.ws.Key, nil).JSON()["state"])
	require.WithinDuration(t, endedAt.Add(24*time.Hour), *b.keepUntil(failed), time.Second)

	unwoundPaths := []string{"/api/v1/groups/" + unwound, "/api/v1/effects/" + str(s["effect_id"]),
		"/api/v1/effects/" + str(c["effect_id"])}
	failedPaths := []string{"/api/v1/groups/" + failed, "/api/v1/effects/" + str(ch["effect_id"])}

	// A day and more: the step's own day passed, but its group keeps it.
	b.clock.Add(25 * time.Hour)
	sweep()
	b.requireKept(true, unwoundPaths...)
	require.Len(t, b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+unwound, b.ws.Key, nil).JSON()["steps"], 2)
	b.requireKept(false, failedPaths...)

	// Three days since the end: the group, its step and its compensation go
	// together, and the group's key opens a new group.
	b.clock.Set(endedAt.Add(72*time.Hour + time.Minute))
	sweep()
	b.requireKept(false, unwoundPaths...)
	require.NotEqual(t, unwound, b.newGroup("order", groupKey))
}

// A step awaiting an approval when its group's rollback ended never takes
// its attempt (the group refuses it, and the rollback closed its approval): it goes with its
// group when the group is due, approval and all, instead of keeping the
// whole group for ever a day at a time (review). A group committed, then
// unwound, is dated from the end of its rollback, not from its commit, and
// not while it unwinds. Not parallel, in its own era (1958).
func TestRetentionDeletesAnEndedRollbackWithAStepAwaitingApproval(t *testing.T) {
	b, sweep := inEra(t, 1958)
	b.putPolicy("email.send", map[string]any{"retention_days": 1})
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval", "retention_days": 1})

	g, steps := b.committedGroup("email.send")
	require.NotNil(t, b.keepUntil(g))
	b.clock.Add(10 * time.Hour)
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil)
	require.Nil(t, b.keepUntil(g), "an unwinding group is kept whole until it ends")
	b.clock.Add(10 * time.Hour)
	c := b.executedAs("succeeded", map[string]any{"effect_type": "email.retract",
		"idempotency_key": "compensate:" + steps[0], "compensates_effect_id": steps[0]})
	require.Equal(t, "unwound", b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g, b.ws.Key, nil).JSON()["state"])
	require.WithinDuration(t, b.clock.Now().Add(90*24*time.Hour), *b.keepUntil(g), time.Second,
		"the compensation's type has no policy: 90 days from the end")

	pending := b.newGroup("payout", "")
	w := wire(key("wire"))
	w["group_id"] = pending
	asked := b.mustBegin("approval_required", w)
	require.Equal(t, "unwound", b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+pending+"/unwind", b.ws.Key, nil).JSON()["state"])
	errCode(t, b.env.Do("POST", "/api/v1/approvals/"+str(asked["approval_id"])+"/approve", b.ws.Key, nil),
		http.StatusConflict, "invalid_state")
	errCode(t, b.begin(w), http.StatusConflict, "group_unwinding")
	endedAt := b.clock.Now()

	b.clock.Set(endedAt.Add(24*time.Hour + time.Minute))
	sweep()
	b.requireKept(false, "/api/v1/groups/"+pending, "/api/v1/effects/"+str(asked["effect_id"]),
		"/api/v1/approvals/"+str(asked["approval_id"]))
	b.requireKept(true, "/api/v1/groups/"+g, "/api/v1/effects/"+steps[0], "/api/v1/effects/"+str(c["effect_id"]))
}

// A pass skips an ended rollback one of whose approvals a decide holds: a
// decide locks its approval, then its effect, and a pass that locked the
// effect, then waited for the approval to delete it, deadlocked with it
// (review). Not parallel, in its own era (1942).
func TestRetentionSkipsAGroupWhoseApprovalADecideHolds(t *testing.T) {
	b, sweep := inEra(t, 1942)
	ctx := context.Background()
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval", "retention_days": 1})
	g := b.newGroup("payout", "")
	w := wire(key("wire"))
	w["group_id"] = g
	asked := b.mustBegin("approval_required", w)
	require.Equal(t, "unwound", b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()["state"])
	paths := []string{"/api/v1/groups/" + g, "/api/v1/effects/" + str(asked["effect_id"]),
		"/api/v1/approvals/" + str(asked["approval_id"])}
	b.clock.Add(49 * time.Hour)

	decide := b.holding(`UPDATE approvals SET note = note WHERE id = $1`, str(asked["approval_id"]))
	waited, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := b.env.App.Server.Gate.SweepRetention(waited, b.clock.Now(), 1000)
	require.NoError(t, err, "the pass must not wait for the approval")
	_, err = decide.Exec(ctx, `UPDATE effects SET updated_at = updated_at WHERE id = $1`, str(asked["effect_id"]))
	require.NoError(t, err)
	require.NoError(t, decide.Rollback(ctx))
	b.requireKept(true, paths...)

	sweep()
	b.requireKept(false, paths...)
}

// A learned surge baseline leaves out the hours whose effects retention
// deleted (0035): with retention_days under 7 those hours counted as quiet,
// the median fell to 0 and the learned ceiling to its floor of 30, so the
// type's ordinary traffic tripped its breaker. Not parallel, in its own era
// (1966).
func TestLearnedSurgeBaselineSkipsTheHoursRetentionDeleted(t *testing.T) {
	b, sweep := inEra(t, 1966)
	c := b.clock
	c.Add(c.Now().Truncate(time.Hour).Add(time.Hour).Sub(c.Now())) // on an hour boundary
	b.putPolicy("sms.send", map[string]any{"surge_multiplier": 10, "surge_action": "deny", "retention_days": 1})
	// 52 hours of 5 an hour: retention keeps the last day of them, fewer
	// than the hours it deletes, so counting those as 0 makes the median 0.
	for h := 0; h < 52; h++ {
		for i := 0; i < 5; i++ {
			b.executedAs("succeeded", sms(key("base")))
		}
		c.Add(time.Hour)
	}
	require.EqualValues(t, 5, b.circuit("sms.send")["baseline_median_hourly"])
	require.Greater(t, sweep(), 100)
	circuit := b.circuit("sms.send")
	require.EqualValues(t, 5, circuit["baseline_median_hourly"], "the deleted hours are not quiet ones")
	require.EqualValues(t, 50, circuit["threshold"])

	// Begin's own baseline, computed afresh in a new hour, agrees: 50 new
	// keys execute and the 51st trips the breaker, not the 31st.
	c.Add(time.Hour)
	sweep()
	for i := 0; i < 50; i++ {
		b.executedAs("succeeded", sms(key("busy")))
	}
	b.denialOf("circuit_open", sms(key("surge")))
	require.Equal(t, "surge", b.circuit("sms.send")["opened_by"])
}

// The circuits list answers the learned ceiling begin applies: the hour's
// baseline, which begin computes once an hour and caches, is read from that
// cache, not computed again from a week of effects per type on every list
// (scale QA: 1.42M effects of 10 types, 0.85 s a list; with the learned
// types cached, the half of them, 0.45 s, all of them 2 ms). Computed
// again, the list disagreed with the breaker within the hour whenever the
// window had changed since begin cached it: here a retention pass deletes
// the quieter early hours, so the list answered a ceiling of 60 while begin
// tripped at 30 until the hour rolled. Not parallel, in its own era (1978).
func TestCircuitListAnswersTheCeilingBeginApplies(t *testing.T) {
	b, sweep := inEra(t, 1978)
	c := b.clock
	c.Add(c.Now().Truncate(time.Hour).Add(time.Hour).Sub(c.Now())) // on an hour boundary
	b.putPolicy("sms.send", map[string]any{"surge_multiplier": 10, "surge_action": "deny", "retention_days": 1})
	// A day of 2 an hour, then 16 hours of 6: a median of 2 over all of
	// them, of 6 over the last day.
	for h := 0; h < 40; h++ {
		n := 2
		if h >= 24 {
			n = 6
		}
		for i := 0; i < n; i++ {
			b.executedAs("succeeded", sms(key("base")))
		}
		c.Add(time.Hour)
	}
	// The hour's first new key: begin computes the baseline and caches it.
	b.executedAs("succeeded", sms(key("busy")))
	circuit := b.circuit("sms.send")
	require.EqualValues(t, 2, circuit["baseline_median_hourly"])
	require.EqualValues(t, 30, circuit["threshold"])

	require.Greater(t, sweep(), 30, "the first 16 hours go")
	circuit = b.circuit("sms.send")
	require.EqualValues(t, 2, circuit["baseline_median_hourly"], "the hour's baseline, as begin has it")
	require.EqualValues(t, 30, circuit["threshold"])
	// And begin applies it: 30 new keys this hour execute, the 31st trips.
	for i := 1; i < 30; i++ {
		b.executedAs("succeeded", sms(key("busy")))
	}
	b.denialOf("circuit_open", sms(key("surge")))
	require.Equal(t, "surge", b.circuit("sms.send")["opened_by"])

	// The next hour, begin computes it again, over the day retention kept.
	c.Add(time.Hour)
	b.env.Must(http.StatusOK, "POST", "/api/v1/circuits/sms.send/close", b.ws.Key, nil)
	b.executedAs("succeeded", sms(key("next")))
	circuit = b.circuit("sms.send")
	require.EqualValues(t, 6, circuit["baseline_median_hourly"])
	require.EqualValues(t, 60, circuit["threshold"])
}

// A retention pass holds none of the begins of the types it purges: it
// records how far it deleted in a table of their own (gate_effect_history),
// where a column of gate_effect_types, which every new key's begin inserts
// into, held each such begin until the pass committed (review). Not
// parallel, in its own era (1970).
func TestRetentionPassHoldsNoBegin(t *testing.T) {
	b, _ := inEra(t, 1970)
	ctx := context.Background()
	b.putPolicy("sms.send", map[string]any{"retention_days": 1})
	b.executedAs("succeeded", sms(key("old")))
	b.clock.Add(25 * time.Hour)

	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }() // for a failed require; rolled back below
	n, err := gate.PurgeExpired(ctx, tx, b.clock.Now(), 1000)
	require.NoError(t, err)
	require.Positive(t, n, "this era's effect, and earlier eras' the other tests left")

	done := make(chan map[string]any, 1)
	go func() { done <- b.env.Do("POST", "/api/v1/effects/begin", b.ws.Key, sms(key("new"))).JSON() }()
	select {
	case d := <-done:
		require.Equal(t, "execute", d["decision"])
		require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "succeeded", nil).Status)
	case <-time.After(5 * time.Second):
		require.NoError(t, tx.Rollback(ctx))
		<-done
		t.Fatal("a new key's begin waited for the retention pass")
	}
	require.NoError(t, tx.Rollback(ctx))
}

// A retention pass skips a committed group a transition holds (an unwind
// taking it, say) and deletes none of its steps, so the unwind plans every
// step; once free, the group and its steps go together. Not parallel, in
// its own era (1976).
func TestRetentionSkipsACommittedGroupAnUnwindHolds(t *testing.T) {
	b, sweep := inEra(t, 1976)
	b.putPolicy("email.send", map[string]any{"retention_days": 1})
	g, steps := b.committedGroup("email.send")
	paths := []string{"/api/v1/groups/" + g, "/api/v1/effects/" + steps[0]}
	b.clock.Add(49 * time.Hour)

	unwind := b.holding(`SELECT 1 FROM effect_groups WHERE id = $1 FOR UPDATE`, g)
	sweep()
	require.NoError(t, unwind.Rollback(context.Background()))
	b.requireKept(true, paths...)

	sweep()
	b.requireKept(false, paths...)
}

// committedGroup is a committed group of b's workspace with a succeeded
// step of each of types, and its steps' effect ids.
func (b *bundle) committedGroup(types ...string) (string, []string) {
	b.t.Helper()
	g := b.newGroup("order", "")
	var steps []string
	for _, typ := range types {
		s := groupStep(g, email(key("step")), nil)
		s["effect_type"] = typ
		steps = append(steps, str(b.executedAs("succeeded", s)["effect_id"]))
	}
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/commit", b.ws.Key, nil)
	return g, steps
}

// holding begins a transaction of its own that runs sql, holding what it
// locks until the test rolls it back (or ends: a failure must not leave the
// pool waiting for it).
func (b *bundle) holding(sql string, args ...any) pgx.Tx {
	b.t.Helper()
	ctx := context.Background()
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, sql, args...)
	require.NoError(b.t, err)
	return tx
}

// keepUntil is group g's keep_until (nil: not dated).
func (b *bundle) keepUntil(g string) *time.Time {
	b.t.Helper()
	var until *time.Time
	require.NoError(b.t, b.env.App.Pool.QueryRow(context.Background(),
		`SELECT keep_until FROM effect_groups WHERE id = $1`, g).Scan(&until))
	return until
}

// requireKept says whether each of paths reads (200) or is gone (404).
func (b *bundle) requireKept(kept bool, paths ...string) {
	b.t.Helper()
	for _, path := range paths {
		r := b.env.Do("GET", path, b.ws.Key, nil)
		if kept {
			require.Equal(b.t, http.StatusOK, r.Status, "%s: %s", path, r.Body)
		} else {
			errCode(b.t, r, http.StatusNotFound, "not_found")
		}
	}
}

// An ended group (committed, unwound) one of whose steps another
// transaction holds (a late report, a resolve, a replayed begin, a
// compensation's report) is kept, steps and all, for a later
// pass: skipping that step alone left it behind its deleted group, where
// its replays were refused as another key's (review). Not parallel, in its
// own era (1952).
func TestRetentionKeepsAnEndedGroupWhileAStepIsHeld(t *testing.T) {
	b, sweep := inEra(t, 1952)
	b.putPolicy("email.send", map[string]any{"retention_days": 1})
	b.putPolicy("email.retract", map[string]any{"retention_days": 1})
	g, steps := b.committedGroup("email.send", "email.send")
	unwound, undone := b.committedGroup("email.send")
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+unwound+"/unwind", b.ws.Key, nil)
	c := b.executedAs("succeeded", map[string]any{"effect_type": "email.retract",
		"idempotency_key": "compensate:" + undone[0], "compensates_effect_id": undone[0]})
	require.Equal(t, "unwound", b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+unwound, b.ws.Key, nil).JSON()["state"])
	paths := []string{"/api/v1/groups/" + g, "/api/v1/effects/" + steps[0], "/api/v1/effects/" + steps[1],
		"/api/v1/groups/" + unwound, "/api/v1/effects/" + undone[0], "/api/v1/effects/" + str(c["effect_id"])}
	b.clock.Add(49 * time.Hour)

	report := b.holding(`SELECT 1 FROM effects WHERE id = ANY($1) FOR UPDATE`, []string{steps[1], str(c["effect_id"])})
	sweep()
	require.NoError(t, report.Rollback(context.Background()))
	b.requireKept(true, paths...)

	sweep()
	b.requireKept(false, paths...)
}

// A pass counts the approvals it locked once, by group, not by reading all
// of them again for each group: that made its work grow with the square of
// its batch (scale QA: 100 groups of 10 approved steps read 100,000 locked
// approvals; 1,000 groups took 1.4-2.5 s instead of 0.3-0.45 s). Each
// group is still matched with its own approvals: of two ended rollbacks,
// the one whose approval a decide holds is kept, the other goes. Not
// parallel, in its own era (1994).
func TestRetentionCountsLockedApprovalsOnce(t *testing.T) {
	b, sweep := inEra(t, 1994)
	ctx := context.Background()
	rescans, err := testpg.RescansCTE(ctx, b.env.App.Pool, "approvals_locked", gate.SQLPurgeKeptGroups,
		b.clock.Now(), []string{"grp_a", "grp_b"}, 1000)
	require.NoError(t, err)
	require.False(t, rescans, "the locked approvals are read again for each group")

	b.putPolicy("wire.send", map[string]any{"mode": "require_approval", "retention_days": 1})
	rollback := func() (approval string, paths []string) {
		g := b.newGroup("payout", "")
		w := wire(key("wire"))
		w["group_id"] = g
		asked := b.mustBegin("approval_required", w)
		require.Equal(t, "unwound", b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()["state"])
		return str(asked["approval_id"]), []string{"/api/v1/groups/" + g, "/api/v1/effects/" + str(asked["effect_id"]),
			"/api/v1/approvals/" + str(asked["approval_id"])}
	}
	heldApproval, held := rollback()
	_, free := rollback()
	b.clock.Add(49 * time.Hour)

	decide := b.holding(`UPDATE approvals SET note = note WHERE id = $1`, heldApproval)
	sweep()
	b.requireKept(false, free...)
	b.requireKept(true, held...)
	require.NoError(t, decide.Rollback(ctx))
	sweep()
	b.requireKept(false, held...)
}

// A pass deletes the steps of the groups it deletes up to its limit, the
// first group's always, so a backlog of large groups cannot make one pass
// outrun its time (review); a group committed by an instance older than
// 0037 (no keep_until) is dated by the next pass. Not parallel, in its own
// era (1954).
func TestRetentionBoundsTheStepsOfTheGroupsAPassDeletes(t *testing.T) {
	b, sweep := inEra(t, 1954)
	ctx := context.Background()
	b.putPolicy("email.send", map[string]any{"retention_days": 1})
	first, _ := b.committedGroup("email.send", "email.send")
	b.clock.Add(time.Minute)
	second, _ := b.committedGroup("email.send", "email.send")
	b.clock.Add(time.Minute)
	undated, _ := b.committedGroup("email.send")
	commitAt := b.clock.Now()
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE effect_groups SET keep_until = NULL WHERE id = $1`, undated)
	require.NoError(t, err)

	b.clock.Add(time.Hour)
	sweep()
	require.WithinDuration(t, commitAt.Add(24*time.Hour), *b.keepUntil(undated), time.Second, "dated by the pass")

	b.clock.Add(49 * time.Hour)
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	deleted, _, err := gate.PurgeKeptGroups(ctx, tx, b.clock.Now(), 10, 3)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{first, second}, deleted, "the second starts within the 3 steps; the third would not")
	deleted, _, err = gate.PurgeKeptGroups(ctx, tx, b.clock.Now(), 10, 1)
	require.NoError(t, err)
	require.Equal(t, []string{undated}, deleted, "the first group always")
	require.NoError(t, tx.Rollback(ctx))

	sweep()
	b.requireKept(false, "/api/v1/groups/"+first, "/api/v1/groups/"+second, "/api/v1/groups/"+undated)
}

// Lowering a type's retention applies to the ended groups holding its
// effects, as it does to every other effect of the type: before, a group
// kept the date its longest retention gave it when it ended, so a type cut
// from 60 days to 2 kept its grouped records 60 days (carried gap). A
// group holding none of the type keeps its date, and so does one another
// type keeps longer. Not parallel, in its own era (1940).
func TestLoweringARetentionShortensTheEndedGroupsOfItsType(t *testing.T) {
	b, sweep := inEra(t, 1940)
	ctx := context.Background()
	b.putPolicy("email.send", map[string]any{"retention_days": 30})
	b.putPolicy("charge.card", map[string]any{"retention_days": 60})
	day := 24 * time.Hour
	endedAt := b.clock.Now()
	both, _ := b.committedGroup("email.send", "charge.card")
	charges, _ := b.committedGroup("charge.card")
	mails, _ := b.committedGroup("email.send")
	others, _ := b.committedGroup("sms.send") // no policy: 90 days
	failed := b.newGroup("order", "")
	charge := email(key("irreversible"))
	charge["effect_type"], charge["group_id"] = "charge.card", failed
	b.executedAs("succeeded", charge)
	require.Equal(t, "unwind_failed",
		b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+failed+"/unwind", b.ws.Key, nil).JSON()["state"])
	require.WithinDuration(t, endedAt.Add(60*day), *b.keepUntil(both), time.Second)

	// (Moved an hour on, so that dating them again would show.)
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE effect_groups SET keep_until = keep_until + interval '1 hour'
		WHERE id = ANY($1)`, []string{mails, others})
	require.NoError(t, err)
	b.putPolicy("charge.card", map[string]any{"retention_days": 2})
	require.WithinDuration(t, endedAt.Add(30*day), *b.keepUntil(both), time.Second, "the mail's 30 days are now the longest")
	require.WithinDuration(t, endedAt.Add(2*day), *b.keepUntil(charges), time.Second)
	require.WithinDuration(t, endedAt.Add(2*day), *b.keepUntil(failed), time.Second, "an ended rollback too")
	require.WithinDuration(t, endedAt.Add(30*day+time.Hour), *b.keepUntil(mails), time.Second, "no charge in it")
	require.WithinDuration(t, endedAt.Add(90*day+time.Hour), *b.keepUntil(others), time.Second)
	// A repeat of the PUT, which changes nothing, dates them again: it is
	// how a PUT whose dating failed after its policy committed is retried.
	version := b.env.Must(http.StatusOK, "GET", "/api/v1/policies/charge.card", b.ws.Key, nil).JSON()["version"]
	_, err = b.env.App.Pool.Exec(ctx, `UPDATE effect_groups SET keep_until = $2 WHERE id = $1`, charges, endedAt.Add(60*day))
	require.NoError(t, err) // as a failed dating left it
	require.Equal(t, version, b.putPolicy("charge.card", map[string]any{"retention_days": 2})["version"], "no new version")
	require.WithinDuration(t, endedAt.Add(2*day), *b.keepUntil(charges), time.Second)

	b.putPolicy("email.send", map[string]any{"retention_days": 1})
	require.WithinDuration(t, endedAt.Add(2*day), *b.keepUntil(both), time.Second)
	require.WithinDuration(t, endedAt.Add(1*day), *b.keepUntil(mails), time.Second)
	require.WithinDuration(t, endedAt.Add(90*day+time.Hour), *b.keepUntil(others), time.Second)

	// Lowered once more together with a ceiling set on the type: both
	// apply (the groups are dated after the policy's transaction, which
	// charged the day's grants).
	b.putPolicy("charge.card", map[string]any{"retention_days": 1, "daily_budget_micros": 1_000_000})
	require.WithinDuration(t, endedAt.Add(1*day), *b.keepUntil(charges), time.Second)
	var charged int64
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count FROM gate_spend WHERE workspace_id = $1
		AND scope = 'type:charge.card'`, b.ws.ID).Scan(&charged))
	require.EqualValues(t, 3, charged, "the day's three charges counted")

	// Dated: nothing is left for the sweeper to date (groups.retention_lowered)
	// but the final passes (migration 0079).
	require.Zero(t, b.groupsToDate())

	// The next pass after the new dates deletes them; the other keeps its.
	b.clock.Set(endedAt.Add(2*day + time.Hour))
	sweep()
	for _, g := range []string{both, charges, mails, failed} {
		b.requireKept(false, "/api/v1/groups/"+g)
	}
	b.requireKept(true, "/api/v1/groups/"+others)
}

// A policy write that lowers a retention waits for a pass holding one of
// the groups it dates again, then dates what the pass left: a pass reads
// the policies of the day after it has locked its groups, so one that
// dated a group by the retention being lowered committed first, and is
// corrected (review). It dates the groups once the policy is committed,
// holding nothing else: not the type's surge turn (which a grouped begin
// waits for holding its group), which a write changing surge_action takes.
// Not parallel, in its own era (1941).
func TestLoweringARetentionWaitsForAPassHoldingAGroup(t *testing.T) {
	lowerWhileAPassHoldsAGroup(t, 1941, nil)
}

// Under an Idempotency-Key too, where the policy's transaction is the
// request's and commits with its kept answer: the groups are dated once
// that commits (db.AfterCommit), holding nothing else (joined, they were
// dated in the request's transaction, behind the surge turn it holds to its
// end). Not parallel, in its own era (1943).
func TestLoweringARetentionUnderAnIdempotencyKeyWaitsForAPassHoldingAGroup(t *testing.T) {
	lowerWhileAPassHoldsAGroup(t, 1943, http.Header{"Idempotency-Key": {"lower-retention"}})
}

// lowerWhileAPassHoldsAGroup lowers a type's retention, sending header
// with the PUT, while a pass holds a group of the type, in era year.
func lowerWhileAPassHoldsAGroup(t *testing.T, year int, header http.Header) {
	b, _ := inEra(t, year)
	ctx := context.Background()
	b.putPolicy("charge.card", map[string]any{"retention_days": 60, "surge_per_hour": 1000, "surge_action": "deny"})
	endedAt := b.clock.Now()
	g, _ := b.committedGroup("charge.card")

	pass := b.holding(`UPDATE effect_groups SET keep_until = $2 WHERE id = $1`, g, endedAt.Add(61*24*time.Hour))
	var passPID uint32
	require.NoError(t, pass.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&passPID))
	lowered := make(chan int, 1)
	go func() {
		lowered <- b.env.DoWith("PUT", "/api/v1/policies/charge.card", b.ws.Key, header,
			map[string]any{"retention_days": 2, "surge_action": "monitor"}).Status
	}()
	// Until the write waits on the pass's row (a fixed 300 ms was too
	// short on a loaded machine: the write had not yet let the surge turn
	// go when it was tried below).
	var early atomic.Int64
	require.Eventually(t, func() bool {
		select {
		case status := <-lowered:
			early.Store(int64(status))
			return true
		default:
		}
		var waiting bool
		return b.env.App.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))`,
			passPID).Scan(&waiting) == nil && waiting
	}, 10*time.Second, 5*time.Millisecond, "the policy write waits for the pass holding the group")
	require.Zero(t, early.Load(), "the policy write did not wait for the pass holding the group")
	turn, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	var free bool
	require.NoError(t, turn.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended('surge:' || $1 || ':charge.card', 0))`,
		b.ws.ID).Scan(&free))
	require.NoError(t, turn.Rollback(ctx))
	require.True(t, free, "the surge turn is free while the groups wait")
	require.Equal(t, "monitor", b.env.Must(http.StatusOK, "GET", "/api/v1/policies/charge.card", b.ws.Key, nil).JSON()["surge_action"],
		"the policy is committed")
	require.NoError(t, pass.Commit(ctx))
	require.Equal(t, http.StatusOK, <-lowered)
	require.WithinDuration(t, endedAt.Add(2*24*time.Hour), *b.keepUntil(g), time.Second)
}

// A lowered retention whose dating of the groups failed after the policy
// committed is dated by the sweeper (groups.retention_lowered): under an
// Idempotency-Key the failure was only logged, and a resend replays the
// kept answer, so the groups kept the longer date for good (review). The
// pass dates a bounded batch of a type's groups at a time, from where the
// last left off, and then forgets the type. Not parallel, in its own era
// (1912); the trigger that fails the dating is on the package database.
func TestTheSweeperDatesTheGroupsALoweredRetentionLeft(t *testing.T) {
	b, sweep := inEra(t, 1912)
	ctx := context.Background()
	b.putPolicy("charge.card", map[string]any{"retention_days": 60})
	endedAt := b.clock.Now()
	first, _ := b.committedGroup("charge.card")
	second, _ := b.committedGroup("charge.card")
	allow := apitest.Refuse(t, "BEFORE UPDATE ON effect_groups", "OLD.id IN ('"+first+"', '"+second+"')")
	lower := func() {
		require.Equal(t, http.StatusOK, b.env.DoWith("PUT", "/api/v1/policies/charge.card", b.ws.Key,
			http.Header{"Idempotency-Key": {"lower"}}, map[string]any{"retention_days": 2}).Status)
	}
	lower()
	allow()
	lower() // replayed: dates nothing
	for _, g := range []string{first, second} {
		require.WithinDuration(t, endedAt.Add(60*24*time.Hour), *b.keepUntil(g), time.Second, "the dating failed")
	}

	dated := func() (n int) {
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM effect_groups WHERE id = ANY($1)
			AND keep_until < $2`, []string{first, second}, endedAt.Add(3*24*time.Hour)).Scan(&n))
		return n
	}
	left := b.groupsToDate
	gate := b.env.App.Server.Gate
	_, err := gate.SweepGroupsToDate(ctx, b.clock.Now(), 100, 1) // a batch of one group
	require.NoError(t, err)
	require.Equal(t, 1, dated())
	require.Equal(t, 1, left(), "the type is still to date")
	_, err = gate.SweepGroupsToDate(ctx, b.clock.Now(), 100, 1)
	require.NoError(t, err)
	require.Equal(t, 2, dated())
	_, err = gate.SweepGroupsToDate(ctx, b.clock.Now(), 100, 1)
	require.NoError(t, err)
	require.Zero(t, left(), "forgotten once every group is dated")
	require.WithinDuration(t, endedAt.Add(2*24*time.Hour), *b.keepUntil(second), time.Second)

	b.clock.Set(endedAt.Add(2*24*time.Hour + time.Hour))
	sweep()
	b.requireKept(false, "/api/v1/groups/"+first, "/api/v1/groups/"+second)
}

// Two sweepers dating at once (groups.retention_lowered) date a type's
// batch once and count it once: each dated and counted the batch the
// other did, the second after waiting for the first's locks (review). The
// second passes over a type the first is dating, waiting for none of its
// locks. A pass counts only the groups whose date it changed: a group
// another type keeps longer was counted at every lowering, dated the same.
// Not parallel, in its own era (1913); the trigger that fails the policy
// write's dating is on the package database.
func TestTwoSweepersDateALoweredRetentionsGroupsOnce(t *testing.T) {
	b, _ := inEra(t, 1913)
	ctx := context.Background()
	b.putPolicy("charge.card", map[string]any{"retention_days": 60})
	b.putPolicy("email.send", map[string]any{"retention_days": 30})
	endedAt := b.clock.Now()
	mixed, _ := b.committedGroup("charge.card", "email.send")
	alsoMixed, _ := b.committedGroup("email.send", "charge.card")
	charges, _ := b.committedGroup("charge.card")
	b.lowerLeavingGroupsToDate("charge.card", 2)

	gate := b.env.App.Server.Gate
	held := b.holding(`SELECT 1 FROM effect_groups WHERE id = $1 FOR UPDATE`, charges)
	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, held))
	type pass struct {
		n   int
		err error
	}
	run := func() (<-chan struct{}, <-chan pass) {
		done, out := make(chan struct{}), make(chan pass, 1)
		go func() {
			defer close(done)
			n, err := gate.SweepGroupsToDate(ctx, b.clock.Now(), 100, 100)
			out <- pass{n, err}
		}()
		return done, out
	}
	firstDone, first := run()
	waits.Waiting(firstDone, "the first pass waits for the held group")
	secondDone, second := run()
	require.False(t, waits.Wait(secondDone, "the second pass answers or waits"),
		"the second pass passes over the type the first is dating")
	require.NoError(t, held.Rollback(ctx))
	one, two := <-first, <-second
	require.NoError(t, one.err)
	require.NoError(t, two.err)
	require.Equal(t, 3, one.n, "the first pass dates the three groups")
	require.Zero(t, two.n, "the second dates none of them")
	require.Zero(t, b.groupsToDate())
	require.WithinDuration(t, endedAt.Add(30*24*time.Hour), *b.keepUntil(mixed), time.Second)
	require.WithinDuration(t, endedAt.Add(30*24*time.Hour), *b.keepUntil(alsoMixed), time.Second)
	require.WithinDuration(t, endedAt.Add(2*24*time.Hour), *b.keepUntil(charges), time.Second)

	// Recorded again (the same PUT's record, its dating lost), the mixed
	// groups read as ones to shorten (kept past 2 days) and are dated the
	// same: none is counted.
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE gate_groups_to_date SET batched = false
		WHERE workspace_id = $1 AND effect_type = 'charge.card'`, b.ws.ID)
	require.NoError(t, err)
	n, err := gate.SweepGroupsToDate(ctx, b.clock.Now(), 100, 100)
	require.NoError(t, err)
	require.Zero(t, n, "no group's date changed")
	require.Zero(t, b.groupsToDate())
	require.WithinDuration(t, endedAt.Add(30*24*time.Hour), *b.keepUntil(mixed), time.Second)
	b.sweptAt(endedAt.Add(31*24*time.Hour), mixed, alsoMixed, charges)
}

// sweptAt runs a retention pass at now that deletes groups (so that no
// later test's pass, in a later era, counts them).
func (b *bundle) sweptAt(now time.Time, groups ...string) {
	b.t.Helper()
	b.clock.Set(now)
	_, err := b.env.App.Server.Gate.SweepRetention(context.Background(), now, 1000)
	require.NoError(b.t, err)
	for _, g := range groups {
		b.requireKept(false, "/api/v1/groups/"+g)
	}
}

// A policy write dates the groups its lowered retention shortens batch
// after batch, each in a transaction of its own, and no more than its
// bound of batches: the sweeper dates the rest (it took every group of the
// type in one transaction, however many). Not parallel, in its own era
// (1914).
func TestLoweringARetentionDatesItsGroupsInBoundedBatches(t *testing.T) {
	b, _ := inEra(t, 1914)
	ctx := context.Background()
	gate.SetDatingBatches(b.env.App.Server.Gate, 2, 2)
	b.putPolicy("charge.card", map[string]any{"retention_days": 60})
	endedAt := b.clock.Now()
	var groups []string
	for range 5 {
		g, _ := b.committedGroup("charge.card")
		groups = append(groups, g)
	}
	dated := func(days int) (n int) {
		for _, g := range groups {
			if off := b.keepUntil(g).Sub(endedAt.Add(time.Duration(days) * 24 * time.Hour)); off.Abs() < time.Second {
				n++
			}
		}
		return n
	}
	b.putPolicy("charge.card", map[string]any{"retention_days": 2})
	require.Equal(t, 4, dated(2), "two batches of two")
	require.Equal(t, 1, b.groupsToDate(), "the rest left to the sweeper")
	// The same PUT again dates the rest, and forgets the type.
	b.putPolicy("charge.card", map[string]any{"retention_days": 2})
	require.Equal(t, 5, dated(2))
	require.Zero(t, b.groupsToDate())

	b.putPolicy("charge.card", map[string]any{"retention_days": 1})
	require.Equal(t, 4, dated(1))
	require.Equal(t, 1, b.groupsToDate())
	n, err := b.env.App.Server.Gate.SweepGroupsToDate(ctx, b.clock.Now(), 100, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 5, dated(1))
	require.Zero(t, b.groupsToDate())
	b.sweptAt(endedAt.Add(2*24*time.Hour), groups...)
}

// A group whose end read the policies before a policy write lowering a
// retention of its types committed, and that committed only after the
// write's dating had read the type's groups (not ended in the dating's
// snapshot, it was not among them), is dated by the lowered retention in
// the dating's final pass (migration 0079), once that is due: the dating
// forgot the type, and the group kept the longer date for good, past the
// customer's lowered retention (review). Its commit and its rollback's end
// are each held, their statement having dated the group, by a trigger
// waiting for a lock the test holds. Not parallel, in its own era (1915);
// the trigger is on the package database.
func TestAGroupEndingAsItsRetentionIsLoweredIsDatedByIt(t *testing.T) {
	b, sweep := inEra(t, 1915)
	ctx := context.Background()
	day := 24 * time.Hour
	b.putPolicy("charge.card", map[string]any{"retention_days": 60})
	b.putPolicy("email.retract", map[string]any{"retention_days": 1})
	endedAt := b.clock.Now()
	step := func(g string) map[string]any {
		s := groupStep(g, email(key("step")), nil)
		s["effect_type"] = "charge.card"
		return b.executedAs("succeeded", s)
	}
	committed := b.newGroup("order", "")
	step(committed)
	unwound := b.newGroup("order", "")
	undone := step(unwound)
	require.Equal(t, "unwinding",
		b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+unwound+"/unwind", b.ws.Key, nil).JSON()["state"])
	retraction := b.mustBegin("execute", map[string]any{"effect_type": "email.retract",
		"idempotency_key": key("retract"), "compensates_effect_id": undone["effect_id"]})

	ends := []struct {
		group string
		end   func() int
	}{
		{committed, func() int { return b.env.Do("POST", "/api/v1/groups/"+committed+"/commit", b.ws.Key, nil).Status }},
		{unwound, func() int { // the report ends the rollback
			return b.report(str(retraction["effect_id"]), str(retraction["lease_token"]), "succeeded", nil).Status
		}},
	}
	read := 60 // the retention before each lowering
	for i, e := range ends {
		held := holdGroupEnd(t, b, e.group)
		waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, held))
		done, status := make(chan struct{}), make(chan int, 1)
		go func() {
			defer close(done)
			status <- e.end()
		}()
		waits.Waiting(done, "the group's end, its statement run, waits for the test")
		b.putPolicy("charge.card", map[string]any{"retention_days": 10 - i})
		require.NoError(t, held.Rollback(ctx))
		require.Equal(t, http.StatusOK, <-status)
		require.WithinDuration(t, endedAt.Add(time.Duration(read)*day), *b.keepUntil(e.group), time.Second,
			"dated by the policy its end read")
		read = 10 - i
	}
	require.Zero(t, b.groupsToDate(), "the dating is done but for its final pass")

	svc := b.env.App.Server.Gate
	n, err := svc.SweepGroupsToDate(ctx, b.clock.Now(), 100, 100)
	require.NoError(t, err)
	require.Zero(t, n, "the final pass is not due yet")
	// Due, a batch of one group a pass: the committed group (dated by the
	// second lowering's batches, as it had ended by then), the unwound one
	// (in either order: they ended at one instant), and an empty batch.
	// (email.retract's first policy lowered its default 90 days: its final
	// pass runs beside; whichever pass reaches the unwound group, it is
	// dated once.) A group that ended after final_at is not read: the
	// pass would chase a busy workspace's ends, never done.
	b.clock.Add(gate.EndsInFlight + time.Second)
	later, _ := b.committedGroup("charge.card")
	records := func() (n int) {
		require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM gate_groups_to_date
			WHERE workspace_id = $1 AND effect_type = 'charge.card'`, b.ws.ID).Scan(&n))
		return n
	}
	dated := 0
	for range 3 {
		require.Equal(t, 1, records(), "the final pass is not done")
		n, err = svc.SweepGroupsToDate(ctx, b.clock.Now(), 100, 1)
		require.NoError(t, err)
		dated += n
	}
	require.Equal(t, 1, dated, "the unwound group dated")
	require.Zero(t, records(), "forgotten after its final pass")
	for _, g := range []string{committed, unwound} {
		require.WithinDuration(t, endedAt.Add(9*day), *b.keepUntil(g), time.Second, "dated by the lowered retention")
	}

	b.clock.Set(endedAt.Add(9*day + time.Hour))
	sweep()
	b.requireKept(false, "/api/v1/groups/"+committed, "/api/v1/groups/"+unwound, "/api/v1/groups/"+later)
}

// A retention lowered again while the type's record waits for its final
// pass (its groups dated, batched) dates every group of the type again,
// not only those the final pass reads: a group that ended before that
// pass's window kept the date of the first lowering. Not parallel, in its
// own era (1916).
func TestLoweringARetentionAgainBeforeTheFinalPassDatesEveryGroup(t *testing.T) {
	b, _ := inEra(t, 1916)
	day := 24 * time.Hour
	b.putPolicy("charge.card", map[string]any{"retention_days": 60})
	endedAt := b.clock.Now()
	g, _ := b.committedGroup("charge.card")
	b.clock.Add(time.Hour)
	b.putPolicy("charge.card", map[string]any{"retention_days": 30})
	require.WithinDuration(t, endedAt.Add(30*day), *b.keepUntil(g), time.Second)
	require.Zero(t, b.groupsToDate(), "only the final pass is left")
	b.clock.Add(time.Minute)
	b.putPolicy("charge.card", map[string]any{"retention_days": 10})
	require.WithinDuration(t, endedAt.Add(10*day), *b.keepUntil(g), time.Second, "dated again by the second lowering")
	b.sweptAt(endedAt.Add(10*day+time.Hour), g)
}

// A retention lowered again after a raise, while its type's groups were
// still dated in batches, dates the type's groups from the first again:
// the batches went on from where they were (after_id), and a group they
// had passed, which a retention pass reaching it due had kept by the
// raised retention since (a pass reads the policies of the day), kept the
// raised date past the retention lowered to (review). Each group is dated
// by the policy in force, not the lowest retention recorded (30 days).
// Not parallel, in its own era (1917).
func TestLoweringARetentionAgainAfterARaiseDatesTheGroupsTheBatchesPassed(t *testing.T) {
	b, sweep := inEra(t, 1917)
	day := 24 * time.Hour
	endedAt, groups := lengthenedByARaise(t, b, sweep, 2)
	gate.SetDatingBatches(b.env.App.Server.Gate, 100, 100)
	b.putPolicy("charge.card", map[string]any{"retention_days": 45})
	for _, g := range groups {
		require.WithinDuration(t, endedAt.Add(45*day), *b.keepUntil(g), time.Second, "dated by the retention in force")
	}
	require.Zero(t, b.groupsToDate())
	b.sweptAt(endedAt.Add(45*day+time.Hour), groups...)
}

// A lowering recorded while a batch of its type's groups is being dated
// (the sweeper's, having read the record, waiting for a group a pass
// holds) restarts the dating all the same: the batch, once done, moved
// the record on past its groups when the record's days were those it
// read, which a lowering to the same retention after a raise leaves
// unchanged, and the groups before them kept the raised date (review). A
// batch moves the record on only while no restart was recorded since
// (restarts, migration 0080). Not parallel, in its own era (1918).
func TestALoweringRecordedWhileABatchIsDatedRestartsTheDating(t *testing.T) {
	b, sweep := inEra(t, 1918)
	ctx := context.Background()
	day := 24 * time.Hour
	svc := b.env.App.Server.Gate
	endedAt, groups := lengthenedByARaise(t, b, sweep, 3)
	held := b.holding(`SELECT 1 FROM effect_groups WHERE id = $1 FOR UPDATE`, groups[1])
	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, held))
	done, swept := make(chan struct{}), make(chan error, 1)
	go func() {
		defer close(done)
		_, err := svc.SweepGroupsToDate(ctx, b.clock.Now(), 100, 1)
		swept <- err
	}()
	waits.Waiting(done, "the sweeper's batch, the record read, waits for the held group")
	gate.SetDatingBatches(svc, 1, 0) // the write dates none itself: the sweeper does
	b.putPolicy("charge.card", map[string]any{"retention_days": 30})
	require.NoError(t, held.Rollback(ctx))
	require.NoError(t, <-swept)
	for range 2 * len(groups) {
		if b.groupsToDate() == 0 {
			break
		}
		_, err := svc.SweepGroupsToDate(ctx, b.clock.Now(), 100, 1)
		require.NoError(t, err)
	}
	require.Zero(t, b.groupsToDate())
	for _, g := range groups {
		require.WithinDuration(t, endedAt.Add(30*day), *b.keepUntil(g), time.Second, "dated by the retention in force")
	}
	b.sweptAt(endedAt.Add(30*day+2*time.Hour), groups...)
}

// lengthenedByARaise commits n groups of charge.card (60 days) at
// endedAt, and answers them in id order once its retention was lowered to
// 30 days, dating the first group alone (a batch of one: the others are
// left to the sweeper), and raised back to 60, and a retention pass
// (sweep) reaching the first group due, 30 days on, kept it by the raised
// retention.
func lengthenedByARaise(t *testing.T, b *bundle, sweep func() int, n int) (endedAt time.Time, groups []string) {
	t.Helper()
	day := 24 * time.Hour
	b.putPolicy("charge.card", map[string]any{"retention_days": 60})
	endedAt = b.clock.Now()
	groups = b.committedGroupsInIDOrder(n, "charge.card")
	gate.SetDatingBatches(b.env.App.Server.Gate, 1, 1)
	b.putPolicy("charge.card", map[string]any{"retention_days": 30})
	require.WithinDuration(t, endedAt.Add(30*day), *b.keepUntil(groups[0]), time.Second, "the first batch")
	require.WithinDuration(t, endedAt.Add(60*day), *b.keepUntil(groups[1]), time.Second, "left to the sweeper")
	b.putPolicy("charge.card", map[string]any{"retention_days": 60}) // raised: dates nothing
	b.clock.Set(endedAt.Add(30*day + time.Hour))
	sweep()
	require.WithinDuration(t, endedAt.Add(60*day), *b.keepUntil(groups[0]), time.Second,
		"a pass keeps the group due by the raised retention")
	return endedAt, groups
}

// committedGroupsInIDOrder is n committed groups of b's workspace, each
// with a succeeded step of each of types, in id order (the order the
// dating's batches read them; made at one instant, their ids are not).
func (b *bundle) committedGroupsInIDOrder(n int, types ...string) []string {
	b.t.Helper()
	var groups []string
	for range n {
		g, _ := b.committedGroup(types...)
		groups = append(groups, g)
	}
	slices.Sort(groups)
	return groups
}

// holdGroupEnd makes the end of group g (its update to an ended state)
// wait, once its statement has run, for a lock the transaction it answers
// holds (a trigger on the package database, dropped when t ends).
func holdGroupEnd(t *testing.T, b *bundle, g string) pgx.Tx {
	t.Helper()
	lock := `pg_advisory_xact_lock(hashtextextended('test_hold_end:' || ` + "'" + g + "'" + `, 0))`
	held := b.holding(`SELECT ` + lock)
	_, err := b.env.App.Pool.Exec(context.Background(), `
		DROP TRIGGER IF EXISTS test_hold_end ON effect_groups;
		CREATE OR REPLACE FUNCTION test_hold_end() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		    PERFORM `+lock+`;
		    RETURN NULL;
		END $$;
		CREATE TRIGGER test_hold_end AFTER UPDATE ON effect_groups FOR EACH ROW
		WHEN (NEW.id = '`+g+`' AND NEW.state IN ('committed', 'unwound', 'unwind_failed')
		    AND OLD.state NOT IN ('committed', 'unwound', 'unwind_failed'))
		EXECUTE FUNCTION test_hold_end();`)
	require.NoError(t, err)
	drop := func() {
		_, err := b.env.App.Pool.Exec(context.Background(), `DROP TRIGGER IF EXISTS test_hold_end ON effect_groups;
			DROP FUNCTION IF EXISTS test_hold_end()`)
		require.NoError(t, err)
	}
	t.Cleanup(drop)
	return held
}

// lowerLeavingGroupsToDate lowers typ's retention to days in a PUT under
// an Idempotency-Key whose dating of the groups fails (refused), so that
// the sweeper has them to date.
func (b *bundle) lowerLeavingGroupsToDate(typ string, days int) {
	b.t.Helper()
	allow := apitest.Refuse(b.t, "BEFORE UPDATE ON effect_groups", "OLD.workspace_id = '"+b.ws.ID+"'")
	require.Equal(b.t, http.StatusOK, b.env.DoWith("PUT", "/api/v1/policies/"+typ, b.ws.Key,
		http.Header{"Idempotency-Key": {"lower " + typ}}, map[string]any{"retention_days": days}).Status)
	allow()
	require.Equal(b.t, 1, b.groupsToDate(), "the dating failed")
}

// groupsToDate counts b's workspace's types with groups to date in
// batches (gate_groups_to_date): not those whose only final pass is left
// (batched, migration 0079).
func (b *bundle) groupsToDate() (n int) {
	b.t.Helper()
	require.NoError(b.t, b.env.App.Pool.QueryRow(context.Background(), `SELECT count(*) FROM gate_groups_to_date
		WHERE workspace_id = $1 AND NOT batched`, b.ws.ID).Scan(&n))
	return n
}

// Groups commit and unwind in every query mode the service accepts: under
// simple_protocol, parameters arrive untyped, and "$3 + make_interval(…)"
// read the time as an interval (PgBouncer QA: every commit and unwind was a
// 500 in that mode).
func TestGroupsInSimpleProtocolMode(t *testing.T) {
	t.Parallel()
	c := newClock()
	env := apitest.Start(t, apitest.WithNow(c.Now), apitest.WithConfig(func(cfg *config.Config) {
		cfg.DBQueryExecMode = "simple_protocol"
	}))
	b := &bundle{t: t, env: env, ws: env.Signup(), clock: c}
	g, _ := b.committedGroup("email.send")
	require.Equal(t, "committed", str(b.env.Must(http.StatusOK, "GET", "/api/v1/groups/"+g, b.ws.Key, nil).JSON()["state"]))
	unwound := b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()
	require.Equal(t, "unwinding", str(unwound["state"]))
	empty := b.newGroup("empty", "")
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+empty+"/commit", b.ws.Key, nil)
}

// Retention shares each batch among the workspaces with effects to delete:
// taken in the order of its scan (by workspace id), the first workspace's
// backlog (a type's retention_days lowered from 90 to 1) filled every
// batch until it was gone, and every workspace after it kept its effects
// past their retention meanwhile (multi-tenant QA). A batch of 2 stands
// for the pass's 1,000. Not parallel, in its own era (1939).
func TestRetentionSharesEachBatchAmongWorkspaces(t *testing.T) {
	a, _ := inEra(t, 1939)
	c, ctx, env := a.clock, context.Background(), a.env
	b := &bundle{t: t, clock: c, env: env, ws: env.Signup()}
	noisy, quiet := a, b // the scan reaches the noisy workspace first
	if b.ws.ID < a.ws.ID {
		noisy, quiet = b, a
	}
	noisy.putPolicy("email.send", map[string]any{"retention_days": 1})
	quiet.putPolicy("email.send", map[string]any{"retention_days": 1})
	var backlog []string
	for range 4 {
		backlog = append(backlog, str(noisy.executedAs("succeeded", email(key("backlog")))["effect_id"]))
	}
	kept := str(quiet.executedAs("succeeded", email(key("kept")))["effect_id"])
	c.Add(25 * time.Hour)
	left := func(ids ...string) (n int) {
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE id = ANY($1)`, ids).Scan(&n))
		return n
	}

	batch := func() (int, error) { return env.App.Server.Gate.SweepRetention(ctx, c.Now(), 2) }
	passes(t, batch, 2)
	require.Zero(t, left(kept), "the quiet workspace's effect went in the first batch")
	require.Equal(t, 3, left(backlog...))
	passes(t, batch, 2, 1, 0) // alone, the backlog fills each batch
}

// A group whose purge fails holds no ungrouped effect past its retention,
// and an ungrouped effect whose purge fails holds no group: the purge that
// fails is rolled back alone, the other is done in the same pass all the
// same, and the failure is answered (sweeper review: a group failing on
// every pass, a statement timeout over a large one say, failed the whole
// task each time, and no ungrouped effect was deleted again; review: the
// ungrouped purge failing so rolled every group's purge back with it). Not
// parallel, in their own eras (1948, 1911); the trigger that fails the
// delete is on the package database.
func TestRetentionPurgesEachSideWhenTheOtherFails(t *testing.T) {
	for _, failing := range []string{"group", "ungrouped"} {
		t.Run(failing, func(t *testing.T) {
			b, sweep := inEra(t, map[string]int{"group": 1948, "ungrouped": 1911}[failing])
			ctx := context.Background()
			b.putPolicy("email.send", map[string]any{"retention_days": 1})
			g, _, step := b.groupWithStep("order", key("grouped"))
			b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/commit", b.ws.Key, nil)
			alone := str(b.executedAs("succeeded", email(key("alone")))["effect_id"])
			b.clock.Add(100 * 24 * time.Hour) // past every retention here
			grouped := []string{"/api/v1/groups/" + g, "/api/v1/effects/" + str(step["effect_id"])}
			refused, kept, gone := "BEFORE DELETE ON effect_groups|OLD.id = '"+g+"'", grouped, []string{"/api/v1/effects/" + alone}
			if failing == "ungrouped" {
				refused, kept, gone = "BEFORE DELETE ON effects|OLD.id = '"+alone+"'", gone, grouped
			}
			event, when, _ := strings.Cut(refused, "|")
			allow := apitest.Refuse(t, event, when)

			n, err := b.env.App.Server.Gate.SweepRetention(ctx, b.clock.Now(), 1000)
			require.ErrorContains(t, err, "test_refuse", "the failure is answered")
			require.GreaterOrEqual(t, n, 1, "the other side's effect (and other tests' effects past their retention: the pass is database-wide)")
			b.requireKept(false, gone...)
			b.requireKept(true, kept...)

			allow()
			b.clock.Add(time.Hour) // a group put off an hour (TestRetentionGoesOnPastAGroupWhosePurgeFails)
			sweep()
			b.requireKept(false, kept...)
		})
	}
}

// A group whose purge fails holds no group after it: the batch is purged
// again group by group, the failing group is put off (its keep_until, an
// hour on) and its error answered, and the next pass reads past it; once
// due again it is tried again (sweeper review: the batch reads the groups
// due first, so one failing on every pass, a statement timeout over a
// large group say, kept every later group for good). The failure is the
// group's delete, then its effects' (which go under the group's
// savepoint). Not parallel, in its own eras (1997, 1998); the trigger that
// fails the purge is on the package database.
func TestRetentionGoesOnPastAGroupWhosePurgeFails(t *testing.T) {
	for i, refused := range []string{"BEFORE DELETE ON effect_groups|OLD.id = '%s'",
		"BEFORE DELETE ON effects|OLD.group_id = '%s'"} {
		event, when, _ := strings.Cut(refused, "|")
		t.Run(event, func(t *testing.T) {
			b, sweep := inEra(t, 1997+i)
			ctx := context.Background()
			b.putPolicy("email.send", map[string]any{"retention_days": 1})
			failing, _, failingStep := b.groupWithStep("order", key("failing"))
			b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+failing+"/commit", b.ws.Key, nil)
			b.clock.Add(time.Hour) // due in this order: the failing one is read first
			later, _, laterStep := b.groupWithStep("order", key("later"))
			b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+later+"/commit", b.ws.Key, nil)
			b.clock.Add(100 * 24 * time.Hour) // past every retention here
			allow := apitest.Refuse(t, event, fmt.Sprintf(when, failing))

			_, err := b.env.App.Server.Gate.SweepRetention(ctx, b.clock.Now(), 1000)
			require.ErrorContains(t, err, "test_refuse", "the failing group's error is answered")
			b.requireKept(true, "/api/v1/groups/"+failing, "/api/v1/effects/"+str(failingStep["effect_id"]))
			b.requireKept(false, "/api/v1/groups/"+later, "/api/v1/effects/"+str(laterStep["effect_id"]))

			b.clock.Add(time.Minute)
			sweep() // the failing group is put off: the next pass reads past it, and answers no error
			b.requireKept(true, "/api/v1/groups/"+failing)

			allow()
			b.clock.Add(time.Hour)
			sweep()
			b.requireKept(false, "/api/v1/groups/"+failing, "/api/v1/effects/"+str(failingStep["effect_id"]))
		})
	}
}

// Purged one by one once their batch failed, the groups share the batch's
// steps as the batch's do: those starting within them go, each whole, the
// last perhaps past them, and the rest wait for the next pass (review:
// each group alone went whole, so a failed batch deleted a batch's worth
// of groups of any size in one pass). A limit of 40 stands for the pass's
// 1,000: a batch of 4 groups, 40 steps; the failing group's step, then
// three of 20 each, due in that order: one by one, the first two go (40
// steps), the third waits. Not parallel, in its own era (1903: no other
// test's group is due); the trigger that fails the purge is on the
// package database.
func TestRetentionGroupsPurgedApartShareTheSteps(t *testing.T) {
	b, _ := inEra(t, 1903)
	ctx := context.Background()
	failing, _, _ := b.groupWithStep("order", key("failing"))
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+failing+"/commit", b.ws.Key, nil)
	var groups []string
	for range 3 {
		b.clock.Add(time.Minute) // due in this order
		g := b.newGroup("order", key("big"))
		for range 20 {
			b.executedAs("succeeded", groupStep(g, email(key("step")), nil))
		}
		b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/commit", b.ws.Key, nil)
		groups = append(groups, g)
	}
	b.clock.Add(100 * 24 * time.Hour) // past every retention here
	apitest.Refuse(t, "BEFORE DELETE ON effect_groups", fmt.Sprintf("OLD.id = '%s'", failing))

	_, err := b.env.App.Server.Gate.SweepRetention(ctx, b.clock.Now(), 40)
	require.ErrorContains(t, err, "test_refuse")
	b.requireKept(false, "/api/v1/groups/"+groups[0], "/api/v1/groups/"+groups[1])
	b.requireKept(true, "/api/v1/groups/"+groups[2], "/api/v1/groups/"+failing)
}

// A group whose purge failed alone is put off without waiting for a group
// another transaction holds (another pass, which purges it or puts it
// off): the failed purge's savepoint let go of the group's lock, and two
// passes putting off each other's groups waited for each other. One not
// held is moved on, never back.
func TestPuttingOffAGroupDoesNotWaitForOneHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool := b.env.App.Pool
	g, _ := b.committedGroup("email.send")
	before := b.keepUntil(g)
	require.NotNil(t, before)
	later := before.Add(time.Hour)
	holder := b.holding(`SELECT 1 FROM effect_groups WHERE id = $1 FOR UPDATE`, g)
	waits := apitest.NewLockWaits(t, pool, apitest.BackendPID(t, holder))
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		_, err = pool.Exec(ctx, gate.SQLPutOffGroup, g, later)
	}()
	require.False(t, waits.Wait(done, "the put-off passes over the group held"))
	require.NoError(t, err)
	require.NoError(t, holder.Rollback(ctx))
	require.True(t, before.Equal(*b.keepUntil(g)), "passed over")

	_, err = pool.Exec(ctx, gate.SQLPutOffGroup, g, later)
	require.NoError(t, err)
	require.True(t, later.Equal(*b.keepUntil(g)), "moved on")
	_, err = pool.Exec(ctx, gate.SQLPutOffGroup, g, before)
	require.NoError(t, err)
	require.True(t, later.Equal(*b.keepUntil(g)), "never back")
}

package gate_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/gate"
)

// deployedEra is inEra with its instance's retention passes as a
// deployment runs them (gate.CheckRetentionAsDeployed): a pair is read once
// it may have an effect due, and the pairs gate_retention_checks does not
// know are found in rounds, an hour apart.
func deployedEra(t *testing.T, year int) (*bundle, func() int) {
	t.Helper()
	b, sweep := inEra(t, year)
	b.env.App.Server.Gate.CheckRetentionAsDeployed(5000)
	return b, sweep
}

// checkAt is the next check of b's workspace's pair of effectType
// (gate_retention_checks): its time, -infinity as the zero time, and
// whether the pair has a row.
func (b *bundle) checkAt(effectType string) (time.Time, bool) {
	b.t.Helper()
	var at *time.Time
	err := b.env.App.Pool.QueryRow(context.Background(), `SELECT CASE WHEN isfinite(check_at) THEN check_at END
		FROM gate_retention_checks WHERE workspace_id = $1 AND effect_type = $2`, b.ws.ID, effectType).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false
	}
	require.NoError(b.t, err)
	if at == nil {
		return time.Time{}, true
	}
	return *at, true
}

// exists says whether effect id is still there.
func (b *bundle) exists(id any) bool {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.env.App.Pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE id = $1`,
		str(id)).Scan(&n))
	return n == 1
}

// A deployed retention pass reads a pair (workspace, effect type) once it
// may have an effect due, not every pair on every batch (sweeper
// scalability QA): a pair it checked with nothing due is read again at the
// earliest due time of its ended effects, or its retention on less
// endsInFlight (effects that end later are due that long after at the
// earliest), and its effects go once due, never before. A new pair is
// found by the next round of discovery (an hour after the last), not by
// every batch; its effects, due a day after they ended at the earliest, go
// once due. Not parallel, in its own era (1921).
func TestRetentionReadsAPairOnceItMayHaveEffectsDue(t *testing.T) {
	b, sweep := deployedEra(t, 1921)
	c := b.clock
	t0 := c.Now()
	b.putPolicy("sms.send", map[string]any{"retention_days": 1})
	short := b.executedAs("succeeded", sms(key("a-day")))

	sweep()
	at, ok := b.checkAt("sms.send")
	require.True(t, ok, "found and checked")
	require.True(t, at.Equal(t0.Add(24*time.Hour-gate.EndsInFlight)), "checked again a day on, less endsInFlight: %s", at)

	c.Add(24*time.Hour - time.Second)
	sweep()
	require.True(t, b.exists(short["effect_id"]), "a second before its retention passed")
	at, _ = b.checkAt("sms.send")
	require.True(t, at.Equal(t0.Add(24*time.Hour)), "checked again when it is due: %s", at)

	c.Add(2 * time.Second)
	sweep()
	require.False(t, b.exists(short["effect_id"]), "its retention passed")
	_, ok = b.checkAt("sms.send")
	require.False(t, ok, "no ended effect left: the pair is forgotten")

	// A new pair: no batch looks for it (that sweep began a round of
	// discovery), the round due an hour after the last finds it.
	t1 := c.Now()
	mail := b.executedAs("succeeded", email(key("new-pair")))
	sweep()
	_, ok = b.checkAt("email.send")
	require.False(t, ok, "no round within the hour: batches do not look for new pairs")
	c.Add(gate.RetentionDiscoveryEvery)
	sweep()
	at, ok = b.checkAt("email.send")
	require.True(t, ok, "the next round found the pair")
	require.True(t, at.Equal(t1.AddDate(0, 0, 90)), "checked again when its effect is due: %s", at)

	c.Add(t1.AddDate(0, 0, 90).Sub(c.Now()) - time.Second)
	sweep()
	require.True(t, b.exists(mail["effect_id"]), "a second before its 90 days passed")
	c.Add(2 * time.Second)
	sweep()
	require.False(t, b.exists(mail["effect_id"]), "its 90 days passed")
}

// A policy write that lowers a type's retention, or a first policy under
// the 90-day default, makes its pair due for a check at once: its
// effects due under the new retention go at the next pass, not when the
// check stored under the old one comes (up to a day later). Not parallel,
// in its own era (1923).
func TestLoweringARetentionChecksItsPairAtOnce(t *testing.T) {
	b, sweep := deployedEra(t, 1923)
	c := b.clock
	b.putPolicy("sms.send", map[string]any{"retention_days": 30})
	mail := b.executedAs("succeeded", email(key("kept-90-days")))
	text := b.executedAs("succeeded", sms(key("kept-30-days")))
	c.Add(time.Hour)
	sweep()
	for _, typ := range []string{"email.send", "sms.send"} {
		at, ok := b.checkAt(typ)
		require.True(t, ok, typ)
		require.True(t, at.After(c.Now().Add(23*time.Hour)), "%s: not read again for nearly a day: %s", typ, at)
	}

	c.Add(time.Hour)
	b.putPolicy("email.send", map[string]any{"retention_days": 1}) // a first policy
	b.putPolicy("sms.send", map[string]any{"retention_days": 1})   // lowered
	for _, typ := range []string{"email.send", "sms.send"} {
		at, ok := b.checkAt(typ)
		require.True(t, ok && at.IsZero(), "%s: due at once (-infinity): %s", typ, at)
	}
	c.Add(22*time.Hour + time.Minute) // a minute past the day since they ended
	sweep()
	require.False(t, b.exists(mail["effect_id"]), "purged by the next pass")
	require.False(t, b.exists(text["effect_id"]))
}

// A deployed batch reads the pairs due for a check, not every pair: 3,000
// idle pairs (an effect each, none due for months, each checked and due
// for its next check in a day) cost it no index scan of effects, where a
// scan of every pair cost at least one each on every batch (sweeper
// scalability QA: 35,000 pairs, 211,720 buffers a batch). The same batch
// with those pairs due scans effects thousands of times: the count sees
// the probes. Not parallel, in its own era (1925): the batch reads the
// pairs of every workspace due at its now.
func TestARetentionBatchReadsNotEveryIdlePair(t *testing.T) {
	b, _ := inEra(t, 1925)
	ctx := context.Background()
	now := b.clock.Now()
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	const idle = 3000
	_, err = tx.Exec(ctx, `INSERT INTO effects (id, workspace_id, effect_type, idempotency_key, fingerprint, state,
		lease_seconds, created_by_key_id, created_at, updated_at)
		SELECT 'eff_idle' || i, $1, 'idle.t' || i, 'idle-' || i, 'f', 'succeeded', 30, 'key_idle', $2::timestamptz,
			$2::timestamptz
		FROM generate_series(1, $3::int) i
		UNION ALL SELECT 'eff_due', $1, 'due.t', 'due', 'f', 'succeeded', 30, 'key_idle', $4::timestamptz, $4::timestamptz`,
		b.ws.ID, now.Add(-time.Hour), idle, now.AddDate(0, 0, -91))
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO gate_retention_checks (workspace_id, effect_type, check_at)
		SELECT $1, 'idle.t' || i, $2::timestamptz FROM generate_series(1, $3::int) i
		UNION ALL SELECT $1, 'due.t', $4::timestamptz`, b.ws.ID, now.Add(23*time.Hour), idle, now.Add(-time.Minute))
	require.NoError(t, err)
	scans := func() int {
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(sum(idx_scan + seq_scan), 0)::int
			FROM pg_stat_xact_user_tables WHERE relname = 'effects'`).Scan(&n))
		return n
	}

	before := scans()
	n, err := gate.PurgeDueChecks(ctx, tx, now, 5000)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 1, "the pair due")
	read := scans() - before
	require.Less(t, read, idle/10, "scans of effects by a batch beside %d idle pairs", idle)
	var gone bool
	require.NoError(t, tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM effects WHERE id = 'eff_due')`).Scan(&gone))
	require.True(t, gone)

	_, err = tx.Exec(ctx, `UPDATE gate_retention_checks SET check_at = $2 WHERE workspace_id = $1`, b.ws.ID,
		now.Add(-time.Minute))
	require.NoError(t, err)
	before = scans()
	_, err = gate.PurgeDueChecks(ctx, tx, now, 5000)
	require.NoError(t, err)
	require.GreaterOrEqual(t, scans()-before, idle, "the same pairs due: each probed (idle batch: %d scans)", read)
}

// The discovery of new pairs goes a chunk of pairs a run, and a round
// under way goes on at the next run whatever its now, until it has read
// every pair; then none begins before the hour is out. A round dated after
// the run's now (a clock that went back) begins again. Not parallel, in
// its own era (1932).
func TestTheDiscoveryOfNewPairsGoesOnAChunkARun(t *testing.T) {
	b, sweep := inEra(t, 1932)
	b.env.App.Server.Gate.CheckRetentionAsDeployed(1)
	ctx := context.Background()
	b.executedAs("succeeded", email(key("first")))
	b.executedAs("succeeded", sms(key("second")))
	var pairs int
	require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT DISTINCT workspace_id, effect_type
		FROM effects WHERE state IN ('succeeded', 'failed', 'denied') AND group_id IS NULL) p`).Scan(&pairs))
	found := func() bool {
		_, mail := b.checkAt("email.send")
		_, text := b.checkAt("sms.send")
		return mail && text
	}
	runs := 0
	for ; !found() && runs <= pairs+1; runs++ {
		sweep()
	}
	require.True(t, found(), "a round reads every pair, a pair a run")
	require.Greater(t, runs, 1, "a pair a run")
	for range pairs + 1 { // to the round's end
		sweep()
	}
	b.executedAs("succeeded", map[string]any{"effect_type": "push.send", "idempotency_key": key("after"),
		"payload": map[string]any{}})
	sweep()
	_, ok := b.checkAt("push.send")
	require.False(t, ok, "the round ended: none before the hour is out")

	back, sweepBack := inEra(t, 1931) // a clock that went back a year
	back.env.App.Server.Gate.CheckRetentionAsDeployed(5000)
	sweepBack()
	_, ok = b.checkAt("push.send")
	require.True(t, ok, "a round dated after the run's now begins again")
}

// A policy write that lowers a retention while a retention batch holds the
// type's pair (it locked the pair's check, read the old retention and
// stored the next check by it) waits for the batch, then makes the pair
// due: the batch's later check is not kept, and the effects the lowered
// retention made due go at the next pass. Not parallel, in its own era
// (1934).
func TestLoweringARetentionWaitsForABatchHoldingItsPair(t *testing.T) {
	b, sweep := deployedEra(t, 1934)
	ctx := context.Background()
	mail := b.executedAs("succeeded", email(key("held")))
	sweep()
	b.clock.Add(24*time.Hour + time.Minute)
	// its check due (stored at its effect's 90 days, read again as a check
	// that came)
	_, err := b.env.App.Pool.Exec(ctx, `UPDATE gate_retention_checks SET check_at = $3
		WHERE workspace_id = $1 AND effect_type = $2`, b.ws.ID, "email.send", b.clock.Now().Add(-time.Minute))
	require.NoError(t, err)
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = gate.PurgeDueChecks(ctx, tx, b.clock.Now(), 1000)
	require.NoError(t, err)

	waits := apitest.NewLockWaits(t, b.env.App.Pool, apitest.BackendPID(t, tx))
	answered := make(chan struct{})
	var r *apitest.Response
	go func() {
		defer close(answered)
		r = b.env.Do("PUT", "/api/v1/policies/email.send", b.ws.Key, map[string]any{"retention_days": 1})
	}()
	waits.Waiting(answered, "the PUT waits for the batch holding its pair")
	require.NoError(t, tx.Commit(ctx))
	<-answered
	require.Equal(t, 200, r.Status, "%s", r.Body)
	at, ok := b.checkAt("email.send")
	require.True(t, ok && at.IsZero(), "due at once (-infinity): %s", at)
	sweep()
	require.False(t, b.exists(mail["effect_id"]), "a day old, under a day's retention")
}

// A pair checked with nothing due is read again at the earliest due time
// of its ended effects, and at most its type's retention on (less
// endsInFlight: an effect that ends later is due that long after it ended
// at the earliest), not a day on whatever the retention: a batch checks
// 1,000 pairs, and at a pass a minute a daily check of every idle pair
// outran it past 1.44 million pairs with ended effects, each pair then
// read later than its effects were due (review). Not parallel, in its own
// era (1943).
func TestAnIdlePairIsReadAgainWithinItsRetention(t *testing.T) {
	b, sweep := deployedEra(t, 1943)
	c := b.clock
	t0 := c.Now()
	b.putPolicy("sms.send", map[string]any{"retention_days": 7})
	mail := b.executedAs("succeeded", email(key("kept-90-days")))
	text := b.executedAs("succeeded", sms(key("kept-7-days")))
	c.Add(time.Hour)
	sweep()
	for typ, due := range map[string]time.Time{"email.send": t0.AddDate(0, 0, 90), "sms.send": t0.AddDate(0, 0, 7)} {
		at, ok := b.checkAt(typ)
		require.True(t, ok, typ)
		require.True(t, !at.After(due), "%s: read again once its effect is due: %s, due %s", typ, at, due)
		require.True(t, at.After(c.Now().Add(6*24*time.Hour)), "%s: not read again within its retention: %s", typ,
			at)
	}
	later := b.executedAs("succeeded", email(key("ended-later")))

	c.Add(t0.AddDate(0, 0, 7).Sub(c.Now()) - time.Second)
	sweep()
	require.True(t, b.exists(text["effect_id"]), "a second before its 7 days passed")
	c.Add(2 * time.Second)
	sweep()
	require.False(t, b.exists(text["effect_id"]), "its 7 days passed")

	c.Add(t0.AddDate(0, 0, 90).Sub(c.Now()) + time.Second)
	sweep()
	require.False(t, b.exists(mail["effect_id"]), "its 90 days passed")
	require.True(t, b.exists(later["effect_id"]), "ended an hour later")
	at, _ := b.checkAt("email.send")
	require.True(t, at.After(c.Now()), "the later effect is due later: %s", at)
	c.Add(2 * time.Hour)
	sweep()
	require.False(t, b.exists(later["effect_id"]), "its 90 days passed")
}

// A batch with pairs due stores their next checks without JIT: the
// reschedule's three probes a pair are estimated pessimistically, and a
// batch of 1,000 pairs beside a million known ones was planned past
// jit_above_cost, compiling 96 functions (50 ms of its 155, review: 200,000
// effects over 3,000 pairs). Not parallel, in its own era (1944).
func TestARetentionBatchTurnsJITOff(t *testing.T) {
	b, _ := inEra(t, 1944)
	ctx := context.Background()
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SET LOCAL jit = on`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO gate_retention_checks (workspace_id, effect_type, check_at)
		VALUES ($1, 'jit.t', '-infinity')`, b.ws.ID)
	require.NoError(t, err)
	_, err = gate.PurgeDueChecks(ctx, tx, b.clock.Now(), 1000)
	require.NoError(t, err)
	var jit string
	require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('jit')`).Scan(&jit))
	require.Equal(t, "off", jit)
}

// A pair whose purge of ungrouped effects fails holds no other pair's
// effects past their retention: the failed batch is purged again pair by
// pair, the failing pair is put off (its check_at, an hour on) and its
// error answered, named by its pair, and its effects stay; once due again
// it is tried again (review: the batch reads the pairs waiting longest
// first and a failed batch moved none of them on, so a pair failing on
// every pass, a statement timeout over its backlog say, kept every pair's
// ungrouped effects for good). The workspace's other type goes, as does
// another workspace's. Deployed, the next pass reads past the failing
// pair; every pass (CheckRetentionEveryPass), discovery makes it due
// again, and each pass answers its error. Not parallel, in their own eras (1963, 1964); the trigger that
// fails the delete is on the package database.
func TestRetentionGoesOnPastAPairWhosePurgeFails(t *testing.T) {
	for i, mode := range []string{"deployed", "every pass"} {
		t.Run(mode, func(t *testing.T) {
			b, sweep := inEra(t, 1963+i)
			if mode == "deployed" {
				b.env.App.Server.Gate.CheckRetentionAsDeployed(5000)
			}
			ctx, c := context.Background(), b.clock
			other := &bundle{t: t, clock: c, env: b.env, ws: b.env.Signup()}
			failing := b.executedAs("succeeded", email(key("failing")))["effect_id"]
			sameWorkspace := b.executedAs("succeeded", sms(key("same-workspace")))["effect_id"]
			otherWorkspace := other.executedAs("succeeded", email(key("other-workspace")))["effect_id"]
			c.Add(100 * 24 * time.Hour) // past every retention here
			allow := apitest.Refuse(t, "BEFORE DELETE ON effects",
				fmt.Sprintf("OLD.workspace_id = '%s' AND OLD.effect_type = 'email.send'", b.ws.ID))
			pass := func() error {
				_, err := b.env.App.Server.Gate.SweepRetention(ctx, c.Now(), 1000)
				return err
			}

			err := pass()
			require.True(t, b.exists(failing))
			require.False(t, b.exists(sameWorkspace), "the workspace's other type goes all the same")
			require.False(t, b.exists(otherWorkspace), "another workspace's effects go all the same")
			require.ErrorContains(t, err, "test_refuse", "the failing pair's error is answered")
			require.ErrorContains(t, err, "effect type email.send of workspace "+b.ws.ID, "named by its pair")
			at, _ := b.checkAt("email.send")
			require.True(t, at.Equal(c.Now().Add(time.Hour)), "put off an hour: %s", at)

			c.Add(time.Minute)
			if mode == "deployed" {
				sweep() // the next pass reads past the failing pair, and answers no error
			} else {
				require.ErrorContains(t, pass(), "test_refuse", "made due again by discovery at every pass")
			}
			require.True(t, b.exists(failing))

			allow()
			c.Add(time.Hour)
			sweep()
			require.False(t, b.exists(failing), "tried again once due")
		})
	}
}

// Purged one by one once their batch failed, the pairs share the batch's
// limit: the pass deletes no more ungrouped effects than a batch would,
// and the pairs left wait for the next pass. A limit of 3 stands for the
// pass's 1,000: the batch's shares, 2 for the failing workspace (its one
// effect) and 1 for each of the other's two types, take the failing
// effect whatever their order; alone, each of the other's pairs took the
// whole limit (4 in all). Every pass, so the batch reads every pair. Not parallel, in its own era
// (1901: the earliest, so no other test's effect is due).
func TestRetentionPairsPurgedApartShareTheLimit(t *testing.T) {
	b, _ := inEra(t, 1901)
	ctx, c := context.Background(), b.clock
	other := &bundle{t: t, clock: c, env: b.env, ws: b.env.Signup()}
	b.executedAs("succeeded", email(key("failing")))
	var ids []any
	for range 2 {
		ids = append(ids, other.executedAs("succeeded", email(key("mail")))["effect_id"],
			other.executedAs("succeeded", sms(key("text")))["effect_id"])
	}
	c.Add(100 * 24 * time.Hour) // past every retention here
	apitest.Refuse(t, "BEFORE DELETE ON effects",
		fmt.Sprintf("OLD.workspace_id = '%s' AND OLD.effect_type = 'email.send'", b.ws.ID))

	n, err := b.env.App.Server.Gate.SweepRetention(ctx, c.Now(), 3)
	require.ErrorContains(t, err, "test_refuse")
	require.Equal(t, 3, n, "the batch's limit, shared")
	var left int
	for _, id := range ids {
		if b.exists(id) {
			left++
		}
	}
	require.Equal(t, 1, left)
}

package groupstest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/ids"
)

// A forward step racing an unwind either is refused (group_unwinding) or
// was admitted before the rollback started, and then the unwind sees it:
// nothing slips into a group behind its rollback's back.
func TestForwardStepsRacingUnwind(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 5; round++ {
		g := f.group()
		const n = 8
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			executed []string
			unwind   map[string]any
		)
		start := make(chan struct{})
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r := f.do("POST", "/api/v1/effects/begin", map[string]any{"effect_type": "payment.charge",
					"idempotency_key": "race:" + ids.Random(6), "group_id": g, "cost_micros": 1,
					"compensation": map[string]any{"effect_type": "payment.refund"}})
				mu.Lock()
				defer mu.Unlock()
				switch r.Status {
				case http.StatusOK:
					executed = append(executed, r.JSON()["effect_id"].(string))
				default:
					require.Equal(t, "group_unwinding", r.ErrorCode(), "%s", r.Body)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			u := f.unwind(g)
			mu.Lock()
			unwind = u
			mu.Unlock()
		}()
		close(start)
		wg.Wait()
		// Every admitted step holds a live lease: unresolved, in the unwind's answer.
		require.ElementsMatch(t, executed, strs(unwind["unresolved"]), "round %d", round)
	}
}

// The last two compensations reported at the same time still end the
// rollback: whichever settles last sees both.
func TestConcurrentLastCompensations(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 5; round++ {
		g := f.group()
		f.done(g, true)
		f.done(g, true)
		u := f.unwind(g)
		type lease struct{ id, token string }
		var leases []lease
		for _, it := range u["plan"].([]any) {
			item := it.(map[string]any)
			comp := item["compensation"].(map[string]any)
			d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", map[string]any{
				"effect_type": comp["effect_type"], "payload": comp["payload"], "cost_micros": 0,
				"idempotency_key": item["suggested_idempotency_key"], "compensates_effect_id": item["compensates_effect_id"]})
			leases = append(leases, lease{d["effect_id"].(string), d["lease_token"].(string)})
		}
		var wg sync.WaitGroup
		for _, l := range leases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f.report(l.id, l.token, "succeeded")
			}()
		}
		wg.Wait()
		require.Equal(t, "unwound", f.stored(g), "round %d", round)
	}
}

// A commit racing an unwind answers what it did: a 200 from commit shows
// the group committed, even when the unwind starts the moment it ends.
func TestCommitRacingUnwindAnswersTheCommit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 20; round++ {
		g := f.group()
		f.done(g, true)
		var wg sync.WaitGroup
		start := make(chan struct{})
		commits := make(chan *apitest.Response, 8)
		for i := 0; i < 8; i++ {
			wg.Add(2)
			go func() {
				defer wg.Done()
				<-start
				commits <- f.do("POST", "/api/v1/groups/"+g+"/commit", nil)
			}()
			go func() {
				defer wg.Done()
				<-start
				f.do("POST", "/api/v1/groups/"+g+"/unwind", nil)
			}()
		}
		close(start)
		wg.Wait()
		close(commits)
		for r := range commits {
			if r.Status == http.StatusOK {
				require.Equal(t, "committed", r.JSON()["state"], "round %d", round)
			} else {
				require.Equal(t, "invalid_state", r.ErrorCode(), "round %d: %s", round, r.Body)
			}
		}
	}
}

// A begin in one group whose key another group's step took while it was
// being admitted (the step's row inserted, its transaction not yet
// committed, when the group check read) is refused as a key used outside
// its group, as it is once the step has committed (QA: it was told
// in_flight, another group's live step). The interleaving is forced: the
// step's insert waits, before its commit, on a lock the test holds, and
// the second begin waits for the step's key (its turn, 0077).
func TestAKeyTakenByAnotherGroupWhileAdmittedIsRefused(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	pool := f.env.App.Pool
	key := "race:" + ids.Random(8)
	lockID := 7_000_000 + rand.Int64N(1_000_000)
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION test_hold_step() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock(%d); RETURN NULL; END $$;
		CREATE TRIGGER test_hold_step AFTER INSERT ON effects FOR EACH ROW
		WHEN (NEW.idempotency_key = '%s') EXECUTE FUNCTION test_hold_step();`, lockID, key))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `DROP TRIGGER IF EXISTS test_hold_step ON effects; DROP FUNCTION IF EXISTS test_hold_step();`)
	})
	hold, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer hold.Release()
	_, err = hold.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockID)
	require.NoError(t, err)
	released := false
	unlock := func() {
		if !released {
			released = true
			_, err := hold.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lockID)
			require.NoError(t, err)
		}
	}
	defer unlock() // a failure below must not leave the step waiting

	ga, gb := f.group(), f.group()
	begin := func(group string, out chan<- *apitest.Response) {
		out <- f.do("POST", "/api/v1/effects/begin", map[string]any{"effect_type": "payment.charge",
			"idempotency_key": key, "group_id": group, "payload": map[string]any{"order": "o1"}, "cost_micros": 1})
	}
	won, lost := make(chan *apitest.Response, 1), make(chan *apitest.Response, 1)
	go begin(ga, won)
	var step int
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, `SELECT l.pid FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.objid::text::bigint = $1 AND NOT l.granted`, lockID).Scan(&step) == nil
	}, 10*time.Second, 5*time.Millisecond, "the step waits before its commit")
	go begin(gb, lost)
	// It waits for the step's key's turn (migration 0077; its insert waited
	// on the step's transaction before).
	apitest.WaitDoneOrBlockedBy(t, pool, step, make(chan struct{}), "the other group's begin waits on the step's key")
	unlock()

	w := <-won
	require.Equal(t, http.StatusOK, w.Status, "%s", w.Body)
	require.Equal(t, "execute", w.JSON()["decision"])
	l := <-lost
	require.Equal(t, http.StatusConflict, l.Status, "%s", l.Body)
	require.Equal(t, "idempotency_key_reuse", l.ErrorCode())
	// Once committed, the same begin is refused alike.
	again := make(chan *apitest.Response, 1)
	begin(gb, again)
	require.Equal(t, "idempotency_key_reuse", (<-again).ErrorCode())
}

// A grouped begin of a step begun under a run with a wallet, sent without
// run_id, takes the run's wallet before its group, as every other begin
// does (a wallet, then a group, then the effect's row). It took the wallet
// after the group (chargeEffectWallet, in the locked path), and with a
// policy PUT shortening two ended groups' keep_until (which locks them in
// id order, waiting for each) it closed a cycle: the PUT held group lo and
// waited for hi, shared by the grouped begin; that begin waited for the
// wallet, held by a begin of lo's step; and that one waited for lo. One of
// them was the deadlock's victim (a 503, or the PUT's dating). The
// interleaving is forced: the test holds lo while the PUT queues on it and
// the begin of lo's step queues behind, holding the wallet, then starts
// the grouped begin of hi's step and lets lo go.
func TestGroupedRetryTakesItsRunWalletBeforeItsGroup(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	pool := f.env.App.Pool
	run := f.must(http.StatusCreated, "POST", "/api/v1/runs", map[string]any{"name": "checkout",
		"budgetMicros": 1_000_000})["id"].(string)
	// Two ended groups (unwound: their one step failed), each step begun
	// under the run, so its retries are charged to the run's wallet.
	failed := func() (string, map[string]any) {
		g := f.group()
		body := map[string]any{"effect_type": "payment.charge", "idempotency_key": "charge:" + ids.Random(8),
			"payload": map[string]any{"order": ids.Random(4)}, "cost_micros": 1000, "group_id": g, "run_id": run}
		d := f.must(http.StatusOK, "POST", "/api/v1/effects/begin", body)
		f.report(d["effect_id"].(string), d["lease_token"].(string), "failed")
		require.Equal(t, "unwound", f.unwind(g)["state"])
		delete(body, "run_id")
		return g, body
	}
	g1, b1 := failed()
	g2, b2 := failed()
	lo, hi, loStep, hiStep := g1, g2, b1, b2
	if lo > hi {
		lo, hi, loStep, hiStep = g2, g1, b2, b1
	}
	delete(loStep, "group_id") // begun again without its group: the locked path holds the wallet, then lo

	waiting := func(what, like, locktype string) {
		t.Helper()
		require.Eventually(t, func() bool {
			var n int
			return pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l USING (pid)
				WHERE a.datname = current_database() AND NOT l.granted AND a.query LIKE $1
				  AND ($2 = '' OR l.locktype = $2)`, like, locktype).Scan(&n) == nil && n > 0
		}, 10*time.Second, 5*time.Millisecond, what)
	}
	hold, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `SELECT 1 FROM effect_groups WHERE id = $1 FOR UPDATE`, lo)
	require.NoError(t, err)

	put, loBegin, hiBegin := make(chan *apitest.Response, 1), make(chan *apitest.Response, 1),
		make(chan *apitest.Response, 1)
	go func() {
		put <- f.do("PUT", "/api/v1/policies/payment.charge", map[string]any{"retention_days": 1})
	}()
	waiting("the PUT's dating waits for lo", "%keep_until >%", "")
	go func() { loBegin <- f.do("POST", "/api/v1/effects/begin", loStep) }()
	waiting("the begin of lo's step waits for lo, holding the wallet", "%FROM effect_groups WHERE id = $1 FOR SHARE%", "")
	go func() { hiBegin <- f.do("POST", "/api/v1/effects/begin", hiStep) }()
	waiting("the grouped begin of hi's step waits for the wallet", "%wallet:%", "advisory")
	require.NoError(t, hold.Rollback(ctx))

	p := <-put
	require.Equal(t, http.StatusOK, p.Status, "%s", p.Body)
	for _, r := range []*apitest.Response{<-loBegin, <-hiBegin} {
		errCode(t, r, http.StatusConflict, "group_unwinding")
	}
	for _, g := range []string{lo, hi} {
		var shortened bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT keep_until = finished_at + interval '1 day'
			FROM effect_groups WHERE id = $1`, g).Scan(&shortened))
		require.True(t, shortened, "group %s dated by the lowered retention", g)
	}
}

// A step has one compensating effect (effects_compensates_idx), however
// many callers begin one at once: 40 begins compensating the same step,
// most under keys of their own, a few under the plan's suggested key,
// grant exactly one execute; the suggested key's other begins are told
// in_flight when it won (invalid_state otherwise), every other key is
// refused invalid_state naming the winner, and the refused keys keep no
// effect.
func TestConcurrentCompensationsOfOneStepUnderManyKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for round := 0; round < 4; round++ {
		g := f.group()
		step := f.done(g, true)
		item := f.unwind(g)["plan"].([]any)[0].(map[string]any)
		suggested := item["suggested_idempotency_key"].(string)
		const n = 40
		keys := make([]string, n)
		for i := range keys {
			keys[i] = suggested
			if i%8 != 0 {
				keys[i] = "mine:" + ids.Random(8)
			}
		}
		rs := hammer(n, func(i int) *apitest.Response {
			return f.do("POST", "/api/v1/effects/begin", map[string]any{"effect_type": "payment.refund",
				"payload": map[string]any{"refund_of": "charge"}, "cost_micros": 0,
				"idempotency_key": keys[i], "compensates_effect_id": step})
		})
		var winner string
		for _, r := range rs {
			if r.Status == http.StatusOK && r.JSON()["decision"] == "execute" {
				require.Empty(t, winner, "round %d: a second compensation executed", round)
				winner = r.JSON()["effect_id"].(string)
			}
		}
		require.NotEmpty(t, winner, "round %d: one compensation executes", round)
		var winnerKey string
		require.NoError(t, f.env.App.Pool.QueryRow(context.Background(),
			`SELECT idempotency_key FROM effects WHERE id = $1`, winner).Scan(&winnerKey))
		for i, r := range rs {
			switch {
			case r.Status == http.StatusOK && r.JSON()["effect_id"] == winner:
				require.Contains(t, []any{"execute", "in_flight"}, r.JSON()["decision"], "round %d: %s", round, r.Body)
				require.Equal(t, winnerKey, keys[i], "round %d: answered for another key's effect", round)
			default:
				errCode(t, r, http.StatusConflict, "invalid_state")
				require.Equal(t, winner, r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["compensating_effect_id"],
					"round %d", round)
			}
		}
		var effects int
		require.NoError(t, f.env.App.Pool.QueryRow(context.Background(), `SELECT count(*) FROM effects
			WHERE workspace_id = $1 AND (compensates_effect_id = $2 OR idempotency_key = ANY($3))`,
			f.ws.ID, step, keys).Scan(&effects))
		require.Equal(t, 1, effects, "round %d: the refused keys keep nothing", round)
	}
}

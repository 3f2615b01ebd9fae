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
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/gate"
)

// Requests on effects a retention pass is deleting (its statement done,
// not yet committed) wait for it or answer from before it, and answer
// what README allows either way, never a 500: a begin of the deleted
// effect's key executes afresh once the pass commits (or asks to be
// retried at once, 409 retry_request) and answers duplicate if it rolls
// back; a replayed report, a resolve of the ended effect and a decision
// on its approval answer the effect as it was, or 404 once it is gone.
// Afterwards the key has one effect, with one attempt. Each request is
// sent alone and let run until it ends or itself waits for the pass's
// locks (apitest.LockWaits), then the pass ends. Not parallel, in its own era
// (1946, then 1947).
func TestRequestsRacingARetentionPass(t *testing.T) {
	eitherEnd(t, 1946, requestsRacingARetentionPass)
}

func requestsRacingARetentionPass(t *testing.T, year int, commit bool) {
	b := raceEra(t, year)
	ctx := context.Background()
	pool := b.env.App.Pool
	b.putPolicy("sms.send", map[string]any{"retention_days": 1})
	b.putPolicy("wire.send", map[string]any{"approval_above_micros": 1_000_000, "retention_days": 1})

	k := key("begun-again")
	old := b.executedAs("succeeded", sms(k))
	replayed := b.mustBegin("execute", sms(key("replayed")))
	require.Equal(t, http.StatusOK, b.report(str(replayed["effect_id"]), str(replayed["lease_token"]), "succeeded", nil).Status)
	resolved := b.executedAs("failed", sms(key("resolved")))
	gated := b.mustBegin("approval_required", wire(key("rejected")))
	approval := str(gated["approval_id"])
	b.env.Must(http.StatusOK, "POST", "/api/v1/approvals/"+approval+"/reject", b.ws.Key, nil)
	b.clock.Add(25 * time.Hour)

	tx, pid, deleted := b.heldPass("")
	require.GreaterOrEqual(t, deleted, int64(4), "this era's four ended effects, and earlier eras' the other tests left")

	answers := b.racingPass(pid, map[string]func() *apitest.Response{
		"begin": func() *apitest.Response { return b.begin(sms(k)) },
		"report": func() *apitest.Response {
			return b.report(str(replayed["effect_id"]), str(replayed["lease_token"]), "succeeded", nil)
		},
		"resolve": func() *apitest.Response {
			return b.env.Do("POST", "/api/v1/effects/"+str(resolved["effect_id"])+"/resolve", b.ws.Key,
				map[string]any{"outcome": "succeeded"})
		},
		"approve": func() *apitest.Response {
			return b.env.Do("POST", "/api/v1/approvals/"+approval+"/approve", b.ws.Key, nil)
		},
	}, ending(t, tx, commit))

	for what, r := range answers {
		body := string(r.Body)
		switch what {
		case "begin":
			d := r.JSON()
			if !commit {
				require.Equal(t, http.StatusOK, r.Status, body)
				require.Equal(t, "duplicate", d["decision"], body)
				require.Equal(t, old["effect_id"], d["effect_id"])
				break
			}
			if r.Status == http.StatusConflict {
				errCode(t, r, http.StatusConflict, "retry_request")
				d = b.mustBegin("execute", sms(k))
			} else {
				require.Equal(t, http.StatusOK, r.Status, body)
			}
			require.Equal(t, "execute", d["decision"], "the key is new again: %s", body)
			require.NotEqual(t, old["effect_id"], d["effect_id"])
			require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "succeeded", nil).Status)
		case "report":
			// The replay of the report that ended it, or the effect gone.
			require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, r.Status, body)
			if !commit {
				require.Equal(t, http.StatusOK, r.Status, body)
			}
		case "resolve", "approve":
			// An ended effect takes no resolve, a decided approval no
			// other decision; once deleted, either is unknown.
			require.Contains(t, []int{http.StatusConflict, http.StatusNotFound}, r.Status, "%s: %s", what, body)
			if !commit {
				require.Equal(t, http.StatusConflict, r.Status, "%s: %s", what, body)
			}
		}
	}

	// The database as README says: the key has one effect, with one
	// attempt; the deleted effects left no attempts or approvals behind.
	var effects, attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(sum((SELECT count(*) FROM effect_attempts a WHERE a.effect_id = e.id)), 0)
		FROM effects e WHERE e.workspace_id = $1 AND e.idempotency_key = $2`, b.ws.ID, k).Scan(&effects, &attempts))
	require.Equal(t, 1, effects)
	require.Equal(t, 1, attempts)
	ids := []string{str(replayed["effect_id"]), str(resolved["effect_id"]), str(gated["effect_id"])}
	if commit {
		ids = append(ids, str(old["effect_id"]))
	}
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM effects WHERE id = ANY($1))
		+ (SELECT count(*) FROM effect_attempts WHERE effect_id = ANY($1))
		+ (SELECT count(*) FROM approvals WHERE effect_id = ANY($1))`, ids).Scan(&left))
	if commit {
		require.Zero(t, left, "the pass deleted them whole")
	} else {
		require.Positive(t, left)
	}
}

// Requests on an ended group a retention pass is deleting (its statements
// done, not yet committed) wait for it or answer from before it, never a
// 500: once it commits, unwinding, committing, reading or joining the
// group is 404, a replayed begin of a step's key finds no group (404) and
// a create under the group's idempotency_key opens a new group (or, read
// before the pass, answers the old one deduplicated); rolled back, each
// answers the group as it was. No step outlives its group. Not parallel,
// in its own era (1948, then 1949).
func TestGroupRequestsRacingARetentionPass(t *testing.T) {
	eitherEnd(t, 1948, groupRequestsRacingARetentionPass)
}

func groupRequestsRacingARetentionPass(t *testing.T, year int, commit bool) {
	b := raceEra(t, year)
	ctx := context.Background()
	pool := b.env.App.Pool
	b.putPolicy("email.send", map[string]any{"retention_days": 1})
	b.putPolicy("email.retract", map[string]any{"retention_days": 1})
	gk := key("order")
	g, step, done := b.groupWithStep("order", gk)
	b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/commit", b.ws.Key, nil)
	b.clock.Add(49 * time.Hour)

	tx, pid, _ := b.heldPass(g)

	answers := b.racingPass(pid, map[string]func() *apitest.Response{
		"unwind": func() *apitest.Response {
			return b.env.Do("POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil)
		},
		"commit": func() *apitest.Response {
			return b.env.Do("POST", "/api/v1/groups/"+g+"/commit", b.ws.Key, nil)
		},
		"join": func() *apitest.Response {
			return b.begin(groupStep(g, email(key("late")), nil))
		},
		"replay": func() *apitest.Response { return b.begin(step) },
		"create": func() *apitest.Response {
			return b.env.Do("POST", "/api/v1/groups", b.ws.Key, map[string]any{"name": "order", "idempotency_key": gk})
		},
	}, ending(t, tx, commit))

	for what, r := range answers {
		body := string(r.Body)
		require.Less(t, r.Status, 500, "%s: %s", what, body)
		switch what {
		case "create":
			d := r.JSON()
			if d["id"] == g {
				require.Equal(t, true, d["deduplicated"], body)
			} else {
				require.True(t, commit, "a new group only once the old one is gone: %s", body)
				require.Equal(t, http.StatusCreated, r.Status, body)
			}
		case "replay":
			if commit {
				errCode(t, r, http.StatusNotFound, "not_found")
			} else if r.Status == http.StatusConflict {
				// the unwind, racing it once the pass rolled back, began first
				errCode(t, r, http.StatusConflict, "group_unwinding")
			} else {
				require.Equal(t, "duplicate", r.JSON()["decision"], body)
				require.Equal(t, done["effect_id"], r.JSON()["effect_id"])
			}
		default:
			if commit {
				errCode(t, r, http.StatusNotFound, "not_found")
			}
		}
	}
	var steps, groupsLeft int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM effects WHERE group_id = $1),
		(SELECT count(*) FROM effect_groups WHERE id = $1)`, g).Scan(&steps, &groupsLeft))
	if commit {
		require.Zero(t, steps+groupsLeft, "the group went whole")
	} else {
		require.Equal(t, 1, groupsLeft)
		require.Positive(t, steps)
	}
	// A group the key opened anew is there, alone under its key.
	var underKey int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM effect_groups WHERE workspace_id = $1 AND idempotency_key = $2`,
		b.ws.ID, gk).Scan(&underKey))
	require.Equal(t, 1, underKey)
}

// passing runs each of passes in a loop of its own until stop is closed,
// or the pass fails (said to failf), and answers a wait for the loops.
func passing(stop <-chan struct{}, failf func(format string, args ...any), passes ...func() error) (wait func()) {
	var wg sync.WaitGroup
	for _, pass := range passes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := pass(); err != nil {
					failf("pass: %v", err)
					return
				}
			}
		}()
	}
	return wg.Wait
}

// racingPass sends each request alone, lets it run until it answers or
// itself waits for a lock the transaction of backend pid holds
// (apitest.LockWaits: not an earlier request's wait), then ends that transaction (end) and answers every
// request's response.
func (b *bundle) racingPass(pid int, requests map[string]func() *apitest.Response, end func()) map[string]*apitest.Response {
	b.t.Helper()
	type answer struct {
		what string
		r    *apitest.Response
	}
	answers := make(chan answer, len(requests))
	waits := apitest.NewLockWaits(b.t, b.env.App.Pool, pid)
	for what, do := range requests {
		done := make(chan struct{})
		go func() { defer close(done); answers <- answer{what, do()} }()
		waits.Wait(done, what+" neither answered nor waited for the pass")
	}
	end()
	out := map[string]*apitest.Response{}
	for range requests {
		a := <-answers
		b.t.Logf("%s: %d", a.what, a.r.Status)
		out[a.what] = a.r
	}
	return out
}

// A hammer: begins of keys whose effects have passed their retention, two
// of each key at once over two instances, race retention passes of both
// instances (small batches, so passes and begins interleave). Each begin
// answers duplicate (of the old effect, or of the new one once it
// succeeded), in_flight while the new one is leased, or execute, at most
// once a key (409 retry_request is retried at once, as API.md says); every
// execute's report lands; and once a last pass ran, each key has the one
// effect its execute made, or none. Not parallel, in its own era (1951).
func TestBeginsOfExpiringKeysRaceRetentionPasses(t *testing.T) {
	b := raceEra(t, 1951)
	other := apitest.Start(t, apitest.WithNow(b.clock.Now))
	ctx := context.Background()
	b.putPolicy("sms.send", map[string]any{"retention_days": 1})
	const keys = 24
	old := map[string]string{}
	for range keys {
		k := key("expiring")
		old[k] = str(b.executedAs("succeeded", sms(k))["effect_id"])
	}
	b.clock.Add(25 * time.Hour)

	var (
		mu       sync.Mutex
		executed = map[string]string{}
		answered = map[string][]string{}
		fail     []string
	)
	failf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fail = append(fail, fmt.Sprintf(format, args...))
	}
	stop := make(chan struct{})
	var passes []func() error
	for _, env := range []*apitest.Env{b.env, other} {
		passes = append(passes, func() error { _, err := env.App.Server.Gate.SweepRetention(ctx, b.clock.Now(), 3); return err })
	}
	sweepersDone := passing(stop, failf, passes...)
	var begins sync.WaitGroup
	for k, was := range old {
		for _, env := range []*apitest.Env{b.env, other} {
			begins.Add(1)
			go func() {
				defer begins.Done()
				for {
					r := env.Do("POST", "/api/v1/effects/begin", b.ws.Key, sms(k))
					if r.Status == http.StatusConflict && r.ErrorCode() == "retry_request" {
						continue
					}
					if r.Status != http.StatusOK {
						failf("begin: %d %s", r.Status, r.ErrorCode())
						return
					}
					d := r.JSON()
					id := str(d["effect_id"])
					switch d["decision"] {
					case "execute":
						mu.Lock()
						first := executed[k] == ""
						executed[k] = id
						mu.Unlock()
						if !first || id == was {
							failf("a second execute of one key, or of its old effect")
							return
						}
						rep := env.Do("POST", "/api/v1/effects/"+id+"/report", b.ws.Key,
							map[string]any{"lease_token": d["lease_token"], "outcome": "succeeded"})
						if rep.Status != http.StatusOK {
							failf("report: %d %s", rep.Status, rep.ErrorCode())
						}
					case "duplicate", "in_flight":
						// checked once every answer is in: an in_flight
						// may come before its execute's answer
						mu.Lock()
						answered[k] = append(answered[k], id)
						mu.Unlock()
					default:
						failf("decision %v", d["decision"])
					}
					return
				}
			}()
		}
	}
	begins.Wait()
	close(stop)
	sweepersDone()
	require.Empty(t, fail)
	for k, ids := range answered {
		for _, id := range ids {
			require.Contains(t, []string{old[k], executed[k]}, id, "an answer of an effect neither old nor executed")
		}
	}

	for {
		n, err := b.env.App.Server.Gate.SweepRetention(ctx, b.clock.Now(), 1000)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	for k := range old {
		ids, err := db.CollectIDs(b.env.App.Pool.Query(ctx,
			`SELECT id FROM effects WHERE workspace_id = $1 AND idempotency_key = $2`, b.ws.ID, k))
		require.NoError(t, err)
		if e := executed[k]; e != "" {
			require.Equal(t, []string{e}, ids, "the key's one effect is its execute's")
			require.Equal(t, "succeeded", b.get(e)["state"])
		} else {
			require.Empty(t, ids, "the old effect went")
		}
	}
	t.Logf("%d of %d keys executed again", len(executed), keys)
}

// A reconciliation posted while a retention pass deletes an effect of its
// window (the pass's statement done, not yet committed) answers 200, never
// a 500: the deleted effect's vendor record matched (read before the pass
// committed) or unknown_to_ratchet (after), and a lapsed effect of the
// window, which retention never deletes, resolved by its record. Not
// parallel, in its own era (1953).
func TestAReconciliationRacingARetentionPass(t *testing.T) {
	b := raceEra(t, 1953)
	b.putPolicy("sms.send", map[string]any{"retention_days": 1})
	from := b.clock.Now()
	gone := key("gone")
	b.executedAs("succeeded", sms(gone))
	lapsedKey := key("lapsed")
	lapsed := b.mustBegin("execute", sms(lapsedKey))
	b.clock.Add(25 * time.Hour)

	tx, pid, _ := b.heldPass("")
	answers := b.racingPass(pid, map[string]func() *apitest.Response{
		"reconcile": func() *apitest.Response {
			return b.env.Do("POST", "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": "sms.send",
				"from": from.Format(time.RFC3339Nano), "to": b.clock.Now().Format(time.RFC3339Nano),
				"records": []map[string]any{{"idempotency_key": gone, "status": "succeeded"},
					{"idempotency_key": lapsedKey, "status": "succeeded"}}})
		},
	}, ending(t, tx, true))
	r := answers["reconcile"]
	require.Equal(t, http.StatusOK, r.Status, string(r.Body))
	out := r.JSON()
	keysIn := func(list string) []string {
		var ks []string
		items, _ := out[list].([]any)
		for _, it := range items {
			ks = append(ks, str(it.(map[string]any)["idempotency_key"]))
		}
		return ks
	}
	require.Equal(t, []string{lapsedKey}, keysIn("resolved"))
	if matched := keysIn("matched"); len(matched) == 0 {
		require.Equal(t, []string{gone}, keysIn("unknown_to_ratchet"))
	} else {
		require.Equal(t, []string{gone}, matched)
	}
	require.Equal(t, "succeeded", b.get(str(lapsed["effect_id"]))["state"])
}

// The other order than TestRetentionSkipsAGroupWhoseApprovalADecideHolds:
// decisions on the pending approval of a step of an ended rollback (one
// the rollback's close passed over, or an earlier release left pending;
// closed, it is decided already), sent
// while a pass deletes the group (its statements done, not yet committed),
// wait for it and answer 404 once it commits (an approve refused
// group_unwinding from the group as it was before is allowed too), never
// a 500, and leave no approval behind. Not parallel, in its own era (1955).
func TestADecisionWaitingForARetentionPassAnswersNotFound(t *testing.T) {
	b := raceEra(t, 1955)
	ctx := context.Background()
	pool := b.env.App.Pool
	b.putPolicy("wire.send", map[string]any{"mode": "require_approval", "retention_days": 1})
	g := b.newGroup("payout", "")
	w := wire(key("wire"))
	w["group_id"] = g
	asked := b.mustBegin("approval_required", w)
	require.Equal(t, "unwound", b.env.Must(http.StatusOK, "POST", "/api/v1/groups/"+g+"/unwind", b.ws.Key, nil).JSON()["state"])
	b.pendAgain(str(asked["approval_id"]))
	b.clock.Add(49 * time.Hour)

	tx, pid, _ := b.heldPass(g)
	approval := "/api/v1/approvals/" + str(asked["approval_id"])
	answers := b.racingPass(pid, map[string]func() *apitest.Response{
		"approve": func() *apitest.Response { return b.env.Do("POST", approval+"/approve", b.ws.Key, nil) },
		"reject":  func() *apitest.Response { return b.env.Do("POST", approval+"/reject", b.ws.Key, nil) },
	}, ending(t, tx, true))
	for what, r := range answers {
		require.Less(t, r.Status, 500, "%s: %s", what, r.Body)
		if what == "approve" && r.Status == http.StatusConflict {
			// refused from the group's state as read before the pass
			// committed, as before it began
			errCode(t, r, http.StatusConflict, "group_unwinding")
			continue
		}
		errCode(t, r, http.StatusNotFound, "not_found")
	}
	b.requireKept(false, "/api/v1/groups/"+g, "/api/v1/effects/"+str(asked["effect_id"]), approval)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM approvals WHERE effect_id = $1`, str(asked["effect_id"])).Scan(&left))
	require.Zero(t, left)
}

// heldPass runs a retention pass at b's now in a transaction it leaves
// open (rolled back when the test ends), deleting ended group g too when
// g is not "" (it must be due), and answers the transaction, its backend's
// pid and how many effects it deleted.
func (b *bundle) heldPass(g string) (pgx.Tx, int, int64) {
	b.t.Helper()
	ctx := context.Background()
	tx, err := b.env.App.Pool.Begin(ctx)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var grouped int
	if g != "" {
		var groups []string
		groups, grouped, err = gate.PurgeKeptGroups(ctx, tx, b.clock.Now(), 100, 1000)
		require.NoError(b.t, err)
		require.Contains(b.t, groups, g)
	}
	n, err := gate.PurgeExpired(ctx, tx, b.clock.Now(), 1000)
	require.NoError(b.t, err)
	return tx, apitest.BackendPID(b.t, tx), int64(grouped) + n
}

// eitherEnd runs race twice, in eras year and year+1: with the pass
// committed, then rolled back.
func eitherEnd(t *testing.T, year int, race func(t *testing.T, year int, commit bool)) {
	for i, commit := range []bool{true, false} {
		name := map[bool]string{true: "committed", false: "rolled back"}[commit]
		t.Run(name, func(t *testing.T) { race(t, year+i, commit) })
	}
}

// ending ends tx: commits it, or rolls it back.
func ending(t *testing.T, tx pgx.Tx, commit bool) func() {
	return func() {
		if commit {
			require.NoError(t, tx.Commit(context.Background()))
		} else {
			require.NoError(t, tx.Rollback(context.Background()))
		}
	}
}

// raceEra is inEra for a test whose passes are its own (held open, or
// racing), or that runs none: the records it leaves, some past their
// retention or leased, go when it ends, so that no later era's pass (the
// retention tests count what theirs delete, TestSweeperAndLapseRaces the
// leases its sweep lapses) meets them.
func raceEra(t *testing.T, year int) *bundle {
	b, _ := inEra(t, year)
	t.Cleanup(func() {
		_, err := b.env.App.Pool.Exec(context.Background(), `WITH e AS (SELECT id FROM effects WHERE workspace_id = $1),
			a AS (DELETE FROM effect_attempts WHERE effect_id IN (SELECT id FROM e)),
			p AS (DELETE FROM approvals WHERE effect_id IN (SELECT id FROM e)),
			f AS (DELETE FROM effects WHERE id IN (SELECT id FROM e))
			DELETE FROM effect_groups WHERE workspace_id = $1`, b.ws.ID)
		require.NoError(t, err)
	})
	return b
}

package gate_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
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
// sent alone and let run until it ends or waits for the pass's locks
// (pg_blocking_pids), then the pass ends. Not parallel, in its own era
// (1946, then 1947).
func TestRequestsRacingARetentionPass(t *testing.T) {
	for i, commit := range []bool{true, false} {
		name := map[bool]string{true: "committed", false: "rolled back"}[commit]
		t.Run(name, func(t *testing.T) { requestsRacingARetentionPass(t, 1946+i, commit) })
	}
}

func requestsRacingARetentionPass(t *testing.T, year int, commit bool) {
	b, _ := inEra(t, year)
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

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	tag, err := tx.Exec(ctx, gate.PurgeExpiredSQL, b.clock.Now(), 1000, []string(nil))
	require.NoError(t, err)
	require.GreaterOrEqual(t, tag.RowsAffected(), int64(4), "this era's four ended effects, and earlier eras' the other tests left")

	// send runs do alone until it answers or waits for the pass.
	type answer struct {
		what string
		r    *apitest.Response
	}
	answers := make(chan answer, 8)
	sent := 0
	send := func(what string, do func() *apitest.Response) {
		sent++
		done := make(chan struct{})
		go func() { defer close(done); answers <- answer{what, do()} }()
		require.Eventually(t, func() bool {
			select {
			case <-done:
				return true
			default:
			}
			var waiting bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND $1::int = ANY (pg_blocking_pids(pid)))`, pid).Scan(&waiting))
			return waiting
		}, 10*time.Second, 5*time.Millisecond, "%s neither answered nor waited for the pass", what)
	}
	send("begin", func() *apitest.Response { return b.begin(sms(k)) })
	send("report", func() *apitest.Response {
		return b.report(str(replayed["effect_id"]), str(replayed["lease_token"]), "succeeded", nil)
	})
	send("resolve", func() *apitest.Response {
		return b.env.Do("POST", "/api/v1/effects/"+str(resolved["effect_id"])+"/resolve", b.ws.Key,
			map[string]any{"outcome": "succeeded"})
	})
	send("approve", func() *apitest.Response {
		return b.env.Do("POST", "/api/v1/approvals/"+approval+"/approve", b.ws.Key, nil)
	})
	if commit {
		require.NoError(t, tx.Commit(ctx))
	} else {
		require.NoError(t, tx.Rollback(ctx))
	}

	for range sent {
		a := <-answers
		body := string(a.r.Body)
		t.Logf("%s: %d", a.what, a.r.Status)
		switch a.what {
		case "begin":
			d := a.r.JSON()
			if !commit {
				require.Equal(t, http.StatusOK, a.r.Status, body)
				require.Equal(t, "duplicate", d["decision"], body)
				require.Equal(t, old["effect_id"], d["effect_id"])
				break
			}
			if a.r.Status == http.StatusConflict {
				errCode(t, a.r, http.StatusConflict, "retry_request")
				d = b.mustBegin("execute", sms(k))
			}
			require.Equal(t, http.StatusOK, a.r.Status, body)
			require.Equal(t, "execute", d["decision"], "the key is new again: %s", body)
			require.NotEqual(t, old["effect_id"], d["effect_id"])
			require.Equal(t, http.StatusOK, b.report(str(d["effect_id"]), str(d["lease_token"]), "succeeded", nil).Status)
		case "report":
			// The replay of the report that ended it, or the effect gone.
			require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, a.r.Status, body)
			if !commit {
				require.Equal(t, http.StatusOK, a.r.Status, body)
			}
		case "resolve", "approve":
			// An ended effect takes no resolve, a decided approval no
			// other decision; once deleted, either is unknown.
			require.Contains(t, []int{http.StatusConflict, http.StatusNotFound}, a.r.Status, "%s: %s", a.what, body)
			if !commit {
				require.Equal(t, http.StatusConflict, a.r.Status, "%s: %s", a.what, body)
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

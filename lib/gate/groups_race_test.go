package gate_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
)

// A begin repeating a step its group took (a producer's retry) is answered
// that step, whatever the group's state since: the group's state does not
// refuse a replay (sqlAdmitGroup). Its statement reads the group's row FOR
// SHARE and, in the same statement, the effect holding the key; one that
// waited for the group's row (behind a commit) re-read that row alone when
// woken, committed now, while the effects it joined were as of its start,
// before the first begin committed its step: it was refused as a new step
// (409 invalid_state). The first begin's commit is played by giving its
// effect back the key hidden before the retry began, the commit by a
// transaction holding the group's row. Not parallel: it watches
// pg_stat_activity.
func TestABeginRetryRacingItsGroupsCommitAnswersTheStep(t *testing.T) {
	ctx := context.Background()
	b := setup(t)
	g := b.newGroup("g", "")
	body := cappedStep(g)
	first := b.mustBegin("execute", body)
	id := str(first["effect_id"])
	require.Equal(t, http.StatusOK, b.report(id, str(first["lease_token"]), "succeeded", nil).Status)
	pool := b.env.App.Pool
	var stored string
	require.NoError(t, pool.QueryRow(ctx, `SELECT idempotency_key FROM effects WHERE id = $1`, id).Scan(&stored))
	_, err := pool.Exec(ctx, `UPDATE effects SET idempotency_key = 'hidden ' || id WHERE id = $1`, id)
	require.NoError(t, err)

	commit, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = commit.Rollback(ctx) }()
	_, err = commit.Exec(ctx, `SELECT 1 FROM effect_groups WHERE id = $1 FOR UPDATE`, g)
	require.NoError(t, err)
	retried := make(chan *apitest.Response, 1)
	go func() { retried <- b.env.Do("POST", "/api/v1/effects/begin", b.ws.Key, body) }()
	apitest.WaitForLock(t, pool, `%FROM effect_groups g LEFT JOIN effects e%`, "%",
		"the retry, its snapshot taken, waits for the group's row")
	_, err = pool.Exec(ctx, `UPDATE effects SET idempotency_key = $2 WHERE id = $1`, id, stored)
	require.NoError(t, err, "the first begin commits")
	_, err = commit.Exec(ctx, `UPDATE effect_groups SET state = 'committed', committed_at = now(), updated_at = now()
		WHERE id = $1`, g)
	require.NoError(t, err)
	require.NoError(t, commit.Commit(ctx))

	r := <-retried
	require.Equal(t, http.StatusOK, r.Status, "a retry of a step the group took is answered, not refused: %s", r.Body)
	require.Equal(t, id, str(r.JSON()["effect_id"]))
	require.Equal(t, http.StatusConflict, b.begin(cappedStep(g)).Status, "a new step is refused")
}

// A step settled while its group's unwind is in progress (the unwind read
// it unresolved and has not committed) ends the rollback once the unwind
// commits: the settle waits for the unwind and reads the group as it left
// it. It read the group on its own snapshot, still open, and passed over
// it, so the rollback stayed unwinding, its last step settled, until a
// read or the sweeper ended it: a reconciliation (endRollbacks), a resolve
// and a report (afterStep) alike. The unwind is a real one, run in a
// request's transaction the test commits (db.BeginRequest).
func TestAStepSettledWhileItsGroupIsBeingUnwoundEndsTheRollback(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"reconcile", "resolve", "report"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			start := b.clock.Now()
			g := b.newGroup("checkout", "")
			step := groupStep(g, email(key("step")), nil)
			d := b.mustBegin("execute", step)
			if via != "report" {
				b.clock.Add(2 * time.Minute) // the lease lapses unreported: the outcome is unknown
			}

			p := &auth.Principal{WorkspaceID: b.ws.ID, KeyID: keyID(b.ws.Key), Scopes: auth.AllScopes}
			unwindCtx, unwind := db.BeginRequest(ctx, b.env.App.Pool)
			defer func() { _ = unwind.Rollback(ctx) }()
			u, err := b.env.App.Server.Gate.UnwindGroup(unwindCtx, p, g)
			require.NoError(t, err)
			require.Equal(t, "unwinding", u.State)
			require.Equal(t, []string{str(d["effect_id"])}, u.Unresolved, "the unwind read the step unresolved")
			var pid int
			require.NoError(t, unwind.QueryRow(unwindCtx, `SELECT pg_backend_pid()`).Scan(&pid))

			settled := make(chan struct{})
			var r *apitest.Response
			go func() {
				defer close(settled)
				switch via {
				case "reconcile":
					r = b.env.Do("POST", "/api/v1/reconcile", b.ws.Key, map[string]any{"effect_type": "email.send",
						"from": start.Add(-time.Minute).Format(time.RFC3339Nano), "to": b.clock.Now().Format(time.RFC3339Nano),
						"records": []any{map[string]any{"idempotency_key": step["idempotency_key"], "status": "failed"}}})
				case "resolve":
					r = b.env.Do("POST", "/api/v1/effects/"+str(d["effect_id"])+"/resolve", b.ws.Key,
						map[string]any{"outcome": "failed"})
				default:
					r = b.report(str(d["effect_id"]), str(d["lease_token"]), "failed", nil)
				}
			}()
			apitest.WaitDoneOrBlockedBy(t, b.env.App.Pool, pid, settled, "the settle answered or waits for the unwind")
			require.NoError(t, unwind.Commit(unwindCtx))
			<-settled
			require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
			var state string
			require.NoError(t, b.env.App.Pool.QueryRow(ctx, `SELECT state FROM effect_groups WHERE id = $1`, g).Scan(&state))
			require.Equal(t, "unwound", state, "its only step failed: nothing is left to undo")
		})
	}
}

package gate_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
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

package apitest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/testpg"
)

// KeptSecrets are the secrets (a new key's, a webhook's) that the answers
// kept for the Idempotency-Keys of the API key whose secret is key still
// hold, read from the table and opened as a replay opens them.
func (e *Env) KeptSecrets(key string) []string {
	e.T.Helper()
	ctx := context.Background()
	keyID, _ := e.Must(http.StatusOK, "GET", "/api/v1/keys/current", key, nil).JSON()["id"].(string)
	rows, err := e.App.Pool.Query(ctx, `SELECT idempotency_key, answer FROM idempotent_requests
		WHERE key_id = $1 AND answer IS NOT NULL`, keyID)
	require.NoError(e.T, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var idemKey string
		var sealed []byte
		require.NoError(e.T, rows.Scan(&idemKey, &sealed))
		body, err := e.App.Server.Sealer.Open(sealed, idempotency.AnswerAAD(keyID, idemKey))
		require.NoError(e.T, err)
		var answer struct {
			Secret string `json:"secret"`
		}
		require.NoError(e.T, json.Unmarshal(body, &answer))
		if answer.Secret != "" {
			out = append(out, answer.Secret)
		}
	}
	require.NoError(e.T, rows.Err())
	return out
}

// RequireErased requires r, a request sent again under the Idempotency-Key
// first was answered under, to be answered as one whose kept answer was
// erased with the resource whose secret it showed: 404 not_found, given
// again for the request that acted, without that secret or any other of
// its kind (secretPrefix).
func (e *Env) RequireErased(r, first *Response, secret, secretPrefix string) {
	e.T.Helper()
	require.Equal(e.T, http.StatusNotFound, r.Status, "%s", r.Body)
	require.Equal(e.T, "not_found", r.ErrorCode())
	require.Equal(e.T, "true", r.Header.Get(httpapi.ReplayedHeader))
	require.Equal(e.T, first.Header.Get("X-Request-Id"), r.Header.Get(httpapi.OriginalRequestHeader))
	require.NotContains(e.T, string(r.Body), secret)
	require.NotContains(e.T, string(r.Body), secretPrefix)
}

// SecretCreates is a kind of resource whose create, sent under an
// Idempotency-Key, answers its secret (a key, a webhook), for the tests of
// the erasure of such answers with the resource.
type SecretCreates struct {
	// Create creates one under the Idempotency-Key idemKey, from the API
	// key whose secret is key; name tells one from another (a key's name, a
	// webhook's url), the same name sending the same body.
	Create func(key, idemKey, name string) *Response
	// End deletes (a key: revokes) resource id.
	End          func(key, id string)
	SecretPrefix string
}

// CheckAnswersKeptBeforeTheUpgrade checks that an answer kept before
// migration 0067 (or by an instance of the previous release during its
// deploy), which names no resource, is erased by the sweeper when its
// resource has ended, and linked for the resource's end otherwise: the
// end does not find it, the sweeper links it (idempotency.link_secrets)
// and, in the same pass, erases those of ended resources.
func (e *Env) CheckAnswersKeptBeforeTheUpgrade(kind SecretCreates) {
	e.T.Helper()
	ctx := context.Background()
	key := e.Signup().Key
	gone, live := kind.Create(key, "old-gone", "gone"), kind.Create(key, "old-live", "live")
	for _, r := range []*Response{gone, live} { // as the release before 0067 recorded them
		require.Equal(e.T, http.StatusCreated, r.Status, "%s", r.Body)
		_, err := e.App.Pool.Exec(ctx, `UPDATE idempotent_requests SET resource_id = NULL WHERE request_id = $1`,
			r.Header.Get("X-Request-Id"))
		require.NoError(e.T, err)
	}
	goneID, liveID := gone.JSON()["id"].(string), live.JSON()["id"].(string)
	kind.End(key, goneID)
	again := kind.Create(key, "old-gone", "gone")
	require.Equal(e.T, string(gone.Body), string(again.Body), "not linked: the end could not find it")

	res := e.App.Sweeper.RunOnce(ctx)
	require.Empty(e.T, res.Errors)
	e.RequireErased(kind.Create(key, "old-gone", "gone"), gone, gone.JSON()["secret"].(string), kind.SecretPrefix)
	require.Equal(e.T, []string{live.JSON()["secret"].(string)}, e.KeptSecrets(key))
	var linked string
	require.NoError(e.T, e.App.Pool.QueryRow(ctx, `SELECT resource_id FROM idempotent_requests WHERE request_id = $1`,
		live.Header.Get("X-Request-Id")).Scan(&linked))
	require.Equal(e.T, liveID, linked, "linked to its resource")
	kind.End(key, liveID)
	e.RequireErased(kind.Create(key, "old-live", "live"), live, live.JSON()["secret"].(string), kind.SecretPrefix)
	require.Empty(e.T, e.KeptSecrets(key))
}

// CheckErasureLeavesAKeyTakenAgain checks that the sweeper's erasure of
// the answers of ended resources (erase: the task's pass,
// idempotency.EraseGoneAnswers) erases a row only while it still holds the
// answer it chose it for. An ended resource's answer whose 24 hours are
// over is taken again by a new request under its Idempotency-Key (its row
// re-claimed in place, before the purge deleted it) and answered with a
// live resource's secret: a pass whose snapshot predates that, and which
// reaches the row after it, rechecks the row at its newest version and
// leaves it. Before, the pass chose the rows by its snapshot (an ended
// resource's) and erased what the row held when it got there: the live
// resource's create, sent again, read 404 (ended since), and a client told
// so created another. The pass is held on the row of an earlier ended
// answer (the one it reaches first) while the key is taken again; clock
// is the env's; leaveEnded ends resources as an instance of the release
// before the erasure does, their answers kept.
func (e *Env) CheckErasureLeavesAKeyTakenAgain(kind SecretCreates, clock *Clock, leaveEnded func(ids ...string),
	erase func(context.Context) (int, error)) {
	e.T.Helper()
	ctx := context.Background()
	key := e.Signup().Key
	early := kind.Create(key, "ended-early", "early")
	clock.Add(time.Second)
	first := kind.Create(key, "taken-again", "first")
	for _, r := range []*Response{early, first} {
		require.Equal(e.T, http.StatusCreated, r.Status, "%s", r.Body)
	}
	leaveEnded(early.JSON()["id"].(string), first.JSON()["id"].(string))
	clock.Add(idempotency.TTL + time.Minute) // both keys' 24 hours are over

	hold, err := e.App.Pool.Begin(ctx)
	require.NoError(e.T, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `SELECT 1 FROM idempotent_requests WHERE request_id = $1 FOR UPDATE`,
		early.Header.Get("X-Request-Id"))
	require.NoError(e.T, err)
	done := make(chan error, 1)
	go func() {
		_, err := erase(ctx)
		done <- err
	}()
	WaitForLock(e.T, e.App.Pool, "%UPDATE idempotent_requests SET answer = NULL%", "%",
		"the pass waits for the early answer's row, its snapshot taken")
	// It has not reached the row taken again: that row is free.
	probe, err := e.App.Pool.Begin(ctx)
	require.NoError(e.T, err)
	_, err = probe.Exec(ctx, `SELECT 1 FROM idempotent_requests WHERE request_id = $1 FOR UPDATE NOWAIT`,
		first.Header.Get("X-Request-Id"))
	require.NoError(e.T, err, "the pass reaches the row taken again after the early one")
	require.NoError(e.T, probe.Rollback(ctx))

	second := kind.Create(key, "taken-again", "second")
	require.Equal(e.T, http.StatusCreated, second.Status, "%s", second.Body)
	require.NotEqual(e.T, first.JSON()["id"], second.JSON()["id"], "acted again: the key's 24 hours were over")
	require.NoError(e.T, hold.Rollback(ctx))
	require.NoError(e.T, <-done)

	var erased bool
	require.NoError(e.T, e.App.Pool.QueryRow(ctx, `SELECT answer IS NULL FROM idempotent_requests WHERE request_id = $1`,
		early.Header.Get("X-Request-Id")).Scan(&erased))
	require.True(e.T, erased, "the ended resource's answer is erased")
	again := kind.Create(key, "taken-again", "second")
	require.Equal(e.T, string(second.Body), string(again.Body), "the live resource's answer is kept")
}

// Statement is a statement with its arguments.
type Statement struct {
	SQL  string
	Args []any
}

// CheckErasuresReadLinkedAnswers checks that each of erasures (by name)
// reads the answers linked to a resource through
// idempotent_requests_resource_idx, not the day of answers every keyed
// create left, in both plan cache modes: in scratch copies of
// idempotent_requests and table, 20,000 answers, one in a thousand linked
// to resource prefix_plan<n>, that resources (an INSERT into table from
// generate_series(1000, 20000, 1000) g) makes ended.
func (e *Env) CheckErasuresReadLinkedAnswers(table, prefix, resources string, erasures map[string]Statement) {
	e.T.Helper()
	ctx := context.Background()
	tx := testpg.Scratch(ctx, e.T, e.App.Pool, "idempotent_requests", table)
	_, err := tx.Exec(ctx, fmt.Sprintf(`
		INSERT INTO idempotent_requests (key_id, idempotency_key, request_hash, request_id, status, answer, created_at,
		    resource_id)
		SELECT 'key_plan', 'k' || g, '\x00', 'req_' || g, 201, '\x01aa', now() - g * interval '1 second',
		       CASE WHEN g %% 1000 = 0 THEN '%s_plan' || g ELSE '' END
		FROM generate_series(1, 20000) g;
		%s;
		ANALYZE idempotent_requests; ANALYZE %s;`, prefix, resources, table))
	require.NoError(e.T, err)
	for _, mode := range testpg.PlanCacheModes {
		for name, stmt := range erasures {
			read, _, err := testpg.RowsRead(ctx, tx, mode, stmt.SQL, stmt.Args...)
			require.NoError(e.T, err, "%s, %s", name, mode)
			require.LessOrEqual(e.T, read["idempotent_requests"], 40, "%s, %s: rows of idempotent_requests read",
				name, mode)
		}
	}
}

package httpapi_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/ids"
)

// keyedCreate is a create whose body may carry an idempotency key of its
// own (bodyKey, in the route's casing), now taking an Idempotency-Key
// header too; table is where its rows are counted.
type keyedCreate struct {
	path, bodyKey, table string
}

var keyedCreates = []keyedCreate{
	{path: "/api/v1/runs", bodyKey: "idempotencyKey", table: "job_runs"},
	{path: "/api/v1/groups", bodyKey: "idempotency_key", table: "effect_groups"},
}

// rowsOf is how many rows of table workspace ws holds.
func rowsOf(t *testing.T, env *apitest.Env, table, ws string) int {
	t.Helper()
	var n int
	require.NoError(t, env.App.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+table+` WHERE workspace_id = $1`, ws).Scan(&n))
	return n
}

// A run's or a group's create sent again under its Idempotency-Key, with no
// key in its body, answers what the first answered and creates nothing
// more: the header was ignored, so a client that retried after a lost
// answer started a second run or opened a second group. Another body under
// the key is 409 idempotency_key_reuse.
func TestIdempotencyKeyAnswersARetriedRunOrGroupCreateOnce(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for _, c := range keyedCreates {
		body := map[string]any{"name": "nightly"}
		first := env.DoWith("POST", c.path, ws.Key, idemKey("create:"+c.table), body)
		require.Equal(t, http.StatusCreated, first.Status, "%s: %s", c.path, first.Body)
		require.Empty(t, first.Header.Get(httpapi.ReplayedHeader), c.path)

		again := env.DoWith("POST", c.path, ws.Key, idemKey("create:"+c.table), body)
		require.Equal(t, http.StatusCreated, again.Status, c.path)
		require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader), c.path)
		require.Equal(t, first.Header.Get("X-Request-Id"), again.Header.Get(httpapi.OriginalRequestHeader), c.path)
		require.Equal(t, string(first.Body), string(again.Body), c.path)
		require.Equal(t, 1, rowsOf(t, env, c.table, ws.ID), "%s: one created", c.path)

		other := env.DoWith("POST", c.path, ws.Key, idemKey("create:"+c.table), map[string]any{"name": "weekly"})
		require.Equal(t, http.StatusConflict, other.Status, c.path)
		require.Equal(t, "idempotency_key_reuse", other.ErrorCode(), c.path)
		require.Equal(t, 1, rowsOf(t, env, c.table, ws.ID), c.path)

		// Without the header, each create still acts.
		env.Must(http.StatusCreated, "POST", c.path, ws.Key, body)
		require.Equal(t, 2, rowsOf(t, env, c.table, ws.ID), c.path)
	}
}

// The header and the body's key compose: the header keeps whatever the
// create answered, the 201 that made the run or group and the 200 that
// found it under its body key alike (status and bytes), and the body key
// still finds it under another header or none.
func TestIdempotencyKeyKeepsAKeyedCreatesAnswerWhateverItWas(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	for _, c := range keyedCreates {
		body := map[string]any{"name": "nightly", c.bodyKey: "nightly:2026-12-07"}
		made := env.DoWith("POST", c.path, ws.Key, idemKey("made:"+c.table), body)
		require.Equal(t, http.StatusCreated, made.Status, "%s: %s", c.path, made.Body)
		require.Equal(t, false, made.JSON()["deduplicated"], c.path)

		found := env.DoWith("POST", c.path, ws.Key, idemKey("found:"+c.table), body)
		require.Equal(t, http.StatusOK, found.Status, "%s: %s", c.path, found.Body)
		require.Empty(t, found.Header.Get(httpapi.ReplayedHeader), c.path)
		require.Equal(t, true, found.JSON()["deduplicated"], c.path)
		require.Equal(t, made.JSON()["id"], found.JSON()["id"], c.path)

		for key, first := range map[string]*apitest.Response{"made:": made, "found:": found} {
			again := env.DoWith("POST", c.path, ws.Key, idemKey(key+c.table), body)
			require.Equal(t, first.Status, again.Status, "%s %s", c.path, key)
			require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader), "%s %s", c.path, key)
			require.Equal(t, string(first.Body), string(again.Body), "%s %s", c.path, key)
		}
		plain := env.Must(http.StatusOK, "POST", c.path, ws.Key, body)
		require.Equal(t, made.JSON()["id"], plain.JSON()["id"], c.path)
		require.Equal(t, 1, rowsOf(t, env, c.table, ws.ID), "%s: one created", c.path)

		// The body key's own reuse is refused under a fresh header, which
		// it leaves free for the corrected request.
		reused := map[string]any{"name": "weekly", c.bodyKey: "nightly:2026-12-07"}
		r := env.DoWith("POST", c.path, ws.Key, idemKey("reused:"+c.table), reused)
		require.Equal(t, "idempotency_key_reuse", r.ErrorCode(), c.path)
		fixed := map[string]any{"name": "weekly", c.bodyKey: "weekly:2026-12-07"}
		r = env.DoWith("POST", c.path, ws.Key, idemKey("reused:"+c.table), fixed)
		require.Equal(t, http.StatusCreated, r.Status, "%s: %s", c.path, r.Body)
		require.Equal(t, 2, rowsOf(t, env, c.table, ws.ID), c.path)
	}
}

// A keyed create under an Idempotency-Key reads what its body key names
// before its own transaction begins; one that finds nothing and then meets
// the key taken by a create that committed meanwhile is 409 retry_request,
// nothing kept, and the retry under the same header finds that run or group
// (200, deduplicated), the answer then kept.
func TestIdempotencyKeyOfAKeyedCreateThatMetAConcurrentOneRetries(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	ctx := context.Background()
	inserts := map[string]struct{ sql, id string }{
		"job_runs": {id: ids.New(ids.Run), sql: `INSERT INTO job_runs (id, workspace_id, name, status, created_at, idempotency_key, request_hash,
			keyed_step_keys) SELECT $2, workspace_id, name, status, created_at, 'concurrent', request_hash,
			true FROM job_runs WHERE workspace_id = $1 AND idempotency_key = 'template'`},
		"effect_groups": {id: ids.New(ids.Group), sql: `INSERT INTO effect_groups (id, workspace_id, name, state, created_by_key_id, created_at,
			updated_at, idempotency_key) SELECT $2, workspace_id, name, state, created_by_key_id,
			created_at, updated_at, 'concurrent' FROM effect_groups WHERE workspace_id = $1 AND idempotency_key = 'template'`},
	}
	for _, c := range keyedCreates {
		// A template made through the route, for the request hash a run
		// keeps; the concurrent create is its copy under the test's key.
		env.Must(http.StatusCreated, "POST", c.path, ws.Key, map[string]any{"name": "nightly", c.bodyKey: "template"})
		tx, err := env.App.Pool.Begin(ctx)
		require.NoError(t, err)
		tag, err := tx.Exec(ctx, inserts[c.table].sql, ws.ID, inserts[c.table].id)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected(), c.path)

		body := map[string]any{"name": "nightly", c.bodyKey: "concurrent"}
		done := make(chan *apitest.Response, 1)
		go func() { done <- env.DoWith("POST", c.path, ws.Key, idemKey("late:"+c.table), body) }()
		apitest.WaitForLock(t, env.App.Pool, "%INSERT INTO "+c.table+"%", "transactionid",
			"the create's insert waits for the concurrent one")
		require.NoError(t, tx.Commit(ctx))
		r := <-done
		require.Equal(t, http.StatusConflict, r.Status, "%s: %s", c.path, r.Body)
		require.Equal(t, "retry_request", r.ErrorCode(), c.path)

		again := env.DoWith("POST", c.path, ws.Key, idemKey("late:"+c.table), body)
		require.Equal(t, http.StatusOK, again.Status, "%s: %s", c.path, again.Body)
		require.Empty(t, again.Header.Get(httpapi.ReplayedHeader), "%s: nothing was kept", c.path)
		require.Equal(t, true, again.JSON()["deduplicated"], c.path)
		require.Equal(t, inserts[c.table].id, again.JSON()["id"], c.path)
		kept := env.DoWith("POST", c.path, ws.Key, idemKey("late:"+c.table), body)
		require.Equal(t, "true", kept.Header.Get(httpapi.ReplayedHeader), c.path)
		require.Equal(t, string(again.Body), string(kept.Body), c.path)
	}
}

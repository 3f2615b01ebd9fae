package apitest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

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

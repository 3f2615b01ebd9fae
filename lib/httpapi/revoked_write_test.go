package httpapi_test

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/httpapi"
)

// revokedWrite is one keyed route that changes something, sent whole and
// valid on the caller's own objects, under an Idempotency-Key or not.
type revokedWrite struct {
	route        httpapi.Route
	path         string
	body         any
	idempotently bool
}

// revokedWrites is every keyed route of the table that changes something
// but those that settle what was begun (a report, a heartbeat: README,
// they may pass for KEY_CACHE_TTL), MCP's transport (each tool call it
// makes goes through the router as a request of these routes) and
// checkedInTheirStatement's: each sent plain, and under an
// Idempotency-Key where the route takes one.
func (w *refusalWorld) revokedWrites(t *testing.T) []revokedWrite {
	doc := apitest.OpenAPIDoc(t)
	var out []revokedWrite
	for _, rt := range httpapi.Routes() {
		if rt.Method == http.MethodGet || rt.Auth != httpapi.AuthKey || rt.Settles || rt.Raw != nil {
			continue
		}
		if _, ok := checkedInTheirStatement[rt.Name]; ok {
			continue
		}
		op, _ := apitest.At(doc, "paths", rt.Pattern, strings.ToLower(rt.Method)).(map[string]any)
		require.NotNil(t, op, rt.Name)
		seed, hasBody := w.seedFor(t, rt.Method+" "+rt.Pattern, op)
		var body any
		if hasBody {
			body = mustJSON(seed)
		}
		c := revokedWrite{route: rt, path: w.ownPath(rt.Pattern), body: body}
		out = append(out, c)
		if rt.Idempotent {
			c.idempotently = true
			out = append(out, c)
		}
	}
	return out
}

// checkedInTheirStatement are the benchmarked calls that check their key
// in the statement that writes, taking no lock on it (a round trip more,
// or every call of a key sharing a lock on its row, would cost them):
// a revocation committed before that statement began refuses them, one
// committed as it runs may not (README). Each names its own test.
var checkedInTheirStatement = map[string]string{
	"effects.begin": "lib/gate TestARevokedKeyBeginsNothingOnAnotherInstance",
	"runs.enqueue":  "TestARevokedKeyEnqueuesNothingOnAnotherInstance",
	"workers.claim": "TestARevokedKeyClaimsNothingOnAnotherInstance",
}

// refusedHereAnyway are the routes whose valid request this world's objects
// refuse for what they are, with the answer: the request writes nothing
// either way (the effect is leased, not indeterminate; the delivery id
// names none), and is answered that refusal or 401.
var refusedHereAnyway = map[string]struct {
	status int
	code   string
}{
	"effects.resolve":           {http.StatusConflict, "invalid_state"},
	"webhooks.deliveries.retry": {http.StatusNotFound, "not_found"},
}

// TestAKeyRevokedAsItWritesWritesNothing: a key read live by a call that
// changes something, then revoked (committed) before the call writes,
// writes nothing: every keyed route that changes something, settling calls
// aside, is sent whole and valid on the caller's own objects (plain, and
// under an Idempotency-Key where it takes one) by a key whose row the test
// holds as a revoke does before it writes (sqlLockRevoke's FOR UPDATE);
// once the request answered or waits for that row, the test revokes the
// key and commits. The request is answered 401 unauthorized, as a revoked
// key is (refusedHereAnyway's may be answered their refusal), and no
// table but the key's own row changed (README: a write that commits after
// its key's revocation committed is refused).
//
// Not parallel: the digest covers the whole database (refusalWorld).
func TestAKeyRevokedAsItWritesWritesNothing(t *testing.T) {
	w := newRefusalWorld(t)
	ctx := context.Background()
	pool := w.env.App.Pool
	for _, c := range w.revokedWrites(t) {
		name := c.route.Name
		if c.idempotently {
			name += " under an Idempotency-Key"
		}
		t.Run(name, func(t *testing.T) {
			e := *w.env
			e.T = t
			minted := e.Must(http.StatusCreated, "POST", "/api/v1/keys", w.own.Key,
				map[string]any{"name": "revoked as it writes", "scopes": auth.AllScopes}).JSON()
			id, secret := minted["id"].(string), minted["secret"].(string)
			path := c.path
			var header http.Header
			if c.idempotently {
				header = http.Header{"Idempotency-Key": {"revoked-as-it-writes"}}
			}

			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, `SELECT 1 FROM api_keys WHERE id = $1 FOR UPDATE`, id)
			require.NoError(t, err)
			before := w.digestBut(t, id)
			done := make(chan struct{})
			var res *apitest.Response
			go func() {
				defer close(done)
				res = e.DoWith(c.route.Method, path, secret, header, c.body)
			}()
			apitest.WaitDoneOrBlockedBy(t, pool, apitest.BackendPID(t, tx), done,
				name+": the request answers or waits for the key's row")
			_, err = tx.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, id)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			<-done

			if refusal, ok := refusedHereAnyway[c.route.Name]; ok && res.Status == refusal.status {
				// Refused before it had anything to commit: the key is
				// checked as its transaction commits.
				require.Equal(t, refusal.code, res.ErrorCode())
			} else {
				require.Equal(t, http.StatusUnauthorized, res.Status, "%s %s: %s", c.route.Method, path, clip(res.Body))
				require.Equal(t, "unauthorized", res.ErrorCode())
			}
			after := w.digestBut(t, id)
			for _, table := range slices.Sorted(maps.Keys(before)) {
				require.Equal(t, before[table], after[table], "%s changed table %s", name, table)
			}
		})
	}
}

// digestBut is digest with api_keys' rows but key id's.
func (w *refusalWorld) digestBut(t *testing.T, id string) map[string]string {
	out := w.digest(t)
	var keys string
	require.NoError(t, w.env.App.Pool.QueryRow(context.Background(), `SELECT md5(coalesce(
		string_agg(x::text, E'\n' ORDER BY x::text), '')) FROM api_keys x WHERE id <> $1`, id).Scan(&keys))
	out["public.api_keys"] = keys
	return out
}

// TestAKeyRevokedAfterItsPolicyCommittedDoesNotFailThePut: a policy write
// that lowers a retention commits the policy, then dates the type's kept
// groups in transactions of their own (shortenKeptGroups). Those follow
// from the committed policy: a revocation committed between the two does
// not answer the PUT 401 (which says nothing changed) after its policy
// changed. The test holds the dating's claim of the type, revokes the key
// once the PUT waits for it (its policy committed), then lets it go on.
func TestAKeyRevokedAfterItsPolicyCommittedDoesNotFailThePut(t *testing.T) {
	t.Parallel()
	e := apitest.Start(t)
	ws := e.Signup()
	ctx := context.Background()
	pool := e.App.Pool
	e.Must(http.StatusOK, "PUT", "/api/v1/policies/revoked.after", ws.Key, map[string]any{"retention_days": 100})
	minted := e.Must(http.StatusCreated, "POST", "/api/v1/keys", ws.Key,
		map[string]any{"name": "revoked after its write", "scopes": auth.AllScopes}).JSON()
	id, secret := minted["id"].(string), minted["secret"].(string)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('groups_to_date:' || $1::text || ':' ||
		$2::text, 0))`, ws.ID, "revoked.after")
	require.NoError(t, err)
	done := make(chan struct{})
	var res *apitest.Response
	go func() {
		defer close(done)
		res = e.Do("PUT", "/api/v1/policies/revoked.after", secret, map[string]any{"retention_days": 30})
	}()
	apitest.WaitDoneOrBlockedBy(t, pool, apitest.BackendPID(t, tx), done, "the PUT dates its groups")
	require.Equal(t, 30, int(e.Must(http.StatusOK, "GET", "/api/v1/policies/revoked.after", ws.Key, nil).
		JSON()["retention_days"].(float64)), "the policy committed before its dating")
	e.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+id, ws.Key, nil)
	require.NoError(t, tx.Rollback(ctx))
	<-done
	require.Equal(t, http.StatusOK, res.Status, "%s", clip(res.Body))
}

package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/idempotency"
)

// mintedKey is a key a test minted: its id and secret.
type mintedKey struct{ id, secret string }

// mintKey mints a key with body by the key whose secret is by.
func mintKey(t *testing.T, env *apitest.Env, by string, body map[string]any) mintedKey {
	t.Helper()
	k := env.Must(http.StatusCreated, "POST", "/api/v1/keys", by, body).JSON()
	return mintedKey{k["id"].(string), k["secret"].(string)}
}

// minter is a body minting a key that may mint keys in turn.
func minter(name string) map[string]any {
	return map[string]any{"name": name, "scopes": []string{"keys:write", "effects:begin"}}
}

// leaf is a body minting a key that may not.
func leaf(name string) map[string]any {
	return map[string]any{"name": name, "scopes": []string{"effects:begin"}}
}

// keyStates reads every key's revoked_at (nil while live) in the workspaces
// whose keys name, straight from the table.
func keyStates(t *testing.T, env *apitest.Env, keys ...string) map[string]*time.Time {
	t.Helper()
	var workspaces []string
	for _, k := range keys {
		var ws string
		require.NoError(t, env.App.Pool.QueryRow(context.Background(),
			`SELECT workspace_id FROM api_keys WHERE id = $1`, k).Scan(&ws))
		workspaces = append(workspaces, ws)
	}
	rows, err := env.App.Pool.Query(context.Background(),
		`SELECT id, revoked_at FROM api_keys WHERE workspace_id = ANY($1)`, workspaces)
	require.NoError(t, err)
	out := map[string]*time.Time{}
	for rows.Next() {
		var id string
		var at *time.Time
		require.NoError(t, rows.Scan(&id, &at))
		out[id] = at
	}
	require.NoError(t, rows.Err())
	return out
}

// revokeWithMinted sends DELETE /api/v1/keys/{id}?include_minted=true.
func revokeWithMinted(env *apitest.Env, by, id string) *apitest.Response {
	return env.Do("DELETE", "/api/v1/keys/"+id+"?include_minted=true", by, nil)
}

// mintedRevoked reads a cascade's minted_revoked.
func mintedRevoked(t *testing.T, r *apitest.Response) []string {
	t.Helper()
	require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
	list, ok := r.JSON()["minted_revoked"].([]any)
	require.True(t, ok, "minted_revoked is a list: %s", r.Body)
	out := []string{}
	for _, id := range list {
		out = append(out, id.(string))
	}
	return out
}

// DELETE /api/v1/keys/{id}?include_minted=true revokes the key and every
// live key minted from it, down the tree and through a key revoked before
// (whose children lived on), answering the key as a revoke does with the
// ids revoked with it, sorted; a sibling outside the tree and another
// workspace's keys are untouched, and each key revoked has its create's
// kept answer, which showed its secret, erased (as a revoke erases its
// key's). Sent again, it answers what the first did, byte for byte, the
// keys it took listed again; a key revoked alone before is answered as it was,
// its live tree revoked.
func TestARevokeWithMintedRevokesTheTree(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	other := env.Signup()
	theirs := mintKey(t, env, other.Key, minter("theirs"))
	theirChild := mintKey(t, env, theirs.secret, leaf("their child"))

	a := mintKey(t, env, ws.Key, minter("a"))
	b1 := mintKey(t, env, a.secret, minter("b1"))
	b2 := mintKey(t, env, a.secret, leaf("b2"))
	c1 := mintKey(t, env, b1.secret, minter("c1"))
	c2create := env.DoWith("POST", "/api/v1/keys", b1.secret, http.Header{idempotency.Header: {"c2-create"}}, leaf("c2"))
	require.Equal(t, http.StatusCreated, c2create.Status, "%s", c2create.Body)
	c2 := mintedKey{c2create.JSON()["id"].(string), c2create.JSON()["secret"].(string)}
	d1 := mintKey(t, env, c1.secret, leaf("d1"))
	siblingCreate := env.DoWith("POST", "/api/v1/keys", ws.Key, http.Header{idempotency.Header: {"sibling-create"}},
		minter("sibling"))
	require.Equal(t, http.StatusCreated, siblingCreate.Status, "%s", siblingCreate.Body)
	sibling := mintedKey{siblingCreate.JSON()["id"].(string), siblingCreate.JSON()["secret"].(string)}
	nephew := mintKey(t, env, sibling.secret, leaf("nephew"))
	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+b1.id, ws.Key, nil) // the middle key, alone
	// A key of another workspace naming a key of this one as its minter
	// (none is minted so: the tree is read within the workspace) is not
	// of the tree.
	_, err := env.App.Pool.Exec(context.Background(), `UPDATE api_keys SET created_by_key_id = $1 WHERE id = $2`,
		a.id, theirChild.id)
	require.NoError(t, err)
	keptAnswers := func(id string) (n int) {
		require.NoError(t, env.App.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM idempotent_requests WHERE resource_id = $1 AND answer IS NOT NULL`, id).Scan(&n))
		return n
	}
	require.Equal(t, 1, keptAnswers(c2.id), "c2's create's answer, which shows its secret, is kept")
	before := keyStates(t, env, a.id, theirs.id)

	r := revokeWithMinted(env, ws.Key, a.id)
	want := []string{b2.id, c1.id, c2.id, d1.id}
	slices.Sort(want)
	require.Equal(t, want, mintedRevoked(t, r), "the live keys below it, sorted; b1 was revoked already")
	k := r.JSON()
	require.Equal(t, a.id, k["id"])
	require.NotNil(t, k["revoked_at"])
	after := keyStates(t, env, a.id, theirs.id)
	at := after[a.id]
	for _, id := range append([]string{a.id}, want...) {
		require.NotNil(t, after[id], id)
		require.True(t, at.Equal(*after[id]), "%s revoked with the key, in its transaction", id)
	}
	require.Equal(t, before[b1.id], after[b1.id], "the key revoked before keeps its revoked_at")
	for _, id := range []string{sibling.id, nephew.id, theirs.id, theirChild.id} {
		require.Nil(t, after[id], "%s is outside the tree", id)
	}
	for _, s := range []string{a.secret, b2.secret, c1.secret, c2.secret, d1.secret} {
		require.Equal(t, http.StatusUnauthorized, env.Do("GET", "/api/v1/keys/current", s, nil).Status)
	}
	env.Must(http.StatusOK, "GET", "/api/v1/keys/current", nephew.secret, nil)
	require.Zero(t, keptAnswers(c2.id), "the answer that showed c2's secret is erased with it")
	require.Equal(t, 1, keptAnswers(sibling.id), "the sibling's is kept")

	// Sent again, its answer lost: the first answer, byte for byte, the
	// keys it revoked with the key listed again (not [], which would say
	// the compromised key had minted nothing), nothing more revoked; the
	// plain revoke (include_minted=false too) answers the key alone.
	again := revokeWithMinted(env, ws.Key, a.id)
	require.Equal(t, string(r.Body), string(again.Body))
	single := env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+a.id, ws.Key, nil)
	require.NotContains(t, string(single.Body), "minted_revoked", "a plain revoke answers the key alone")
	mintedJSON, err := json.Marshal(want)
	require.NoError(t, err)
	require.Equal(t, string(single.Body),
		strings.Replace(string(again.Body), `,"minted_revoked":`+string(mintedJSON), "", 1))
	off := env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+a.id+"?include_minted=false", ws.Key, nil)
	require.Equal(t, string(single.Body), string(off.Body))
	require.Equal(t, after, keyStates(t, env, a.id, theirs.id))

	// A key revoked alone, its children live: the retry answers it as it
	// was revoked and revokes them.
	first := env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+sibling.id, ws.Key, nil)
	retry := revokeWithMinted(env, ws.Key, sibling.id)
	require.Equal(t, []string{nephew.id}, mintedRevoked(t, retry))
	require.Equal(t, first.JSON()["revoked_at"], retry.JSON()["revoked_at"])
	require.Equal(t, string(retry.Body), string(revokeWithMinted(env, ws.Key, sibling.id).Body),
		"that revoke sent again lists the nephew again")
	require.NotNil(t, keyStates(t, env, a.id)[nephew.id])
	require.Nil(t, keyStates(t, env, theirs.id)[theirChild.id])
}

// include_minted is true or false: any other value, an empty one too, or
// the parameter twice, is 400 invalid_request at include_minted, and
// revokes nothing.
func TestIncludeMintedIsTrueOrFalse(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	a := mintKey(t, env, ws.Key, minter("a"))
	mintKey(t, env, a.secret, leaf("b"))
	before := keyStates(t, env, a.id)
	for _, bad := range []string{"", "TRUE", "True", "1", "0", "yes", "false%20", "true&include_minted=true"} {
		r := env.Do("DELETE", "/api/v1/keys/"+a.id+"?include_minted="+bad, ws.Key, nil)
		require.Equal(t, []string{"include_minted"}, validationFields(t, r), "include_minted=%q", bad)
	}
	require.Equal(t, before, keyStates(t, env, a.id), "nothing revoked")
}

// A key of the tree the caller may not revoke alone refuses the whole
// revoke, as that revoke would refuse it, naming it in detail.key_id, and
// nothing is revoked: a key with scopes the caller lacks, a jobs:work key
// with tools the caller does not cover. Minting keeps a key's keys within
// its powers, so such a key was minted under older rules (written here
// into its row): the revoke checks every key all the same.
func TestARevokeWithMintedIsRefusedForAnyKeyOfTheTree(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	caller := mintKey(t, env, ws.Key, map[string]any{"name": "caller",
		"scopes": []string{"keys:write", "effects:begin", "jobs:work"}, "tools": []string{"a@1"}})
	a := mintKey(t, env, caller.secret, map[string]any{"name": "a",
		"scopes": []string{"keys:write", "effects:begin", "jobs:work"}, "tools": []string{"a@1"}})
	b := mintKey(t, env, a.secret, minter("b"))
	worker := mintKey(t, env, b.secret, leaf("worker"))
	wide := mintKey(t, env, b.secret, leaf("wide"))
	set := func(id, sql string) {
		_, err := env.App.Pool.Exec(context.Background(), `UPDATE api_keys SET `+sql+` WHERE id = $1`, id)
		require.NoError(t, err)
	}
	set(worker.id, `scopes = '{jobs:work}', tools = '{b@1}'`)
	set(wide.id, `scopes = '{effects:begin,policies:write}'`)
	before := keyStates(t, env, a.id)

	refused := func(key mintedKey, required ...string) {
		t.Helper()
		r := revokeWithMinted(env, caller.secret, a.id)
		require.Equal(t, http.StatusForbidden, r.Status, "%s", r.Body)
		detail := r.JSON()["error"].(map[string]any)["detail"].(map[string]any)
		require.Equal(t, key.id, detail["key_id"], "%s", r.Body)
		var got []string
		for _, s := range detail["required"].([]any) {
			got = append(got, s.(string))
		}
		require.Equal(t, required, got)
		single := env.Do("DELETE", "/api/v1/keys/"+key.id, caller.secret, nil)
		require.Equal(t, r.JSON()["error"].(map[string]any)["code"], single.ErrorCode(), "as its own revoke")
		require.Equal(t, before, keyStates(t, env, a.id), "nothing revoked")
	}
	refused(worker, "tool:b@1")
	set(worker.id, `tools = '{a@1}'`)
	refused(wide, "policies:write")
	set(wide.id, `scopes = '{effects:begin}'`)

	// The key itself, first: detail.key_id names it too.
	r := revokeWithMinted(env, b.secret, a.id)
	require.Equal(t, http.StatusForbidden, r.Status, "%s", r.Body)
	require.Equal(t, a.id, r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["key_id"])
	require.Equal(t, before, keyStates(t, env, a.id))

	// Another workspace's key is none.
	other := env.Signup()
	require.Equal(t, http.StatusNotFound, revokeWithMinted(env, other.Key, a.id).Status)
	require.Equal(t, before, keyStates(t, env, a.id))

	require.Len(t, mintedRevoked(t, revokeWithMinted(env, caller.secret, a.id)), 3)
}

// A revoke with minted keys that would leave the workspace no root key
// (every scope, no tools, no ceiling) is refused 409 invalid_state, naming
// the first root of the tree in detail.key_id, and revokes nothing; with a
// root outside the tree it revokes them.
func TestARevokeWithMintedKeepsARootKey(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	signupID := env.Must(http.StatusOK, "GET", "/api/v1/keys/current", ws.Key, nil).JSON()["id"].(string)
	r1 := mintKey(t, env, ws.Key, map[string]any{"name": "r1", "preset": "OPERATOR"})
	r2 := mintKey(t, env, r1.secret, map[string]any{"name": "r2", "preset": "OPERATOR"})
	leafOfR2 := mintKey(t, env, r2.secret, leaf("leaf"))

	// Every key descends from the signup key.
	before := keyStates(t, env, signupID)
	r := revokeWithMinted(env, r2.secret, signupID)
	require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
	require.Equal(t, "invalid_state", r.ErrorCode())
	require.Equal(t, signupID, r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["key_id"])
	require.Equal(t, before, keyStates(t, env, signupID))

	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+signupID, r2.secret, nil) // r1 and r2 are left
	before = keyStates(t, env, r1.id)
	r = revokeWithMinted(env, r2.secret, r1.id)
	require.Equal(t, http.StatusConflict, r.Status, "%s", r.Body)
	require.Equal(t, "invalid_state", r.ErrorCode())
	require.Equal(t, r1.id, r.JSON()["error"].(map[string]any)["detail"].(map[string]any)["key_id"])
	require.Equal(t, before, keyStates(t, env, r1.id), "neither root, nor the leaf, revoked")

	r3 := mintKey(t, env, r1.secret, map[string]any{"name": "r3", "preset": "OPERATOR"}) // outside r2's tree
	r = revokeWithMinted(env, r3.secret, r2.id)
	require.Equal(t, []string{leafOfR2.id}, mintedRevoked(t, r))
}

// A key of the tree minting a key as the tree is revoked: either the mint
// commits first and the revoke revokes its key too (it read the tree
// before that commit, and waited for the minter's row the mint held), or
// the revoke locks the minter first and the mint, which waited for it, is
// refused 401: no key minted from the tree outlives the revoke.
func TestAKeyMintedAsItsTreeIsRevokedIsRevokedOrRefused(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ctx := context.Background()
	ws := env.Signup()
	a := mintKey(t, env, ws.Key, minter("a"))
	b := mintKey(t, env, a.secret, minter("b"))

	send := func(method, path, key string, body any) (<-chan struct{}, *apitest.Response) {
		done := make(chan struct{})
		var r apitest.Response
		go func() {
			defer close(done)
			r = *env.Do(method, path, key, body)
		}()
		return done, &r
	}
	hold := func(sql string, args ...any) (pgx.Tx, *apitest.LockWaits) {
		tx, err := env.App.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, sql, args...)
		require.NoError(t, err)
		return tx, apitest.NewLockWaits(t, env.App.Pool, apitest.BackendPID(t, tx))
	}

	// The mint first: it holds b's row and waits, at its insert, for the
	// workspace's row (the test's); the revoke reads the tree, then waits
	// for b's row.
	tx, waits := hold(`SELECT 1 FROM workspaces WHERE id = $1 FOR UPDATE`, ws.ID)
	mintDone, mint := send("POST", "/api/v1/keys", b.secret, leaf("racing"))
	waits.Waiting(mintDone, "the mint holds b's row and waits for the workspace's")
	revokeDone, revoke := send("DELETE", "/api/v1/keys/"+a.id+"?include_minted=true", ws.Key, nil)
	waits.Waiting(revokeDone, "the revoke waits for b's row, behind the mint")
	require.NoError(t, tx.Commit(ctx))
	<-mintDone
	<-revokeDone
	require.Equal(t, http.StatusCreated, mint.Status, "%s", mint.Body)
	racing := mint.JSON()["id"].(string)
	want := []string{b.id, racing}
	slices.Sort(want)
	require.Equal(t, want, mintedRevoked(t, revoke), "the key minted as it ran is revoked too")
	require.NotNil(t, keyStates(t, env, a.id)[racing])

	// The revoke first: it holds the tree's rows and waits for a root
	// minted after them (the test's); the mint waits for its minter's row.
	c := mintKey(t, env, ws.Key, minter("c"))
	d := mintKey(t, env, c.secret, minter("d"))
	root := mintKey(t, env, ws.Key, map[string]any{"name": "root", "preset": "OPERATOR"})
	for root.id < c.id || root.id < d.id { // ids made in one millisecond are not ordered
		root = mintKey(t, env, ws.Key, map[string]any{"name": "root", "preset": "OPERATOR"})
	}
	tx, waits = hold(`SELECT 1 FROM api_keys WHERE id = $1 FOR SHARE`, root.id)
	revokeDone, revoke = send("DELETE", "/api/v1/keys/"+c.id+"?include_minted=true", ws.Key, nil)
	waits.Waiting(revokeDone, "the revoke holds c's and d's rows and waits for the root's")
	mintDone, mint = send("POST", "/api/v1/keys", d.secret, leaf("late"))
	waits.Waiting(mintDone, "the mint waits for d's row, behind the revoke")
	require.NoError(t, tx.Commit(ctx))
	<-mintDone
	<-revokeDone
	require.Equal(t, []string{d.id}, mintedRevoked(t, revoke))
	require.Equal(t, http.StatusUnauthorized, mint.Status, "%s", mint.Body)
	var minted int
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE created_by_key_id = $1`,
		d.id).Scan(&minted))
	require.Zero(t, minted, "d minted nothing")
}

// Revokes with minted keys, revokes alone and mints racing over
// overlapping trees all answer (no deadlock, no 500), and every key ends
// revoked once: each is listed by one revoke's minted_revoked at most,
// and a key's revoked_at is the one each revoke of it answered.
func TestRevokesOfOverlappingTreesRacing(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ws := env.Signup()
	rng := rand.New(rand.NewPCG(7, 11))
	var keys []mintedKey
	tops := []mintedKey{mintKey(t, env, ws.Key, minter("t0")), mintKey(t, env, ws.Key, minter("t1"))}
	keys = append(keys, tops...)
	for i := range 30 {
		parent := keys[rng.IntN(len(keys))]
		keys = append(keys, mintKey(t, env, parent.secret, minter(fmt.Sprint("k", i))))
	}
	const racers, rounds = 6, 8
	type answer struct {
		id      string
		cascade bool
		r       *apitest.Response
	}
	var (
		mu      sync.Mutex
		answers []answer
		minted  []string
	)
	apitest.StartTogether(racers, func(i int) {
		rng := rand.New(rand.NewPCG(uint64(i), 3))
		for range rounds {
			k := keys[rng.IntN(len(keys))]
			switch rng.IntN(3) {
			case 0:
				r := env.Do("POST", "/api/v1/keys", k.secret, leaf("racer"))
				require.Contains(t, []int{http.StatusCreated, http.StatusUnauthorized}, r.Status, "%s", r.Body)
				if r.Status == http.StatusCreated {
					mu.Lock()
					minted = append(minted, r.JSON()["id"].(string))
					mu.Unlock()
				}
			default:
				cascade := rng.IntN(2) == 0
				path := "/api/v1/keys/" + k.id
				if cascade {
					path += "?include_minted=true"
				}
				r := env.Do("DELETE", path, ws.Key, nil)
				require.Equal(t, http.StatusOK, r.Status, "%s", r.Body)
				mu.Lock()
				answers = append(answers, answer{k.id, cascade, r})
				mu.Unlock()
			}
		}
	})
	for _, top := range tops {
		r := revokeWithMinted(env, ws.Key, top.id)
		answers = append(answers, answer{top.id, true, r})
	}
	states := keyStates(t, env, tops[0].id)
	// Each key is listed by the revokes of one key at most: a revoke of
	// the same key sent again lists what the first took again.
	claimers := map[string]map[string]bool{}
	for _, a := range answers {
		require.Equal(t, http.StatusOK, a.r.Status, "%s", a.r.Body)
		at, err := time.Parse(time.RFC3339Nano, a.r.JSON()["revoked_at"].(string))
		require.NoError(t, err)
		require.True(t, at.Equal(*states[a.id]), "%s: the revoked_at every revoke of it answers", a.id)
		if a.cascade {
			for _, id := range mintedRevoked(t, a.r) {
				if claimers[id] == nil {
					claimers[id] = map[string]bool{}
				}
				claimers[id][a.id] = true
			}
		}
	}
	for _, k := range keys {
		require.NotNil(t, states[k.id], k.id)
		require.LessOrEqual(t, len(claimers[k.id]), 1, "%s revoked with one key", k.id)
	}
	for _, id := range minted {
		require.NotNil(t, states[id], "%s, minted as the trees were revoked", id)
		require.LessOrEqual(t, len(claimers[id]), 1, id)
	}
}

// A key revoked as its own revoke of another key waits revokes nothing
// (README: a revoked key changes nothing, on any instance): its request
// read it live, but the revoke checks the caller among the rows it locks,
// as a mint holds its minter's row (security review: k, found compromised,
// revoked the operator's key o after o's revoke of k had committed, the
// two having waited for each other's root rows).
func TestAKeyRevokedAsItsRevokeWaitsRevokesNothing(t *testing.T) {
	t.Parallel()
	env := apitest.Start(t)
	ctx := context.Background()
	ws := env.Signup()
	o := mintedKey{env.Must(http.StatusOK, "GET", "/api/v1/keys/current", ws.Key, nil).JSON()["id"].(string), ws.Key}
	k := mintKey(t, env, o.secret, map[string]any{"name": "compromised", "preset": "OPERATOR"})
	x := mintKey(t, env, o.secret, map[string]any{"name": "spare", "preset": "OPERATOR"})
	// Every revoke locks every root key in id order: the test holds the
	// last, so o's revoke of k holds the others and waits, and k's revoke
	// of o, its key read live, waits behind it.
	last := slices.Max([]string{o.id, k.id, x.id})
	tx, err := env.App.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM api_keys WHERE id = $1 FOR UPDATE`, last)
	require.NoError(t, err)
	waits := apitest.NewLockWaits(t, env.App.Pool, apitest.BackendPID(t, tx))
	send := func(path, key string) (<-chan struct{}, *apitest.Response) {
		done := make(chan struct{})
		var r apitest.Response
		go func() {
			defer close(done)
			r = *env.Do("DELETE", path, key, nil)
		}()
		return done, &r
	}
	ofK, revokeK := send("/api/v1/keys/"+k.id, o.secret)
	waits.Waiting(ofK, "o's revoke of k holds the first root rows and waits for the last")
	byK, revokeO := send("/api/v1/keys/"+o.id, k.secret)
	waits.Waiting(byK, "k's revoke of o, k read live, waits behind o's")
	require.NoError(t, tx.Rollback(ctx))
	<-ofK
	<-byK
	require.Equal(t, http.StatusOK, revokeK.Status, "%s", revokeK.Body)
	require.Equal(t, http.StatusUnauthorized, revokeO.Status, "k was revoked before its revoke acted: %s", revokeO.Body)
	require.Equal(t, "unauthorized", revokeO.ErrorCode())
	states := keyStates(t, env, o.id)
	require.Nil(t, states[o.id], "o is live")
	require.NotNil(t, states[k.id])
	env.Must(http.StatusOK, "GET", "/api/v1/keys/current", o.secret, nil)
}

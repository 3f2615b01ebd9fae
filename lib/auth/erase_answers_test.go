package auth_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/idempotency"
)

func underKey(k string) http.Header { return http.Header{idempotency.Header: {k}} }

// keySecretPrefix begins every key's secret.
const keySecretPrefix = "rk_"

// createUnder mints a key named name under the Idempotency-Key idemKey.
func createUnder(t *testing.T, env *apitest.Env, key, idemKey, name string) *apitest.Response {
	t.Helper()
	r := env.DoWith("POST", "/api/v1/keys", key, underKey(idemKey), map[string]any{"name": name, "preset": "AGENT"})
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	return r
}

// A revoke erases the answer kept for its key's create's Idempotency-Key,
// which showed the key's secret, in its transaction: a replay of the
// create is 404 not_found (marked as given again), never the secret and
// never a second key, the Idempotency-Key stays used for other requests,
// and the table keeps no sealed copy of the secret. Before, the answer
// kept the revoked key's secret for its 24 hours and a replay showed it.
// Another key's answer is kept.
func TestARevokeErasesTheAnswerThatShowedItsSecret(t *testing.T) {
	env := apitest.Start(t)
	ctx := context.Background()
	ws := env.Signup()
	created := createUnder(t, env, ws.Key, "key-create", "revoked")
	id, secret := created.JSON()["id"].(string), created.JSON()["secret"].(string)
	kept := createUnder(t, env, ws.Key, "key-kept", "kept")
	keptSecret := kept.JSON()["secret"].(string)
	require.ElementsMatch(t, []string{secret, keptSecret}, env.KeptSecrets(ws.Key))
	again := env.DoWith("POST", "/api/v1/keys", ws.Key, underKey("key-create"), map[string]any{"name": "revoked", "preset": "AGENT"})
	require.Equal(t, string(created.Body), string(again.Body), "given again while the key lives")

	env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+id, ws.Key, nil)

	replay := env.DoWith("POST", "/api/v1/keys", ws.Key, underKey("key-create"), map[string]any{"name": "revoked", "preset": "AGENT"})
	env.RequireErased(replay, created, secret, keySecretPrefix)
	require.Contains(t, replay.JSON()["error"].(map[string]any)["message"], "revoked since")
	require.Equal(t, []string{keptSecret}, env.KeptSecrets(ws.Key), "no sealed copy of the revoked key's secret")
	var status int
	var answer []byte
	require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT status, answer FROM idempotent_requests
		WHERE request_id = $1`, created.Header.Get("X-Request-Id")).Scan(&status, &answer))
	require.Equal(t, http.StatusNotFound, status)
	require.Nil(t, answer)

	other := env.DoWith("POST", "/api/v1/keys", ws.Key, underKey("key-create"), map[string]any{"name": "other", "preset": "AGENT"})
	require.Equal(t, "idempotency_key_reuse", other.ErrorCode(), "the key stays used")
	list := env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, list, 3, "the replay minted nothing: the operator key and the two created")
	replayKept := env.DoWith("POST", "/api/v1/keys", ws.Key, underKey("key-kept"), map[string]any{"name": "kept", "preset": "AGENT"})
	require.Equal(t, string(kept.Body), string(replayKept.Body), "another key's answer is kept")
}

// A revoke racing the create of its key, the create held at the record of
// its answer (after the key's insert, before its commit), the revoke held
// before any statement of it that writes idempotent_requests until the
// create has committed: whichever way it lands, no revoked key's secret is
// left readable. The revoke either finds no key (404: its lock statement
// began before the create committed), and the key lives with its answer,
// or revokes it and erases that answer. A revoke that erased before it
// locked the key's row would read the answers as they were before the
// create committed, and then revoke the key it finds, its answer kept.
func TestARevokeRacingItsKeysCreateLeavesNoSecretReadable(t *testing.T) {
	env := apitest.Start(t)
	ctx := context.Background()
	pool := env.App.Pool
	ws := env.Signup()
	const createHeld, revokeHeld = 680068, 680069
	// The held create names its backend after the key it inserts
	// (application_name, which pg_stat_activity shows at once), so that
	// the revoke can name the key before it is committed.
	_, err := pool.Exec(ctx, fmt.Sprintf(`
		CREATE FUNCTION test_name_held_key() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM set_config('application_name', NEW.id, true); RETURN NEW; END $$;
		CREATE TRIGGER test_name_held_key AFTER INSERT ON api_keys FOR EACH ROW
		WHEN (NEW.name = 'held') EXECUTE FUNCTION test_name_held_key();
		CREATE FUNCTION test_hold_answer() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock(%d); RETURN NEW; END $$;
		CREATE TRIGGER test_hold_answer BEFORE UPDATE ON idempotent_requests FOR EACH ROW
		WHEN (NEW.idempotency_key = 'held-create' AND OLD.status IS NULL AND NEW.status IS NOT NULL)
		EXECUTE FUNCTION test_hold_answer();
		CREATE FUNCTION test_hold_others() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		    IF current_setting('application_name') NOT LIKE 'key\_%%' THEN
		        PERFORM pg_advisory_xact_lock_shared(%d);
		    END IF;
		    RETURN NULL;
		END $$;
		CREATE TRIGGER test_hold_others BEFORE UPDATE ON idempotent_requests FOR EACH STATEMENT
		EXECUTE FUNCTION test_hold_others();`, createHeld, revokeHeld))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `DROP TRIGGER IF EXISTS test_name_held_key ON api_keys;
			DROP TRIGGER IF EXISTS test_hold_answer ON idempotent_requests;
			DROP TRIGGER IF EXISTS test_hold_others ON idempotent_requests;
			DROP FUNCTION IF EXISTS test_name_held_key(); DROP FUNCTION IF EXISTS test_hold_answer();
			DROP FUNCTION IF EXISTS test_hold_others();`)
	})
	hold := func(lock int) pgx.Tx {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lock)
		require.NoError(t, err)
		return tx
	}
	// waiting counts the backends waiting on a lock, the held create's
	// (named after its key) or the others'.
	waiting := func(held bool) (n int, key string) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(max(application_name), '')
			FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
			  AND (application_name LIKE 'key\_%') = $1`, held).Scan(&n, &key))
		return n, key
	}

	createHolder := hold(createHeld)
	body := map[string]any{"name": "held", "preset": "AGENT"}
	created := make(chan *apitest.Response, 1)
	go func() { created <- env.DoWith("POST", "/api/v1/keys", ws.Key, underKey("held-create"), body) }()
	var id string
	require.Eventually(t, func() bool {
		n, key := waiting(true)
		id = key
		return n == 1
	}, 10*time.Second, 5*time.Millisecond, "the create waits at its answer, its key inserted")
	revokeHolder := hold(revokeHeld)
	revoked := make(chan *apitest.Response, 1)
	go func() { revoked <- env.Do("DELETE", "/api/v1/keys/"+id, ws.Key, nil) }()
	require.Eventually(t, func() bool {
		n, _ := waiting(false)
		return n > 0 || len(revoked) > 0
	}, 10*time.Second, 5*time.Millisecond, "the revoke waits (for the creator's row, or before its erasure)")
	require.NoError(t, createHolder.Commit(ctx))
	first := <-created
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	require.Equal(t, id, first.JSON()["id"])
	require.NoError(t, revokeHolder.Commit(ctx))
	secret := first.JSON()["secret"].(string)
	r := <-revoked
	t.Logf("revoke answered %d", r.Status)
	switch r.Status {
	case http.StatusOK:
	case http.StatusNotFound:
		// It came before the key: the key lives, and so does its answer.
		again := env.DoWith("POST", "/api/v1/keys", ws.Key, underKey("held-create"), body)
		require.Equal(t, string(first.Body), string(again.Body), "the key lives")
		require.Contains(t, env.KeptSecrets(ws.Key), secret)
		env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+id, ws.Key, nil)
	default:
		t.Fatalf("the revoke answered %d: %s", r.Status, r.Body)
	}
	env.RequireErased(env.DoWith("POST", "/api/v1/keys", ws.Key, underKey("held-create"), body), first, secret,
		keySecretPrefix)
	require.NotContains(t, env.KeptSecrets(ws.Key), secret)
}

// An answer kept before migration 0068 (before 0067, or by the release of
// 0067, which recorded it as showing no secret; or by an instance of the
// previous release during the deploy) names no key, so a revoke does not
// find it: the sweeper links it (idempotency.link_secrets, which knows a
// key's create's answer from a webhook's) and, in the same pass, erases
// those of revoked keys (keys.revoked_secrets), leaving a live key's
// linked for its revoke.
func TestTheSweeperErasesTheAnswersOfRevokedKeysKeptBeforeTheUpgrade(t *testing.T) {
	env := apitest.Start(t)
	kind := keyCreates(env)
	kind.End = func(key, id string) { env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+id, key, nil) }
	env.CheckAnswersKeptBeforeTheUpgrade(kind)
}

// keyCreates mints keys under Idempotency-Keys, for the apitest checks of
// their answers' erasure.
func keyCreates(env *apitest.Env) apitest.SecretCreates {
	return apitest.SecretCreates{
		Create: func(key, idemKey, name string) *apitest.Response {
			return env.DoWith("POST", "/api/v1/keys", key, underKey(idemKey), map[string]any{"name": name, "preset": "AGENT"})
		},
		SecretPrefix: keySecretPrefix,
	}
}

// The sweeper's erasure of revoked keys' answers leaves a row whose
// Idempotency-Key's 24 hours ended and that a new key's create took again
// after the pass's snapshot: sent again, that create answers the live key,
// not 404 (apitest.CheckErasureLeavesAKeyTakenAgain).
func TestTheSweepersErasureLeavesAnAnswerTakenAgainForALiveKey(t *testing.T) {
	clock := apitest.NewClock(time.Now())
	env := apitest.Start(t, apitest.WithNow(clock.Now))
	env.CheckErasureLeavesAKeyTakenAgain(keyCreates(env), clock, func(ids ...string) { // revoked as the release before 0068 revokes: its answers kept
		_, err := env.App.Pool.Exec(context.Background(), `UPDATE api_keys SET revoked_at = $2 WHERE id = ANY($1)`,
			ids, clock.Now())
		require.NoError(t, err)
	}, func(ctx context.Context) (int, error) { return env.App.Server.Auth.EraseRevokedAnswers(ctx, 1000) })
}

// A revoke's erasure and the sweeper's read the answers linked to a key
// through idempotent_requests_resource_idx, not the day of answers every
// keyed create left (20,000 here, a few linked), in both plan cache modes.
func TestTheKeysErasuresReadTheLinkedAnswersOnly(t *testing.T) {
	env := apitest.Start(t)
	env.CheckErasuresReadLinkedAnswers("api_keys", "key", `
		INSERT INTO api_keys (id, workspace_id, name, secret_hash, scopes, created_at, revoked_at)
		SELECT 'key_plan' || g, 'ws_plan', 'k', '\x00', '{effects:begin}', now(), now()
		FROM generate_series(1000, 20000, 1000) g`, map[string]apitest.Statement{
		"revoke":  {SQL: auth.SQLRevoke, Args: []any{[]string{"key_plan1000"}, time.Now(), "key_plan1000"}},
		"sweeper": {SQL: auth.SQLEraseRevokedAnswers, Args: []any{1000}},
	})
}

// Replays of a key's create on two instances racing the key's revoke each
// answer the create's answer byte for byte or 404 without the secret;
// every replay sent once the revoke has answered is the 404, on either
// instance, and a client told 404 is never shown the secret again.
func TestReplaysRacingARevokeOnTwoInstancesNeverShowTheSecretAfterIt(t *testing.T) {
	env := apitest.Start(t)
	other := apitest.Start(t)
	instances := []*apitest.Env{env, other}
	ws := env.Signup()
	body := map[string]any{"name": "raced", "preset": "AGENT"}
	created := createUnder(t, env, ws.Key, "raced", "raced")
	id, secret := created.JSON()["id"].(string), created.JSON()["secret"].(string)

	type replay struct {
		afterRevoke bool // sent once the revoke had answered
		r           *apitest.Response
	}
	const clients, roundsAfter = 8, 3
	replays := make([][]replay, clients)
	var revoked atomic.Bool
	var warm sync.WaitGroup // each client has replayed once
	warm.Add(clients)
	apitest.StartTogether(clients+1, func(i int) {
		if i == clients {
			warm.Wait()
			env.Must(http.StatusOK, "DELETE", "/api/v1/keys/"+id, ws.Key, nil)
			revoked.Store(true)
			return
		}
		for round, after := 0, 0; after < roundsAfter; round++ {
			sentAfter := revoked.Load()
			replays[i] = append(replays[i], replay{sentAfter,
				instances[i%2].DoWith("POST", "/api/v1/keys", ws.Key, underKey("raced"), body)})
			if round == 0 {
				warm.Done()
			}
			if sentAfter {
				after++
			}
		}
	})
	for i, client := range replays {
		erased := false
		for _, p := range client {
			switch {
			case p.r.Status == http.StatusCreated && !p.afterRevoke && !erased:
				require.Equal(t, string(created.Body), string(p.r.Body), "client %d", i)
			case p.r.Status == http.StatusNotFound:
				env.RequireErased(p.r, created, secret, keySecretPrefix)
				erased = true
			default:
				t.Fatalf("client %d: replay answered %d (sent after the revoke: %v, after a 404: %v): %s", i,
					p.r.Status, p.afterRevoke, erased, p.r.Body)
			}
		}
	}
	require.Len(t, env.Must(http.StatusOK, "GET", "/api/v1/keys", ws.Key, nil).JSON()["data"].([]any), 2,
		"no replay minted a key")
	require.NotContains(t, env.KeptSecrets(ws.Key), secret)
}

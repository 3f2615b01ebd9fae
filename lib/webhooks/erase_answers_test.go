package webhooks_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/events"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/webhooks"
)

func underKey(k string) http.Header { return http.Header{idempotency.Header: {k}} }

// requireErased is a replay answered after the webhook's delete: 404
// not_found, given again for the request that acted, without the secret.
func requireErased(t *testing.T, env *apitest.Env, r *apitest.Response, first *apitest.Response, secret string) {
	t.Helper()
	env.RequireErased(r, first, secret, "whsec_")
}

// A delete erases the answers kept for its create's and rotation's
// Idempotency-Keys, which showed its signing secrets, in its transaction:
// a replay of either is 404 not_found (marked as given again), never the
// secret and never a second webhook or rotation, the keys stay used for
// other requests, and the table keeps no sealed copy of either secret.
// Before, the answers kept the secrets for their 24 hours after the delete
// and a replay showed them. Another webhook's answer is kept.
func TestADeleteErasesTheAnswersThatShowedItsSecrets(t *testing.T) {
	env, _ := start(t, false)
	ctx := context.Background()
	ws := env.Signup()
	body := map[string]any{"url": "https://example.com/hook", "events": []string{events.RunFinished}}
	created := env.DoWith("POST", "/api/v1/webhooks", ws.Key, underKey("hook-create"), body)
	require.Equal(t, http.StatusCreated, created.Status, "%s", created.Body)
	id, secret := created.JSON()["id"].(string), created.JSON()["secret"].(string)
	rotate := map[string]any{"previous_secret_expires_in_seconds": 0}
	rotatePath := "/api/v1/webhooks/" + id + "/rotate-secret"
	rotated := env.DoWith("POST", rotatePath, ws.Key, underKey("hook-rotate"), rotate)
	require.Equal(t, http.StatusOK, rotated.Status, "%s", rotated.Body)
	newSecret := rotated.JSON()["secret"].(string)
	kept := env.DoWith("POST", "/api/v1/webhooks", ws.Key, underKey("hook-kept"),
		map[string]any{"url": "https://example.com/kept", "events": []string{events.RunFinished}})
	require.Equal(t, http.StatusCreated, kept.Status)
	keptSecret := kept.JSON()["secret"].(string)
	require.ElementsMatch(t, []string{secret, newSecret, keptSecret}, env.KeptSecrets(ws.Key))
	again := env.DoWith("POST", rotatePath, ws.Key, underKey("hook-rotate"), rotate)
	require.Equal(t, string(rotated.Body), string(again.Body), "given again while the webhook lives")

	env.Must(http.StatusOK, "DELETE", "/api/v1/webhooks/"+id, ws.Key, nil)

	requireErased(t, env, env.DoWith("POST", "/api/v1/webhooks", ws.Key, underKey("hook-create"), body), created, secret)
	requireErased(t, env, env.DoWith("POST", rotatePath, ws.Key, underKey("hook-rotate"), rotate), rotated, newSecret)
	require.Equal(t, []string{keptSecret}, env.KeptSecrets(ws.Key), "no sealed copy of the deleted one's secrets")
	for _, reqID := range []string{created.Header.Get("X-Request-Id"), rotated.Header.Get("X-Request-Id")} {
		var status int
		var answer []byte
		require.NoError(t, env.App.Pool.QueryRow(ctx, `SELECT status, answer FROM idempotent_requests
			WHERE request_id = $1`, reqID).Scan(&status, &answer))
		require.Equal(t, http.StatusNotFound, status)
		require.Nil(t, answer)
	}

	other := env.DoWith("POST", "/api/v1/webhooks", ws.Key, underKey("hook-create"),
		map[string]any{"url": "https://example.com/other", "events": []string{events.RunFinished}})
	require.Equal(t, "idempotency_key_reuse", other.ErrorCode(), "the key stays used")
	list := env.Must(http.StatusOK, "GET", "/api/v1/webhooks", ws.Key, nil).JSON()["data"].([]any)
	require.Len(t, list, 1, "the replay created nothing")
	replayKept := env.DoWith("POST", "/api/v1/webhooks", ws.Key, underKey("hook-kept"),
		map[string]any{"url": "https://example.com/kept", "events": []string{events.RunFinished}})
	require.Equal(t, string(kept.Body), string(replayKept.Body), "another webhook's answer is kept")
}

// A rotation still in flight when the delete comes (its answer recorded,
// its commit not yet sent) holds the webhook's row: the delete waits for
// it, and erases the answer it committed. The delete's own statement reads
// the table as it was before the wait, without that answer: the erasure is
// its next statement. A trigger holds the rotation at its answer's record
// (after its update of the webhook) on an advisory lock the test holds.
func TestARotationInFlightAtADeleteHasItsAnswerErased(t *testing.T) {
	env, _ := start(t, false)
	ctx := context.Background()
	pool := env.App.Pool
	ws := env.Signup()
	id, _ := subscribe(t, env, ws.Key, "https://example.com/hook")
	const lock = 670067
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION test_hold_answer() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock(%d); RETURN NEW; END $$;
		CREATE TRIGGER test_hold_answer BEFORE UPDATE ON idempotent_requests FOR EACH ROW
		WHEN (NEW.idempotency_key = 'held-rotate' AND OLD.status IS NULL AND NEW.status IS NOT NULL)
		EXECUTE FUNCTION test_hold_answer();`, lock))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `DROP TRIGGER IF EXISTS test_hold_answer ON idempotent_requests;
			DROP FUNCTION IF EXISTS test_hold_answer();`)
	})
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lock)
	require.NoError(t, err)

	waiting := func(like string) func() bool {
		return func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, like).Scan(&n))
			return n > 0
		}
	}
	rotate := map[string]any{"previous_secret_expires_in_seconds": 0}
	rotatePath := "/api/v1/webhooks/" + id + "/rotate-secret"
	rotated := make(chan *apitest.Response, 1)
	go func() { rotated <- env.DoWith("POST", rotatePath, ws.Key, underKey("held-rotate"), rotate) }()
	require.Eventually(t, waiting("%UPDATE idempotent_requests SET status%"), 10*time.Second, 5*time.Millisecond,
		"the rotation waits at its answer, the webhook's row held")
	deleted := make(chan int, 1)
	go func() { deleted <- env.Do("DELETE", "/api/v1/webhooks/"+id, ws.Key, nil).Status }()
	require.Eventually(t, waiting("%UPDATE webhooks SET deleted_at%"), 10*time.Second, 5*time.Millisecond,
		"the delete waits for the rotation")
	require.NoError(t, holder.Commit(ctx))

	first := <-rotated
	require.Equal(t, http.StatusOK, first.Status, "%s", first.Body)
	require.Equal(t, http.StatusOK, <-deleted)
	requireErased(t, env, env.DoWith("POST", rotatePath, ws.Key, underKey("held-rotate"), rotate), first,
		first.JSON()["secret"].(string))
	require.Empty(t, env.KeptSecrets(ws.Key))
}

// Replays of a create racing its webhook's delete each answer either the
// create's answer, byte for byte, or 404 without the secret, never a torn
// one; every replay sent once the delete has answered is the 404, and a
// client that was told 404 is never shown the secret again.
func TestReplaysRacingADeleteNeverShowTheSecretAfterIt(t *testing.T) {
	env, _ := start(t, false)
	ws := env.Signup()
	body := map[string]any{"url": "https://example.com/hook", "events": []string{events.RunFinished}}
	created := env.DoWith("POST", "/api/v1/webhooks", ws.Key, underKey("raced"), body)
	require.Equal(t, http.StatusCreated, created.Status, "%s", created.Body)
	id, secret := created.JSON()["id"].(string), created.JSON()["secret"].(string)

	type replay struct {
		afterDelete bool // sent once the delete had answered
		r           *apitest.Response
	}
	var deleted atomic.Bool
	const clients, rounds = 4, 6
	replays := make([][]replay, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			for range rounds {
				after := deleted.Load()
				replays[i] = append(replays[i], replay{after,
					env.DoWith("POST", "/api/v1/webhooks", ws.Key, underKey("raced"), body)})
			}
		})
	}
	env.Must(http.StatusOK, "DELETE", "/api/v1/webhooks/"+id, ws.Key, nil)
	deleted.Store(true)
	wg.Wait()
	for _, client := range replays {
		erased := false
		for _, p := range client {
			switch {
			case p.r.Status == http.StatusCreated && !p.afterDelete && !erased:
				require.Equal(t, string(created.Body), string(p.r.Body))
			case p.r.Status == http.StatusNotFound:
				requireErased(t, env, p.r, created, secret)
				erased = true
			default:
				t.Fatalf("replay answered %d (sent after the delete: %v, after a 404: %v): %s", p.r.Status,
					p.afterDelete, erased, p.r.Body)
			}
		}
	}
	requireErased(t, env, env.DoWith("POST", "/api/v1/webhooks", ws.Key, underKey("raced"), body), created, secret)
	require.Empty(t, env.KeptSecrets(ws.Key))
}

// A subscription deleted by an instance of the release before migration
// 0067 (still running during the deploy) leaves the answers this release
// linked to it: the sweeper (webhooks.expired_secrets) erases them with
// its secrets, and leaves a live subscription's.
func TestTheSweeperErasesTheAnswersADeleteLeft(t *testing.T) {
	env, _ := start(t, false)
	ctx := context.Background()
	ws := env.Signup()
	mk := func(k, url string) *apitest.Response {
		r := env.DoWith("POST", "/api/v1/webhooks", ws.Key, underKey(k),
			map[string]any{"url": url, "events": []string{events.RunFinished}})
		require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
		return r
	}
	gone, live := mk("gone", "https://example.com/gone"), mk("live", "https://example.com/live")
	// What earlier tests left for it (the pass reads every workspace).
	_, err := env.App.Server.Webhooks.ClearExpiredSecrets(ctx, time.Now(), 1000)
	require.NoError(t, err)
	// The previous release's delete: deleted_at alone.
	_, err = env.App.Pool.Exec(ctx, `UPDATE webhooks SET deleted_at = now() WHERE id = $1`, gone.JSON()["id"])
	require.NoError(t, err)
	n, err := env.App.Server.Webhooks.ClearExpiredSecrets(ctx, time.Now(), 100)
	require.NoError(t, err)
	require.Equal(t, 2, n, "its row's secret and its create's answer")
	require.Equal(t, []string{live.JSON()["secret"].(string)}, env.KeptSecrets(ws.Key))
	requireErased(t, env, env.DoWith("POST", "/api/v1/webhooks", ws.Key, underKey("gone"),
		map[string]any{"url": "https://example.com/gone", "events": []string{events.RunFinished}}), gone,
		gone.JSON()["secret"].(string))
}

// An answer kept before migration 0067 (or by an instance of the previous
// release during its deploy) names no subscription, so a delete does not
// find it: the sweeper links it (idempotency.link_secrets) and, in the same
// pass, erases those of deleted subscriptions (webhooks.expired_secrets),
// leaving a live one's linked for its delete.
func TestTheSweeperErasesTheAnswersKeptBeforeTheUpgrade(t *testing.T) {
	env, _ := start(t, false)
	kind := hookCreates(env)
	kind.End = func(key, id string) { env.Must(http.StatusOK, "DELETE", "/api/v1/webhooks/"+id, key, nil) }
	env.CheckAnswersKeptBeforeTheUpgrade(kind)
}

// hookCreates creates subscriptions under Idempotency-Keys, for the
// apitest checks of their answers' erasure.
func hookCreates(env *apitest.Env) apitest.SecretCreates {
	return apitest.SecretCreates{
		Create: func(key, idemKey, name string) *apitest.Response {
			return env.DoWith("POST", "/api/v1/webhooks", key, underKey(idemKey),
				map[string]any{"url": "https://example.com/" + name, "events": []string{events.RunFinished}})
		},
		SecretPrefix: "whsec_",
	}
}

// The sweeper's erasure of deleted subscriptions' answers leaves a row
// whose Idempotency-Key's 24 hours ended and that a new subscription's
// create took again after the pass's snapshot: sent again, that create
// answers the live subscription, not 404
// (apitest.CheckErasureLeavesAKeyTakenAgain).
func TestTheSweepersErasureLeavesAnAnswerTakenAgainForALiveSubscription(t *testing.T) {
	env, clock := start(t, false)
	env.CheckErasureLeavesAKeyTakenAgain(hookCreates(env), clock, func(ids ...string) { // deleted as the release before 0067 deletes: its answers kept
		_, err := env.App.Pool.Exec(context.Background(), `UPDATE webhooks SET deleted_at = $2 WHERE id = ANY($1)`,
			ids, clock.Now())
		require.NoError(t, err)
	}, func(ctx context.Context) (int, error) {
		return env.App.Server.Webhooks.ClearExpiredSecrets(ctx, clock.Now(), 100)
	})
}

// A delete's erasure and the sweeper's read the answers linked to a
// subscription through idempotent_requests_resource_idx, not the day of
// answers every keyed create left (20,000 here, a few linked), in both
// plan cache modes.
func TestTheErasuresReadTheLinkedAnswersOnly(t *testing.T) {
	env, _ := start(t, false)
	env.CheckErasuresReadLinkedAnswers("webhooks", "whk", `
		INSERT INTO webhooks (id, workspace_id, url, events, secret, created_at, deleted_at)
		SELECT 'whk_plan' || g, 'ws_plan', 'https://example.com/' || g, '{run.finished}', NULL, now(), now()
		FROM generate_series(1000, 20000, 1000) g`, map[string]apitest.Statement{
		"delete":  {SQL: webhooks.SQLAbandon, Args: []any{"whk_plan1000", nil, "webhook deleted"}},
		"sweeper": {SQL: webhooks.SQLClearExpiredSecrets, Args: []any{time.Now(), 1000}},
	})
}

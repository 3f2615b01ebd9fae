package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idempotency"
)

// The sweeper's purge (idempotency.expired) racing a request sent again
// under its Idempotency-Key. The purge acts on every API key's answers in
// the database, so these tests are not parallel and each lives in an era
// of its own (purgeEra), earlier than the one before and than any other
// test's, so that no pass of theirs meets another test's answers.
//
// Two instances share the database: one answers the requests, the other's
// sweeper purges. Their clocks are the database's (db.Clock) but may
// differ by a moment: a request whose instance reads the answer as not yet
// a day old may meet a purge whose instance reads it as older. Either way
// the request is answered the kept answer (read before the purge deleted
// it) or acts as a new request (README: the first success is kept for 24
// hours), once, never an error.

// purgeEra is the year the last purge race began in.
var purgeEra = 1986

// purgeRig is a workspace served by one instance (requests) while
// another's sweeper purges (sweeper), each on its own clock.
type purgeRig struct {
	t                     *testing.T
	requests, sweeper     *apitest.Env
	reqClock, sweepClock  *apitest.Clock
	ws                    apitest.Workspace
	hooksMade             int
	firstID, firstRequest string // the first create's webhook and X-Request-Id
	firstBody             []byte
}

func newPurgeRig(t *testing.T) *purgeRig {
	purgeEra--
	era := time.Date(purgeEra, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &purgeRig{t: t, reqClock: apitest.NewClock(era), sweepClock: apitest.NewClock(era)}
	r.requests = apitest.Start(t, apitest.WithNow(r.reqClock.Now))
	r.sweeper = apitest.Start(t, apitest.WithNow(r.sweepClock.Now))
	r.ws = r.requests.Signup()
	// The answers this era leaves go with it, so that no later purge (one
	// that counts what it deletes: TestPurgeDeletesDayOldAnswers) meets them.
	t.Cleanup(func() {
		_, err := r.requests.App.Pool.Exec(context.Background(),
			`DELETE FROM idempotent_requests WHERE created_at >= $1 AND created_at < $2`, era, era.AddDate(1, 0, 0))
		require.NoError(t, err)
	})
	return r
}

const purgeHookBody = `{"url":"https://example.com/purged","events":["run.finished"]}`

// create sends the webhook create under key.
func (r *purgeRig) create(key string) *apitest.Response {
	return r.requests.DoWith("POST", "/api/v1/webhooks", r.ws.Key, http.Header{idempotency.Header: {key}}, purgeHookBody)
}

// answered creates a webhook under key, its answer kept, and moves both
// clocks on: the requests' by reqAge, the sweeper's past the answer's day.
func (r *purgeRig) answered(key string, reqAge time.Duration) {
	first := r.create(key)
	require.Equal(r.t, http.StatusCreated, first.Status, "%s", first.Body)
	r.firstID, r.firstRequest, r.firstBody = first.JSON()["id"].(string), first.Header.Get("X-Request-Id"), first.Body
	r.hooksMade++
	r.reqClock.Add(reqAge)
	r.sweepClock.Add(idempotency.TTL + time.Second)
}

// fresh says whether answer is a new request's success (not the kept one):
// it requires a 201, and for a replay the kept answer byte for byte.
func (r *purgeRig) fresh(answer *apitest.Response, acted string, actedBody []byte) bool {
	r.t.Helper()
	require.Equal(r.t, http.StatusCreated, answer.Status, "%s", answer.Body)
	if answer.Header.Get(httpapi.ReplayedHeader) == "true" {
		require.Equal(r.t, acted, answer.Header.Get(httpapi.OriginalRequestHeader))
		require.Equal(r.t, string(actedBody), string(answer.Body))
		return false
	}
	require.NotEqual(r.t, r.firstID, answer.JSON()["id"], "a new request makes a new webhook")
	return true
}

// requireKept requires the workspace's webhooks to be the ones made, and
// key to have rows rows (one: the last request that acted's answer).
func (r *purgeRig) requireKept(key string, rows int) {
	r.t.Helper()
	var hooks, kept int
	require.NoError(r.t, r.requests.App.Pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM webhooks WHERE workspace_id = $1 AND deleted_at IS NULL),
		(SELECT count(*) FROM idempotent_requests WHERE idempotency_key = $2 AND created_at < $3)`,
		r.ws.ID, key, time.Date(purgeEra+1, 1, 1, 0, 0, 0, 0, time.UTC)).Scan(&hooks, &kept))
	require.Equal(r.t, r.hooksMade, hooks, "a webhook for each request that acted, no more")
	require.Equal(r.t, rows, kept)
}

// A purge pass holding the answer it deletes (its statement done, not yet
// committed) and the same create sent again: the request waits for the
// pass (its claim meets the row being deleted). Committed, the key is new
// and the request acts; rolled back, the request is given the kept answer
// when its instance reads it as younger than a day, and acts (taking the
// day-old answer's key over) when it reads it as a day old too. Then the
// same request again is given the answer of the one that acted last.
func TestAReplayRacingAPurgePass(t *testing.T) {
	for _, skew := range []string{"request's clock behind", "same clocks"} {
		for _, commit := range []bool{true, false} {
			name := fmt.Sprintf("%s, pass %s", skew, map[bool]string{true: "committed", false: "rolled back"}[commit])
			t.Run(name, func(t *testing.T) {
				r := newPurgeRig(t)
				ctx := context.Background()
				pool := r.requests.App.Pool
				reqAge := idempotency.TTL - time.Second // the answer still kept, to the requests' instance
				if skew == "same clocks" {
					reqAge = idempotency.TTL + time.Second
				}
				r.answered("purged", reqAge)

				tx, err := pool.Begin(ctx)
				require.NoError(t, err)
				t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
				tag, err := tx.Exec(ctx, idempotency.SQLPurge, r.sweepClock.Now().Add(-idempotency.TTL), 1000)
				require.NoError(t, err)
				require.Positive(t, tag.RowsAffected())
				pid := apitest.BackendPID(t, tx)

				done := make(chan struct{})
				var again *apitest.Response
				go func() { defer close(done); again = r.create("purged") }()
				apitest.WaitDoneOrBlockedBy(t, pool, pid, done, "the replay neither answered nor waited for the pass")
				select {
				case <-done:
					t.Fatal("the replay answered before the pass ended: it met no deleted row")
				default:
				}
				if commit {
					require.NoError(t, tx.Commit(ctx))
				} else {
					require.NoError(t, tx.Rollback(ctx))
				}
				<-done

				acted := r.fresh(again, r.firstRequest, r.firstBody)
				require.Equal(t, commit || skew == "same clocks", acted,
					"the key is new once the pass deleted its answer or the request reads it as a day old")
				last, lastBody := r.firstRequest, r.firstBody
				if acted {
					r.hooksMade++
					last, lastBody = again.Header.Get("X-Request-Id"), again.Body
				}
				require.False(t, r.fresh(r.create("purged"), last, lastBody), "the same request again is given the answer")
				r.requireKept("purged", 1)
			})
		}
	}
}

// A purge that deletes the answer between a request's claim statement
// (which found it kept: its instance reads it as younger than a day) and
// its read of the answer: the key is free, and the request claims it anew
// and acts, once (Begin tries the claim again), rather than failing for a
// row it saw and then lost. The purge is the sweeper's whole pass, run at
// that moment (AfterClaims).
func TestAPurgeBetweenAClaimAndItsReadLeavesTheKeyNew(t *testing.T) {
	r := newPurgeRig(t)
	ctx := context.Background()
	r.answered("purged", idempotency.TTL-time.Second)
	var once sync.Once
	purged := 0
	idempotency.AfterClaims(r.requests.App.Server.Idempotency, func(err error) error {
		once.Do(func() {
			res := r.sweeper.App.Sweeper.RunOnce(ctx)
			require.NoError(t, res.Error())
			purged = res.Changed["idempotency.expired"]
		})
		return err
	})
	again := r.create("purged")
	idempotency.AfterClaims(r.requests.App.Server.Idempotency, nil)
	require.Positive(t, purged, "the pass deleted the answer")
	require.True(t, r.fresh(again, r.firstRequest, r.firstBody), "acted as a new request")
	r.hooksMade++
	require.False(t, r.fresh(r.create("purged"), again.Header.Get("X-Request-Id"), again.Body))
	r.requireKept("purged", 1)
}

// A hammer: the same creates sent again under their keys, two at a time
// each, while the sweeper's instance purges a row at a time in a loop.
// Each is answered 201: the kept answer, or a new request's success (at
// most one a key), or that one's answer given again; 409 retry_request
// (while the new request acts) is sent again at once, as README says. The
// workspace holds a webhook for each request that acted.
func TestReplaysRacePurgePasses(t *testing.T) {
	r := newPurgeRig(t)
	ctx := context.Background()
	const keys = 8
	type kept struct {
		request string
		body    []byte
	}
	first := map[string]kept{}
	for i := range keys {
		k := fmt.Sprint("hammered-", i)
		a := r.create(k)
		require.Equal(t, http.StatusCreated, a.Status, "%s", a.Body)
		first[k] = kept{a.Header.Get("X-Request-Id"), a.Body}
	}
	r.hooksMade = keys
	r.reqClock.Add(idempotency.TTL - time.Second)
	r.sweepClock.Add(idempotency.TTL + time.Second)

	stop := make(chan struct{})
	passes := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				passes <- nil
				return
			default:
			}
			if _, err := r.sweeper.App.Server.Idempotency.Purge(ctx, r.sweepClock.Now(), 1); err != nil {
				passes <- err
				return
			}
		}
	}()
	var mu sync.Mutex
	answers := map[string][]*apitest.Response{}
	var wg sync.WaitGroup
	for k := range first {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					a := r.create(k)
					if a.Status == http.StatusConflict && a.ErrorCode() == "retry_request" {
						continue
					}
					mu.Lock()
					answers[k] = append(answers[k], a)
					mu.Unlock()
					return
				}
			}()
		}
	}
	wg.Wait()
	close(stop)
	require.NoError(t, <-passes)
	_, err := r.sweeper.App.Server.Idempotency.Purge(ctx, r.sweepClock.Now(), 1000) // a last pass
	require.NoError(t, err)

	executed, rows := 0, map[string]int{}
	for k, as := range answers {
		var acted *apitest.Response
		for _, a := range as {
			require.Equal(t, http.StatusCreated, a.Status, "%s: %s", k, a.Body)
			if a.Header.Get(httpapi.ReplayedHeader) != "true" {
				require.Nil(t, acted, "%s: two requests acted under one key", k)
				acted = a
			}
		}
		for _, a := range as {
			switch {
			case a == acted:
				require.NotEqual(t, first[k].body, a.Body)
			case a.Header.Get(httpapi.OriginalRequestHeader) == first[k].request:
				require.Equal(t, string(first[k].body), string(a.Body), "%s: the kept answer", k)
			default:
				require.NotNil(t, acted, "%s: a replay of a request that did not act", k)
				require.Equal(t, acted.Header.Get("X-Request-Id"), a.Header.Get(httpapi.OriginalRequestHeader))
				require.Equal(t, string(acted.Body), string(a.Body))
			}
		}
		if acted != nil {
			executed++
			rows[k] = 1 // the new answer, which no pass of the sweeper's clock deletes
		}
	}
	r.hooksMade += executed
	for k := range first {
		// A key none acted under lost its answer to the passes (the last
		// one at least), after its replays read it.
		r.requireKept(k, rows[k])
	}
	t.Logf("%d of %d keys acted again", executed, keys)
}

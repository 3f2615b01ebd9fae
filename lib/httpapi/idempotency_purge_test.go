package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/httpapi"
	"github.com/getratchet/ratchet/lib/idempotency"
)

// purgeEra is the year the last purge test of this package began in: the
// sweeper's purge (idempotency.expired) acts on every API key's answers in
// the package database, so these tests are not parallel, and each lives
// in an era earlier than the one before and than any other test's, whose
// answers none of its passes meets; its own go when it ends.
var purgeEra = 1976

// startPurgeRig is an idemRig in an era of its own (purgeEra).
func startPurgeRig(t *testing.T) *idemRig {
	purgeEra--
	era := time.Date(purgeEra, 1, 1, 0, 0, 0, 0, time.UTC)
	r := startIdemRigAt(t, era)
	t.Cleanup(func() {
		_, err := r.env.App.Pool.Exec(context.Background(),
			`DELETE FROM idempotent_requests WHERE created_at >= $1 AND created_at < $2`, era, era.AddDate(1, 0, 0))
		require.NoError(t, err)
	})
	return r
}

// sweep runs a whole pass of the rig's sweeper at its clock and answers
// how many answers it purged.
func (r *idemRig) sweep() int {
	r.t.Helper()
	res := r.env.App.Sweeper.RunOnce(context.Background())
	require.NoError(r.t, res.Error(), "%v", res.Errors)
	return res.Changed["idempotency.expired"]
}

// rows is how many rows the key of caller holds (0 or 1).
func (r *idemRig) rows(caller int, key string) int {
	r.t.Helper()
	var n int
	require.NoError(r.t, r.env.App.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idempotent_requests WHERE key_id = $1 AND idempotency_key = $2`,
		r.callers[caller].id, key).Scan(&n))
	return n
}

// A key whose kept answer the sweeper purged (a day after it was kept) is
// a new key (README: the first success is kept for 24 hours): the same
// request acts again, once, and another request under the key acts rather
// than being told idempotency_key_reuse; an answer erased with its webhook
// goes the same way, and its request acts again rather than being told
// 404. A pass a moment before the day ends purges nothing, and the answer
// is given again; a claim whose request died is purged once a day old.
func TestAPurgedKeyIsANewKey(t *testing.T) {
	r := startPurgeRig(t)
	tr := apitest.NewModelTrace(t, "go test -run 'TestAPurgedKeyIsANewKey$' ./lib/httpapi/")
	hooks := 0
	send := func(s idemSend, status int, code, replayed string) *httptest.ResponseRecorder {
		rec := r.send(s)
		tr.Add(fmt.Sprintf("%s -> %d %s", s, rec.Code, rec.Header().Get(httpapi.ReplayedHeader)))
		check(tr, rec, status, code, replayed)
		require.False(t, tr.Failed())
		if status == 201 && replayed == "" {
			hooks++
		}
		return rec
	}
	same := idemSend{caller: 0, key: "same", path: "/api/v1/test/ok", body: `{}`}
	other := idemSend{caller: 0, key: "other", path: "/api/v1/test/ok", body: `{}`}
	erased := idemSend{caller: 1, key: "erased", path: "/api/v1/webhooks",
		body: `{"url":"https://example.com/a","events":["run.finished"]}`}
	dead := idemSend{caller: 0, key: "dead", path: "/api/v1/test/ok", body: `{}`}
	first := send(same, 201, "", "")
	send(other, 201, "", "")
	made := send(erased, 201, "", "")
	var id struct{ ID string }
	require.NoError(t, json.Unmarshal(made.Body.Bytes(), &id))
	del := r.serve("DELETE", "/api/v1/webhooks/"+id.ID, r.ws[0].Key, "", "")
	require.Equal(t, 200, del.Code, "%s", del.Body)
	hooks--
	_, _, err := r.env.App.Server.Deps.Idempotency.Begin(context.Background(), idempotency.Request{
		APIKeyID: r.callers[dead.caller].id, Key: dead.key, Method: "POST", Path: dead.path, Body: []byte(dead.body),
		ID: "dead-request"})
	require.NoError(t, err)

	r.clock.Add(idempotency.TTL - time.Second)
	require.Zero(t, r.sweep(), "nothing is a day old yet")
	send(same, 201, "", first.Header().Get("X-Request-Id"))
	send(erased, 404, apierr.CodeNotFound, made.Header().Get("X-Request-Id"))

	r.clock.Add(time.Second)
	require.Equal(t, 4, r.sweep(), "the three answers and the dead claim, a day old")
	for i, k := range []idemSend{same, other, erased, dead} {
		require.Zero(t, r.rows(k.caller, k.key), "key %d purged", i)
	}
	again := send(same, 201, "", "")
	require.NotEqual(t, first.Body.String(), again.Body.String(), "a new webhook")
	send(same, 201, "", again.Header().Get("X-Request-Id"))
	send(idemSend{caller: 0, key: "other", path: "/api/v1/test/ok", body: `{ }`}, 201, "", "") // another request acts
	send(erased, 201, "", "")
	send(dead, 201, "", "")
	require.Equal(t, hooks, r.liveHooks(0))
}

// A request acting under its key (held in its handler) keeps it through
// sweeper passes: a claim is never purged from under its request while it
// may still act (30 seconds, idempotency.ClaimTTL), nor after it lapsed
// until a day has passed. The same request sent meanwhile is told 409
// retry_request; released, the request answers its success, kept and
// given again. A request held a whole day (which the 20 seconds a request
// may act never allow, idempotency.ActingTime) finds its claim purged:
// it rolls its work back and is told 409 retry_request, as one whose
// lapsed claim another request took over, and its retry acts, once.
func TestAPurgeLeavesARequestInFlightItsKey(t *testing.T) {
	for _, age := range []time.Duration{0, 25 * time.Second, idempotency.ClaimTTL + time.Second,
		idempotency.TTL + time.Second} {
		t.Run(fmt.Sprint("held ", age), func(t *testing.T) {
			r := startPurgeRig(t)
			tr := apitest.NewModelTrace(t, "go test -run 'TestAPurgeLeavesARequestInFlightItsKey$' ./lib/httpapi/")
			held := idemSend{caller: 0, key: "held", path: "/api/v1/test/hold", body: `{}`}
			done := make(chan *httptest.ResponseRecorder, 1)
			go func() { done <- r.send(held) }()
			release := <-r.hold // its handler runs: the key is claimed
			r.clock.Add(age)
			purged := r.sweep()
			if age < idempotency.TTL {
				require.Zero(t, purged)
				require.Equal(t, 1, r.rows(held.caller, held.key), "the claim is kept")
			} else {
				require.Equal(t, 1, purged, "a day-old claim")
				require.Zero(t, r.rows(held.caller, held.key))
			}
			if age < idempotency.ClaimTTL {
				rec := r.send(held)
				check(tr, rec, 409, apierr.CodeRetryRequest, "")
			}
			close(release)
			rec := <-done
			if age >= idempotency.TTL {
				check(tr, rec, 409, apierr.CodeRetryRequest, "")
				require.Zero(t, r.liveHooks(0), "the held request's webhook rolled back")
				go func() { close(<-r.hold) }() // held again in its handler: released at once
				check(tr, r.send(held), 201, "", "")
				require.Equal(t, 1, r.liveHooks(0), "acted once")
				return
			}
			check(tr, rec, 201, "", "")
			replay := r.send(held)
			check(tr, replay, 201, "", rec.Header().Get("X-Request-Id"))
			require.Equal(t, rec.Body.String(), replay.Body.String())
			require.Equal(t, 1, r.liveHooks(0))
		})
	}
}

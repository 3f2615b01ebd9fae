package idempotency_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/ids"
)

func TestMain(m *testing.M) { os.Exit(apitest.Main(m)) }

// store is a Store over a test database with its own clock, and a request
// from a fresh API key of a fresh workspace.
func store(t *testing.T, start time.Time) (*idempotency.Store, *apitest.Clock, idempotency.Request) {
	t.Helper()
	clock := apitest.NewClock(start)
	env := apitest.Start(t, apitest.WithNow(clock.Now))
	s := env.App.Server.Idempotency
	req := idempotency.Request{APIKeyID: ids.New("key"), Key: "create-1", Method: "POST", Path: "/api/v1/keys",
		Body: []byte(`{"name":"a","preset":"AGENT"}`), Claim: ids.New(ids.Request)}
	return s, clock, req
}

func retry(req idempotency.Request) idempotency.Request {
	req.Claim = ids.New(ids.Request)
	return req
}

func TestAnsweredRequestIsAnsweredAgain(t *testing.T) {
	t.Parallel()
	s, clock, req := store(t, time.Now())
	ctx := context.Background()
	claim, stored, err := s.Begin(ctx, req)
	require.NoError(t, err)
	require.Nil(t, stored)
	require.NoError(t, claim.Finish(ctx, idempotency.Answer{Status: 201, Body: []byte(`{"id":"key_1"}`)}))

	// The same request, its fields in another order and spaced otherwise.
	same := retry(req)
	same.Body = []byte(`{ "preset": "AGENT", "name": "a" }`)
	claim, stored, err = s.Begin(ctx, same)
	require.NoError(t, err)
	require.Nil(t, claim)
	require.Equal(t, &idempotency.Answer{Status: 201, Body: []byte(`{"id":"key_1"}`)}, stored)

	for name, other := range map[string]func(*idempotency.Request){
		"body":   func(r *idempotency.Request) { r.Body = []byte(`{"name":"b","preset":"AGENT"}`) },
		"path":   func(r *idempotency.Request) { r.Path = "/api/v1/webhooks" },
		"method": func(r *idempotency.Request) { r.Method = "PUT" },
	} {
		r := retry(req)
		other(&r)
		_, _, err := s.Begin(ctx, r)
		require.ErrorIs(t, err, idempotency.ErrReused, name)
	}

	// Another API key's keys are its own.
	mine := retry(req)
	mine.APIKeyID = ids.New("key")
	claim, _, err = s.Begin(ctx, mine)
	require.NoError(t, err)
	require.NotNil(t, claim)

	// A day later the key is new, whatever the request.
	clock.Add(idempotency.TTL)
	later := retry(req)
	later.Body = []byte(`{"name":"c"}`)
	claim, stored, err = s.Begin(ctx, later)
	require.NoError(t, err)
	require.Nil(t, stored)
	require.NotNil(t, claim)
}

func TestRefusedRequestLeavesTheKeyFree(t *testing.T) {
	t.Parallel()
	s, _, req := store(t, time.Now())
	ctx := context.Background()
	claim, _, err := s.Begin(ctx, req)
	require.NoError(t, err)
	require.NoError(t, claim.Finish(ctx, idempotency.Answer{Status: 400, Body: []byte(`{"error":{}}`)}))
	corrected := retry(req)
	corrected.Body = []byte(`{"name":"a","preset":"WORKER"}`)
	claim, stored, err := s.Begin(ctx, corrected)
	require.NoError(t, err)
	require.Nil(t, stored)
	require.NotNil(t, claim)
}

// A request sent while the first is acting is refused until the first's
// claim lapses; then it acts, and the first's late answer is not recorded
// over its own.
func TestClaimHoldsTheKeyUntilItLapses(t *testing.T) {
	t.Parallel()
	s, clock, req := store(t, time.Now())
	ctx := context.Background()
	first, _, err := s.Begin(ctx, req)
	require.NoError(t, err)
	_, _, err = s.Begin(ctx, retry(req))
	require.ErrorIs(t, err, idempotency.ErrInFlight)
	other := retry(req)
	other.Body = []byte(`{}`)
	_, _, err = s.Begin(ctx, other)
	require.ErrorIs(t, err, idempotency.ErrReused, "another request is refused as reuse, in flight or not")

	clock.Add(idempotency.ClaimTTL)
	second, stored, err := s.Begin(ctx, retry(req))
	require.NoError(t, err)
	require.Nil(t, stored)
	require.NoError(t, second.Finish(ctx, idempotency.Answer{Status: 201, Body: []byte(`{"n":2}`)}))
	require.NoError(t, first.Finish(ctx, idempotency.Answer{Status: 201, Body: []byte(`{"n":1}`)}))
	_, stored, err = s.Begin(ctx, retry(req))
	require.NoError(t, err)
	require.Equal(t, []byte(`{"n":2}`), stored.Body)
}

// Purge deletes answers a day old. In its own era (1999): a purge acts on
// every test's rows.
func TestPurgeDeletesDayOldAnswers(t *testing.T) {
	t.Parallel()
	s, clock, req := store(t, time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	answer := func(r idempotency.Request, body string) {
		claim, _, err := s.Begin(ctx, r)
		require.NoError(t, err)
		require.NoError(t, claim.Finish(ctx, idempotency.Answer{Status: 201, Body: []byte(body)}))
	}
	answer(req, `{"n":1}`)
	clock.Add(time.Hour)
	young := retry(req)
	young.Key = "create-2"
	answer(young, `{"n":2}`)

	clock.Add(idempotency.TTL - time.Hour)
	n, err := s.Purge(ctx, clock.Now(), 1000)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, stored, err := s.Begin(ctx, retry(young))
	require.NoError(t, err)
	require.Equal(t, []byte(`{"n":2}`), stored.Body, "an hour younger: kept")
	n, err = s.Purge(ctx, clock.Now(), 1000)
	require.NoError(t, err)
	require.Zero(t, n)
}

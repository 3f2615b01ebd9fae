package idempotency_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/testpg"
	"github.com/getratchet/ratchet/migrations"
)

// outageStore is a Store over a database of the test's own that it may
// crash, with a clock that stands still (so no claim lapses: only its
// give-up frees a key), a request, and a context that ends with the test
// (or at its hang guard, a minute on).
func outageStore(t *testing.T) (context.Context, *testpg.Cluster, testStore, idempotency.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	pg := testpg.Crashable(t, ctx)
	_, err := db.MigrateURL(ctx, pg.URL, migrations.FS)
	require.NoError(t, err)
	clock := apitest.NewClock(time.Now())
	env := apitest.Start(t, apitest.WithNow(clock.Now), apitest.WithConfig(func(c *config.Config) {
		c.DatabaseURL = pg.URL
	}))
	req := idempotency.Request{APIKeyID: ids.New("key"), Key: "create-1", Method: "POST", Path: "/api/v1/keys",
		Body: []byte(`{"name":"a","preset":"AGENT"}`), ID: ids.New(ids.Request)}
	return ctx, pg, testStore{Store: env.App.Server.Idempotency, pool: env.App.Pool}, req
}

// requireFreedOnceBack asks again under req's key until it takes it; a
// hang guard well short of ClaimTTL bounds the wait (the claim cannot
// lapse: the clock stands still).
func requireFreedOnceBack(t *testing.T, ctx context.Context, s testStore, req idempotency.Request) {
	for began := time.Now(); ; {
		again, stored, err := s.Begin(ctx, retry(req))
		if err == nil {
			require.Nil(t, stored, "nothing was answered")
			require.NotNil(t, again, "the retry took the key")
			return
		}
		var busy *idempotency.InFlightError
		require.True(t, errors.As(err, &busy) || db.IsUnavailable(err), "%v", err)
		require.Less(t, time.Since(began), idempotency.ClaimTTL/2, "the key stayed held after the database came back")
		time.Sleep(50 * time.Millisecond)
	}
}

// A request that changed nothing but could not give its claim up, the
// database being down (a crash between the claim and the route's work),
// gives it up once the database is back, not when it lapses (DB crash QA:
// a key's create sent again after a two-second outage was told to wait for
// up to 30 s).
func TestAClaimGivenUpDuringAnOutageIsFreedOnceTheDatabaseIsBack(t *testing.T) {
	t.Parallel()
	ctx, pg, s, req := outageStore(t)

	claim := mustClaim(t, s, req)
	require.NoError(t, pg.Crash(ctx))
	err := claim.GiveUp(ctx)
	require.True(t, db.IsUnavailable(err), "the give-up could not reach the database: %v", err)
	require.NoError(t, pg.Restart(ctx))
	requireFreedOnceBack(t, ctx, s, req)
}

// So does one whose COMMIT the crash cut, which Settle could not settle:
// the crash rolled it back.
func TestAClaimSettledDuringAnOutageIsFreedOnceTheDatabaseIsBack(t *testing.T) {
	t.Parallel()
	ctx, pg, s, req := outageStore(t)

	claim := mustClaim(t, s, req)
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	taken, err := claim.Record(ctx, tx, idempotency.Answer{Status: 201, Body: []byte(`{"id":"key_1"}`)})
	require.NoError(t, err)
	require.False(t, taken)
	require.NoError(t, pg.Crash(ctx))
	require.Error(t, tx.Commit(ctx), "the crash ended the transaction")
	_, err = claim.Settle(ctx)
	require.True(t, db.IsUnavailable(err), "the settle could not reach the database: %v", err)
	require.NoError(t, pg.Restart(ctx))
	requireFreedOnceBack(t, ctx, s, req)
}

// So does one whose claim landed but whose answer was lost, the database
// going down as it answered (Begin's lost-claim path): Begin's give-up
// cannot reach the database either, and the claim is given up in the
// background once it is back, not when it lapses.
func TestAClaimWhoseAnswerAnOutageLostIsFreedOnceTheDatabaseIsBack(t *testing.T) {
	t.Parallel()
	ctx, pg, s, req := outageStore(t)

	lost := idempotency.New(s.pool, nil, time.Now)
	idempotency.AfterClaims(lost, func(err error) error {
		require.NoError(t, err, "the claim landed")
		require.NoError(t, pg.Crash(ctx))
		return io.ErrUnexpectedEOF // the connection ended before its answer was read
	})
	_, _, err := lost.Begin(ctx, req)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.NoError(t, pg.Restart(ctx))
	requireFreedOnceBack(t, ctx, s, req)
}

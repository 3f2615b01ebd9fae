package db_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
	"github.com/getratchet/ratchet/lib/config"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/testpg"
)

func clockConfig(t *testing.T, conns int32) *config.Config {
	return &config.Config{DatabaseURL: apitest.DatabaseURL(t), DBMaxConns: conns, DBMaxConnIdleTime: time.Minute,
		DBConnectTimeout: 5 * time.Second, DBQueryExecMode: "exec"}
}

// between requires read() within the database's clock read just before and
// just after it, give or take a little.
func between(t *testing.T, pool *pgxpool.Pool, read func() time.Time) {
	t.Helper()
	ctx := context.Background()
	var before, after time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before))
	got := read()
	require.NoError(t, pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after))
	require.False(t, got.Before(before.Add(-100*time.Millisecond)) || got.After(after.Add(100*time.Millisecond)),
		"%s not within [%s, %s]", got, before, after)
}

// The clock is the database's, whatever the instance's wall clock reads:
// an hour off, it still answers the database's time to within a round
// trip, in UTC.
func TestClockReadsTheDatabasesTime(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		c := db.NewClock(func() time.Time { return time.Now().Add(skew) })
		pool, err := db.OpenWithClock(context.Background(), clockConfig(t, 2), c)
		require.NoError(t, err)
		defer pool.Close()
		between(t, pool, c.Now)
		require.Equal(t, time.UTC, c.Now().Location())
	}
}

// Reading the clock costs no statement on a request's path: the first
// reading opens the connection the instance's first statement then uses,
// and connections opened or handed out while the reading is fresh read
// nothing.
func TestClockReadsOnceWhileFresh(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := db.NewClock(nil)
	pool, err := db.OpenWithClock(ctx, clockConfig(t, 4), c)
	require.NoError(t, err)
	defer pool.Close()

	c.Now()
	require.EqualValues(t, 1, db.ClockReadings(c))
	require.EqualValues(t, 1, pool.Stat().TotalConns())
	_, err = pool.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	require.EqualValues(t, 1, pool.Stat().TotalConns(), "the first statement used the connection the reading opened")

	var wg sync.WaitGroup
	for range 4 { // four connections open at once
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := pool.Exec(ctx, `SELECT pg_sleep(0.2)`)
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	require.EqualValues(t, 4, pool.Stat().TotalConns())
	for range 20 {
		c.Now()
	}
	require.EqualValues(t, 1, db.ClockReadings(c), "a fresh reading: no statement for it")
}

// A reading older than the refresh, or taken before the instance's clock
// jumped, is taken again on the next connection handed out: in place of
// pgxpool's ping on a connection idle for over a second (no round trip
// more), as a statement of its own otherwise, and one at a time. A fresh
// reading leaves the ping as it was.
func TestClockReadsAgainWhenDueInPlaceOfThePing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var jump atomic.Int64
	c := db.NewClock(func() time.Time { return time.Now().Add(time.Duration(jump.Load())) })
	pc, err := pgxpool.ParseConfig(apitest.DatabaseURL(t))
	require.NoError(t, err)
	db.HookClock(c, pc)
	conn, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, pc.AfterConnect(ctx, conn))
	require.EqualValues(t, 1, db.ClockReadings(c), "a first connection reads")
	require.NoError(t, pc.AfterConnect(ctx, conn))
	require.EqualValues(t, 1, db.ClockReadings(c), "a fresh reading is not taken again")

	hand := func(idle time.Duration) (pinged bool) {
		t.Helper()
		pinged = pc.ShouldPing(ctx, pgxpool.ShouldPingParams{Conn: conn, IdleDuration: idle})
		ok, err := pc.PrepareConn(ctx, conn)
		require.NoError(t, err)
		require.True(t, ok)
		return pinged
	}
	require.True(t, hand(2*time.Second), "fresh: pgxpool pings an idle connection as before")
	require.False(t, hand(time.Millisecond))
	require.EqualValues(t, 1, db.ClockReadings(c))

	jump.Store(int64(90 * time.Second)) // the instance's clock steps ahead
	require.WithinDuration(t, time.Now().Add(90*time.Second), c.Now(), time.Second, "until the next reading")
	require.False(t, hand(2*time.Second), "the reading is the ping")
	require.EqualValues(t, 2, db.ClockReadings(c))
	require.WithinDuration(t, time.Now(), c.Now(), time.Second, "the database's time again")

	jump.Store(int64(-90 * time.Second))
	require.False(t, hand(time.Millisecond))
	require.EqualValues(t, 3, db.ClockReadings(c), "a busy connection reads as a statement of its own")
	require.WithinDuration(t, time.Now(), c.Now(), time.Second)
	require.True(t, hand(2*time.Second))
	require.EqualValues(t, 3, db.ClockReadings(c))
}

// With the database unreachable before any connection opened, the clock
// answers the instance's own as soon as the connect failed: the caller's
// statement fails the same way. DB_CONNECT_TIMEOUT is an hour, so a Now
// that waited for it rather than for the connect's failure hangs.
func TestClockWithoutTheDatabaseAnswersTheInstances(t *testing.T) {
	t.Parallel()
	down := testpg.StartHangUp(t)
	cfg := clockConfig(t, 2)
	cfg.DatabaseURL, cfg.DBConnectTimeout = down.URL, time.Hour
	wall := func() time.Time { return time.Now().Add(time.Hour) }
	c := db.NewClock(wall)
	pool, err := db.OpenWithClock(context.Background(), cfg, c)
	require.NoError(t, err)
	defer pool.Close()
	var got time.Time
	apitest.Returns(t, "Now waited for DB_CONNECT_TIMEOUT", func() { got = c.Now() })
	require.WithinDuration(t, wall(), got, time.Minute, "the instance's clock (an hour ahead)")
	require.Equal(t, 1, down.Dials(), "it tried the database")
	require.EqualValues(t, 0, db.ClockReadings(c))
}

// At a cold start with the database unreachable, the request that took
// the first reading waits for the database once: the statement it runs
// next, and any the instance would open a connection for before the
// reading is tried again, fail as the reading's connect did rather than
// dial again (QA: the first request failed after twice DB_CONNECT_TIMEOUT,
// the reading's connect and then its statement's). The server hangs up at
// once, so nothing here waits; the test counts dials.
func TestClockFailedFirstReadingAnswersForTheStatementsAfterIt(t *testing.T) {
	t.Parallel()
	down := testpg.StartHangUp(t)
	cfg := clockConfig(t, 2)
	cfg.DatabaseURL = down.URL
	c := db.NewClock(nil)
	db.SetClockRetry(c, time.Hour) // no second reading during the test
	pool, err := db.OpenWithClock(context.Background(), cfg, c)
	require.NoError(t, err)
	defer pool.Close()

	c.Now()
	require.Equal(t, 1, down.Dials(), "the first reading dialled once")
	require.EqualValues(t, 0, db.ClockReadings(c))
	for range 2 {
		_, err = pool.Exec(context.Background(), `SELECT 1`)
		require.Error(t, err)
		require.True(t, db.Unapplied(err), "nothing was sent: %v", err)
		require.True(t, db.IsUnavailable(err), "%v", err)
		c.Now() // not read again either
	}
	require.Equal(t, 1, down.Dials(), "a statement dialled again right after the reading's connect failed")
}

// The database reached again, the instance reaches it once the failed
// first reading stops answering for it: a new first reading, and the
// statement's connection, open.
func TestClockFailedFirstReadingStandsForAMomentOnly(t *testing.T) {
	t.Parallel()
	p := startSlowProxy(t, apitest.DatabaseURL(t))
	cfg := clockConfig(t, 2)
	cfg.DatabaseURL = p.url
	c := db.NewClock(func() time.Time { return time.Now().Add(time.Hour) })
	db.SetClockRetry(c, 100*time.Millisecond)
	pool, err := db.OpenWithClock(context.Background(), cfg, c)
	require.NoError(t, err)
	defer pool.Close()

	p.refuse.Store(true)
	c.Now()
	require.EqualValues(t, 0, db.ClockReadings(c))
	p.refuse.Store(false)
	// Polled, never timed: a failure that stood for good fails at the
	// hang guard.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, err = pool.Exec(ctx, `SELECT 1`); err == nil {
			break
		}
		require.True(t, db.IsUnavailable(err), "%v", err)
		select {
		case <-ctx.Done():
			require.FailNow(t, "the instance never reached the database again", "%v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	require.EqualValues(t, 1, db.ClockReadings(c), "the connection that opened read the clock")
	between(t, pool, c.Now)
}

// A reading that never gets its answer (the connection opened, then the
// path to the server died, or a pooler has no server free) is bounded by
// DB_CONNECT_TIMEOUT, as the connect before it is: pgxpool opens a
// connection under no deadline of the caller's, and an unbounded reading
// kept its slot of the pool taken for good (clock QA: with DB_MAX_CONNS=1
// no statement of the instance ran again, once the path was back). The
// statement the connection was opened for was never sent: it is Unapplied.
func TestClockReadingThatHangsIsBounded(t *testing.T) {
	t.Parallel()
	p := startSlowProxy(t, apitest.DatabaseURL(t))
	cfg := clockConfig(t, 1)
	cfg.DatabaseURL, cfg.DBConnectTimeout = p.url, time.Second
	pool, err := db.OpenWithClock(context.Background(), cfg, db.NewClock(nil))
	require.NoError(t, err)
	defer pool.Close()

	p.stall.Store(true)
	// The caller gives no deadline: DB_CONNECT_TIMEOUT (1 s) is the only
	// thing that can end the reading, so an unbounded one hangs.
	apitest.Returns(t, "the reading was not bounded by DB_CONNECT_TIMEOUT", func() {
		_, err = pool.Exec(context.Background(), `SELECT 1`)
	})
	require.Error(t, err)
	require.ErrorIs(t, err, context.DeadlineExceeded, "ended by DB_CONNECT_TIMEOUT")
	require.True(t, db.Unapplied(err), "the statement was never sent: %v", err)
	require.True(t, db.IsUnavailable(err), "%v", err)

	p.stall.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = pool.Exec(ctx, `SELECT 1`)
	require.NoError(t, err, "the pool's one connection is free again")
}

// A first reading asked for while another request's connection is still
// opening, in a pool that connection fills (DB_MAX_CONNS=1), is that
// connection's: the clock answers once it read, not when the wait for a
// connection of its own ends, and never the instance's own clock then
// (clock QA: Now waited out DB_CONNECT_TIMEOUT behind a transaction that
// held the one connection, then answered a clock an hour off).
func TestClockFirstReadingWaitsForNoOnesTransaction(t *testing.T) {
	t.Parallel()
	p := startSlowProxy(t, apitest.DatabaseURL(t))
	p.delay.Store(int64(400 * time.Millisecond)) // connecting takes a while
	cfg := clockConfig(t, 1)
	// Waiting for the held connection would last DB_CONNECT_TIMEOUT (an
	// hour): the transaction holds it until Now returned.
	cfg.DatabaseURL, cfg.DBConnectTimeout = p.url, time.Hour
	c := db.NewClock(func() time.Time { return time.Now().Add(time.Hour) })
	pool, err := db.OpenWithClock(context.Background(), cfg, c)
	require.NoError(t, err)
	defer pool.Close()
	direct, err := pgx.Connect(context.Background(), apitest.DatabaseURL(t))
	require.NoError(t, err)
	defer direct.Close(context.Background())

	ctx := context.Background()
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free() // before pool.Close, which waits for the transaction
	go func() {
		defer close(held)
		tx, err := pool.Begin(ctx) // opens the one connection, holds it
		if !assert.NoError(t, err) {
			return
		}
		<-release
		assert.NoError(t, tx.Rollback(ctx))
	}()
	for p.dials.Load() == 0 { // the connection is opening (for 400 ms)
		time.Sleep(5 * time.Millisecond)
	}
	var before, after, got time.Time
	require.NoError(t, direct.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before))
	apitest.Returns(t, "Now waited for the held connection", func() { got = c.Now() })
	free()
	<-held
	require.NoError(t, direct.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after))
	require.False(t, got.Before(before.Add(-100*time.Millisecond)) || got.After(after.Add(100*time.Millisecond)),
		"the database's time, not the instance's (an hour ahead): %s not within [%s, %s]", got, before, after)
}

package db

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/config"
)

// Clock is the instance's reading of the database's clock. Every decision
// Ratchet makes by time (a lease's end, a due time, a rate window, a UTC
// day, a cooldown, a cut-off) is taken by one instance and compared with
// times other instances stored; with each instance's own clock deciding, an
// instance whose clock ran s seconds ahead saw another's lease lapse s
// seconds early and granted its key or job to a second holder (clock QA).
// So the instances read one clock, PostgreSQL's: Now is the instance's wall
// clock plus the offset to the database's clock_timestamp() found by the
// last reading, to within half that statement's round trip.
//
// A reading is taken on a connection as it opens or is handed out, when the
// last one is older than clockRefresh or the instance's clock jumped since
// (its wall clock and its monotonic clock disagree: a step of the wall
// clock, or a Lambda freeze, during which the monotonic clock may stand
// still while the wall clock, which Now follows, does not). On a connection
// idle for over a second, which pgxpool pings before handing it out, the
// reading is the ping: it costs no round trip. Otherwise it costs one
// statement a minute at most, never one per request.
//
// The decisions themselves stay in Go and in the statements' parameters
// rather than in SQL's now(): a transaction decides with one instant in
// several statements and in Go (whether a lease lapsed, a retry's jittered
// due time, a refusal's resets_at), and tests move that instant instead of
// sleeping.
type Clock struct {
	wall      func() time.Time
	refresh   time.Duration
	pool      atomic.Pointer[pgxpool.Pool]
	anchor    atomic.Pointer[clockAnchor]
	anchored  chan struct{} // closed by the first reading
	anchorOne sync.Once
	delegated sync.Map                      // *pgx.Conn whose ping the reading replaces
	reading   atomic.Bool                   // a reading not in place of a ping is under way
	first     sync.Mutex                    // one first reading at a time
	down      atomic.Pointer[failedReading] // the last first reading's failure
	retry     time.Duration                 // how long it stands
	timeout   time.Duration
	reads     atomic.Int64 // readings taken (tests)
}

// clockAnchor is one reading.
type clockAnchor struct {
	offset time.Duration // the database's clock minus the instance's wall clock
	wall   time.Time     // the instance's wall clock at the reading, monotonic reading stripped
	mono   time.Time     // the same instant with its monotonic reading
}

// clockRefresh is how old a reading may grow. NTP slews the instance's
// clock by parts per million; a minute bounds what a step it missed, or a
// database failed over to another host, leaves.
const clockRefresh = time.Minute

// clockJump is how far the wall and monotonic clocks may part since a
// reading before the instance's clock counts as having jumped.
const clockJump = 250 * time.Millisecond

// NewClock returns a clock for a pool OpenWithClock opens. wall is the
// instance's own clock (nil: time.Now); tests skew it, and Now must not move.
func NewClock(wall func() time.Time) *Clock {
	if wall == nil {
		wall = time.Now
	}
	return &Clock{wall: wall, refresh: clockRefresh, retry: readingRetry, timeout: 5 * time.Second, anchored: make(chan struct{})}
}

// OpenWithClock is Open whose connections keep c read (see Clock).
func OpenWithClock(ctx context.Context, cfg *config.Config, c *Clock) (*pgxpool.Pool, error) {
	if cfg.DBConnectTimeout > 0 {
		c.timeout = cfg.DBConnectTimeout
	}
	pool, err := open(ctx, cfg, c)
	if err != nil {
		return nil, err
	}
	c.pool.Store(pool)
	return pool, nil
}

// hook adds c's readings to a pool's configuration.
func (c *Clock) hook(pc *pgxpool.Config) {
	after := pc.AfterConnect
	pc.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, conn); err != nil {
				return err
			}
		}
		// pgxpool opens a connection under no deadline of the
		// caller's (it goes on after the caller gives up): the reading
		// is bounded as the connect before it is, or one that never got
		// its answer held its slot of the pool for good.
		ctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		if own, ok := ctx.Value(openingKey{}).(*atomic.Bool); ok {
			own.Store(true) // opened for firstReading
		}
		if c.anchor.Load() != nil { // every first connection reads
			if !c.claim() {
				return nil
			}
			defer c.reading.Store(false)
		}
		if err := c.read(ctx, conn); err != nil {
			return &openError{why: openReadingFailed, err: err}
		}
		return nil
	}
	before := pc.BeforeConnect
	pc.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		// The first reading's connect failed a moment ago: the database
		// is not reached again so soon. The request that took the
		// reading waited for the database once, not once for the
		// reading and again for its statement (QA: at a cold start
		// with the database away the first request failed after twice
		// DB_CONNECT_TIMEOUT).
		if f := c.failure(); f != nil {
			return &openError{why: unreached, err: f.err}
		}
		if before != nil {
			return before(ctx, cc)
		}
		return nil
	}
	pc.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
		if p.IdleDuration <= time.Second {
			return false // pgxpool's own rule
		}
		if c.due() {
			c.delegated.Store(p.Conn, struct{}{})
			return false
		}
		return true
	}
	pc.PrepareConn = func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		if _, pinged := c.delegated.LoadAndDelete(conn); !pinged {
			if !c.claim() {
				return true, nil
			}
			defer c.reading.Store(false)
		}
		if err := c.read(ctx, conn); err != nil {
			// As a failed ping: another connection, unless the
			// caller's context ended.
			return false, ctx.Err()
		}
		return true, nil
	}
}

// Now is the database's clock as the instance reads it, in UTC. Before any
// connection opened it opens one (which the instance's first statement
// would have opened anyway) to read it; when the database cannot be reached
// then, it answers the instance's own clock, and the statement the caller
// is about to run fails the same way, at once (see failure).
func (c *Clock) Now() time.Time {
	a := c.anchor.Load()
	if a == nil {
		if a = c.firstReading(); a == nil {
			return c.wall().Round(0).UTC()
		}
	}
	return c.wall().Round(0).Add(a.offset).UTC()
}

// due says whether a new reading is wanted: none yet, the last one older
// than the refresh, or the instance's clock jumped since.
func (c *Clock) due() bool {
	a := c.anchor.Load()
	if a == nil {
		return true
	}
	w := c.wall()
	wallAge, monoAge := w.Round(0).Sub(a.wall), w.Sub(a.mono)
	return wallAge >= c.refresh || monoAge >= c.refresh || wallAge < -clockJump || monoAge < -clockJump ||
		(wallAge-monoAge).Abs() > clockJump
}

// claim says whether this connection should take a reading that replaces
// no ping: one is due and no other connection is taking one. The caller
// clears reading after.
func (c *Clock) claim() bool {
	return c.due() && c.reading.CompareAndSwap(false, true)
}

// firstReading opens a connection so that it reads the database's clock. No
// caller holds a connection here (every connection opened took a reading
// first), but another caller's connection may be opening, in a pool it
// fills: its reading is the first, and this waits for it, not for that
// caller to give the connection back.
func (c *Clock) firstReading() *clockAnchor {
	c.first.Lock()
	defer c.first.Unlock()
	if a := c.anchor.Load(); a != nil {
		return a
	}
	pool := c.pool.Load()
	if pool == nil || c.failure() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	own := new(atomic.Bool)
	ctx = context.WithValue(ctx, openingKey{}, own)
	acquired := make(chan error, 1)
	go func() {
		conn, err := pool.Acquire(ctx)
		if err == nil {
			conn.Release()
		}
		acquired <- err
	}()
	select {
	case <-c.anchored:
		if own.Load() {
			// The connection this opened read: it comes back to the
			// pool at once, where the caller's statement finds it,
			// rather than opening a second one beside it.
			<-acquired
		}
	case err := <-acquired:
		if err != nil && c.anchor.Load() == nil {
			c.down.Store(&failedReading{at: time.Now(), err: err})
		}
	}
	return c.anchor.Load()
}

// failedReading is a first reading whose connection failed to open (or to
// read), and when.
type failedReading struct {
	at  time.Time
	err error
}

// readingRetry is how long a failed first reading answers for the
// database: no first reading is tried again, and no connection opened,
// until it passed.
const readingRetry = time.Second

// failure is the first reading's failure while it stands: no reading
// since, and younger than c.retry.
func (c *Clock) failure() *failedReading {
	if c.anchor.Load() != nil {
		return nil
	}
	if f := c.down.Load(); f != nil && time.Since(f.at) < c.retry {
		return f
	}
	return nil
}

// openingKey marks the context of firstReading's acquire, which pgxpool
// hands to the hooks of a connection it opens for it.
type openingKey struct{}

// read reads the database's clock on conn. The simple protocol makes it one
// round trip in every DB_QUERY_EXEC_MODE.
func (c *Clock) read(ctx context.Context, conn *pgx.Conn) error {
	var at time.Time
	sent := c.wall()
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`, pgx.QueryExecModeSimpleProtocol).Scan(&at); err != nil {
		return err
	}
	mid := sent.Add(c.wall().Sub(sent) / 2)
	c.reads.Add(1)
	c.anchor.Store(&clockAnchor{offset: at.Sub(mid.Round(0)), wall: mid.Round(0), mono: mid})
	c.anchorOne.Do(func() { close(c.anchored) })
	return nil
}

// openError is a connection that failed to open on the clock's account:
// its reading failed as it opened, or it was not opened at all because the
// first reading's connect failed a moment ago (see failure). The caller's
// statement, which the connection was opened for, was never sent: it is
// answered as one whose connect failed (Unapplied, and unavailable as the
// failure it wraps is), not as one that may have committed (clock QA: a
// reading that timed out read as "may have been applied").
type openError struct {
	why string
	err error
}

// openReadingFailed and unreached are openError's whys.
const (
	openReadingFailed = "reading the database's clock on a new connection"
	unreached         = "the database was not reached a moment ago"
)

func (e *openError) Error() string { return e.why + ": " + e.err.Error() }

func (e *openError) Unwrap() error { return e.err }

// SafeToRetry says that nothing of the caller's was sent (pgconn.SafeToRetry).
func (e *openError) SafeToRetry() bool { return true }

package db

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// RequestReserve is how many of an instance's pool connections a Share
// leaves to the rest of the instance (its requests, the sweeper's other
// tasks) at least, where the pool has room for one beside them.
const RequestReserve = 2

// Share bounds how many of a pool's connections one kind of background
// work holds at once, so that a burst of it (a webhook delivery pass
// recording up to 100 outcomes as their sends end) leaves the instance's
// requests room instead of queueing them behind it: pgxpool hands its
// connections out first come, first served, and such a burst took every
// one each pass (soak QA). The work's statements wait for one of the
// share's slots first, then for a connection, as requests wait for one.
type Share struct {
	slots chan struct{}
}

// ShareOf answers a Share of pool of ShareSize(its MaxConns) slots.
func ShareOf(pool *pgxpool.Pool) *Share { return NewShare(ShareSize(pool.Config().MaxConns)) }

// NewShare answers a Share of n slots (at least one).
func NewShare(n int) *Share { return &Share{slots: make(chan struct{}, max(1, n))} }

// ShareSize is the connections a Share of a pool of maxConns holds at
// most: half the pool, leaving at least RequestReserve, and at least one
// (a pool of 1 to 3 shares one connection, the serverless 4 two, the local
// server's 16 eight). Half, not all but two: a large pool serves many
// requests at once, and a burst of background work should not leave them
// two connections.
func ShareSize(maxConns int32) int {
	return max(1, min(int(maxConns)/2, int(maxConns)-RequestReserve))
}

// Size is how many connections the share holds at most.
func (s *Share) Size() int { return cap(s.slots) }

// Hold runs fn, which uses at most one of the pool's connections at a
// time, once one of the share's slots is free, and frees it when fn
// returns. Slots are handed out in the order asked for. When ctx ends
// first, fn does not run and Hold answers a PoolWaitError (nothing was
// sent; Busy when every slot was taken), as a wait for the pool's own
// connections does.
func (s *Share) Hold(ctx context.Context, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return s.waitError(err)
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return s.waitError(ctx.Err())
	}
	defer func() { <-s.slots }()
	return fn()
}

// waitError is a wait for a slot that ended with err: Busy when every slot
// was taken.
func (s *Share) waitError(err error) error {
	return &PoolWaitError{Busy: len(s.slots) == cap(s.slots), err: err}
}

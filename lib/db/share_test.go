package db_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/db"
)

// A share takes at most half a pool's connections, leaving at least two
// to the rest of the instance, and takes one of a pool too small for that.
func TestAShareLeavesRequestsHalfThePool(t *testing.T) {
	t.Parallel()
	for maxConns, want := range map[int32]int{1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 3, 16: 8, 32: 16} {
		require.Equal(t, want, db.ShareSize(maxConns), "DB_MAX_CONNS=%d", maxConns)
	}
}

// A statement that waits for a slot of a share in vain sent nothing, as one
// that waits for the pool's own connections (db.PoolWaitError).
func TestWaitingForAShareIsBoundedAndUnapplied(t *testing.T) {
	t.Parallel()
	share := db.NewShare(1)
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- share.Hold(context.Background(), func() error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	gone, leave := context.WithCancel(context.Background())
	leave()
	ran := false
	err := share.Hold(gone, func() error { ran = true; return nil })
	require.False(t, ran)
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, db.IsPoolBusy(err), "%v", err)
	require.True(t, db.Unapplied(err), "%v", err)
	close(release)
	require.NoError(t, <-done)
	require.NoError(t, share.Hold(context.Background(), func() error { ran = true; return nil }))
	require.True(t, ran, "the slot is free again")
}

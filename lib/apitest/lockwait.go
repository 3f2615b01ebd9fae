package apitest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// WaitForLock waits until a statement of this database whose text matches
// like (a LIKE pattern) waits for a lock whose wait_event matches event (a
// LIKE pattern too: "%" for any, "advisory" for an advisory lock): the
// other side of a race a test stages by hand has reached it. Ten seconds
// at most, a hang guard only.
func WaitForLock(t testing.TB, pool *pgxpool.Pool, like, event, why string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event LIKE $2
			  AND query LIKE $1)`, like, event).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, why)
}

// BackendPID is the server process id of tx's connection, for
// LockWaits.
func BackendPID(t testing.TB, tx pgx.Tx) int {
	t.Helper()
	var pid int
	require.NoError(t, tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid))
	return pid
}

// LockWaits tells, for each request a test sends while it holds a
// transaction open (a retention pass, say: backend holder), that this very
// request answered or waits for that transaction's locks, not merely that
// some backend does: with requests sent one by one, a backend waiting for
// the holder that no earlier request (still unanswered) waits on is the
// new request's own. A request's connection comes from a pool, so its pid
// is learnt that way, by elimination. Make it before sending the first
// request: backends already waiting then are no request's.
type LockWaits struct {
	t      testing.TB
	pool   *pgxpool.Pool
	holder int
	before map[int]bool
	sent   []sentRequest
}

type sentRequest struct {
	done    <-chan struct{}
	backend int // 0: answered without waiting
}

// NewLockWaits watches requests against the locks of backend holder.
func NewLockWaits(t testing.TB, pool *pgxpool.Pool, holder int) *LockWaits {
	t.Helper()
	w := &LockWaits{t: t, pool: pool, holder: holder, before: map[int]bool{}}
	for _, pid := range w.waiting() {
		w.before[pid] = true
	}
	return w
}

// waiting answers the backends that wait for the holder's locks: directly,
// or behind a backend that does (a second waiter for a row waits for the
// first waiter's tuple lock, not for the holder: pg_blocking_pids, followed).
func (w *LockWaits) waiting() []int {
	var pids []int
	require.NoError(w.t, w.pool.QueryRow(context.Background(), `WITH RECURSIVE waiting(pid) AS (
			SELECT pid FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid))
			UNION
			SELECT a.pid FROM pg_stat_activity a JOIN waiting w ON w.pid = ANY (pg_blocking_pids(a.pid)))
		SELECT coalesce(array_agg(pid), '{}') FROM waiting`, w.holder).Scan(&pids))
	return pids
}

// Wait waits until done is closed (the request just sent answered) or a
// backend waits for the holder's locks that neither an earlier request
// still unanswered nor a backend waiting before the first request waits
// on: this request's, which it records. It answers whether the request
// waits (false: it answered). Ten seconds at most, a hang guard only.
func (w *LockWaits) Wait(done <-chan struct{}, why string) (waits bool) {
	w.t.Helper()
	req := sentRequest{done: done}
	require.Eventually(w.t, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		req.backend = w.newWaiter()
		return req.backend != 0
	}, 10*time.Second, 5*time.Millisecond, why)
	w.sent = append(w.sent, req)
	return req.backend != 0
}

// newWaiter answers a backend waiting for the holder's locks that neither
// an earlier request still unanswered nor a backend waiting before the
// first request waits on, or 0.
func (w *LockWaits) newWaiter() int {
	known := map[int]bool{}
	for _, s := range w.sent {
		select {
		case <-s.done: // answered: its connection may serve a later request
		default:
			known[s.backend] = true
		}
	}
	for _, pid := range w.waiting() {
		if !known[pid] && !w.before[pid] {
			return pid
		}
	}
	return 0
}

// Waiting waits until the request answers or waits for the holder's locks
// (LockWaits.Wait), and fails the test if it answered: the request must
// meet the holder's locks.
func (w *LockWaits) Waiting(done <-chan struct{}, why string) {
	w.t.Helper()
	require.True(w.t, w.Wait(done, why), "answered without waiting: %s", why)
}

// WaitDoneOrBlockedBy waits until done is closed (a request answered) or
// the request waits for a lock that backend pid holds (LockWaits.Wait, for
// one request, any waiter counting: made after the request was sent), so
// that a test can end that transaction knowing the request either answered
// before it or waits for it.
func WaitDoneOrBlockedBy(t testing.TB, pool *pgxpool.Pool, pid int, done <-chan struct{}, why string) {
	t.Helper()
	w := &LockWaits{t: t, pool: pool, holder: pid}
	w.Wait(done, why)
}

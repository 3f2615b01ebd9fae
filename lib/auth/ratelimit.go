package auth

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// countSQL counts one request against the bucket's current window and
// returns the window's total with it, exactly: the window is one row, so
// concurrent requests take turns on its lock and each reads the count its
// own increment made. (Spreading a window over 16 rows and summing them
// read a snapshot without the others' increments: a burst of 50 against a
// limit of 10 let about 20 through.) The shard column of rate_counters
// stays 0.
const countSQL = `
INSERT INTO rate_counters (bucket, window_start, shard, count)
VALUES ($1, $2, 0, 1)
ON CONFLICT (bucket, window_start, shard) DO UPDATE SET count = rate_counters.count + 1
RETURNING count::bigint`

// refundSQL takes back one request countSQL counted in the window of
// bucket $1 that began at $2 (Limiter.refund); never below zero.
const refundSQL = `UPDATE rate_counters SET count = count - 1
WHERE bucket = $1 AND window_start = $2 AND shard = 0 AND count > 0`

// Limiter enforces fixed-window limits in Postgres. A refused request still
// counts, so hammering a limit does not shorten the wait.
type Limiter struct {
	pool *pgxpool.Pool
	now  func() time.Time
}

// NewLimiter returns a Limiter over pool.
func NewLimiter(pool *pgxpool.Pool, now func() time.Time) *Limiter {
	return &Limiter{pool: pool, now: now}
}

// Allow counts one request against bucket and reports whether it is within
// limit per window; when not, retryAfter is the seconds until the window rolls.
func (l *Limiter) Allow(ctx context.Context, bucket string, limit int, window time.Duration) (ok bool, retryAfter int, err error) {
	ok, retryAfter, _, err = l.charge(ctx, bucket, limit, window)
	return ok, retryAfter, err
}

// charge is Allow, also returning the window it counted the request in,
// for refund.
func (l *Limiter) charge(ctx context.Context, bucket string, limit int, window time.Duration) (ok bool, retryAfter int, start time.Time, err error) {
	now := l.now().UTC()
	start = now.Truncate(window)
	var total int64
	if err := l.pool.QueryRow(ctx, countSQL, bucket, start).Scan(&total); err != nil {
		return false, 0, start, fmt.Errorf("count rate bucket: %w", err)
	}
	if total <= int64(limit) {
		return true, 0, start, nil
	}
	return false, retryAfterSeconds(now, start.Add(window)), start, nil
}

// refund takes back a request charge counted in the window that began at
// start: one that turned out not to be what the limit bounds. Counting
// first and refunding after, rather than counting only once the request is
// known to be one, keeps the limit exact under concurrency: requests that
// all read the count below the limit before any of them counted would
// each be let through.
func (l *Limiter) refund(ctx context.Context, bucket string, start time.Time) error {
	if _, err := l.pool.Exec(ctx, refundSQL, bucket, start); err != nil {
		return fmt.Errorf("refund rate bucket: %w", err)
	}
	return nil
}

func retryAfterSeconds(now, end time.Time) int {
	s := int(end.Sub(now).Seconds() + 0.999)
	if s < 1 {
		s = 1
	}
	return s
}

// sqlPruneCounters deletes up to $2 windows that began before $1, oldest
// first. They are found by rate_counters_window_idx (migration 0053) and
// deleted by the row addresses the same statement locked, so a pass reads
// the rows it deletes, not the table: found by a scan of it (no index had
// window_start first) and deleted through a join that read it again, a
// pass read every row twice even when few or none were due (scale QA:
// 1.25M rows, 40k due, 1.15 s instead of 0.06 s; none due, 0.1 s on every
// pass instead of 0.1 ms).
const sqlPruneCounters = `DELETE FROM rate_counters WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM rate_counters WHERE window_start < $1 ORDER BY window_start LIMIT $2
    FOR UPDATE SKIP LOCKED))`

// PruneCounters deletes up to limit windows that began before cutoff
// (called by the sweeper). Bounded like every sweep task: a backlog (the
// sweeper stopped for a day while keys kept counting) was one statement
// deleting all of it, which outlived the task's time, rolled back, and did
// the same on every pass after (scale QA: 610k rows of 10k rate-limited
// keys took 0.8 s; a day of them, 14M).
func PruneCounters(ctx context.Context, pool *pgxpool.Pool, cutoff time.Time, limit int) (int64, error) {
	tag, err := pool.Exec(ctx, sqlPruneCounters, cutoff, limit)
	if err != nil {
		return 0, fmt.Errorf("prune rate counters: %w", err)
	}
	return tag.RowsAffected(), nil
}

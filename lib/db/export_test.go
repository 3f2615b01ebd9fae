package db

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ClockReadings is how many times c read the database's clock.
func ClockReadings(c *Clock) int64 { return c.reads.Load() }

// HookClock adds c's hooks to pc, as OpenWithClock does.
func HookClock(c *Clock, pc *pgxpool.Config) { c.hook(pc) }

// SetClockRetry changes how long a failed first reading answers for c
// before another is tried (set it before the pool opens).
func SetClockRetry(c *Clock, d time.Duration) { c.retry = d }

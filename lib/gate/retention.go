package gate

import (
	"context"
	"fmt"
	"time"

	"github.com/getratchet/ratchet/lib/ids"
)

// minRetention is the shortest retention a policy can set (retention_days
// 1); no effect younger than it is ever a candidate.
const minRetention = 24 * time.Hour

// SweepRetention deletes up to limit effects whose policy's retention_days
// have passed (API.md §4.2, "retention"), with their attempts and approvals.
// Concurrent passes skip each other's rows.
func (s *Service) SweepRetention(ctx context.Context, now time.Time, limit int) (int, error) {
	now = now.UTC()
	ct, err := s.pool.Exec(ctx, sqlPurgeExpired, now, ids.NewAt(ids.Effect, now.Add(-minRetention)), limit)
	if err != nil {
		return 0, fmt.Errorf("purge expired effects: %w", err)
	}
	return int(ct.RowsAffected()), nil
}

package gate

import (
	"context"
	"fmt"
	"time"
)

// SweepRetention deletes up to limit effects whose policy's retention_days
// have passed (API.md §4.2, "retention"), with their attempts and approvals.
// Concurrent passes skip each other's rows.
func (s *Service) SweepRetention(ctx context.Context, now time.Time, limit int) (int, error) {
	ct, err := s.pool.Exec(ctx, sqlPurgeExpired, now.UTC(), limit)
	if err != nil {
		return 0, fmt.Errorf("purge expired effects: %w", err)
	}
	return int(ct.RowsAffected()), nil
}

package gate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/db"
)

// SweepRetention deletes up to limit committed groups whose steps have all
// passed their retention, then up to limit effects whose policy's
// retention_days have passed (API.md §4.2, "retention"), with their
// attempts and approvals, and answers how many effects it deleted. One
// transaction, so a group's steps are deleted only once the group is.
// Concurrent passes skip each other's rows.
func (s *Service) SweepRetention(ctx context.Context, now time.Time, limit int) (int, error) {
	var n int
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlPurgeCommittedGroups, now.UTC(), limit); err != nil {
			return fmt.Errorf("purge expired committed groups: %w", err)
		}
		ct, err := tx.Exec(ctx, sqlPurgeExpired, now.UTC(), limit)
		if err != nil {
			return fmt.Errorf("purge expired effects: %w", err)
		}
		n = int(ct.RowsAffected())
		return nil
	})
	return n, err
}

package gate

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/db"
)

// SweepRetention deletes ended groups (committed, unwound, unwind_failed)
// whose effects have all passed their retention, with those effects (the
// groups starting within limit steps, the first always), and up to limit
// ungrouped effects whose policy's
// retention_days have passed (API.md §4.2, "retention"), with their
// attempts and approvals; it answers how many effects it deleted. One
// transaction, so a group and its steps go together. Concurrent passes
// skip each other's rows.
func (s *Service) SweepRetention(ctx context.Context, now time.Time, limit int) (int, error) {
	var n int
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlPurgeKeptGroups, now.UTC(), max(limit/groupsPerEffects, 1), limit)
		if err != nil {
			return fmt.Errorf("purge expired groups: %w", err)
		}
		groups, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("purge expired groups: %w", err)
		}
		ct, err := tx.Exec(ctx, sqlPurgeExpired, now.UTC(), limit, groups)
		if err != nil {
			return fmt.Errorf("purge expired effects: %w", err)
		}
		n = int(ct.RowsAffected())
		return nil
	})
	return n, err
}

// groupsPerEffects bounds the ended groups a pass reads to a tenth of
// its effects.
const groupsPerEffects = 10

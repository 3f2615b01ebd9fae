package gate

import (
	"context"
	"errors"
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
//
// The groups' purge runs under a savepoint: one that fails (a statement
// timeout over a large group, which goes whole, say) is rolled back
// alone, the ungrouped effects are purged all the same, and the failure
// is answered with their count (sweeper review: it failed the whole task,
// and, failing on every pass, kept every ungrouped effect past its
// retention for good).
func (s *Service) SweepRetention(ctx context.Context, now time.Time, limit int) (int, error) {
	var n int
	var groupsErr error
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		var groups []string
		groups, groupsErr = purgeGroupsApart(ctx, tx, now.UTC(), max(limit/groupsPerEffects, 1), limit)
		ct, err := tx.Exec(ctx, sqlPurgeExpired, now.UTC(), limit, groups)
		if err != nil {
			return fmt.Errorf("purge expired effects: %w", err)
		}
		n = int(ct.RowsAffected())
		return nil
	})
	if err != nil {
		return 0, errors.Join(groupsErr, err)
	}
	return n, groupsErr
}

// purgeGroupsApart is purgeKeptGroups under a savepoint of tx: when it
// fails, what it did is rolled back and tx goes on (a savepoint that
// cannot be rolled back leaves tx failing its next statement).
func purgeGroupsApart(ctx context.Context, tx pgx.Tx, now time.Time, limit, steps int) ([]string, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("purge expired groups: savepoint: %w", err)
	}
	groups, err := purgeKeptGroups(ctx, sp, now, limit, steps)
	if err != nil {
		_ = sp.Rollback(ctx)
		return nil, err
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, fmt.Errorf("purge expired groups: release savepoint: %w", err)
	}
	return groups, nil
}

// purgeKeptGroups locks up to limit ended groups due at now, then deletes
// those whose steps have all passed their retention (the groups starting
// within steps steps), and answers their ids. Two statements, so that the
// second reads the policies after the locks are taken (sqlLockDueGroups).
func purgeKeptGroups(ctx context.Context, tx pgx.Tx, now time.Time, limit, steps int) ([]string, error) {
	due, err := db.CollectIDs(tx.Query(ctx, sqlLockDueGroups, now, limit))
	if err != nil {
		return nil, fmt.Errorf("lock due groups: %w", err)
	}
	if len(due) == 0 {
		return nil, nil
	}
	groups, err := db.CollectIDs(tx.Query(ctx, sqlPurgeKeptGroups, now, due, steps))
	if err != nil {
		return nil, fmt.Errorf("purge expired groups: %w", err)
	}
	return groups, nil
}

// groupsPerEffects bounds the ended groups a pass reads to a tenth of
// its effects.
const groupsPerEffects = 10

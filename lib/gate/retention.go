package gate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/sweep"
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
// retention for good). See purgeGroupsApart for the groups after it.
// The ungrouped effects' purge runs under a savepoint of its own in turn:
// one that fails on every pass (a statement timeout, a refused delete)
// is rolled back alone, the groups purged before it are committed all the
// same, and its failure is answered with their count (review: it rolled
// the groups' purge back with it, every pass). See purgeChecksApart for
// the pairs after it.
//
// The ungrouped effects it reads are those of the pairs (workspace, effect
// type) due for a check (gate_retention_checks, retentionChecks), up to
// limit pairs, and a run first finds the pairs the table does not know yet
// (discoverChecks); a discovery that fails is answered with the rest, and
// holds no purge back.
func (s *Service) SweepRetention(ctx context.Context, now time.Time, limit int) (int, error) {
	now = now.UTC()
	discoveryErr := s.discoverChecks(ctx, now)
	var n int
	var groupsErr, ungroupedErr error
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		n, groupsErr, err = purgeGroupsApart(ctx, tx, now, max(limit/groupsPerEffects, 1), limit)
		if err != nil {
			return err
		}
		m, purgeErr, err := s.purgeChecksApart(ctx, tx, now, limit)
		if err != nil {
			return err
		}
		if purgeErr != nil && !sweep.GoOn(ctx, purgeErr) {
			return purgeErr // not the purge's own failure: the groups' would fail alike
		}
		n, ungroupedErr = n+m, purgeErr
		return nil
	})
	if err != nil {
		return 0, errors.Join(discoveryErr, groupsErr, err)
	}
	return n, errors.Join(discoveryErr, groupsErr, ungroupedErr)
}

// Discovery of the pairs gate_retention_checks does not know yet
// (retentionChecks): a round an hour, retentionDiscoveryPairs pairs a run
// (one index descent each: a chunk reads some 30,000 buffers at most).
const (
	retentionDiscoveryEvery = time.Hour
	retentionDiscoveryPairs = 5000
)

// CheckRetentionEveryPass makes effects.retention check every pair with an
// ended, ungrouped effect at each run, as it did before migration 0084,
// for a clock that may go back (the app's, when its caller injects one:
// tests, whose instances share a database at clocks years apart): a check
// stored at a later now, or a discovery round dated so, would put a pair
// off at an earlier one.
func (s *Service) CheckRetentionEveryPass() { s.checkEveryPass = true }

// discoverChecks gives the pairs gate_retention_checks does not know yet
// their rows, due at now (sqlDiscoverChecks): the next chunk of the round
// under way, or of a new one once retentionDiscoveryEvery has passed since
// the last ended. A round dated later than now by more than endsInFlight
// (a clock that went back) is begun again at now, so that a wrong clock
// holds no discovery back for good. A run that finds the state held by
// another passes over it. Every pass (CheckRetentionEveryPass): all pairs,
// each made due at now.
func (s *Service) discoverChecks(ctx context.Context, now time.Time) error {
	if s.checkEveryPass {
		if _, err := s.pool.Exec(ctx, sqlDiscoverAllChecks, "", "", nil, now); err != nil {
			return fmt.Errorf("discover retention checks: %w", err)
		}
		return nil
	}
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		var (
			afterWS, afterType string
			restart, due       bool
		)
		err := tx.QueryRow(ctx, sqlRetentionDiscovery, now, now.Add(endsInFlight)).Scan(&afterWS, &afterType, &restart,
			&due)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // another run is discovering
		}
		if err != nil {
			return err
		}
		if !due && !restart {
			return nil
		}
		var roundFrom *time.Time // the round's, when it goes on
		if restart || afterWS == "" && afterType == "" {
			afterWS, afterType, roundFrom = "", "", &now
		}
		var n int
		var lastWS, lastType string
		if err := tx.QueryRow(ctx, sqlDiscoverNewChecks, afterWS, afterType, s.discoveryPairs, now).Scan(&n, &lastWS,
			&lastType); err != nil {
			return err
		}
		var next *time.Time // while a round is under way, the next run goes on with it
		if n < s.discoveryPairs {
			at := now.Add(retentionDiscoveryEvery)
			lastWS, lastType, next = "", "", &at
		}
		_, err = tx.Exec(ctx, sqlRetentionDiscovered, lastWS, lastType, roundFrom, next)
		return err
	})
	if err != nil {
		return fmt.Errorf("discover retention checks: %w", err)
	}
	return nil
}

// typePair is a (workspace, effect type) pair: one of
// gate_retention_checks, or of gate_groups_to_date.
type typePair struct{ workspaceID, effectType string }

// collectPairs answers the pairs rows read (workspace_id, effect_type).
func collectPairs(rows pgx.Rows, err error) ([]typePair, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (typePair, error) {
		var p typePair
		return p, r.Scan(&p.workspaceID, &p.effectType)
	})
}

// purgeChecksApart purges the ungrouped effects of up to limit pairs due
// at now (purgeDueChecks) as purgeApart does, and answers the effects it
// deleted and the purge's failures (purgeErr); err, when tx itself
// failed. A pair whose purge fails alone is put off (its check_at,
// retentionRetryAfter on): sqlLockDueChecks reads the pairs waiting
// longest first, and a failed batch moves none of them on, so one failing
// on every pass (a statement timeout over its backlog, a refused delete)
// kept every pair's ungrouped effects past their retention for good
// (review). One by one, the pairs share the batch's limit in their order:
// once it is spent, those left stay due, waiting longest, for the next
// pass. Every pass (CheckRetentionEveryPass), discovery makes a pair put
// off due again at each run (sqlDiscoverAllChecks: a check_at later than
// now is read as a clock that went back), so a failing pair fails the
// batch, and answers its error, at every run: the other pairs are purged
// one by one all the same. That mode is the tests'.
func (s *Service) purgeChecksApart(ctx context.Context, tx pgx.Tx, now time.Time, limit int) (n int, purgeErr,
	err error) {
	return purgeApart(ctx, tx, apart[typePair]{
		batch: func(sp pgx.Tx) ([]typePair, int, error) { return s.purgeDueChecks(ctx, sp, now, limit) },
		alone: func(sp pgx.Tx, p typePair, deleted int) (int, error) {
			locked, err := collectPairs(sp.Query(ctx, sqlLockDueCheck, now, p.workspaceID, p.effectType))
			if err != nil {
				return 0, fmt.Errorf("lock due retention check: %w", err)
			}
			return purgePairs(ctx, sp, now, limit-deleted, locked)
		},
		limit: limit,
		putOff: func(p typePair) error {
			_, err := tx.Exec(ctx, sqlPutOffCheck, p.workspaceID, p.effectType, now.Add(retentionRetryAfter))
			return err
		},
		name: func(p typePair) string {
			return fmt.Sprintf("effect type %s of workspace %s", p.effectType, p.workspaceID)
		},
	})
}

// purgeDueChecks locks up to limit pairs due for a check at now
// (sqlLockDueChecks; every one due when checkEveryPass) and purges them
// (purgePairs); it answers the pairs it locked, also when the purge then
// fails, and the effects it deleted.
func (s *Service) purgeDueChecks(ctx context.Context, tx pgx.Tx, now time.Time, limit int) ([]typePair, int, error) {
	pairs := &limit
	if s.checkEveryPass {
		pairs = nil
	}
	due, err := collectPairs(tx.Query(ctx, sqlLockDueChecks, now, pairs))
	if err != nil {
		return nil, 0, fmt.Errorf("lock due retention checks: %w", err)
	}
	n, err := purgePairs(ctx, tx, now, limit, due)
	return due, n, err
}

// purgePairs deletes, of the pairs tx locked (due), up to limit of their
// ungrouped effects whose retention has passed at now (sqlPurgeExpired),
// then stores each pair's next check (sqlRescheduleChecks), both without
// JIT (sqlRetentionPlan), and answers the effects it deleted.
func purgePairs(ctx context.Context, tx pgx.Tx, now time.Time, limit int, due []typePair) (int, error) {
	if len(due) == 0 {
		return 0, nil
	}
	workspaces, types := make([]string, len(due)), make([]string, len(due))
	for i, p := range due {
		workspaces[i], types[i] = p.workspaceID, p.effectType
	}
	if _, err := tx.Exec(ctx, sqlRetentionPlan); err != nil {
		return 0, fmt.Errorf("retention plan: %w", err)
	}
	ct, err := tx.Exec(ctx, sqlPurgeExpired, now, limit, nil, workspaces, types)
	if err != nil {
		return 0, fmt.Errorf("purge expired effects: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlRescheduleChecks, now, workspaces, types, now.Add(-endsInFlight)); err != nil {
		return 0, fmt.Errorf("reschedule retention checks: %w", err)
	}
	return int(ct.RowsAffected()), nil
}

// retentionRetryAfter is how long a group, or a pair, whose purge failed
// alone is put off (its keep_until, its check_at, moved on).
const retentionRetryAfter = time.Hour

// purgeGroupsApart purges up to limit due groups (purgeKeptGroups) as
// purgeApart does, and answers the effects it deleted and the groups'
// failures (groupsErr); err, when tx itself failed. A group that fails
// alone is put off (its keep_until, retentionRetryAfter on): the batch
// reads the groups due first, so one failing on every pass (a statement
// timeout over a large group, a refused delete) kept every group after it
// for good (sweeper review). One by one, each group goes whole, and the
// groups share the batch's steps as the batch's do: those starting within
// steps steps, the first always, the last perhaps past it.
func purgeGroupsApart(ctx context.Context, tx pgx.Tx, now time.Time, limit, steps int) (n int, groupsErr, err error) {
	return purgeApart(ctx, tx, apart[string]{
		batch: func(sp pgx.Tx) ([]string, int, error) {
			due, err := db.CollectIDs(sp.Query(ctx, sqlLockDueGroups, now, limit))
			if err != nil {
				return nil, 0, fmt.Errorf("lock due groups: %w", err)
			}
			_, effects, err := purgeKeptGroups(ctx, sp, now, due, steps)
			return due, effects, err
		},
		alone: func(sp pgx.Tx, id string, _ int) (int, error) {
			locked, err := db.CollectIDs(sp.Query(ctx, sqlLockDueGroup, now, id))
			if err != nil {
				return 0, fmt.Errorf("lock due group: %w", err)
			}
			_, effects, err := purgeKeptGroups(ctx, sp, now, locked, steps)
			return effects, err
		},
		limit: steps,
		putOff: func(id string) error {
			_, err := tx.Exec(ctx, sqlPutOffGroup, id, now.Add(retentionRetryAfter))
			return err
		},
		name: func(id string) string { return "group " + id },
	})
}

// apart is a purge that purgeApart runs as one batch, and item by item
// once the batch failed: the groups' (purgeGroupsApart), the pairs'
// (purgeChecksApart).
type apart[T any] struct {
	// batch locks the items due and purges them under sp; it answers the
	// items it locked, also when their purge then fails, and the effects
	// it deleted.
	batch func(sp pgx.Tx) ([]T, int, error)
	// alone locks item again, if it is still due and no other pass holds
	// it, and purges it under sp; deleted is what the items before it
	// deleted.
	alone func(sp pgx.Tx, item T, deleted int) (int, error)
	// limit is the effects the items share one by one, as the batch's
	// items do: once they are deleted, the items left are left as they
	// are, due, for the next pass. Each item alone took up to the batch's
	// own limit (review: the groups of a failed batch, each deleted whole,
	// a batch's worth of groups of any size, in one pass).
	limit int
	// putOff puts item off by retentionRetryAfter (never back), in tx.
	putOff func(item T) error
	// name names item in an error: ids only, never a key or a payload.
	name func(item T) string
}

// purgeApart runs a's batch under a savepoint of tx, and answers the
// effects it deleted and the purge's failures (purgeErr); err, when tx
// itself failed. When the batch fails, what it did is rolled back and its
// items are purged again one by one, each under a savepoint of its own;
// an item that fails alone is put off and its error, named by the item,
// answered, so that the next batches read past it. One by one only once a
// batch failed, and the item put off leaves the next batches whole: a
// pass's round trips stay those of one batch but for one pass an hour per
// failing item. A savepoint per item instead would cost two more round
// trips per item on every pass.
func purgeApart[T any](ctx context.Context, tx pgx.Tx, a apart[T]) (n int, purgeErr, err error) {
	var due []T
	n, batchErr := inSavepoint(ctx, tx, func(sp pgx.Tx) (int, error) {
		var effects int
		var err error
		due, effects, err = a.batch(sp)
		return effects, err
	})
	if batchErr == nil || !sweep.GoOn(ctx, batchErr) {
		return n, batchErr, nil
	}
	var errs []error
	for _, item := range due {
		if n >= a.limit {
			break // the rest wait for the next pass
		}
		err := batchErr
		if len(due) > 1 { // one alone failed as the batch
			var m int
			m, err = inSavepoint(ctx, tx, func(sp pgx.Tx) (int, error) { return a.alone(sp, item, n) })
			if err == nil {
				n += m
				continue
			}
			err = fmt.Errorf("%s: %w", a.name(item), err)
		}
		if errs = append(errs, err); !sweep.GoOn(ctx, err) {
			break // not the item's failure: it is not put off
		}
		if err := a.putOff(item); err != nil {
			return 0, errors.Join(errs...), fmt.Errorf("put off %s: %w", a.name(item), err)
		}
	}
	if len(errs) == 0 {
		errs = append(errs, batchErr)
	}
	return n, errors.Join(errs...), nil
}

// inSavepoint runs do under a savepoint of tx: when it fails, what it did
// is rolled back and tx goes on (a savepoint that cannot be rolled back
// leaves tx failing its next statement).
func inSavepoint(ctx context.Context, tx pgx.Tx, do func(sp pgx.Tx) (int, error)) (int, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("purge expired: savepoint: %w", err)
	}
	n, err := do(sp)
	if err != nil {
		_ = sp.Rollback(ctx)
		return 0, err
	}
	if err := sp.Commit(ctx); err != nil {
		return 0, fmt.Errorf("purge expired: release savepoint: %w", err)
	}
	return n, nil
}

// purgeKeptGroups deletes, of the groups due at now that tx locked (due),
// those whose steps have all passed their retention (the groups starting
// within steps steps), with their effects, and answers those groups and
// how many effects it deleted. The groups were locked by a statement of their own, so that
// this one reads the policies after the locks are taken (sqlLockDueGroups).
// Their effects go under the groups' savepoint, so that a group whose
// effects cannot be deleted is rolled back alone too.
func purgeKeptGroups(ctx context.Context, tx pgx.Tx, now time.Time, due []string, steps int) (groups []string, effects int, err error) {
	if len(due) == 0 {
		return nil, 0, nil
	}
	groups, err = db.CollectIDs(tx.Query(ctx, sqlPurgeKeptGroups, now, due, steps))
	if err != nil {
		return nil, 0, fmt.Errorf("purge expired groups: %w", err)
	}
	if len(groups) == 0 {
		return nil, 0, nil
	}
	ct, err := tx.Exec(ctx, sqlPurgeExpired, now, 0, groups, nil, nil) // no pair: the groups' effects alone
	if err != nil {
		return nil, 0, fmt.Errorf("purge expired groups' effects: %w", err)
	}
	return groups, int(ct.RowsAffected()), nil
}

// groupsPerEffects bounds the ended groups a pass reads to a tenth of
// its effects.
const groupsPerEffects = 10

// SweepGroupsToDate dates again the ended groups of the types whose
// retention a policy write lowered and whose dating after it did not
// happen, or not wholly (it failed, or the instance stopped first: under
// an Idempotency-Key the failure is only logged, and a resend replays the
// answer; or the write dated its most, datingBatchesPerWrite batches), so
// that a lost dating is done by the next pass, and makes the final pass of
// those dated whose final pass is due at now (endsInFlight): up to types
// such types (each workspace's first before any one's second), a batch of
// up to groups groups of each (dateGroupsBatch), from where the last batch
// left it. A type whose batch another transaction is dating (a second
// sweeper, the policy write) is passed over. Each type in a transaction of
// its own; one that fails holds no other back. It answers how many groups
// it dated.
func (s *Service) SweepGroupsToDate(ctx context.Context, now time.Time, types, groups int) (int, error) {
	due, err := collectPairs(s.pool.Query(ctx, sqlGroupsToDate, types, now.UTC()))
	if err != nil {
		return 0, fmt.Errorf("read groups to date: %w", err)
	}
	var (
		n    int
		errs []error
	)
	for _, t := range due {
		m, _, err := s.dateGroupsBatch(ctx, t.workspaceID, t.effectType, groups, false, now)
		if err != nil {
			if errs = append(errs, fmt.Errorf("date groups of a lowered retention: %w", err)); !sweep.GoOn(ctx, err) {
				break
			}
			continue
		}
		n += m
	}
	return n, errors.Join(errs...)
}

// endsInFlight is how long after a policy write lowering a retention its
// dating's final pass comes (the record's final_at, migration 0079), and
// how long before it the groups that pass reads ended (ended_from). A
// group's end (a commit, the end of a rollback) dates the group by the
// policies its statement reads, without waiting for a policy write (a
// report can end a rollback, and waits for none): one that read them
// before the write committed, and committed after the dating read the
// type's groups, was not ended in the dating's snapshot, and kept the
// longer date (review). Such an end began before the write committed and
// runs in a request or a sweeper's task: it commits or rolls back within
// the longest of those (30 s for a request, the functions' limit; 60 s
// for the sweeper's Lambda function), and dated its group by its
// instance's clock no earlier than its own start. Five minutes leaves
// room for both and for instances' clocks minutes apart: by the final
// pass every such end is committed, and it ended within the window.
const endsInFlight = 5 * time.Minute

// dateGroupsBatch dates again, in a transaction of its own, a batch of up
// to groups of the ended groups that a lowered retention of workspaceID's
// type effectType left to date (gate_groups_to_date, migration 0078), from
// where the last batch left off (after_id), and moves the record on past
// them, or marks it batched once the last is dated (unless a lower
// retention was recorded meanwhile). Once batched, and its final pass due
// at now (final_at, migration 0079), a batch is one of the final pass
// (finalDating), which deletes the record once done. The one place groups
// are shortened: a policy write's dating runs it batch after batch
// (shortenKeptGroups), the sweeper a batch a type a pass
// (SweepGroupsToDate). It claims the type first (sqlClaimGroupsToDate),
// then reads the record, then locks the groups, then writes the record: a
// policy write holds the record only as its last statement, so the batch
// waits for no more than its commit. Claimed by another transaction, the
// type is waited for when wait (the write's dating: it then goes on from
// where that one left it), else passed over (the sweeper's: dated 0,
// more). It answers the groups whose date changed, and whether any is left
// to date now (more: the record is still there, not batched or its final
// pass due).
func (s *Service) dateGroupsBatch(ctx context.Context, workspaceID, effectType string, groups int, wait bool,
	now time.Time) (n int, more bool, err error) {
	err = db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		n, more = 0, true
		claimed := true
		if wait {
			_, err = tx.Exec(ctx, sqlClaimGroupsToDate, workspaceID, effectType)
		} else {
			err = tx.QueryRow(ctx, sqlTryClaimGroupsToDate, workspaceID, effectType).Scan(&claimed)
		}
		if err != nil {
			return fmt.Errorf("claim groups to date: %w", err)
		}
		if !claimed {
			return nil // another transaction is dating this batch
		}
		var r toDateRecord
		err := tx.QueryRow(ctx, sqlGroupsToDateOf, workspaceID, effectType).Scan(&r.days, &r.afterID, &r.batched,
			&r.finalAt, &r.endedFrom, &r.restarts)
		if errors.Is(err, pgx.ErrNoRows) {
			more = false // dated already
			return nil
		}
		if err != nil {
			return fmt.Errorf("read groups to date: %w", err)
		}
		if r.batched {
			if r.finalAt.After(now) {
				more = false // dated; the final pass is not due yet
				return nil
			}
			n, more, err = finalDating(ctx, tx, workspaceID, effectType, r, groups)
			return err
		}
		batch, err := db.CollectIDs(tx.Query(ctx, sqlLockGroupsToShortenAfter, workspaceID, effectType, r.days,
			r.afterID, groups))
		if err != nil {
			return fmt.Errorf("lock groups to shorten: %w", err)
		}
		if n, err = shortenLocked(ctx, tx, batch); err != nil {
			return err
		}
		if len(batch) == groups { // perhaps more after the last
			if _, err := tx.Exec(ctx, sqlGroupsDatedTo, workspaceID, effectType, r.restarts, batch[len(batch)-1]); err != nil {
				return fmt.Errorf("groups dated to: %w", err)
			}
			return nil
		}
		ct, err := tx.Exec(ctx, sqlGroupsBatched, workspaceID, effectType, r.restarts)
		if err != nil {
			return fmt.Errorf("groups dated: %w", err)
		}
		more = ct.RowsAffected() == 0 // restarted meanwhile
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	return n, more, nil
}

// toDateRecord is a type's record of groups to date (sqlGroupsToDateOf).
type toDateRecord struct {
	days               int
	afterID            string
	batched            bool
	finalAt, endedFrom time.Time
	restarts           int64
}

// finalDating runs a batch of r's final pass in tx, which holds the type's
// claim: it reads up to groups of the workspace's groups that ended from
// r's ended_from (and after_id) on, up to its final_at, in the order they
// ended
// (sqlLockEndedGroupsToShorten), dates again those of the type kept too
// long, and moves the record on past the batch, or deletes it once the
// batch is the last (unless a retention was lowered meanwhile). So a group
// whose end committed after the batches read its type's groups, having
// read the policies before the write, is dated by the lowered retention
// all the same (endsInFlight). It answers the groups whose date changed
// and whether the record is still there.
func finalDating(ctx context.Context, tx pgx.Tx, workspaceID, effectType string, r toDateRecord, groups int) (
	n int, more bool, err error) {
	type ended struct {
		id      string
		at      time.Time
		shorten bool
	}
	rows, err := tx.Query(ctx, sqlLockEndedGroupsToShorten, workspaceID, effectType, r.days, r.endedFrom, r.afterID, groups,
		r.finalAt)
	if err != nil {
		return 0, false, fmt.Errorf("lock ended groups to shorten: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ended, error) {
		var e ended
		return e, row.Scan(&e.id, &e.at, &e.shorten)
	})
	if err != nil {
		return 0, false, fmt.Errorf("lock ended groups to shorten: %w", err)
	}
	var locked []string
	for _, e := range batch {
		if e.shorten {
			locked = append(locked, e.id)
		}
	}
	if n, err = shortenLocked(ctx, tx, locked); err != nil {
		return 0, false, err
	}
	if len(batch) == groups { // perhaps more after the last
		last := batch[len(batch)-1]
		if _, err := tx.Exec(ctx, sqlFinalDatedTo, workspaceID, effectType, r.restarts, last.at, last.id); err != nil {
			return 0, false, fmt.Errorf("final groups dated to: %w", err)
		}
		return n, true, nil
	}
	ct, err := tx.Exec(ctx, sqlGroupsDated, workspaceID, effectType, r.restarts)
	if err != nil {
		return 0, false, fmt.Errorf("groups dated: %w", err)
	}
	return n, ct.RowsAffected() == 0, nil // still there: restarted meanwhile
}

// shortenLocked dates again the groups tx locked to shorten
// (sqlShortenKeptGroups), and answers those whose date changed.
func shortenLocked(ctx context.Context, tx pgx.Tx, batch []string) (int, error) {
	if len(batch) == 0 {
		return 0, nil
	}
	ct, err := tx.Exec(ctx, sqlShortenKeptGroups, batch)
	if err != nil {
		return 0, fmt.Errorf("shorten kept groups: %w", err)
	}
	return int(ct.RowsAffected()), nil
}

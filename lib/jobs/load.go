package jobs

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/ids"
)

// Load-testing helpers: used by tests and scripts/jobsbench, never by the API.

// CloneQueued copies the QUEUED job templateJobID n times with ids built from
// tag (unique per call), for load tests and benchmarks. It is not used by the
// API. tag must be made of id characters (ids.Valid): a copy whose id the API
// cannot parse could be claimed but never reported.
func (s *Service) CloneQueued(ctx context.Context, templateJobID, tag string, n int) (int64, error) {
	if tag == "" || len(tag) > 20 || !ids.Valid(ids.Job, ids.Job+"_"+tag+strings.Repeat("0", 26-len(tag))) {
		return 0, fmt.Errorf("clone queued: tag %q is not made of id characters", tag)
	}
	ct, err := s.pool.Exec(ctx, sqlCloneQueued, templateJobID, tag, n)
	if err != nil {
		return 0, fmt.Errorf("clone queued: %w", err)
	}
	return ct.RowsAffected(), nil
}

// ExplainClaim runs the claim statement under EXPLAIN ANALYZE in a
// transaction that is rolled back, and returns the plan, so a benchmark can
// show that the claim reads only the head of the claim index.
func (s *Service) ExplainClaim(ctx context.Context, p *auth.Principal, workerID string, limit int) (string, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+sqlClaim,
		s.claimArgs(p, workerID, limit, nil, s.now())...)
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("explain claim: %w", err)
	}
	return strings.Join(lines, "\n"), nil
}

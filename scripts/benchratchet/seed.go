package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// cloneRows seeds history by copying rows that the real service wrote: each
// row of table matching where is copied `copies` times, every column kept
// except those in overrides, which are SQL expressions over the source row
// `s` and the copy number `g` (e.g. {"id": "s.id || '-h' || g"}). Because
// the rows come from the product itself and jsonb_populate_record carries
// every other column over, the seed needs no knowledge of the table's
// columns and stays right when migrations add some. Returns rows inserted.
//
// Copies are history only: sealed columns keep the ciphertext of their
// source row, whose additional data names the source id, so a copy with a
// new id never opens. Figures must therefore read and write only the real
// rows they created.
func cloneRows(ctx context.Context, pool *pgxpool.Pool, table string, copies int, where string, overrides map[string]string, args ...any) (int64, error) {
	if copies < 1 {
		return 0, nil
	}
	var pairs []string
	for _, col := range slices.Sorted(maps.Keys(overrides)) {
		pairs = append(pairs, fmt.Sprintf("'%s', %s", col, overrides[col]))
	}
	t := pgx.Identifier{table}.Sanitize()
	sql := fmt.Sprintf(`INSERT INTO %s SELECT (jsonb_populate_record(s, jsonb_build_object(%s))).*
		FROM %s s CROSS JOIN generate_series(1, %d) g WHERE %s`, t, strings.Join(pairs, ", "), t, copies, where)
	var n int64
	err := unbounded(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sql, args...)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("seed %s: %w", table, err)
	}
	return n, nil
}

// unbounded runs fn in a transaction without the app's statement timeout
// (DB_STATEMENT_TIMEOUT protects requests; a seed of a million rows on a
// loaded machine may take longer and is not a request).
func unbounded(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = 0"); err != nil {
			return err
		}
		return fn(tx)
	})
}

// analyze refreshes planner statistics after seeding: a plan made for an
// empty table is not the plan a real deployment runs.
func analyze(ctx context.Context, pool *pgxpool.Pool, tables ...string) error {
	return unbounded(ctx, pool, func(tx pgx.Tx) error {
		for _, t := range tables {
			if _, err := tx.Exec(ctx, "ANALYZE "+pgx.Identifier{t}.Sanitize()); err != nil {
				return err
			}
		}
		return nil
	})
}

// vacuumAnalyze is analyze plus VACUUM: after a bulk load it sets the hint
// bits and the visibility map a long-lived queue table has, so the first
// measured reads do not pay for them (and autovacuum does not start on the
// freshly loaded table in the middle of a figure).
func vacuumAnalyze(ctx context.Context, pool *pgxpool.Pool, tables ...string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET statement_timeout = 0"); err != nil {
		return err
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "RESET statement_timeout") }()
	for _, t := range tables {
		if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) "+pgx.Identifier{t}.Sanitize()); err != nil {
			return err
		}
	}
	return nil
}

// claimIO is what the server has written to its WAL and read from its
// buffers, for the claim figure's "# claim io" line: where a deeper queue's
// claim spends more (full-page writes, buffers read from outside
// shared_buffers).
type claimIO struct{ walRecords, walBytes, walFPI, hit, read int64 }

func readClaimIO(ctx context.Context, pool *pgxpool.Pool) (claimIO, error) {
	var c claimIO
	err := pool.QueryRow(ctx, `SELECT w.wal_records, w.wal_bytes::bigint, w.wal_fpi, d.blks_hit, d.blks_read
FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()`).Scan(
		&c.walRecords, &c.walBytes, &c.walFPI, &c.hit, &c.read)
	return c, err
}

package testpg

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PlanCacheModes are the two ways a statement the pool sends is planned: on
// its parameters' values (an unnamed statement, as the exec and simple
// modes send, or a prepared one's first executions) or once for any values
// (a prepared statement the server caches, or plan_cache_mode set so).
var PlanCacheModes = []string{"force_custom_plan", "force_generic_plan"}

// Scratch begins a transaction on pool in which each of tables is an empty
// copy of itself, with its indexes (without its foreign keys), that the
// statements it runs read instead (an uncommitted schema of their own,
// first in the search path); the other tables are the database's. A test
// of a plan seeds and ANALYZEs them there: no other test sees its rows or
// sways its statistics. The transaction is rolled back when the test ends.
func Scratch(ctx context.Context, t testing.TB, pool *pgxpool.Pool, tables ...string) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("testpg: scratch: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var schema string
	if err := tx.QueryRow(ctx, `SELECT 'scratch_' || pg_backend_pid()`).Scan(&schema); err != nil {
		t.Fatalf("testpg: scratch: %v", err)
	}
	stmts := []string{`CREATE SCHEMA ` + schema}
	for _, table := range tables {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE %s.%s (LIKE public.%[2]s INCLUDING ALL)`, schema, table))
	}
	stmts = append(stmts, `SELECT set_config('search_path', '`+schema+`, public', true)`)
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("testpg: scratch: %s: %v", s, err)
		}
	}
	return tx
}

// RowsRead runs sql with args in tx under EXPLAIN (ANALYZE, BUFFERS) as the
// pool runs it: prepared with the parameter types the server infers (as
// pgx's exec and statement cache modes have it prepared), then executed
// under plan cache mode mode (PlanCacheModes). What it changes is undone (a
// savepoint). It answers, for each relation the plan scans, how many rows
// it read of it: those its scans of the relation returned and those they
// removed (by filter or recheck), over all their loops; and the plan.
// Rows read, not the nodes' names, say whether a sweep read a batch or a
// backlog.
func RowsRead(ctx context.Context, tx pgx.Tx, mode, sql string, args ...any) (map[string]int, []PlanNode, error) {
	if _, err := tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode); err != nil {
		return nil, nil, err
	}
	if _, err := tx.Exec(ctx, `PREPARE rows_read AS `+sql); err != nil {
		return nil, nil, fmt.Errorf("prepare: %w", err)
	}
	if _, err := tx.Exec(ctx, `SAVEPOINT rows_read`); err != nil {
		return nil, nil, err
	}
	nodes, err := explainExecute(ctx, tx, args)
	if _, rerr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT rows_read`); rerr != nil && err == nil {
		err = rerr
	}
	// A prepared statement outlives the transaction: the connection goes
	// back to the pool.
	if _, derr := tx.Exec(ctx, `DEALLOCATE rows_read`); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		return nil, nil, err
	}
	read := map[string]int{}
	for _, n := range nodes {
		if rel, ok := n.Fields["Relation Name"].(string); ok && n.Fields["Node Type"] != "ModifyTable" {
			read[rel] += n.rowsRead()
		}
	}
	return read, nodes, nil
}

// ReadsAtMost fails t for each relation in most of which the plan (RowsRead's
// read and nodes) read more rows than its bound, naming how it read it; of
// says what the statement ran on ("force_generic_plan, limit 100: a batch of
// 100 runs"). The bounds are a few times a batch: a statement that reads its
// table whole, or a backlog, is far over them.
func ReadsAtMost(t testing.TB, read map[string]int, nodes []PlanNode, most map[string]int, of string) {
	t.Helper()
	for relation, bound := range most {
		if read[relation] > bound {
			t.Errorf("%s: %d rows of %s read, at most %d expected: %v", of, read[relation], relation, bound,
				Reads(nodes, relation))
		}
	}
}

// rowsRead is how many rows a scan read over all its loops (EXPLAIN
// ANALYZE's counts are each loop's average): those it returned and those
// it removed by filter or recheck.
func (n PlanNode) rowsRead() int {
	num := func(k string) float64 { v, _ := n.Fields[k].(float64); return v }
	return int(num("Actual Loops") * (num("Actual Rows") + num("Rows Removed by Filter") + num("Rows Removed by Index Recheck")))
}

// TempBlocks answers how many blocks of temporary files the plan nodes
// (RowsRead's) wrote: a sort or a hash that did not fit in work_mem
// spilled to disk. The first node's count is the statement's.
func TempBlocks(nodes []PlanNode) int {
	if len(nodes) == 0 {
		return 0
	}
	n, _ := nodes[0].Fields["Temp Written Blocks"].(float64)
	return int(n)
}

// scans describes the scans of relation in nodes, with the rows each read.
func scans(nodes []PlanNode, relation string) []string {
	var out []string
	for _, n := range nodes {
		if n.Fields["Relation Name"] == relation && n.Fields["Node Type"] != "ModifyTable" {
			out = append(out, fmt.Sprintf("%s %v: %d rows", n.Fields["Node Type"], n.Fields["Index Name"], n.rowsRead()))
		}
	}
	return out
}

// explainExecute runs the prepared statement rows_read under EXPLAIN
// (ANALYZE, BUFFERS). The arguments are sent as literals (the simple protocol):
// EXECUTE takes them as its parameters, of the types inferred.
func explainExecute(ctx context.Context, tx pgx.Tx, args []any) ([]PlanNode, error) {
	marks := make([]string, len(args))
	for i := range marks {
		marks[i] = fmt.Sprintf("$%d", i+1)
	}
	var plans []struct {
		Plan map[string]any `json:"Plan"`
	}
	q := `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE rows_read(` + strings.Join(marks, ", ") + `)`
	if err := tx.QueryRow(ctx, q, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...).Scan(&plans); err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	var out []PlanNode
	for _, p := range plans {
		out = append(out, walkPlan(p.Plan, false)...)
	}
	return out, nil
}

// Backlog is a test that a sweep's statement reads a batch of one
// workspace's backlog, not the backlog: CheckBacklog seeds Tables[0] with
// Seed ($1 rows of history, done, among $2 workspaces "ws_h0"…, and a
// backlog of $3 rows due, all of workspace "ws_h0", newer), ANALYZEs it,
// and runs SQL with Args(limit) for each of Limits, in both plan cache
// modes, on a few workspaces' history and on many's.
type Backlog struct {
	Tables []string // copied (Scratch): the table worked off, then those the statement writes
	Seed   string
	SQL    string
	Args   func(limit int) []any
	Limits []int
}

// Sizes of CheckBacklog's seed: together within ANALYZE's default sample
// (30,000 rows), so that the statistics, and so the plans, are the same on
// every run.
const (
	backlogRows = 20000
	historyRows = 10000
)

// CheckBacklog fails t unless each run of b's statement read fewer rows of
// the table worked off than a fifth of the backlog: a batch is read (each
// workspace's first rows, then the batch's by id), not the backlog whole
// (a bitmap scan of it, sorted) nor the history before it (an index in
// due order alone, filtered). Rows read, not buffers: a bitmap scan of a
// backlog of 40,000 events read 610 buffers, and the fan-out's 500
// updates and lookups by id some 3,000 whatever the plan.
func CheckBacklog(t *testing.T, pool *pgxpool.Pool, b Backlog) {
	t.Helper()
	ctx := context.Background()
	for _, workspaces := range []int{3, 100} {
		tx := Scratch(ctx, t, pool, b.Tables...)
		if _, err := tx.Exec(ctx, b.Seed, historyRows, workspaces, backlogRows); err != nil {
			t.Fatalf("seed: %v", err)
		}
		if _, err := tx.Exec(ctx, `ANALYZE `+b.Tables[0]); err != nil {
			t.Fatalf("analyze: %v", err)
		}
		for _, mode := range PlanCacheModes {
			for _, limit := range b.Limits {
				read, nodes, err := RowsRead(ctx, tx, mode, b.SQL, b.Args(limit)...)
				if err != nil {
					t.Fatalf("%s, limit %d: %v", mode, limit, err)
				}
				if n := read[b.Tables[0]]; n >= backlogRows/5 {
					t.Errorf("%d workspaces of history, %s, limit %d: %d rows of %s read for a backlog of %d: %v",
						workspaces, mode, limit, n, b.Tables[0], backlogRows, scans(nodes, b.Tables[0]))
				}
			}
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatalf("rollback: %v", err)
		}
	}
}

// Pages is a test that a list read newest first reads a page of one
// workspace's rows, not the rows before it: CheckPages seeds Table with
// Seed ($1 rows of workspace "ws_h0", a few of them, among the oldest, of
// value Rare in the list's filter; then twice as many of "ws_h1", all
// newer), ANALYZEs it, and runs each page Page answers (the statement and
// its arguments for a cursor, "" for none, and a filter value, "" for
// any), in both plan cache modes: the first page and one after Cursor, of
// any value and of Rare (when the list has a filter: Rare not "").
type Pages struct {
	Table  string
	Seed   string
	Rare   string
	Cursor string
	Page   func(cursor, value string, limit int) (string, []any)
}

// CheckPages fails t unless each page read at most twice its rows of
// p.Table (pageRows).
func CheckPages(t *testing.T, pool *pgxpool.Pool, p Pages) {
	t.Helper()
	const pageRows = 50
	ctx := context.Background()
	tx := Scratch(ctx, t, pool, p.Table)
	if _, err := tx.Exec(ctx, p.Seed, backlogRows); err != nil {
		t.Fatalf("seed: %v", err)
	}
	if _, err := tx.Exec(ctx, `ANALYZE `+p.Table); err != nil {
		t.Fatalf("analyze: %v", err)
	}
	for _, mode := range PlanCacheModes {
		for _, cursor := range []string{"", p.Cursor} {
			values := []string{""}
			if p.Rare != "" {
				values = append(values, p.Rare)
			}
			for _, value := range values {
				sql, args := p.Page(cursor, value, pageRows)
				read, nodes, err := RowsRead(ctx, tx, mode, sql, args...)
				if err != nil {
					t.Fatalf("%s, cursor %q, value %q: %v", mode, cursor, value, err)
				}
				if n := read[p.Table]; n > 2*pageRows {
					t.Errorf("%s, cursor %q, value %q: %d rows of %s read for a page of %d: %v", mode, cursor, value,
						n, p.Table, pageRows, scans(nodes, p.Table))
				}
			}
		}
	}
}

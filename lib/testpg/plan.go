package testpg

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Querier is what Explain needs of a pool, a connection or a transaction.
type Querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// PlanNode is one node of a statement's plan (EXPLAIN's JSON fields, "Node
// Type", "Relation Name", "CTE Name", "Function Name"...). InSubPlan: it
// runs under a correlated subplan, once for each row of something else.
type PlanNode struct {
	Fields    map[string]any
	InSubPlan bool
}

// Explain answers the nodes of sql's plan with args (EXPLAIN only: the
// statement does not run). Tests assert on the shape of a plan what no
// small test database shows as slow (scale QA).
func Explain(ctx context.Context, q Querier, sql string, args ...any) ([]PlanNode, error) {
	var plans []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := q.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&plans); err != nil {
		return nil, err
	}
	var out []PlanNode
	for _, p := range plans {
		out = append(out, walkPlan(p.Plan, false)...)
	}
	return out, nil
}

// walkPlan answers node and the nodes under it, in EXPLAIN's order.
func walkPlan(node map[string]any, inSubPlan bool) []PlanNode {
	inSubPlan = inSubPlan || node["Parent Relationship"] == "SubPlan"
	out := []PlanNode{{Fields: node, InSubPlan: inSubPlan}}
	children, _ := node["Plans"].([]any)
	for _, c := range children {
		if child, ok := c.(map[string]any); ok {
			out = append(out, walkPlan(child, inSubPlan)...)
		}
	}
	return out
}

// RescansCTE reports whether the plan of sql reads the CTE named cte again
// for each row of something else: a scan of it under a correlated subplan.
// A statement that counts a batch's rows that way does work growing with
// the square of its batch.
func RescansCTE(ctx context.Context, q Querier, cte, sql string, args ...any) (bool, error) {
	nodes, err := Explain(ctx, q, sql, args...)
	if err != nil {
		return false, err
	}
	for _, n := range nodes {
		if n.InSubPlan && n.Fields["Node Type"] == "CTE Scan" && n.Fields["CTE Name"] == cte {
			return true, nil
		}
	}
	return false, nil
}

// Reads answers how the plan of a statement over one table reads it: the
// node type and index name ("Index Scan rate_counters_window_idx", "Tid
// Scan <nil>") of each node that scans relation or an index (a bitmap
// index scan names no relation), the statement's own ModifyTable left out.
// A test of a sweep says through it that a pass reads the rows due through
// an index and deletes them by the addresses it locked, never the table
// whole.
func Reads(nodes []PlanNode, relation string) []string {
	var reads []string
	for _, n := range nodes {
		if n.Fields["Node Type"] != "ModifyTable" && (n.Fields["Relation Name"] == relation ||
			n.Fields["Index Name"] != nil) {
			reads = append(reads, fmt.Sprint(n.Fields["Node Type"], " ", n.Fields["Index Name"]))
		}
	}
	return reads
}

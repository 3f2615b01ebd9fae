package testpg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// RescansCTE reports whether the plan of sql (with args; EXPLAIN only, it
// does not run it) reads the CTE named cte again for each row of something
// else: a scan of it under a correlated subplan. A statement that counts a
// batch's rows that way does work growing with the square of its batch
// (scale QA), which no small test database shows as slow.
func RescansCTE(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, cte, sql string, args ...any) (bool, error) {
	var plan []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := q.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
		return false, err
	}
	var walk func(node map[string]any, inSubPlan bool) bool
	walk = func(node map[string]any, inSubPlan bool) bool {
		inSubPlan = inSubPlan || node["Parent Relationship"] == "SubPlan"
		if inSubPlan && node["Node Type"] == "CTE Scan" && node["CTE Name"] == cte {
			return true
		}
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			if child, ok := c.(map[string]any); ok && walk(child, inSubPlan) {
				return true
			}
		}
		return false
	}
	for _, p := range plan {
		if walk(p.Plan, false) {
			return true, nil
		}
	}
	return false, nil
}

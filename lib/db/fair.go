package db

// Fair batches. The sweeper serves every workspace from one database in
// bounded batches. Ordered by due time alone, a batch is one workspace's
// whenever that workspace has a backlog older than the others' work (a
// crash that lapsed 100,000 leases, a flood of events): every other
// workspace waits pass after pass until it is worked off (multi-tenant QA).
// A fair batch takes turns among the workspaces instead, as FairPick
// builds it from the two fragments below it.

// WorkspacesWith is a FROM item (alias it) naming, once each and in id
// order, the workspaces that have a row of table matching cond (columns
// unqualified). It walks an index on (workspace_id, …) whose predicate is
// cond, one descent a workspace, so what it costs grows with the
// workspaces it names, not with their rows: a backlog of a million rows in
// one workspace costs a descent, as one row does.
func WorkspacesWith(table, cond string) string { return DistinctWith(table, "workspace_id", cond) }

// DistinctWith is a FROM item (alias it) naming, once each and in order,
// the values of column (its only column, of that name) in the rows of
// table matching cond (columns unqualified). It walks an index on
// (column, …) whose predicate is cond, one descent a value: what it costs
// grows with the values it names, not with their rows.
func DistinctWith(table, column, cond string) string {
	return `(WITH RECURSIVE ws AS (
    (SELECT ` + column + ` FROM ` + table + ` WHERE ` + cond + ` ORDER BY ` + column + ` LIMIT 1)
    UNION ALL
    SELECT (SELECT t.` + column + ` FROM ` + table + ` t WHERE (` + cond + `) AND t.` + column + ` > ws.` + column + `
            ORDER BY t.` + column + ` LIMIT 1)
    FROM ws WHERE ws.` + column + ` IS NOT NULL
) SELECT ` + column + ` FROM ws WHERE ` + column + ` IS NOT NULL)`
}

// Backlog is the rows of one table that a sweep works off, for FairPick.
// They are those matching Where, the predicate of an index of the table on
// (workspace_id, Order), and Also: each workspace's are read from that
// index, in Order.
type Backlog struct {
	Table string // with the columns id and workspace_id
	Where string // the index's predicate (columns unqualified)
	Also  string // a further condition on the rows, or ""
	Order string // the index's key after workspace_id, as ORDER BY takes it
	Due   string // the rows' due time, an expression that sorts as Order
}

// FairPick is a query of the ids of up to limit (an integer expression, as
// "$2::int") of b's rows, taking turns among their workspaces (RoundRobin):
// every workspace that has a row (WorkspacesWith), its first limit rows in
// Order.
//
// A workspace's rows are read up to a limit the planner cannot see (an
// InitPlan). Planned on its value (a custom plan, as the pool's unnamed
// statements are), LIMIT 500 over a workspace that the statistics guess
// has a few hundred rows (the table's rows over its workspaces) was read
// whole by a bitmap scan and sorted, and one workspace's backlog was read
// whole each pass (webhook fan-out QA: 300 ms against 48 ms for 100,000
// events; lapsed leases, lapsed jobs and unwinding groups were planned
// so too). Not seeing the limit, the planner plans to read a part of the
// rows, through the index in Order, as a generic plan does
// (testpg.CheckBacklog tests both).
func FairPick(b Backlog, limit string) string {
	cond := "(" + b.Where + ")"
	if b.Also != "" {
		cond += " AND (" + b.Also + ")"
	}
	return RoundRobin(`
        SELECT f.id, f.workspace_id, f.due
        FROM `+WorkspacesWith(b.Table, b.Where)+` w
        CROSS JOIN LATERAL (
            SELECT id, workspace_id, `+b.Due+` AS due FROM `+b.Table+`
            WHERE workspace_id = w.workspace_id AND `+cond+`
            ORDER BY `+b.Order+` LIMIT (SELECT `+limit+`)
        ) f`, limit)
}

// RoundRobin is a query of the ids of up to limit of rows (a query with
// the columns id, workspace_id and due), taking turns among their
// workspaces: every workspace's first row (the earliest due), then every
// workspace's second, and so on, each turn earliest due first. A workspace
// with fewer rows than its turns leaves its room to the others, so one
// workspace alone fills the batch. Rows should be bounded (a LIMIT per
// workspace, as FairPick's, or a set the statement reads whole anyway):
// every row of it is sorted. A statement that takes the
// rows it names reads them as id = ANY(ARRAY(…)), through the primary key:
// as id IN (…), the planner may hash them and scan the whole table for
// them (a fan-out of 500 events read 100,000).
func RoundRobin(rows, limit string) string {
	return `SELECT id FROM (
    SELECT r.id, r.due, row_number() OVER (PARTITION BY r.workspace_id ORDER BY r.due, r.id) AS turn FROM (` + rows + `) r
) rr ORDER BY rr.turn, rr.due, rr.id LIMIT ` + limit
}

package db

// Fair batches. The sweeper serves every workspace from one database in
// bounded batches. Ordered by due time alone, a batch is one workspace's
// whenever that workspace has a backlog older than the others' work (a
// crash that lapsed 100,000 leases, a flood of events): every other
// workspace waits pass after pass until it is worked off (multi-tenant QA).
// A fair batch takes turns among the workspaces instead, as these two
// fragments build it.

// WorkspacesWith is a FROM item (alias it) naming, once each and in id
// order, the workspaces that have a row of table matching cond (columns
// unqualified). It walks an index on (workspace_id, …) whose predicate is
// cond, one descent a workspace, so what it costs grows with the
// workspaces it names, not with their rows: a backlog of a million rows in
// one workspace costs a descent, as one row does.
func WorkspacesWith(table, cond string) string {
	return `(WITH RECURSIVE ws AS (
    (SELECT workspace_id FROM ` + table + ` WHERE ` + cond + ` ORDER BY workspace_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.workspace_id FROM ` + table + ` t WHERE (` + cond + `) AND t.workspace_id > ws.workspace_id
            ORDER BY t.workspace_id LIMIT 1)
    FROM ws WHERE ws.workspace_id IS NOT NULL
) SELECT workspace_id FROM ws WHERE workspace_id IS NOT NULL)`
}

// RoundRobin is a query of the ids of up to limit of rows (a query with
// the columns id, workspace_id and due), taking turns among their
// workspaces: every workspace's first row (the earliest due), then every
// workspace's second, and so on, each turn earliest due first. A workspace
// with fewer rows than its turns leaves its room to the others, so one
// workspace alone fills the batch. Rows should be bounded (a lateral
// LIMIT per workspace from WorkspacesWith, or a set the statement reads
// whole anyway): every row of it is sorted. A statement that takes the
// rows it names reads them as id = ANY(ARRAY(…)), through the primary key:
// as id IN (…), the planner may hash them and scan the whole table for
// them (a fan-out of 500 events read 100,000).
func RoundRobin(rows, limit string) string {
	return `SELECT id FROM (
    SELECT r.id, r.due, row_number() OVER (PARTITION BY r.workspace_id ORDER BY r.due, r.id) AS turn FROM (` + rows + `) r
) rr ORDER BY rr.turn, rr.due, rr.id LIMIT ` + limit
}

-- GET /api/v1/approvals without ?state= pages a workspace's approvals
-- newest first: with no index led by the workspace in id order, its plan
-- read the primary key backwards, every workspace's approvals, and kept
-- the workspace's (a workspace whose approvals are older than another's
-- read all of the other's for each page). Approvals are written twice
-- each (asked, decided): one index entry more each time. On a large table
-- build it first, concurrently (README, Upgrading).
CREATE INDEX IF NOT EXISTS approvals_workspace_idx ON approvals (workspace_id, id);

-- The sweeper's approvals.moot finds the workspaces with a pending
-- approval through this index, one descent each (db.WorkspacesWith): it
-- read every workspace and probed approvals_list_idx for each, on every
-- pass, whether or not it had any pending (5,000 idle workspaces: 10,000
-- buffers a pass). Pending approvals are few (an operator decides them, or
-- a resolution, a rollback or the sweeper closes them); an approval enters
-- it when asked and leaves it when decided. On a large table build it
-- first, concurrently (README, Upgrading).
CREATE INDEX IF NOT EXISTS approvals_pending_idx ON approvals (workspace_id, id) WHERE state = 'pending';

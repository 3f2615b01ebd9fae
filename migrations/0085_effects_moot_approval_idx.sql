-- The sweeper's approvals.moot reads the effects whose pending approval
-- may ask nothing any more through this index: those settled succeeded,
-- and those of a group (a rollback may keep them from ever running). It
-- found the workspaces with any pending approval (approvals_pending_idx)
-- and read every pending approval of each, with its effect, to find the
-- moot among them, on every pass: approvals waiting for an operator cost
-- the pass whether or not any was moot (scale QA: 20,000 pending in 100
-- workspaces, 100,000 buffers and 0.76 s a pass with none moot). An
-- effect enters it when its approval is asked and it is settled or
-- grouped, and leaves it when the approval is decided. On a large table
-- build it first, concurrently (README, Upgrading).
CREATE INDEX IF NOT EXISTS effects_moot_approval_idx ON effects (workspace_id, approval_id)
    WHERE approval_state = 'pending' AND (state = 'succeeded' OR group_id IS NOT NULL);

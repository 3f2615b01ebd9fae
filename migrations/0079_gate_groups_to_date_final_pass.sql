-- A lowered retention's final pass over the groups that ended while it was
-- written. A group's end (a commit, the end of a rollback) dates the group
-- by the policies its statement reads; one that read them before a policy
-- write lowering a retention committed, and itself committed after that
-- write's dating read the type's groups, was missed by the dating (it was
-- not ended yet in the dating's snapshot) and kept the longer date (review:
-- kept past the customer's lowered retention). The record of a type's
-- groups to date (0078) is no longer deleted once its groups are dated:
-- batched says they are, and the sweeper (groups.retention_lowered) makes a
-- last pass at final_at, once every end that could have read the older
-- policy has committed or rolled back, over the groups of the workspace
-- that ended from ended_from on (then its cursor, with after_id), dating
-- those of the type again, and then deletes the record; it reads the
-- groups that ended up to final_at only. The defaults are for the rows a
-- previous release writes during the deploy, and those written before: a
-- final pass due at once (at their insert, or this migration, for those
-- written before it) over every group of the workspace that ended by then,
-- as their write's time is not known.
ALTER TABLE gate_groups_to_date
    ADD COLUMN IF NOT EXISTS batched    boolean     NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS final_at   timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS ended_from timestamptz NOT NULL DEFAULT '-infinity';

-- The final pass reads a workspace's groups by when they ended. Built in
-- the migration's transaction, which blocks writes to effect_groups while
-- it builds (a group's creation, commit, unwind and settle wait; the table
-- is read whole): on a large table build it first with CREATE INDEX
-- CONCURRENTLY under the same name (README, "Upgrading"), and IF NOT EXISTS
-- then leaves it be. A group's end writes one entry more.
CREATE INDEX IF NOT EXISTS effect_groups_ended_ws_idx
    ON effect_groups (workspace_id, (coalesce(finished_at, committed_at)), id)
    WHERE state IN ('committed', 'unwound', 'unwind_failed');

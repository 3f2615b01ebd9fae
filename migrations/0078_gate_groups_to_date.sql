-- A lowered retention's ended groups still to date again: a policy write
-- that lowers a type's retention_days records the type here in its own
-- transaction, and the dating of the type's groups (in a transaction of its
-- own once the policy is committed) deletes it when done. Should that
-- dating fail (under an Idempotency-Key it is only logged: the answer is
-- kept already), the sweeper (groups.retention_lowered) dates the groups,
-- a bounded batch at a time from after_id on, and deletes the row once it
-- has reached the last (review: a lost dating was never done again). days
-- is the lowest retention recorded since. A new, empty table: quick.
CREATE TABLE IF NOT EXISTS gate_groups_to_date (
    workspace_id text NOT NULL REFERENCES workspaces(id),
    effect_type  text NOT NULL,
    days         int  NOT NULL,
    after_id     text NOT NULL DEFAULT '',
    PRIMARY KEY (workspace_id, effect_type)
);

-- A group whose rollback ended (unwound, unwind_failed) is kept, steps and
-- compensations together, until the longest retention_days among their
-- types has passed since the end, then deleted whole, as 0037 does for a
-- committed group (lib/gate sqlPurgeKeptGroups). Before, its steps went one
-- by one under their own types' retention while the group's row was kept
-- for ever: it then read "unwound" with steps missing, or none, and a
-- keyed create of its key answered it so. Retention now deletes no step of
-- a group on its own; an open or unwinding group keeps all of them.
--
-- The backfill and the index run inside this migration's transaction,
-- which blocks writes to effect_groups meanwhile; README "Upgrading" shows
-- how to build the index first, concurrently (IF NOT EXISTS then keeps it).
UPDATE effect_groups g
SET keep_until = coalesce(g.finished_at, g.updated_at) + make_interval(days => (
    SELECT coalesce(max(coalesce(p.retention_days, 90)), 90)
    FROM effects f
    LEFT JOIN gate_policies p ON p.workspace_id = f.workspace_id AND p.effect_type = f.effect_type
    WHERE f.group_id = g.id))
WHERE g.state IN ('unwound', 'unwind_failed');

-- Undated groups first, as effect_groups_due_idx (0037), which this
-- replaces: it held committed groups only.
CREATE INDEX IF NOT EXISTS effect_groups_kept_idx ON effect_groups ((coalesce(keep_until, '-infinity'::timestamptz)))
    WHERE state IN ('committed', 'unwound', 'unwind_failed');
DROP INDEX IF EXISTS effect_groups_due_idx;

-- A group whose rollback ended (unwound, unwind_failed) is kept, steps and
-- compensations together, until the longest retention_days among their
-- types has passed since the end, then deleted whole, as 0037 does for a
-- committed group (lib/gate sqlPurgeKeptGroups). Before, its steps went one
-- by one under their own types' retention while the group's row was kept
-- for ever: it then read "unwound" with steps missing, or none, and a
-- keyed create of its key answered it so. Retention now deletes no step of
-- a group on its own; an open or unwinding group keeps all of them.
--
-- The backfill and the indexes run inside this migration's transaction,
-- which blocks writes to effect_groups and effects (begins) meanwhile;
-- README "Upgrading" shows how to build the indexes first, concurrently
-- (IF NOT EXISTS then keeps them).
UPDATE effect_groups g
SET keep_until = coalesce(g.finished_at, g.updated_at) + make_interval(days => (
    SELECT coalesce(max(coalesce(p.retention_days, 90)), 90)
    FROM effects f
    LEFT JOIN gate_policies p ON p.workspace_id = f.workspace_id AND p.effect_type = f.effect_type
    WHERE f.group_id = g.id))
WHERE g.state IN ('unwound', 'unwind_failed');

-- Undated groups first, as effect_groups_due_idx (0037), which held
-- committed groups only. That one is kept for the previous release's
-- instances during the deploy (their passes read committed groups through
-- it; dropping it here would also lock the table for reads until this
-- migration commits): README "Upgrading" says when to drop it.
CREATE INDEX IF NOT EXISTS effect_groups_kept_idx ON effect_groups ((coalesce(keep_until, '-infinity'::timestamptz)))
    WHERE state IN ('committed', 'unwound', 'unwind_failed');

-- The per-type retention scan (lib/gate sqlPurgeExpired) reads ended,
-- ungrouped effects only: a group's go with it, and an effect not ended is
-- kept. Through effects_type_created_idx it walked past every grouped or
-- kept effect older than its type's retention on each pass, heap row and
-- group probe each (seconds a pass with a few hundred thousand of them,
-- review). A begin writes no entry here (its effect is leased, or awaits
-- an approval); a report writes one (its update of the indexed state is
-- never HOT, so every index took one already).
CREATE INDEX IF NOT EXISTS effects_ended_ungrouped_idx ON effects (workspace_id, effect_type, created_at)
    WHERE group_id IS NULL AND state IN ('succeeded', 'failed', 'denied');

-- A committed group can be unwound while its steps are kept, and no longer:
-- keep_until is when retention may delete it, then its steps (lib/gate
-- sqlPurgeCommittedGroups), set at commit to the commit time plus the
-- longest retention_days among its steps' types (90 without a policy).
-- Every step has succeeded by then and none changes after, so that is when
-- the last of them passes its own retention. Before, a committed group and
-- its steps were kept for ever: the effects table grew with every completed
-- saga. A pass reads only the groups due (effect_groups_due_idx) and
-- checks them against the policies of the day: a retention raised since
-- moves keep_until on instead, and a group committed without one (by an
-- instance of the previous release, during the deploy) gets it then.
--
-- The backfill and the index run inside this migration's transaction,
-- which blocks writes to effect_groups meanwhile; README "Upgrading" shows
-- how to build such an index first, concurrently (IF NOT EXISTS then keeps
-- it).
ALTER TABLE effect_groups ADD COLUMN IF NOT EXISTS keep_until timestamptz;

UPDATE effect_groups g
SET keep_until = g.committed_at + make_interval(days => (
    SELECT coalesce(max(coalesce(p.retention_days, 90)), 90)
    FROM effects f
    LEFT JOIN gate_policies p ON p.workspace_id = f.workspace_id AND p.effect_type = f.effect_type
    WHERE f.group_id = g.id))
WHERE g.state = 'committed' AND g.keep_until IS NULL;

-- Undated groups first (an instance of the previous release committed them
-- during the deploy): a plain index on keep_until puts NULLs last, and a
-- pass would sort every group due instead of reading the first (review).
CREATE INDEX IF NOT EXISTS effect_groups_due_idx ON effect_groups ((coalesce(keep_until, '-infinity'::timestamptz)))
    WHERE state = 'committed';

-- A group may be opened under an idempotency key (POST /api/v1/groups
-- idempotency_key), so that a client whose answer was lost opens it again
-- and gets the same group, not a second, orphaned one (QA), as a run may
-- be started (0029). The key is unique per workspace; the same key with
-- another name, or a group another key opened that the caller may not see,
-- is 409 idempotency_key_reuse (lib/gate CreateGroup).
--
-- The index is built inside this migration's transaction, which blocks
-- writes to effect_groups while it builds; README "Upgrading" shows how to
-- build such an index first, concurrently (IF NOT EXISTS then keeps it).
ALTER TABLE effect_groups ADD COLUMN IF NOT EXISTS idempotency_key text;
CREATE UNIQUE INDEX IF NOT EXISTS effect_groups_key_idx ON effect_groups (workspace_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

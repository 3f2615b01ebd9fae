-- Effect groups (API.md §2.6) and reconciliation (§2.7).
--
-- A group is one unit of work whose effects (rows of effects with group_id)
-- may be undone in reverse order of success. Every transition locks the
-- group row: begin takes it FOR SHARE to admit a step, commit / unwind /
-- settle take it FOR UPDATE, so a forward step can never slip into a group
-- after its rollback started.

CREATE TABLE effect_groups (
    id                text PRIMARY KEY,
    workspace_id      text NOT NULL REFERENCES workspaces(id),
    name              text NOT NULL,
    state             text NOT NULL CHECK (state IN ('open', 'committed', 'unwinding', 'unwound', 'unwind_failed')),
    created_by_key_id text NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    committed_at      timestamptz,
    unwind_started_at timestamptz,
    -- When the rollback ended (unwound or unwind_failed).
    finished_at       timestamptz,
    -- When the sweeper last checked an unwinding group, so its bounded pass
    -- visits every such group in turn instead of the same oldest ones.
    swept_at          timestamptz
);
CREATE INDEX effect_groups_workspace_idx ON effect_groups (workspace_id, id);
-- The sweeper's backstop scan for rollbacks that may have finished.
CREATE INDEX effect_groups_unwinding_idx ON effect_groups (swept_at NULLS FIRST) WHERE state = 'unwinding';

-- A group's steps, read by commit, unwind and GET.
CREATE INDEX effects_group_idx ON effects (group_id, id) WHERE group_id IS NOT NULL;
-- At most one compensating effect per step, whatever idempotency key it was
-- begun with: this is what stops a retried rollback from refunding twice.
CREATE UNIQUE INDEX effects_compensates_idx ON effects (compensates_effect_id) WHERE compensates_effect_id IS NOT NULL;
-- Reconciliation compares one effect type's effects created in [from, to),
-- served by effects_type_created_idx (0005).

-- The reconciliation calendar: when each effect type was last compared
-- against the vendor's records.
CREATE TABLE reconciliations (
    workspace_id       text NOT NULL REFERENCES workspaces(id),
    effect_type        text NOT NULL,
    last_reconciled_at timestamptz NOT NULL,
    last_from          timestamptz NOT NULL,
    last_to            timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, effect_type)
);
-- The reminder sweep reads only the types that asked for reminders.
CREATE INDEX gate_policies_reconcile_idx ON gate_policies (workspace_id, effect_type)
    WHERE reconcile_every_hours IS NOT NULL;

-- reconciliation.due skips a type reminded since its current period fell
-- due by reading when it was last reminded here, not by probing events for
-- a reminder recorded since: with reminders on and nobody reconciling,
-- most types are overdue and reminded, and each cost an index probe into
-- events every minute (scale QA: 1,000 workspaces of 100 such types, some
-- 800,000 buffers and 1.2 to 1.7 s a pass). A row per (workspace, effect
-- type) reminded at least once: last_reminded_at is when its latest
-- reminder was recorded (the reminder's created_at, its sweep's now),
-- last_due_at the due time of the period it was for. Only the statement
-- that records a reminder writes it (lib/gate sqlReconcileDue), in the same
-- statement: not gate_policies, whose rows policy writes version, nor
-- reconciliations, which reconciliations write.
CREATE TABLE IF NOT EXISTS reconciliation_reminders (
    workspace_id     text        NOT NULL REFERENCES workspaces(id),
    effect_type      text        NOT NULL,
    last_reminded_at timestamptz NOT NULL,
    last_due_at      timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, effect_type)
);

-- From the reminders recorded so far, so that no type is reminded twice
-- across the upgrade: event retention keeps each type's latest. Reads the
-- events table once.
INSERT INTO reconciliation_reminders (workspace_id, effect_type, last_reminded_at, last_due_at)
SELECT DISTINCT ON (workspace_id, subject_id) workspace_id, subject_id, created_at,
    coalesce((data->>'due_at')::timestamptz, created_at)
FROM events WHERE type = 'reconciliation.due'
ORDER BY workspace_id, subject_id, created_at DESC
ON CONFLICT (workspace_id, effect_type) DO NOTHING;

-- effects.retention checks a (workspace, effect type) once it may have an
-- effect due, not every pair on every batch: it visited each pair present
-- in effects with a loose index scan and probed each for effects due, batch
-- after batch (sweeper scalability QA: 35,000 pairs with nothing due read
-- 211,720 buffers a batch). check_at is the earliest time a pair may next
-- have an ungrouped effect due; only the sweeper writes it (a begin or a
-- report writes nothing here), and a policy write that lowers the type's
-- retention sets it to -infinity (lib/gate sqlPurgeExpired says why it is
-- safe). A pair with no ended, ungrouped effect has no row. New, empty
-- tables: quick.
CREATE TABLE IF NOT EXISTS gate_retention_checks (
    workspace_id text        NOT NULL REFERENCES workspaces(id),
    effect_type  text        NOT NULL,
    check_at     timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, effect_type)
);
CREATE INDEX IF NOT EXISTS gate_retention_checks_due_idx ON gate_retention_checks (check_at);

-- The sweeper finds the pairs the table does not know yet in rounds, a
-- bounded chunk of pairs a run from after_workspace_id/after_effect_type
-- on, a round an hour (next_at); round_from is the time the round began.
-- One row.
CREATE TABLE IF NOT EXISTS gate_retention_discovery (
    one                boolean     PRIMARY KEY DEFAULT true CHECK (one),
    after_workspace_id text        NOT NULL DEFAULT '',
    after_effect_type  text        NOT NULL DEFAULT '',
    round_from         timestamptz NOT NULL DEFAULT '-infinity',
    next_at            timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO gate_retention_discovery DEFAULT VALUES ON CONFLICT DO NOTHING;

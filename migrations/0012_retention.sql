-- Retention (the sweeper's effects.retention task) deletes an expired
-- effect's approvals with it, and the foreign key from approvals checks each
-- deleted effect: both look approvals up by effect, which no index served.
-- Approvals are rare writes, so the index costs little.
CREATE INDEX approvals_effect_idx ON approvals (effect_id);

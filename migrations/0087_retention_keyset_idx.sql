-- The retention purges of events and of runs walk their rows in creation
-- (events) or finishing (runs) order and keep some for good at its front:
-- the latest reconciliation.due of each effect type, a FAILED run with a
-- step that never ends. Each batch of a pass now starts after the last row
-- the batch before it looked at, (created_at, id) and (finished_at, id)
-- (lib/webhooks sqlPurgeDelivered, lib/jobs sqlRetiredRuns), so that the
-- rows kept are read once a pass, not once a batch (review: 50,000 events
-- kept, each batch of 1,000 read 102,000). These indexes are the old ones
-- (events_dispatched_idx, 0063; job_runs_finished_idx, 0017) with the id
-- after the time, so that the batch starts at its place in the index,
-- however many rows share the time (a reconciliation sweep writes its
-- reminders at one time).
--
-- Built inside the migration's transaction, which blocks writes to events
-- and job_runs while each builds; the drops at its end hold the tables
-- against reads too until the migration commits. On large tables build
-- them first with CREATE INDEX CONCURRENTLY under the same names (README,
-- "Upgrading"): IF NOT EXISTS then leaves them be.
CREATE INDEX IF NOT EXISTS events_purge_idx ON events (created_at, id) WHERE dispatched_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS job_runs_purge_idx ON job_runs (finished_at, id) WHERE status IN ('SUCCEEDED', 'FAILED');
DROP INDEX IF EXISTS events_dispatched_idx;
DROP INDEX IF EXISTS job_runs_finished_idx;

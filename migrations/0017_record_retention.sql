-- Retention of durable-job records and of the event outbox (the sweeper's
-- jobs.retention and events.retention tasks, JOB_RETENTION_DAYS and
-- EVENT_RETENTION_DAYS). Effects have had theirs since 0012; runs, their
-- steps' jobs, executions and replays, events and webhook deliveries were
-- kept for ever.
--
-- Migrations run in a transaction, so these indexes are built with writes
-- to their tables blocked meanwhile. On a large deployment build them first
-- with CREATE INDEX CONCURRENTLY under the same names (README, "Upgrading"):
-- IF NOT EXISTS then leaves them be.
--
-- Finished runs by finish time, for the purge's oldest-first scan.
CREATE INDEX IF NOT EXISTS job_runs_finished_idx ON job_runs (finished_at) WHERE status IN ('SUCCEEDED', 'FAILED');
-- Events by age, for the purge's oldest-first scan (events_undispatched_idx
-- covers only those not yet dispatched).
CREATE INDEX IF NOT EXISTS events_created_idx ON events (created_at);
-- Deliveries by event: the purge asks whether an event still has one
-- pending, and the foreign key from deliveries checks each deleted event;
-- the unique (webhook_id, event_id) index leads with the webhook.
CREATE INDEX IF NOT EXISTS webhook_deliveries_event_idx ON webhook_deliveries (event_id);
-- Listing a workspace's runs newest first (GET /api/v1/runs), and those in
-- one status (a FAILED run among many that succeeded).
CREATE INDEX IF NOT EXISTS job_runs_workspace_idx ON job_runs (workspace_id, id);
CREATE INDEX IF NOT EXISTS job_runs_workspace_status_idx ON job_runs (workspace_id, status, id);

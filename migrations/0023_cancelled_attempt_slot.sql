-- A RUNNING job that is cancelled keeps its endpoint's concurrency slot
-- until its attempt ends: its worker learns of the cancel at its next
-- heartbeat and may still be calling the service meanwhile, so freeing the
-- slot at the cancel let maxConcurrent + 1 calls run at once (seed 000:
-- "maximum concurrent leased jobs"). The slot is freed when the attempt is
-- reported, or when its lease expires (the sweeper, which also fails the
-- unreported execution with the lapse warning). A replay keeps it: the old
-- attempt may still be running.
--
-- slot_attempt is the cancelled attempt still holding the slot (NULL: none).
-- job_endpoints.running_count counts these beside the RUNNING jobs
-- (lib/jobs/sql.go, "Endpoint gate protocol"). Slots already freed by
-- earlier cancels stay freed.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS slot_attempt integer;

-- Few rows at any time: the sweeper reads them all, a recount one
-- endpoint's.
CREATE INDEX IF NOT EXISTS jobs_slot_idx ON jobs (endpoint_id) WHERE slot_attempt IS NOT NULL;

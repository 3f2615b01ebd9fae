-- A step replayed while its cancelled attempt may still run (jobs.slot_attempt
-- set, its lease, the job's lease_expires_at, not expired) is not claimed
-- until that attempt ends (0060). The replay made it due at once all the
-- same (ready_at, due_at = the replay's time), so such jobs sat at the head
-- of the claim index, in ready_at order, and every claim of their
-- name@version read each of them and passed over it until its lease
-- expired: after a mass cancel and replay of 20 000 running steps, every
-- claim read 20 000 rows more (2 000 more buffers) before the jobs it could
-- take, for as long as those leases ran (a timeout may be hours; replay QA).
--
-- From this release the replay makes such a job due at that lease's expiry
-- (the latest it waits: the claim then takes it at once, 0060), and the
-- attempt's report, which frees it, makes it due at the report's time, both
-- under the job's row lock (lib/jobs: replayDue, sqlAdjustSlots), so the
-- claim's scan ends before any waiting job. 0060's test in the claim stays,
-- as the guard. This moves the jobs replayed so before this release, which
-- the code does not revisit: due at their held attempts' lease expiry, which
-- the step's read shows as dueAt. A report of one of those attempts by the
-- previous release during the deploy frees it without making the job due:
-- that job then waits until the lease expiry, never beside its attempt.
UPDATE jobs SET due_at = lease_expires_at, ready_at = lease_expires_at
WHERE slot_attempt IS NOT NULL AND status = 'QUEUED' AND lease_expires_at > now()
  AND ready_at < lease_expires_at;

-- A job belongs to its run's workspace, and one composite foreign key now
-- says so: (run_id, workspace_id) must name a run of that workspace. It
-- replaces the two keys every enqueue checked separately, to job_runs(id)
-- and to workspaces(id): the run's own key to workspaces keeps the workspace
-- real, so integrity only grows (a job can no longer sit in another
-- workspace than its run, which jobs_enqueue already never wrote).
--
-- Why: the foreign-key check locks the referenced row FOR KEY SHARE. The
-- workspace row is shared by every enqueue of the workspace, so concurrent
-- enqueues kept turning its lock into ever-new multixacts; the run row is
-- the one jobs_enqueue has already locked FOR SHARE, so checking against it
-- costs no new lock. Measured: database CPU per enqueue lower in seven of
-- seven alternating runs of the enqueue figure, by 8 % in the median
-- (BENCHMARKS.md, session 4).
--
-- The new key is validated here, inside the migration's transaction: on a
-- large jobs table that scan holds off writes to jobs and job_runs until the
-- migration commits.
ALTER TABLE job_runs ADD CONSTRAINT job_runs_id_workspace_key UNIQUE (id, workspace_id);
ALTER TABLE jobs ADD CONSTRAINT jobs_run_workspace_fkey
    FOREIGN KEY (run_id, workspace_id) REFERENCES job_runs (id, workspace_id);
ALTER TABLE jobs DROP CONSTRAINT jobs_run_id_fkey;
ALTER TABLE jobs DROP CONSTRAINT jobs_workspace_id_fkey;

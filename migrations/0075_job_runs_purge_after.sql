-- A run whose retention purge failed (a statement timeout over a run of
-- many steps, which goes whole, or a row a trigger refuses to delete) is
-- not read by the purge again until its cut-off (the pass's time less the
-- retention) passes purge_after, so that the runs after it are purged
-- meanwhile (sweeper review: read first on every pass, it failed each
-- batch, and no later run was purged again). NULL: never failed.
-- Nullable, no default: quick, no rewrite.
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS purge_after timestamptz;

-- A run may be started under an idempotency key (POST /api/v1/runs
-- idempotencyKey), so that a client whose answer was lost can start it again
-- and get the same run, not a second one (Temporal's workflow id, Stripe's
-- Idempotency-Key; SDK QA: StartRun could not be retried safely). The key
-- is unique per workspace among the runs kept; request_hash is the
-- canonical hash of what the run was started with (name, budgetMicros),
-- and the same key with another is 409 idempotency_key_reuse.
--
-- The index is built inside this migration's transaction, which blocks
-- writes to job_runs while it builds; README "Upgrading" shows how to build
-- it first, concurrently, on a large table (IF NOT EXISTS then keeps it).
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS idempotency_key text,
    ADD COLUMN IF NOT EXISTS request_hash text;
CREATE UNIQUE INDEX IF NOT EXISTS job_runs_key_idx ON job_runs (workspace_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

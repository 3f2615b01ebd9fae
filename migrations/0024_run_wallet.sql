-- A run's own wallet (seed 003: "403 run_budget_exceeded — This run has
-- spent its own wallet. A new run gets a new wallet"). POST /api/v1/runs
-- may set budgetMicros; every begin naming the run (run_id) is then charged
-- to it: the costs of the run's effects that were granted and not known to
-- have failed (leased, succeeded, indeterminate) may not exceed it. The
-- budget is fixed when the run is created; NULL is no wallet, as before.
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS budget_micros bigint
    CHECK (budget_micros BETWEEN 0 AND 1000000000000000000);

-- A wallet's spend is summed over its run's effects (lib/gate, sqlRunSpend).
-- Built inside the migration's transaction; on a large table build it first
-- with CREATE INDEX CONCURRENTLY under the same name (README, "Upgrading").
CREATE INDEX IF NOT EXISTS effects_run_idx ON effects (run_id) WHERE run_id IS NOT NULL;

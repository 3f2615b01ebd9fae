-- A run's wallet lasts the run's whole life (seed 003: "A new run gets a new
-- wallet"), but what it had spent was summed over the run's effects, which
-- effect retention deletes (a type's retention_days) while the run goes on:
-- a run outliving its types' retention got its budget back (QA). The purge
-- now adds the spend it deletes to the run's retired_spend_micros
-- (lib/gate, sqlPurgeExpired), which the wallet's spend includes
-- (lib/money, RunSpendSQL). At most the budget, like the spend it keeps.
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS retired_spend_micros bigint NOT NULL DEFAULT 0;

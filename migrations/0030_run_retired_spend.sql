-- A run's wallet lasts the run's whole life (seed 003: "A new run gets a new
-- wallet"), but what it had spent was summed over the run's effects, which
-- effect retention deletes (a type's retention_days) while the run goes on:
-- a run outliving its types' retention got its budget back (QA). The purge
-- now records what it deletes of a wallet's spend here (lib/gate,
-- sqlPurgeExpired; lib/money, RetiredRunSpendSQL), and the wallet's spend
-- includes it (RunSpendSQL). Rows are only ever inserted, so overlapping
-- purges take no row locks on runs and cannot deadlock over them; they go
-- with their run.
CREATE TABLE IF NOT EXISTS run_retired_spend (
    run_id text NOT NULL REFERENCES job_runs (id) ON DELETE CASCADE,
    micros bigint NOT NULL CHECK (micros > 0)
);
CREATE INDEX IF NOT EXISTS run_retired_spend_run_idx ON run_retired_spend (run_id);

-- Endpoint rows are locked FOR NO KEY UPDATE, not FOR UPDATE (session 8's
-- review). An enqueue's insert checks its foreign key to the job's endpoint
-- with a KEY SHARE lock on that row while it holds its run's row FOR SHARE
-- (jobs_enqueue). A report that ends a step may now settle its run at once
-- (0019), locking the run's row while it holds endpoint rows: FOR UPDATE
-- conflicts with KEY SHARE, so the two deadlocked and one answered 500. The
-- same held for a report releasing the dependents an enqueue was naming,
-- and for the sweeper's lapse paths. FOR NO KEY UPDATE conflicts with
-- itself and with every UPDATE of the row, so claims, reports and sweeps
-- still order among themselves by it (endpoints in id order), but no
-- longer with the foreign-key check: the enqueue never waits for them.
--
-- jobs_claim takes its endpoints so since 0018; the Go statements
-- (lib/jobs/sql.go) change with this migration. jobs_report_apply below is
-- 0011's, verbatim but for that lock.

-- jobs_report_apply records a batch's decided reports in workspace $1 at
-- $2: parallel arrays $3…$16, one element per report (see sqlReportApply).
CREATE OR REPLACE FUNCTION jobs_report_apply(p_workspace_id text, p_now timestamptz, p_job_ids text[],
    p_attempts integer[], p_next text[], p_due timestamptz[], p_finished timestamptz[], p_output bytea[],
    p_preview text[], p_outcome text[], p_retryable boolean[], p_retry_after bigint[], p_error bytea[],
    p_update_job boolean[], p_warning text[], p_rejected boolean[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
BEGIN
WITH u AS (
    SELECT * FROM unnest($3::text[], $4::int[], $5::text[], $6::timestamptz[], $7::timestamptz[], $8::bytea[],
                         $9::text[], $10::text[], $11::bool[], $12::bigint[], $13::bytea[], $14::bool[], $15::text[],
                         $16::bool[])
        AS u(job_id, attempt, next, due, finished, output, preview, outcome, retryable, retry_after, err, update_job,
             warning, rejected)
), j AS (
    UPDATE jobs SET status = u.next, due_at = u.due, ready_at = u.due, finished_at = u.finished,
        output_sealed = u.output, output_preview = u.preview::jsonb, updated_at = $2::timestamptz
    FROM u WHERE jobs.id = u.job_id AND jobs.workspace_id = $1::text AND u.update_job
    RETURNING jobs.endpoint_id
), x AS (
    UPDATE job_executions x SET outcome = u.outcome, retryable = u.retryable, retry_after_ms = u.retry_after,
        error_sealed = u.err, reported_at = $2::timestamptz, ended_at = $2::timestamptz, result_status = u.next,
        next_due_at = u.due, warning = coalesce(u.warning, x.warning), output_rejected = u.rejected
    FROM u WHERE x.job_id = u.job_id AND x.attempt = u.attempt
), freed AS (
    SELECT endpoint_id, count(*)::int AS n FROM j GROUP BY endpoint_id
), gated AS (
    SELECT e.id FROM job_endpoints e
    WHERE e.id IN (SELECT endpoint_id FROM freed) AND e.max_concurrent IS NOT NULL
    ORDER BY e.id
    FOR NO KEY UPDATE
)
UPDATE job_endpoints e SET running_count = GREATEST(0, e.running_count - f.n)
FROM freed f JOIN gated g ON g.id = f.endpoint_id
WHERE e.id = f.endpoint_id;
END
$fn$;

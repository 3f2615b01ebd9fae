-- A report batch locks the rows of its endpoints that its later statements
-- update (a concurrency limit's count, a breaker's failures) in its first
-- statement, in id order, after the endpoints' gate locks (sqlReportLock).
-- It chose those rows in that statement too, with the statement's snapshot,
-- taken before the gate locks: a policy write that set a limit while the
-- report waited for a gate lock committed after that snapshot, so the row
-- was left unlocked, and the statement that frees the slots locked it after
-- the others, out of id order: a claim holding it and waiting for another
-- of the batch's rows deadlocked with the report (sixth review).
--
-- jobs_report_lock_endpoints chooses and locks the rows in a query of its
-- own, whose snapshot (READ COMMITTED, a VOLATILE function) is taken when it
-- runs: after the gate locks, so after every policy write that could change
-- the choice (a policy write holds the gate lock exclusively until it
-- commits, and waits for the report's shared one). New: the previous
-- release, during a deploy, keeps its own statement.

-- jobs_report_lock_endpoints locks, in id order, the rows of those of the
-- endpoints $1 that count failures or have a concurrency limit, and answers
-- each with whether it counts failures or its circuit is open (the report's
-- circuitHint).
CREATE FUNCTION jobs_report_lock_endpoints(p_endpoint_ids text[])
RETURNS TABLE (id text, hinted boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
SELECT e.id, e.circuit_failure_threshold IS NOT NULL OR e.circuit_state = 'open'
FROM job_endpoints e
WHERE e.id = ANY($1::text[])
  AND (e.circuit_failure_threshold IS NOT NULL OR e.circuit_state = 'open' OR e.max_concurrent IS NOT NULL)
ORDER BY e.id
FOR NO KEY UPDATE;
END
$fn$;

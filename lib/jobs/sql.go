package jobs

import (
	"strconv"

	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/money"
)

// Every statement of the package. Parameters are cast explicitly because the
// pool runs in QueryExecModeExec (types come from Go values, not from a
// server-side describe).
//
// Endpoint rows are locked FOR NO KEY UPDATE, never FOR UPDATE: that still
// orders claims, reports and sweeps among themselves (it conflicts with
// itself and with every UPDATE of the row), but not with the KEY SHARE lock
// an enqueue's foreign-key check takes on its job's endpoint. An enqueue
// holds its run's row when it inserts, and a report that ends a step may
// settle (lock) that run while it holds endpoint rows: with FOR UPDATE the
// two deadlocked (migration 0021).
//
// Endpoint gate protocol. job_endpoints.running_count counts an endpoint's
// RUNNING jobs, and its cancelled attempts that still hold their slot
// (jobs.slot_attempt: until reported or their lease expires, migration
// 0023), only while max_concurrent is set, so that reports to an unlimited
// endpoint never write (and queue on) its row:
//   - a claim locks its endpoints' rows and increments the count when a limit
//     is set (it reads the locked rows at their latest version);
//   - a transaction moving a job out of RUNNING, or freeing a cancelled
//     attempt's slot, first takes a shared transaction-scoped advisory lock
//     on the endpoint (in sqlReportLock, sqlCancelLock, sqlLapsedGates,
//     sqlRequeueGates or sqlHeldSlotGates), then, in a later statement,
//     decrements the count if a limit is set;
//   - a policy write takes that advisory lock exclusively, so it waits for
//     those transactions, and then recounts (sqlRecountRunning) whenever a
//     limit is set.
// A count can therefore never miss a transition that raced with a limit
// being set.

const endpointColumns = `id, name, version, preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms,
	jitter_percent, default_timeout_ms, max_concurrent, rate_limit_per_minute, paused, circuit_state,
	circuit_opened_at, created_at, updated_at, circuit_failure_threshold, circuit_cooldown_ms, circuit_failures,
	circuit_probe_at`

const sqlInsertEndpoint = `
INSERT INTO job_endpoints (id, workspace_id, name, preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms,
                           jitter_percent, default_timeout_ms, max_concurrent, rate_limit_per_minute, created_at, updated_at,
                           circuit_failure_threshold, circuit_cooldown_ms)
VALUES ($1::text, $2::text, $3::text, $4::text, $5::int, $6::bigint, $7::float8, $8::bigint, $9::float8, $10::bigint,
        $11::int, $12::int, $13::timestamptz, $13::timestamptz, $14::int, $15::bigint)
ON CONFLICT (workspace_id, name) DO NOTHING
RETURNING ` + endpointColumns

const sqlEndpointByName = `SELECT ` + endpointColumns + ` FROM job_endpoints WHERE workspace_id = $1::text AND name = $2::text`

const sqlEndpointByID = `SELECT ` + endpointColumns + ` FROM job_endpoints WHERE workspace_id = $1::text AND id = $2::text`

const sqlListEndpoints = `SELECT ` + endpointColumns + ` FROM job_endpoints
WHERE workspace_id = $1::text AND id > $2::text ORDER BY id LIMIT $3::int`

// sqlUpdatePolicy is an optimistic write: it changes nothing unless the
// version is still the expected one ($13). Turning the breaker off ($14
// NULL) closes its circuit and forgets its count.
const sqlUpdatePolicy = `
UPDATE job_endpoints SET preset = $3::text, max_attempts = $4::int, initial_delay_ms = $5::bigint,
    multiplier = $6::float8, max_delay_ms = $7::bigint, jitter_percent = $8::float8, default_timeout_ms = $9::bigint,
    max_concurrent = $10::int, rate_limit_per_minute = $11::int, updated_at = $12::timestamptz, version = version + 1,
    circuit_failure_threshold = $14::int, circuit_cooldown_ms = $15::bigint,
    circuit_state = CASE WHEN $14::int IS NULL THEN 'closed' ELSE circuit_state END,
    circuit_opened_at = CASE WHEN $14::int IS NULL THEN NULL ELSE circuit_opened_at END,
    circuit_probe_at = CASE WHEN $14::int IS NULL THEN NULL ELSE circuit_probe_at END,
    circuit_failures = CASE WHEN $14::int IS NULL THEN 0 ELSE circuit_failures END
WHERE id = $1::text AND workspace_id = $2::text AND version = $13::bigint
RETURNING ` + endpointColumns

const sqlSetPaused = `
UPDATE job_endpoints SET paused = $3::bool, updated_at = $4::timestamptz
WHERE workspace_id = $1::text AND id = $2::text
RETURNING ` + endpointColumns

// sqlLockCircuit locks an endpoint's row for CloseCircuit and reads its
// circuit as it was.
const sqlLockCircuit = `
SELECT circuit_state, circuit_opened_at FROM job_endpoints WHERE workspace_id = $1::text AND id = $2::text
FOR NO KEY UPDATE`

// sqlCloseCircuit closes the endpoint's breaker and forgets its count;
// closing a closed breaker with no failures counted changes nothing (not
// even updated_at), so a repeat is a plain read.
const sqlCloseCircuit = `
UPDATE job_endpoints SET circuit_state = 'closed', circuit_opened_at = NULL, circuit_probe_at = NULL,
    circuit_failures = 0,
    updated_at = CASE WHEN circuit_state = 'closed' AND circuit_failures = 0 THEN updated_at ELSE $3::timestamptz END
WHERE workspace_id = $1::text AND id = $2::text
RETURNING ` + endpointColumns

// sqlCircuitRecord counts a report batch's outcomes on the endpoints whose
// breaker is on (parallel arrays: $1 endpoint, $2 whether a success came,
// $3 the retryable failures after the last one) at $5, and answers each
// endpoint it counted on. Under the endpoint's row lock:
//   - the count restarts from $3 after a success, else grows by it;
//   - an open circuit stays open without a success, and a failure restarts
//     its cooldown (a probe failed); a success closes it;
//   - a closed circuit opens once the count reaches the threshold.
//
// It locks, in id order, these endpoints and those with a concurrency limit
// among the endpoints of the jobs whose slots the report may change ($4),
// the rows the report's later statements update: see recordCircuits.
const sqlCircuitRecord = `
WITH t AS (
    SELECT * FROM unnest($1::text[], $2::bool[], $3::int[]) AS t(endpoint_id, succeeded, failures)
), locked AS (
    SELECT e.id, e.name, e.circuit_state, e.circuit_failures, e.circuit_failure_threshold, e.circuit_opened_at,
           e.circuit_probe_at
    FROM job_endpoints e
    WHERE e.id IN (SELECT endpoint_id FROM t)
       OR (e.max_concurrent IS NOT NULL AND e.id IN (SELECT endpoint_id FROM jobs WHERE id = ANY($4::text[])))
    ORDER BY e.id
    FOR NO KEY UPDATE
), calc AS (
    SELECT l.*, l.circuit_state = 'open' AS was_open, t.succeeded, t.failures,
           CASE WHEN t.succeeded THEN t.failures ELSE l.circuit_failures + t.failures END AS n
    FROM locked l JOIN t ON t.endpoint_id = l.id
    WHERE l.circuit_failure_threshold IS NOT NULL OR l.circuit_state = 'open'
), next AS (
    SELECT c.*, c.circuit_failure_threshold IS NOT NULL
                AND ((c.was_open AND NOT c.succeeded) OR c.n >= c.circuit_failure_threshold) AS open_now
    FROM calc c
), up AS (
    UPDATE job_endpoints e SET circuit_failures = n.n,
        circuit_state = CASE WHEN n.open_now THEN 'open' ELSE 'closed' END,
        circuit_opened_at = CASE WHEN NOT n.open_now THEN NULL
                                 WHEN n.was_open AND NOT n.succeeded THEN e.circuit_opened_at
                                 ELSE $5::timestamptz END,
        circuit_probe_at = CASE WHEN NOT n.open_now THEN NULL
                                WHEN n.was_open AND NOT n.succeeded AND n.failures = 0 THEN e.circuit_probe_at
                                ELSE $5::timestamptz + e.circuit_cooldown_ms * interval '1 millisecond' END,
        updated_at = CASE WHEN n.open_now = n.was_open AND NOT (n.was_open AND n.succeeded) THEN e.updated_at
                          ELSE $5::timestamptz END
    FROM next n
    WHERE e.id = n.id AND (n.n <> n.circuit_failures OR n.open_now OR n.was_open)
    RETURNING e.id, n.name, n.was_open, n.succeeded, n.open_now, n.circuit_opened_at, e.circuit_probe_at,
              e.circuit_failures
)
SELECT * FROM up`

// sqlInsertRun starts a run.
const sqlInsertRun = `
INSERT INTO job_runs (id, workspace_id, name, status, created_at, budget_micros, keyed_step_keys)
VALUES ($1::text, $2::text, $3::text, 'RUNNING', $4::timestamptz, $5::bigint, true)`

// sqlInsertKeyedRun starts a run under idempotency key $6 (with the
// request's hash $7), unless the key already names a run (no row affected:
// sqlRunByKey reads it). A concurrent start under the same key waits here
// for the other to commit or roll back. Only keyed starts name the key's
// index, so a start without a key never depends on it.
const sqlInsertKeyedRun = `
INSERT INTO job_runs (id, workspace_id, name, status, created_at, budget_micros, idempotency_key, request_hash,
                      keyed_step_keys)
VALUES ($1::text, $2::text, $3::text, 'RUNNING', $4::timestamptz, $5::bigint, $6::text, $7::text, true)
ON CONFLICT (workspace_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING`

// sqlRunByKey is the run workspace $1 started under idempotency key $2,
// with what it was started with.
const sqlRunByKey = `SELECT id, request_hash FROM job_runs WHERE workspace_id = $1::text AND idempotency_key = $2::text`

// runColumns are a run's (of job_runs) in scanRun order; a wallet's spend
// is read with it.
var runColumns = `id, name, status, completion_requested, created_at, finished_at, synthetic, budget_micros,
	idempotency_key, CASE WHEN budget_micros IS NOT NULL THEN ` + money.RunSpendSQL("job_runs.workspace_id", "job_runs.id") + ` END`

var sqlGetRun = `SELECT ` + runColumns + ` FROM job_runs WHERE id = $1::text AND workspace_id = $2::text`

// currentAttempt is true of a job (alias j) whose current attempt's
// execution (alias x) meets cond.
func currentAttempt(cond string) string {
	return `EXISTS (SELECT 1 FROM job_executions x
    WHERE x.job_id = j.id AND x.attempt = j.attempt AND ` + cond + `)`
}

// openAttempt is true of a job (alias j) whose current attempt's execution
// (alias x) has no outcome yet and meets cond: neither reported nor failed
// by the sweeper as lapsed.
func openAttempt(cond string) string { return currentAttempt("x.outcome IS NULL AND " + cond) }

// heldLease is a job's (alias j) lease while an attempt holds it: running,
// or cancelled (the job replayed since, or not) and not yet reported; NULL
// otherwise, though the column keeps the last lease after it ended.
var heldLease = `CASE WHEN j.status = 'RUNNING' OR ` + openAttempt("true") + ` THEN j.lease_expires_at END`

// pendingDue is a job's (alias j) due time while one is pending: NULL while
// RUNNING, though the column keeps the due time it was claimed at (a claim
// leaves it; a lapsed attempt reclaimed at once keeps the earlier one), so
// a running step read as due in the past (QA). Every other status without
// a pending due time has it NULL already.
const pendingDue = `CASE WHEN j.status <> 'RUNNING' THEN j.due_at END`

var stepColumns = `j.step_id, j.id, j.name, j.version, e.name, j.status, j.idempotency_key, j.after_step_id,
	j.after_status, j.contract_version, j.attempt, j.max_attempts, ` + pendingDue + `, ` + heldLease + `, j.cancel_requested,
	j.policy_preset, j.initial_delay_ms, j.multiplier, j.max_delay_ms, j.jitter_percent, j.timeout_ms,
	j.policy_version, j.input_preview, j.output_preview, j.created_at, j.finished_at, j.run_id,
	coalesce(j.policy_max_attempts, j.max_attempts), ` + replaysJSON

// replayObject is a replay audit row (alias r) as a Replay's JSON.
const replayObject = `jsonb_build_object(
	'id', r.id, 'keyId', r.key_id, 'reason', r.reason, 'priorStatus', r.prior_status,
	'priorAttempt', r.prior_attempt, 'additionalAttempts', r.additional_attempts, 'maxAttempts', r.max_attempts,
	'oldHandlerVersion', r.old_handler_version, 'newHandlerVersion', r.new_handler_version,
	'oldContractVersion', r.old_contract_version, 'newContractVersion', r.new_contract_version,
	'createdAt', r.created_at)`

// replaysJSON aggregates a job's (alias j) last StepReplaysShown+1 replays,
// oldest first (job_replays_job_idx, read backwards), in the step's own
// row: read beside it, not in a round trip of its own. The one more says
// there are earlier ones (scanStep drops it: ReplaysTruncated).
var replaysJSON = `(SELECT coalesce(jsonb_agg(` + replayObject + ` ORDER BY r.created_at, r.id), '[]')
  FROM (SELECT * FROM job_replays r WHERE r.job_id = j.id ORDER BY r.created_at DESC, r.id DESC
        LIMIT ` + strconv.Itoa(StepReplaysShown+1) + `) r)`

// sqlStepReplaysPage pages step $1's replays (workspace $2) oldest first:
// after replay $3 (” for the first page), $4 at most.
var sqlStepReplaysPage = `SELECT ` + replayObject + ` FROM jobs j JOIN job_replays r ON r.job_id = j.id
WHERE j.step_id = $1::text AND j.workspace_id = $2::text
  AND ($3::text = '' OR (r.created_at, r.id) > (SELECT c.created_at, c.id FROM job_replays c
       WHERE c.id = $3::text AND c.job_id = j.id))
ORDER BY r.created_at, r.id LIMIT $4::int`

// sqlStepAttemptsPage pages step $1's executions (workspace $2) in attempt
// order: after attempt $3 (0 for the first page), $4 at most.
const sqlStepAttemptsPage = `SELECT ` + attemptColumns + ` FROM jobs j JOIN job_executions x ON x.job_id = j.id
WHERE j.step_id = $1::text AND j.workspace_id = $2::text AND x.attempt > $3::int
ORDER BY x.attempt LIMIT $4::int`

// sqlStepReplayCursor says whether step $1 is workspace $2's, and whether
// $3 is a replay of it (true for an empty $3, the first page's cursor).
const sqlStepReplayCursor = `SELECT EXISTS (SELECT 1 FROM jobs WHERE step_id = $1::text AND workspace_id = $2::text),
    $3::text = '' OR EXISTS (SELECT 1 FROM jobs j JOIN job_replays r ON r.job_id = j.id
        WHERE j.step_id = $1::text AND j.workspace_id = $2::text AND r.id = $3::text)`

var sqlStepByID = `SELECT ` + stepColumns + ` FROM jobs j JOIN job_endpoints e ON e.id = j.endpoint_id
WHERE j.step_id = $1::text AND j.workspace_id = $2::text`

const attemptColumns = `x.job_id, x.attempt, x.worker_id, x.outcome, x.warning, x.retryable, x.retry_after_ms,
	x.started_at, x.lease_expires_at, x.reported_at, x.error_sealed`

// sqlListRuns is the statement db.NewestFirst pages a workspace's runs
// with ($1 the workspace; a status, as column status): one range of
// job_runs_workspace_idx, or of job_runs_workspace_status_idx with a
// status.
var sqlListRuns = `SELECT ` + runColumns + ` FROM job_runs WHERE workspace_id = $1::text`

// sqlRunStepsPage pages a run's steps in id order (jobs_run_idx): $2 the
// previous page's last step id (” for the first), $3 a status (” for
// any), $4 the limit.
var sqlRunStepsPage = `SELECT ` + stepColumns + ` FROM jobs j JOIN job_endpoints e ON e.id = j.endpoint_id
WHERE j.run_id = $1::text AND j.step_id > $2::text AND ($3::text = '' OR j.status = $3::text)
ORDER BY j.step_id LIMIT $4::int`

// sqlJobsAttempts reads the last $2 executions of each of the jobs $1
// (the primary key, read backwards from each job's last), in attempt order.
const sqlJobsAttempts = `SELECT ` + attemptColumns + ` FROM unnest($1::text[]) AS q(job_id)
CROSS JOIN LATERAL (SELECT * FROM job_executions x WHERE x.job_id = q.job_id ORDER BY x.attempt DESC
  LIMIT $2::int) x
ORDER BY x.job_id, x.attempt`

// sqlEndpointAttempts pages endpoint $2's executions in workspace $1 newest
// first, each with its job (job_executions_endpoint_idx, one range of it):
// after the previous page's last ($3 started, $4 job, $5 attempt; $3 null
// for the first page), only those of outcome $6 (” for any), $7 at most.
// The first page's bound is infinity rather than no bound, so that a
// generic plan still starts the index range at the cursor.
//
// Each attempt's version is the handler version it was claimed for
// (migration 0058); an execution from before that reads its job's.
const sqlEndpointAttempts = `SELECT ` + attemptColumns + `, j.step_id, j.run_id, j.name, coalesce(x.version, j.version)
FROM job_executions x JOIN jobs j ON j.id = x.job_id
WHERE x.endpoint_id = $2::text AND x.workspace_id = $1::text
  AND (x.started_at, x.job_id, x.attempt) < (coalesce($3::timestamptz, 'infinity'), $4::text, $5::int)
  AND ($6::text = '' OR x.outcome = $6::text)
ORDER BY x.started_at DESC, x.job_id DESC, x.attempt DESC LIMIT $7::int`

// sqlEndpointExists says whether endpoint $2 is workspace $1's.
const sqlEndpointExists = `SELECT EXISTS (SELECT 1 FROM job_endpoints WHERE workspace_id = $1::text AND id = $2::text)`

// sqlEnqueue is an enqueue in one call of jobs_enqueue (migration 0009,
// the only copy of its SQL, which documents its locks and answers): the
// dependency, the run's shared lock and the key lookup, the contract
// selection, the endpoint and the insert.
//
//	$1 workspace  $2 run  $3 idempotency key  $4 request hash  $5 tool name
//	$6 handler version  $7 endpoint name  $8 afterStepId  $9 afterStatus
//	$10 contract version (the explicit one, or the one checked)  $11 whether
//	the caller checked it  $12 maxAttempts override  $13 timeoutMs override
//	$14 new job id  $15 new step id  $16 sealed input  $17 input preview
//	$18 now  $19 not before (a delayed step's due time; NULL: due now,
//	migration 0027)  $20 and $21 a generated key's keyed form and its
//	request hash (NULL for a key the producer named; migration 0031: $3 and
//	$4 are then the plain form, which runs from before 0031 keep)  $22 the
//	calling key (NULL for the service's own calls; migration 0044)
//
// It answers outcome, step_id, job_id, status, due_at, request_hash,
// contract_version and key_taken (the key the step has or gets). Outcome
// 'revoked' says the calling key was revoked once the revocation committed,
// whatever this instance's key cache holds; the call then changed nothing.
const sqlEnqueue = `SELECT * FROM jobs_enqueue($1::text, $2::text, $3::text, $4::bytea, $5::text, $6::text,
    $7::text, $8::text, $9::text, $10::int, $11::bool, $12::int, $13::bigint, $14::text, $15::text, $16::bytea,
    $17::jsonb, $18::timestamptz, $19::timestamptz, $20::text, $21::bytea, $22::text)`

// Run completion uses two transaction-scoped advisory locks per run. Finish
// takes the run key exclusively; every transaction that ends a step holds it
// shared (so finish waits for in-flight endings, and its own check then sees
// them). A transaction that checks completion after finish was requested
// first takes the run's settle key exclusively, so concurrent last steps are
// checked one after the other, each seeing the other's commit.
//
// The lock order, in every transaction that takes more than one of these:
// the row of the step it ends, cancels or replays (and, by the gate
// protocol, its endpoint before it), then the run key (shared or
// exclusive), then the rows of that step's dependents (released, skipped
// or put back by unskip), then the settle key, then the run's row. A
// report, a cancel, a lapse, the stranded-dependents backstop and a
// replay all take the run key before the dependents' rows: the backstop
// took the rows first and the run key after them, while a replay held the
// run key exclusively and went for the rows (sweeper review: a deadlock
// whose victim might be the replay).
const (
	sqlRunLockExclusive = `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`
	sqlRunLockShared    = `SELECT pg_advisory_xact_lock_shared(hashtextextended($1::text, 0))`
	// sqlRunOfWorkspaceLockExclusive takes run $1's key exclusively only
	// if the run is workspace $2's, in one statement (no row otherwise):
	// another tenant naming the run's id neither waits behind the run's
	// transactions nor holds its key for as long as its own transaction
	// lasts (review: a finish sent with another workspace's run id locked
	// that run before the workspace was checked). It reads the run's row
	// without locking it, so the lock order above is unchanged.
	sqlRunOfWorkspaceLockExclusive = `SELECT pg_advisory_xact_lock(hashtextextended(id, 0))::text
FROM job_runs WHERE id = $1::text AND workspace_id = $2::text`
	sqlRunSettleExclusive = `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 1))`
	// sqlStepRunLockShared takes the shared run key of step $1's run, and
	// answers that run; no row when the step is gone.
	sqlStepRunLockShared = `SELECT run_id, pg_advisory_xact_lock_shared(hashtextextended(run_id, 0))::text
FROM jobs WHERE step_id = $1::text`
)

const sqlRequestCompletion = `
UPDATE job_runs SET completion_requested = true WHERE id = $1::text AND workspace_id = $2::text RETURNING id`

// sqlSettleRun finishes a run: FAILED as soon as a step is EXHAUSTED or
// CANCELLED, whether or not its completion was requested (migration 0019);
// SUCCEEDED once its completion was requested and every step ended well
// (SKIPPED counts as well). It records run.finished once (data: the status
// and whether the run is synthetic, a tool test's), and answers
// whether it finished the run (1) or found it finished or undecided (0).
const sqlSettleRun = `
WITH r AS (
    UPDATE job_runs r SET
        status = CASE WHEN EXISTS (SELECT 1 FROM jobs WHERE run_id = r.id AND status IN ('EXHAUSTED', 'CANCELLED'))
                      THEN 'FAILED' ELSE 'SUCCEEDED' END,
        finished_at = $2::timestamptz
    WHERE r.id = $1::text AND r.status = 'RUNNING' AND ` + runDecided + `
    RETURNING r.id, r.workspace_id, r.status, r.reopened, r.synthetic
), evt AS (
    INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
    SELECT $3::text, workspace_id, 'run.finished', id, jsonb_build_object('status', status, 'synthetic', synthetic),
           $2::timestamptz,
           -- A run reopened by a replay finishes again: one event per finish.
           CASE WHEN reopened = 0 THEN '' ELSE 'reopened:' || reopened END FROM r
    ON CONFLICT DO NOTHING
)
SELECT count(*)::int FROM r`

// runDecided says whether the steps of run r decide it (see sqlSettleRun).
const runDecided = `(EXISTS (SELECT 1 FROM jobs WHERE run_id = r.id AND status IN ('EXHAUSTED', 'CANCELLED'))
           OR (r.completion_requested
               AND NOT EXISTS (SELECT 1 FROM jobs WHERE run_id = r.id AND status NOT IN ('SUCCEEDED', 'SKIPPED'))))`

// sqlRunsToSettle finds, for the sweeper's backstop, up to $1 runs whose
// completion was requested and that their steps decide: only those, so that
// runs still waiting for their steps neither fill every pass nor hide newer
// ones; taking turns among their workspaces (db.RoundRobin), each one's
// oldest first, so that one workspace's many runs to settle hold no other's
// back for passes (multi-tenant QA: in id order alone, they did). It reads
// every run whose completion was requested, as it did whenever fewer than
// $1 were decided (job_runs_finishing_idx).
var sqlRunsToSettle = db.RoundRobin(`
    SELECT r.id, r.workspace_id, r.id AS due FROM job_runs r
    WHERE r.status = 'RUNNING' AND r.completion_requested AND `+runDecided, "$1::int")

// sqlReleaseDependents moves WAITING steps whose dependency ($1) has ended:
// QUEUED when it ended the requested way, SKIPPED otherwise, and with a
// skipped step every WAITING step below it, however deep the chain (a
// skip decides its dependents at once: SKIPPED is neither a success nor an
// exhaustion). One statement for the whole cascade, so a report decides a
// chain of any depth inline (API.md §5); it used to take one statement per
// level and leave levels beyond 32 to the sweeper.
const sqlReleaseDependents = `
WITH RECURSIVE decided AS (
    SELECT j.id, j.step_id,
           CASE WHEN (j.after_status = 'SUCCEEDED' AND d.status = 'SUCCEEDED')
                  OR (j.after_status = 'FAILED' AND d.status = 'EXHAUSTED') THEN 'QUEUED' ELSE 'SKIPPED' END AS next
    FROM jobs j JOIN jobs d ON d.step_id = j.after_step_id
    WHERE j.status = 'WAITING' AND j.after_step_id = ANY($1::text[])
      AND d.status IN ('SUCCEEDED', 'EXHAUSTED', 'CANCELLED', 'SKIPPED')
    UNION ALL
    SELECT w.id, w.step_id, 'SKIPPED'
    FROM decided s JOIN jobs w ON w.after_step_id = s.step_id
    WHERE s.next = 'SKIPPED' AND w.status = 'WAITING'
)
UPDATE jobs j SET status = x.next,
    due_at = CASE WHEN x.next = 'QUEUED' THEN $2::timestamptz END,
    ready_at = CASE WHEN x.next = 'QUEUED' THEN $2::timestamptz END,
    finished_at = CASE WHEN x.next = 'SKIPPED' THEN $2::timestamptz END,
    updated_at = $2::timestamptz
FROM decided x
WHERE j.id = x.id AND j.status = 'WAITING'
RETURNING j.step_id, j.run_id, j.workspace_id, j.status, j.name, j.version`

// sqlStrandedDependents finds up to $1 ended steps that WAITING steps still
// depend on (the sweeper's backstop for a release no request made), taking
// turns among their workspaces (db.RoundRobin), each one's longest ended
// first, so that one workspace's stranded chains hold no other's back for
// passes (multi-tenant QA). It reads every WAITING step with its
// dependency, as it did whenever fewer than $1 were stranded
// (jobs_waiting_idx).
var sqlStrandedDependents = db.RoundRobin(`
    SELECT DISTINCT w.after_step_id AS id, d.workspace_id, coalesce(d.finished_at, d.updated_at) AS due
    FROM jobs w JOIN jobs d ON d.step_id = w.after_step_id
    WHERE w.status = 'WAITING' AND d.status IN ('SUCCEEDED', 'EXHAUSTED', 'CANCELLED', 'SKIPPED')`, "$1::int")

// sqlInsertEvents records events at $6 ($1 ids, $2 workspaces, $3 types,
// $4 subjects, $5 data, $7 dedupe keys). An event naming a run in $8 (a
// step.exhausted: event.syntheticRun) has its data's synthetic, written
// false, read true when that run is synthetic (a tool test's, set at its
// insert and never changed): read here, not by a statement of its own
// before (one round trip less a release of exhausted steps). jsonb keeps
// one value a key, in its own order, so the data is the same either way.
// An event naming no run (an empty string) joins on NULL: no index probe.
const sqlInsertEvents = `
INSERT INTO events (id, workspace_id, type, subject_id, data, created_at, dedupe_key)
SELECT u.id, u.ws, u.type, u.subject,
    CASE WHEN r.synthetic THEN u.data::jsonb || '{"synthetic": true}'::jsonb ELSE u.data::jsonb END,
    $6::timestamptz, u.dedupe
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $7::text[], $8::text[])
    AS u(id, ws, type, subject, data, dedupe, run)
LEFT JOIN job_runs r ON r.id = NULLIF(u.run, '')
ON CONFLICT DO NOTHING`

// failLapsed follows a CTE upd of jobs whose attempt's lease lapsed (id,
// attempt, endpoint_id), which a lapse just moved out of RUNNING or whose
// cancelled attempt held a slot: it fails those executions, unless
// reported, with the warning (parameter warning) at now, and frees their
// endpoints' concurrency slots.
// The endpoints are locked in id order first, the order claims and
// recorded reports take them in (jobs_claim, jobs_report_apply): locked as
// the update met them, a sweep over two endpoints could deadlock with them.
// The sweep's statement before (lapseGates) has locked them already, and
// the jobs are those of its endpoints: this lock takes them at once.
func failLapsed(now, warning string) string {
	return `), x AS (
    UPDATE job_executions x SET outcome = 'FAILED', warning = ` + warning + `::text, ended_at = ` + now + `::timestamptz
    FROM upd WHERE x.job_id = upd.id AND x.attempt = upd.attempt AND x.outcome IS NULL
), gated AS (
    SELECT e.id FROM job_endpoints e
    WHERE e.id IN (SELECT endpoint_id FROM upd) AND e.max_concurrent IS NOT NULL
    ORDER BY e.id
    FOR NO KEY UPDATE
), e AS (
    UPDATE job_endpoints e SET running_count = GREATEST(0, e.running_count - c.n)
    FROM (SELECT endpoint_id, count(*)::int AS n FROM upd GROUP BY endpoint_id) c
    WHERE e.id = c.endpoint_id AND e.id IN (SELECT id FROM gated)
)`
}

// sweptJobs ends a statement that frees slots (after failLapsed): it
// answers how many jobs it changed and, in parallel arrays, each one's
// workspace, tool name and handler version, and whether its endpoint has a
// limit (its slot was freed), for the wakes after its commit (sweptWakes).
const sweptJobs = `
SELECT count(*)::int, coalesce(array_agg(workspace_id), '{}'), coalesce(array_agg(name), '{}'),
    coalesce(array_agg(coalesce(version, '')), '{}'), coalesce(array_agg(endpoint_id IN (SELECT id FROM gated)), '{}')
FROM upd`

// lapseGates is the first statement of a sweep that frees slots (the
// freeing statement ends with failLapsed): pick answers the ids and
// endpoints of up to $2 jobs to free; on their endpoints it takes the gate
// protocol's shared lock and then, in id order, locks their rows, and
// answers those endpoints' ids and the jobs'. The freeing statement takes
// only these jobs, on these endpoints (the last two parameters of each),
// if they are still candidates once it has locked them (candidates that
// came since wait for the next sweep).
//
// The rows are locked here, a statement before the one that updates them,
// for the reason sqlReportLock gives: a statement that locks a row and then
// updates it reads the row with a snapshot taken before the lock, could
// meet an older version and queue for that version's tuple lock behind a
// claim waiting for the sweep, a deadlock (concurrency QA). And the freeing
// statement must lock no endpoint beyond them: one found only by its newer
// snapshot (a running job cancelled meanwhile) would be locked after those
// held here, out of id order, a deadlock with a claim holding it and
// waiting for one of these (review), and would have missed its gate lock.
// So every one of their rows is locked, not only those with a limit: this
// statement reads max_concurrent with a snapshot taken before its gate
// locks, and a policy write that set a limit while it waited for them
// would have left that row to the freeing statement's lock (second
// review). A sweep is rare; a row it locks needlessly costs a moment.
// The statement names itself in a comment first: pg_stat_activity keeps
// only a statement's first 1,024 bytes, and pick's can fill them.
func lapseGates(pick string) string {
	return `/* lapse gates */
WITH p AS (` + pick + `
), e AS (
    SELECT DISTINCT endpoint_id FROM p
), g AS (
    SELECT array_agg(endpoint_id ORDER BY endpoint_id) AS ids,
        count(pg_advisory_xact_lock_shared(hashtextextended(endpoint_id, 0))) AS n
    FROM e
), r AS (
    SELECT id FROM job_endpoints
    WHERE id IN (SELECT endpoint_id FROM e) AND (SELECT n FROM g) >= 0
    ORDER BY id
    FOR NO KEY UPDATE
)
SELECT coalesce(g.ids, '{}'), coalesce((SELECT array_agg(p.id ORDER BY p.id) FROM p), '{}')
FROM g, (SELECT count(*) FROM r) r`
}

// fairRunning picks the ids and endpoints of up to $2 RUNNING jobs that
// match cond (which holds status = 'RUNNING' and bounds ready_at), taking
// turns among the workspaces that have some (db.FairPick), each one's
// earliest ready_at first. Ordered by ready_at alone, one workspace's
// backlog of lapsed leases (a fleet of workers that died at once) filled
// every pass until it was worked off, and another workspace's lapsed last
// attempt, and the dependents and run waiting for it, waited pass after
// pass (multi-tenant QA). The workspaces are found through
// jobs_lapsed_ws_idx (migration 0062), a descent each (db.WorkspacesWith),
// and each one's first $2 candidates are read from it: a pass costs the
// same whatever the backlog.
func fairRunning(cond string) string {
	return `SELECT id, endpoint_id FROM jobs WHERE id = ANY(ARRAY(` + db.FairPick(db.Backlog{
		Table: "jobs", Where: "status = 'RUNNING'", Also: cond, Order: "ready_at", Due: "ready_at",
	}, "$2::int") + `))`
}

// sqlExhaustLapsed ends jobs whose lease lapsed on their last attempt; the
// lapsed execution is marked failed with the side-effect warning. $3 limits
// it to one run (inline at a run's read), $5 to one workspace (at a list of
// its runs), or, both NULL, to a bounded sweep; $6 to the endpoints
// sqlLapsedGates (or sqlLapsedGatesFair) locked, $7 to the jobs it picked.
var sqlExhaustLapsed = `
WITH lapsed AS (
    SELECT id FROM jobs
    WHERE status = 'RUNNING' AND ready_at <= $1::timestamptz AND attempt >= max_attempts
      AND ($3::text IS NULL OR run_id = $3::text) AND ($5::text IS NULL OR workspace_id = $5::text)
      AND endpoint_id = ANY($6::text[]) AND id = ANY($7::text[])
    ORDER BY ready_at
    LIMIT $2::int
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE jobs j SET status = 'EXHAUSTED', due_at = NULL, ready_at = NULL, finished_at = $1::timestamptz,
        updated_at = $1::timestamptz
    FROM lapsed WHERE j.id = lapsed.id
    RETURNING j.step_id, j.run_id, j.workspace_id, j.id, j.status, j.attempt, j.endpoint_id
` + failLapsed("$1", "$4") + `
SELECT step_id, run_id, workspace_id, id, status, attempt FROM upd`

// sqlAwaitJobLocks waits for whoever holds the jobs $1 locked (a read or
// the sweeper ending their lapsed last attempts, a report) to end, within
// sqlLapseWaitTimeout's bound, in its own transaction. It locks in id order,
// as a batch report does (jobs_report_lock), so the two cannot deadlock.
const sqlAwaitJobLocks = `SELECT id FROM jobs WHERE id = ANY($1::text[]) ORDER BY id FOR SHARE`

// sqlLapseWaitTimeout bounds sqlAwaitJobLocks' whole wait ($1, as
// '2000ms'): a statement_timeout, where a lock_timeout would bound each of
// its locks.
const sqlLapseWaitTimeout = `SELECT set_config('statement_timeout', $1::text, true)`

// sqlLapsedGates takes the gate protocol's shared lock on, and locks the
// rows of, the endpoints of the jobs sqlExhaustLapsed is about to end
// (lapseGates: a separate, earlier statement, so that the ending statement
// reads max_concurrent after the locks): up to $2 of run $3's, or of
// workspace $4's, longest lapsed first. sqlLapsedGatesFair is the sweep's,
// over every workspace ($1 now, $2 limit), taking turns among them
// (fairRunning).
var (
	sqlLapsedGates = lapseGates(`SELECT id, endpoint_id FROM jobs
    WHERE ` + lapsedLast + ` AND ($3::text IS NULL OR run_id = $3::text) AND ($4::text IS NULL OR workspace_id = $4::text)
    ORDER BY ready_at LIMIT $2::int`)
	sqlLapsedGatesFair = lapseGates(fairRunning(lapsedLast))
)

// lapsedLast is true of a job whose lease lapsed by $1 on its last attempt.
const lapsedLast = `status = 'RUNNING' AND ready_at <= $1::timestamptz AND attempt >= max_attempts`

// Requeueing lapsed leases (the sweeper's backstop). A lapsed lease on an
// attempt that was not the job's last leaves the job claimable at once by a
// worker of its exact version, and until one claims it the job still counts
// against its endpoint's maxConcurrent: with no such worker left (a crashed
// worker of a version being retired) it held the slot for good, and every
// other version's and tool's jobs on the endpoint waited; on any endpoint
// it read RUNNING, its attempt open, for good (SDK QA: 14 minutes after a
// worker's key was revoked, only queue health said the jobs were waiting).
// So once the lease has been lapsed for $3 ms the job goes back to QUEUED
// (due when its lease lapsed, so queue health shows its age), the lapsed
// execution is failed with the warning, the slot (if the endpoint has a
// limit) is freed and the job's token cleared (a heartbeat answers
// lease_lost). Until a new claim, a report with that token is still
// recorded (API.md §5; see sqlAdjustSlots). A statement per step, as
// sqlLapsedGates and sqlExhaustLapsed:
const requeueCandidates = `status = 'RUNNING' AND attempt < max_attempts
      AND ready_at <= $1::timestamptz - $3::bigint * interval '1 millisecond'`

// sqlRequeueGates takes the gate protocol's shared lock on, and locks the
// rows of, the endpoints of up to $2 candidates (lapseGates), taking turns
// among the workspaces (fairRunning).
var sqlRequeueGates = lapseGates(fairRunning(requeueCandidates))

// sqlRequeueLapsed requeues the candidates sqlRequeueGates picked ($6) of
// the endpoints it locked ($5); $4 is the warning.
var sqlRequeueLapsed = `
WITH lapsed AS (
    SELECT id FROM jobs WHERE ` + requeueCandidates + ` AND endpoint_id = ANY($5::text[]) AND id = ANY($6::text[])
    ORDER BY ready_at
    LIMIT $2::int
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE jobs j SET status = 'QUEUED', due_at = j.lease_expires_at, ready_at = j.lease_expires_at,
        lease_token = NULL, updated_at = $1::timestamptz
    FROM lapsed WHERE j.id = lapsed.id
    RETURNING j.id, j.attempt, j.endpoint_id, j.workspace_id, j.name, j.version
` + failLapsed("$1", "$4") + sweptJobs

const (
	sqlEndpointGateExclusive = `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`
	sqlRecountRunning        = `
UPDATE job_endpoints SET running_count = (SELECT count(*) FROM jobs WHERE endpoint_id = $1::text AND status = 'RUNNING')
    + (SELECT count(*) FROM jobs WHERE endpoint_id = $1::text AND slot_attempt IS NOT NULL)
WHERE id = $1::text AND max_concurrent IS NOT NULL`
)

// sqlRecountRate starts a rate limit set or changed by a policy write ($1
// the endpoint) from every attempt started on the endpoint in the minute
// it is set in ($2, the write's minute, read once it holds the row; a later
// one when a claim's clock already counted one), as its executions record them (their endpoint and
// start, job_executions_endpoint_idx): a claim counts its grants on the
// endpoint's row only while a limit (or maxConcurrent, or an open circuit)
// makes it write the row, so without this a limit set mid-minute let that
// many more start in a minute whose earlier claims went uncounted (README:
// "the rate counts per UTC minute"). Under the row lock the write holds:
// every claim of the endpoint's jobs that committed before is counted, and
// every later one counts on the row as written here.
const sqlRecountRate = `
UPDATE job_endpoints e SET rate_window_start = greatest(e.rate_window_start, $2::timestamptz),
    rate_window_count = (SELECT count(*) FROM job_executions x
                         WHERE x.endpoint_id = $1::text
                           AND x.started_at >= greatest(e.rate_window_start, $2::timestamptz))
WHERE e.id = $1::text AND e.rate_limit_per_minute IS NOT NULL`

const sqlInsertWorker = `
INSERT INTO job_workers (id, workspace_id, key_id, names, versions, created_at, last_seen_at)
VALUES ($1::text, $2::text, $3::text, $4::text[], $5::text[], $6::timestamptz, $6::timestamptz)`

const sqlWorkerExists = `SELECT true FROM job_workers WHERE id = $1::text AND workspace_id = $2::text AND key_id = $3::text`

// sqlWorkerTools reads the exact name@version pairs a worker of the key
// serves, for a long poll to park with (waker).
const sqlWorkerTools = `SELECT names, versions FROM job_workers WHERE id = $1::text AND workspace_id = $2::text AND key_id = $3::text`

// sqlClaim claims up to $5 due jobs of the worker's exact name@version pairs
// in one statement. Jobs are locked with SKIP LOCKED (claimers never wait on
// each other's jobs); their endpoints are then locked in id order, and the
// gates are decided by a second statement, whose snapshot is taken once
// those rows are locked, so it reads their latest versions: pause,
// maxConcurrent and rateLimitPerMinute hold across concurrent claimers, a
// pause PUT and reports freeing slots. (The first statement's scan reads
// the endpoints as of its start, and a claim that then waited for an
// endpoint's row re-reads only that row: its filter may offer a job whose
// gate closed meanwhile, which then gets no grant, or pass over one whose
// gate opened, which the next look takes; no grant rests on it.
// TestAClaimWaitingForItsEndpointGrantsFromTheLockedRow.) A RUNNING job is due
// when its lease lapsed: its reclaim needs no new concurrency slot, and its
// lapsed execution is marked failed with the warning. A job replayed after
// a cancel while its cancelled attempt may still run (jobs.slot_attempt,
// its lease not expired) is passed over; once that lease expired, its claim
// takes over the attempt's slot and fails it with the warning the same way.
// Such a job is not due (ready_at) until that expiry or the attempt's
// report (replayDue, sqlAdjustSlots), so the scan in ready_at order stops
// before it: the test in the claim is only the guard.
//
// $1 worker, $2 workspace, $3 now, $4 key, $5 limit, $6 lease grace ms,
// $7 rate window (minute), $8 warning, $9 the most bytes of sealed input one
// claim answers (always at least one job; ClaimInputBudget), $10 the
// claim's ClaimID and $11 its secret (both NULL for a claim without one).
// The statement is the PL/pgSQL function jobs_claim_keyed (migration 0060
// waits for a replayed job's cancelled attempt on every endpoint; 0058
// marks the worker seen at most once a minute; 0052 passes over the jobs
// named in ratchet.claim_skip; 0043 writes each execution's endpoint;
// 0042 made it: 0032's
// jobs_claim_hashed with the keyed claim's answer again and derived
// tokens; 0011 has its design), which
// answers each lease token and stores only its hash (every comparison is
// jobs_lease_token_matches, which also accepts a token stored in clear
// before 0032). Each server connection parses the call once, but the
// function's query is still planned with each call's values, on purpose: a
// generic plan cannot see the LIMIT and, with a million jobs queued, reads
// and sorts every due one (BENCHMARKS.md, "What limits the rest").
//
// The function runs once for the key only while the key is not revoked
// (LATERAL: it is called per row of k, and there is none once revoked), so
// a long-polling claim stops leasing jobs the moment its key's revocation
// commits, though it was authenticated before (QA: one opened before the
// revocation leased a job queued after it, decrypted input included). A
// revoked key gets one row of NULLs instead (the second branch, which calls
// nothing), its job id NULL, which claimOnce answers 401 (race QA: the
// claim answered 200 with no jobs, so its worker polled on, unaware).
const sqlClaim = `SELECT c.* FROM api_keys k,
    LATERAL jobs_claim_keyed($1::text, $2::text, $3::timestamptz, k.id, $5::int, $6::bigint, $7::timestamptz, $8::text,
                             $9::bigint, $10::text, $11::text) c
WHERE k.id = $4::text AND k.revoked_at IS NULL
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM api_keys k WHERE k.id = $4::text AND k.revoked_at IS NOT NULL`

// sqlClaimSkip names, for the rest of its transaction, the jobs the claim
// statement passes over (migration 0052; claimOnce): $1 their ids, comma
// separated.
const sqlClaimSkip = `SELECT set_config('ratchet.claim_skip', $1::text, true)`

// sqlHeartbeat extends a current lease by the job's timeout plus the grace,
// when the key may work the job's tool ($6: its name@version list, NULL for
// any tool). Never shorter: a heartbeat whose clock reading is older than
// one already recorded (it waited for a connection or the row, its client
// gave up on it and sent another, or its instance's clock is behind) leaves
// the later expiry, which the worker may have been told (time QA: the
// lease moved back and a second worker took the job). The worker that
// holds it counts as seen (at most once a minute): a worker whose slots are
// all busy does not claim, and one that looked gone would be missing from
// queue health and, after JOB_RETENTION_DAYS, deleted.
const sqlHeartbeat = `
WITH j AS (
    UPDATE jobs SET lease_expires_at = greatest(lease_expires_at,
            $4::timestamptz + (timeout_ms + $5::bigint) * interval '1 millisecond'),
        ready_at = greatest(lease_expires_at, $4::timestamptz + (timeout_ms + $5::bigint) * interval '1 millisecond'),
        updated_at = $4::timestamptz
    WHERE id = $1::text AND workspace_id = $2::text AND jobs_lease_token_matches(lease_token, $3::text) AND status = 'RUNNING'
      AND ($6::text[] IS NULL OR name || '@' || version = ANY($6::text[]))
    RETURNING id, attempt, lease_expires_at, cancel_requested, worker_id
), x AS (
    UPDATE job_executions x SET lease_expires_at = j.lease_expires_at FROM j WHERE x.job_id = j.id AND x.attempt = j.attempt
), w AS (
    UPDATE job_workers w SET last_seen_at = $4::timestamptz FROM j
    WHERE w.id = j.worker_id AND w.last_seen_at < $4::timestamptz - interval '1 minute'
)
SELECT lease_expires_at, cancel_requested FROM j`

// requeuedFor is true of a job (alias j) that the sweeper requeued after its
// lease lapsed (sqlRequeueLapsed) and nothing took since, for the attempt
// whose token is token: QUEUED with its token cleared (a claim sets a new
// one, a replay sets ”), and that attempt, the job's latest, never
// reported (the lapse failed it).
func requeuedFor(token string) string {
	return `(j.status = 'QUEUED' AND j.lease_token IS NULL AND ` +
		currentAttempt("x.reported_at IS NULL AND jobs_lease_token_matches(x.lease_token, "+token+")") + `)`
}

// replayedOpen is true of a job (alias j) a replay queued again (its
// lease token is empty, see sqlReplaySameVersion; it may have been
// cancelled again since) while the attempt holding token was open:
// cancelled while running and neither reported nor failed by the sweeper
// as lapsed, and superseded by no claim since. Its worker may still be at
// work, and its report is recorded as API.md §5 has it for any lapsed
// lease no claim has superseded.
func replayedOpen(token string) string {
	return `(j.status IN ('QUEUED', 'CANCELLED') AND j.lease_token = '' AND ` + openAttempt("jobs_lease_token_matches(x.lease_token, "+token+")") + `)`
}

// cancelledRequeuedFor is true of a job (alias j) the sweeper requeued
// under token and then cancelled, with nothing claiming or replaying it
// since: CANCELLED with its token cleared (a replay empties it) and that
// attempt, the job's latest, never reported. Its report is still recorded
// (decideReport), and its worker is told to stop.
func cancelledRequeuedFor(token string) string {
	return `(j.status = 'CANCELLED' AND j.lease_token IS NULL AND ` +
		currentAttempt("x.reported_at IS NULL AND jobs_lease_token_matches(x.lease_token, "+token+")") + `)`
}

// reportedLatest is true of a job (alias j) whose latest attempt holds
// token and has reported: the attempt ended, and no claim has superseded
// it since (a claim starts a new attempt).
func reportedLatest(token string) string {
	return currentAttempt("x.reported_at IS NOT NULL AND jobs_lease_token_matches(x.lease_token, " + token + ")")
}

// sqlLeaseState explains why a heartbeat did not extend a lease. A job
// never claimed has no token: no token is current. Then whether the job
// was requeued under this token (requeuedFor): the heartbeat may take it
// back (sqlReviveRequeued); whether a replay queued it again while this
// token's attempt was open (replayedOpen), or cancelled it after the
// requeue (cancelledRequeuedFor); and whether the job's current
// attempt is still unreported (a cancelled job's worker may be at work
// still, its report recorded, even once its lease lapsed and the sweeper
// failed it to free its slot); and whether this token's attempt is still
// the job's latest and has reported (reportedLatest): no claim superseded
// it, though a replay or the sweeper's requeue cleared the job's token.
// The version read is the one the token's attempt was claimed for, which a
// restricted key must be allowed to work (see sqlReportLock).
var sqlLeaseState = `
SELECT j.status, coalesce(jobs_lease_token_matches(j.lease_token, $3::text), false), j.lease_expires_at, j.cancel_requested, j.name,
       coalesce((SELECT x.version FROM job_executions x
                 WHERE x.job_id = j.id AND jobs_lease_token_matches(x.lease_token, $3::text)), j.version),
       ` + requeuedFor("$3::text") + `, ` + replayedOpen("$3::text") + `,
       ` + currentAttempt("x.reported_at IS NULL") + `, ` + reportedLatest("$3::text") + `,
       ` + cancelledRequeuedFor("$3::text") + `
FROM jobs j WHERE j.id = $1::text AND j.workspace_id = $2::text`

// sqlReportedFailure reads what a reported failure decided: whether it was
// retryable (a failure without an error object is) and its retryAfterMs
// (NULL when it sent none). $1 job, $2 attempt.
const sqlReportedFailure = `SELECT coalesce(x.retryable, true), x.retry_after_ms FROM job_executions x
WHERE x.job_id = $1::text AND x.attempt = $2::int`

// sqlRequeuedFor says whether a job a report locked ($1) was requeued under
// the report's token ($2), read after the lock: a requeue that committed
// while the report waited for it is seen.
var sqlRequeuedFor = `SELECT ` + requeuedFor("$2::text") + ` FROM jobs j WHERE j.id = $1::text`

// sqlReviveRequeued gives a job the sweeper requeued back to the worker
// whose heartbeat shows it still at work, when nothing claimed it since:
// RUNNING again under its token with a fresh lease, its execution open
// again, and its concurrency slot taken back, if the endpoint has room (the
// requeue freed the slot for others, who may hold it now; no row then).
// Locks as a claim does: the job's row, then its endpoint's.
var sqlReviveRequeued = `
WITH j0 AS (
    SELECT j.id, j.attempt, j.endpoint_id FROM jobs j
    WHERE j.id = $1::text AND j.workspace_id = $2::text AND ` + requeuedFor("$3::text") + `
    FOR UPDATE OF j
), room AS (
    UPDATE job_endpoints e
    SET running_count = e.running_count + CASE WHEN e.max_concurrent IS NULL THEN 0 ELSE 1 END
    FROM j0 WHERE e.id = j0.endpoint_id AND (e.max_concurrent IS NULL OR e.running_count < e.max_concurrent)
    RETURNING e.id
), j AS (
    UPDATE jobs SET status = 'RUNNING', lease_token = jobs_lease_token_stored($3::text),
        lease_expires_at = $4::timestamptz + (jobs.timeout_ms + $5::bigint) * interval '1 millisecond',
        ready_at = $4::timestamptz + (jobs.timeout_ms + $5::bigint) * interval '1 millisecond', updated_at = $4::timestamptz
    FROM j0, room WHERE jobs.id = j0.id
    RETURNING jobs.id, jobs.attempt, jobs.lease_expires_at, jobs.cancel_requested
), x AS (
    UPDATE job_executions x SET outcome = NULL, warning = NULL, ended_at = NULL, lease_expires_at = j.lease_expires_at
    FROM j WHERE x.job_id = j.id AND x.attempt = j.attempt
)
SELECT lease_expires_at, cancel_requested FROM j`

// sqlReportLock locks a batch's jobs in id order ($1 is sorted), takes the
// endpoint gate's shared lock for each, tries each run's shared lock without
// waiting (a report that had to wait for a finish checks completion
// afterwards) and finds the execution each job's token ($3, parallel to $1)
// belongs to. The statement is jobs_report_lock (migration 0011); beside it,
// for a key restricted to some tools ($4), the handler version the key must
// be allowed to work (the name is in the function's answer): that of the
// attempt the token names (job_executions.version, recorded by its claim),
// else the job's. A step cancelled while it ran and replayed onto another
// contract's handler version is the new version's, but the cancelled
// attempt's worker reports what it ran under its own version's key (QA: it
// was refused 403, its outcome lost, and the replay waited for the lease).
//
// Every job's row is locked first (pre, in id order): the function takes a
// job's run lock (shared) as it locks that job, so a batch would hold one
// run's lock while waiting for its next job's row, which a replay of that
// job holds while it waits for the same run's lock, exclusively — a
// deadlock Postgres broke by failing one of them. The function then finds
// the rows already locked. The lateral call's argument depends on pre's
// count so that pre runs first.
//
// Then, after the jobs and in id order, it locks the rows of their
// endpoints that the report's later statements may update: those that count
// failures and those with a concurrency limit. Those statements (the
// circuit count, the slot counts) update the rows they lock, and a
// statement that locks a row and updates it reads it with a snapshot taken
// before the lock: it could meet an older version, and queue for that
// version's tuple lock behind a claim waiting for this report, a deadlock
// (concurrency QA). Locked here, in a statement before theirs, the rows are
// at their latest version when those statements begin. The rows are chosen
// by jobs_report_lock_endpoints (migration 0049), whose query sees the
// endpoints as they are after the gate locks: this statement's snapshot
// predates them, and missed a limit set by a policy write the report waited
// for, leaving that row to a later statement, out of id order (a deadlock,
// sixth review). The function's argument is an aggregate of l, so it runs
// after every gate lock; g's count makes every such row locked, whichever
// rows the last column's probe reads.
//
// The last column says whether the job's endpoint counts failures
// (circuitHint; one probe per endpoint, not per job): only then does the
// report run sqlCircuitRecord. A breaker turned on after this statement
// counts from the next report on.
const sqlReportLock = `
WITH pre AS (
    SELECT j.id FROM jobs j WHERE j.id = ANY($1::text[]) AND j.workspace_id = $2::text
    ORDER BY j.id
    FOR UPDATE
), l AS (
    SELECT l.* FROM (SELECT count(*) AS n FROM pre) p,
         LATERAL jobs_report_lock(CASE WHEN p.n >= 0 THEN $1::text[] END, $2::text, $3::text[]) l
), gated AS (
    SELECT g.* FROM (SELECT array_agg(DISTINCT endpoint_id) AS ids FROM l) a,
         LATERAL jobs_report_lock_endpoints(a.ids) g
)
SELECT l.*, CASE WHEN $4::boolean THEN coalesce((SELECT x.version FROM job_executions x
                                                   WHERE x.job_id = l.id AND x.attempt = l.x_attempt),
                                                  (SELECT j.version FROM jobs j WHERE j.id = l.id)) END,
       l.endpoint_id IN (SELECT id FROM gated WHERE hinted), l.endpoint_id IN (SELECT id FROM gated)
FROM l, (SELECT count(*) AS n FROM gated) g`

// sqlAdjustSlots corrects the concurrency counts before a report batch is
// recorded. Recording frees a slot for each job it ends
// (jobs_report_apply), so for late reports on jobs the sweeper requeued
// ($1), whose slots the requeue freed already, it is taken back first and
// the count nets out. Reports of cancelled attempts that still hold their
// slot ($2, with their attempts $3; jobs_report_apply frees nothing for a
// job it does not update) free it here. Under the endpoints' shared gate
// lock, which sqlReportLock took. It locks, in id order, every endpoint the
// recording will ($4: all the jobs it records), as jobs_report_apply then
// does: locking only these first, out of that order, deadlocked with claims
// and other reports.
//
// A job replayed while the attempt freed here could still run is QUEUED and
// due at that attempt's lease expiry (replayDue): the attempt has ended, so
// it is due now ($5), the report's time, unless it was due earlier. Under
// the job's row lock (sqlReportLock), which a claim takes too (SKIP LOCKED,
// deciding on the row it locked): no claim sees the attempt freed without
// the job due, or the job due with the attempt held.
const sqlAdjustSlots = `
WITH gated AS (
    SELECT e.id FROM job_endpoints e
    WHERE e.id IN (SELECT endpoint_id FROM jobs WHERE id = ANY($4::text[])) AND e.max_concurrent IS NOT NULL
    ORDER BY e.id
    FOR NO KEY UPDATE
), freed AS (
    UPDATE jobs j SET slot_attempt = NULL,
        due_at = CASE WHEN j.status = 'QUEUED' THEN least(j.due_at, $5::timestamptz) ELSE j.due_at END,
        ready_at = CASE WHEN j.status = 'QUEUED' THEN least(j.ready_at, $5::timestamptz) ELSE j.ready_at END
    FROM unnest($2::text[], $3::int[]) AS u(id, attempt)
    WHERE j.id = u.id AND j.slot_attempt = u.attempt
    RETURNING j.endpoint_id
), c AS (
    SELECT endpoint_id, sum(n)::int AS n
    FROM (SELECT endpoint_id, 1 AS n FROM jobs WHERE id = ANY($1::text[])
          UNION ALL SELECT endpoint_id, -1 FROM freed) d
    GROUP BY endpoint_id
)
UPDATE job_endpoints e SET running_count = GREATEST(0, e.running_count + c.n)
FROM c WHERE e.id = c.endpoint_id AND e.id IN (SELECT id FROM gated)`

// heldSlotExpired is true of a job (alias jobs) whose cancelled attempt
// holds a slot with its lease expired at $1: its worker never reported.
const heldSlotExpired = `jobs.slot_attempt IS NOT NULL AND EXISTS (SELECT 1 FROM job_executions x
    WHERE x.job_id = jobs.id AND x.attempt = jobs.slot_attempt AND x.lease_expires_at <= $1::timestamptz)`

// sqlHeldSlotGates takes the gate protocol's shared lock on, and locks the
// rows of, the endpoints of up to $2 jobs sqlReleaseHeldSlots is about to
// free (lapseGates), taking turns among the workspaces (db.RoundRobin; the
// held slots are few, and read whole through jobs_slot_idx).
var sqlHeldSlotGates = lapseGates(`SELECT id, endpoint_id FROM jobs WHERE id = ANY(ARRAY(` +
	db.RoundRobin(`SELECT id, workspace_id, id AS due FROM jobs WHERE `+heldSlotExpired, "$2::int") + `))`)

// sqlReleaseHeldSlots frees the slots of the cancelled attempts whose lease
// expired unreported that sqlHeldSlotGates picked ($5), on the endpoints it
// locked ($4), failing their executions with the warning $3.
var sqlReleaseHeldSlots = `
WITH lapsed AS (
    SELECT id, slot_attempt FROM jobs WHERE ` + heldSlotExpired + ` AND endpoint_id = ANY($4::text[]) AND id = ANY($5::text[])
    ORDER BY id
    LIMIT $2::int
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE jobs j SET slot_attempt = NULL, updated_at = $1::timestamptz
    FROM lapsed WHERE j.id = lapsed.id AND j.slot_attempt = lapsed.slot_attempt
    RETURNING j.id, lapsed.slot_attempt AS attempt, j.endpoint_id, j.workspace_id, j.name, j.version
` + failLapsed("$1", "$3") + sweptJobs

// sqlExecutionByToken reads the execution a lease token names, as
// jobs_report_lock does. $1 job, $2 token.
const sqlExecutionByToken = `
SELECT attempt, outcome, reported_at, result_status, next_due_at, coalesce(output_rejected, false)
FROM job_executions WHERE job_id = $1::text AND jobs_lease_token_matches(lease_token, $2::text)`

// sqlReplayedSince says whether a job ($1) was replayed since its lease
// token was last set: a replay empties the token (sqlReplaySameVersion), a
// claim sets a new one, and the sweeper's requeue clears it (NULL).
const sqlReplayedSince = `SELECT coalesce(lease_token = '', false) FROM jobs WHERE id = $1::text`

// sqlReportApply records reports' outcomes (parallel arrays $3…$16, one
// element per report), the jobs' next statuses where $14 says so, and frees
// the endpoints' concurrency slots. The endpoints are locked in id order
// first, the order claims lock them in. The call is jobs_report_apply
// (migration 0011); beside it, which of the runs $17 have had completion
// requested, read with this statement's snapshot (see applyReports).
const sqlReportApply = `SELECT jobs_report_apply($1::text, $2::timestamptz, $3::text[], $4::int[], $5::text[], $6::timestamptz[],
    $7::timestamptz[], $8::bytea[], $9::text[], $10::text[], $11::bool[], $12::bigint[], $13::bytea[], $14::bool[], $15::text[],
    $16::bool[]),
    ARRAY(SELECT r.id FROM job_runs r WHERE r.id = ANY($17::text[]) AND r.completion_requested AND r.status = 'RUNNING')`

// sqlKeepCancelledOutputs stores outputs ($2, previews $3) reported for
// jobs ($1) cancelled while they ran; see keepCancelledOutputs.
const sqlKeepCancelledOutputs = `
UPDATE jobs j SET output_sealed = u.output, output_preview = u.preview::jsonb, updated_at = $4::timestamptz
FROM unnest($1::text[], $2::bytea[], $3::text[]) AS u(id, output, preview)
WHERE j.id = u.id AND j.status IN ('CANCELLED', 'QUEUED')`

const sqlCancelLock = `
SELECT pg_advisory_xact_lock_shared(hashtextextended(endpoint_id, 0))::text, id, status, run_id, attempt, endpoint_id,
    max_attempts, lease_expires_at FROM jobs WHERE step_id = $1::text AND workspace_id = $2::text FOR UPDATE`

// sqlCancel cancels job $1 at $2. A RUNNING one ($3) keeps its concurrency
// slot for its attempt (slot_attempt), which its worker may still be
// running, until the attempt is reported (sqlAdjustSlots) or its lease
// expires (sqlReleaseHeldSlots), or a claim of the job, replayed since,
// takes it over once that lease expired (migration 0060). The one
// exception: a replayed job whose earlier cancelled attempt still holds a
// slot frees the new attempt's at once (one held attempt per job; the count
// stays exact). Since migration 0060 a claim takes no job beside its held
// attempt, so this happens only to a job claimed so before then.
const sqlCancel = `
WITH j AS (
    UPDATE jobs SET status = 'CANCELLED', cancel_requested = true, due_at = NULL, ready_at = NULL,
        finished_at = $2::timestamptz, updated_at = $2::timestamptz,
        slot_attempt = CASE WHEN $3::bool THEN coalesce(slot_attempt, attempt) ELSE slot_attempt END
    WHERE id = $1::text
    RETURNING endpoint_id, slot_attempt = attempt AS held
)
UPDATE job_endpoints e SET running_count = GREATEST(0, e.running_count - 1) FROM j
WHERE e.id = j.endpoint_id AND $3::bool AND NOT j.held AND e.max_concurrent IS NOT NULL`

// sqlQueueHealth summarises queued work per exact name@version (all of it,
// and how much is due: a retry or a delayed enqueue waits for its time),
// with the workers that polled for it recently and whose key is not
// revoked: a revoked key's worker never claims again (401), so counting it
// for the two minutes after its last poll read a queue no worker could take
// as served, its message null (jobs QA; seed 000: "check that a worker is
// online, its key works"). A RUNNING job whose lease lapsed is
// waiting too (its worker is gone, and it is claimable again): it counts,
// as of its lease's expiry, unless that was its last attempt (no claim takes
// it; the sweeper or the next read of its run ends it EXHAUSTED). Pages go
// by (name, version): $4 and $5 are the last row's (NULL for the first
// page), $6 the page's rows. The last column names the endpoints where a
// replayed job waits for its cancelled attempt, which may still run: it
// has not reported and its lease (the job's lease_expires_at) has not
// expired (migration 0060: the claim waits for it, on any endpoint). Such a
// job is due at that expiry (replayDue), not yet: it counts as queued, not
// due, like a retry waiting for its time, and is named whatever its due
// time, as what holds it is an attempt that may end sooner, at its report.
//
// An endpoint at its maxConcurrent holds only the jobs that would take a
// new slot: as in jobs_claim_keyed (migration 0047), a lapsed RUNNING job
// keeps its own slot and is reclaimed past the limit, and (0060) a replayed
// job takes over the slot its cancelled attempt holds. Its endpoint is named
// at the limit only for a QUEUED or RETRY_SCHEDULED job of the row that
// holds no such slot (QA: a
// lapsed job alone read as held by the limit, and the next claim took it).
// The two limits name an endpoint only for a job that is due: one waiting
// for its time (a retry, a delayed enqueue) is not held by them, and they
// may have passed when it comes due (QA: a retry due tomorrow read as held
// by this minute's limit). A pause or an open circuit holds every job,
// due or not, until someone acts, so those are named for any.
//
// The jobs are counted by (name, version, endpoint), a group or few per
// endpoint of each version, hashed in memory, and those groups by version
// (e): grouped by version alone, every queued job was sorted by version
// (on disk past work_mem) and each version's jobs again for each DISTINCT
// list of endpoints (scale QA: 500,000 queued over four versions, 2.1 s
// and 22 MB of temporary files; 0.6 s and none so). On the first page the
// cursor is the empty string (no name or version is empty): its comparison
// stays an index condition in a plan made for any cursor, not a filter.
const sqlQueueHealth = `
WITH q AS (
    SELECT name, version, sum(queued)::bigint AS queued, sum(due)::bigint AS due, min(oldest) AS oldest,
           array_agg(endpoint_id) AS endpoint_ids,
           array_agg(endpoint_id) FILTER (WHERE due > 0) AS due_endpoint_ids,
           array_agg(endpoint_id) FILTER (WHERE needs_slot) AS slot_endpoint_ids,
           array_agg(endpoint_id) FILTER (WHERE held) AS held_endpoint_ids
    FROM (
        SELECT name, version, endpoint_id, count(*) AS queued,
               count(*) FILTER (WHERE ready_at <= $2::timestamptz) AS due,
               min(ready_at) FILTER (WHERE ready_at <= $2::timestamptz) AS oldest,
               bool_or(status <> 'RUNNING' AND slot_attempt IS NULL AND ready_at <= $2::timestamptz) AS needs_slot,
               bool_or(status <> 'RUNNING' AND slot_attempt IS NOT NULL
                       AND lease_expires_at > $2::timestamptz) AS held
        FROM jobs
        WHERE workspace_id = $1::text AND (status IN ('QUEUED', 'RETRY_SCHEDULED')
                                           OR (status = 'RUNNING' AND ready_at <= $2::timestamptz
                                               AND attempt < max_attempts))
          AND (name, version) > (coalesce($4::text, ''), coalesce($5::text, ''))
        GROUP BY name, version, endpoint_id
    ) e
    GROUP BY name, version
    ORDER BY name, version LIMIT $6
), w AS (
    SELECT t.name, t.version, count(DISTINCT wk.id)::bigint AS seen
    FROM job_workers wk JOIN api_keys k ON k.id = wk.key_id AND k.revoked_at IS NULL,
         unnest(wk.names, wk.versions) AS t(name, version)
    WHERE wk.workspace_id = $1::text AND wk.last_seen_at > $3::timestamptz
    GROUP BY t.name, t.version
)
SELECT q.name, q.version, q.queued, q.due, q.oldest, coalesce(w.seen, 0),
       coalesce(h.open_circuits, '{}'), coalesce(h.paused, '{}'), coalesce(h.at_limit, '{}'),
       coalesce(h.rate_limited, '{}'), coalesce(h.held_replays, '{}')
FROM q LEFT JOIN w ON w.name = q.name AND w.version = q.version
CROSS JOIN LATERAL (
    SELECT array_agg(e.name ORDER BY e.name) FILTER (WHERE e.circuit_state = 'open') AS open_circuits,
           array_agg(e.name ORDER BY e.name) FILTER (WHERE e.paused) AS paused,
           array_agg(e.name ORDER BY e.name) FILTER (WHERE e.max_concurrent IS NOT NULL
                                                     AND e.running_count >= e.max_concurrent
                                                     AND e.id = ANY (q.slot_endpoint_ids)) AS at_limit,
           array_agg(e.name ORDER BY e.name) FILTER (WHERE e.rate_limit_per_minute IS NOT NULL
                                                     AND e.rate_window_start >= $7::timestamptz
                                                     AND e.rate_window_count >= e.rate_limit_per_minute
                                                     AND e.id = ANY (q.due_endpoint_ids)) AS rate_limited,
           array_agg(e.name ORDER BY e.name) FILTER (WHERE e.id = ANY (q.held_endpoint_ids)) AS held_replays
    FROM job_endpoints e WHERE e.id = ANY (q.endpoint_ids)
) h
ORDER BY q.name, q.version`

// sqlCloneQueued copies a QUEUED job n times (new ids and keys, the same
// run, endpoint, tool and policy snapshot, no input) in one statement. It
// exists for load tests and benchmarks that need deep queues fast. (Spreading
// the copies' due times by a microsecond each was tried: no faster drain, and
// a slower claim with a million queued in one run, so the copies keep the
// original's.)
const sqlCloneQueued = `
INSERT INTO jobs (id, step_id, workspace_id, run_id, name, version, contract_version, endpoint_id, idempotency_key,
                  request_hash, status, policy_version, policy_preset, max_attempts, initial_delay_ms, multiplier,
                  max_delay_ms, jitter_percent, timeout_ms, due_at, ready_at, input_preview, created_at, updated_at)
SELECT 'job_' || $2::text || lpad(g::text, 26 - length($2::text), '0'),
       'stp_' || $2::text || lpad(g::text, 26 - length($2::text), '0'),
       t.workspace_id, t.run_id, t.name, t.version, t.contract_version, t.endpoint_id,
       'clone:' || $2::text || ':' || g, t.request_hash, 'QUEUED', t.policy_version, t.policy_preset, t.max_attempts,
       t.initial_delay_ms, t.multiplier, t.max_delay_ms, t.jitter_percent, t.timeout_ms,
       t.due_at, t.ready_at, t.input_preview,
       t.created_at, t.updated_at
FROM jobs t, generate_series(1, $3::int) AS g
WHERE t.id = $1::text AND t.status = 'QUEUED'`

// Retention (the sweeper's jobs.retention task). A run is deleted whole, with
// its steps' jobs, their executions and replays, once it finished and every
// one of its steps ended before the cut-off $1: a FAILED run's other steps
// may run on, or be replayed, and the run is kept until the last of them has
// been over for the whole period. A run that has not finished (RUNNING) is
// kept. Three statements in one transaction:
//
// sqlRetiredRuns takes up to $2 candidates, oldest first, after ($3
// finished_at, $4 id) (job_runs_purge_idx, migration 0087: the batch
// before it in the pass looked at those up to there, sweep.Place, so a
// run kept in front, a FAILED one with a step that never ends, is read
// once a pass, not once a batch), with how many steps each and when it
// finished, locking each run's
// row and skipping any a request holds (an enqueue, a finish or a replay's
// reopening hold it; a replay holds its step's job row from the start,
// which sqlLockRetiredJobs skips); a run none of whose jobs still holds an
// endpoint slot (a cancelled attempt keeps its slot until its report or its
// lease's end: deleted first, the endpoint's running count never came down,
// and one with maxConcurrent 1 took no job again; retention QA); and not
// one whose purge failed until the cut-off passes its purge_after
// (migration 0075; sqlPurgeLater).
const sqlRetiredRuns = retiredRuns + `
  AND (r.finished_at, r.id) > ($3::timestamptz, $4::text)
ORDER BY r.finished_at, r.id
LIMIT $2::int
FOR UPDATE OF r SKIP LOCKED`

// sqlRetiredRun is sqlRetiredRuns for run $2 alone: a batch that failed
// is purged run by run (PurgeRetired).
const sqlRetiredRun = retiredRuns + `
  AND r.id = $2::text
FOR UPDATE OF r SKIP LOCKED`

const retiredRuns = `
SELECT r.id, (SELECT count(*) FROM jobs j WHERE j.run_id = r.id), r.finished_at FROM job_runs r
WHERE r.status IN ('SUCCEEDED', 'FAILED') AND r.finished_at < $1::timestamptz
  AND (r.purge_after IS NULL OR r.purge_after <= $1::timestamptz)
  -- a probe a run (jobs_run_idx), in finished_at order until the batch is
  -- full: as NOT EXISTS it was planned as an anti-join over a hash of every
  -- step that keeps its run, each batch reading the steps kept, not its own
  -- (scale QA: 100,000 of 200,000 steps for each batch of 1,000 runs)
  AND (SELECT true FROM jobs j WHERE j.run_id = r.id
         AND (j.finished_at IS NULL OR j.finished_at >= $1::timestamptz OR j.slot_attempt IS NOT NULL)
       LIMIT 1) IS NULL`

// sqlPurgeLater sets run $1's purge_after to $2: a run whose purge failed
// alone is read again once the cut-off passes it.
const sqlPurgeLater = `UPDATE job_runs SET purge_after = $2::timestamptz WHERE id = $1::text`

// sqlLockRetiredJobs locks the candidates' jobs ($1), skipping any a request
// holds, and answers the runs whose every job it locked and still found
// ended before $2 (a locked row is re-read at its latest version, so a
// replay that committed in between shows as not ended). No job can be added
// meanwhile: an enqueue needs the run's row, which is locked.
//
// The locked jobs are counted once, by run, then joined: a count per run
// over all of them read the whole batch for each run (scale QA: 1,000 runs
// of 5 steps took 300 ms, growing with the square of the batch). The jobs
// are read by run as = ANY(ARRAY(…)), as sqlDeleteRuns reads them: a
// literal array of the batch was planned for its values, a scan of every
// step once the batch was a few percent of the runs (scale QA: all 30,000
// steps of 6,000 runs read to lock a batch of 500 runs of 5 steps).
const sqlLockRetiredJobs = `
WITH locked AS (
    SELECT j.run_id, j.finished_at, j.slot_attempt FROM jobs j WHERE j.run_id = ANY(ARRAY(SELECT unnest($1::text[])))
    FOR UPDATE OF j SKIP LOCKED
), ended AS (
    SELECT l.run_id, count(*) AS n FROM locked l
    WHERE l.finished_at < $2::timestamptz AND l.slot_attempt IS NULL
    GROUP BY l.run_id
)
SELECT r.id FROM unnest($1::text[]) AS r(id) LEFT JOIN ended ON ended.run_id = r.id
WHERE (SELECT count(*) FROM jobs j WHERE j.run_id = r.id) = coalesce(ended.n, 0)`

// sqlDeleteRuns deletes the runs $1 and everything of theirs, in one
// statement (the foreign keys are checked at its end). The steps are read
// once, through jobs_run_idx, their executions and replays are deleted by
// those steps' ids, and the runs by theirs, each as = ANY(ARRAY(…)) (as
// db.RoundRobin says): joined to the batch's steps, the planner hashed
// them and scanned the whole of each child table, and a literal array of
// the batch (a plan made for its values) was matched by a scan of every
// run and every step once it was a few percent of them (scale QA: 200,000
// executions read for each batch of 500 runs). The foreign
// keys' own checks are index lookups (job_executions_pkey,
// job_replays_job_idx, jobs_run_idx, run_retired_spend_run_idx), one per
// row deleted.
const sqlDeleteRuns = `
WITH j AS (
    DELETE FROM jobs j WHERE j.run_id = ANY(ARRAY(SELECT unnest($1::text[]))) RETURNING j.id
), x AS (
    DELETE FROM job_executions x WHERE x.job_id = ANY(ARRAY(SELECT id FROM j))
), p AS (
    DELETE FROM job_replays p WHERE p.job_id = ANY(ARRAY(SELECT id FROM j))
)
DELETE FROM job_runs r WHERE r.id = ANY(ARRAY(SELECT unnest($1::text[])))`

// sqlDeleteIdleWorkers deletes up to $2 worker registrations not seen since
// $1 (through job_workers_last_seen_idx, migration 0058): a running worker
// is marked seen once a minute by its claims, long polls included, or its
// heartbeats, so these are workers long gone (a claim under a deleted id
// answers 404, and the SDK registers again at start). The delete checks
// last_seen_at again itself: a claim or heartbeat that marks the worker
// seen while the delete waits for its row leaves a version the delete
// rechecks, and only its own conditions are rechecked (the subquery's ids
// stand as its snapshot read them), so without it a worker seen just now
// was deleted (retention QA). The batch is the longest idle, in
// last_seen_at order (without it, the table was scanned in its own order,
// past every live registration before the idle ones), and its rows are
// read by the primary key (= ANY(ARRAY(…)), as db.RoundRobin says): as
// IN (…), the planner hashed the ids and read every idle registration for
// each batch (scale QA: 50,000 of 200,000 read to delete 1,000).
const sqlDeleteIdleWorkers = `
DELETE FROM job_workers WHERE id = ANY(ARRAY(
    SELECT id FROM job_workers WHERE last_seen_at < $1::timestamptz ORDER BY last_seen_at LIMIT $2::int))
  AND last_seen_at < $1::timestamptz`

package jobs

// The statements of tool contracts, synthetic tests and replay (the rest of
// the package's SQL is in sql.go, with the locking protocols it documents).

const contractColumns = `name, contract_version, handler_version, input_schema, output_schema, timeout_ms,
	retry_preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms, jitter_percent, status, created_at`

// sqlPublishContract bumps the tool's version counter and inserts the
// contract under the number it returned, in one statement: the counter row's
// lock orders concurrent publications of a tool.
const sqlPublishContract = `
WITH head AS (
    INSERT INTO tool_contract_heads (workspace_id, name, last_version)
    VALUES ($1::text, $2::text, 1)
    ON CONFLICT (workspace_id, name) DO UPDATE SET last_version = tool_contract_heads.last_version + 1
    RETURNING last_version
)
INSERT INTO tool_contracts (workspace_id, name, contract_version, handler_version, input_schema, output_schema,
                            timeout_ms, retry_preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms,
                            jitter_percent, status, created_by, created_at)
SELECT $1::text, $2::text, head.last_version, $3::text, $4::jsonb, $5::jsonb, $6::bigint, $7::text, $8::int,
       $9::bigint, $10::float8, $11::bigint, $12::float8, $13::text, $14::text, $15::timestamptz
FROM head
RETURNING ` + contractColumns

// sqlListContracts reads a page of a tool's contracts ($4 of them at most)
// that an answer of $5 bytes can hold: the page (httpapi.NewCamelPage)
// keeps its first contract, then each whose JSON, added to the ones before
// it, fits the answer, and needs the contract after the last it keeps, to
// know a next page follows. So it reads the first two and each contract
// whose predecessors' schemas fit $5 bytes, measured by a bound below
// their JSON in the answer: their text without its spaces (jsonb's text
// writes one after each ':' and ',', which the answer's compact JSON
// drops; the ones in strings it keeps). A contract it leaves out follows
// one that the page would not keep (review: up to 201 contracts, two
// schemas of up to 256 KiB each, were read for a page of 4 MB).
const sqlListContracts = `SELECT ` + contractColumns + ` FROM (
    SELECT c.*, row_number() OVER w AS n,
           sum(octet_length(replace(c.input_schema::text, ' ', '')) + octet_length(replace(c.output_schema::text, ' ', '')))
               OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
    FROM (SELECT * FROM tool_contracts
          WHERE workspace_id = $1::text AND name = $2::text AND contract_version > $3::int
          ORDER BY contract_version LIMIT $4::int) c
    WINDOW w AS (ORDER BY c.contract_version)
) c
WHERE c.n <= 2 OR c.before <= $5::bigint
ORDER BY contract_version`

const sqlContractByVersion = `SELECT ` + contractColumns + ` FROM tool_contracts
WHERE workspace_id = $1::text AND name = $2::text AND contract_version = $3::int`

// sqlReplayTargets lists a tool's contracts but the step's own ($4, NULL
// for a step without one), newest first, $3 at most, for the replay
// preview: each with what compiling its input schema costs at least
// (compileEvaluations: $6, and one more for each $7 bytes of its text
// without spaces, as sqlReplayOlderTargets counts it) and its size as
// read, and the schema itself only for a first batch: the preview checks
// the contracts not FORBIDDEN first, newest first, then the FORBIDDEN
// ones (fitBudget), and the batch is the first in that order, and each
// after it whose predecessors' sizes and its own stay within $8 bytes,
// while their costs stay below the budget ($5 evaluations). The preview
// reads the rest in batches as its budget reaches them
// (sqlReplaySchemas): what a check evaluates is told only by checking, and
// a first check may spend the whole budget (review: the page read its 100
// schemas, up to 256 KiB each, when the budget reached the first alone).
// An input that cannot be opened passes 0 and reads none. No output schema
// is read: the preview checks inputs only.
const sqlReplayTargets = `SELECT c.contract_version, c.handler_version, c.status,
       CASE WHEN c.before_cost + c.cost < $5::bigint AND (c.n = 1 OR c.before_bytes + c.bytes <= $8::bigint)
            THEN c.input_schema END AS input_schema,
       c.cost, c.bytes
FROM (
    SELECT c.*, row_number() OVER w AS n,
           coalesce(sum(c.cost) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before_cost,
           coalesce(sum(c.bytes) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before_bytes
    FROM (SELECT t.contract_version, t.handler_version, t.status, t.input_schema,
                 $6::bigint + octet_length(replace(t.input_schema::text, ' ', '')) / $7::bigint AS cost,
                 octet_length(t.input_schema::text)::bigint AS bytes
          FROM tool_contracts t
          WHERE t.workspace_id = $1::text AND t.name = $2::text AND t.contract_version IS DISTINCT FROM $4::int
          ORDER BY t.contract_version DESC LIMIT $3::int) c
    WINDOW w AS (ORDER BY c.status = 'FORBIDDEN', c.contract_version DESC)
) c
ORDER BY c.contract_version DESC`

// sqlReplaySchemas reads the input schemas of the tool's contracts $3, a
// batch the replay preview's budget left may reach (sqlReplayTargets).
const sqlReplaySchemas = `SELECT contract_version, input_schema FROM tool_contracts
WHERE workspace_id = $1::text AND name = $2::text AND contract_version = ANY($3::int[])`

// sqlReplayOlderTargets lists, newest first, the contracts below $3 (the
// oldest the preview listed) that are not FORBIDDEN (the step's own is: it
// is read only for a wholly FORBIDDEN handler version): the preview's eligibility reads on past its bounded list, so a
// step whose only fitting upgrade is older than the listed page reads
// eligible, as its replay onto that upgrade succeeds. It reads at most $4
// of them, and only the input schemas the preview's budget left ($5
// evaluations, fitBudget) may reach: compiling each costs at least $6 and
// one more for each $7 bytes of it (compileEvaluations), counted here by
// its text without spaces (a bound below its bytes as read). A contract
// whose predecessors' cost and its own reach $5 cannot be checked (fit
// would answer it not checked, so it may take the step): it reads with a
// NULL input schema, and none after it is read (review: a page of 100
// schemas of up to 256 KiB each, about 25 MB, was read when the budget was
// spent before the first). The first is read even so, without its schema
// when the budget left cannot reach it: that it exists says the step may
// take it. No more than $5 / $6 + 1 are looked at: each costs $6 at least.
const sqlReplayOlderTargets = `SELECT name, contract_version, handler_version,
	CASE WHEN c.before + c.cost < $5::bigint THEN c.input_schema END AS input_schema, NULL::jsonb AS output_schema,
	timeout_ms, retry_preset, max_attempts, initial_delay_ms, multiplier, max_delay_ms, jitter_percent, status,
	created_at
FROM (
    SELECT c.*, row_number() OVER w AS n,
           coalesce(sum(c.cost) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
    FROM (SELECT t.*, $6::bigint + octet_length(replace(t.input_schema::text, ' ', '')) / $7::bigint AS cost
          FROM tool_contracts t
          WHERE t.workspace_id = $1::text AND t.name = $2::text AND t.contract_version < $3::int
            AND t.status <> 'FORBIDDEN'
          ORDER BY t.contract_version DESC LIMIT least($4::bigint, greatest($5::bigint, 0) / $6::bigint + 1)) c
    WINDOW w AS (ORDER BY c.contract_version DESC)
) c
WHERE c.n = 1 OR c.before < $5::bigint
ORDER BY contract_version DESC`

// sqlOutputSchema is the output schema a SUCCEEDED report is checked
// against (none for a job without a contract).
const sqlOutputSchema = `SELECT c.output_schema FROM tool_contracts c
WHERE c.workspace_id = $1::text AND c.name = $2::text AND c.contract_version = $3::int`

// sqlInsertSyntheticRun inserts a synthetic run whose completion is not yet
// requested: an enqueue refuses a run whose completion was requested, so
// TestTool requests it once the step is in, in the same transaction.
const sqlInsertSyntheticRun = `
INSERT INTO job_runs (id, workspace_id, name, status, synthetic, created_at, keyed_step_keys)
VALUES ($1::text, $2::text, $3::text, 'RUNNING', true, $4::timestamptz, true)`

// sqlReplayPreview reads what a replay decides on; sqlReplayLock reads it
// under the job's row lock (a replay, a report, a cancel and a claim of one
// job are serialised by it). Waiting for that lock, it re-reads the job's
// row alone: the endpoint's paused flag and the dependency's status stay
// as of the statement's start. Neither needs more. paused only answers the
// preview (a paused endpoint holds the QUEUED job at the claim). A stale
// dependency status either refuses (the dependency ended meanwhile: the
// refusal the replay would get ordered before that ending, the job then
// not replayable yet), or admits beside a dependency replayed meanwhile:
// the state the two replays leave in the other order, this one first, as
// a dependency's replay leaves its released dependents as they are. A
// transaction holding the job's row that takes the dependency back (its
// replay unskipping the job) leaves the job WAITING, refused on its own
// re-read status. The last column says the job's handler version is
// forbidden: it has contracts and none ACTIVE (the rule an enqueue without
// contractVersion follows, migration 0048; a job with a contract has an
// ACTIVE one, contracts being immutable). A publication is seen as of the
// statement's start: one committed while it waited for the lock is not,
// as it would not be had it committed just after the replay. The run's
// synthetic flag (set at its insert, never changed) says the step is a
// tool test's. The last three columns are the job's lease and whether its
// dependency is on its last attempt, and that one's lease: the replay's
// lock sees whether either lapsed while it waited (replayJob.lapsedBy).
const sqlReplayPreview = `
SELECT j.id, j.run_id, j.name, j.version, j.contract_version, j.status, j.attempt, j.max_attempts,
       coalesce(j.policy_max_attempts, j.max_attempts), j.input_sealed, e.paused,
       (SELECT d.status FROM jobs d WHERE d.step_id = j.after_step_id), j.after_status,
       (SELECT coalesce(bool_and(c.status = 'FORBIDDEN'), false) FROM tool_contracts c
        WHERE c.workspace_id = j.workspace_id AND c.name = j.name AND c.handler_version = j.version),
       (SELECT r.synthetic FROM job_runs r WHERE r.id = j.run_id), j.lease_expires_at,
       (SELECT d.attempt >= d.max_attempts FROM jobs d WHERE d.step_id = j.after_step_id),
       (SELECT d.lease_expires_at FROM jobs d WHERE d.step_id = j.after_step_id)
FROM jobs j JOIN job_endpoints e ON e.id = j.endpoint_id
WHERE j.step_id = $1::text AND j.workspace_id = $2::text`

const sqlReplayLock = sqlReplayPreview + `
FOR UPDATE OF j`

// A replay sets the job's token to ” (no lease, and unlike a requeue's
// NULL, no lapsed attempt to take back: see requeuedFor).

// replayDue is when a job replayed at $3 is due: at once, unless it holds
// a cancelled attempt (slot_attempt) whose lease (lease_expires_at, never
// extended after the cancel) has not expired. No claim takes it while that
// attempt may still run (migration 0060), so it is due when that lease
// expires, or when the attempt reports first (sqlAdjustSlots brings it back
// to the report's time). Left due at once, such jobs sat at the head of the
// claim index (ready_at order) and every claim of their name@version read
// and passed over each of them until their leases expired: 20 000 of them,
// after a mass cancel and replay, made each claim read 20 000 rows (replay
// QA).
const replayDue = `CASE WHEN slot_attempt IS NOT NULL AND lease_expires_at > $3::timestamptz
    THEN lease_expires_at ELSE $3::timestamptz END`

// sqlReplaySameVersion re-queues an ended job with a higher lifetime
// ceiling, keeping its handler version, contract and policy snapshot (the
// policy's own count is pinned before the ceiling moves), due at replayDue.
const sqlReplaySameVersion = `
UPDATE jobs SET status = 'QUEUED', max_attempts = $2::int, lease_token = '',
    policy_max_attempts = coalesce(policy_max_attempts, max_attempts),
    due_at = ` + replayDue + `, ready_at = ` + replayDue + `, finished_at = NULL, cancel_requested = false,
    updated_at = $3::timestamptz
WHERE id = $1::text`

// sqlReplayUpgrade re-queues an ended job under the target contract: its
// handler version, contract version, timeout and complete retry policy;
// due at replayDue (the held attempt's lease is the old timeout's).
const sqlReplayUpgrade = `
UPDATE jobs SET status = 'QUEUED', max_attempts = $2::int, lease_token = '', due_at = ` + replayDue + `,
    ready_at = ` + replayDue + `, finished_at = NULL, cancel_requested = false, updated_at = $3::timestamptz,
    version = $4::text, contract_version = $5::int, timeout_ms = $6::bigint, policy_preset = $7::text,
    policy_max_attempts = $8::int, initial_delay_ms = $9::bigint, multiplier = $10::float8,
    max_delay_ms = $11::bigint, jitter_percent = $12::float8
WHERE id = $1::text`

// sqlReopenRun takes a FAILED run back to RUNNING when no other step of it
// is EXHAUSTED or CANCELLED (otherwise the run stays FAILED: the other step
// still decides it). The caller holds the run's exclusive lock.
const sqlReopenRun = `
UPDATE job_runs r SET status = 'RUNNING', finished_at = NULL, reopened = r.reopened + 1
WHERE r.id = $1::text AND r.status = 'FAILED'
  AND NOT EXISTS (SELECT 1 FROM jobs WHERE run_id = r.id AND step_id <> $2::text
                  AND status IN ('EXHAUSTED', 'CANCELLED'))
RETURNING r.status`

// sqlUnskipDependents puts back to WAITING the steps that the replayed
// step's end skipped (they waited for the other outcome), and the steps
// their skip skipped in turn: each waits again for the replay's outcome,
// and is queued or skipped when it comes. Steps that the end released have
// run (or are queued) and stay as they are. $1 the replayed step (or, run
// again by unskip, the steps the last run put back), $2 now; it answers
// the steps it put back.
const sqlUnskipDependents = `
WITH RECURSIVE skipped AS (
    SELECT j.id, j.step_id FROM jobs j WHERE j.after_step_id = ANY($1::text[]) AND j.status = 'SKIPPED'
  UNION
    SELECT j.id, j.step_id FROM jobs j JOIN skipped s ON j.after_step_id = s.step_id WHERE j.status = 'SKIPPED'
)
UPDATE jobs j SET status = 'WAITING', finished_at = NULL, updated_at = $2::timestamptz
FROM skipped WHERE j.id = skipped.id AND j.status = 'SKIPPED'
RETURNING j.step_id`

const sqlInsertReplay = `
INSERT INTO job_replays (id, workspace_id, job_id, step_id, key_id, reason, prior_status, prior_attempt,
                         additional_attempts, max_attempts, old_handler_version, new_handler_version,
                         old_contract_version, new_contract_version, created_at)
VALUES ($1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $8::int, $9::int, $10::int,
        $11::text, $12::text, $13::int, $14::int, $15::timestamptz)`

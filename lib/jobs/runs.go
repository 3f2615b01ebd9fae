package jobs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/canonjson"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/money"
	"github.com/getratchet/ratchet/lib/redact"
	"github.com/getratchet/ratchet/lib/seal"
	"github.com/getratchet/ratchet/lib/toolname"
)

// noSuchDependency answers an afterStepId that is no step of the run:
// unknown, another workspace's or another run's alike, and whatever its
// form (API.md §0: an unknown id is 404, never a hint; contract QA).
func noSuchDependency() *apierr.Error {
	return apierr.New(http.StatusNotFound, apierr.CodeNotFound, "No such step in this run (afterStepId).")
}

// RunSummary is a run without its steps, as GET /api/v1/runs lists it.
type RunSummary struct {
	ID                  string     `json:"id"`
	Name                string     `json:"name"`
	Status              string     `json:"status" openapi:"enum=RUNNING|SUCCEEDED|FAILED"`
	CompletionRequested bool       `json:"completionRequested"`
	CreatedAt           time.Time  `json:"createdAt"`
	FinishedAt          *time.Time `json:"finishedAt"`
	Synthetic           bool       `json:"synthetic"` // made by POST /tools/{name}/test
	// BudgetMicros is the run's own wallet for the effects begun under it
	// (run_id), nil for none; SpentMicros what they were granted and did
	// not give back (failed), nil without a wallet.
	BudgetMicros *int64 `json:"budgetMicros"`
	SpentMicros  *int64 `json:"spentMicros"`
	// IdempotencyKey is the key the run was started under, nil for none.
	IdempotencyKey *string `json:"idempotencyKey"`
}

// Run is a group of steps that completes as a whole (API.md §5): the run's
// own fields and its steps.
type Run struct {
	RunSummary
	Steps []Step `json:"steps" openapi:"notNull"` // [] for none (stepsPage)
	// StepsTruncated says Steps holds only the run's first steps: its
	// first 1000, or fewer when they would take the answer past
	// answer.Budget (the API cuts it there): GET /api/v1/runs/{id}/steps
	// pages all of them.
	StepsTruncated bool `json:"stepsTruncated" jsonschema:"true when steps holds only the run's first steps: its first 1000, fewer when they would take the answer past about 4 MB; GET /api/v1/runs/{id}/steps pages them all"`
	// Deduplicated answers POST /api/v1/runs only: true when the key
	// already named this run (200), false for a new one (201).
	Deduplicated *bool `json:"deduplicated,omitempty"`
}

// Step is one enqueued operation and its durable job.
type Step struct {
	ID              string     `json:"id"`
	RunID           string     `json:"runId"`
	Name            string     `json:"name"`
	Version         string     `json:"version"`
	Endpoint        string     `json:"endpoint"`
	Status          string     `json:"status" openapi:"enum=WAITING|QUEUED|RUNNING|RETRY_SCHEDULED|SUCCEEDED|EXHAUSTED|CANCELLED|SKIPPED"`
	IdempotencyKey  string     `json:"idempotencyKey"`
	AfterStepID     *string    `json:"afterStepId"`
	AfterStatus     *string    `json:"afterStatus" openapi:"enum=SUCCEEDED|FAILED"`
	ContractVersion *int       `json:"contractVersion"`
	InputPreview    any        `json:"inputPreview"`
	OutputPreview   any        `json:"outputPreview"`
	CreatedAt       time.Time  `json:"createdAt"`
	FinishedAt      *time.Time `json:"finishedAt"`
	DurableJob      DurableJob `json:"durableJob"`
}

// DurableJob is a step's job: its status, attempts and policy snapshot.
type DurableJob struct {
	ID              string         `json:"id"`
	Status          string         `json:"status" openapi:"enum=WAITING|QUEUED|RUNNING|RETRY_SCHEDULED|SUCCEEDED|EXHAUSTED|CANCELLED|SKIPPED"`
	Attempt         int            `json:"attempt"`
	MaxAttempts     int            `json:"maxAttempts"`
	DueAt           *time.Time     `json:"dueAt" jsonschema:"when a QUEUED or RETRY_SCHEDULED job is due: no claim takes it before. A step replayed while its cancelled attempt may still run is due at that attempt's lease expiry (leaseExpiresAt), or at its report if that comes first. Null in every other status: WAITING, RUNNING (a lapsed attempt's job is claimable again from its leaseExpiresAt) and once ended"`
	LeaseExpiresAt  *time.Time     `json:"leaseExpiresAt"`
	CancelRequested bool           `json:"cancelRequested"`
	PolicyVersion   int64          `json:"policyVersion"`
	Policy          PolicySnapshot `json:"policy"`
	// Attempts are the job's executions in attempt order: its last
	// StepAttemptsShown (AttemptsTruncated says earlier ones are left out).
	Attempts []Attempt `json:"attempts" openapi:"notNull"` // [] before the first (attachAttempts)
	// AttemptsTruncated says Attempts holds only the job's last
	// StepAttemptsShown attempts: replays add attempts without end, and a
	// step answered with all of them could pass what one answer holds
	// (answer.Budget). GET /api/v1/steps/{id}/attempts pages them all.
	AttemptsTruncated bool `json:"attemptsTruncated" jsonschema:"true when attempts holds only the job's last 50 attempts (replays add attempts without end); GET /api/v1/steps/{id}/attempts pages them all; false otherwise"`
	// Replays is the job's replay audit, oldest first: who replayed it,
	// why, and what the replay changed; its last StepReplaysShown.
	Replays []Replay `json:"replays" openapi:"notNull"` // [] for none (replaysJSON)
	// ReplaysTruncated says Replays holds only the job's last
	// StepReplaysShown replays; GET /api/v1/steps/{id}/replays pages them
	// all.
	ReplaysTruncated bool `json:"replaysTruncated" jsonschema:"true when replays holds only the job's last 50 replays; GET /api/v1/steps/{id}/replays pages them all; false otherwise"`
}

// StepAttemptsShown and StepReplaysShown bound the attempts and replays a
// step is answered with (its last ones): a job takes any number of replays,
// each adding up to 10 attempts, and an attempt holds up to two messages of
// 2 000 characters, so one step could pass what one answer holds
// (answer.Budget) alone, in a run's read, a page of steps or its own read
// (size QA). At most these, a step answers about 1.6 MB at worst (its test).
const (
	StepAttemptsShown = 50
	StepReplaysShown  = 50
)

// Replay is one replay of a job (POST /api/v1/steps/{id}/replay): the key
// that made it, its reason, the status and attempt it found, the attempts it
// added, the job's ceiling after it, and the handler and contract versions
// before and after.
type Replay struct {
	ID                 string    `json:"id"`
	KeyID              string    `json:"keyId"`
	Reason             *string   `json:"reason"`
	PriorStatus        string    `json:"priorStatus" openapi:"enum=EXHAUSTED|CANCELLED"` // only those are replayed
	PriorAttempt       int       `json:"priorAttempt"`
	AdditionalAttempts int       `json:"additionalAttempts"`
	MaxAttempts        int       `json:"maxAttempts"`
	OldHandlerVersion  string    `json:"oldHandlerVersion"`
	NewHandlerVersion  string    `json:"newHandlerVersion"`
	OldContractVersion *int      `json:"oldContractVersion"`
	NewContractVersion *int      `json:"newContractVersion"`
	CreatedAt          time.Time `json:"createdAt"`
}

// Attempt is one execution of a job (one claim). A lease that lapsed without
// a report reads outcome FAILED with a warning and no reportedAt.
type Attempt struct {
	Attempt      int     `json:"attempt"`
	WorkerID     string  `json:"workerId"`
	Outcome      *string `json:"outcome" openapi:"enum=SUCCEEDED|FAILED"`
	Warning      *string `json:"warning"`
	Retryable    *bool   `json:"retryable" jsonschema:"a failure's retry decision: true when its worker reported none (it is then retried), false for a non-retryable failure or a rejected output; null for a success or an attempt that was not reported"`
	RetryAfterMs *int64  `json:"retryAfterMs"`
	// ErrorMessage is the message the worker reported with a failure (the
	// SDK bounds and redacts it before sending; the server masks it again,
	// ratchet.RedactText), or a rejected output's reason; sealed at rest,
	// opened for readers of the run.
	ErrorMessage *string `json:"errorMessage"`
	// ErrorMessageUnreadable says the attempt has an error message this
	// instance cannot open (sealed with a key missing from its
	// RESULT_ENCRYPTION_KEY / RESULT_ENCRYPTION_KEYS): errorMessage reads
	// null, and the rest of the read answers as ever (seal QA: one such
	// message failed a whole run's read, or a page of attempts, with 500).
	ErrorMessageUnreadable bool       `json:"errorMessageUnreadable" jsonschema:"true when the attempt has an error message this server cannot decrypt (sealed with an encryption key it is not configured with): errorMessage is then null; false otherwise"`
	StartedAt              time.Time  `json:"startedAt"`
	LeaseExpiresAt         time.Time  `json:"leaseExpiresAt"`
	ReportedAt             *time.Time `json:"reportedAt"`
}

// PolicySnapshot is the complete effective policy a job was enqueued with;
// maxAttempts includes an enqueue override.
type PolicySnapshot struct {
	RetryPolicy
	TimeoutMs int64 `json:"timeoutMs"`
}

// CreateRunRequest is the body of POST /api/v1/runs.
type CreateRunRequest struct {
	Name         string `json:"name" openapi:"minLength=1,maxLength=200"`
	BudgetMicros *int64 `json:"budgetMicros,omitempty" openapi:"min=0,max=1000000000000000000"`
	// IdempotencyKey makes the start safe to retry: the same key and the
	// same name and budget answer the run it started (deduplicated), another
	// name or budget is 409 idempotency_key_reuse. Unique per workspace
	// among the runs kept (JOB_RETENTION_DAYS).
	IdempotencyKey *string `json:"idempotencyKey,omitempty" openapi:"minLength=1,maxLength=255,printable"`
}

// EnqueueRequest is the body of POST /api/v1/runs/{id}/steps.
type EnqueueRequest struct {
	Name            string          `json:"name" openapi:"minLength=1,maxLength=200,toolname"`
	Version         string          `json:"version" openapi:"minLength=1,maxLength=100,toolname"`
	Input           json.RawMessage `json:"input,omitempty"`
	Endpoint        *string         `json:"endpoint,omitempty" openapi:"minLength=1,maxLength=200,printable"` // validEndpointName, as POST /endpoints states it
	IdempotencyKey  *string         `json:"idempotencyKey,omitempty" openapi:"minLength=1,maxLength=255,printable"`
	TimeoutMs       *int64          `json:"timeoutMs,omitempty" openapi:"min=1000,max=86400000"`
	MaxAttempts     *int64          `json:"maxAttempts,omitempty" openapi:"min=1,max=10"`
	ContractVersion *int64          `json:"contractVersion,omitempty" openapi:"min=1"`
	AfterStepID     *string         `json:"afterStepId,omitempty"`
	AfterStatus     *string         `json:"afterStatus,omitempty" openapi:"enum=SUCCEEDED|FAILED"`
	// DelayMs makes the step due this long after the enqueue (0 to 30 days)
	// instead of at once; not with afterStepId.
	DelayMs *int64 `json:"delayMs,omitempty" openapi:"min=0,max=2592000000"`
}

// EnqueueResult answers an enqueue (201, or 200 when deduplicated).
type EnqueueResult struct {
	StepID         string     `json:"stepId"`
	JobID          string     `json:"jobId"`
	IdempotencyKey string     `json:"idempotencyKey"`
	Status         string     `json:"status" openapi:"enum=WAITING|QUEUED|RUNNING|RETRY_SCHEDULED|SUCCEEDED|EXHAUSTED|CANCELLED|SKIPPED"`
	DueAt          *time.Time `json:"dueAt"`
	Deduplicated   bool       `json:"deduplicated"`

	contractVersion *int64 // the contract selected for a new step
}

func scanStep(row pgx.Row) (Step, error) {
	var st Step
	var cv *int32
	var inPrev, outPrev, replays []byte
	j := &st.DurableJob
	err := row.Scan(&st.ID, &j.ID, &st.Name, &st.Version, &st.Endpoint, &j.Status, &st.IdempotencyKey, &st.AfterStepID,
		&st.AfterStatus, &cv, &j.Attempt, &j.MaxAttempts, &j.DueAt, &j.LeaseExpiresAt, &j.CancelRequested,
		&j.Policy.Preset, &j.Policy.InitialDelayMs, &j.Policy.Multiplier, &j.Policy.MaxDelayMs,
		&j.Policy.JitterPercent, &j.Policy.TimeoutMs, &j.PolicyVersion, &inPrev, &outPrev, &st.CreatedAt,
		&st.FinishedAt, &st.RunID, &j.Policy.MaxAttempts, &replays)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(replays, &j.Replays); err != nil {
		return st, fmt.Errorf("step replays: %w", err)
	}
	if len(j.Replays) > StepReplaysShown { // read with one more (replaysJSON)
		j.Replays, j.ReplaysTruncated = j.Replays[len(j.Replays)-StepReplaysShown:], true
	}
	st.Status = j.Status
	st.ContractVersion = intPtr(cv)
	st.InputPreview = rawOrNil(inPrev)
	st.OutputPreview = rawOrNil(outPrev)
	return st, nil
}

func rawOrNil(b []byte) any {
	if b == nil {
		return nil
	}
	return json.RawMessage(b)
}

// CreateRun starts a run.
func (s *Service) CreateRun(ctx context.Context, workspaceID string, req CreateRunRequest) (Run, error) {
	var p apierr.Problems
	name := strings.TrimSpace(req.Name)
	if name == "" || utf8.RuneCountInString(name) > 200 {
		p.Add("name", "must be 1-200 characters")
	}
	if req.BudgetMicros != nil && !money.Valid(*req.BudgetMicros) {
		p.Add("budgetMicros", money.Rule)
	}
	if req.IdempotencyKey != nil && !idemkey.Valid(*req.IdempotencyKey) {
		p.Add("idempotencyKey", idemkey.Rule)
	}
	if err := p.Err(); err != nil {
		return Run{}, err
	}
	now := s.now()
	fresh := false
	r := Run{RunSummary: RunSummary{ID: ids.NewAt(ids.Run, now), Name: name, Status: RunRunning, CreatedAt: now,
		BudgetMicros: req.BudgetMicros, IdempotencyKey: req.IdempotencyKey}, Steps: []Step{}, Deduplicated: &fresh}
	if req.BudgetMicros != nil {
		var zero int64
		r.SpentMicros = &zero
	}
	if req.IdempotencyKey == nil {
		if _, err := db.Writer(ctx, s.pool).Exec(ctx, sqlInsertRun, r.ID, workspaceID, r.Name, now, req.BudgetMicros); err != nil {
			return Run{}, fmt.Errorf("create run: %w", err)
		}
		return r, nil
	}
	hash, err := canonjson.Hash(map[string]any{"name": name, "budgetMicros": req.BudgetMicros})
	if err != nil {
		return Run{}, fmt.Errorf("create run: %w", err)
	}
	// Twice at most: a run the key named may be deleted (retention) between
	// the insert that met it and the reads.
	inRequest := db.InRequest(ctx)
	for range 2 {
		if inRequest {
			// Under an Idempotency-Key (db.BeginRequest) the insert begins
			// the request's transaction, which would then hold the read of
			// the run the key names (GetRun settles lapsed leases, in
			// transactions of their own, not the request's): read first,
			// outside it, while it has not begun.
			existing, found, err := s.runOfKey(db.OutsideRequest(ctx), workspaceID, *req.IdempotencyKey, hash)
			if found || err != nil {
				return existing, err
			}
		}
		tag, err := db.Writer(ctx, s.pool).Exec(ctx, sqlInsertKeyedRun, r.ID, workspaceID, r.Name, now, req.BudgetMicros,
			*req.IdempotencyKey, hash)
		if err != nil {
			return Run{}, fmt.Errorf("create run: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return r, nil
		}
		if inRequest {
			break // started since the read above: the retry, its transaction not begun, reads it
		}
		existing, found, err := s.runOfKey(ctx, workspaceID, *req.IdempotencyKey, hash)
		if found || err != nil {
			return existing, err
		}
	}
	return Run{}, apierr.Conflict(apierr.CodeRetryRequest, "The run this key named changed concurrently; retry at once.")
}

// runOfKey is the run workspaceID started under idempotency key key,
// deduplicated (found), when there is one; 409 idempotency_key_reuse when
// it was started with another name or budget (hash, not its).
func (s *Service) runOfKey(ctx context.Context, workspaceID, key, hash string) (Run, bool, error) {
	var id, started string
	err := db.Conn(ctx, s.pool).QueryRow(ctx, sqlRunByKey, workspaceID, key).Scan(&id, &started)
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, false, nil
	}
	if err != nil {
		return Run{}, false, fmt.Errorf("create run: read by key: %w", err)
	}
	if started != hash {
		return Run{}, false, apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
			"This idempotency key started a run with another name or budget.")
	}
	existing, err := s.GetRun(ctx, workspaceID, id)
	if e, ok := apierr.As(err); ok && e.Code == apierr.CodeNotFound {
		return Run{}, false, nil // deleted since the read: start it afresh
	}
	if err != nil {
		return Run{}, false, err
	}
	dup := true
	existing.Deduplicated = &dup
	return existing, true, nil
}

// runStepsMax bounds the steps GET /api/v1/runs/{id} returns: a run may
// hold any number, and reading them all into one answer cost memory and
// time in proportion (security review: a million steps would be hundreds of
// MB). Beyond it the read says stepsTruncated, and ListSteps pages the rest.
const runStepsMax = 1000

// GetRun reads a run with its first runStepsMax steps (in id order), the
// run and its steps from one snapshot. Leases that lapsed on their last
// attempt are settled first (settleLapsed), so the read does not show a dead
// job as RUNNING, nor the run RUNNING beside its EXHAUSTED step (race QA:
// concurrent reads at a lapse answered both).
func (s *Service) GetRun(ctx context.Context, workspaceID, runID string) (Run, error) {
	return readSettled(ctx, s, func() (Run, error) { return s.readRunAndSteps(ctx, workspaceID, runID) },
		func(r Run) (string, []string, bool) {
			// A FAILED run's other steps go on (seed 000: a failed run
			// does not cancel them), so they lapse too (QA: a run read
			// left them RUNNING once the run had failed).
			lapsed := lapsedJobs(r.Steps, s.now())
			unseen := r.StepsTruncated && r.Status != RunSucceeded // steps past the page may have lapsed
			return runID, lapsed, len(lapsed) > 0 || unseen
		})
}

// readSettled answers read, settling lapsed last attempts first: while
// what it read shows some (lapsed gives their run, their jobs, and whether
// to settle at all), it settles them (settleLapsed) and reads again, at
// most settleRounds times.
func readSettled[T any](ctx context.Context, s *Service, read func() (T, error),
	lapsed func(T) (runID string, jobIDs []string, settle bool)) (T, error) {
	v, err := read()
	for round := 0; err == nil && round < settleRounds; round++ {
		runID, jobIDs, settle := lapsed(v)
		if !settle {
			break
		}
		again, serr := s.settleLapsed(ctx, runID, jobIDs)
		if serr != nil {
			var zero T
			return zero, serr
		}
		if !again {
			break
		}
		v, err = read()
	}
	return v, err
}

// settleRounds bounds how many times a read settles lapsed last attempts
// and reads again.
const settleRounds = 2

// lapseWait bounds how long a read waits for another transaction holding a
// lapsed job (settling it, or reporting it) before it answers what it read.
const lapseWait = 2 * time.Second

// settleLapsed ends run runID's jobs whose lease lapsed on their last
// attempt, lapsed being those of them the read saw. When it ended none of
// those, another read, the sweeper or a report holds them (its lock made
// ours skip them, SKIP LOCKED), and it waits for that transaction to end,
// for at most lapseWait in all, however many jobs are held (a lock_timeout
// bounded each lock, so a read waited lapseWait for each held job). It
// reports whether reading again may show more.
func (s *Service) settleLapsed(ctx context.Context, runID string, lapsed []string) (bool, error) {
	n, err := s.exhaustLapsed(ctx, &runID, 1000)
	if err != nil || n > 0 || len(lapsed) == 0 {
		return n > 0, err
	}
	// In a transaction of its own, never a request's (where the lock
	// timeout and the share locks would last until the request commits).
	ctx = db.OutsideRequest(ctx)
	err = db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLapseWaitTimeout, fmt.Sprintf("%dms", lapseWait.Milliseconds())); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlAwaitJobLocks, lapsed)
		return err
	})
	if db.HasCode(err, db.CodeLockNotAvailable) || (db.HasCode(err, db.CodeQueryCanceled) && ctx.Err() == nil) {
		// Still held after lapseWait (or a lock_timeout set for the role
		// cut the wait): answer what was read.
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("await settling: %w", err)
	}
	return true, nil
}

// lapsedJobs lists the jobs of steps whose lease lapsed by now on their
// last attempt.
func lapsedJobs(steps []Step, now time.Time) []string {
	var ids []string
	for i := range steps {
		if j := &steps[i].DurableJob; j.lapsedOnLastAttempt(now) {
			ids = append(ids, j.ID)
		}
	}
	return ids
}

// readRunAndSteps reads a run and its first runStepsMax steps with their
// attempts, all from one snapshot.
func (s *Service) readRunAndSteps(ctx context.Context, workspaceID, runID string) (Run, error) {
	var r Run
	err := db.Snapshot(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if r, err = s.readRun(ctx, tx, workspaceID, runID); err != nil {
			return err
		}
		if r.Steps, err = s.stepsPage(ctx, tx, runID, "", "", runStepsMax+1); err != nil {
			return err
		}
		if len(r.Steps) > runStepsMax {
			r.Steps, r.StepsTruncated = r.Steps[:runStepsMax], true
		}
		return nil
	})
	if err != nil {
		return Run{}, err
	}
	return r, nil
}

// lapsedOnLastAttempt says whether j's lease lapsed by now on its last
// attempt: a read ends it (exhaustLapsed).
func (j *DurableJob) lapsedOnLastAttempt(now time.Time) bool {
	return j.Status == StatusRunning && j.Attempt >= j.MaxAttempts && j.LeaseExpiresAt != nil &&
		!j.LeaseExpiresAt.After(now)
}

// ListRuns pages the workspace's runs newest first, optionally only those
// in one status. cursor is the previous page's last run id.
func (s *Service) ListRuns(ctx context.Context, workspaceID, status, cursor string, limit int) ([]RunSummary, error) {
	if status != "" && status != RunRunning && status != RunSucceeded && status != RunFailed {
		return nil, apierr.InvalidField("status", "must be RUNNING, SUCCEEDED or FAILED")
	}
	// Settle the workspace's leases that lapsed on a last attempt first, as
	// a run's read does: the list must not show RUNNING a run the read
	// answers FAILED.
	if _, err := s.exhaustLapsedIn(ctx, nil, &workspaceID, 1000, s.now); err != nil {
		return nil, err
	}
	sql, args := db.NewestFirst(sqlListRuns, "workspace_id", []any{workspaceID}, cursor, "status", status, limit)
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunSummary, error) { return scanRun(row) })
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	if out == nil {
		out = []RunSummary{}
	}
	return out, nil
}

// StatusRule is what a step list's ?status= must be.
const StatusRule = "must be a job status (WAITING, QUEUED, RUNNING, RETRY_SCHEDULED, SUCCEEDED, EXHAUSTED, " +
	"CANCELLED or SKIPPED)"

// ListSteps pages a run's steps in id order, each with its durable job and
// attempts, optionally only those in one status. cursor is the previous
// page's last step id. A run with many steps is read a page at a time here;
// GET /api/v1/runs/{id} returns the first runStepsMax.
func (s *Service) ListSteps(ctx context.Context, workspaceID, runID, status, cursor string, limit int) ([]Step, error) {
	if status != "" && !validStatus(status) {
		return nil, apierr.InvalidField("status", "%s", StatusRule)
	}
	r, err := s.readRun(ctx, s.pool, workspaceID, runID) // the workspace's run, or 404
	if err != nil {
		return nil, err
	}
	return readSettled(ctx, s, func() ([]Step, error) { return s.stepsPage(ctx, s.pool, runID, status, cursor, limit) },
		func(steps []Step) (string, []string, bool) {
			// Lapsed jobs off this page (another page, another status
			// filter) are settled too, unless the run has succeeded.
			lapsed := lapsedJobs(steps, s.now())
			return runID, lapsed, len(lapsed) > 0 || r.Status != RunSucceeded
		})
}

// stepsPage reads up to limit of a run's steps after cursor in id order,
// optionally only those in one status, each with its attempts.
func (s *Service) stepsPage(ctx context.Context, q db.Querier, runID, status, cursor string, limit int) ([]Step, error) {
	rows, err := q.Query(ctx, sqlRunStepsPage, runID, cursor, status, limit)
	if err != nil {
		return nil, fmt.Errorf("run steps: %w", err)
	}
	steps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Step, error) { return scanStep(row) })
	if err != nil {
		return nil, fmt.Errorf("run steps: %w", err)
	}
	if steps == nil {
		return []Step{}, nil
	}
	if err := s.attachAttempts(ctx, q, steps); err != nil {
		return nil, err
	}
	return steps, nil
}

// attachAttempts reads the last StepAttemptsShown executions of steps'
// jobs, in attempt order, into their durable jobs, and says
// AttemptsTruncated of those that have more.
func (s *Service) attachAttempts(ctx context.Context, q db.Querier, steps []Step) error {
	jobIDs := make([]string, len(steps))
	byJob := make(map[string]*DurableJob, len(steps))
	for i := range steps {
		j := &steps[i].DurableJob
		j.Attempts = []Attempt{}
		jobIDs[i], byJob[j.ID] = j.ID, j
	}
	rows, err := q.Query(ctx, sqlJobsAttempts, jobIDs, StepAttemptsShown+1)
	if err != nil {
		return fmt.Errorf("attempts: %w", err)
	}
	defer rows.Close()
	var unreadable unreadableMessages
	for rows.Next() {
		var (
			jobID string
			a     Attempt
			read  attemptRow
		)
		if err := rows.Scan(read.dest(&jobID, &a)...); err != nil {
			return fmt.Errorf("attempts: %w", err)
		}
		s.openAttempt(jobID, &a, read, &unreadable)
		if j := byJob[jobID]; j != nil {
			j.Attempts = append(j.Attempts, a)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("attempts: %w", err)
	}
	unreadable.log(s.logger)
	for _, j := range byJob {
		if len(j.Attempts) > StepAttemptsShown { // read with one more
			j.Attempts, j.AttemptsTruncated = j.Attempts[len(j.Attempts)-StepAttemptsShown:], true
		}
	}
	return nil
}

// attemptRow holds what a row of attemptColumns has beyond an Attempt's
// fields: its error message, sealed.
type attemptRow struct{ sealed []byte }

// dest is the scan destinations of attemptColumns, into jobID and a, the
// sealed message into r, followed by more for the columns after them.
func (r *attemptRow) dest(jobID *string, a *Attempt, more ...any) []any {
	return append([]any{jobID, &a.Attempt, &a.WorkerID, &a.Outcome, &a.Warning, &a.Retryable, &a.RetryAfterMs,
		&a.StartedAt, &a.LeaseExpiresAt, &a.ReportedAt, &r.sealed}, more...)
}

// openAttempt opens the error message of job jobID's attempt a read with r.
// One it cannot open reads as unreadable (Attempt.ErrorMessageUnreadable)
// and is noted in u, which the read logs once.
func (s *Service) openAttempt(jobID string, a *Attempt, r attemptRow, u *unreadableMessages) {
	if r.sealed == nil {
		return
	}
	msg, err := s.sealer.Open(r.sealed, seal.AAD(jobID, fmt.Sprintf("error/%d", a.Attempt)))
	if err != nil {
		a.ErrorMessageUnreadable = true
		u.note(jobID, a.Attempt, r.sealed, err)
		return
	}
	m := string(msg)
	a.ErrorMessage = &m
}

// unreadableMessages gathers the error messages one read cannot open, to
// log them in one line: by their number, the first one's job, attempt and
// key id, and why (never the value).
type unreadableMessages struct {
	n       int
	jobID   string
	attempt int
	keyID   string
	err     error
}

func (u *unreadableMessages) note(jobID string, attempt int, sealed []byte, err error) {
	if u.n == 0 {
		u.jobID, u.attempt, u.keyID, u.err = jobID, attempt, seal.KeyIDOf(sealed), err
	}
	u.n++
}

func (u *unreadableMessages) log(logger *slog.Logger) {
	if u.n == 0 {
		return
	}
	logger.Warn("attempts' error messages this instance cannot open read as errorMessageUnreadable",
		"count", u.n, "job_id", u.jobID, "attempt", u.attempt, "key_id", u.keyID, "error", u.err)
}

// scanRun reads a row of runColumns.
func scanRun(row pgx.Row) (RunSummary, error) {
	var r RunSummary
	err := row.Scan(&r.ID, &r.Name, &r.Status, &r.CompletionRequested, &r.CreatedAt, &r.FinishedAt, &r.Synthetic,
		&r.BudgetMicros, &r.IdempotencyKey, &r.SpentMicros)
	return r, err
}

func (s *Service) readRun(ctx context.Context, q db.Querier, workspaceID, runID string) (Run, error) {
	sum, err := scanRun(q.QueryRow(ctx, sqlGetRun, runID, workspaceID))
	r := Run{RunSummary: sum}
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, apierr.NotFound("run")
	}
	if err != nil {
		return Run{}, fmt.Errorf("get run: %w", err)
	}
	return r, nil
}

// FinishRun requests completion: the run ends as soon as its steps decide it.
func (s *Service) FinishRun(ctx context.Context, workspaceID, runID string) (Run, error) {
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		// The run key is taken only for a run of this workspace (see
		// sqlRunOfWorkspaceLockExclusive), in the statement that checks it.
		var locked string
		if err := tx.QueryRow(ctx, sqlRunOfWorkspaceLockExclusive, runID, workspaceID).Scan(&locked); errors.Is(err, pgx.ErrNoRows) {
			return apierr.NotFound("run")
		} else if err != nil {
			return fmt.Errorf("lock run: %w", err)
		}
		var id string
		if err := tx.QueryRow(ctx, sqlRequestCompletion, runID, workspaceID).Scan(&id); errors.Is(err, pgx.ErrNoRows) {
			return apierr.NotFound("run")
		} else if err != nil {
			return fmt.Errorf("finish run: %w", err)
		}
		_, err := s.settleRun(ctx, tx, runID)
		return err
	})
	if err != nil {
		return Run{}, err
	}
	return s.GetRun(ctx, workspaceID, runID)
}

// enqueueOp is the validated operation of an enqueue.
type enqueueOp struct {
	runID, name, version, endpoint string
	input                          []byte // as sent, compacted: what is validated, stored and claimed
	canon                          []byte // canonical JSON: what the key and fingerprint hash
	key                            string
	// identity is what a generated key hashes (canonical JSON); nil when
	// the producer named the key. key is then its plain hash, which runs
	// started before migration 0031 keep (see keyedStepKey).
	identity []byte
	// head is the canonical JSON array of what the identity and every
	// fingerprint begin with (run, tool, handler version, contract version,
	// effective endpoint, dependency, canonical input), left open: each of
	// them is head, its own elements and the delay, encoded once (see
	// hashed).
	head []byte
	// delay is the canonical {"delayMs":N} both end with, nil without a
	// delay: every hash of an enqueue without one is what it was before
	// delays existed, so keys and retries from before the upgrade still
	// match.
	delay                    []byte
	timeoutMs, maxAttempts   *int64
	contractVersion          *int64
	afterStepID, afterStatus *string
	delayMs                  *int64 // set only when above 0
}

func (req EnqueueRequest) validate(runID string) (enqueueOp, error) {
	var p apierr.Problems
	op := enqueueOp{runID: runID, name: req.Name, version: req.Version, timeoutMs: req.TimeoutMs,
		maxAttempts: req.MaxAttempts, contractVersion: req.ContractVersion, afterStepID: req.AfterStepID,
		afterStatus: req.AfterStatus}
	if !toolname.ValidName(req.Name) {
		p.Add("name", toolname.NameRule)
	}
	if !toolname.ValidVersion(req.Version) {
		p.Add("version", toolname.VersionRule)
	}
	op.endpoint = req.Name
	if req.Endpoint != nil {
		op.endpoint = *req.Endpoint
		if !validEndpointName(op.endpoint) {
			p.Add("endpoint", endpointNameRule)
		}
	}
	raw := req.Input
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("null")
	}
	canon, err := canonjson.Marshal(raw)
	if err != nil {
		p.Add("input", "must be JSON")
	}
	op.canon = canon
	op.input = storedInput(raw, canon)
	if k := req.IdempotencyKey; k != nil && !idemkey.Valid(*k) {
		p.Add("idempotencyKey", idemkey.Rule)
	}
	if t := req.TimeoutMs; t != nil && (*t < MinTimeoutMs || *t > MaxTimeoutMs) {
		p.Add("timeoutMs", "%s", apierr.IntegerRule(MinTimeoutMs, MaxTimeoutMs))
	}
	if m := req.MaxAttempts; m != nil && (*m < MinAttempts || *m > MaxAttemptsLimit) {
		p.Add("maxAttempts", "%s", apierr.IntegerRule(MinAttempts, MaxAttemptsLimit))
	}
	if c := req.ContractVersion; c != nil && *c < 1 {
		p.Add("contractVersion", "%s", apierr.IntegerRule(1, typeMax))
	} else if c != nil && *c > math.MaxInt32 {
		p.Add("contractVersion", noContractNumbered, req.Name, *c)
	}
	if d := req.DelayMs; d != nil {
		switch {
		case *d < 0 || *d > MaxEnqueueDelayMs:
			p.Add("delayMs", "%s", apierr.IntegerRule(0, MaxEnqueueDelayMs))
		case *d > 0 && req.AfterStepID != nil:
			p.Add("delayMs", "cannot be combined with afterStepId: a dependent step is due when its dependency ends")
		case *d > 0:
			op.delayMs = d
		}
	}
	// afterStatus's own rule holds whether or not afterStepId came with it:
	// each rule a body breaks is listed (QA: "DONE" without afterStepId was
	// answered with the missing afterStepId alone).
	if s := req.AfterStatus; s != nil && *s != StatusSucceeded && *s != "FAILED" {
		p.Add("afterStatus", "must be SUCCEEDED or FAILED")
	}
	switch {
	case req.AfterStepID == nil && req.AfterStatus != nil:
		p.Add("afterStepId", "is required with afterStatus")
	case req.AfterStepID != nil && req.AfterStatus == nil:
		p.Add("afterStatus", "is required with afterStepId (SUCCEEDED or FAILED)")
	case req.AfterStepID != nil && *req.AfterStepID == "":
		p.Add("afterStepId", "must be the id of a step of this run")
	}
	if err := p.Err(); err != nil {
		return op, err
	}
	if req.AfterStepID != nil {
		// One that cannot be a step's id names no step: looked up as such
		// an id (ids.Lookup), it is answered as one is, after the run's own
		// checks.
		id := ids.Lookup(ids.Step, *req.AfterStepID)
		op.afterStepID = &id
	}
	head, err := canonjson.Marshal([]any{runID, op.name, op.version, op.contractVersion, op.endpoint, op.afterStepID,
		op.afterStatus, canonjson.Canonical(op.canon)})
	if err != nil {
		return op, apierr.InvalidField("input", "must be JSON")
	}
	op.head = head[:len(head)-1] // open: "[" and the elements
	if op.delayMs != nil {
		op.delay, _ = canonjson.Marshal(map[string]any{"delayMs": *op.delayMs})
	}
	if req.IdempotencyKey != nil {
		op.key = *req.IdempotencyKey
	} else {
		// The generated key hashes the operation's identity (seed 000):
		// run, tool, handler version, contract version, effective endpoint,
		// dependency and canonical input; and a delay, if any (a step sent
		// now and the same one in a day are two steps).
		op.identity = op.hashed(nil)
		sum := sha256.Sum256(op.identity)
		op.key = hex.EncodeToString(sum[:])
	}
	return op, nil
}

// storedInput is the input a job keeps: the producer's JSON as sent, only
// compacted. The canonical form is for hashing alone: it reads numbers as
// JavaScript does (float64), so storing it would hand a worker
// 18446744073709552000 for 18446744073709551615 and fail a schema that
// the input meets. Input with invalid UTF-8 is stored canonical, with its
// bad bytes replaced, as it always was.
func storedInput(raw, canon []byte) []byte {
	var buf bytes.Buffer
	if !utf8.Valid(raw) || json.Compact(&buf, raw) != nil {
		return canon
	}
	return buf.Bytes()
}

// fingerprint identifies the whole operation, so a repeated key with a
// different operation is told apart from a duplicate.
// It is the identity's elements, then timeout, attempts and key, then the
// delay.
func (op enqueueOp) fingerprint() []byte {
	more, _ := canonjson.Marshal([]any{op.timeoutMs, op.maxAttempts, op.key})
	return op.hashed(more)
}

// hashed is the canonical JSON array of the identity's elements (op.head),
// those of the canonical array more (none when nil), and the delay if
// any: canonjson.Marshal of the one []any of them all, byte for byte, as
// the hashes stored so far were made, without encoding the shared
// elements again for each hash (an enqueue without a key hashes three such
// arrays).
func (op enqueueOp) hashed(more []byte) []byte {
	b := make([]byte, 0, len(op.head)+len(more)+len(op.delay)+2)
	b = append(b, op.head...)
	if len(more) > 2 { // "[]" adds nothing
		b = append(append(b, ','), more[1:len(more)-1]...)
	}
	if op.delay != nil {
		b = append(append(b, ','), op.delay...)
	}
	return append(b, ']')
}

// Enqueue adds a step to a run. A known key with the same operation answers
// the existing step (deduplicated); with another operation it is 409.
func (s *Service) Enqueue(ctx context.Context, workspaceID, runID string, req EnqueueRequest) (EnqueueResult, error) {
	return s.enqueueChecked(ctx, workspaceID, nil, runID, req)
}

// EnqueueAs is Enqueue for the key that asks: its statement enqueues only
// while the key is not revoked (401 otherwise), so a key revoked on one
// instance enqueues nothing on another whose cache still holds it, as it
// begins and claims nothing (a runaway producer's jobs would be run).
func (s *Service) EnqueueAs(ctx context.Context, p *auth.Principal, runID string, req EnqueueRequest) (EnqueueResult, error) {
	return s.enqueueChecked(ctx, p.WorkspaceID, &p.KeyID, runID, req)
}

func (s *Service) enqueueChecked(ctx context.Context, workspaceID string, keyID *string, runID string,
	req EnqueueRequest) (EnqueueResult, error) {
	op, err := req.validate(runID)
	if err != nil {
		return EnqueueResult{}, err
	}
	res, err := s.enqueue(ctx, s.pool, workspaceID, keyID, op)
	if err == nil && res.Status == StatusQueued && !res.Deduplicated && op.delayMs == nil {
		s.wake.wakeOne(workspaceID, toolKey(op.name, op.version)) // the enqueue is its own transaction: committed
	}
	return res, err
}

// enqueue calls jobs_enqueue (sqlEnqueue) until it decides. The common
// enqueue, whose endpoint exists and to which no contract applies, is that
// one call: on the pool it is its own transaction, so one round trip. What
// stays in Go costs a call more each: a contract is checked and the input
// validated against its inputSchema (checkContract), a missing endpoint is
// created (endpointForEnqueue), and the function is called again, which
// checks everything again. Inside a transaction (q is a pgx.Tx) the calls
// run in it. With keyID, each call acts only while that key is not revoked.
func (s *Service) enqueue(ctx context.Context, q db.Querier, workspaceID string, keyID *string,
	op enqueueOp) (EnqueueResult, error) {
	now := s.now()
	jobID, stepID := ids.NewAt(ids.Job, now), ids.NewAt(ids.Step, now)
	hash, keyedKey, keyedHash := s.enqueueHashes(op)
	sealed, preview := s.sealer.Seal(op.input, seal.AAD(jobID, "input")), string(redact.PreviewJSON(op.input))
	contract, checked := op.contractVersion, false
	var notBefore *time.Time
	if op.delayMs != nil {
		t := now.Add(time.Duration(*op.delayMs) * time.Millisecond)
		notBefore = &t
	}
	// The contract, the endpoint, then the decision: three calls at most
	// (a checked contract is not selected again, and endpoints are never
	// deleted).
	for range 3 {
		// The answer is read into pgtype values rather than pointers: pgx
		// plans a pointer's scan afresh for every row, a few allocations a
		// column. One struct, so one allocation for them all.
		var row struct {
			outcome                  string
			step, job, status, taken pgtype.Text // step, job and status set with inserted and existing
			due                      pgtype.Timestamptz
			stored                   []byte
			cv                       pgtype.Int4
		}
		err := q.QueryRow(ctx, sqlEnqueue, workspaceID, op.runID, op.key, hash, op.name, op.version, op.endpoint,
			op.afterStepID, op.afterStatus, contract, checked, op.maxAttempts, op.timeoutMs, jobID, stepID, sealed,
			preview, now, notBefore, keyedKey, keyedHash, keyID).Scan(&row.outcome, &row.step, &row.job, &row.status,
			&row.due, &row.stored, &row.cv, &row.taken)
		if err != nil {
			return EnqueueResult{}, fmt.Errorf("enqueue: %w", err)
		}
		if keyedKey != nil && row.taken.Valid && row.taken.String == *keyedKey {
			op.key, hash = *keyedKey, keyedHash // the run's generated keys are keyed (migration 0031)
		}
		var due *time.Time
		if row.due.Valid {
			due = &row.due.Time
		}
		var cv *int32
		if row.cv.Valid {
			cv = &row.cv.Int32
		}
		switch row.outcome {
		case "inserted":
			if due != nil {
				// The clock's reading, before Postgres rounded it to microseconds.
				t := now
				due = &t
				if notBefore != nil {
					due = notBefore
				}
			}
			return EnqueueResult{StepID: row.step.String, JobID: row.job.String, IdempotencyKey: op.key,
				Status: row.status.String, DueAt: due, contractVersion: int64Ptr(cv)}, nil
		case "existing":
			return dedupe(op, hash, row.step.String, row.job.String, row.status.String, due, row.stored)
		case "revoked":
			return EnqueueResult{}, auth.ErrRevokedKey() // revoked since this instance cached it
		case "not_found":
			return EnqueueResult{}, apierr.NotFound("run")
		case "ended":
			return EnqueueResult{}, apierr.InvalidState("The run's completion was requested; it takes no new steps.")
		case "dependency":
			return EnqueueResult{}, noSuchDependency()
		case "endpoint":
			if _, err := s.endpointForEnqueue(ctx, q, workspaceID, op.endpoint); err != nil {
				return EnqueueResult{}, fmt.Errorf("enqueue endpoint: %w", err)
			}
		case "contract":
			c, err := s.checkContract(ctx, q, workspaceID, op, int64(*cv))
			if err != nil {
				return EnqueueResult{}, err
			}
			v := int64(c.ContractVersion)
			contract, checked = &v, true
		default:
			return EnqueueResult{}, fmt.Errorf("enqueue: unknown outcome %q", row.outcome)
		}
	}
	return EnqueueResult{}, errors.New("enqueue: undecided after three calls")
}

// enqueueHashes is what an enqueue's statement matches a step by: the
// operation's request hash (the keyed hash of its fingerprint) and, for a
// generated key, its keyed form with that form's request hash (nil for a
// key the producer named).
func (s *Service) enqueueHashes(op enqueueOp) (hash []byte, keyedKey *string, keyedHash []byte) {
	hash = s.mac(op.fingerprint())
	if op.identity != nil {
		keyed := op
		keyed.key = s.keyedStepKey(op.identity)
		keyedKey, keyedHash = &keyed.key, s.mac(keyed.fingerprint())
	}
	return hash, keyedKey, keyedHash
}

// keyedStepKey is the key the service generates for a step of a run
// started since migration 0031: the operation's identity under the
// service's keyed hash, so that the key, shown to producers, workers and
// the services they pass it to, gives away nothing of a sealed input
// (security review: a plain hash of parts the step's read shows, and the
// input, let a guessed input be confirmed offline).
func (s *Service) keyedStepKey(identity []byte) string {
	return hex.EncodeToString(s.mac([]byte("ratchet step key\n"), identity))
}

func int64Ptr(v *int32) *int64 {
	if v == nil {
		return nil
	}
	i := int64(*v)
	return &i
}

// dedupe answers an enqueue whose key a step holds already: that step,
// when the operation is the same, else idempotency_key_reuse.
func dedupe(op enqueueOp, hash []byte, stepID, jobID, status string, due *time.Time, stored []byte) (EnqueueResult, error) {
	if !bytes.Equal(hash, stored) {
		if op.identity != nil {
			// The producer sent no key: the one generated from the step's
			// identity leaves out its settings (QA: told of "this
			// idempotency key", a producer that sent none was lost).
			return EnqueueResult{}, apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
				"This run already has this step (the same name, version, contract, endpoint, dependency, delay and "+
					"input, hence the same generated idempotency key) enqueued with other settings (timeoutMs or "+
					"maxAttempts). Send the same settings to get that step, or an idempotencyKey of your own for "+
					"another step.")
		}
		return EnqueueResult{}, apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
			"This idempotency key was used for a different operation in this workspace.")
	}
	if status == StatusRunning {
		due = nil // as the step's read shows it (pendingDue)
	}
	return EnqueueResult{StepID: stepID, JobID: jobID, IdempotencyKey: op.key, Status: status, DueAt: due,
		Deduplicated: true}, nil
}

func ended(status string) bool {
	switch status {
	case StatusSucceeded, StatusExhausted, StatusCancelled, StatusSkipped:
		return true
	}
	return false
}

// GetStep reads one step with its attempts, from one snapshot. A lease that
// lapsed on the last attempt ends the job at read (settleLapsed).
func (s *Service) GetStep(ctx context.Context, workspaceID, stepID string) (Step, error) {
	return readSettled(ctx, s, func() (Step, error) { return s.readStep(ctx, workspaceID, stepID) }, s.stepLapsed)
}

// stepLapsed is readSettled's lapsed for a step's read.
func (s *Service) stepLapsed(st Step) (string, []string, bool) {
	if !st.DurableJob.lapsedOnLastAttempt(s.now()) {
		return "", nil, false
	}
	return st.RunID, []string{st.DurableJob.ID}, true
}

// settledStep reads a step without its attempts, its lease settled first
// when it lapsed on its last attempt, as GetStep reads it.
func (s *Service) settledStep(ctx context.Context, workspaceID, stepID string) (Step, error) {
	return readSettled(ctx, s, func() (Step, error) {
		st, err := scanStep(s.pool.QueryRow(ctx, sqlStepByID, stepID, workspaceID))
		if errors.Is(err, pgx.ErrNoRows) {
			return Step{}, apierr.NotFound("step")
		}
		if err != nil {
			return Step{}, fmt.Errorf("read step: %w", err)
		}
		return st, nil
	}, s.stepLapsed)
}

// ListStepAttempts pages a step's attempts in attempt order, after attempt
// number after (0 for the first page), limit at most: every one of them,
// where the step's reads answer its last StepAttemptsShown.
func (s *Service) ListStepAttempts(ctx context.Context, workspaceID, stepID string, after, limit int) ([]Attempt, error) {
	if _, err := s.settledStep(ctx, workspaceID, stepID); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, sqlStepAttemptsPage, stepID, workspaceID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("step attempts: %w", err)
	}
	var unreadable unreadableMessages
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attempt, error) {
		var (
			jobID string
			a     Attempt
			read  attemptRow
		)
		if err := row.Scan(read.dest(&jobID, &a)...); err != nil {
			return a, err
		}
		s.openAttempt(jobID, &a, read, &unreadable)
		return a, nil
	})
	if err != nil {
		return nil, fmt.Errorf("step attempts: %w", err)
	}
	unreadable.log(s.logger)
	if out == nil {
		out = []Attempt{}
	}
	return out, nil
}

// AttemptCursor is where a page of a step's attempts ends: its last
// attempt's number.
func AttemptCursor(a Attempt) string { return strconv.Itoa(a.Attempt) }

// ParseAttemptCursor reads an AttemptCursor (ok false for anything else).
func ParseAttemptCursor(cursor string) (after int, ok bool) {
	n, ok := cursorNumber(cursor, 1, math.MaxInt32) // the column's integer
	return int(n), ok
}

// cursorNumber reads a cursor's number from min to max as the API writes
// it, in decimal without sign or leading zeros: each page has one cursor,
// so "007" or "+7" is no cursor from this API but a mistyped one.
func cursorNumber(s string, min, max int64) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= min && n <= max && strconv.FormatInt(n, 10) == s
}

// ListStepReplays pages a step's replays oldest first, after replay id
// cursor ("" for the first page), limit at most: every one of them, where
// the step's reads answer its last StepReplaysShown.
func (s *Service) ListStepReplays(ctx context.Context, workspaceID, stepID, cursor string, limit int) ([]Replay, error) {
	rows, err := s.pool.Query(ctx, sqlStepReplaysPage, stepID, workspaceID, cursor, limit)
	if err != nil {
		return nil, fmt.Errorf("step replays: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Replay, error) {
		var (
			doc []byte
			r   Replay
		)
		if err := row.Scan(&doc); err != nil {
			return r, err
		}
		return r, json.Unmarshal(doc, &r)
	})
	if err != nil {
		return nil, fmt.Errorf("step replays: %w", err)
	}
	if len(out) > 0 {
		return out, nil
	}
	// An empty page: the step's last, or no step of the workspace, or a
	// cursor naming none of the step's replays (another step's), which
	// the page reads after nothing: it answered an empty last page, and a
	// walk handed the wrong cursor ended there, its replays unread (QA).
	var exists, known bool
	if err := s.pool.QueryRow(ctx, sqlStepReplayCursor, stepID, workspaceID, cursor).Scan(&exists, &known); err != nil {
		return nil, fmt.Errorf("step replays: %w", err)
	}
	if !exists {
		return nil, apierr.NotFound("step")
	}
	if !known {
		return nil, apierr.InvalidField("cursor", "is not a cursor from this API")
	}
	return []Replay{}, nil
}

// ValidReplayCursor says whether cursor is a replay's id, as a page of a
// step's replays ends with.
func ValidReplayCursor(cursor string) bool { return ids.Valid(replayIDPrefix, cursor) }

// readStep reads a step and its attempts from one snapshot.
func (s *Service) readStep(ctx context.Context, workspaceID, stepID string) (Step, error) {
	var st Step
	err := db.Snapshot(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		st, err = scanStep(tx.QueryRow(ctx, sqlStepByID, stepID, workspaceID))
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.NotFound("step")
		}
		if err != nil {
			return err
		}
		steps := []Step{st}
		if err := s.attachAttempts(ctx, tx, steps); err != nil {
			return err
		}
		st = steps[0]
		return nil
	})
	if err != nil {
		return Step{}, err
	}
	return st, nil
}

// CancelStep cancels a step that has not ended. A RUNNING job is cancelled at
// once and its worker learns it from its next heartbeat; its report is still
// recorded on the execution. A job whose last attempt's lease lapsed has
// ended: it is ended EXHAUSTED first, as a read of the step ends it, and the
// cancel refused so (jobs QA: with no read before it, the cancel made it
// CANCELLED, and the step.exhausted saying its side effect may have
// happened never went out). Like a replay's, that end commits on its own,
// never under the request's transaction (see Replay). The cancel decides at
// the clock reading it records, once it holds the job: a lease that lapsed
// while it waited for the job (or its endpoint) is ended so too, and looked
// at again (QA: the look before the lock saw the lease held, and the
// cancel, granted the row after the expiry, made the lapsed job CANCELLED
// without its step.exhausted).
func (s *Service) CancelStep(ctx context.Context, workspaceID, stepID string) (Step, error) {
	look := db.OutsideRequest(ctx)
	for round := 0; ; round++ {
		if _, err := s.settledStep(look, workspaceID, stepID); err != nil {
			return Step{}, err
		}
		err := s.txRetrying(ctx, func(tx pgx.Tx) error {
			return s.cancelLocked(ctx, tx, workspaceID, stepID, round < lapseLooks)
		})
		if errors.Is(err, errLapsedMeanwhile) {
			// The request's transaction, if any, has begun by now (its
			// savepoint rolled back, holding nothing): the next look
			// still commits on its own.
			look = db.AfterRequest(ctx)
			continue
		}
		if err != nil {
			return Step{}, err
		}
		return s.GetStep(ctx, workspaceID, stepID)
	}
}

// lapseLooks bounds how many times a cancel or a replay looks again at a
// step whose last lease lapsed while it waited for the job (each look ends
// it, unless another transaction holds it for lapseWait, twice): past them
// it decides on the job as it stands, as before that check.
const lapseLooks = 2

// errLapsedMeanwhile: a last attempt's lease had lapsed by the time a
// cancel or a replay held the job (cancelLocked, replayLocked).
var errLapsedMeanwhile = errors.New("jobs: a last attempt's lease lapsed while the request waited for its job")

// cancelLocked cancels step stepID inside tx, once it holds its job.
// refuseLapsed: a job whose last attempt's lease has lapsed by then is
// errLapsedMeanwhile, to be ended first.
func (s *Service) cancelLocked(ctx context.Context, tx pgx.Tx, workspaceID, stepID string, refuseLapsed bool) error {
	var jobID, status, runID, endpointID string
	var attempt, maxAttempts int
	var leaseExpiresAt *time.Time
	err := tx.QueryRow(ctx, sqlCancelLock, stepID, workspaceID).Scan(nil, &jobID, &status, &runID, &attempt, &endpointID,
		&maxAttempts, &leaseExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.NotFound("step")
	}
	if err != nil {
		return fmt.Errorf("cancel lock: %w", err)
	}
	if status == StatusCancelled {
		return nil // cancelling twice answers the cancelled step, so a retried cancel is safe
	}
	if ended(status) {
		return apierr.InvalidState("The step already ended (%s).", status)
	}
	now := s.now()
	lapsed := (&DurableJob{Status: status, Attempt: attempt, MaxAttempts: maxAttempts, LeaseExpiresAt: leaseExpiresAt}).
		lapsedOnLastAttempt(now)
	if refuseLapsed && lapsed {
		return errLapsedMeanwhile
	}
	if _, err := tx.Exec(ctx, sqlCancel, jobID, now, status == StatusRunning); err != nil {
		return fmt.Errorf("cancel: %w", err)
	}
	return s.afterEnded(ctx, tx, []endedStep{{stepID: stepID, runID: runID, workspaceID: workspaceID,
		jobID: jobID, status: StatusCancelled, attempt: attempt}})
}

// endedStep is a step that just reached an ending status.
type endedStep struct {
	stepID, runID, workspaceID, jobID, status string
	attempt                                   int
	// lapsed: its last attempt's lease lapsed unreported, so its side
	// effect may have happened (step.exhausted says so).
	lapsed bool
}

func scanEnded(rows pgx.Rows) ([]endedStep, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (endedStep, error) {
		var e endedStep
		err := r.Scan(&e.stepID, &e.runID, &e.workspaceID, &e.jobID, &e.status, &e.attempt)
		return e, err
	})
}

// afterEnded makes the transitions a step's ending causes, inside the
// caller's transaction: step.exhausted events, dependents released (and the
// cascade of skips), and completion of the affected runs. The ended steps'
// runs are locked shared before their dependents' rows (the lock order,
// see sqlRunLockShared).
func (s *Service) afterEnded(ctx context.Context, tx pgx.Tx, done []endedStep) error {
	held := map[string]bool{}
	for _, e := range done {
		if e.runID != "" {
			held[e.runID] = true
		}
	}
	for _, runID := range slices.Sorted(maps.Keys(held)) {
		if _, err := tx.Exec(ctx, sqlRunLockShared, runID); err != nil {
			return fmt.Errorf("lock run: %w", err)
		}
	}
	runs, _, err := s.release(ctx, tx, done, true)
	if err != nil {
		return err
	}
	return s.settleTouched(ctx, tx, runs, held)
}

// settleTouched checks the completion of the runs a release touched, in id
// order. held are the runs whose shared lock the caller holds already.
func (s *Service) settleTouched(ctx context.Context, tx pgx.Tx, runs, held map[string]bool) error {
	for _, runID := range slices.Sorted(maps.Keys(runs)) {
		if err := s.lockAndSettle(ctx, tx, runID, !held[runID]); err != nil {
			return err
		}
	}
	return nil
}

// queuedJob is a job a release queued: its workspace and exact tool
// (toolKey), for a wake once the release commits.
type queuedJob struct{ workspaceID, tool string }

// release records step.exhausted events and, when dependents may exist,
// releases them with the whole cascade of skips (sqlReleaseDependents). It
// returns the runs touched and the jobs it queued.
func (s *Service) release(ctx context.Context, tx pgx.Tx, done []endedStep, dependents bool) (map[string]bool, []queuedJob, error) {
	runs := map[string]bool{}
	var queued []queuedJob
	var events []event
	stepIDs := make([]string, 0, len(done))
	for _, e := range done {
		if e.runID != "" {
			runs[e.runID] = true
		}
		stepIDs = append(stepIDs, e.stepID)
		if e.status == StatusExhausted {
			// step.exhausted says whether its step is a tool test's
			// (synthetic), as run.finished does, so a receiver paging on it
			// can tell: its record reads the run's (syntheticRun).
			events = append(events, event{workspaceID: e.workspaceID, typ: EventStepExhausted, subject: e.stepID,
				data: fmt.Sprintf(`{"jobId":%q,"runId":%q,"attempt":%d,"leaseLapsed":%t,"synthetic":false}`,
					e.jobID, e.runID, e.attempt, e.lapsed),
				dedupe: strconv.Itoa(e.attempt), syntheticRun: e.runID})
		}
	}
	// One statement decides the whole cascade from its snapshot; a step an
	// enqueue added below a skipped one while it ran (the enqueue held that
	// step's row, and committed before the statement could update it) is
	// not in that snapshot, so the newly skipped steps are released again
	// until none is left (review: the per-level loop this replaced caught
	// it, one statement per level).
	for frontier := stepIDs; dependents && len(frontier) > 0; {
		rows, err := tx.Query(ctx, sqlReleaseDependents, frontier, s.now())
		if err != nil {
			return nil, nil, fmt.Errorf("release dependents: %w", err)
		}
		released, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (releasedStep, error) {
			var e releasedStep
			err := r.Scan(&e.stepID, &e.runID, &e.workspaceID, &e.status, &e.name, &e.version)
			return e, err
		})
		if err != nil {
			return nil, nil, fmt.Errorf("release dependents: %w", err)
		}
		frontier = nil
		for _, r := range released {
			runs[r.runID] = true
			switch r.status {
			case StatusSkipped:
				frontier = append(frontier, r.stepID)
			case StatusQueued:
				queued = append(queued, queuedJob{workspaceID: r.workspaceID, tool: toolKey(r.name, r.version)})
			}
		}
	}
	return runs, queued, s.recordEvents(ctx, tx, events)
}

// releasedStep is a row sqlReleaseDependents moved.
type releasedStep struct{ stepID, runID, workspaceID, status, name, version string }

// lockAndSettle checks a run's completion under the run locks (see sql.go).
// shared says the caller does not hold the run's shared lock yet.
func (s *Service) lockAndSettle(ctx context.Context, tx pgx.Tx, runID string, shared bool) error {
	if shared {
		if _, err := tx.Exec(ctx, sqlRunLockShared, runID); err != nil {
			return fmt.Errorf("lock run: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, sqlRunSettleExclusive, runID); err != nil {
		return fmt.Errorf("lock run: %w", err)
	}
	_, err := s.settleRun(ctx, tx, runID)
	return err
}

// settleRun finishes the run if its steps decide it (sqlSettleRun), and
// answers whether this call finished it.
func (s *Service) settleRun(ctx context.Context, tx pgx.Tx, runID string) (bool, error) {
	var n int
	if err := tx.QueryRow(ctx, sqlSettleRun, runID, s.now(), ids.NewAt(ids.Event, s.now())).Scan(&n); err != nil {
		return false, fmt.Errorf("settle run: %w", err)
	}
	return n > 0, nil
}

// event is an outbox row recordEvents writes; id is made there unless
// given (a key made of it: trippedEvent). syntheticRun, when set, is the
// run whose being synthetic data's synthetic (written false) says
// (sqlInsertEvents reads it).
type event struct {
	id, workspaceID, typ, subject, data, dedupe string
	syntheticRun                                string
}

func (s *Service) recordEvents(ctx context.Context, q db.Querier, events []event) error {
	if len(events) == 0 {
		return nil
	}
	n := len(events)
	idv, ws, typ, sub, data, dd, run := make([]string, n), make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n)
	now := s.now()
	for i, e := range events {
		idv[i], ws[i], typ[i], sub[i], data[i], dd[i], run[i] = e.id, e.workspaceID, e.typ, e.subject, e.data, e.dedupe,
			e.syntheticRun
		if e.id == "" {
			idv[i] = ids.NewAt(ids.Event, now)
		}
	}
	if _, err := q.Exec(ctx, sqlInsertEvents, idv, ws, typ, sub, data, now, dd, run); err != nil {
		return fmt.Errorf("record events: %w", err)
	}
	return nil
}

package ratchet

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Run statuses.
const (
	RunRunning   = "RUNNING"
	RunSucceeded = "SUCCEEDED"
	RunFailed    = "FAILED"
)

// Job (and step) statuses.
const (
	JobWaiting        = "WAITING"
	JobQueued         = "QUEUED"
	JobRunning        = "RUNNING"
	JobRetryScheduled = "RETRY_SCHEDULED"
	JobSucceeded      = "SUCCEEDED"
	JobExhausted      = "EXHAUSTED"
	JobCancelled      = "CANCELLED"
	JobSkipped        = "SKIPPED"
)

// Run is a durable run with its steps (GET /api/v1/runs/{id}).
type Run struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Status is RunRunning, RunSucceeded or RunFailed. A run fails as soon
	// as one of its steps is exhausted, and that cancels none of its other
	// steps: a FAILED run's other steps may still be queued or running
	// (a failure branch, a retry), so wait for the steps you need, not for
	// the run's status to leave RUNNING.
	Status string `json:"status"`
	// CompletionRequested is set by FinishRun; the run ends once its steps do.
	CompletionRequested bool       `json:"completionRequested"`
	CreatedAt           time.Time  `json:"createdAt"`
	FinishedAt          *time.Time `json:"finishedAt"`
	// Synthetic is true for a run TestTool made for a synthetic test job.
	Synthetic bool `json:"synthetic"`
	// BudgetMicros is the run's wallet for the effects begun with its id
	// (WithBudgetMicros), nil for none; SpentMicros what they spent of it.
	BudgetMicros *int64 `json:"budgetMicros"`
	SpentMicros  *int64 `json:"spentMicros"`
	// IdempotencyKey is the key the run was started under (WithIdempotencyKey).
	IdempotencyKey *string `json:"idempotencyKey"`
	Steps          []Step  `json:"steps"`
	// StepsTruncated says Steps holds only the run's first steps: 1000, or
	// fewer when more would take the answer past about 4 MB
	// (GetRun); ListRunSteps pages all of them.
	StepsTruncated bool `json:"stepsTruncated"`
	// Deduplicated is set by StartRun: the key had started this run already.
	Deduplicated bool `json:"deduplicated,omitempty"`
}

// Step is one step of a run. Its Status equals DurableJob.Status.
type Step struct {
	ID      string `json:"id"`
	RunID   string `json:"runId"`
	Name    string `json:"name"`
	Version string `json:"version"`
	// Endpoint is the endpoint's name.
	Endpoint       string `json:"endpoint"`
	Status         string `json:"status"`
	IdempotencyKey string `json:"idempotencyKey"`
	// AfterStepID and AfterStatus (AfterSucceeded or AfterFailed) are the
	// step's dependency, if any.
	AfterStepID     *string `json:"afterStepId"`
	AfterStatus     *string `json:"afterStatus"`
	ContractVersion *int    `json:"contractVersion"`
	// InputPreview and OutputPreview are redacted previews (shape only).
	InputPreview  json.RawMessage `json:"inputPreview"`
	OutputPreview json.RawMessage `json:"outputPreview"`
	// CreatedAt is never nil (a pointer, kept so code that reads it compiles).
	CreatedAt  *time.Time `json:"createdAt"`
	FinishedAt *time.Time `json:"finishedAt"`
	DurableJob DurableJob `json:"durableJob"`
}

// DurableJob is the job behind a step.
type DurableJob struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	// Attempt is the number of executions so far; MaxAttempts the ceiling.
	Attempt     int `json:"attempt"`
	MaxAttempts int `json:"maxAttempts"`
	// DueAt is when a QUEUED or RETRY_SCHEDULED job may next be claimed;
	// nil while WAITING or RUNNING and once the job ended.
	DueAt           *time.Time `json:"dueAt"`
	LeaseExpiresAt  *time.Time `json:"leaseExpiresAt"`
	CancelRequested bool       `json:"cancelRequested"`
	// PolicyVersion is the version of the endpoint policy Policy was
	// snapshotted from (0 when none was set).
	PolicyVersion int64       `json:"policyVersion"`
	Policy        RetryPolicy `json:"policy"`
	// Attempts are the job's executions, oldest first: its last 50.
	Attempts []JobAttempt `json:"attempts"`
	// AttemptsTruncated says Attempts holds only the job's last 50
	// executions (replays add attempts without end, and one answer holds
	// about 4 MB): ListStepAttempts pages all of them.
	AttemptsTruncated bool `json:"attemptsTruncated"`
	// Replays are the job's replays, oldest first: its last 50.
	Replays []JobReplay `json:"replays"`
	// ReplaysTruncated says Replays holds only the job's last 50 replays:
	// ListStepReplays pages all of them.
	ReplaysTruncated bool `json:"replaysTruncated"`
}

// JobReplay is one replay of a durable job: who made it, why, what it
// found and what it changed.
type JobReplay struct {
	ID     string  `json:"id"`
	KeyID  string  `json:"keyId"`
	Reason *string `json:"reason"`
	// PriorStatus and PriorAttempt are the job's status and last attempt
	// when it was replayed; AdditionalAttempts what the replay added, and
	// MaxAttempts the job's lifetime ceiling after it.
	PriorStatus        string `json:"priorStatus"`
	PriorAttempt       int    `json:"priorAttempt"`
	AdditionalAttempts int    `json:"additionalAttempts"`
	MaxAttempts        int    `json:"maxAttempts"`
	// The handler and contract versions before and after (equal for a
	// same-version replay; contract versions nil without a contract).
	OldHandlerVersion  string    `json:"oldHandlerVersion"`
	NewHandlerVersion  string    `json:"newHandlerVersion"`
	OldContractVersion *int      `json:"oldContractVersion"`
	NewContractVersion *int      `json:"newContractVersion"`
	CreatedAt          time.Time `json:"createdAt"`
}

// JobAttempt is one execution of a durable job.
type JobAttempt struct {
	Attempt  int    `json:"attempt"`
	WorkerID string `json:"workerId"`
	// Outcome is ReportSucceeded or ReportFailed once known; nil while it
	// runs.
	Outcome      *string `json:"outcome"`
	Retryable    *bool   `json:"retryable"`
	RetryAfterMs *int64  `json:"retryAfterMs"`
	// ErrorMessage is the message the worker reported with a failure.
	ErrorMessage *string `json:"errorMessage"`
	// ErrorMessageUnreadable is true when the server cannot decrypt the
	// attempt's message (sealed with an encryption key it is no longer
	// configured with); ErrorMessage is then nil.
	ErrorMessageUnreadable bool `json:"errorMessageUnreadable"`
	// Warning explains a failure the server recorded itself (a lapsed lease,
	// a rejected output).
	Warning        *string    `json:"warning"`
	StartedAt      time.Time  `json:"startedAt"`
	LeaseExpiresAt time.Time  `json:"leaseExpiresAt"`
	ReportedAt     *time.Time `json:"reportedAt"`
}

// RetryPolicy is a job's snapshot of its retry schedule: after failure n the
// wait is min(MaxDelayMs, InitialDelayMs × Multiplier^(n-1)) ± JitterPercent.
type RetryPolicy struct {
	Preset         string  `json:"preset"` // a RetryPreset* constant
	MaxAttempts    int     `json:"maxAttempts"`
	InitialDelayMs int64   `json:"initialDelayMs"`
	Multiplier     float64 `json:"multiplier"`
	MaxDelayMs     int64   `json:"maxDelayMs"`
	JitterPercent  float64 `json:"jitterPercent"`
	TimeoutMs      int64   `json:"timeoutMs"`
}

// RunOption configures StartRun.
type RunOption func(*startRun)

type startRun struct {
	Name           string  `json:"name"`
	BudgetMicros   *int64  `json:"budgetMicros,omitempty"`
	IdempotencyKey *string `json:"idempotencyKey,omitempty"`
}

// WithIdempotencyKey starts the run under key (1-255 printable characters,
// unique per workspace among the runs kept): starting it again with the same
// name and budget, from this process or another, answers the run the key
// started (Run.Deduplicated); another name or budget under the key is 409
// idempotency_key_reuse. Derive it from the work ("onboarding:user_123"), as
// a Temporal workflow id.
func WithIdempotencyKey(key string) RunOption {
	return func(r *startRun) { r.IdempotencyKey = &key }
}

// WithBudgetMicros gives the run its own wallet: effects begun with the
// run's id (BeginRequest.RunID) may spend at most micros in all, beyond
// which a begin is denied run_budget_exceeded.
func WithBudgetMicros(micros int64) RunOption {
	return func(r *startRun) { r.BudgetMicros = &micros }
}

// StartRun creates a run (POST /api/v1/runs), retried after an ambiguous
// failure under an Idempotency-Key of its own, made once per call
// (callKeyed): a retry after a lost answer is answered the run the first
// attempt started, never a second run. WithIdempotencyKey's body key, besides,
// makes a start from another process (or a later call) find the same run.
func (c *Client) StartRun(ctx context.Context, name string, opts ...RunOption) (*Run, error) {
	req := startRun{Name: name}
	for _, o := range opts {
		o(&req)
	}
	return callKeyed[Run](ctx, c, "POST", "/runs", "", req)
}

// GetRun reads a run with its steps.
func (c *Client) GetRun(ctx context.Context, runID string) (*Run, error) {
	var run Run
	if err := c.do(ctx, "GET", "/runs/"+pathID(runID), nil, &run, idempotent); err != nil {
		return nil, err
	}
	return &run, nil
}

// RunSummary is a run without its steps, as ListRuns pages them.
type RunSummary struct {
	ID                  string     `json:"id"`
	Name                string     `json:"name"`
	Status              string     `json:"status"` // RunRunning, RunSucceeded or RunFailed
	CompletionRequested bool       `json:"completionRequested"`
	CreatedAt           time.Time  `json:"createdAt"`
	FinishedAt          *time.Time `json:"finishedAt"`
	Synthetic           bool       `json:"synthetic"` // made by TestTool
	BudgetMicros        *int64     `json:"budgetMicros"`
	SpentMicros         *int64     `json:"spentMicros"`
	IdempotencyKey      *string    `json:"idempotencyKey"`
}

// RunQuery filters ListRuns: Status "" lists every status. Limit 0 is the
// server's default (50), at most 200.
type RunQuery struct {
	Status string // RunRunning, RunSucceeded or RunFailed
	Limit  int
	Cursor string // NextCursor of the previous page
}

// ListRuns pages the workspace's runs newest first, without their steps
// (GET /api/v1/runs, scope runs:read): say, the FAILED ones to inspect.
func (c *Client) ListRuns(ctx context.Context, q RunQuery) (*Page[RunSummary], error) {
	v := ListQuery{Limit: q.Limit, Cursor: q.Cursor}.values()
	if q.Status != "" {
		v.Set("status", q.Status)
	}
	return call[Page[RunSummary]](ctx, c, "GET", withQuery("/runs", v), nil, idempotent)
}

// GetStep reads one step with its durable job, its last 50 executions and
// its last 50 replays (GET /api/v1/steps/{id}; DurableJob.AttemptsTruncated
// and ReplaysTruncated say when earlier ones are left out).
func (c *Client) GetStep(ctx context.Context, stepID string) (*Step, error) {
	return call[Step](ctx, c, "GET", "/steps/"+pathID(stepID), nil, idempotent)
}

// ListStepAttempts pages every execution of a step's durable job in attempt
// order (GET /api/v1/steps/{id}/attempts, scope runs:read), where GetStep,
// GetRun and ListRunSteps hold its last 50 (DurableJob.AttemptsTruncated).
// Limit 0 is the server's default (50), at most 200; pass NextCursor (the
// page's last attempt number) as Cursor for the next page.
func (c *Client) ListStepAttempts(ctx context.Context, stepID string, q ListQuery) (*Page[JobAttempt], error) {
	return call[Page[JobAttempt]](ctx, c, "GET", withQuery("/steps/"+pathID(stepID)+"/attempts", q.values()), nil,
		idempotent)
}

// ListStepReplays pages every replay of a step's durable job oldest first
// (GET /api/v1/steps/{id}/replays, scope runs:read), where GetStep, GetRun
// and ListRunSteps hold its last 50 (DurableJob.ReplaysTruncated). Limit 0
// is the server's default (50), at most 200.
func (c *Client) ListStepReplays(ctx context.Context, stepID string, q ListQuery) (*Page[JobReplay], error) {
	return call[Page[JobReplay]](ctx, c, "GET", withQuery("/steps/"+pathID(stepID)+"/replays", q.values()), nil,
		idempotent)
}

// StepQuery filters ListRunSteps. Zero fields do not filter; Limit 0 is
// the server's default (50), at most 200.
type StepQuery struct {
	Status string // a job status: QUEUED, RUNNING, EXHAUSTED, …
	Limit  int
	Cursor string // NextCursor of the previous page
}

// StepPage is one page of a run's steps in id order. NextCursor is nil on
// the last page.
type StepPage struct {
	Data       []Step  `json:"data"`
	NextCursor *string `json:"nextCursor"`
}

// ListRunSteps pages a run's steps, each with its durable job and attempts
// (GET /api/v1/runs/{id}/steps): every step of a run, however many, where
// GetRun holds the first 1000.
func (c *Client) ListRunSteps(ctx context.Context, runID string, q StepQuery) (*StepPage, error) {
	v := ListQuery{Limit: q.Limit, Cursor: q.Cursor}.values()
	if q.Status != "" {
		v.Set("status", q.Status)
	}
	var out StepPage
	if err := c.do(ctx, "GET", withQuery("/runs/"+pathID(runID)+"/steps", v), nil, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// FinishRun requests completion of a run: it becomes SUCCEEDED once every
// step ended well, FAILED when any step is EXHAUSTED or CANCELLED. New steps
// are refused afterwards (409 invalid_state). It returns the run as the
// server answers it.
func (c *Client) FinishRun(ctx context.Context, runID string) (*Run, error) {
	var run Run
	if err := c.do(ctx, "POST", "/runs/"+pathID(runID)+"/finish", struct{}{}, &run, idempotent); err != nil {
		return nil, err
	}
	return &run, nil
}

// Dependency outcomes for EnqueueOptions.AfterStatus.
const (
	AfterSucceeded = "SUCCEEDED"
	AfterFailed    = "FAILED"
)

// EnqueueOptions are a step's options (API.md §3). Name and Version are
// required; zero values of the others are omitted so the server's defaults
// apply.
type EnqueueOptions struct {
	// Name and Version select the exact handler (name@version) that runs it.
	Name    string
	Version string // see Name
	// Endpoint is the endpoint (service) name whose policy and gates apply;
	// empty means the tool name.
	Endpoint string
	// IdempotencyKey identifies the operation. Empty lets the server derive
	// one from the run, name, version, contract version, endpoint,
	// dependency, canonical input and delay, so an identical enqueue
	// deduplicates.
	// Use an explicit key when producers in different languages must agree.
	IdempotencyKey string
	// Timeout bounds one attempt; sent as whole milliseconds.
	Timeout time.Duration
	// MaxAttempts (1–10) overrides only the policy's attempt count.
	MaxAttempts int
	// ContractVersion pins a published tool contract (from 1).
	ContractVersion int
	// AfterStepID makes the step wait for another step of the run, and
	// AfterStatus says which ending releases it (AfterSucceeded or
	// AfterFailed); the other ending skips it.
	AfterStepID string
	AfterStatus string // see AfterStepID
	// Delay makes the step due this long after the enqueue (up to 30 days;
	// sent as whole milliseconds, rounded up) instead of at once. Not with
	// AfterStepID.
	Delay time.Duration
}

// EnqueueResult is the answer to an enqueue. Deduplicated is true when the
// same key and operation already existed (nothing new was created), which
// includes a step this very call created when its first answer was lost and
// the client repeated the call: read it as "the step exists".
type EnqueueResult struct {
	StepID         string     `json:"stepId"`
	JobID          string     `json:"jobId"`
	IdempotencyKey string     `json:"idempotencyKey"` // explicit or generated
	Status         string     `json:"status"`         // a new step's QUEUED, WAITING or SKIPPED; a deduplicated one's current status
	DueAt          *time.Time `json:"dueAt"`
	Deduplicated   bool       `json:"deduplicated"`
}

type enqueueRequest struct {
	Name            string          `json:"name"`
	Version         string          `json:"version"`
	Input           json.RawMessage `json:"input"`
	Endpoint        string          `json:"endpoint,omitempty"`
	IdempotencyKey  string          `json:"idempotencyKey,omitempty"`
	TimeoutMs       int64           `json:"timeoutMs,omitempty"`
	MaxAttempts     int             `json:"maxAttempts,omitempty"`
	ContractVersion int             `json:"contractVersion,omitempty"`
	AfterStepID     string          `json:"afterStepId,omitempty"`
	AfterStatus     string          `json:"afterStatus,omitempty"`
	DelayMs         int64           `json:"delayMs,omitempty"`
}

// Enqueue adds a step to a run (POST /api/v1/runs/{id}/steps). input is
// marshalled to JSON. Enqueue is idempotent (by explicit or server-derived
// key), so it is retried after ambiguous failures.
func (c *Client) Enqueue(ctx context.Context, runID string, input any, opts EnqueueOptions) (*EnqueueResult, error) {
	if opts.Name == "" || opts.Version == "" {
		return nil, errors.New("ratchet: enqueue needs a tool name and version")
	}
	raw, err := json.Marshal(input)
	if err != nil {
		return nil, err
	}
	req := enqueueRequest{Name: opts.Name, Version: opts.Version, Input: raw, Endpoint: opts.Endpoint,
		IdempotencyKey: opts.IdempotencyKey, MaxAttempts: opts.MaxAttempts,
		ContractVersion: opts.ContractVersion, AfterStepID: opts.AfterStepID, AfterStatus: opts.AfterStatus}
	if opts.Timeout > 0 {
		req.TimeoutMs = max(1, opts.Timeout.Milliseconds())
	}
	if opts.Delay > 0 {
		req.DelayMs = int64((opts.Delay + time.Millisecond - 1) / time.Millisecond)
	}
	var out EnqueueResult
	if err := c.do(ctx, "POST", "/runs/"+pathID(runID)+"/steps", req, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// CancelStep cancels a step's job (POST /api/v1/steps/{id}/cancel). A
// running handler learns of it at its next heartbeat. It returns the step as
// the server answers it; a step that ended otherwise than cancelled is 409
// invalid_state. It is retried under an Idempotency-Key of its own, so
// that a retry after a lost answer is answered the first answer and never
// cancels a replay of the step made since.
func (c *Client) CancelStep(ctx context.Context, stepID string) (*Step, error) {
	return c.CancelStepWithKey(ctx, stepID, "")
}

// CancelStepWithKey is CancelStep under an Idempotency-Key of the caller's
// (a fresh one when empty), as UpdateEffectPolicyWithKey.
func (c *Client) CancelStepWithKey(ctx context.Context, stepID, idempotencyKey string) (*Step, error) {
	return callKeyed[Step](ctx, c, "POST", "/steps/"+pathID(stepID)+"/cancel", idempotencyKey, struct{}{})
}

// ReplayPreview says whether a step can be replayed and to which contract
// versions it could be upgraded.
type ReplayPreview struct {
	StepID   string `json:"stepId"`
	JobID    string `json:"jobId"`
	Name     string `json:"name"`
	Status   string `json:"status"`   // one of the Job* status constants
	Eligible bool   `json:"eligible"` // exhausted or cancelled, its dependency allowing it
	// IneligibleReason says why a replay would be refused now (nil when
	// Eligible).
	IneligibleReason *string `json:"ineligibleReason"`
	// HandlerVersion is the step's current handler version: pass it as
	// ReplayOptions.ExpectedHandlerVersion for an upgrade.
	HandlerVersion string `json:"handlerVersion"`
	// HandlerVersionForbidden is true when every contract of the step's
	// tool at HandlerVersion is FORBIDDEN: a Replay of the same version is
	// refused (409 invalid_state), and only one onto an upgrade runs the
	// step (Eligible is false when no upgrade can).
	HandlerVersionForbidden bool `json:"handlerVersionForbidden"`
	ContractVersion         *int `json:"contractVersion"` // the step's contract, if any
	// Attempt is the step's attempt now: pass it as
	// ReplayOptions.ExpectedAttempt so that a retried replay runs once.
	Attempt        int             `json:"attempt"`
	MaxAttempts    int             `json:"maxAttempts"`
	EndpointPaused bool            `json:"endpointPaused"` // a replay would wait for the resume
	Upgrades       []ReplayUpgrade `json:"upgrades"`       // contracts it could move to
	// InputUnreadable is true when the server cannot decrypt the saved
	// input (sealed with an encryption key it is no longer configured
	// with): no upgrade is then Compatible, and a Replay onto one fails
	// with a 500 until the key is configured again.
	InputUnreadable bool `json:"inputUnreadable"`
}

// ReplayUpgrade is one contract a replay could move to. Compatible means the
// saved input validates against its input schema; Validation says why it
// does not (field paths and rules, never the input's values). Checked is
// false when the preview did not check the input against it (its check
// budget ran out first, or InputUnreadable): Compatible is then false
// though it may fit, and a Replay onto it checks it.
type ReplayUpgrade struct {
	ContractVersion int          `json:"contractVersion"` // pass as TargetContractVersion
	HandlerVersion  string       `json:"handlerVersion"`  // the handler that would run
	Status          string       `json:"status"`          // ContractActive or ContractForbidden
	Compatible      bool         `json:"compatible"`      // saved input fits its schema
	Forbidden       bool         `json:"forbidden"`       // status FORBIDDEN: not selectable
	Checked         bool         `json:"checked"`         // false: fit unknown, checked at replay
	Validation      []FieldError `json:"validation"`      // empty when Compatible
}

// ReplayPreview reads GET /api/v1/steps/{id}/replay (scope steps:replay).
func (c *Client) ReplayPreview(ctx context.Context, stepID string) (*ReplayPreview, error) {
	var out ReplayPreview
	if err := c.do(ctx, "GET", "/steps/"+pathID(stepID)+"/replay", nil, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReplayOptions are the body of a replay. AcknowledgeDuplicateRisk must be
// true: the previous worker may have completed a side effect whose result
// was never recorded. For a version upgrade set TargetContractVersion,
// ExpectedHandlerVersion (the preview's HandlerVersion) and
// AcknowledgeVersionChange.
type ReplayOptions struct {
	AcknowledgeDuplicateRisk bool   `json:"acknowledgeDuplicateRisk"`        // must be true
	MaxAttempts              int    `json:"maxAttempts,omitempty"`           // additional executions allowed
	Reason                   string `json:"reason,omitempty"`                // recorded in the replay event
	TargetContractVersion    int    `json:"targetContractVersion,omitempty"` // upgrade target
	ExpectedHandlerVersion   string `json:"expectedHandlerVersion,omitempty"`
	AcknowledgeVersionChange bool   `json:"acknowledgeVersionChange,omitempty"`
	// ExpectedAttempt is the preview's Attempt: a replay of a step that has
	// run since (a retry of a replay that landed and ran) is refused 409
	// invalid_state instead of running the job once more. nil checks nothing.
	ExpectedAttempt *int `json:"expectedAttempt,omitempty"`
}

// ReplayResult is the answer to a replay: the same job, QUEUED again.
// Attempt is the last attempt made so far; MaxAttempts the lifetime ceiling.
type ReplayResult struct {
	StepID         string `json:"stepId"`
	JobID          string `json:"jobId"`
	Status         string `json:"status"`         // QUEUED
	Attempt        int    `json:"attempt"`        // the last attempt so far
	MaxAttempts    int    `json:"maxAttempts"`    // the lifetime ceiling
	HandlerVersion string `json:"handlerVersion"` // the handler the replay runs
}

// Replay re-queues an exhausted or cancelled step (POST
// /api/v1/steps/{id}/replay, scope steps:replay). Every attempt of one call
// carries one Idempotency-Key, so a repeat after an ambiguous failure gets
// back the replay the first attempt made instead of replaying again (the
// server commits a replay and its answer together). Across calls,
// ExpectedAttempt is what keeps a replay to one.
func (c *Client) Replay(ctx context.Context, stepID string, opts ReplayOptions) (*ReplayResult, error) {
	var out ReplayResult
	if err := c.doKeyed(ctx, "POST", "/steps/"+pathID(stepID)+"/replay", newRequestID(), opts, &out,
		idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

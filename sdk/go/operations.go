package ratchet

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"time"
)

// call sends one API call (Client.do) and answers its decoded body.
func call[T any](ctx context.Context, c *Client, method, path string, in any, safe idempotency) (*T, error) {
	var out T
	if err := c.do(ctx, method, path, in, &out, safe); err != nil {
		return nil, err
	}
	return &out, nil
}

// callKeyed is call under an Idempotency-Key (Client.doKeyed), for the
// creates the server keys: the caller's key, or a fresh one when it is
// empty, so that the call's retries never go out without one (an empty key
// given to CreateKeyWithKey was retried keyless, and could mint two keys;
// the Python and TypeScript SDKs send a fresh key in its place).
func callKeyed[T any](ctx context.Context, c *Client, method, path, key string, in any) (*T, error) {
	if key == "" {
		key = newRequestID()
	}
	var out T
	if err := c.doKeyed(ctx, method, path, key, in, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// The actions that set a state another actor may set back (a breaker's
// open or close, the stop and its release, a step's cancel, an endpoint's
// pause, resume or circuit close, a webhook's update, a policy update) go
// through callKeyed too, each under the key its XWithKey variant takes or
// a fresh one: made once per call and sent on each of its retries, so that
// a retry after a lost answer is answered the first answer instead of
// acting again on a state changed since (a close retried after the breaker
// tripped again closed the new trip; a cancel retried after a replay
// cancelled the replay).

// Endpoint is a service its jobs call (GET /api/v1/endpoints/{id}/policy):
// its retry policy, gates and circuit breaker. A job snapshots the policy
// when it is enqueued; edits apply to jobs enqueued after them.
type Endpoint struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Version is the policy's version, the expectedVersion of an update.
	Version      int64  `json:"version"`
	PolicyPreset string `json:"policyPreset"` // a RetryPreset* constant
	// RetryPolicy is the complete CUSTOM schedule, nil for a built-in
	// preset.
	RetryPolicy        *RetrySchedule `json:"retryPolicy"`
	MaxAttempts        int            `json:"maxAttempts"`
	DefaultTimeoutMs   int64          `json:"defaultTimeoutMs"`
	MaxConcurrent      *int           `json:"maxConcurrent"`
	RateLimitPerMinute *int           `json:"rateLimitPerMinute"`
	// Paused endpoints accept jobs but leave them unclaimed.
	Paused bool `json:"paused"`
	// CircuitFailureThreshold consecutive retryable failures open the
	// circuit (nil: the breaker is off).
	CircuitFailureThreshold *int            `json:"circuitFailureThreshold"`
	CircuitCooldownMs       int64           `json:"circuitCooldownMs"`
	Circuit                 EndpointCircuit `json:"circuit"`
	CreatedAt               time.Time       `json:"createdAt"`
	UpdatedAt               time.Time       `json:"updatedAt"`
}

// RetrySchedule is an endpoint's retry schedule: after failure n the wait
// is min(MaxDelayMs, InitialDelayMs × Multiplier^(n-1)) ± JitterPercent.
// A job snapshots it with its timeout (RetryPolicy).
type RetrySchedule struct {
	Preset         string  `json:"preset"` // a RetryPreset* constant (CUSTOM for an endpoint's or a contract's)
	MaxAttempts    int     `json:"maxAttempts"`
	InitialDelayMs int64   `json:"initialDelayMs"`
	Multiplier     float64 `json:"multiplier"`
	MaxDelayMs     int64   `json:"maxDelayMs"`
	JitterPercent  float64 `json:"jitterPercent"`
}

// EndpointCircuit is an endpoint's breaker: CircuitClosed, or CircuitOpen
// since OpenedAt, when claims skip its jobs but for one probe from ProbeAt.
type EndpointCircuit struct {
	State               string     `json:"state"`
	OpenedAt            *time.Time `json:"openedAt"`
	ProbeAt             *time.Time `json:"probeAt"`
	ConsecutiveFailures int        `json:"consecutiveFailures"`
}

// ListQuery pages a list: Limit 0 is the server's default (50), at most
// 200; Cursor is the previous page's NextCursor.
type ListQuery struct {
	Limit  int
	Cursor string
}

// values is q as query parameters.
func (q ListQuery) values() url.Values {
	v := url.Values{}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Cursor != "" {
		v.Set("cursor", q.Cursor)
	}
	return v
}

// Page is one page of a list on the durable-job routes (camelCase);
// NextCursor is nil on the last.
type Page[T any] struct {
	Data       []T     `json:"data"`
	NextCursor *string `json:"nextCursor"`
}

// GatePage is Page on the effect gate's routes, whose fields are
// snake_case: NextCursor is next_cursor there, and nil on the last page.
type GatePage[T any] struct {
	Data       []T     `json:"data"`
	NextCursor *string `json:"next_cursor"`
}

// ListEndpoints pages the workspace's endpoints (GET /api/v1/endpoints).
func (c *Client) ListEndpoints(ctx context.Context, q ListQuery) (*Page[Endpoint], error) {
	return call[Page[Endpoint]](ctx, c, "GET", withQuery("/endpoints", q.values()), nil, idempotent)
}

// CreateEndpoint creates an endpoint ahead of its first job, with policy
// fields as UpdateEndpointPolicy takes them (nil: the defaults, STANDARD).
// An existing name answers the endpoint unchanged, so the call is retried.
func (c *Client) CreateEndpoint(ctx context.Context, name string, policy PolicyUpdate) (*Endpoint, error) {
	return call[Endpoint](ctx, c, "POST", "/endpoints", policy.with(map[string]any{"name": name}), idempotent)
}

// GetEndpoint reads an endpoint and its policy.
func (c *Client) GetEndpoint(ctx context.Context, endpointID string) (*Endpoint, error) {
	return c.endpointCall(ctx, "GET", endpointID, "/policy", nil, idempotent)
}

// PolicyUpdate holds the policy fields to change, by their API names: an
// endpoint's (UpdateEndpointPolicy: preset, maxAttempts, initialDelayMs,
// multiplier, maxDelayMs, jitterPercent, defaultTimeoutMs, maxConcurrent,
// rateLimitPerMinute, circuitFailureThreshold, circuitCooldownMs) or an
// effect type's (UpdateEffectPolicy: mode, max_cost_micros, ...). A nil value clears
// an optional one (maxConcurrent: nil lifts the limit); fields left out keep
// their values.
type PolicyUpdate map[string]any

// with is the request body: u's fields and extra's (never nil: an empty
// update is {}).
func (u PolicyUpdate) with(extra map[string]any) map[string]any {
	body := make(map[string]any, len(u)+len(extra))
	for k, v := range u {
		body[k] = v
	}
	for k, v := range extra {
		body[k] = v
	}
	return body
}

// UpdateEndpointPolicy merges update into the endpoint's policy when
// expectedVersion is still its version (otherwise *Error with code
// version_conflict: read it again, and decide again). Jobs already
// enqueued keep their snapshot. It is not retried after an answer that
// was lost: the repeat of an update that was applied would meet the new
// version (MayHaveApplied tells; read the endpoint to see).
func (c *Client) UpdateEndpointPolicy(ctx context.Context, endpointID string, expectedVersion int64,
	update PolicyUpdate) (*Endpoint, error) {
	return c.endpointCall(ctx, "PUT", endpointID, "/policy", update.with(map[string]any{"expectedVersion": expectedVersion}),
		notIdempotent)
}

// PauseEndpoint pauses an endpoint: its jobs are accepted but not claimed,
// consuming no attempts, until ResumeEndpoint. Retried under an
// Idempotency-Key of its own, so that a retry after a lost answer never
// pauses again an endpoint another operator resumed since (callKeyed).
func (c *Client) PauseEndpoint(ctx context.Context, endpointID string) (*Endpoint, error) {
	return c.PauseEndpointWithKey(ctx, endpointID, "")
}

// PauseEndpointWithKey is PauseEndpoint under an Idempotency-Key of the
// caller's (a fresh one when empty), as UpdateEffectPolicyWithKey.
func (c *Client) PauseEndpointWithKey(ctx context.Context, endpointID, idempotencyKey string) (*Endpoint, error) {
	return callKeyed[Endpoint](ctx, c, "POST", "/endpoints/"+pathID(endpointID)+"/pause", idempotencyKey, struct{}{})
}

// ResumeEndpoint resumes a paused endpoint, retried under an
// Idempotency-Key of its own as PauseEndpoint is.
func (c *Client) ResumeEndpoint(ctx context.Context, endpointID string) (*Endpoint, error) {
	return c.ResumeEndpointWithKey(ctx, endpointID, "")
}

// ResumeEndpointWithKey is ResumeEndpoint under an Idempotency-Key of the
// caller's (a fresh one when empty), as UpdateEffectPolicyWithKey.
func (c *Client) ResumeEndpointWithKey(ctx context.Context, endpointID, idempotencyKey string) (*Endpoint, error) {
	return callKeyed[Endpoint](ctx, c, "POST", "/endpoints/"+pathID(endpointID)+"/resume", idempotencyKey, struct{}{})
}

// CloseEndpointCircuit closes the endpoint's circuit breaker by hand (an
// operator's word that the service is back: inspect its recent attempts
// first, ListEndpointAttempts). Closing a closed circuit changes nothing.
// Retried under an Idempotency-Key of its own, so that a retry never
// closes the circuit again once it opened again since.
func (c *Client) CloseEndpointCircuit(ctx context.Context, endpointID string) (*Endpoint, error) {
	return c.CloseEndpointCircuitWithKey(ctx, endpointID, "")
}

// CloseEndpointCircuitWithKey is CloseEndpointCircuit under an
// Idempotency-Key of the caller's (a fresh one when empty), as
// UpdateEffectPolicyWithKey.
func (c *Client) CloseEndpointCircuitWithKey(ctx context.Context, endpointID, idempotencyKey string) (*Endpoint, error) {
	return callKeyed[Endpoint](ctx, c, "POST", "/endpoints/"+pathID(endpointID)+"/circuit/close", idempotencyKey,
		struct{}{})
}

// endpointCall sends one call on /endpoints/{id}{suffix} answered with the
// endpoint.
func (c *Client) endpointCall(ctx context.Context, method, endpointID, suffix string, in any,
	safe idempotency) (*Endpoint, error) {
	return call[Endpoint](ctx, c, method, "/endpoints/"+pathID(endpointID)+suffix, in, safe)
}

// EndpointAttempt is one attempt (one claim) of a job of an endpoint, with
// the job it belongs to.
type EndpointAttempt struct {
	JobID   string `json:"jobId"`
	StepID  string `json:"stepId"`
	RunID   string `json:"runId"`
	Name    string `json:"name"`
	Version string `json:"version"`
	JobAttempt
}

// AttemptQuery filters ListEndpointAttempts: Outcome "SUCCEEDED" or
// "FAILED" keeps only those ("" keeps all, running ones included). Limit 0
// is the server's default (50), at most 200.
type AttemptQuery struct {
	Outcome string
	Limit   int
	Cursor  string // NextCursor of the previous page
}

// ListEndpointAttempts pages an endpoint's attempts newest first (GET
// /api/v1/endpoints/{id}/attempts), each with its job and the message its
// worker reported: what to read before closing its circuit or resuming it.
func (c *Client) ListEndpointAttempts(ctx context.Context, endpointID string, q AttemptQuery) (*Page[EndpointAttempt], error) {
	v := ListQuery{Limit: q.Limit, Cursor: q.Cursor}.values()
	if q.Outcome != "" {
		v.Set("outcome", q.Outcome)
	}
	return call[Page[EndpointAttempt]](ctx, c, "GET", withQuery("/endpoints/"+pathID(endpointID)+"/attempts", v), nil,
		idempotent)
}

// QueueHealth is the queued work of one exact name@version, and what
// holds it when something does (GET /api/v1/queue/health).
type QueueHealth struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Queued  int64  `json:"queued"`
	// Due is how many of them a claim could take now.
	Due                    int64 `json:"due"`
	OldestQueuedAgeSeconds int64 `json:"oldestQueuedAgeSeconds"`
	// WorkersSeen counts the workers serving the version that polled
	// recently.
	WorkersSeen int64 `json:"workersSeen"`
	// The names of the endpoints holding its queued jobs: circuit open,
	// paused, every concurrency slot taken, this minute's rate used up.
	OpenCircuitEndpoints []string `json:"openCircuitEndpoints"`
	PausedEndpoints      []string `json:"pausedEndpoints"`
	AtLimitEndpoints     []string `json:"atConcurrencyLimitEndpoints"`
	RateLimitedEndpoints []string `json:"rateLimitedEndpoints"`
	// Message says plainly what holds the queue (no worker, a pause, an
	// open circuit, a limit reached), nil when nothing does.
	Message *string `json:"message"`
}

// ListQueueHealth pages the queue's health in name, version order.
func (c *Client) ListQueueHealth(ctx context.Context, q ListQuery) (*Page[QueueHealth], error) {
	return call[Page[QueueHealth]](ctx, c, "GET", withQuery("/queue/health", q.values()), nil, idempotent)
}

// Approval states.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalRejected = "rejected"
)

// Why an effect was held for approval (Approval.Reason, and each of
// Approval.Answers): its policy's mode, a cost at or above the policy's
// approval_above_micros, or a breaker or the emergency stop holding its type
// with BreakerRequireApproval.
const (
	ApprovalReasonPolicyRequiresApproval = "policy_requires_approval"
	ApprovalReasonCostAtOrAboveThreshold = "cost_at_or_above_threshold"
	ApprovalReasonCircuitOpen            = "circuit_open"
)

// Approval is an operator's decision on an effect the gate held
// (ApprovalRequiredError.ApprovalID names it).
type Approval struct {
	ID         string `json:"id"`
	EffectID   string `json:"effect_id"`
	EffectType string `json:"effect_type"`
	State      string `json:"state"` // ApprovalPending, ApprovalApproved or ApprovalRejected
	// Reason is why the effect was held: one of the ApprovalReason*
	// constants.
	Reason    string     `json:"reason"`
	CreatedAt time.Time  `json:"created_at"`
	DecidedAt *time.Time `json:"decided_at"`
	Note      *string    `json:"note"`
	// Answers, once approved, is every reason the approval answers (the
	// one it was asked for and any other that held as it was given).
	Answers []string `json:"answers"`
	// DecidedByKeyID is the key that decided it (approved or rejected it,
	// or closed it by a resolution or an unwind); nil while pending, and
	// for one no key decided.
	DecidedByKeyID *string `json:"decided_by_key_id"`
	// CostMicros and IdempotencyKey are the held effect's: what the
	// approval says yes to. CostMicros is nil when it declared no cost.
	CostMicros     *int64 `json:"cost_micros"`
	IdempotencyKey string `json:"idempotency_key"`
}

// ApprovalQuery filters ListApprovals: State "" lists every state. Limit 0
// is the server's default (50), at most 200.
type ApprovalQuery struct {
	State  string
	Limit  int
	Cursor string // NextCursor of the previous page
}

// ListApprovals pages the workspace's approvals newest first (GET
// /api/v1/approvals, scope approvals:write): say, the pending ones.
func (c *Client) ListApprovals(ctx context.Context, q ApprovalQuery) (*GatePage[Approval], error) {
	v := ListQuery{Limit: q.Limit, Cursor: q.Cursor}.values()
	if q.State != "" {
		v.Set("state", q.State)
	}
	return call[GatePage[Approval]](ctx, c, "GET", withQuery("/approvals", v), nil, idempotent)
}

// GetApproval reads one approval.
func (c *Client) GetApproval(ctx context.Context, approvalID string) (*Approval, error) {
	return c.approvalCall(ctx, "GET", approvalID, "", nil)
}

// Approve approves a pending effect: the next begin of its key executes.
// Approving an approved effect answers it unchanged, so the call is retried
// through transient failures; approving a rejected one is 409 invalid_state.
func (c *Client) Approve(ctx context.Context, approvalID, note string) (*Approval, error) {
	return c.approvalCall(ctx, "POST", approvalID, "/approve", decideBody{Note: note})
}

// Reject rejects a pending effect: every begin of its key is denied
// approval_rejected, for good. Retried like Approve.
func (c *Client) Reject(ctx context.Context, approvalID, note string) (*Approval, error) {
	return c.approvalCall(ctx, "POST", approvalID, "/reject", decideBody{Note: note})
}

// decideBody is the body of approve and reject.
type decideBody struct {
	Note string `json:"note,omitempty"`
}

// approvalCall sends one call on /approvals/{id}{suffix} answered with the
// approval.
func (c *Client) approvalCall(ctx context.Context, method, approvalID, suffix string, in any) (*Approval, error) {
	return call[Approval](ctx, c, method, "/approvals/"+pathID(approvalID)+suffix, in, idempotent)
}

// Contract statuses.
const (
	ContractActive    = "ACTIVE"
	ContractForbidden = "FORBIDDEN"
)

// A contract's retry presets: a built-in schedule, or CUSTOM (its
// RetryPolicy).
const (
	RetryPresetStandard   = "STANDARD"
	RetryPresetAggressive = "AGGRESSIVE"
	RetryPresetRelaxed    = "RELAXED"
	RetryPresetCustom     = "CUSTOM"
)

// Contract is a published version of a tool's contract (POST
// /api/v1/tools/{name}/contracts): the handler version it binds, its input
// and output JSON Schemas (2020-12), its timeout and retry policy.
type Contract struct {
	Name            string          `json:"name"`
	ContractVersion int             `json:"contractVersion"`
	HandlerVersion  string          `json:"handlerVersion"`
	InputSchema     json.RawMessage `json:"inputSchema"`
	OutputSchema    json.RawMessage `json:"outputSchema"`
	TimeoutMs       int64           `json:"timeoutMs"`
	RetryPreset     string          `json:"retryPreset"` // a RetryPreset* constant
	// RetryPolicy is the complete CUSTOM schedule, nil for a built-in preset.
	RetryPolicy *RetrySchedule `json:"retryPolicy"`
	Status      string         `json:"status"` // ContractActive or ContractForbidden
	CreatedAt   time.Time      `json:"createdAt"`
}

// ContractSpec is what PublishContract publishes. InputSchema is required;
// a nil OutputSchema accepts any output. Zero Timeout, RetryPreset and
// Status take the server's defaults (30 s, STANDARD, ACTIVE); Timeout is
// sent in whole milliseconds. RetryPolicy goes with RetryPreset "CUSTOM"
// only (its Preset field is not sent).
type ContractSpec struct {
	HandlerVersion string
	InputSchema    json.RawMessage
	OutputSchema   json.RawMessage
	Timeout        time.Duration
	RetryPreset    string // a RetryPreset* constant: STANDARD, AGGRESSIVE, RELAXED or CUSTOM
	RetryPolicy    *RetrySchedule
	Status         string // ContractActive or ContractForbidden
	// IdempotencyKey is the Idempotency-Key the publish is sent under (at
	// most 255 characters): the same publish under the same key within a
	// day answers the version the first published, so a caller whose
	// retries ran out can learn it. Empty sends a fresh key of its own.
	IdempotencyKey string
}

// contractBody is ContractSpec as the route takes it.
type contractBody struct {
	HandlerVersion string          `json:"handlerVersion"`
	InputSchema    json.RawMessage `json:"inputSchema"`
	OutputSchema   json.RawMessage `json:"outputSchema,omitempty"`
	TimeoutMs      int64           `json:"timeoutMs,omitempty"`
	RetryPreset    string          `json:"retryPreset,omitempty"`
	RetryPolicy    *customPolicy   `json:"retryPolicy,omitempty"`
	Status         string          `json:"status,omitempty"`
}

// customPolicy is a CUSTOM schedule as a contract takes it (no preset).
type customPolicy struct {
	MaxAttempts    int     `json:"maxAttempts"`
	InitialDelayMs int64   `json:"initialDelayMs"`
	Multiplier     float64 `json:"multiplier"`
	MaxDelayMs     int64   `json:"maxDelayMs"`
	JitterPercent  float64 `json:"jitterPercent"`
}

// PublishContract publishes a new contract version of tool name
// (contracts:write). Every attempt of the call carries one Idempotency-Key,
// so a repeat after a lost answer gets the version the first published
// instead of publishing another.
func (c *Client) PublishContract(ctx context.Context, name string, spec ContractSpec) (*Contract, error) {
	body := contractBody{HandlerVersion: spec.HandlerVersion, InputSchema: spec.InputSchema,
		OutputSchema: spec.OutputSchema, TimeoutMs: spec.Timeout.Milliseconds(), RetryPreset: spec.RetryPreset,
		Status: spec.Status}
	if p := spec.RetryPolicy; p != nil {
		body.RetryPolicy = &customPolicy{MaxAttempts: p.MaxAttempts, InitialDelayMs: p.InitialDelayMs,
			Multiplier: p.Multiplier, MaxDelayMs: p.MaxDelayMs, JitterPercent: p.JitterPercent}
	}
	return callKeyed[Contract](ctx, c, "POST", "/tools/"+pathID(name)+"/contracts", spec.IdempotencyKey, body)
}

// ListContracts pages tool name's contracts by version.
func (c *Client) ListContracts(ctx context.Context, name string, q ListQuery) (*Page[Contract], error) {
	return call[Page[Contract]](ctx, c, "GET", withQuery("/tools/"+pathID(name)+"/contracts", q.values()), nil, idempotent)
}

// ToolTest is a synthetic test's job (TestTool): one attempt, in a run of
// its own that ends with it.
type ToolTest struct {
	RunID           string     `json:"runId"`
	StepID          string     `json:"stepId"`
	JobID           string     `json:"jobId"`
	Name            string     `json:"name"`
	Version         string     `json:"version"`
	ContractVersion *int       `json:"contractVersion"`
	Status          string     `json:"status"`
	MaxAttempts     int        `json:"maxAttempts"`
	DueAt           *time.Time `json:"dueAt"`
}

// TestTool enqueues a synthetic one-attempt job of name@version with input
// (contracts:write), checked against the version's contract as any
// enqueue: follow it with GetRun(RunID). Retried under one
// Idempotency-Key, as PublishContract.
func (c *Client) TestTool(ctx context.Context, name, version string, input any) (*ToolTest, error) {
	return c.TestToolWithKey(ctx, name, version, input, "")
}

// TestToolWithKey is TestTool under an Idempotency-Key of the caller's (at
// most 255 characters): the same test under the same key within a day
// answers the job the first enqueued instead of enqueueing another.
func (c *Client) TestToolWithKey(ctx context.Context, name, version string, input any, idempotencyKey string) (*ToolTest, error) {
	body := struct {
		Version string `json:"version"`
		Input   any    `json:"input,omitempty"`
	}{version, input}
	return callKeyed[ToolTest](ctx, c, "POST", "/tools/"+pathID(name)+"/test", idempotencyKey, body)
}

package ratchet

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Stable error codes of the API (API.md "Errors"). Branch on these, never on
// messages.
const (
	CodeInvalidRequest         = "invalid_request"
	CodeCostRequired           = "cost_required"
	CodeDimensionRequired      = "dimension_required"
	CodeUnauthorized           = "unauthorized"
	CodeInsufficientCredit     = "insufficient_credit"
	CodeQuotaExhausted         = "quota_exhausted"
	CodeForbidden              = "forbidden"
	CodeBudgetExceeded         = "budget_exceeded"
	CodeCostCeilingExceeded    = "cost_ceiling_exceeded"
	CodeRunBudgetExceeded      = "run_budget_exceeded"
	CodeKeyBudgetExceeded      = "key_budget_exceeded"
	CodeDimensionLimitExceeded = "dimension_limit_exceeded"
	CodePolicyDenied           = "policy_denied"
	CodeMaxAttemptsExceeded    = "max_attempts_exceeded"
	CodeApprovalRejected       = "approval_rejected"
	CodeCircuitOpen            = "circuit_open"
	CodeNotFound               = "not_found"
	CodeIdempotencyKeyReuse    = "idempotency_key_reuse"
	CodeInvalidState           = "invalid_state"
	CodeLeaseExpired           = "lease_expired"
	CodeLeaseLost              = "lease_lost"
	CodeRetryRequest           = "retry_request"
	CodeGroupUnwinding         = "group_unwinding"
	CodeVersionConflict        = "version_conflict"
	CodePayloadTooLarge        = "payload_too_large"
	CodeRateLimited            = "rate_limited"
	CodeInternal               = "internal_error"
	CodeBillingUnavailable     = "billing_unavailable"
	// CodeApprovalThresholdAboveCeiling: a policy's approval_above_micros
	// is above its max_cost_micros (400).
	CodeApprovalThresholdAboveCeiling = "approval_threshold_above_ceiling"
	// CodeDatabaseUnavailable: the server cannot reach its database (503).
	// detail.outcome "not_applied" says the call changed nothing; the
	// client retries it either way when that is safe.
	CodeDatabaseUnavailable = "database_unavailable"
	// CodeRequestTimeout: the call's body had not arrived when its time ran
	// out (408); nothing was done, and the client sends it again.
	CodeRequestTimeout = "request_timeout"
)

// Error is a failure answered by the API: the HTTP status and the error
// envelope's stable code, message and detail. Match it with errors.As:
//
//	var apiErr *ratchet.Error
//	if errors.As(err, &apiErr) && apiErr.Code == ratchet.CodeLeaseLost { ... }
//
// A response that is not a Ratchet error envelope (a proxy's 502 page, say)
// yields an Error with an empty Code and the status text as Message.
type Error struct {
	// StatusCode is the HTTP status of the response.
	StatusCode int
	// Code is the stable error code, e.g. "lease_lost".
	Code string
	// Message is the server's human-readable explanation.
	Message string
	// Detail holds structured detail such as "validation", "required" or
	// "retry_after_seconds".
	Detail map[string]any
	// RequestID is the response's X-Request-Id; quote it when reporting a 500.
	RequestID string

	body []byte   // the raw response, for begin's 403 decision body
	call callInfo // the call it answered, for a worker's default failure log
}

// Error implements error.
func (e *Error) Error() string {
	s := "ratchet: " + strconv.Itoa(e.StatusCode)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if alt := e.AnyOf(); len(alt) > 0 {
		s += " (requires one of " + strings.Join(alt, ", ") + ")"
	} else if req := e.Required(); len(req) > 0 {
		s += " (requires " + strings.Join(req, ", ") + ")"
	}
	if e.RequestID != "" {
		s += " (request " + e.RequestID + ")"
	}
	return s
}

// Required returns detail.required of a 403 forbidden: the scopes or
// tools ("tool:name@version") the key lacks. Nil when there is none.
func (e *Error) Required() []string { return detailStrings(e.Detail["required"]) }

// detailStrings reads a detail field that is a list of strings.
func detailStrings(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, v := range list {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// AnyOf returns detail.any_of of a 403 forbidden from a route that any one
// of several scopes opens: holding one of them is enough. Nil otherwise.
func (e *Error) AnyOf() []string { return detailStrings(e.Detail["any_of"]) }

// RetryAfterSeconds returns detail.retry_after_seconds when the server sent
// it (rate_limited), else a 429's or 503's Retry-After header in seconds,
// and 0 otherwise.
func (e *Error) RetryAfterSeconds() int {
	switch v := e.Detail["retry_after_seconds"].(type) {
	case float64:
		return int(v)
	case int:
		return v
	}
	return 0
}

// ResetsAt returns detail.resets_at of a budget_exceeded,
// key_budget_exceeded or dimension_limit_exceeded denial: when the UTC day
// window that refused it rolls over. ok is false when there is none.
func (e *Error) ResetsAt() (t time.Time, ok bool) {
	s, _ := e.Detail["resets_at"].(string)
	t, err := time.Parse(time.RFC3339Nano, s)
	return t, err == nil
}

// Dimension returns detail.dimension of a dimension_limit_exceeded denial:
// the dimension whose per-counterparty ceiling refused it ("" otherwise).
func (e *Error) Dimension() string {
	s, _ := e.Detail["dimension"].(string)
	return s
}

// Validation returns detail.validation as field/message pairs for an
// invalid_request error.
func (e *Error) Validation() []FieldError {
	raw, _ := e.Detail["validation"].([]any)
	out := make([]FieldError, 0, len(raw))
	for _, item := range raw {
		m, _ := item.(map[string]any)
		f, _ := m["field"].(string)
		msg, _ := m["message"].(string)
		out = append(out, FieldError{Field: f, Message: msg})
	}
	return out
}

// FieldError is one entry of an invalid_request error's detail.validation.
type FieldError struct {
	// Field is the dotted path of the offending request field.
	Field string `json:"field"`
	// Message says what is wrong with it.
	Message string `json:"message"`
}

// ErrorCode returns the API error code carried by err (or anything it
// wraps), or "" when err did not come from the API.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// IsCode reports whether err carries the API error code code.
func IsCode(err error, code string) bool { return err != nil && ErrorCode(err) == code }

// MayHaveApplied reports whether a call that failed with err may still have
// been applied by the server: its answer was lost (a network failure, the
// HTTP client's timeout, the caller's context ending while it was on its
// way) or unreadable, or the server failed after it may have acted (a 5xx,
// but a database_unavailable whose detail.outcome is "not_applied"),
// including when a later repeat of the call was refused. Before doing again
// what such a call asked (a run started without an idempotency key, say),
// look first or repeat it under the same key. nil, a refusal the server
// answered before acting (a 4xx) and a decision it answered (ErrDenied and
// the gate's other answers) are false; an error it cannot place, such as
// one raised before the call was sent, is true, erring towards looking
// first. It speaks of API calls: whether DoEffect's action ran is told by
// its outcome (non-nil when the action ran, even with an error saying its
// report or result was refused).
func MayHaveApplied(err error) bool {
	switch {
	case err == nil, errors.Is(err, ErrBlocked), errors.Is(err, ErrApprovalRequired), errors.Is(err, ErrDenied),
		errors.Is(err, ErrInFlight):
		return false
	}
	return errors.Is(err, context.Canceled) || mayHaveApplied(err)
}

// RetryableError is returned by a tool handler to ask for another attempt.
// RetryAfter, when positive, is a minimum wait before that attempt; the
// server waits the longer of it and the job's jittered policy delay. It is
// sent as whole milliseconds, clamped to the API's range of 1 second to
// 24 hours. Message is sent to the API (bounded and redacted), so keep it
// free of payloads and credentials.
type RetryableError struct {
	Message    string        // sent to the API, redacted
	RetryAfter time.Duration // optional minimum wait
}

// Error implements error.
func (e *RetryableError) Error() string { return "retryable: " + e.Message }

// NonRetryableError is returned by a tool handler to fail the job for good:
// it is exhausted at once, whatever attempts remain. Message is sent to the
// API (bounded and redacted).
type NonRetryableError struct {
	Message string // sent to the API, redacted
}

// Error implements error.
func (e *NonRetryableError) Error() string { return "non-retryable: " + e.Message }

// Retryable returns a *RetryableError with the given message and minimum
// delay (0 for the policy's own delay).
func Retryable(message string, retryAfter time.Duration) error {
	return &RetryableError{Message: message, RetryAfter: retryAfter}
}

// NonRetryable returns a *NonRetryableError with the given message.
func NonRetryable(message string) error { return &NonRetryableError{Message: message} }

// Sentinel causes a handler's context is cancelled with; read them with
// context.Cause(ctx).
var (
	// ErrTimeout: the job's timeoutMs elapsed. The attempt is reported as a
	// retryable failure unless the handler returned an explicit SDK error.
	ErrTimeout = errors.New("ratchet: job timed out")
	// ErrCancelRequested: the server asked for the job to be cancelled
	// (heartbeat cancelRequested). The attempt is reported non-retryable.
	ErrCancelRequested = errors.New("ratchet: job cancellation requested")
	// ErrLeaseLost: the server no longer recognises the lease (another
	// worker reclaimed the job or it ended; for DoEffect, the effect lease
	// expired or was superseded, or no heartbeat extended it before it
	// lapsed). After a heartbeat's lease_lost, a job's handler that still
	// returns success has it reported (the server records it unless a newer
	// attempt holds the job); nothing else is reported. DoEffect's cause reads
	// "effect lease lost" and matches ErrLeaseLost with errors.Is.
	ErrLeaseLost = errors.New("ratchet: job lease lost")
	// ErrWorkerStopped: the worker stopped before the handler finished. The
	// attempt is reported as a retryable failure.
	ErrWorkerStopped = errors.New("ratchet: worker stopped")
	// ErrReportsNotRecorded: Stop's error when reports of the worker's life
	// were not recorded (each went to OnError): their jobs run again once
	// their leases lapse.
	ErrReportsNotRecorded = errors.New("ratchet: reports not recorded")
)

// PanicError is passed to a worker's OnError when a handler or classifier
// panics. It stays in the process: only a fixed message reaches the API.
type PanicError struct {
	// Where names what panicked ("handler send_welcome_email@1").
	Where string
	// Value is the recovered value.
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string { return fmt.Sprintf("ratchet: %s panicked: %v", e.Where, e.Value) }

// ReportNotRecordedError is what a worker's OnError is told of a job's
// report the server did not record: refused (a lease_lost, an
// invalid_state, a 403...) or given up at Stop's deadline, or never sent
// because the worker stopped with the job's handler still running past
// StartOptions.StopGrace (Err then matches ErrWorkerStopped), its job then run
// again once its lease lapses unless the refusal settled it; or of a
// success whose output the server refused, reported as a non-retryable
// failure instead. Read it with errors.As; Err is the call's error (an
// *Error, so IsCode and ErrorCode read through the notice, or a network
// failure). The Python SDK's ReportNotRecorded and the TypeScript SDK's
// ReportNotRecordedError carry the same (what, job id, attempt, cause).
type ReportNotRecordedError struct {
	// What is "not_recorded", or "output_refused" when the server refused
	// a success's output and a failure was reported in its place.
	What    string
	JobID   string // the job whose report it was
	Attempt int    // the attempt it reported
	Err     error  // the call's error
}

// Error implements error.
func (e *ReportNotRecordedError) Error() string {
	if e.What == "output_refused" {
		return fmt.Sprintf("ratchet: job %s attempt %d: the server refused the output; reporting it failed: %v",
			e.JobID, e.Attempt, e.Err)
	}
	return fmt.Sprintf("ratchet: report job %s attempt %d: %v", e.JobID, e.Attempt, e.Err)
}

// Unwrap returns the call's error.
func (e *ReportNotRecordedError) Unwrap() error { return e.Err }

// LeaseLostError is what a worker's OnError is told when a job's attempt
// lost its lease while its handler ran, whose context then ends with
// ErrLeaseLost: a heartbeat was refused for good (Err is the refusal: 409
// lease_lost or invalid_state, 404, 403), or the lease passed its end by
// the worker's clock while heartbeats failed (Err nil). The job runs again
// once its lease lapses, unless the refusal says it ended. Read it with
// errors.As; it matches ErrLeaseLost with errors.Is. The Python SDK's
// LeaseLost and the TypeScript SDK's LeaseLostError carry the same (job id,
// attempt, tool, cause).
type LeaseLostError struct {
	JobID   string  // the job whose lease was lost
	Attempt int     // the attempt that lost it
	Tool    ToolRef // the handler's name and version
	Err     error   // the heartbeat's refusal; nil when the lease lapsed
}

// Error implements error.
func (e *LeaseLostError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("ratchet: job %s attempt %d (%s@%s): no heartbeat extended its lease before it lapsed",
			e.JobID, e.Attempt, e.Tool.Name, e.Tool.Version)
	}
	return fmt.Sprintf("ratchet: job %s attempt %d (%s@%s) no longer holds its lease: %v",
		e.JobID, e.Attempt, e.Tool.Name, e.Tool.Version, e.Err)
}

// Unwrap returns the heartbeat's refusal (nil after a lapse).
func (e *LeaseLostError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrLeaseLost) true.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// Package apierr is the one error type the HTTP API speaks. Every failure a
// client can see carries a stable code from the wire contract (API.md) and the
// HTTP status that goes with it; anything that is not an *Error surfaces as a
// 500 internal_error that carries only the request id.
package apierr

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// Stable error codes. Clients branch on these; never rename one.
const (
	CodeInvalidRequest         = "invalid_request"
	CodeCostRequired           = "cost_required"
	CodeDimensionRequired      = "dimension_required"
	CodeApprovalAboveCeiling   = "approval_threshold_above_ceiling"
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
	CodeMethodNotAllowed       = "method_not_allowed"
	CodeIdempotencyKeyReuse    = "idempotency_key_reuse"
	CodeInvalidState           = "invalid_state"
	CodeLeaseExpired           = "lease_expired"
	CodeLeaseLost              = "lease_lost"
	CodeRetryRequest           = "retry_request"
	CodeGroupUnwinding         = "group_unwinding"
	CodeVersionConflict        = "version_conflict"
	CodePayloadTooLarge        = "payload_too_large"
	CodeRequestTimeout         = "request_timeout"
	CodeRateLimited            = "rate_limited"
	CodeInternal               = "internal_error"
	CodeBillingUnavailable     = "billing_unavailable"
	CodeDatabaseUnavailable    = "database_unavailable"
)

// Error is a failure with a stable code, an HTTP status, a human message and
// optional structured detail. Messages must never echo request payloads, keys
// or secrets: they are returned to callers and may be logged.
type Error struct {
	Status  int
	Code    string
	Message string
	Detail  map[string]any
	cause   error
}

// Wire is an error as the API writes it: the value of a response's "error".
type Wire struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Detail  map[string]any `json:"detail"`
}

// Wire returns e's wire form (detail {} when e has none).
func (e *Error) Wire() Wire {
	d := e.Detail
	if d == nil {
		d = map[string]any{}
	}
	return Wire{Code: e.Code, Message: e.Message, Detail: d}
}

func (e *Error) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.cause)
	}
	return e.Code + ": " + e.Message
}

// Unwrap exposes the underlying cause (never sent to clients).
func (e *Error) Unwrap() error { return e.cause }

// WithDetail returns a copy of e with key set in its detail map.
func (e *Error) WithDetail(key string, value any) *Error {
	c := *e
	c.Detail = make(map[string]any, len(e.Detail)+1)
	for k, v := range e.Detail {
		c.Detail[k] = v
	}
	c.Detail[key] = value
	return &c
}

// Wrap attaches an internal cause to e for logs and errors.Is; the cause is
// never serialised.
func (e *Error) Wrap(cause error) *Error {
	c := *e
	c.cause = cause
	return &c
}

// New builds an error with an explicit status and code.
func New(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// As reports whether err is (or wraps) an *Error and returns it.
func As(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// HasCode reports whether err carries the given API error code.
func HasCode(err error, code string) bool {
	e, ok := As(err)
	return ok && e.Code == code
}

// LimitRule is the message for a list's limit that is not an integer from
// 1 to 200: REST's ?limit= and an MCP list tool's limit argument, which
// forms it, say it in the same words (QA: MCP answered "must be an
// integer" to 1.5).
const LimitRule = "must be an integer from 1 to 200"

// IntegerRule is the message for a value of an integer field bounded lo to
// hi that it refuses: the decoder (lib/jsonstrict) tells a number that is
// no integer (1.5) so, from the field's openapi min/max tags, and a handler
// an integer out of the bounds in the same words (jobs QA: the handlers
// added "(milliseconds)" or "null or", so 1.5 and 0 in one field were told
// two rules).
func IntegerRule(lo, hi any) string { return fmt.Sprintf("must be an integer from %v to %v", lo, hi) }

// FieldError names one invalid request field by its dotted path from the body
// root (for example "retryPolicy.maxAttempts") or by its query parameter name.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// MaxProblems bounds the problems one refusal lists: enough to fix a
// request by, and an answer of a few kilobytes whatever the request holds.
// Unbounded, a list of 5 000 malformed tools or dimension names (or a query
// of 9 999 unknown parameters) was answered with every one of them, up to
// 1 MB per request and fifteen times what was sent (edge QA).
const MaxProblems = 20

// MaxFieldBytes bounds the field path a problem names: a path holds the
// request's own keys (an unknown one, a dimension's name, a key inside an
// input a schema refused), and a key may be as long as the body, so a
// refusal that named it as it came (twice: in its message and in
// detail.validation) answered twice the body, which an MCP tool result
// carries three times over (size QA: a 1 MB unknown key answered 2 MB, and
// an MCP tool call sent alone was refused as too large to answer, -32600).
const MaxFieldBytes = 1024

// fieldTail is how much of a path's end CutField keeps: where the key at
// fault usually is.
const fieldTail = 256

// CutField is path when it holds at most MaxFieldBytes bytes, and
// otherwise its start and its end around "…", MaxFieldBytes bytes in all,
// cut between characters: enough to find the key at fault.
func CutField(path string) string {
	if len(path) <= MaxFieldBytes {
		return path
	}
	head := MaxFieldBytes - fieldTail - len("…")
	for head > 0 && !utf8.RuneStart(path[head]) {
		head--
	}
	tail := len(path) - fieldTail
	for tail < len(path) && !utf8.RuneStart(path[tail]) {
		tail++
	}
	return path[:head] + "…" + path[tail:]
}

// Invalid is a 400 invalid_request listing the problems found, the first
// MaxProblems of them in the order they were found, each field cut to
// MaxFieldBytes (CutField).
func Invalid(problems ...FieldError) *Error {
	problems = problems[:min(len(problems), MaxProblems)]
	if len(problems) > 0 {
		cut := make([]FieldError, len(problems))
		for i, p := range problems {
			cut[i] = FieldError{Field: CutField(p.Field), Message: p.Message}
		}
		problems = cut
	}
	msg := "The request is invalid."
	if len(problems) > 0 {
		msg = fmt.Sprintf("The request is invalid: %s %s.", problems[0].Field, problems[0].Message)
	}
	if problems == nil {
		problems = []FieldError{}
	}
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalidRequest, Message: msg,
		Detail: map[string]any{"validation": problems}}
}

// InvalidField is Invalid with a single problem.
func InvalidField(field, format string, args ...any) *Error {
	return Invalid(FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Problems collects field errors while validating a request, so one response
// can name every problem rather than the first.
type Problems []FieldError

// Add records a problem with field.
func (p *Problems) Add(field, format string, args ...any) {
	*p = append(*p, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Err returns a 400 invalid_request for the collected problems, or nil.
func (p Problems) Err() error {
	if len(p) == 0 {
		return nil
	}
	return Invalid(p...)
}

// NotFound is the answer for unknown and cross-tenant ids alike, so a caller
// learns nothing about other workspaces.
func NotFound(what string) *Error {
	return New(http.StatusNotFound, CodeNotFound, "No such %s in this workspace.", what)
}

// Unauthorized never echoes the presented key.
func Unauthorized(reason string) *Error {
	return New(http.StatusUnauthorized, CodeUnauthorized, "%s", reason)
}

// Forbidden names what the caller lacks in detail.required (scope names, or
// tool:<name>@<version> entries).
func Forbidden(required ...string) *Error {
	if required == nil {
		required = []string{}
	}
	return &Error{Status: http.StatusForbidden, Code: CodeForbidden,
		Message: "This key may not do that.", Detail: map[string]any{"required": required}}
}

// ForbiddenAnyOf is Forbidden for a route any one of several scopes opens:
// detail.required names the first, as for any other route, and
// detail.any_of every alternative (holding one of them is enough).
func ForbiddenAnyOf(scopes ...string) *Error {
	e := Forbidden(scopes[0])
	e.Message = "This key may not do that: it needs one of " + strings.Join(scopes, ", ") + "."
	e.Detail["any_of"] = scopes
	return e
}

// InvalidState is a 409 for a transition that is not legal from the current state.
func InvalidState(format string, args ...any) *Error {
	return New(http.StatusConflict, CodeInvalidState, format, args...)
}

// Conflict is a 409 with the given code.
func Conflict(code, format string, args ...any) *Error {
	return New(http.StatusConflict, code, format, args...)
}

// VersionConflict is a 409 version_conflict for a stale expected version.
func VersionConflict(current int64) *Error {
	return New(http.StatusConflict, CodeVersionConflict,
		"The expected version is stale; re-read and try again.").WithDetail("current_version", current)
}

// RateLimited is a 429 telling the caller how long to wait.
func RateLimited(retryAfterSeconds int) *Error {
	return New(http.StatusTooManyRequests, CodeRateLimited, "Too many requests for this key.").
		WithDetail("retry_after_seconds", retryAfterSeconds)
}

// RequestTimeout is the 408 of a request whose body had not arrived when its
// time ran out: nothing was done with it.
func RequestTimeout() *Error {
	return New(http.StatusRequestTimeout, CodeRequestTimeout,
		"The request's body did not arrive within the request's time; nothing was done. Send it again.")
}

// CodeClientClosedRequest is the code of a request whose client went away
// before it was answered (nginx's 499): an answer no client reads, but a
// log, a proxy, or an MCP tool call built on the request may.
const CodeClientClosedRequest = "client_closed_request"

// ClientClosed is the 499 of a request whose client went away: it stopped
// where it was.
func ClientClosed() *Error {
	return New(499, CodeClientClosedRequest, "The client closed the request.")
}

// PayloadTooLarge is a 413.
func PayloadTooLarge(limit int64) *Error {
	return New(http.StatusRequestEntityTooLarge, CodePayloadTooLarge,
		"The body or result exceeds the published limit.").WithDetail("limit_bytes", limit)
}

// Outcomes of a request the database failed, in a database_unavailable's
// detail.outcome: whether a retry could repeat what it did.
const (
	OutcomeNotApplied = "not_applied" // nothing reached the database
	OutcomeUnknown    = "unknown"     // a statement was sent; it may have committed
)

// DatabaseUnavailable is a 503 returned when Postgres could not be reached
// before anything was sent: the request changed nothing.
func DatabaseUnavailable(cause error) *Error {
	return New(http.StatusServiceUnavailable, CodeDatabaseUnavailable,
		"The database is unavailable; nothing was changed. Retry with backoff.").Wrap(cause).
		WithDetail("outcome", OutcomeNotApplied)
}

// DatabaseLost is a 503 for a request whose database connection failed (or
// whose time ran out) after a statement was sent: it may have been applied.
// A retry under the same idempotency key or lease token answers what
// happened; a call without one may already have taken effect.
func DatabaseLost(cause error) *Error {
	return New(http.StatusServiceUnavailable, CodeDatabaseUnavailable,
		"The database became unavailable while the request ran, so it may have been applied. "+retryUnderKey).Wrap(cause).
		WithDetail("outcome", OutcomeUnknown)
}

// TimedOut returns a copy of e saying the database was reached but did not
// answer in time, instead of being unavailable (chaos QA: a route held up
// by a lock was answered "the database is unavailable"); the outcome stays
// as e says.
func (e *Error) TimedOut() *Error {
	c := *e
	if e.Detail["outcome"] == OutcomeNotApplied {
		c.Message = "The database did not answer in time; nothing was changed. Retry with backoff."
	} else {
		c.Message = "The database did not answer in time, so the request may have been applied. " + retryUnderKey
	}
	return &c
}

// PoolBusy is a 503 for a request that waited in vain for one of its
// instance's database connections, all in use by other requests: nothing
// was sent, so nothing was changed.
func PoolBusy(cause error) *Error {
	return New(http.StatusServiceUnavailable, CodeDatabaseUnavailable,
		"Every database connection of this instance stayed in use; nothing was changed. Retry with backoff.").
		Wrap(cause).WithDetail("outcome", OutcomeNotApplied)
}

// retryUnderKey is what a client does about an outcome it cannot know.
const retryUnderKey = "Retry with backoff under the same idempotency key or lease token, which answers what happened."

// Internal hides cause behind a generic 500.
func Internal(cause error) *Error {
	return New(http.StatusInternalServerError, CodeInternal, "Internal error.").Wrap(cause)
}

// Statuses maps every code to its HTTP status, for documentation (OpenAPI)
// and for tests that check the table is honoured.
var Statuses = map[string]int{
	CodeInvalidRequest:         400,
	CodeCostRequired:           400,
	CodeDimensionRequired:      400,
	CodeApprovalAboveCeiling:   400,
	CodeUnauthorized:           401,
	CodeInsufficientCredit:     402,
	CodeQuotaExhausted:         402,
	CodeForbidden:              403,
	CodeBudgetExceeded:         403,
	CodeCostCeilingExceeded:    403,
	CodeRunBudgetExceeded:      403,
	CodeKeyBudgetExceeded:      403,
	CodeDimensionLimitExceeded: 403,
	CodePolicyDenied:           403,
	CodeMaxAttemptsExceeded:    403,
	CodeApprovalRejected:       403,
	CodeCircuitOpen:            403,
	CodeNotFound:               404,
	CodeMethodNotAllowed:       405,
	CodeIdempotencyKeyReuse:    409,
	CodeInvalidState:           409,
	CodeLeaseExpired:           409,
	CodeLeaseLost:              409,
	CodeRetryRequest:           409,
	CodeGroupUnwinding:         409,
	CodeVersionConflict:        409,
	CodeRequestTimeout:         408,
	CodePayloadTooLarge:        413,
	CodeRateLimited:            429,
	CodeInternal:               500,
	CodeBillingUnavailable:     503,
	CodeDatabaseUnavailable:    503,
}

// Of builds an error with code's documented status.
func Of(code, format string, args ...any) *Error {
	status, ok := Statuses[code]
	if !ok {
		status = http.StatusInternalServerError
	}
	return New(status, code, format, args...)
}

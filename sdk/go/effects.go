package ratchet

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"time"
)

// Begin decisions (API.md §2.1).
const (
	DecisionExecute          = "execute"
	DecisionDuplicate        = "duplicate"
	DecisionInFlight         = "in_flight"
	DecisionBlocked          = "blocked"
	DecisionApprovalRequired = "approval_required"
	DecisionDenied           = "denied"
)

// Effect states.
const (
	EffectLeased           = "leased"
	EffectSucceeded        = "succeeded"
	EffectFailed           = "failed"
	EffectIndeterminate    = "indeterminate"
	EffectAwaitingApproval = "awaiting_approval"
	EffectDenied           = "denied"
)

// Report outcomes for an effect.
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
)

// BeginRequest asks the gate for permission to perform one side effect.
type BeginRequest struct {
	// EffectType names the kind of action ("email.send"); its policy applies.
	EffectType string `json:"effect_type"`
	// IdempotencyKey identifies the logical action: derive it from the work
	// ("welcome-email:user_123"), never from time or randomness. Blind it
	// with BlindKey when the recorded result is sensitive.
	IdempotencyKey string `json:"idempotency_key"`
	// Payload describes the action; with EffectType, CostMicros and
	// Dimensions it forms the fingerprint a reused key must match. It is
	// compared as JSON: a nil map or slice is null, an empty one {} or [],
	// and those are different payloads (409 idempotency_key_reuse), so
	// build it the same way on every retry.
	Payload any `json:"payload"`
	// CostMicros is the declared cost in micros of USD (Micros helps); nil
	// declares none, which differs from Micros(0) in the fingerprint.
	CostMicros *int64 `json:"cost_micros,omitempty"`
	// Dimensions name counterparties for per-dimension ceilings.
	Dimensions map[string]string `json:"dimensions,omitempty"`
	// RunID ties the effect to a run (and its budget).
	RunID string `json:"run_id,omitempty"`
	// GroupID joins an effect group (see Compensation).
	GroupID string `json:"group_id,omitempty"`
	// Compensation declares how to undo this effect within its group.
	Compensation *Compensation `json:"compensation,omitempty"`
	// CompensatesEffectID marks this effect as the undo of another; use it
	// with the unwind plan's suggested key so a retried rollback is deduplicated.
	CompensatesEffectID string `json:"compensates_effect_id,omitempty"`
	// LeaseSeconds may shorten the policy's lease (a longer one is capped).
	LeaseSeconds int `json:"lease_seconds,omitempty"`
	// RequestID names this call across its retries (16-255 printable
	// characters, random: the gate keeps it with the attempt and answers a
	// repeat of it, from the same key, with the same lease while it is
	// live). Begin fills a random one when it is empty,
	// so that a retry of a begin whose answer was lost (a dropped
	// connection) gets the same execute and lease token instead of
	// in_flight. Set it only to span retries of your own of a begin whose
	// answer was lost, e.g. a process that must begin again after a timeout
	// of its caller. Never reuse one once an action may have run under its
	// lease (a DoEffect that returned, a process that crashed mid-action):
	// while that lease is live its begin is handed the same execute, and
	// the action runs twice (QA).
	RequestID string `json:"request_id,omitempty"`
}

// Compensation is the undo action declared for a grouped effect.
type Compensation struct {
	EffectType string `json:"effect_type"` // the undo action's effect type
	Payload    any    `json:"payload"`     // the undo action's payload
}

// Micros returns a pointer to n, for BeginRequest.CostMicros.
func Micros(n int64) *int64 { return &n }

// PriorAttempt describes the earlier attempt behind a blocked or probe
// decision.
type PriorAttempt struct {
	Attempt        int        `json:"attempt"`          // its attempt number
	StartedAt      *time.Time `json:"started_at"`       // when it was granted execute
	LeaseExpiredAt *time.Time `json:"lease_expired_at"` // when its lease lapsed unreported
}

// BeginResponse is the gate's decision. Which fields are set depends on
// Decision (API.md §2.1). For DecisionDenied, Denial holds the error
// envelope the server sent along with HTTP 403.
type BeginResponse struct {
	Decision string `json:"decision"` // one of the Decision* constants
	EffectID string `json:"effect_id"`
	State    string `json:"state"`   // one of the Effect* state constants
	Attempt  int    `json:"attempt"` // execute grants so far
	// LeaseToken and LeaseExpiresAt come with execute: report with the token.
	LeaseToken     string     `json:"lease_token,omitempty"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	// Probe (execute) asks the holder to check the vendor for PriorAttempt
	// first; PriorAttempt also comes with blocked.
	Probe        bool          `json:"probe,omitempty"`
	PriorAttempt *PriorAttempt `json:"prior_attempt,omitempty"`
	// Result is the recorded result (duplicate).
	Result json.RawMessage `json:"result,omitempty"`
	// RetryAfterSeconds is how long to wait before asking again (in_flight).
	RetryAfterSeconds int `json:"retry_after_seconds,omitempty"`
	// ApprovalID names the pending approval (approval_required).
	ApprovalID string `json:"approval_id,omitempty"`
	// Denial is the error sent with a denied decision (HTTP 403).
	Denial *Error `json:"-"`

	serverDate time.Time // the response's Date header, when it had one
}

// setServerDate implements serverDated.
func (b *BeginResponse) setServerDate(t time.Time) { b.serverDate = t }

// Begin asks before acting (POST /api/v1/effects/begin). A denial is not an
// error here: it comes back as Decision "denied" with Denial set. Begin is
// idempotent by key and retried (409 retry_request at once).
func (c *Client) Begin(ctx context.Context, req BeginRequest) (*BeginResponse, error) {
	if req.RequestID == "" {
		req.RequestID = newRequestID()
	}
	var out BeginResponse
	// The same body, request id included, each retry. Every supported
	// server takes request_id (since migration 0028): a begin is never sent
	// without it, which would cost a lost answer its lease (sdk QA: the
	// fallback for a server without the field asked again without it, and
	// the Python and TypeScript SDKs never did).
	err := c.do(ctx, "POST", "/effects/begin", req, &out, idempotent)
	if err == nil {
		return &out, nil
	}
	var apiErr *Error
	if errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusForbidden {
		var denied BeginResponse
		if json.Unmarshal(apiErr.body, &denied) == nil && denied.Decision == DecisionDenied {
			denied.Denial = apiErr
			return &denied, nil
		}
	}
	return nil, err
}

// EffectAttempt is one attempt in an effect's history.
type EffectAttempt struct {
	Attempt   int       `json:"attempt"`    // from 1
	Outcome   *string   `json:"outcome"`    // succeeded, failed, indeterminate or null while leased
	Probe     bool      `json:"probe"`      // granted to find out what an unknown attempt did
	StartedAt time.Time `json:"started_at"` // when execute was granted
	// LeaseExpiresAt is the lease's (last) expiry, never nil (a pointer,
	// kept so code that reads it compiles).
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	ReportedAt     *time.Time `json:"reported_at"` // when a report or resolve recorded it
	// The keys that began, reported and resolved it, when it was resolved,
	// and the resolve's note ("reconciliation" or "probe" when those
	// settled it).
	BeganByKeyID    string     `json:"began_by_key_id"`
	ReportedByKeyID *string    `json:"reported_by_key_id"`
	ResolvedByKeyID *string    `json:"resolved_by_key_id"`
	ResolvedAt      *time.Time `json:"resolved_at"`
	ResolveNote     *string    `json:"resolve_note"`
}

// Effect is the gate's record of one idempotency key.
type Effect struct {
	ID             string          `json:"id"`
	EffectType     string          `json:"effect_type"`
	IdempotencyKey string          `json:"idempotency_key"`
	State          string          `json:"state"`    // one of the Effect* state constants
	Attempt        int             `json:"attempt"`  // execute grants so far
	Attempts       []EffectAttempt `json:"attempts"` // the history, oldest first
	Result         json.RawMessage `json:"result"`   // the recorded result, if succeeded (single reads)
	// ResultUnreadable is true when the server cannot decrypt the recorded
	// result (sealed with an encryption key it is no longer configured
	// with); Result is then null, on single reads and in lists alike.
	ResultUnreadable bool `json:"result_unreadable"`
	// ResultPreview and PayloadPreview show the result's and the payload's
	// shape with values redacted.
	ResultPreview  json.RawMessage `json:"result_preview"`
	PayloadPreview json.RawMessage `json:"payload_preview"`
	CostMicros     *int64          `json:"cost_micros"`
	RunID          *string         `json:"run_id"`
	GroupID        *string         `json:"group_id"`
	// CompensatesEffectID is the group step this effect undoes, if any.
	CompensatesEffectID *string    `json:"compensates_effect_id"`
	DenialCode          *string    `json:"denial_code"`      // why it was denied, if it was
	ApprovalID          *string    `json:"approval_id"`      // the approval it asked for, if any
	LeaseExpiresAt      *time.Time `json:"lease_expires_at"` // the live lease's expiry while leased
	CreatedAt           time.Time  `json:"created_at"`
	UpdatedAt           time.Time  `json:"updated_at"`
}

// ReportEffect records what happened (POST /api/v1/effects/{id}/report).
// Report OutcomeFailed only when the action surely did not reach the outside
// world; when unsure, report nothing. Repeating the same report with the
// same token is answered the same, so it is retried.
func (c *Client) ReportEffect(ctx context.Context, effectID, leaseToken, outcome string, result any) (*Effect, error) {
	body := struct {
		LeaseToken string          `json:"lease_token"`
		Outcome    string          `json:"outcome"`
		Result     json.RawMessage `json:"result,omitempty"`
	}{LeaseToken: leaseToken, Outcome: outcome}
	if result != nil {
		raw, err := json.Marshal(result)
		if err != nil {
			return nil, err
		}
		body.Result = raw
	}
	var out Effect
	if err := c.do(ctx, "POST", "/effects/"+pathID(effectID)+"/report", body, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// HeartbeatEffect extends an effect's lease and returns its new expiry.
func (c *Client) HeartbeatEffect(ctx context.Context, effectID, leaseToken string) (time.Time, error) {
	hb, err := c.heartbeatEffect(ctx, effectID, leaseToken)
	return hb.LeaseExpiresAt, err
}

// effectHeartbeat is a heartbeat's answer with the server's Date.
type effectHeartbeat struct {
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	serverDate     time.Time
}

// setServerDate implements serverDated.
func (h *effectHeartbeat) setServerDate(t time.Time) { h.serverDate = t }

// heartbeatEffect is HeartbeatEffect keeping the response's Date.
func (c *Client) heartbeatEffect(ctx context.Context, effectID, leaseToken string) (effectHeartbeat, error) {
	var out effectHeartbeat
	err := c.do(ctx, "POST", "/effects/"+pathID(effectID)+"/heartbeat", map[string]string{"lease_token": leaseToken}, &out, idempotent)
	return out, err
}

// GetEffect reads an effect with its attempts (scope effects:read).
func (c *Client) GetEffect(ctx context.Context, effectID string) (*Effect, error) {
	var out Effect
	if err := c.do(ctx, "GET", "/effects/"+pathID(effectID), nil, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// BlindKey derives an idempotency key that is still deterministic but not
// guessable: hex HMAC-SHA-256 of key under secret, first 32 characters. Use
// it when a duplicate's recorded result must not be readable by anyone who
// can guess the meaningful key. Keep secret out of source.
func BlindKey(secret, key string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(key))
	return hex.EncodeToString(mac.Sum(nil))[:32]
}

// newRequestID is a random BeginRequest.RequestID.
func newRequestID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

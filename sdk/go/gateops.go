package ratchet

import (
	"context"
	"time"
)

// Policy is an effect type's policy (GET /api/v1/policies/{effect_type}):
// an unconfigured type reads as the safe default, Version 0.
type Policy struct {
	EffectType      string `json:"effect_type"`
	Version         int64  `json:"version"`
	Mode            string `json:"mode"`             // one of the PolicyMode* constants
	OnIndeterminate string `json:"on_indeterminate"` // one of the OnIndeterminate* constants
	LeaseSeconds    int    `json:"lease_seconds"`
	MaxAttempts     int    `json:"max_attempts"`
	// Money in micros of USD; nil for no limit.
	MaxCostMicros              *int64                    `json:"max_cost_micros"`
	ApprovalAboveMicros        *int64                    `json:"approval_above_micros"`
	DailyBudgetMicros          *int64                    `json:"daily_budget_micros"`
	ReconcileEveryHours        *int                      `json:"reconcile_every_hours"`
	RequireCost                bool                      `json:"require_cost"`
	RequiredDimensions         []string                  `json:"required_dimensions"`
	DimensionLimits            map[string]DimensionLimit `json:"dimension_limits"`
	StructuringThresholdMicros *int64                    `json:"structuring_threshold_micros"`
	SurgePerHour               *int                      `json:"surge_per_hour"`
	SurgeMultiplier            *int                      `json:"surge_multiplier"`
	SurgeAction                string                    `json:"surge_action"` // monitor, require_approval or deny
	SurgeCooldownSeconds       int                       `json:"surge_cooldown_seconds"`
	RetentionDays              int                       `json:"retention_days"`
	UpdatedAt                  *time.Time                `json:"updated_at"`
	// LastReconciledAt is when the type was last reconciled (Reconcile), nil
	// before the first; its ReconcileEveryHours calendar restarts there.
	// Read-only: PolicyUpdate cannot set it.
	LastReconciledAt *time.Time `json:"last_reconciled_at"`
}

// DimensionLimit bounds one dimension's value per UTC day: by the cost it
// declares and by count (nil: no bound). A policy answers both fields. In
// an update (PolicyUpdate{"dimension_limits": map[string]DimensionLimit{...}})
// either may be nil, sent as null, as the server takes a field left out or
// null; not both (400 invalid_request at dimension_limits.<name>: it would
// limit nothing). DailyMicros is 0 to 10^18, DailyCount at least 1.
type DimensionLimit struct {
	DailyMicros *int64 `json:"daily_micros"`
	DailyCount  *int64 `json:"daily_count"`
}

// ListEffectPolicies pages the workspace's configured effect-type
// policies (policies:read).
func (c *Client) ListEffectPolicies(ctx context.Context, q ListQuery) (*GatePage[Policy], error) {
	return call[GatePage[Policy]](ctx, c, "GET", withQuery("/policies", q.values()), nil, idempotent)
}

// Policy modes (Policy.Mode): what a begin of the type meets.
const (
	PolicyModeAllow           = "allow"
	PolicyModeRequireApproval = "require_approval"
	PolicyModeDeny            = "deny"
)

// What a begin meets whose key's last attempt's outcome is unknown
// (Policy.OnIndeterminate): blocked until resolved, a new attempt, or a
// probe to find out what the last one did.
const (
	OnIndeterminateBlock = "block"
	OnIndeterminateRetry = "retry"
	OnIndeterminateProbe = "probe"
)

// GetEffectPolicy reads effectType's policy, the safe default when it has
// none.
func (c *Client) GetEffectPolicy(ctx context.Context, effectType string) (*Policy, error) {
	return call[Policy](ctx, c, "GET", "/policies/"+pathID(effectType), nil, idempotent)
}

// Structuring is how closely the costs declared for an effect type crowd
// its watch line (GET /api/v1/policies/{effect_type}/structuring): a
// measure, never enforced.
type Structuring struct {
	EffectType string `json:"effect_type"`
	// ThresholdMicros is the line: structuring_threshold_micros, else
	// max_cost_micros, else nil (then only declarations are counted).
	ThresholdMicros *int64 `json:"threshold_micros"`
	// ThresholdFrom names the policy field the line comes from
	// (ThresholdFromStructuringThreshold or ThresholdFromMaxCost), nil
	// without one.
	ThresholdFrom *string             `json:"threshold_from"`
	AsOf          time.Time           `json:"as_of"`
	Windows       []StructuringWindow `json:"windows"` // the last 24 hours, then 7 days
}

// The policy fields a structuring line comes from (Structuring.ThresholdFrom).
const (
	ThresholdFromStructuringThreshold = "structuring_threshold_micros"
	ThresholdFromMaxCost              = "max_cost_micros"
)

// StructuringWindow counts the begins that declared a cost in the Hours up
// to AsOf by where the cost sat against the line (the bands nil without a
// line).
type StructuringWindow struct {
	Hours              int    `json:"hours"`
	Declared           int64  `json:"declared"`
	Below80Percent     *int64 `json:"below_80_percent"`
	From80To90Percent  *int64 `json:"from_80_to_90_percent"`
	From90To100Percent *int64 `json:"from_90_to_100_percent"`
	AtOrAbove          *int64 `json:"at_or_above"`
	// ShareJustBelow is From90To100Percent / Declared: nil without a line
	// or without declarations.
	ShareJustBelow *float64 `json:"share_just_below"`
}

// GetPolicyStructuring reads how closely the costs declared for effectType
// over the last 24 hours and 7 days crowd its watch line
// (structuring_threshold_micros, else max_cost_micros): declarations by
// band of the line and the share just below it (policies:read).
func (c *Client) GetPolicyStructuring(ctx context.Context, effectType string) (*Structuring, error) {
	return call[Structuring](ctx, c, "GET", "/policies/"+pathID(effectType)+"/structuring", nil, idempotent)
}

// UpdateEffectPolicy merges update (by the API's snake_case names: "mode",
// "max_cost_micros", ...; nil clears a nullable field; a list or map sent,
// required_dimensions or dimension_limits, replaces the stored one whole: a
// dimension left out of dimension_limits loses its limit) into
// effectType's policy and returns it (policies:write). With expectedVersion set it
// merges only while that is still the policy's version (0 for a type still
// on the safe default; otherwise *Error code version_conflict); nil merges
// whatever the version. It is retried under an Idempotency-Key of its own,
// so that a retry after a lost answer is answered the first answer and
// never writes over another operator's update made since.
func (c *Client) UpdateEffectPolicy(ctx context.Context, effectType string, expectedVersion *int64,
	update PolicyUpdate) (*Policy, error) {
	return c.UpdateEffectPolicyWithKey(ctx, effectType, expectedVersion, update, "")
}

// UpdateEffectPolicyWithKey is UpdateEffectPolicy under an Idempotency-Key
// of the caller's (a fresh one when empty), sent on each of its retries: a
// retry from another process under the first call's key is answered the
// first answer.
func (c *Client) UpdateEffectPolicyWithKey(ctx context.Context, effectType string, expectedVersion *int64,
	update PolicyUpdate, idempotencyKey string) (*Policy, error) {
	extra := map[string]any{}
	if expectedVersion != nil {
		extra["expected_version"] = *expectedVersion
	}
	body := update.with(extra)
	return callKeyed[Policy](ctx, c, "PUT", "/policies/"+pathID(effectType), idempotencyKey, body)
}

// Circuit is an effect type's breaker (GET /api/v1/circuits): closed, or
// open by a surge, an operator or the emergency stop, with the action
// begins of the type meet while it is.
type Circuit struct {
	EffectType           string     `json:"effect_type"`
	State                string     `json:"state"`     // CircuitClosed or CircuitOpen
	OpenedBy             *string    `json:"opened_by"` // one of the CircuitOpenedBy* constants
	Action               *string    `json:"action"`    // monitor, require_approval or deny
	Reason               *string    `json:"reason"`
	VolumeLastHour       int64      `json:"volume_last_hour"`
	BaselineMedianHourly *float64   `json:"baseline_median_hourly"`
	Threshold            *int64     `json:"threshold"`
	OpenedAt             *time.Time `json:"opened_at"`
	ClosesAt             *time.Time `json:"closes_at"`
}

// Circuit states (Circuit.State), and the emergency stop's (StopState.State).
const (
	CircuitClosed = "closed"
	CircuitOpen   = "open"
)

// What opened a circuit (Circuit.OpenedBy): a surge, an operator
// (OpenCircuit) or the emergency stop.
const (
	CircuitOpenedBySurge  = "surge"
	CircuitOpenedByManual = "manual"
	CircuitOpenedByStop   = "stop"
)

// Breaker actions for OpenCircuit and EmergencyStop.
const (
	BreakerMonitor         = "monitor"
	BreakerRequireApproval = "require_approval"
	BreakerDeny            = "deny"
)

// breakerBody is the body of a circuit's open and of the emergency stop.
type breakerBody struct {
	Action string `json:"action,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// ListCircuits pages the circuit of every effect type seen or configured
// (policies:write).
func (c *Client) ListCircuits(ctx context.Context, q ListQuery) (*GatePage[Circuit], error) {
	return call[GatePage[Circuit]](ctx, c, "GET", withQuery("/circuits", q.values()), nil, idempotent)
}

// OpenCircuit opens effectType's breaker by hand: its begins meet action
// (BreakerRequireApproval when empty) until CloseCircuit. It is retried
// under an Idempotency-Key of its own, as are the other breaker calls, so
// that a retry after a lost answer is answered the first answer and never
// opens again a breaker another operator closed since.
func (c *Client) OpenCircuit(ctx context.Context, effectType, action, reason string) (*Circuit, error) {
	return c.OpenCircuitWithKey(ctx, effectType, action, reason, "")
}

// OpenCircuitWithKey is OpenCircuit under an Idempotency-Key of the
// caller's (a fresh one when empty), as UpdateEffectPolicyWithKey.
func (c *Client) OpenCircuitWithKey(ctx context.Context, effectType, action, reason, idempotencyKey string) (*Circuit, error) {
	return callKeyed[Circuit](ctx, c, "POST", "/circuits/"+pathID(effectType)+"/open", idempotencyKey,
		breakerBody{Action: action, Reason: reason})
}

// CloseCircuit closes effectType's breaker, with a fresh surge allowance
// counted from now. A retry never closes a breaker that tripped again
// since (an Idempotency-Key of its own).
func (c *Client) CloseCircuit(ctx context.Context, effectType string) (*Circuit, error) {
	return c.CloseCircuitWithKey(ctx, effectType, "")
}

// CloseCircuitWithKey is CloseCircuit under an Idempotency-Key of the
// caller's (a fresh one when empty), as UpdateEffectPolicyWithKey.
func (c *Client) CloseCircuitWithKey(ctx context.Context, effectType, idempotencyKey string) (*Circuit, error) {
	return callKeyed[Circuit](ctx, c, "POST", "/circuits/"+pathID(effectType)+"/close", idempotencyKey, struct{}{})
}

// EmergencyStop holds every effect type, those first seen while it is on
// included, with action (BreakerRequireApproval when empty) until
// ReleaseEmergencyStop. It answers at most the first 200 circuits, without
// a cursor: ListCircuits pages them all. A retry never stops again after
// another operator's release (an Idempotency-Key of its own).
func (c *Client) EmergencyStop(ctx context.Context, action, reason string) (*GatePage[Circuit], error) {
	return c.EmergencyStopWithKey(ctx, action, reason, "")
}

// EmergencyStopWithKey is EmergencyStop under an Idempotency-Key of the
// caller's (a fresh one when empty), as UpdateEffectPolicyWithKey.
func (c *Client) EmergencyStopWithKey(ctx context.Context, action, reason, idempotencyKey string) (*GatePage[Circuit], error) {
	return callKeyed[GatePage[Circuit]](ctx, c, "POST", "/circuits/stop", idempotencyKey,
		breakerBody{Action: action, Reason: reason})
}

// StopState is whether the emergency stop is on (GET /api/v1/circuits/stop):
// State open with its action, reason and when it opened, or closed with
// the rest nil.
type StopState struct {
	State    string     `json:"state"`  // CircuitClosed or CircuitOpen
	Action   *string    `json:"action"` // monitor, require_approval or deny
	Reason   *string    `json:"reason"`
	OpenedAt *time.Time `json:"opened_at"`
}

// GetEmergencyStop reads whether the emergency stop is on, which the
// circuits list shows only on the types it holds (a type's own stricter
// breaker shows instead). A server older than the route answers 404.
func (c *Client) GetEmergencyStop(ctx context.Context) (*StopState, error) {
	return call[StopState](ctx, c, "GET", "/circuits/stop", nil, idempotent)
}

// ReleaseEmergencyStop lifts the emergency stop; breakers of single types
// stay as they are. It answers circuits as EmergencyStop does. A retry
// never lifts a stop another operator put on since (an Idempotency-Key of
// its own).
func (c *Client) ReleaseEmergencyStop(ctx context.Context) (*GatePage[Circuit], error) {
	return c.ReleaseEmergencyStopWithKey(ctx, "")
}

// ReleaseEmergencyStopWithKey is ReleaseEmergencyStop under an
// Idempotency-Key of the caller's (a fresh one when empty), as
// UpdateEffectPolicyWithKey.
func (c *Client) ReleaseEmergencyStopWithKey(ctx context.Context, idempotencyKey string) (*GatePage[Circuit], error) {
	return callKeyed[GatePage[Circuit]](ctx, c, "POST", "/circuits/release", idempotencyKey, struct{}{})
}

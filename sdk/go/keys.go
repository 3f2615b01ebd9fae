package ratchet

import (
	"context"
	"time"
)

// Scopes a key may hold (APIKey.Scopes, KeySpec.Scopes): a route needs one.
const (
	ScopeEffectsBegin   = "effects:begin"
	ScopeEffectsReport  = "effects:report"
	ScopeEffectsRead    = "effects:read"
	ScopeEffectsResolve = "effects:resolve"
	ScopePoliciesRead   = "policies:read"
	ScopePoliciesWrite  = "policies:write"
	ScopeApprovalsWrite = "approvals:write"
	ScopeKeysWrite      = "keys:write"
	ScopeRunsWrite      = "runs:write"
	ScopeRunsRead       = "runs:read"
	ScopeJobsWork       = "jobs:work"
	ScopeStepsReplay    = "steps:replay"
	ScopeEndpointsWrite = "endpoints:write"
	ScopeContractsWrite = "contracts:write"
	ScopeWebhooksWrite  = "webhooks:write"
	ScopeReconcileWrite = "reconcile:write"
	ScopeBillingWrite   = "billing:write"
)

// APIKey is a key of the workspace (scope keys:write to manage them). Its
// secret is shown once, when it is created (NewAPIKey).
type APIKey struct {
	ID                      string   `json:"id"`
	Name                    string   `json:"name"`
	Scopes                  []string `json:"scopes"` // Scope* constants
	Tools                   []string `json:"tools"`  // name@version pairs a worker key may serve; nil for any
	DailySpendCeilingMicros *int64   `json:"daily_spend_ceiling_micros"`
	RateLimitPerMinute      *int     `json:"rate_limit_per_minute"`
	// CreatedByKeyID is the key that minted this one; nil for a
	// workspace's signup key. Revoking a key leaves the keys it minted
	// live: ListKeysMintedBy lists them; RevokeKeyWithMinted revokes them
	// with it.
	CreatedByKeyID *string    `json:"created_by_key_id"`
	CreatedAt      time.Time  `json:"created_at"`
	RevokedAt      *time.Time `json:"revoked_at"`
}

// NewAPIKey is a created key with its secret: keep it in a secret store.
type NewAPIKey struct {
	APIKey
	Secret string `json:"secret"`
}

// KeySpec is what CreateKey creates: a Preset (AGENT, INGEST, WORKER,
// OPERATOR) or explicit Scopes, never more than the creating key holds;
// Tools bound a WORKER key to exact name@version pairs.
type KeySpec struct {
	Name   string   `json:"name"`
	Preset string   `json:"preset,omitempty"`
	Scopes []string `json:"scopes,omitempty"`
	// Tools is sent as it is: nil (null) leaves the key unrestricted
	// (AGENT, OPERATOR) where an empty list restricts it to no tool.
	Tools                   []string `json:"tools"`
	DailySpendCeilingMicros *int64   `json:"daily_spend_ceiling_micros,omitempty"`
	RateLimitPerMinute      *int     `json:"rate_limit_per_minute,omitempty"`
}

// CreateKey mints a key. Every attempt of the call carries one
// Idempotency-Key, so a retry after a lost answer gets the key (and the
// secret) the first attempt minted instead of a second key.
func (c *Client) CreateKey(ctx context.Context, spec KeySpec) (*NewAPIKey, error) {
	return c.CreateKeyWithKey(ctx, spec, newRequestID())
}

// CreateKeyWithKey is CreateKey under an Idempotency-Key of the caller's
// (at most 255 characters): the same call with the same key within a day
// answers the same key and secret, so a caller whose retries ran out can
// still recover the secret, shown only here.
func (c *Client) CreateKeyWithKey(ctx context.Context, spec KeySpec, idempotencyKey string) (*NewAPIKey, error) {
	return callKeyed[NewAPIKey](ctx, c, "POST", "/keys", idempotencyKey, spec)
}

// ListKeys pages the workspace's keys (never their secrets).
func (c *Client) ListKeys(ctx context.Context, q ListQuery) (*GatePage[APIKey], error) {
	return call[GatePage[APIKey]](ctx, c, "GET", withQuery("/keys", q.values()), nil, idempotent)
}

// ListKeysMintedBy pages the keys that the key keyID minted (their
// CreatedByKeyID; GET /api/v1/keys?created_by=): revoking a key leaves
// them live, so a key found compromised is revoked and then each of
// these. Another workspace's key, or none, lists nothing.
func (c *Client) ListKeysMintedBy(ctx context.Context, keyID string, q ListQuery) (*GatePage[APIKey], error) {
	v := q.values()
	v.Set("created_by", keyID)
	return call[GatePage[APIKey]](ctx, c, "GET", withQuery("/keys", v), nil, idempotent)
}

// CurrentKey reads the client's own key (never its secret): its scopes,
// tools, spend ceiling and rate limit. Any valid key may, whatever its
// scopes.
func (c *Client) CurrentKey(ctx context.Context) (*APIKey, error) {
	return call[APIKey](ctx, c, "GET", "/keys/current", nil, idempotent)
}

// RevokeKey revokes a key for good and returns it; revoking again answers
// the same key, so the call is retried. Every call that changes something
// refuses the key at once, on every instance. A client revoking its own
// key whose answer was lost is refused (401) when it asks again: read the
// key with another to confirm.
func (c *Client) RevokeKey(ctx context.Context, keyID string) (*APIKey, error) {
	return call[APIKey](ctx, c, "DELETE", "/keys/"+pathID(keyID), nil, idempotent)
}

// RevokedAPIKey is what RevokeKeyWithMinted answers: the revoked key and
// the ids of the keys revoked with it.
type RevokedAPIKey struct {
	APIKey
	// MintedRevoked are the ids, sorted, of the keys this call revoked with
	// the key: every live key minted from it, down the tree (through keys
	// revoked before). Keys revoked before are not listed; empty when
	// none was live. A retry (the first answer lost) lists the keys the
	// first call took again (a server of migration 0074 or later).
	MintedRevoked []string `json:"minted_revoked,omitempty"`
}

// RevokeKeyWithMinted revokes a key found compromised and, at once (one
// transaction), every live key minted from it, the keys those minted,
// and so on (DELETE /api/v1/keys/{id}?include_minted=true). If a key of
// the tree is one this client's key may not revoke (403 forbidden) or
// the workspace's last root key (409 invalid_state), nothing is revoked,
// and the error's Detail["key_id"] names that key. Sent again it answers
// the key as RevokeKey does and revokes any key of the tree still live,
// so the call is retried, and it revokes the tree of a key revoked alone
// before.
func (c *Client) RevokeKeyWithMinted(ctx context.Context, keyID string) (*RevokedAPIKey, error) {
	return call[RevokedAPIKey](ctx, c, "DELETE", "/keys/"+pathID(keyID)+"?include_minted=true", nil, idempotent)
}

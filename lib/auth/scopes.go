// Package auth authenticates API keys, checks scopes and tool allow-lists,
// mints and revokes keys, and enforces per-key rate limits that hold across
// serverless instances.
package auth

import (
	"slices"
	"sort"

	"github.com/getratchet/ratchet/lib/apierr"
)

// Scopes (API.md §1). A route names the scope it needs; a key holds a set.
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

// AllScopes lists every scope in a stable order. A scope added later must
// be granted to the existing root keys (every scope, no tools, uncapped) by
// the migration that adds it: RevokeKey keeps the workspace's last root,
// and a key missing the new scope would no longer count as one.
var AllScopes = []string{
	ScopeEffectsBegin, ScopeEffectsReport, ScopeEffectsRead, ScopeEffectsResolve,
	ScopePoliciesRead, ScopePoliciesWrite, ScopeApprovalsWrite, ScopeKeysWrite,
	ScopeRunsWrite, ScopeRunsRead, ScopeJobsWork, ScopeStepsReplay,
	ScopeEndpointsWrite, ScopeContractsWrite, ScopeWebhooksWrite, ScopeReconcileWrite,
	ScopeBillingWrite,
}

// Presets name common scope sets.
var Presets = map[string][]string{
	"OPERATOR": AllScopes,
	"AGENT":    {ScopeEffectsBegin, ScopeEffectsReport},
	"INGEST":   {ScopeRunsWrite, ScopeRunsRead},
	"WORKER":   {ScopeJobsWork},
}

// PresetNames lists the presets in a stable order.
var PresetNames = []string{"OPERATOR", "AGENT", "INGEST", "WORKER"}

// KnownScope reports whether s is a scope.
func KnownScope(s string) bool { return slices.Contains(AllScopes, s) }

// normalizeScopes sorts and deduplicates.
func normalizeScopes(in []string) []string {
	out := slices.Clone(in)
	sort.Strings(out)
	return slices.Compact(out)
}

// Principal is the authenticated caller of one request.
type Principal struct {
	WorkspaceID             string
	KeyID                   string
	Scopes                  []string
	Tools                   []string // nil: any tool (when the key holds jobs:work)
	DailySpendCeilingMicros *int64
	RateLimitPerMinute      *int
}

// Has reports whether the key holds scope.
func (p *Principal) Has(scope string) bool { return slices.Contains(p.Scopes, scope) }

// Require answers 403 forbidden naming every missing scope.
func (p *Principal) Require(scopes ...string) error {
	var missing []string
	for _, s := range scopes {
		if !p.Has(s) {
			missing = append(missing, s)
		}
	}
	if missing != nil {
		return apierr.Forbidden(missing...)
	}
	return nil
}

// ToolRef formats name@version.
func ToolRef(name, version string) string { return name + "@" + version }

// MayWorkTool reports whether the key may register and claim name@version:
// a key with jobs:work and no tools list may work any tool; otherwise only
// the exact listed pairs.
func (p *Principal) MayWorkTool(name, version string) bool {
	if !p.Has(ScopeJobsWork) {
		return false
	}
	return p.Tools == nil || slices.Contains(p.Tools, ToolRef(name, version))
}

// RequireTools answers 403 naming each tool:<name>@<version> the key may not work.
func (p *Principal) RequireTools(refs ...[2]string) error {
	if err := p.Require(ScopeJobsWork); err != nil {
		return err
	}
	var missing []string
	for _, r := range refs {
		if !p.MayWorkTool(r[0], r[1]) {
			missing = append(missing, "tool:"+ToolRef(r[0], r[1]))
		}
	}
	if missing != nil {
		return apierr.Forbidden(missing...)
	}
	return nil
}

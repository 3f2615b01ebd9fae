package httpapi

import (
	"context"
	"net/http"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/ids"
)

// DeniedDecision is a denied begin: HTTP 403 with the decision fields and the
// error envelope side by side.
type DeniedDecision struct {
	decisionFields
	Error apierr.Wire `json:"error"`
}

// decisionFields is gate.Decision embedded under another name: embedded as
// itself, its field Decision would be shadowed by the embedded field's name
// for reflect.VisibleFields, and the OpenAPI schema would lose "decision"
// (encoding/json, which goes by JSON names, writes it either way).
type decisionFields = gate.Decision

// gateRoutes are the effect gate's routes (API.md §2).
func (s *Server) gateRoutes() []Route {
	return []Route{
		{
			Method: "POST", Pattern: "/api/v1/effects/begin", Name: "effects.begin", Tag: "effects",
			Scopes: []string{auth.ScopeEffectsBegin},
			Summary: "Ask before a side effect. Branch on decision: execute (you hold the lease), duplicate " +
				"(use result), in_flight (wait retry_after_seconds), blocked (verify at the vendor, then resolve), " +
				"approval_required (poll), denied (HTTP 403 with the error envelope). A duplicate whose recorded " +
				"result this server cannot decrypt (its encryption key is not configured) is 500 internal_error, " +
				"changing nothing, never a duplicate without its result.",
			Request: gate.BeginRequest{}, Response: gate.Decision{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeCostRequired, apierr.CodeDimensionRequired,
				apierr.CodeIdempotencyKeyReuse, apierr.CodeRetryRequest, apierr.CodePolicyDenied,
				apierr.CodeCostCeilingExceeded, apierr.CodeMaxAttemptsExceeded, apierr.CodeApprovalRejected,
				apierr.CodeBudgetExceeded, apierr.CodeKeyBudgetExceeded, apierr.CodeDimensionLimitExceeded,
				apierr.CodeRunBudgetExceeded, apierr.CodeCircuitOpen, apierr.CodeNotFound,
				apierr.CodeInvalidState, apierr.CodeGroupUnwinding},
			ErrorBodies: map[int]any{http.StatusForbidden: DeniedDecision{}},
			ChecksKey:   true,
			Handle:      s.beginEffect,
		},
		{
			Method: "GET", Pattern: "/api/v1/effects", Name: "effects.list", Tag: "effects",
			Scopes: []string{auth.ScopeEffectsRead},
			Summary: "List effects newest first; results appear only as redacted previews (result_unreadable: true " +
				"marks one this server cannot decrypt).",
			Query: append([]Param{
				{Name: "state", Type: "string", Description: "leased, succeeded, failed, indeterminate, awaiting_approval or denied",
					Enum: []string{gate.StateLeased, gate.StateSucceeded, gate.StateFailed, gate.StateIndeterminate,
						gate.StateAwaitingApproval, gate.StateDenied}, Rule: gate.ListStateRule},
				{Name: "effect_type", Type: "string", Description: "only this effect type",
					Pattern: gate.EffectTypePattern, MaxLength: gate.EffectTypeMaxLength, Valid: gate.ValidEffectType,
					Rule: gate.ListEffectTypeRule},
			}, listParams...),
			Response: Page[gate.Effect]{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Cursor: idCursor(ids.Effect),
			Handle: s.listEffects,
		},
		{
			Method: "GET", Pattern: "/api/v1/effects/{id}", Name: "effects.get", Tag: "effects",
			Scopes: []string{auth.ScopeEffectsRead},
			Summary: "Read an effect with its attempts and recorded result (null with result_unreadable: true when " +
				"this server cannot decrypt it: sealed with an encryption key it is not configured with).",
			Response: gate.Effect{}, Status: 200, Errors: []string{apierr.CodeNotFound},
			Handle: s.getEffect,
		},
		{
			Method: "POST", Pattern: "/api/v1/effects/{id}/report", Name: "effects.report", Tag: "effects",
			Scopes: []string{auth.ScopeEffectsReport},
			Summary: "Report what the lease holder did. failed only when the action surely did not reach the " +
				"outside world; when unsure, report nothing. Repeating a report is safe.",
			Request: gate.ReportRequest{}, Response: gate.Effect{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound, apierr.CodeLeaseExpired,
				apierr.CodeLeaseLost, apierr.CodeInvalidState, apierr.CodePayloadTooLarge},
			Settles: true, Handle: s.reportEffect,
		},
		{
			Method: "POST", Pattern: "/api/v1/effects/{id}/heartbeat", Name: "effects.heartbeat", Tag: "effects",
			Scopes:  []string{auth.ScopeEffectsReport},
			Summary: "Extend a live lease by its length from now.",
			Request: gate.HeartbeatRequest{}, Response: gate.HeartbeatResponse{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound, apierr.CodeLeaseExpired,
				apierr.CodeLeaseLost, apierr.CodeInvalidState},
			Settles: true, Handle: s.heartbeatEffect,
		},
		{
			Method: "POST", Pattern: "/api/v1/effects/{id}/resolve", Name: "effects.resolve", Tag: "effects",
			Scopes:  []string{auth.ScopeEffectsResolve},
			Summary: "Record what an operator found at the vendor for an indeterminate effect; unblocks its key (settled succeeded, a retry's pending approval is closed as rejected).",
			Request: gate.ResolveRequest{}, Response: gate.Effect{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound, apierr.CodeInvalidState,
				apierr.CodePayloadTooLarge},
			Handle: s.resolveEffect,
		},
		{
			Method: "GET", Pattern: "/api/v1/policies", Name: "policies.list", Tag: "policies",
			Scopes: []string{auth.ScopePoliciesRead}, Summary: "List the configured effect-type policies in effect type order.",
			Query: listParams, Response: Page[gate.Policy]{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Cursor: gate.ValidEffectType,
			Handle: s.listPolicies,
		},
		{
			Method: "GET", Pattern: "/api/v1/policies/{effect_type}", Name: "policies.get", Tag: "policies",
			Scopes:   []string{auth.ScopePoliciesRead},
			Summary:  "Read an effect type's policy; an unconfigured type reads as the safe default with version 0.",
			Response: gate.Policy{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Handle: s.getPolicy,
		},
		{
			Method: "GET", Pattern: "/api/v1/policies/{effect_type}/structuring", Name: "policies.structuring",
			Tag: "policies", Scopes: []string{auth.ScopePoliciesRead},
			Summary: "How closely the costs declared for the type crowd its watch line (structuring_threshold_micros, " +
				"else max_cost_micros) over the last 24 hours and 7 days: declarations by band of the line, and the " +
				"share just below it. A measure, never enforced.",
			Response: gate.Structuring{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Handle: s.policyStructuring,
		},
		{
			Method: "PUT", Pattern: "/api/v1/policies/{effect_type}", Name: "policies.put", Tag: "policies",
			Scopes: []string{auth.ScopePoliciesWrite}, Idempotent: true,
			Summary: "Merge fields into an effect type's policy: omitted fields keep their value, null clears a " +
				"nullable one; a list or map sent (required_dimensions, dimension_limits) replaces the one stored " +
				"whole, so a dimension left out of dimension_limits loses its limit: send every limit to keep. " +
				"expected_version, when sent, must equal the current version. A daily ceiling " +
				"set during the day counts the type's earlier grants of that UTC day. reconcile_every_hours turned " +
				"on (from null) starts its reminders' calendar: the first reconciliation.due comes one period " +
				"after the later of that and the type's last reconciliation; changing the period keeps that start. " +
				"Without expected_version: " + retriedAction,
			Request: gate.PutPolicyRequest{}, Response: gate.Policy{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeApprovalAboveCeiling, apierr.CodeVersionConflict,
				apierr.CodeInvalidState},
			Handle: s.putPolicy,
		},
		{
			Method: "GET", Pattern: "/api/v1/approvals", Name: "approvals.list", Tag: "approvals",
			Scopes: []string{auth.ScopeApprovalsWrite}, Summary: "List approvals newest first, optionally by state.",
			Query: append([]Param{{Name: "state", Type: "string", Description: "pending, approved or rejected",
				Enum: []string{gate.ApprovalPending, gate.ApprovalApproved, gate.ApprovalRejected}}},
				listParams...),
			Response: Page[gate.Approval]{}, Status: 200, Errors: []string{apierr.CodeInvalidRequest},
			Cursor: idCursor(ids.Approval),
			Handle: s.listApprovals,
		},
		{
			Method: "GET", Pattern: "/api/v1/approvals/{id}", Name: "approvals.get", Tag: "approvals",
			Scopes:   []string{auth.ScopeApprovalsWrite},
			Summary:  "Read one approval: the approval_id a begin answered with.",
			Response: gate.Approval{}, Status: 200, Errors: []string{apierr.CodeNotFound},
			Handle: s.getApproval,
		},
		{
			Method: "POST", Pattern: "/api/v1/approvals/{id}/approve", Name: "approvals.approve", Tag: "approvals",
			Scopes:  []string{auth.ScopeApprovalsWrite},
			Summary: "Approve a pending effect: the next begin on its key executes.",
			Request: gate.DecideRequest{}, Response: gate.Approval{}, Status: 200,
			Errors: []string{apierr.CodeNotFound, apierr.CodeInvalidState, apierr.CodeGroupUnwinding},
			Handle: s.decideApproval(gate.ApprovalApproved),
		},
		{
			Method: "POST", Pattern: "/api/v1/approvals/{id}/reject", Name: "approvals.reject", Tag: "approvals",
			Scopes:  []string{auth.ScopeApprovalsWrite},
			Summary: "Reject a pending effect: every begin on its key is denied with approval_rejected.",
			Request: gate.DecideRequest{}, Response: gate.Approval{}, Status: 200,
			Errors: []string{apierr.CodeNotFound, apierr.CodeInvalidState},
			Handle: s.decideApproval(gate.ApprovalRejected),
		},
	}
}

func (s *Server) beginEffect(ctx context.Context, c *Call) (any, error) {
	var req gate.BeginRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	d, err := s.Gate.Begin(ctx, c.Principal, req)
	if err != nil {
		return nil, err
	}
	if d.Denial != nil {
		return Reply{Status: http.StatusForbidden, Body: DeniedDecision{decisionFields: d, Error: d.Denial.Wire()}}, nil
	}
	return d, nil
}

func (s *Server) listEffects(ctx context.Context, c *Call) (any, error) {
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	q := c.R.URL.Query()
	effects, err := s.Gate.ListEffects(ctx, c.Principal.WorkspaceID, gate.ListFilter{
		State: q.Get("state"), EffectType: q.Get("effect_type"), Cursor: cursor, Limit: limit + 1})
	if err != nil {
		return nil, err
	}
	return NewPage(ctx, effects, limit, func(e gate.Effect) string { return e.ID })
}

func (s *Server) getEffect(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Effect)
	if err != nil {
		return nil, err
	}
	return s.Gate.GetEffect(ctx, c.Principal.WorkspaceID, id)
}

func (s *Server) reportEffect(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Effect)
	if err != nil {
		return nil, err
	}
	var req gate.ReportRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Gate.Report(ctx, c.Principal, id, req)
}

func (s *Server) heartbeatEffect(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Effect)
	if err != nil {
		return nil, err
	}
	var req gate.HeartbeatRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Gate.Heartbeat(ctx, c.Principal, id, req)
}

func (s *Server) resolveEffect(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Effect)
	if err != nil {
		return nil, err
	}
	var req gate.ResolveRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Gate.Resolve(ctx, c.Principal, id, req)
}

func (s *Server) listPolicies(ctx context.Context, c *Call) (any, error) {
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	policies, err := s.Gate.ListPolicies(ctx, c.Principal.WorkspaceID, cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewPage(ctx, policies, limit, func(p gate.Policy) string { return p.EffectType })
}

func (s *Server) getPolicy(ctx context.Context, c *Call) (any, error) {
	return s.Gate.GetPolicy(ctx, c.Principal.WorkspaceID, c.R.PathValue("effect_type"))
}

func (s *Server) policyStructuring(ctx context.Context, c *Call) (any, error) {
	return s.Gate.Structuring(ctx, c.Principal.WorkspaceID, c.R.PathValue("effect_type"))
}

func (s *Server) putPolicy(ctx context.Context, c *Call) (any, error) {
	var req gate.PutPolicyRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Gate.PutPolicy(ctx, c.Principal.WorkspaceID, c.R.PathValue("effect_type"), req)
}

func (s *Server) listApprovals(ctx context.Context, c *Call) (any, error) {
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	approvals, err := s.Gate.ListApprovals(ctx, c.Principal.WorkspaceID, c.R.URL.Query().Get("state"), cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewPage(ctx, approvals, limit, func(a gate.Approval) string { return a.ID })
}

func (s *Server) getApproval(ctx context.Context, c *Call) (any, error) {
	id, err := c.PathID("id", ids.Approval)
	if err != nil {
		return nil, err
	}
	return s.Gate.GetApproval(ctx, c.Principal.WorkspaceID, id)
}

func (s *Server) decideApproval(state string) HandlerFunc {
	return func(ctx context.Context, c *Call) (any, error) {
		id, err := c.PathID("id", ids.Approval)
		if err != nil {
			return nil, err
		}
		var req gate.DecideRequest
		if err := c.Decode(&req); err != nil {
			return nil, err
		}
		return s.Gate.Decide(ctx, c.Principal, id, state, req)
	}
}

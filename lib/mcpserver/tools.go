package mcpserver

import (
	"context"
	"net/url"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// tool binds one MCP tool to one REST call.
type tool struct {
	name string
	add  func(s *mcp.Server, c Caller, defaultAuth string)
}

// define registers a typed tool whose input maps to (method, path, body).
func define[In any](name, description string, route func(In) (method, path string, body any)) tool {
	return tool{name: name, add: func(s *mcp.Server, c Caller, defaultAuth string) {
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: description},
			func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, any, error) {
				method, path, body := route(in)
				res, err := call(ctx, c, req, defaultAuth, method, path, body)
				return res, nil, err
			})
	}}
}

// BeginInput mirrors POST /api/v1/effects/begin.
type BeginInput struct {
	EffectType          string            `json:"effect_type" jsonschema:"what kind of effect, e.g. email.send or payment.charge"`
	IdempotencyKey      string            `json:"idempotency_key" jsonschema:"derived from the work, deterministically (refund:order_551:full), never random"`
	Payload             any               `json:"payload,omitempty" jsonschema:"the arguments of the action; the same key with other arguments is refused"`
	CostMicros          *int64            `json:"cost_micros,omitempty" jsonschema:"declared cost in micros of USD"`
	Dimensions          map[string]string `json:"dimensions,omitempty" jsonschema:"counterparties such as recipient, for per-destination ceilings"`
	RunID               *string           `json:"run_id,omitempty"`
	GroupID             *string           `json:"group_id,omitempty"`
	Compensation        any               `json:"compensation,omitempty" jsonschema:"how to undo it: {effect_type, payload}"`
	CompensatesEffectID *string           `json:"compensates_effect_id,omitempty"`
	LeaseSeconds        *int              `json:"lease_seconds,omitempty"`
}

// ReportInput mirrors POST /api/v1/effects/{id}/report.
type ReportInput struct {
	EffectID   string `json:"effect_id"`
	LeaseToken string `json:"lease_token"`
	Outcome    string `json:"outcome" jsonschema:"succeeded, or failed only when the action surely did not reach the outside world"`
	Result     any    `json:"result,omitempty"`
}

// HeartbeatInput mirrors POST /api/v1/effects/{id}/heartbeat.
type HeartbeatInput struct {
	EffectID   string `json:"effect_id"`
	LeaseToken string `json:"lease_token"`
}

// ResolveInput mirrors POST /api/v1/effects/{id}/resolve.
type ResolveInput struct {
	EffectID string `json:"effect_id"`
	Outcome  string `json:"outcome" jsonschema:"what the vendor's own record shows: succeeded or failed"`
	Result   any    `json:"result,omitempty"`
	Note     string `json:"note,omitempty"`
}

// EffectInput names one effect.
type EffectInput struct {
	EffectID string `json:"effect_id"`
}

// ListEffectsInput filters GET /api/v1/effects.
type ListEffectsInput struct {
	State      string `json:"state,omitempty" jsonschema:"leased, succeeded, failed, indeterminate, awaiting_approval or denied"`
	EffectType string `json:"effect_type,omitempty"`
	Limit      int    `json:"limit,omitempty"`
	Cursor     string `json:"cursor,omitempty"`
}

// PolicyInput names an effect type.
type PolicyInput struct {
	EffectType string `json:"effect_type"`
}

// ListApprovalsInput filters GET /api/v1/approvals.
type ListApprovalsInput struct {
	State string `json:"state,omitempty" jsonschema:"pending, approved or rejected"`
}

// DecideInput approves or rejects a held effect.
type DecideInput struct {
	ApprovalID string `json:"approval_id"`
	Decision   string `json:"decision" jsonschema:"approve or reject"`
	Note       string `json:"note,omitempty"`
}

func query(params map[string]string) string {
	v := url.Values{}
	for k, p := range params {
		if p != "" {
			v.Set(k, p)
		}
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

// tools are the nine MCP tools.
var tools = []tool{
	define("ratchet_begin", "Ask before you act. Returns decision: execute, duplicate, in_flight, blocked, approval_required or denied.",
		func(in BeginInput) (string, string, any) { return "POST", "/api/v1/effects/begin", in }),
	define("ratchet_report", "Report what happened after an execute decision.",
		func(in ReportInput) (string, string, any) {
			return "POST", "/api/v1/effects/" + pathEscape(in.EffectID) + "/report",
				map[string]any{"lease_token": in.LeaseToken, "outcome": in.Outcome, "result": in.Result}
		}),
	define("ratchet_heartbeat", "Extend a held lease while a long action is still running.",
		func(in HeartbeatInput) (string, string, any) {
			return "POST", "/api/v1/effects/" + pathEscape(in.EffectID) + "/heartbeat", map[string]any{"lease_token": in.LeaseToken}
		}),
	define("ratchet_resolve", "Record what the vendor shows for an indeterminate effect; unblocks its key.",
		func(in ResolveInput) (string, string, any) {
			return "POST", "/api/v1/effects/" + pathEscape(in.EffectID) + "/resolve",
				map[string]any{"outcome": in.Outcome, "result": in.Result, "note": in.Note}
		}),
	define("ratchet_get_effect", "Read one effect with its attempts.",
		func(in EffectInput) (string, string, any) {
			return "GET", "/api/v1/effects/" + pathEscape(in.EffectID), nil
		}),
	define("ratchet_list_effects", "List effects, e.g. state=indeterminate to find what needs verifying.",
		func(in ListEffectsInput) (string, string, any) {
			limit := ""
			if in.Limit > 0 {
				limit = strconv.Itoa(in.Limit)
			}
			return "GET", "/api/v1/effects" + query(map[string]string{"state": in.State, "effect_type": in.EffectType,
				"limit": limit, "cursor": in.Cursor}), nil
		}),
	define("ratchet_get_policy", "Read the policy that governs an effect type.",
		func(in PolicyInput) (string, string, any) {
			return "GET", "/api/v1/policies/" + pathEscape(in.EffectType), nil
		}),
	define("ratchet_list_approvals", "List approvals, e.g. state=pending.",
		func(in ListApprovalsInput) (string, string, any) {
			return "GET", "/api/v1/approvals" + query(map[string]string{"state": in.State}), nil
		}),
	define("ratchet_decide_approval", "Approve or reject a held effect (operator keys only).",
		func(in DecideInput) (string, string, any) {
			verb := "approve"
			if in.Decision == "reject" {
				verb = "reject"
			}
			return "POST", "/api/v1/approvals/" + pathEscape(in.ApprovalID) + "/" + verb, map[string]any{"note": in.Note}
		}),
}

// ToolNames lists the tools (for the capability manifest and tests).
func ToolNames() []string {
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.name
	}
	return names
}

package httpapi

import (
	"context"
	"fmt"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/gate"
)

// circuitRoutes are surge containment and the emergency stop (API.md §2.5).
// Every change needs policies:write, so an agent's key cannot close its own
// breaker; the reads take policies:read or policies:write, as the policies'
// do (the scopes cover "policies and circuits"): a read-only key needed the
// write scope to see them (console QA). A read's refusal still names
// policies:write in detail.required, the scope API.md §2.5 says every
// circuit route needs, and both in detail.any_of (conformance QA: it named
// policies:read, which a client reading §2.5 does not expect).
func (s *Server) circuitRoutes() []Route {
	write := []string{auth.ScopePoliciesWrite}
	read := []string{auth.ScopePoliciesWrite, auth.ScopePoliciesRead}
	return []Route{
		{
			Method: "GET", Pattern: "/api/v1/circuits", Name: "circuits.list", Tag: "circuits", AnyScopes: read,
			Summary: "Read the circuit of every effect type seen or configured, in effect type order: state, who opened it, its action, " +
				"the volume of new keys in the trailing hour, the 7-day median hourly baseline and the threshold.",
			Query: listParams, Response: Page[gate.Circuit]{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeForbidden},
			Cursor: gate.ValidEffectType,
			Handle: s.listCircuits,
		},
		{
			Method: "GET", Pattern: "/api/v1/circuits/stop", Name: "circuits.stop.get", Tag: "circuits",
			AnyScopes: read,
			Summary: "Read whether the emergency stop is on: state open with its action, reason and opened_at, " +
				"or closed with the rest null. The circuits list shows it only on types it holds.",
			Response: gate.EmergencyStop{}, Status: 200, Errors: []string{apierr.CodeForbidden},
			Handle: s.getEmergencyStop,
		},
		{
			Method: "POST", Pattern: "/api/v1/circuits/stop", Name: "circuits.stop", Tag: "circuits", Scopes: write,
			Idempotent: true,
			Summary: "Emergency stop: hold every effect type, including types first seen while it is on, with " +
				"action (default require_approval) until released. Answers every circuit, as a page: its first " +
				stopPage + " " + retriedAction,
			Request: gate.OpenCircuitRequest{}, Response: Page[gate.Circuit]{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeForbidden},
			Handle: s.stopCircuits,
		},
		{
			Method: "POST", Pattern: "/api/v1/circuits/release", Name: "circuits.release", Tag: "circuits",
			Scopes: write, Idempotent: true,
			Summary: "Lift the emergency stop. Breakers of single types stay as they are. Answers every circuit, " +
				"as a page: its first " + stopPage + " " + retriedAction,
			Request: struct{}{}, Response: Page[gate.Circuit]{}, Status: 200, Errors: []string{apierr.CodeForbidden},
			Handle: bodiless(s.releaseCircuits),
		},
		{
			Method: "POST", Pattern: "/api/v1/circuits/{effect_type}/open", Name: "circuits.open", Tag: "circuits",
			Scopes: write, Idempotent: true,
			Summary: "Open an effect type's breaker by hand with action monitor, require_approval (default) or " +
				"deny. It has no cooldown: it stays open until closed. " + retriedAction,
			Request: gate.OpenCircuitRequest{}, Response: gate.Circuit{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeForbidden},
			Handle: s.openCircuit,
		},
		{
			Method: "POST", Pattern: "/api/v1/circuits/{effect_type}/close", Name: "circuits.close", Tag: "circuits",
			Scopes: write, Idempotent: true,
			Summary: "Close an effect type's breaker: a fresh surge allowance counted from now; the breaker stays " +
				"armed. Does not lift the emergency stop. " + retriedAction,
			Request: struct{}{}, Response: gate.Circuit{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeForbidden},
			Handle: bodiless(s.closeCircuit),
		},
	}
}

func (s *Server) listCircuits(ctx context.Context, c *Call) (any, error) {
	limit, cursor, err := c.ListParams()
	if err != nil {
		return nil, err
	}
	cs, err := s.Gate.ListCircuits(ctx, c.Principal.WorkspaceID, cursor, limit+1)
	if err != nil {
		return nil, err
	}
	return NewPage(ctx, cs, limit, func(x gate.Circuit) string { return x.EffectType })
}

// stopPage says how the stop's and the release's answer holds every
// circuit: past gate.MaxCircuitsAnswered types, its next_cursor reads on.
var stopPage = fmt.Sprintf("%d circuits in effect type order, with next_cursor set when the workspace has more "+
	"types (GET /api/v1/circuits?cursor= reads the rest).", gate.MaxCircuitsAnswered)

func (s *Server) stopCircuits(ctx context.Context, c *Call) (any, error) {
	var req gate.OpenCircuitRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	cs, err := s.Gate.Stop(ctx, c.Principal, req)
	if err != nil {
		return nil, err
	}
	return NewPage(ctx, cs, gate.MaxCircuitsAnswered, func(x gate.Circuit) string { return x.EffectType })
}

func (s *Server) getEmergencyStop(ctx context.Context, c *Call) (any, error) {
	return s.Gate.GetEmergencyStop(ctx, c.Principal.WorkspaceID)
}

func (s *Server) releaseCircuits(ctx context.Context, c *Call) (any, error) {
	cs, err := s.Gate.Release(ctx, c.Principal)
	if err != nil {
		return nil, err
	}
	return NewPage(ctx, cs, gate.MaxCircuitsAnswered, func(x gate.Circuit) string { return x.EffectType })
}

func (s *Server) openCircuit(ctx context.Context, c *Call) (any, error) {
	var req gate.OpenCircuitRequest
	if err := c.Decode(&req); err != nil {
		return nil, err
	}
	return s.Gate.OpenCircuit(ctx, c.Principal, c.R.PathValue("effect_type"), req)
}

func (s *Server) closeCircuit(ctx context.Context, c *Call) (any, error) {
	return s.Gate.CloseCircuit(ctx, c.Principal, c.R.PathValue("effect_type"))
}

package httpapi

import (
	"context"
	"net/http"
	"strconv"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/ids"
)

// GroupCommit answers a commit: the group, plus the {state, plan,
// unresolved} fields API.md §2.6 gives commit and unwind alike, and the
// group's id as the unwind names it (group_id), so that one client type
// reads both answers (QA: it lost the id of one). A group commits only when
// every step succeeded, so both lists are empty.
type GroupCommit struct {
	gate.Group
	GroupID    string          `json:"group_id"`
	Plan       []gate.PlanItem `json:"plan" openapi:"notNull"`       // always []
	Unresolved []string        `json:"unresolved" openapi:"notNull"` // always []
}

// groupRoutes are the effect-group routes (API.md §2.6). A key that may
// begin effects may create, commit and unwind groups (effects:begin), so an
// agent can roll back its own unit of work; reading a group takes
// effects:read or effects:begin. Without effects:read, a key sees only the
// groups it created (gate.groupReader); without effects:read and
// effects:resolve, it acts only on those (gate.groupOwner).
func (s *Server) groupRoutes() []Route {
	begin := []string{auth.ScopeEffectsBegin}
	return []Route{
		{
			Method: "POST", Pattern: "/api/v1/groups", Name: "groups.create", Tag: "groups", Scopes: begin,
			Summary: "Open an effect group. Begin effects with its group_id, each declaring compensation " +
				"{effect_type, payload}; then commit, or unwind to get the compensation plan. With idempotency_key " +
				"a retry answers the group it opened (200, deduplicated: true, its steps cut to fit as " +
				"GET /api/v1/groups/{id} cuts them) until retention deletes it; the same key with another name is " +
				"409 idempotency_key_reuse; under an Idempotency-Key header, with idempotency_key or without, the " +
				"same request sent again is answered the first answer again. A group takes at most " +
				strconv.Itoa(gate.MaxGroupSteps) + " forward steps " +
				"(limits.group_steps_max): a begin that would add another is 409 invalid_state (detail.group_steps_max), " +
				"nothing kept; new attempts at its steps, its commit and its rollback's compensations still work.",
			Request: gate.CreateGroupRequest{}, Response: gate.Group{}, Status: 201, DedupOK: true, Idempotent: true,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeIdempotencyKeyReuse},
			Handle: func(ctx context.Context, c *Call) (any, error) {
				var req gate.CreateGroupRequest
				if err := c.Decode(&req); err != nil {
					return nil, err
				}
				g, err := s.Gate.CreateGroup(ctx, c.Principal, req)
				if err != nil {
					return nil, err
				}
				body, err := fitGroup(ctx, g, func(g gate.Group) any { return g })
				if err == nil && g.Deduplicated != nil && *g.Deduplicated {
					return Reply{Status: http.StatusOK, Body: body}, nil
				}
				return body, err
			},
		},
		{
			Method: "GET", Pattern: "/api/v1/groups/{id}", Name: "groups.get", Tag: "groups",
			Summary: "Read a group and its steps (needs effects:read or effects:begin; without effects:read, " +
				"only a group the key created). Compensation payloads appear only in the unwind plan. A group " +
				"that ended (committed, unwound, unwind_failed) is kept whole until retention deletes it with its " +
				"steps (the longest retention_days of their types after the end); then 404. A group whose steps " +
				"would take the answer past about 4 MB holds its first steps, steps_truncated saying so " +
				"(GET /api/v1/groups/{id}/steps pages them all).",
			AnyScopes: []string{auth.ScopeEffectsRead, auth.ScopeEffectsBegin},
			Response:  gate.Group{}, Status: 200, Errors: []string{apierr.CodeNotFound, apierr.CodeForbidden},
			Handle: func(ctx context.Context, c *Call) (any, error) {
				id, err := c.PathID("id", ids.Group)
				if err != nil {
					return nil, err
				}
				g, err := s.Gate.GetGroup(ctx, c.Principal, id)
				if err != nil {
					return nil, err
				}
				return fitGroup(ctx, g, func(g gate.Group) any { return g })
			},
		},
		{
			Method: "GET", Pattern: "/api/v1/groups/{id}/steps", Name: "groups.steps", Tag: "groups",
			Summary: "Page a group's steps (its effects, forward and compensating) in effect id order, each as " +
				"GET /api/v1/groups/{id} lists it: all of them, where that read holds the first steps that fit in " +
				"one answer (steps_truncated; continue with cursor set to the last step's effect_id). Needs " +
				"effects:read or effects:begin (without effects:read, only a group the key created).",
			AnyScopes: []string{auth.ScopeEffectsRead, auth.ScopeEffectsBegin},
			Query:     listParams, Response: Page[gate.GroupStep]{}, Status: 200,
			Errors: []string{apierr.CodeInvalidRequest, apierr.CodeNotFound, apierr.CodeForbidden},
			Cursor: idCursor(ids.Effect),
			Handle: func(ctx context.Context, c *Call) (any, error) {
				id, err := c.PathID("id", ids.Group)
				if err != nil {
					return nil, err
				}
				limit, cursor, err := c.ListParams()
				if err != nil {
					return nil, err
				}
				steps, err := s.Gate.ListGroupSteps(ctx, c.Principal, id, cursor, limit+1)
				if err != nil {
					return nil, err
				}
				return NewPage(ctx, steps, limit, func(st gate.GroupStep) string { return st.EffectID })
			},
		},
		{
			Method: "POST", Pattern: "/api/v1/groups/{id}/commit", Name: "groups.commit", Tag: "groups", Scopes: begin,
			Summary: "Commit an open group whose every step succeeded (409 invalid_state otherwise). A committed " +
				"group takes no new steps and can still be unwound until retention deletes it with its steps (the " +
				"longest retention_days of its steps' types after the commit). Another key's group needs effects:read and " +
				"effects:resolve. Its steps are cut to fit as GET /api/v1/groups/{id} cuts them (steps_truncated).",
			Response: GroupCommit{}, Status: 200, Errors: []string{apierr.CodeNotFound, apierr.CodeInvalidState},
			Handle: func(ctx context.Context, c *Call) (any, error) {
				id, err := c.PathID("id", ids.Group)
				if err != nil {
					return nil, err
				}
				g, err := s.Gate.CommitGroup(ctx, c.Principal, id)
				if err != nil {
					return nil, err
				}
				return fitGroup(ctx, g, func(g gate.Group) any {
					return GroupCommit{Group: g, GroupID: g.ID, Plan: []gate.PlanItem{}, Unresolved: []string{}}
				})
			},
		},
		{
			Method: "POST", Pattern: "/api/v1/groups/{id}/unwind", Name: "groups.unwind", Tag: "groups", Scopes: begin,
			Summary: "Start (or re-read) the rollback: the compensation plan in reverse order of success, with " +
				"deterministic suggested idempotency keys. Read unresolved first: the plan stops at any step " +
				"whose outcome is unknown. Safe to repeat. The pending approvals the rollback makes moot (its " +
				"forward steps' once it starts, its compensations' once it ends) are closed as rejected, with a " +
				"note; their effects keep their state. Another key's group needs effects:read and " +
				"effects:resolve. A compensation the plan needs that this server cannot decrypt (its encryption key " +
				"is not configured) is 500 internal_error, the group left as it was. A plan that would take the " +
				"answer past about 4 MB (compensation payloads may be 1 MiB each) holds its first items only, " +
				"plan_truncated saying so: perform them, then unwind again for the rest. unresolved, irreversible " +
				"and reversed are whole (a group takes at most " + strconv.Itoa(gate.MaxGroupSteps) + " forward steps).",
			Response: gate.Unwind{}, Status: 200, Errors: []string{apierr.CodeNotFound},
			Handle: func(ctx context.Context, c *Call) (any, error) {
				id, err := c.PathID("id", ids.Group)
				if err != nil {
					return nil, err
				}
				u, err := s.Gate.UnwindGroup(ctx, c.Principal, id)
				if err != nil {
					return nil, err
				}
				// Each compensation may carry a payload of up to 1 MiB: a
				// plan past what one answer holds is cut, from its first
				// item, and says so (plan_truncated). The gate read the
				// items that could fit (u.PlanTruncated when it left some
				// out); this cuts them exactly.
				readAll := !u.PlanTruncated
				return fitPrefix(ctx, u.Plan, 1, func(plan []gate.PlanItem, cut bool) any {
					u.Plan, u.PlanTruncated = plan, cut || !readAll
					return u
				})
			},
		},
	}
}

// fitGroup encodes shape(g) within its answer's budget (answer.Of): a
// group may hold any number of steps, each of up to about 1.3 KB (a key of
// 255 four-byte characters), so some 3 000 of them passed what Vercel and
// Lambda deliver (QA: 3 500 answered 4.1 MB). One that would pass it answers its steps that fit,
// from the first, with steps_truncated: true, as a run's read cuts its
// steps (stepsTruncated); GET /api/v1/groups/{id}/steps pages them all.
func fitGroup(ctx context.Context, g gate.Group, shape func(gate.Group) any) (any, error) {
	return fitPrefix(ctx, g.Steps, 0, func(steps []gate.GroupStep, cut bool) any {
		g.Steps, g.StepsTruncated = steps, cut
		return shape(g)
	})
}

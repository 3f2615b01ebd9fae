package ratchet

import (
	"context"
	"time"
)

// The gate's recovery path (seed 003): find the effects whose outcome is
// unknown, verify them at the vendor and resolve them; and effect groups,
// whose unwind plan names the compensations to begin.

// ResolveRequest is what an operator found at the vendor for an
// indeterminate effect: OutcomeSucceeded (with the vendor's result, which a
// duplicate begin then returns) or OutcomeFailed (it did not happen).
type ResolveRequest struct {
	Outcome string `json:"outcome"`
	Result  any    `json:"result,omitempty"`
	Note    string `json:"note,omitempty"`
	// Attempt, when not 0, is the attempt the operator verified: the
	// effect's latest attempt whose outcome reads indeterminate in the
	// Effect read before verifying. The resolve then applies
	// only to that attempt: naming another is 409 invalid_state, changing
	// nothing, its detail naming unresolved_attempt. Send it, so a resolve
	// retried after its answer was lost can never settle a later attempt
	// (one begun after a resolve to failed freed the key) nobody checked.
	// 0 lets ResolveEffect name it: it reads the effect first and sends
	// its latest attempt whose outcome reads indeterminate (none when no
	// attempt does, or when the key may not read effects: the resolve then
	// settles whatever is unknown when it lands).
	Attempt int `json:"attempt,omitempty"`
}

// latestUnknown is the latest of e's attempts whose outcome reads
// indeterminate, 0 for none: the attempt a resolve of e settles now.
func latestUnknown(e *Effect) int {
	latest := 0
	for _, a := range e.Attempts {
		if a.Outcome != nil && *a.Outcome == EffectIndeterminate && a.Attempt > latest {
			latest = a.Attempt
		}
	}
	return latest
}

// ResolveEffect records the outcome of an indeterminate effect (POST
// /api/v1/effects/{id}/resolve, scope effects:resolve) and unblocks its key.
// Without req.Attempt it reads the effect first (GET, scope effects:read)
// to name the attempt unknown now. It is retried through transient failures: a repeat by the same key with
// the same outcome answers the effect as resolved; another outcome, or an
// effect another key resolved, answers 409 invalid_state, and so does a
// resolve whose Attempt is not the one unknown now.
func (c *Client) ResolveEffect(ctx context.Context, effectID string, req ResolveRequest) (*Effect, error) {
	if req.Attempt == 0 {
		// The call is retried: a repeat that landed after the resolve to
		// failed freed the key, the key ran again and that attempt's
		// outcome turned unknown would settle that attempt, which nobody
		// verified (retry QA). Named, the repeat is refused instead.
		e, err := c.GetEffect(ctx, effectID)
		switch {
		case err == nil:
			req.Attempt = latestUnknown(e)
		case !IsCode(err, CodeForbidden):
			return nil, err
		}
	}
	var out Effect
	if err := c.do(ctx, "POST", "/effects/"+pathID(effectID)+"/resolve", req, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// EffectQuery filters ListEffects. Zero fields do not filter; Limit 0 is the
// server's default (50), at most 200.
type EffectQuery struct {
	State      string // EffectIndeterminate, …
	EffectType string
	Limit      int
	Cursor     string // NextCursor of the previous page
}

// EffectPage is one page of effects, newest first. NextCursor is nil on
// the last page.
type EffectPage struct {
	Data       []Effect `json:"data"`
	NextCursor *string  `json:"next_cursor"`
}

// ListEffects lists effects newest first (GET /api/v1/effects), results as
// redacted previews only: say, every indeterminate one to verify.
func (c *Client) ListEffects(ctx context.Context, q EffectQuery) (*EffectPage, error) {
	v := ListQuery{Limit: q.Limit, Cursor: q.Cursor}.values()
	if q.State != "" {
		v.Set("state", q.State)
	}
	if q.EffectType != "" {
		v.Set("effect_type", q.EffectType)
	}
	var out EffectPage
	if err := c.do(ctx, "GET", withQuery("/effects", v), nil, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// GroupStep is one effect of a group. Compensation payloads are not shown
// here; only the unwind plan opens them.
type GroupStep struct {
	EffectID            string  `json:"effect_id"`
	EffectType          string  `json:"effect_type"`
	IdempotencyKey      string  `json:"idempotency_key"`
	State               string  `json:"state"`
	HasCompensation     bool    `json:"has_compensation"`
	CompensatesEffectID *string `json:"compensates_effect_id"`
}

// Group states (Group.State, Unwind.State).
const (
	GroupOpen         = "open"
	GroupCommitted    = "committed"
	GroupUnwinding    = "unwinding"
	GroupUnwound      = "unwound"
	GroupUnwindFailed = "unwind_failed"
)

// Group is a unit of work that can be rolled back: open, committed,
// unwinding, unwound or unwind_failed.
type Group struct {
	ID              string     `json:"id"`
	Name            string     `json:"name"`
	State           string     `json:"state"` // one of the Group* state constants
	CreatedAt       time.Time  `json:"created_at"`
	UpdatedAt       time.Time  `json:"updated_at"` // its last change of state
	CommittedAt     *time.Time `json:"committed_at"`
	UnwindStartedAt *time.Time `json:"unwind_started_at"`
	FinishedAt      *time.Time `json:"finished_at"`
	// IdempotencyKey is the key the group was opened under (CreateGroupWithKey).
	IdempotencyKey *string `json:"idempotency_key"`
	// Steps are the group's effects, forward and compensating, in effect
	// id order: all of them unless StepsTruncated.
	Steps []GroupStep `json:"steps"`
	// StepsTruncated says Steps holds only the group's first steps: the
	// rest would take the answer past about 4 MB (some 3 000 steps at
	// worst, under the longest keys). ListGroupSteps pages all of them.
	StepsTruncated bool `json:"steps_truncated"`
	// Deduplicated is set by CreateGroupWithKey: the key had opened this
	// group already.
	Deduplicated bool `json:"deduplicated,omitempty"`
}

// PlanItem is one compensation to perform: begin Compensation's effect_type
// and payload with IdempotencyKey SuggestedIdempotencyKey and
// CompensatesEffectID set, then report as usual.
type PlanItem struct {
	EffectID                string         `json:"effect_id"`
	Compensation            map[string]any `json:"compensation"`
	SuggestedIdempotencyKey string         `json:"suggested_idempotency_key"`
	CompensatesEffectID     string         `json:"compensates_effect_id"`
	CompensationEffectID    *string        `json:"compensation_effect_id"`
	CompensationState       *string        `json:"compensation_state"`
}

// Unwind is a group's rollback: the plan in reverse order of success, the
// effects whose outcome must be verified before the plan goes past them,
// and the steps that cannot be or have been reversed.
type Unwind struct {
	GroupID string `json:"group_id"`
	// State is the group's: one of the Group* state constants.
	State string     `json:"state"`
	Plan  []PlanItem `json:"plan"`
	// PlanTruncated says Plan holds only its first items: the rest would
	// take the answer past about 4 MB (a compensation's payload may be
	// 1 MiB). Perform them, then call UnwindGroup again for the rest.
	PlanTruncated bool     `json:"plan_truncated"`
	Unresolved    []string `json:"unresolved"`
	Irreversible  []string `json:"irreversible"`
	Reversed      []string `json:"reversed"`
}

// GroupCommit answers CommitGroup: the group, or, when some step has not
// succeeded, the refusal (409 invalid_state).
type GroupCommit struct {
	Group
	GroupID    string     `json:"group_id"` // the group's id, as Unwind names it
	Plan       []PlanItem `json:"plan"`
	Unresolved []string   `json:"unresolved"`
}

// CreateGroup opens a group (POST /api/v1/groups); begins with its ID in
// BeginRequest.GroupID join it. Retried after an ambiguous failure under an
// Idempotency-Key of its own, made once per call (callKeyed): a retry after
// a lost answer is answered the group the first attempt opened, never a
// second group.
func (c *Client) CreateGroup(ctx context.Context, name string) (*Group, error) {
	return callKeyed[Group](ctx, c, "POST", "/groups", "", map[string]string{"name": name})
}

// CreateGroupWithKey opens a group under an idempotency key derived from
// the work ("checkout:order_123"), retried as CreateGroup is: a later call
// with the key, from this process or another, answers the group the key
// opened (Deduplicated). The same key with another name is 409
// idempotency_key_reuse.
func (c *Client) CreateGroupWithKey(ctx context.Context, name, idempotencyKey string) (*Group, error) {
	return callKeyed[Group](ctx, c, "POST", "/groups", "",
		map[string]string{"name": name, "idempotency_key": idempotencyKey})
}

// GetGroup reads a group with its steps: all of them, or the first that
// fit in one answer (StepsTruncated; ListGroupSteps pages the rest).
func (c *Client) GetGroup(ctx context.Context, groupID string) (*Group, error) {
	var out Group
	if err := c.do(ctx, "GET", "/groups/"+pathID(groupID), nil, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListGroupSteps pages every step of a group in effect id order, each as
// GetGroup shows it (GET /api/v1/groups/{id}/steps; effects:read, or
// effects:begin for a group the key created), where GetGroup, CommitGroup
// and CreateGroupWithKey's repeat hold the first steps that fit in one
// answer (Group.StepsTruncated). Limit 0 is the server's default (50), at
// most 200. To read on past a cut group, pass its last step's EffectID as
// Cursor; otherwise pass NextCursor of the previous page.
func (c *Client) ListGroupSteps(ctx context.Context, groupID string, q ListQuery) (*GatePage[GroupStep], error) {
	return call[GatePage[GroupStep]](ctx, c, "GET", withQuery("/groups/"+pathID(groupID)+"/steps", q.values()), nil,
		idempotent)
}

// CommitGroup commits a group whose forward steps all succeeded; it takes
// no new step afterwards but can still be unwound, until retention deletes
// it with its steps (the longest retention_days of their types after the
// commit). Committing a committed group answers it again.
func (c *Client) CommitGroup(ctx context.Context, groupID string) (*GroupCommit, error) {
	var out GroupCommit
	if err := c.do(ctx, "POST", "/groups/"+pathID(groupID)+"/commit", nil, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

// UnwindGroup starts (or continues to read) a group's rollback and answers
// its plan. Repeating it answers the plan as it stands.
func (c *Client) UnwindGroup(ctx context.Context, groupID string) (*Unwind, error) {
	var out Unwind
	if err := c.do(ctx, "POST", "/groups/"+pathID(groupID)+"/unwind", nil, &out, idempotent); err != nil {
		return nil, err
	}
	return &out, nil
}

package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/canonjson"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/sweep"
)

// Effect groups (API.md §2.6): several effects as one unit of work, each
// forward step declaring how to undo it. Unwinding returns the exact
// compensation plan, in reverse order of success, and stops at any step
// whose outcome is unknown: rolling back past a maybe is how a half-undone
// state is created.
//
// States:
//   - open: accepting steps.
//   - committed: every forward step succeeded; no new forward steps; can still
//     be unwound later.
//   - unwinding: rolling back; refuses new forward steps (group_unwinding),
//     admits compensating effects.
//   - unwound: the rollback ended and every succeeded step was reversed (its
//     compensating effect succeeded).
//   - unwind_failed: the rollback ended, but some succeeded step could not be
//     reversed (it declared no compensation, or its compensating effect was
//     finally denied). Not a clean rollback, and it does not claim to be.
//
// A rollback "ends" when nothing is left to do: no plan and nothing
// unresolved. The end is decided inline by unwind, by the report or resolve
// that settles a group's last step, by GET, and by the sweeper as a backstop.
const (
	GroupOpen         = "open"
	GroupCommitted    = "committed"
	GroupUnwinding    = "unwinding"
	GroupUnwound      = "unwound"
	GroupUnwindFailed = "unwind_failed"
)

// CompensationKeyPrefix makes a plan's suggested idempotency key: derived
// from the step alone, so every retried rollback suggests the same key and
// the gate answers duplicate instead of compensating twice.
const CompensationKeyPrefix = "compensate:"

const maxGroupNameRunes = 200

// CreateGroupRequest is the body of POST /api/v1/groups.
type CreateGroupRequest struct {
	Name string `json:"name" openapi:"minLength=1,maxLength=200"`
	// IdempotencyKey makes the create safe to retry: the same key answers
	// the group it opened (with the same name; another is 409
	// idempotency_key_reuse).
	IdempotencyKey *string `json:"idempotency_key" openapi:"minLength=1,maxLength=255,printable"`
}

// GroupStep is one effect of a group as GET shows it. Compensation payloads
// are never shown here; only the unwind plan opens them.
type GroupStep struct {
	EffectID            string  `json:"effect_id"`
	EffectType          string  `json:"effect_type"`
	IdempotencyKey      string  `json:"idempotency_key"`
	State               string  `json:"state" openapi:"enum=leased|succeeded|failed|indeterminate|awaiting_approval|denied"`
	HasCompensation     bool    `json:"has_compensation"`
	CompensatesEffectID *string `json:"compensates_effect_id"`
}

// Group is the group object.
type Group struct {
	ID              string     `json:"id"`
	Name            string     `json:"name"`
	State           string     `json:"state" openapi:"enum=open|committed|unwinding|unwound|unwind_failed"`
	CreatedAt       time.Time  `json:"created_at"`
	UpdatedAt       time.Time  `json:"updated_at"`
	CommittedAt     *time.Time `json:"committed_at"`
	UnwindStartedAt *time.Time `json:"unwind_started_at"`
	FinishedAt      *time.Time `json:"finished_at"`
	// IdempotencyKey is the key the group was opened under, if any.
	IdempotencyKey *string `json:"idempotency_key"`
	// Steps are the group's effects, forward and compensating, in id
	// order: every one, unless StepsTruncated.
	Steps []GroupStep `json:"steps" openapi:"notNull"` // [] for none (createGroup, withSteps)
	// StepsTruncated says Steps holds only the group's first steps: the
	// rest would take the answer past answer.Budget (the API cuts it
	// there). GET /api/v1/groups/{id}/steps pages them all.
	StepsTruncated bool `json:"steps_truncated" jsonschema:"true when steps holds only the group's first steps, the rest taking the answer past about 4 MB (some 3 000 steps at worst, under the longest keys); GET /api/v1/groups/{id}/steps pages them all, from the cursor of the last one shown (its effect_id); false otherwise"`
	// Deduplicated is set by CreateGroup only: true when its idempotency
	// key had opened this group already (answered 200 rather than 201).
	Deduplicated *bool `json:"deduplicated,omitempty"`
}

// PlanItem is one compensation to perform: begin compensation.effect_type
// with compensation.payload, idempotency_key suggested_idempotency_key and
// compensates_effect_id, then report as usual.
type PlanItem struct {
	EffectID string `json:"effect_id"`
	// Compensation is the one the step declared, as its begin stored it
	// ({effect_type, payload}): typed, so the OpenAPI document states it
	// (contract QA: it read as any value).
	Compensation            Compensation `json:"compensation"`
	SuggestedIdempotencyKey string       `json:"suggested_idempotency_key"`
	CompensatesEffectID     string       `json:"compensates_effect_id"`
	// The compensating effect already begun for this step, if any, and its state.
	CompensationEffectID *string `json:"compensation_effect_id"`
	CompensationState    *string `json:"compensation_state" openapi:"enum=leased|succeeded|failed|indeterminate|awaiting_approval|denied"`
}

// Unwind is the answer of POST /api/v1/groups/{id}/unwind.
type Unwind struct {
	GroupID string     `json:"group_id"`
	State   string     `json:"state" openapi:"enum=open|committed|unwinding|unwound|unwind_failed"`
	Plan    []PlanItem `json:"plan" openapi:"notNull"` // [] for none (settleLocked, planItems)
	// Effects whose outcome is unknown (a live lease, or indeterminate): the
	// plan stops where the first of them would come, until each is verified
	// (resolve, reconcile) or reported. This list and the next two are
	// whole: each step is in one of them at most, and a group holds at most
	// MaxGroupSteps (maxItems; a test holds the tag to it).
	Unresolved []string `json:"unresolved" openapi:"maxItems=10000,notNull"` // [] for none (planRollback)
	// Succeeded steps that cannot be reversed: no compensation was declared,
	// or their compensating effect was finally denied.
	Irreversible []string `json:"irreversible" openapi:"maxItems=10000,notNull"`
	// Succeeded steps whose compensating effect has succeeded.
	Reversed []string `json:"reversed" openapi:"maxItems=10000,notNull"`
	// PlanTruncated says Plan holds only its first items: the rest would
	// take the answer past answer.Budget (UnwindGroup reads the
	// compensations of those that may fit; the API cuts them exactly).
	PlanTruncated bool `json:"plan_truncated" jsonschema:"true when plan holds only its first items, the rest taking the answer past about 4 MB (a compensation's payload may be 1 MiB): perform them, then unwind again (safe to repeat) for the rest; false otherwise"`
}

// CreateGroup opens a group, or, under an idempotency key that already
// opened one, answers that group (Deduplicated) with its steps. Retention
// deletes an ended group once its steps' retention has passed, and with
// it frees its key, as an effect's: a group deleted between this create's
// statements is created anew.
func (s *Service) CreateGroup(ctx context.Context, p *auth.Principal, req CreateGroupRequest) (Group, error) {
	var pr apierr.Problems
	name := strings.TrimSpace(req.Name)
	if n := utf8.RuneCountInString(name); n < 1 || n > maxGroupNameRunes {
		pr.Add("name", "must be 1-%d characters", maxGroupNameRunes)
	}
	if req.IdempotencyKey != nil && !idemkey.Valid(*req.IdempotencyKey) {
		pr.Add("idempotency_key", idemkey.Rule)
	}
	if err := pr.Err(); err != nil {
		return Group{}, err
	}
	for range 3 {
		g, err := s.createGroup(ctx, p, name, req.IdempotencyKey)
		if !errors.Is(err, errGroupGone) {
			return g, err
		}
	}
	return Group{}, fmt.Errorf("create group: the key's group was deleted three times over")
}

// errGroupGone is a key's group deleted (by retention) while a create read it.
var errGroupGone = errors.New("the key's group was deleted meanwhile")

// createGroup is one try of CreateGroup.
func (s *Service) createGroup(ctx context.Context, p *auth.Principal, name string, key *string) (Group, error) {
	inRequest := key != nil && db.InRequest(ctx)
	if inRequest {
		// Under an Idempotency-Key (db.BeginRequest) the insert begins the
		// request's transaction, which would then hold the read of the
		// group the key names (GetGroup settles an unwinding one, in a
		// transaction of its own, not the request's): read first, outside
		// it, while it has not begun.
		g, err := s.groupOfKey(db.OutsideRequest(ctx), p, name, *key)
		if !errors.Is(err, errGroupGone) {
			return g, err
		}
	}
	now := s.clock()
	g, err := scanGroup(db.Writer(ctx, s.pool).QueryRow(ctx, sqlCreateGroup, ids.NewAt(ids.Group, now), p.WorkspaceID, name,
		p.KeyID, now, key))
	if err == nil {
		fresh := false
		g.Steps, g.Deduplicated = []GroupStep{}, &fresh
		return g, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) || key == nil {
		return Group{}, fmt.Errorf("create group: %w", err) // only a key's conflict answers no row
	}
	if inRequest {
		// Opened since the read above: the retry, its transaction not
		// begun, reads it.
		return Group{}, apierr.Conflict(apierr.CodeRetryRequest,
			"The group this key named was opened concurrently; retry at once.")
	}
	return s.groupOfKey(ctx, p, name, *key)
}

// groupOfKey is the group p's workspace opened under idempotency key key,
// deduplicated; errGroupGone when there is none; 409
// idempotency_key_reuse when it was opened with another name, or p may not
// act on it.
func (s *Service) groupOfKey(ctx context.Context, p *auth.Principal, name, key string) (Group, error) {
	var (
		id, opened string
		visible    bool
	)
	err := db.Conn(ctx, s.pool).QueryRow(ctx, sqlGroupByKey, p.WorkspaceID, key, groupOwner(p)).Scan(&id, &opened, &visible)
	if errors.Is(err, pgx.ErrNoRows) {
		return Group{}, errGroupGone
	}
	if err != nil {
		return Group{}, fmt.Errorf("create group: read the key's group: %w", err)
	}
	if !visible || opened != name {
		// Another key's group is not shown to a key that sees only its own.
		return Group{}, apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
			"This idempotency key opened another group; choose a key of your own.")
	}
	g, err := s.GetGroup(ctx, p, id)
	if e, ok := apierr.As(err); ok && e.Code == apierr.CodeNotFound {
		return Group{}, errGroupGone
	}
	dup := true
	g.Deduplicated = &dup
	return g, err
}

func scanGroup(row pgx.Row) (Group, error) {
	var g Group
	err := row.Scan(&g.ID, &g.Name, &g.State, &g.CreatedAt, &g.UpdatedAt, &g.CommittedAt, &g.UnwindStartedAt,
		&g.FinishedAt, &g.IdempotencyKey)
	return g, err
}

// groupOwner is the key a group must have been created by for p to act on
// it (join it, compensate its steps, commit or unwind it, take it as the
// answer to its own create): nil when p may act on every group of its
// workspace, which takes reading every effect (effects:read) and settling
// what another caller began (effects:resolve), as an operator's key does.
// A key that can only ask and report cannot read other effects (seed 003),
// and a group's steps and unwind plan (compensation payloads included) are
// effects; its groups are its own unit of work. Another key's group answers
// 404, as an unknown id. effects:read alone once let a key that could also
// begin unwind every group of the workspace, refunds and all (review).
func groupOwner(p *auth.Principal) *string {
	if p.Has(auth.ScopeEffectsRead) && p.Has(auth.ScopeEffectsResolve) {
		return nil
	}
	return &p.KeyID
}

// groupReader is the key a group must have been created by for p to read
// it: nil with effects:read.
func groupReader(p *auth.Principal) *string {
	if p.Has(auth.ScopeEffectsRead) {
		return nil
	}
	return &p.KeyID
}

// lockGroup takes a group of p's workspace that p may act on for a
// transition. One p may read but not act on is 403 forbidden, naming
// effects:resolve; one it may not read, 404.
func lockGroup(ctx context.Context, tx pgx.Tx, p *auth.Principal, id string) (Group, error) {
	owner := groupOwner(p)
	g, err := scanGroup(tx.QueryRow(ctx, sqlLockGroup, id, p.WorkspaceID, owner))
	if errors.Is(err, pgx.ErrNoRows) && owner != nil && groupReader(p) == nil {
		if ferr := readableNotActable(ctx, tx, p.WorkspaceID, id); ferr != nil {
			return Group{}, ferr
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return g, apierr.NotFound("group")
	}
	if err != nil {
		return g, fmt.Errorf("lock group: %w", err)
	}
	return g, nil
}

// readableNotActable is the answer to a key that reads every effect but
// may not act on group id, which its owner filter did not find: 403
// forbidden naming effects:resolve when the group exists, nil when it does
// not (the caller answers 404).
func readableNotActable(ctx context.Context, tx pgx.Tx, workspaceID, id string) error {
	_, err := scanGroup(tx.QueryRow(ctx, sqlGetGroup, id, workspaceID, nil))
	switch {
	case err == nil:
		return apierr.Forbidden(auth.ScopeEffectsResolve)
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	default:
		return fmt.Errorf("read group: %w", err)
	}
}

// GetGroup reads a group p may see (groupReader) and its steps, in one
// snapshot (readGroup). An unwinding group whose rollback has ended is
// settled first, so a read never shows a finished rollback as still
// running.
func (s *Service) GetGroup(ctx context.Context, p *auth.Principal, id string) (Group, error) {
	g, err := s.readGroup(ctx, p, id, true)
	if err != nil || g.State != GroupUnwinding {
		return g, err
	}
	if _, err := s.settleGroup(ctx, p.WorkspaceID, id, false); err != nil {
		return Group{}, err
	}
	// Read again whether this settle ended it or another did meanwhile.
	return s.readGroup(ctx, p, id, false)
}

// readGroup reads a group p may see and its steps in one read-only
// REPEATABLE READ transaction (db.Snapshot): read in two statements, a
// rollback that ended between them showed the group open beside the
// compensations that undid its steps (review), and a group retention
// deleted between them read as one without steps. With toSettle, an
// unwinding group is answered without its steps, which its caller settles
// and reads again: read here too, a client polling its rollback read every
// step three times a poll, the settle's read among them (review).
func (s *Service) readGroup(ctx context.Context, p *auth.Principal, id string, toSettle bool) (Group, error) {
	var out Group
	err := db.Snapshot(ctx, s.pool, func(tx pgx.Tx) error {
		g, err := readableGroup(ctx, tx, p, id)
		if err != nil || (toSettle && g.State == GroupUnwinding) {
			out = g
			return err
		}
		out, err = s.withSteps(ctx, tx, g)
		return err
	})
	return out, err
}

// readableGroup reads a group p may see (groupReader) in tx: 404 when
// there is none.
func readableGroup(ctx context.Context, tx pgx.Tx, p *auth.Principal, id string) (Group, error) {
	g, err := scanGroup(tx.QueryRow(ctx, sqlGetGroup, id, p.WorkspaceID, groupReader(p)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Group{}, apierr.NotFound("group")
	}
	if err != nil {
		return Group{}, fmt.Errorf("get group: %w", err)
	}
	return g, nil
}

// ListGroupSteps pages the steps of a group p may see (groupReader) in id
// order, as GetGroup lists them, after effect id cursor ("" for the first
// page), limit at most: every one of them, where a group's read holds those
// that fit in one answer (steps_truncated). Each reads its state at now.
// The group and the page are read in one snapshot, as GetGroup reads them.
func (s *Service) ListGroupSteps(ctx context.Context, p *auth.Principal, id, cursor string, limit int) ([]GroupStep, error) {
	var out []GroupStep
	err := db.Snapshot(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := readableGroup(ctx, tx, p, id); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sqlGroupStepsPage, id, cursor, limit)
		if err != nil {
			return fmt.Errorf("group steps: %w", err)
		}
		now := s.clock()
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (GroupStep, error) {
			var (
				gs GroupStep
				st groupStep
			)
			err := row.Scan(&gs.EffectID, &gs.EffectType, &gs.IdempotencyKey, &st.state, &st.leaseExpiresAt,
				&gs.HasCompensation, &gs.CompensatesEffectID)
			gs.State = st.effectiveState(now)
			return gs, err
		})
		if err != nil {
			return fmt.Errorf("group steps: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = []GroupStep{}
	}
	return out, nil
}

// withSteps fills in g's steps as q reads them.
func (s *Service) withSteps(ctx context.Context, q db.Querier, g Group) (Group, error) {
	steps, err := groupSteps(ctx, q, g.ID)
	if err != nil {
		return Group{}, err
	}
	now := s.clock()
	g.Steps = make([]GroupStep, len(steps))
	for i, st := range steps {
		g.Steps[i] = GroupStep{EffectID: st.id, EffectType: st.effectType, IdempotencyKey: st.key,
			State: st.effectiveState(now), HasCompensation: st.hasCompensation(), CompensatesEffectID: st.compensates}
	}
	return g, nil
}

// CommitGroup closes an open group p may act on (groupOwner) whose every
// forward step succeeded. Committing a committed group answers it unchanged.
func (s *Service) CommitGroup(ctx context.Context, p *auth.Principal, id string) (Group, error) {
	now := s.clock()
	var out Group
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		g, err := lockGroup(ctx, tx, p, id)
		if err != nil {
			return err
		}
		now = s.heldAt(now)
		switch g.State {
		case GroupCommitted:
			out, err = s.withSteps(ctx, tx, g)
			return err
		case GroupOpen:
		default:
			if g.CommittedAt != nil {
				// The retry of a commit whose answer was lost, after an
				// unwind began: it had committed (gate QA: the bare refusal
				// read as a commit that failed).
				return apierr.InvalidState("This group was committed; an unwind began since (it is %s).", g.State).
					WithDetail("state", g.State).WithDetail("committed_at", g.CommittedAt.UTC().Format(time.RFC3339Nano))
			}
			return apierr.InvalidState("Only an open group can be committed; this one is %s.", g.State).
				WithDetail("state", g.State)
		}
		steps, err := groupSteps(ctx, tx, id)
		if err != nil {
			return err
		}
		var pending []map[string]string
		for _, st := range steps {
			if state := st.effectiveState(now); st.compensates == nil && state != StateSucceeded {
				pending = append(pending, map[string]string{"effect_id": st.id, "state": state})
			}
		}
		if pending != nil {
			return apierr.InvalidState("A group commits only when every step succeeded.").WithDetail("steps", pending)
		}
		if out, err = scanGroup(tx.QueryRow(ctx, sqlSetGroupState, id, GroupCommitted, now)); err != nil {
			return err
		}
		// Read in the commit's transaction, so the answer is the commit's
		// even when an unwind starts the moment it ends.
		out, err = s.withSteps(ctx, tx, out)
		return err
	})
	if err != nil {
		return Group{}, err
	}
	return out, nil
}

// UnwindGroup starts (or, called again, re-reads) the rollback of a group p
// may act on (groupOwner) and returns what remains to do. It is safe to
// repeat: the plan is derived from the steps as they stand, with the same
// suggested keys every time.
func (s *Service) UnwindGroup(ctx context.Context, p *auth.Principal, id string) (Unwind, error) {
	now := s.clock()
	var out Unwind
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		g, err := lockGroup(ctx, tx, p, id)
		if err != nil {
			return err
		}
		now = s.heldAt(now)
		if g.State == GroupOpen || g.State == GroupCommitted {
			if g, err = scanGroup(tx.QueryRow(ctx, sqlSetGroupState, id, GroupUnwinding, now)); err != nil {
				return fmt.Errorf("unwind group: %w", err)
			}
			// Its forward steps' approvals can no longer be given.
			if err := s.closeRolledBackApprovals(ctx, tx, id, &p.KeyID, now); err != nil {
				return err
			}
		}
		out, err = s.settleLocked(ctx, tx, g, now, true, &p.KeyID)
		return err
	})
	return out, err
}

// heldAt is the time of a transition of a group once it is held: the
// clock read again after the wait for its row (as a begin's, lockedAt), so
// an unwind that waited behind a step's begin is not dated before the
// step's attempt, nor judges the steps' leases at a clock from before it
// (gate QA: unwind_started_at read earlier than the attempt of a step the
// group took before the unwind).
func (s *Service) heldAt(before time.Time) time.Time {
	if now := s.clock(); now.After(before) {
		return now
	}
	return before
}

// settleGroup ends an unwinding group's rollback when nothing is left to do.
// skip makes it pass over a group another settle holds (the sweeper);
// inline callers wait, because the holder may have read the steps before
// the caller's own change committed: a settle, and an unwind making the
// group unwinding (sqlGroupStates waits for it; a group it leaves in
// another state, an open one most often, costs that one statement, no
// transaction).
func (s *Service) settleGroup(ctx context.Context, workspaceID, id string, skip bool) (ended bool, err error) {
	now := s.clock()
	sql := sqlLockUnwinding
	if skip {
		sql = sqlLockUnwindingSkip
	} else {
		states, err := groupStates(ctx, db.Conn(ctx, s.pool), sqlGroupStates, workspaceID, []string{id})
		if err != nil {
			return false, fmt.Errorf("settle group: %w", err)
		}
		if states[id] != GroupUnwinding {
			return false, nil
		}
	}
	err = db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		g, err := scanGroup(tx.QueryRow(ctx, sql, id, workspaceID))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // not unwinding (or held by another settle)
		}
		if err != nil {
			return fmt.Errorf("settle group: %w", err)
		}
		u, err := s.settleLocked(ctx, tx, g, s.heldAt(now), false, nil)
		ended = u.State != GroupUnwinding
		return err
	})
	return ended && err == nil, err
}

// groupStates reads the states of groups ids of workspaceID with sql
// (sqlGroupStates or sqlGroupStatesSkip), by id: a group left out was
// deleted, or, skipped, is held by another transaction.
func groupStates(ctx context.Context, q db.Querier, sql, workspaceID string, ids []string) (map[string]string, error) {
	rows, err := q.Query(ctx, sql, workspaceID, ids)
	if err != nil {
		return nil, err
	}
	states := make(map[string]string, len(ids))
	var id, state string
	_, err = pgx.ForEachRow(rows, []any{&id, &state}, func() error {
		states[id] = state
		return nil
	})
	return states, err
}

// afterStep settles the group of an effect whose outcome just became known.
func (s *Service) afterStep(ctx context.Context, workspaceID string, groupID *string) error {
	if groupID == nil {
		return nil
	}
	// The step has committed: a key revoked since fails it no more.
	_, err := s.settleGroup(db.Unchecked(ctx), workspaceID, *groupID, false)
	return err
}

// settleEach settles groups of workspaceID after a change that committed
// (why: what it was) may have ended their rollbacks. One that fails does
// not stop those after it, as in SweepGroups (sweep.GoOn); each failure is
// logged, not answered (the change stands), and the sweeper settles it.
func (s *Service) settleEach(ctx context.Context, workspaceID string, groups []string, why string) {
	for _, g := range groups {
		if _, err := s.settleGroup(ctx, workspaceID, g, false); err != nil {
			s.logger.Warn("rollback not settled after its change", "after", why, "group_id", g, "err", err)
			if !sweep.GoOn(ctx, err) {
				return
			}
		}
	}
}

// SweepGroups is the sweeper's backstop: it settles up to limit unwinding
// groups, least recently checked first. One that fails does not stop
// those after it, whose check sqlUnwindingDue has just recorded too (it
// stamps them all before any is settled): in a batch of fewer than limit,
// all stamped alike every pass and read in the same order, a group whose
// settling failed each time kept every one after it unwinding for good
// (sweeper review; sweep.GoOn). The failures are answered joined.
func (s *Service) SweepGroups(ctx context.Context, now time.Time, limit int) (int, error) {
	groups, err := db.CollectIDs(s.pool.Query(ctx, sqlUnwindingDue, now.UTC(), limit))
	if err != nil {
		return 0, fmt.Errorf("sweep groups: %w", err)
	}
	changed := 0
	var errs []error
	for _, id := range groups {
		ended, err := s.settleGroup(ctx, "", id, true)
		if err != nil {
			if errs = append(errs, err); !sweep.GoOn(ctx, err) {
				break
			}
			continue
		}
		if ended {
			changed++
		}
	}
	return changed, errors.Join(errs...)
}

// settleLocked computes the rollback of a locked group and, when it is
// unwinding and nothing is left to do, ends it, closing the approvals its
// end makes moot, decided by key (closeRolledBackApprovals). withPlan opens
// the compensations into the plan (unwind's answer only).
func (s *Service) settleLocked(ctx context.Context, tx pgx.Tx, g Group, now time.Time, withPlan bool,
	key *string) (Unwind, error) {
	steps, err := groupSteps(ctx, tx, g.ID)
	if err != nil {
		return Unwind{}, err
	}
	r := planRollback(steps, now, groupEnded(g.State))
	if g.State == GroupUnwinding && len(r.plan) == 0 && len(r.unresolved) == 0 {
		end := GroupUnwound
		if len(r.irreversible) > 0 {
			end = GroupUnwindFailed
		}
		if g, err = scanGroup(tx.QueryRow(ctx, sqlSetGroupState, g.ID, end, now)); err != nil {
			return Unwind{}, fmt.Errorf("settle group: %w", err)
		}
		if err := s.closeRolledBackApprovals(ctx, tx, g.ID, key, now); err != nil {
			return Unwind{}, err
		}
	}
	out := Unwind{GroupID: g.ID, State: g.State, Plan: []PlanItem{}, Unresolved: r.unresolved,
		Irreversible: r.irreversible, Reversed: r.reversed}
	if !withPlan {
		return out, nil
	}
	if out.Plan, out.PlanTruncated, err = s.planItems(ctx, tx, g.ID, r.plan, now); err != nil {
		return Unwind{}, err
	}
	if err := suggestFreeKeys(ctx, tx, g.ID, out.Plan); err != nil {
		return Unwind{}, err
	}
	return out, nil
}

// planItems makes the plan's first entries into its items, in order, as
// many as one answer holds (answer.Of; truncated says the rest were left
// out): the API cuts the plan there anyway (plan_truncated), and each item
// carries its step's compensation, up to 1 MiB, so the compensations are
// read from the database a batch at a time, each batch as many as the room
// left would hold at their sealed length, until the items made pass the
// answer's room (groups QA: an unwind read every step's compensation,
// hundreds of MiB for a large group, to answer 4 MB of them). Each item is
// measured as the API writes it; the API cuts the last one when it does
// not fit after all.
func (s *Service) planItems(ctx context.Context, q db.Querier, groupID string, plan []planEntry,
	now time.Time) (items []PlanItem, truncated bool, err error) {
	budget, size := answer.Of(ctx), 0
	items = make([]PlanItem, 0, min(len(plan), 64))
	for len(items) < len(plan) {
		if len(items) > 0 && size > budget {
			return items, true, nil
		}
		rest := plan[len(items):]
		n, room := 1, budget-size-rest[0].step.compensationBytes
		for n < len(rest) && rest[n].step.compensationBytes <= room {
			room -= rest[n].step.compensationBytes
			n++
		}
		batch := make([]string, n)
		for i, e := range rest[:n] {
			batch[i] = e.step.id
		}
		rows, err := q.Query(ctx, sqlPlanCompensations, groupID, batch)
		if err != nil {
			return nil, false, fmt.Errorf("unwind group %s: compensations: %w", groupID, err)
		}
		sealed := map[string][]byte{}
		var (
			id string
			ct []byte
		)
		if _, err := pgx.ForEachRow(rows, []any{&id, &ct}, func() error { sealed[id] = ct; return nil }); err != nil {
			return nil, false, fmt.Errorf("unwind group %s: compensations: %w", groupID, err)
		}
		for _, e := range rest[:n] {
			item, err := s.planItem(groupID, e, sealed[e.step.id], now)
			if err != nil {
				return nil, false, err
			}
			b, err := jsonx.Marshal(item)
			if err != nil {
				return nil, false, fmt.Errorf("unwind group %s: %w", groupID, err)
			}
			size += len(b) + 1 // and the comma after it
			items = append(items, item)
		}
	}
	return items, false, nil
}

// planItem is the plan item of entry e, whose step's compensation is
// sealed.
func (s *Service) planItem(groupID string, e planEntry, sealed []byte, now time.Time) (PlanItem, error) {
	doc, err := s.openJSON(e.step.id, "compensation", sealed)
	if err == nil && doc == nil {
		err = fmt.Errorf("compensation of effect %s: not found", e.step.id)
	}
	if err != nil {
		// A compensation this instance cannot open (its key is not
		// configured) fails the whole unwind, whose transaction then
		// leaves the group as it was: a plan without that item, or with
		// a null compensation, would have the caller undo the steps
		// behind it first, or begin a compensation without its
		// payload. The error names the step and the key (logged;
		// answered as a 500 saying a stored value is unreadable).
		return PlanItem{}, fmt.Errorf("unwind group %s: %w", groupID, err)
	}
	// As begin stored it: a Compensation, marshalled, by releases before
	// session 47 with HTML escapes (each <, > and & six bytes), which the
	// plan drops (jsonx.Unescaped), so that an item is the size of the
	// compensation as it was sent.
	var comp Compensation
	if err := json.Unmarshal(jsonx.Unescaped(doc), &comp); err != nil {
		return PlanItem{}, fmt.Errorf("settle group: compensation of %s: %w", e.step.id, err)
	}
	item := PlanItem{EffectID: e.step.id, Compensation: comp,
		SuggestedIdempotencyKey: CompensationKeyPrefix + e.step.id, CompensatesEffectID: e.step.id}
	if c := e.comp; c != nil {
		st := c.effectiveState(now)
		item.CompensationEffectID, item.CompensationState = &c.id, &st
		// A compensation begun under a key of its own is continued
		// under that key: the step takes one compensating effect, so
		// the usual key would be refused.
		item.SuggestedIdempotencyKey = c.key
	}
	return item, nil
}

// alternateCompensationKeys is how many keys after a step's usual one
// (compensate:<id>:2, :3, …) a plan may suggest when others hold them.
const alternateCompensationKeys = 8

// suggestFreeKeys moves the suggestion of a plan item whose compensation is
// not begun off a key another effect of the workspace already holds (a
// forward step begun under compensate:<id>, say): the compensating begin
// would be refused, or answered by that effect, and a client following the
// plan would be stuck (groups QA). The first free key of a fixed sequence
// is suggested, so retries are offered the same one until it is taken, and
// from then on the compensation's own key; when every key of the sequence
// is held, a random one (review: the usual key, held, was suggested).
func suggestFreeKeys(ctx context.Context, tx pgx.Tx, groupID string, plan []PlanItem) error {
	var candidates []string
	for _, item := range plan {
		if item.CompensationEffectID == nil {
			candidates = append(candidates, compensationKeys(item.EffectID)...)
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, sqlTakenKeys, groupID, candidates)
	if err != nil {
		return fmt.Errorf("settle group: taken keys: %w", err)
	}
	taken, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("settle group: taken keys: %w", err)
	}
	for i := range plan {
		if plan[i].CompensationEffectID != nil {
			continue
		}
		keys := compensationKeys(plan[i].EffectID)
		if free := slices.IndexFunc(keys, func(k string) bool { return !slices.Contains(taken, k) }); free >= 0 {
			plan[i].SuggestedIdempotencyKey = keys[free]
		} else {
			// Every key of the sequence held (squatted on, say): a fresh
			// random one, suggested once. Two callers following two plans
			// still undo the step once: it takes one compensating effect.
			plan[i].SuggestedIdempotencyKey = CompensationKeyPrefix + plan[i].EffectID + ":" + ids.Random(8)
		}
	}
	return nil
}

// compensationKeys are the keys a plan may suggest for undoing step, in
// order: the usual one first.
func compensationKeys(step string) []string {
	keys := []string{CompensationKeyPrefix + step}
	for n := 2; n <= alternateCompensationKeys+1; n++ {
		keys = append(keys, fmt.Sprintf("%s%s:%d", CompensationKeyPrefix, step, n))
	}
	return keys
}

// groupStep is one effect of a group as the rollback sees it.
type groupStep struct {
	id, effectType, key, state string
	denialCode                 *string
	leaseExpiresAt             *time.Time
	// compensationBytes is the length of its sealed compensation (0: it
	// declared none); only an unwind's plan reads the value
	// (sqlGroupSteps).
	compensationBytes    int
	compensates          *string
	createdAt, updatedAt time.Time
	succeededAt          *time.Time
	// unknownUntil is, for an indeterminate step, the end of the lease of
	// its latest attempt of unknown outcome: the latest it could have acted
	// (a retry after it reported failed did not act).
	unknownUntil *time.Time
	spent        bool // failed or denied, never to be tried again: its attempts used, or its retry rejected
}

// hasCompensation says whether the step declared a compensation.
func (st *groupStep) hasCompensation() bool { return st.compensationBytes > 0 }

func (st *groupStep) effectiveState(now time.Time) string {
	if st.state == StateLeased && lapsed(st.leaseExpiresAt, now) {
		return StateIndeterminate
	}
	return st.state
}

func groupSteps(ctx context.Context, q db.Querier, groupID string) ([]groupStep, error) {
	rows, err := q.Query(ctx, sqlGroupSteps, groupID)
	if err != nil {
		return nil, fmt.Errorf("group steps: %w", err)
	}
	defer rows.Close()
	var out []groupStep
	for rows.Next() {
		var st groupStep
		if err := rows.Scan(&st.id, &st.effectType, &st.key, &st.state, &st.denialCode, &st.leaseExpiresAt,
			&st.compensationBytes, &st.compensates, &st.createdAt, &st.updatedAt, &st.succeededAt, &st.unknownUntil,
			&st.spent); err != nil {
			return nil, fmt.Errorf("group steps: %w", err)
		}
		out = append(out, st)
	}
	return out, rows.Err()
}

// rollback is what remains of a group's rollback.
type rollback struct {
	plan                               []planEntry
	unresolved, irreversible, reversed []string
	// held lists the steps to undo that sit behind an unknown outcome: a
	// step that may have succeeded after them, or a compensation of one
	// whose lease lapsed unreported. (A compensation merely in flight stops
	// the plan too, but undoing what comes before it meanwhile is no
	// rollback past a maybe: the plan offers such steps together.)
	held []string
}

// planEntry is a forward step in the rollback's walk: a compensation to
// perform, or (maybe) a step whose outcome is unknown.
type planEntry struct {
	step  *groupStep
	comp  *groupStep // its compensating effect, if begun
	at    time.Time  // where it falls in the order of success
	maybe bool       // the step's own outcome is unknown: the walk stops here
	stop  bool       // its compensation's outcome is unknown: the walk stops after it
	// lapsed says the compensation stopping the walk lapsed unreported
	// (not merely in flight).
	lapsed bool
}

// reachedByRollback refuses a new compensation of step while the rollback
// has not reached it: a step after it in the order of success has an
// outcome that is unknown (or a compensation whose lease lapsed
// unreported), so unwind does not offer it, and undoing it would roll back
// past a maybe — how a half-undone state is created (see rollback.held).
func reachedByRollback(ctx context.Context, tx pgx.Tx, groupID, groupState, step string, now time.Time) error {
	steps, err := groupSteps(ctx, tx, groupID)
	if err != nil {
		return err
	}
	r := planRollback(steps, now, groupEnded(groupState))
	if !slices.Contains(r.held, step) {
		return nil
	}
	return apierr.InvalidState("The rollback has not reached this step: a step that succeeded after it, or its "+
		"compensation, has an unknown outcome. Verify it (resolve) first, then call unwind again.").
		WithDetail("unresolved", r.unresolved)
}

// finalDenial is a denial that a later begin on the same key cannot lift,
// or a failure whose key has no attempt left or whose retry an operator
// rejected (its next begin would be that denial: waiting for it would hold
// the rollback open for nothing).
func finalDenial(st *groupStep) bool {
	return st.spent || st.state == StateDenied && st.denialCode != nil &&
		(*st.denialCode == apierr.CodeApprovalRejected || *st.denialCode == apierr.CodeMaxAttemptsExceeded)
}

// planRollback walks the forward steps in reverse order of success. A step
// whose outcome is unknown sits where it could have succeeded at the latest
// (its lease's end: a live lease is later than every known success; for an
// indeterminate one, the lease of its latest attempt of unknown outcome,
// not that of a retry after it reported failed, which did not act: where
// it sits once resolved succeeded, sqlGroupSteps), and
// the plan stops there: what succeeded before it is not compensated until it
// is known. A compensation whose own outcome is unknown stays in the plan
// (retrying its suggested key is safe) but nothing after it is offered.
// Failed, denied and approval-waiting steps never happened: nothing to undo.
//
// ended says the rollback ended: its record is final, so a compensation that
// did not succeed is what made its step irreversible, whatever the policy
// says now.
func planRollback(steps []groupStep, now time.Time, ended bool) rollback {
	comps := map[string]*groupStep{}
	for i := range steps {
		if c := steps[i].compensates; c != nil {
			comps[*c] = &steps[i]
		}
	}
	r := rollback{unresolved: []string{}, irreversible: []string{}, reversed: []string{}}
	var walk []planEntry
	for i := range steps {
		st := &steps[i]
		if st.compensates != nil {
			continue
		}
		switch st.effectiveState(now) {
		case StateSucceeded:
			c := comps[st.id]
			switch {
			case !st.hasCompensation() || (c != nil && (finalDenial(c) || ended && c.state != StateSucceeded)):
				r.irreversible = append(r.irreversible, st.id)
				continue
			case c != nil && c.state == StateSucceeded:
				r.reversed = append(r.reversed, st.id)
				continue
			}
			at := st.updatedAt
			if st.succeededAt != nil {
				at = *st.succeededAt
			}
			e := planEntry{step: st, comp: c, at: at}
			if c != nil {
				if cs := c.effectiveState(now); cs == StateLeased || cs == StateIndeterminate {
					e.stop, e.lapsed = true, cs == StateIndeterminate
				}
			}
			walk = append(walk, e)
		case StateLeased, StateIndeterminate:
			at := st.updatedAt
			switch {
			case st.state == StateIndeterminate && st.unknownUntil != nil:
				at = *st.unknownUntil
			case st.leaseExpiresAt != nil:
				at = *st.leaseExpiresAt
			}
			walk = append(walk, planEntry{step: st, at: at, maybe: true})
		}
	}
	sort.SliceStable(walk, func(i, j int) bool {
		if !walk[i].at.Equal(walk[j].at) {
			return walk[i].at.After(walk[j].at)
		}
		return walk[i].step.id > walk[j].step.id
	})
	stopped, unknown := false, false
	for _, e := range walk {
		if unknown && !e.maybe {
			r.held = append(r.held, e.step.id)
		}
		unknown = unknown || e.maybe || e.lapsed
		switch {
		case e.maybe:
			r.unresolved = append(r.unresolved, e.step.id)
			stopped = true
		case e.stop:
			r.unresolved = append(r.unresolved, e.comp.id)
			if !stopped {
				r.plan = append(r.plan, e)
			}
			stopped = true
		case !stopped:
			r.plan = append(r.plan, e)
		}
	}
	return r
}

// grouped reports whether begin must consult a group.
func (in *beginInput) grouped() bool { return in.groupID != nil || in.compensates != nil }

// keyUsedOutsideGroup refuses a grouped begin whose key names an effect of
// another group, or of none.
func keyUsedOutsideGroup() error {
	return apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
		"This idempotency key was used outside this group; a group's steps need keys of their own.")
}

// keyNamesAnotherRole refuses a grouped begin whose key names an effect of
// the group that is not what the begin is: the compensation of another
// step (or a forward step) for a compensating begin, a compensation for a
// forward one.
func keyNamesAnotherRole(compensates *string) error {
	if compensates != nil {
		return apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
			"This idempotency key names another effect of the group than a compensation of step %s; "+
				"compensate it under a key of its own (the unwind plan suggests one).", *compensates)
	}
	return apierr.Conflict(apierr.CodeIdempotencyKeyReuse,
		"This idempotency key names a compensating effect of the group; a forward step needs a key of its own.")
}

// samePtr says whether two optional ids are both absent or equal.
func samePtr(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// beginInTx is begin for a request naming a group or a step to compensate,
// or a run with a wallet (budget), in one transaction. The run's wallet is
// locked first (chargeWallet). The group is held shared for the whole
// begin, so a commit or an unwind (which take it exclusively) orders
// strictly before or after it: no forward step slips into a group whose
// rollback has started. The rest of the decision is begin's own, in the
// same transaction.
func (s *Service) beginInTx(ctx context.Context, in *beginInput, w *wallet) (Decision, error) {
	d, err := s.beginInTxOnce(ctx, in, w)
	if db.ConstraintName(err) != "effects_compensates_idx" {
		return d, err
	}
	// A concurrent begin's compensation of the step committed first.
	id, key, cerr := compensationOf(ctx, s.pool, *in.compensates)
	switch {
	case cerr != nil:
		return Decision{}, cerr
	case id == "":
		return d, err
	case key == in.key:
		// Begun under this very key (callers following one plan item at
		// once): the key now names it, and this begin is answered as any
		// begin of a taken key is (in_flight, duplicate), not told to use
		// the key it used (groups QA: 1 in 6 concurrent compensations of
		// one item was refused so; the insert met the step's index before
		// the key's).
		return s.beginInTxOnce(ctx, in, w)
	}
	return Decision{}, compensatedBy(id)
}

// beginInTxOnce is one try of beginInTx.
func (s *Service) beginInTxOnce(ctx context.Context, in *beginInput, w *wallet) (Decision, error) {
	var d Decision
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		if err := sharePolicy(ctx, tx, in); err != nil {
			return err
		}
		if w != nil {
			if err := s.chargeWallet(ctx, tx, in, *w); err != nil {
				return err
			}
		}
		if in.grouped() {
			if err := s.admit(ctx, tx, in); err != nil {
				return err
			}
		}
		s.lockedAt(in)
		var err error
		d, err = s.decide(ctx, tx, in, func(ctx context.Context, in *beginInput) (Decision, error) {
			return s.decideLocked(ctx, tx, in)
		})
		if err == nil && in.joinsGroup {
			err = s.groupHasRoom(ctx, tx, *in.groupID)
		}
		return err
	})
	return d, err
}

// groupHasRoom refuses a forward step that took its group past
// MaxGroupSteps, before its transaction commits, so that nothing of it is
// kept. It is checked last, once the step is in (its key's effect may
// also have been inserted by a concurrent begin instead, which this one
// then answers), under a lock held until the commit: each begin adding a
// step counts the steps committed before it took the lock, in a statement
// of its own, and its own, so a group never holds more (a check at admit
// would let begins racing for the last place each find it free). Only the
// count and the commit are serialised, not the begins. The group is open
// (admit holds it shared), so its effects are all forward steps.
func (s *Service) groupHasRoom(ctx context.Context, tx pgx.Tx, groupID string) error {
	if _, err := tx.Exec(ctx, sqlLockGroupSteps, groupID); err != nil {
		return fmt.Errorf("begin: lock group steps: %w", err)
	}
	var n int
	if err := tx.QueryRow(ctx, sqlCountGroupSteps, groupID, s.maxGroupSteps+1).Scan(&n); err != nil {
		return fmt.Errorf("begin: count group steps: %w", err)
	}
	if n <= s.maxGroupSteps {
		return nil
	}
	return apierr.InvalidState("The group holds %d steps, the most one group takes; start a new group for the "+
		"rest of the work.", s.maxGroupSteps).WithDetail("state", GroupOpen).
		WithDetail("group_steps_max", s.maxGroupSteps)
}

// alreadyCompensated is the refusal of a second compensating effect for a
// step: it names the one the step has (detail.compensating_effect_id; the
// caller may see the step, so its compensation too), whose key a retry
// should use. It answers nil when the step has none.
func (s *Service) alreadyCompensated(ctx context.Context, q db.Querier, stepID string) error {
	id, _, err := compensationOf(ctx, q, stepID)
	if err != nil || id == "" {
		return err
	}
	return compensatedBy(id)
}

// compensatedBy is alreadyCompensated's refusal, naming the step's
// compensating effect id.
func compensatedBy(id string) error {
	return apierr.InvalidState("That step already has a compensating effect; "+
		"begin it again with the idempotency key it was begun with (the unwind plan suggests it).").
		WithDetail("compensating_effect_id", id)
}

// compensationOf reads the compensating effect of stepID and its key; the
// id is "" when the step has none.
func compensationOf(ctx context.Context, q db.Querier, stepID string) (id, key string, err error) {
	var k *string
	err = q.QueryRow(ctx, sqlCompensationOf, stepID).Scan(&id, &k)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("begin: the step's compensation: %w", err)
	}
	if k != nil {
		key = *k
	}
	return id, key, nil
}

// matchesDeclared checks a compensating begin against the compensation its
// step declared: the rollback will count the step as reversed once this
// effect succeeds, and the step's one compensation slot is taken by it, so
// it must be the declared undo (effect type and payload, compared
// canonically), not any effect that names the step.
func (s *Service) matchesDeclared(ctx context.Context, q db.Querier, in *beginInput) error {
	var declared []byte
	if err := q.QueryRow(ctx, sqlEffectCompensation, *in.compensates).Scan(&declared); err != nil {
		return fmt.Errorf("begin: declared compensation: %w", err)
	}
	doc, err := s.openJSON(*in.compensates, "compensation", declared)
	if err != nil {
		return err
	}
	var c Compensation
	if err := json.Unmarshal(doc, &c); err != nil {
		return fmt.Errorf("begin: declared compensation: %w", err)
	}
	var p apierr.Problems
	if c.EffectType != in.effectType {
		p.Add("effect_type", "must be %q, the compensation step %s declared (see its unwind plan)",
			c.EffectType, *in.compensates)
	}
	want, err := canonjson.Hash(rawOrNull(c.Payload))
	if err != nil {
		return fmt.Errorf("begin: declared compensation: %w", err)
	}
	if want != in.payloadHash {
		p.Add("payload", "must be the payload the compensation of step %s declared (see its unwind plan)",
			*in.compensates)
	}
	return p.Err()
}

// admit checks a grouped begin: the group is in the workspace (404
// otherwise); a compensating effect names a step of that group that
// succeeded (the group is then taken from the step when omitted) and the
// group's rollback has started; a forward step needs an open group
// (group_unwinding once a rollback started, invalid_state once committed).
// A key that already names an effect of this group is a replay: its state
// answers it, and a new attempt on it is checked by admitAttempt instead. A
// key that names an effect outside the group is a reuse of the key.
func (s *Service) admit(ctx context.Context, tx pgx.Tx, in *beginInput) error {
	in.joinsGroup = false
	var (
		targetState string
		declares    bool // the target declared a compensation
	)
	if in.compensates != nil {
		if in.compensation != nil {
			return apierr.InvalidField("compensation", "must be left out: a compensating effect has no compensation of its own")
		}
		var (
			group, target *string
			state         string
			exp           *time.Time
		)
		err := tx.QueryRow(ctx, sqlCompensationTarget, *in.compensates, in.ws, in.groupOwner).Scan(&group, &state, &exp, &target,
			&declares)
		if errors.Is(err, pgx.ErrNoRows) && in.groupOwner != nil && in.readsEffects {
			// A key that reads every effect is told what it lacks to act
			// on another key's step, not that the effect is unknown, and
			// what any key is told of an effect that is no step.
			err = tx.QueryRow(ctx, sqlCompensationTarget, *in.compensates, in.ws, nil).Scan(&group, &state, &exp,
				&target, &declares)
			if err == nil && group != nil && target == nil {
				return apierr.Forbidden(auth.ScopeEffectsResolve)
			}
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.NotFound("effect")
		}
		if err != nil {
			return fmt.Errorf("begin: compensation target: %w", err)
		}
		if in.groupID != nil && (group == nil || *in.groupID != *group) {
			// A group_id that names no group this key sees is unknown
			// (404), whatever step it is paired with (review: it was told
			// the step is not of that group).
			if err := groupVisible(ctx, tx, in); err != nil {
				return err
			}
		}
		switch {
		case group == nil || target != nil:
			return apierr.InvalidField("compensates_effect_id", "must name a forward step of an effect group")
		case in.groupID != nil && *in.groupID != *group:
			return apierr.InvalidField("compensates_effect_id", "must name a step of group_id's group")
		case !declares:
			// The rollback lists such a step as irreversible; a compensation
			// of it would be an effect no plan or settlement accounts for.
			return apierr.InvalidState("That step declared no compensation: the rollback lists it as " +
				"irreversible, so there is nothing to undo it with.")
		}
		in.groupID = group
		targetState = state
		if state == StateLeased && lapsed(exp, in.now) {
			targetState = StateIndeterminate
		}
	}
	var (
		state     string
		replay    bool
		keysGroup *string
	)
	err := tx.QueryRow(ctx, sqlAdmitGroup, *in.groupID, in.ws, in.key, in.groupOwner).Scan(&state, &replay, &keysGroup)
	if errors.Is(err, pgx.ErrNoRows) && in.groupOwner != nil && in.readsEffects {
		if ferr := readableNotActable(ctx, tx, in.ws, *in.groupID); ferr != nil {
			return ferr
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.NotFound("group")
	}
	if err != nil {
		return fmt.Errorf("begin: group: %w", err)
	}
	// The group is held: what the rollback says of the steps is judged at
	// a clock read now, not before the wait for it (review: a compensation
	// of a later step that lapsed unreported meanwhile was read in flight,
	// and the step behind it was compensated past that maybe).
	s.lockedAt(in)
	if !replay && state != GroupOpen {
		// sqlAdmitGroup may have waited for the group's row behind a
		// commit or an unwind, itself behind the begin that took the key:
		// woken, it re-read that row alone, and the effects it joined are
		// as of its start. A statement of its own sees the effect that
		// begin committed, and the retry is answered, not refused as a new
		// step (QA: 409 invalid_state to a retry of a committed group's
		// step). An open group refuses no begin here.
		err := tx.QueryRow(ctx, sqlKeysGroup, in.ws, in.key).Scan(&keysGroup)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("begin: group key: %w", err)
		}
		replay = err == nil
	}
	if replay {
		if keysGroup == nil || *keysGroup != *in.groupID {
			return keyUsedOutsideGroup()
		}
		return nil
	}
	if in.compensates == nil {
		in.joinsGroup = true
		return forwardAdmitted(state)
	}
	if state == GroupOpen || state == GroupCommitted {
		return apierr.InvalidState("Compensating effects join a group once its rollback started; call unwind first.").
			WithDetail("state", state)
	}
	if groupEnded(state) {
		// Its record is final. A step's compensation still there answered
		// above (a replay of its key); one retention deleted left the
		// step's key new and its unique index free, and a retried rollback
		// refunded again (retention QA).
		return apierr.InvalidState("The group's rollback ended (%s); it takes no new compensating effect.", state).
			WithDetail("state", state)
	}
	if targetState != StateSucceeded {
		return apierr.InvalidState("Only a step that succeeded can be compensated; this one is %s.", targetState).
			WithDetail("state", targetState)
	}
	if err := reachedByRollback(ctx, tx, *in.groupID, state, *in.compensates, in.now); err != nil {
		return err
	}
	if err := s.matchesDeclared(ctx, tx, in); err != nil {
		// Another effect than the declared one: refused either way, but a
		// step compensated already says so first, as the insert would.
		if taken := s.alreadyCompensated(ctx, tx, *in.compensates); taken != nil {
			return taken
		}
		return err
	}
	return nil
}

// forwardAdmitted is whether a group in state takes a new forward step (or
// a new attempt at one).
func forwardAdmitted(state string) error {
	switch state {
	case GroupOpen:
		return nil
	case GroupCommitted:
		return apierr.InvalidState("The group is committed; start a new group for new work.").
			WithDetail("state", state)
	}
	if state == GroupUnwinding {
		return apierr.Conflict(apierr.CodeGroupUnwinding,
			"The effect group is being compensated; start a new group if the work is genuinely new.").
			WithDetail("state", state)
	}
	// QA: "is being compensated" read wrong of a rollback that ended.
	return apierr.Conflict(apierr.CodeGroupUnwinding,
		"The effect group was rolled back (%s); start a new group if the work is genuinely new.", state).
		WithDetail("state", state)
}

// admitAttempt checks a new attempt (or a fresh evaluation) of an existing
// effect against its group: a forward step needs an open group. The group is
// held shared until the attempt commits.
func admitAttempt(ctx context.Context, tx pgx.Tx, row *effectRow) error {
	if row.GroupID == nil || row.CompensatesEffectID != nil {
		return nil
	}
	var state string
	if err := tx.QueryRow(ctx, sqlShareGroupState, *row.GroupID).Scan(&state); err != nil {
		return fmt.Errorf("begin: group state: %w", err)
	}
	return forwardAdmitted(state)
}

// shareEffectGroup holds the group of the key's effect (read before its row
// lock) shared before the locked path locks the row, in the order a
// grouped begin takes them (admit, then the row). admitAttempt and
// admitCompensationGrant hold it after the row lock; taken only there, a
// begin naming no group (or a grouped one past admit's replay) waited for
// it behind an unwind queued for a grouped begin, which itself waited for
// the row: a deadlock, answered 503 a second later (groups QA, a failed
// step's retries with and without group_id racing unwind).
func shareEffectGroup(ctx context.Context, tx pgx.Tx, in *beginInput) error {
	if in.effectGroup == nil {
		return nil
	}
	var state string
	if err := tx.QueryRow(ctx, sqlShareGroupState, *in.effectGroup).Scan(&state); err != nil &&
		!errors.Is(err, pgx.ErrNoRows) { // deleted by retention: the row lock answers
		return fmt.Errorf("begin: group: %w", err)
	}
	return nil
}

// awaitsApproval checks a forward step held by its pending approval before
// begin answers approval_required: once its group's rollback started the
// approval can no longer be given (sqlDecideApproval), so the step is
// answered as a new attempt at it would be, not told to wait for nothing.
// A read only: any begin of the key, grouped or not, gets the same answer.
func awaitsApproval(ctx context.Context, q db.Querier, row *effectRow) error {
	if row.GroupID == nil || row.CompensatesEffectID != nil {
		return nil
	}
	var state string
	if err := q.QueryRow(ctx, sqlGroupState, *row.GroupID).Scan(&state); err != nil {
		return fmt.Errorf("begin: group state: %w", err)
	}
	return forwardAdmitted(state)
}

// admitCompensationGrant checks a new attempt of a compensating effect, at
// the grant (a final refusal answers first): once its group's rollback
// ended (unwound, unwind_failed) the record is final, and a compensation it
// counted irreversible must not run after all (QA: raising the type's
// max_attempts let it). Nor may it run while the rollback has not reached
// its step (reachedByRollback), as its first attempt could not (admit):
// a retry after a failed attempt, with a later step's compensation lapsed
// unreported meanwhile, rolled back past that maybe (groups QA). The group
// is held shared until the grant commits.
func admitCompensationGrant(ctx context.Context, tx pgx.Tx, row *effectRow, now time.Time) error {
	if row.GroupID == nil || row.CompensatesEffectID == nil {
		return nil
	}
	var state string
	if err := tx.QueryRow(ctx, sqlShareGroupState, *row.GroupID).Scan(&state); err != nil {
		return fmt.Errorf("begin: group state: %w", err)
	}
	if groupEnded(state) {
		return apierr.InvalidState("The group's rollback ended (%s); its compensations take no new attempt.", state).
			WithDetail("state", state)
	}
	return reachedByRollback(ctx, tx, *row.GroupID, state, *row.CompensatesEffectID, now)
}

// groupEnded says whether a group's rollback ended.
func groupEnded(state string) bool { return state == GroupUnwound || state == GroupUnwindFailed }

// groupVisible answers 404 unless in's group_id names a group of the
// workspace that the begin's key may read: its own, or any with
// effects:read.
func groupVisible(ctx context.Context, tx pgx.Tx, in *beginInput) error {
	owner := in.groupOwner
	if in.readsEffects {
		owner = nil
	}
	var seen bool
	if err := tx.QueryRow(ctx, sqlGroupVisible, *in.groupID, in.ws, owner).Scan(&seen); err != nil {
		return fmt.Errorf("begin: group: %w", err)
	}
	if !seen {
		return apierr.NotFound("group")
	}
	return nil
}

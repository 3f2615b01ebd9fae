package gate

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
)

// Approval states.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalRejected = "rejected"
)

// Approval is an operator decision on one effect (API.md §5).
type Approval struct {
	ID         string     `json:"id"`
	EffectID   string     `json:"effect_id"`
	EffectType string     `json:"effect_type"`
	State      string     `json:"state" openapi:"enum=pending|approved|rejected"`
	Reason     string     `json:"reason" openapi:"enum=policy_requires_approval|circuit_open|cost_at_or_above_threshold"`
	CreatedAt  time.Time  `json:"created_at"`
	DecidedAt  *time.Time `json:"decided_at"`
	Note       *string    `json:"note"`
	// Answers, once approved, is every reason the approval answers: the
	// one it was asked for and every other that held as it was given
	// (null while pending, and for a rejection).
	Answers []string `json:"answers" openapi:"itemEnum=policy_requires_approval|circuit_open|cost_at_or_above_threshold" jsonschema:"once approved, every reason the approval answers: the one it was asked for and every other that held as it was given; null while pending, and for a rejection"`
	// DecidedByKeyID is the key that decided it: the operator's that
	// approved or rejected it, the resolving key's for one a resolution
	// closed, the unwinding key's for one an unwind closed; null while
	// pending, and for one that no key decided (closed where a rollback
	// ended, or by the sweeper for a rollback). Keys are revoked, never
	// deleted, so it names the key for good.
	DecidedByKeyID *string `json:"decided_by_key_id" jsonschema:"the key that decided it (approved or rejected it, or closed it by a resolution or an unwind); null while pending, and for one no key decided"`
	// CostMicros and IdempotencyKey are the held effect's: what an
	// approver says yes to (the amount, the work), readable without
	// effects:read. The effect's fingerprint binds both, so a begin of the
	// key with another cost is 409 idempotency_key_reuse, never the
	// approved effect.
	CostMicros     *int64 `json:"cost_micros" jsonschema:"the held effect's declared cost (null: none declared); its key cannot be begun with another"`
	IdempotencyKey string `json:"idempotency_key" jsonschema:"the held effect's idempotency key"`
}

// DecideRequest is the body of approve and reject.
type DecideRequest struct {
	Note string `json:"note,omitempty" openapi:"maxLength=2000"`
}

func scanApproval(row pgx.Row) (Approval, error) {
	var a Approval
	err := row.Scan(a.dest()...)
	return a, err
}

// dest is where approvalCols scan into.
func (a *Approval) dest() []any {
	return []any{&a.ID, &a.EffectID, &a.EffectType, &a.State, &a.Reason, &a.CreatedAt, &a.DecidedAt, &a.Note,
		&a.Answers, &a.DecidedByKeyID, &a.CostMicros, &a.IdempotencyKey}
}

// GetApproval reads one approval: what begin's approval_id names, so a
// caller can follow its question without paging the list.
func (s *Service) GetApproval(ctx context.Context, workspaceID, id string) (Approval, error) {
	a, err := scanApproval(s.pool.QueryRow(ctx, sqlGetApproval, id, workspaceID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, apierr.NotFound("approval")
	}
	if err != nil {
		return Approval{}, fmt.Errorf("read approval: %w", err)
	}
	return a, nil
}

// ListApprovals pages newest first, optionally by state.
func (s *Service) ListApprovals(ctx context.Context, workspaceID, state, cursor string, limit int) ([]Approval, error) {
	if state != "" && state != ApprovalPending && state != ApprovalApproved && state != ApprovalRejected {
		return nil, apierr.InvalidField("state", "must be pending, approved or rejected")
	}
	sql, args := db.NewestFirst(sqlListApprovals, "workspace_id", []any{workspaceID}, cursor, "state", state, limit)
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list approvals: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Approval, error) { return scanApproval(r) })
}

// Decide approves or rejects a pending approval. After approval the next
// begin on the key executes; after rejection every begin on it is denied
// (approval_rejected is final). Repeating the same decision answers the
// approval unchanged; the other decision is 409 invalid_state.
func (s *Service) Decide(ctx context.Context, p *auth.Principal, id, state string, req DecideRequest) (Approval, error) {
	if utf8.RuneCountInString(req.Note) > maxNoteRunes {
		return Approval{}, apierr.InvalidField("note", "must be at most %d characters", maxNoteRunes)
	}
	var note *string
	if req.Note != "" {
		note = &req.Note
	}
	now := s.clock()
	var (
		a     Approval
		group *string // the effect's group
	)
	err := db.Writer(ctx, s.pool).QueryRow(ctx, sqlDecideApproval, id, p.WorkspaceID, state, now, p.KeyID, note,
		ids.NewAt(ids.Event, now)).Scan(append(a.dest(), &group)...)
	if err == nil {
		if state == ApprovalRejected {
			// A rejected compensation may end its group's rollback, as a
			// report does (groups QA: the group read unwinding until a read
			// or the sweeper settled it).
			return a, committedThen(s.afterStep(ctx, p.WorkspaceID, group))
		}
		return a, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, fmt.Errorf("decide approval: %w", err)
	}
	revoked, err := auth.KeyRevoked(ctx, s.pool, p.KeyID)
	if err != nil {
		return Approval{}, err
	}
	if revoked {
		return Approval{}, auth.ErrRevokedKey() // revoked since this instance cached it
	}
	a, err = s.GetApproval(ctx, p.WorkspaceID, id)
	if err != nil {
		return Approval{}, err
	}
	if a.State == state {
		if state == ApprovalRejected {
			// The repeat of a rejection whose answer was lost, or was
			// outcome unknown because the settling of its group failed
			// after it committed: it ends the rollback as the first would
			// have (QA: the repeat answered the approval and the group's
			// row read unwinding until a read or the sweeper settled it).
			var group *string
			if err := s.pool.QueryRow(ctx, sqlEffectGroupOf, a.EffectID).Scan(&group); err != nil &&
				!errors.Is(err, pgx.ErrNoRows) { // deleted by retention: nothing to settle
				return Approval{}, fmt.Errorf("decide approval: effect's group: %w", err)
			}
			return a, committedThen(s.afterStep(ctx, p.WorkspaceID, group))
		}
		return a, nil
	}
	if a.State == ApprovalPending {
		return Approval{}, s.rolledBack(ctx, id)
	}
	return Approval{}, apierr.InvalidState("This approval was already %s.", a.State).WithDetail("state", a.State)
}

// rolledBack is the refusal of a yes to a pending approval whose effect its
// group's rollback keeps from ever running (sqlDecideApproval takes no
// other yes back): approved, nothing would run, yet the queue would show
// it decided (groups QA). A rejection still clears it from the queue.
func (s *Service) rolledBack(ctx context.Context, id string) error {
	var state string
	if err := s.pool.QueryRow(ctx, sqlApprovalRolledBack, id).Scan(&state); err != nil {
		return fmt.Errorf("decide approval: still pending: %w", err)
	}
	return apierr.Conflict(apierr.CodeGroupUnwinding, "The effect's group's rollback started (%s): its effect "+
		"can never run, so it cannot be approved; reject the approval to clear it.", state).WithDetail("state", state)
}

// mootNote is the note of an approval a resolution closed (closeMootApprovals).
const mootNote = "Closed without a decision: the effect was resolved succeeded, so nothing is left to approve."

// closeMootApprovals decides, in tx, the pending approvals of those of
// effects that a resolution (an operator's resolve, a reconciliation) has
// just settled succeeded: each asked whether a retry of an effect whose
// outcome was unknown may run, and the resolution answered that nothing
// runs again (every later begin is a duplicate). Left pending, it stayed in
// the queue for good (gate QA). It is rejected, with mootNote, by the
// resolving key, and announced (approval.decided) as a decision is; the
// effect keeps its state. A key revoked meanwhile leaves it pending, as
// does a decide holding it; the sweeper closes such (SweepMootApprovals).
func (s *Service) closeMootApprovals(ctx context.Context, tx pgx.Tx, p *auth.Principal, effects []string,
	now time.Time) error {
	moot, err := db.CollectIDs(tx.Query(ctx, sqlMootApprovals, effects, p.WorkspaceID))
	if err != nil {
		return fmt.Errorf("close moot approvals: %w", err)
	}
	note := mootNote
	for _, id := range moot {
		var (
			a     Approval
			group *string
		)
		err := tx.QueryRow(ctx, sqlDecideApproval, id, p.WorkspaceID, ApprovalRejected, now, p.KeyID, &note,
			ids.NewAt(ids.Event, now)).Scan(append(a.dest(), &group)...)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("close moot approval: %w", err)
		}
	}
	return nil
}

// rolledBackNote is the note of an approval a group's rollback closed
// (closeRolledBackApprovals).
const rolledBackNote = "Closed without a decision: the effect's group was rolled back, which keeps the effect " +
	"from ever running, so nothing is left to approve."

// closeRolledBackApprovals decides, in tx, which holds group groupID and
// has just moved it (an unwind began, or the rollback ended), the pending
// approvals of its effects that the rollback keeps from ever running (a
// forward step once the unwind began, a compensation once the rollback
// ended): a yes could no longer be given (Decide: 409 group_unwinding),
// and left pending each stayed in the queue for good until an operator
// rejected it by hand (groups QA). Each is rejected, with rolledBackNote,
// decided by key (the key that unwound; nil when the rollback's end came
// from elsewhere), and announced (approval.decided) as a decision is; the
// effect keeps its state, so a begin of its key is still answered by the
// group (409 group_unwinding), not approval_rejected. One another
// transaction holds is passed over (a decide deciding it now, or a begin
// or resolve holding its effect); the sweeper closes such
// (SweepMootApprovals).
func (s *Service) closeRolledBackApprovals(ctx context.Context, tx pgx.Tx, groupID string, key *string,
	now time.Time) error {
	moot, err := db.CollectIDs(tx.Query(ctx, sqlLockRolledBackApprovals, groupID))
	if err != nil {
		return fmt.Errorf("close rolled-back approvals: %w", err)
	}
	if len(moot) == 0 {
		return nil
	}
	now = now.UTC().Truncate(time.Microsecond)
	if _, err := tx.Exec(ctx, sqlCloseRolledBackApprovals, now, moot, rolledBackNote, eventIDsAt(now, len(moot)),
		key); err != nil {
		return fmt.Errorf("close rolled-back approvals: %w", err)
	}
	return nil
}

// SweepMootApprovals closes up to limit pending approvals that ask nothing
// any more, as the inline closes do: those whose effect is settled
// succeeded (closeMootApprovals), and those whose effect its group's
// rollback keeps from ever running (closeRolledBackApprovals); each one
// closed before the inline close existed, or passed over because another
// transaction held it then (sqlSweepMootApprovals). It answers how many it
// closed.
func (s *Service) SweepMootApprovals(ctx context.Context, now time.Time, limit int) (int, error) {
	now = now.UTC().Truncate(time.Microsecond)
	var n int
	if err := s.pool.QueryRow(ctx, sqlSweepMootApprovals, now, limit, mootNote, eventIDsAt(now, limit),
		rolledBackNote).Scan(&n); err != nil {
		return 0, fmt.Errorf("sweep moot approvals: %w", err)
	}
	return n, nil
}

package gate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/redact"
)

// ReportRequest is the body of POST /api/v1/effects/{id}/report.
type ReportRequest struct {
	LeaseToken string          `json:"lease_token"`
	Outcome    string          `json:"outcome" openapi:"enum=succeeded|failed"`
	Result     json.RawMessage `json:"result"`
}

// HeartbeatRequest is the body of POST /api/v1/effects/{id}/heartbeat.
type HeartbeatRequest struct {
	LeaseToken string `json:"lease_token"`
}

// HeartbeatResponse carries the extended lease.
type HeartbeatResponse struct {
	EffectID       string    `json:"effect_id"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
}

// ResolveRequest is the body of POST /api/v1/effects/{id}/resolve.
type ResolveRequest struct {
	Outcome string          `json:"outcome" openapi:"enum=succeeded|failed"`
	Result  json.RawMessage `json:"result"`
	Note    string          `json:"note,omitempty" openapi:"maxLength=2000"`
	// Attempt, when sent, is the attempt the operator verified (the
	// effect's latest unknown one, as read): the resolve applies only to
	// it, so a resolve retried after its answer was lost can never settle
	// an attempt begun since. Absent, the resolve settles whatever is
	// unknown now.
	Attempt *int `json:"attempt,omitempty" openapi:"min=1" jsonschema:"the attempt you verified at the vendor (the effect's latest unknown attempt, as you read it); the resolve applies only to it, so a retried resolve can never settle a later attempt"`
}

const maxNoteRunes = 2000 // ResolveRequest's openapi tag says it too

func checkOutcome(pr *apierr.Problems, outcome string) {
	if outcome != StateSucceeded && outcome != StateFailed {
		pr.Add("outcome", "must be succeeded or failed")
	}
}

func checkToken(pr *apierr.Problems, token string) {
	if token == "" || len(token) > 200 {
		pr.Add("lease_token", "must be the lease_token begin returned")
	}
}

// sealedResult validates and seals a result; a missing result stays NULL.
func (s *Service) sealedResult(effectID string, result json.RawMessage) (sealed []byte, preview *string, err error) {
	res := nullJSON(result)
	if len(res) > MaxResultBytes {
		compact, err := compactJSON(res)
		if err != nil || len(compact) > MaxResultBytes {
			return nil, nil, apierr.PayloadTooLarge(MaxResultBytes)
		}
		res = compact
	}
	if res == nil {
		return nil, nil, nil
	}
	p := string(redact.PreviewJSON(res))
	return s.sealJSON(effectID, "result", res), &p, nil
}

// compactJSON writes doc without white space or escapes it does not need
// (jsonx.Marshal: every string in UTF-8, <, > and & as themselves). The
// result limit is on the value, not on how its sender wrote it (contract
// QA: Python's json.dumps escapes every character beyond ASCII, so 150 KB
// of text sent as 300 KB was refused, and so was a retry of an accepted
// report sent that way; review: padding, or HTML escaped by the measure,
// counted too). Only a result over the limit as sent is written again, and
// it is stored so (its object keys sorted): never more than the limit.
func compactJSON(doc json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return jsonx.Marshal(v)
}

// leaseExpired refuses a report or heartbeat that came after its lease.
// Its message must not send a caller that acted to begin again (MCP QA:
// under on_indeterminate retry that begin is an execute, and an agent told
// to begin again acted twice): what happened is an operator's to record.
// state is the effect's, once its lapse is recorded: an operator's resolve
// or a reconciliation may have settled it since (QA: the message still
// said the outcome reads unknown, and sent the caller to an operator who
// had already recorded it).
func leaseExpired(state string) error {
	if state == StateSucceeded || state == StateFailed {
		return apierr.Conflict(apierr.CodeLeaseExpired,
			"The lease expired before this call, so this call changed nothing; the effect's outcome has since "+
				"been recorded as %s (resolve or reconciliation). Do not act again.", state)
	}
	return apierr.Conflict(apierr.CodeLeaseExpired,
		"The lease expired before this call, so this call changed nothing and the attempt's outcome reads "+
			"unknown (indeterminate). Do not act again: if the action happened, an operator records it with "+
			"resolve; the key's next begin answers as its policy's on_indeterminate says.")
}

func leaseLost() *apierr.Error {
	return apierr.Conflict(apierr.CodeLeaseLost,
		"This lease token does not hold the effect's current attempt: a newer attempt superseded it, the "+
			"effect holds no lease now (it awaits an approval, say), or it is not this effect's token.")
}

// supersededLost is lease_lost for a token whose attempt a newer one
// superseded, saying which attempt it held and, when that attempt was
// reported, what was recorded: a client repeating a report whose answer it
// lost (a crash) learns that the report landed, and so whether its charge
// was released, without reading the effect (QA).
func supersededLost(att tokenAttempt) error {
	e := leaseLost().WithDetail("attempt", att.attempt)
	if att.reportedAt != nil && att.outcome != nil {
		e = e.WithDetail("reported_outcome", *att.outcome)
	}
	return e
}

// tokenAttempt is the attempt a presented lease token belongs to.
type tokenAttempt struct {
	attempt    int
	outcome    *string
	reportedAt *time.Time
}

// lockForToken locks the effect and finds the token's attempt: unknown
// effect → 404, a token of no attempt or of a superseded one → lease_lost
// (even if that lease also lapsed).
func lockForToken(ctx context.Context, tx pgx.Tx, workspaceID, id string, th []byte) (effectRow, tokenAttempt, error) {
	var (
		row effectRow
		att tokenAttempt
	)
	err := tx.QueryRow(ctx, sqlLockEffect, id, workspaceID).Scan(row.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return row, att, apierr.NotFound("effect")
	}
	if err != nil {
		return row, att, fmt.Errorf("lock effect: %w", err)
	}
	err = tx.QueryRow(ctx, sqlTokenAttempt, id, th).Scan(&att.attempt, &att.outcome, &att.reportedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return row, att, leaseLost()
	}
	if err == nil && att.attempt < row.Attempt {
		return row, att, supersededLost(att)
	}
	if err != nil {
		return row, att, fmt.Errorf("find attempt: %w", err)
	}
	return row, att, nil
}

// Report records what the holder of the current lease did. The common case
// is one round trip (one function call); anything else is classified under
// the effect's row lock, so a report racing the lease's expiry is either
// accepted or lease_expired, never both.
func (s *Service) Report(ctx context.Context, p *auth.Principal, id string, req ReportRequest) (Effect, error) {
	var pr apierr.Problems
	checkToken(&pr, req.LeaseToken)
	checkOutcome(&pr, req.Outcome)
	if err := pr.Err(); err != nil {
		return Effect{}, err
	}
	sealed, preview, err := s.sealedResult(id, req.Result)
	if err != nil {
		return Effect{}, err
	}
	now := s.clock()
	th := tokenHash(req.LeaseToken)
	args := []any{id, p.WorkspaceID, th, req.Outcome, sealed, preview, now, p.KeyID, ids.NewAt(ids.Event, now)}
	row, atts, err := scanReport(s.pool.QueryRow(ctx, sqlReport, args...))
	if err == nil {
		e, err := s.reported(&row, atts, now, req.Result)
		if err != nil {
			return Effect{}, err
		}
		return e, committedThen(s.afterStep(ctx, p.WorkspaceID, e.GroupID))
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Effect{}, fmt.Errorf("report: %w", err)
	}

	var (
		out   Effect
		after error // answered after the transaction commits
	)
	err = db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		row, att, err := lockForToken(ctx, tx, p.WorkspaceID, id, th)
		if err != nil {
			return err
		}
		switch holdingOf(&row, &att, now) {
		case holdReported:
			// A repeated report is safe to retry; a different outcome is not.
			if *att.outcome != req.Outcome {
				return apierr.InvalidState("This attempt was already reported %s.", *att.outcome)
			}
			out, err = s.getEffect(ctx, tx, p.WorkspaceID, id, now)
			return err
		case holdExpired:
			after = leaseExpired(row.effectiveState(now))
			return s.recordLapse(ctx, tx, &row, now)
		case holdLive:
			row, atts, err := scanReport(tx.QueryRow(ctx, sqlReport, args...))
			if err != nil {
				return fmt.Errorf("report: %w", err)
			}
			out, err = s.reported(&row, atts, now, req.Result)
			return err
		}
		return apierr.InvalidState("The effect is %s; this attempt cannot be reported.", row.effectiveState(now))
	})
	if err != nil {
		return Effect{}, err
	}
	if after == nil {
		after = committedThen(s.afterStep(ctx, p.WorkspaceID, out.GroupID))
	}
	return out, after
}

// committedThen is the error of a step a request takes after its change
// committed on its own (settling a reported or resolved effect's group, measuring a
// slow grant's lease again). The database failing that step, even before
// anything of it was sent (a connection found gone, the request's time
// run out, a deadlock's victim), is answered database_unavailable with
// outcome unknown, never not_applied: the change stands, and the retry
// under the same lease token or request_id answers it (crash QA: a report
// that had landed, and a grant that leased its key, were told nothing was
// changed). A client that went away is answered as such by the router.
func committedThen(err error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return err
	}
	if _, ok := apierr.As(err); ok {
		return err
	}
	if db.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded) || db.HasCode(err, db.CodeDeadlockDetected) {
		e := apierr.DatabaseLost(err)
		if errors.Is(err, context.DeadlineExceeded) || db.IsCanceled(err) {
			e = e.TimedOut()
		}
		return e
	}
	return err
}

// holding is what a current lease token still holds, under the row lock.
type holding int

const (
	holdNone     holding = iota
	holdReported         // its attempt was reported
	holdExpired          // its lease lapsed (resolved or not): lease_expired
	holdLive             // its lease is live
)

func holdingOf(row *effectRow, att *tokenAttempt, now time.Time) holding {
	switch {
	case att.reportedAt != nil:
		return holdReported
	case att.outcome != nil || row.effectiveState(now) == StateIndeterminate:
		return holdExpired
	case row.State == StateLeased:
		return holdLive
	}
	return holdNone
}

// recordLapse makes a locked effect's lapse durable, once: the callers answer
// lease_expired after committing it.
func (s *Service) recordLapse(ctx context.Context, tx pgx.Tx, row *effectRow, now time.Time) error {
	if row.State != StateLeased {
		return nil
	}
	_, err := s.lapse(ctx, tx, now, []string{row.ID}, 1)
	return err
}

func scanReport(row pgx.Row) (effectRow, []byte, error) {
	var (
		e    effectRow
		atts []byte
	)
	err := row.Scan(e.destWith(&atts)...)
	return e, atts, err
}

// reported builds the answer to an accepted report; the result is the one
// just recorded, so it need not be opened again.
func (s *Service) reported(row *effectRow, atts []byte, now time.Time, result json.RawMessage) (Effect, error) {
	e, err := s.view(row, atts, now, false)
	if err != nil {
		return Effect{}, err
	}
	e.Result = nullJSON(result)
	return e, nil
}

// Heartbeat extends a live lease by its length from now.
func (s *Service) Heartbeat(ctx context.Context, p *auth.Principal, id string, req HeartbeatRequest) (HeartbeatResponse, error) {
	var pr apierr.Problems
	checkToken(&pr, req.LeaseToken)
	if err := pr.Err(); err != nil {
		return HeartbeatResponse{}, err
	}
	now := s.clock()
	th := tokenHash(req.LeaseToken)
	out := HeartbeatResponse{EffectID: id}
	err := s.pool.QueryRow(ctx, sqlHeartbeat, id, p.WorkspaceID, th, now).Scan(&out.LeaseExpiresAt)
	if err == nil {
		return out, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return out, fmt.Errorf("heartbeat: %w", err)
	}
	var after error
	err = db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		row, att, err := lockForToken(ctx, tx, p.WorkspaceID, id, th)
		if err != nil {
			return err
		}
		switch holdingOf(&row, &att, now) {
		case holdReported:
			return apierr.InvalidState("This attempt was already reported; its lease is over.")
		case holdExpired:
			after = leaseExpired(row.effectiveState(now))
			return s.recordLapse(ctx, tx, &row, now)
		case holdLive:
			return tx.QueryRow(ctx, sqlHeartbeat, id, p.WorkspaceID, th, now).Scan(&out.LeaseExpiresAt)
		}
		return apierr.InvalidState("The effect is %s; there is no lease to extend.", row.effectiveState(now))
	})
	if err != nil {
		return HeartbeatResponse{}, err
	}
	return out, after
}

// Resolve records what an operator found at the vendor for an indeterminate
// effect, which unblocks its key: succeeded makes later begins duplicates,
// failed allows a new attempt.
func (s *Service) Resolve(ctx context.Context, p *auth.Principal, id string, req ResolveRequest) (Effect, error) {
	var pr apierr.Problems
	checkOutcome(&pr, req.Outcome)
	if utf8.RuneCountInString(req.Note) > maxNoteRunes {
		pr.Add("note", "must be at most %d characters", maxNoteRunes)
	}
	if req.Attempt != nil && *req.Attempt < 1 {
		// the decoder's words for 1.5 or 2^63 (its openapi tag min=1)
		pr.Add("attempt", "%s", apierr.IntegerRule(1, "2^63-1"))
	}
	if err := pr.Err(); err != nil {
		return Effect{}, err
	}
	named := 0 // the attempt the resolve names, 0 for none
	if req.Attempt != nil {
		named = *req.Attempt
	}
	sealed, preview, err := s.sealedResult(id, req.Result)
	if err != nil {
		return Effect{}, err
	}
	now := s.clock()
	var out Effect
	err = db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		var row effectRow
		err := tx.QueryRow(ctx, sqlLockEffect, id, p.WorkspaceID).Scan(row.dest()...)
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.NotFound("effect")
		}
		if err != nil {
			return fmt.Errorf("resolve: %w", err)
		}
		if st := row.effectiveState(now); st != StateIndeterminate {
			refused := apierr.InvalidState("Only an indeterminate effect can be resolved; this one is %s.", st).
				WithDetail("state", st)
			e, err := s.getEffect(ctx, tx, p.WorkspaceID, id, now)
			if err != nil {
				return err
			}
			attempt, resolvedAt := resolvedBy(e, p.KeyID, req.Outcome, named)
			switch {
			case attempt == 0:
				return refused
			case settledAs(&e, st, req.Outcome) && !begunSince(e, attempt, resolvedAt):
				// A repeat of this key's own resolve (its first answer lost)
				// answers the effect as it is, as a repeated report does (QA).
				out = e
				return nil
			default:
				// The key was begun again since (a resolve to failed frees
				// it), whether or not that attempt ended as this resolve
				// did: the repeat is refused, but says that it landed, as a
				// superseded report's lease_lost does (race QA: it said
				// only the state; model QA: a new attempt reported failed
				// since made it answer 200 with an effect it had not
				// settled).
				return refused.WithDetail("attempt", attempt).WithDetail("resolved_outcome", req.Outcome)
			}
		}
		if named != 0 {
			if err := s.namesUnknownAttempt(ctx, tx, p, &row, req.Outcome, named, now); err != nil {
				return err
			}
		}
		if err := s.recordLapse(ctx, tx, &row, now); err != nil {
			return err
		}
		var note *string
		if req.Note != "" {
			note = &req.Note
		}
		if _, err := tx.Exec(ctx, sqlResolve, id, req.Outcome, sealed, preview, now, p.KeyID, note,
			rolledBackNote); err != nil {
			return fmt.Errorf("resolve: %w", err)
		}
		if req.Outcome == StateSucceeded && row.ApprovalState != nil && *row.ApprovalState == ApprovalPending {
			if err := s.closeMootApprovals(ctx, tx, p, []string{id}, now); err != nil {
				return err
			}
		}
		out, err = s.getEffect(ctx, tx, p.WorkspaceID, id, now)
		return err
	})
	if err != nil {
		return Effect{}, err
	}
	return out, committedThen(s.afterStep(ctx, p.WorkspaceID, out.GroupID))
}

// settledAs says whether effect e, in state st, is settled as a resolve to
// outcome leaves it: that state, or denied approval_rejected for failed,
// as a resolve to failed makes one whose retry's approval was rejected
// (settledState), so that its repeat answers as any repeat does.
func settledAs(e *Effect, st, outcome string) bool {
	return st == outcome || (outcome == StateFailed && st == StateDenied && e.DenialCode != nil &&
		*e.DenialCode == apierr.CodeApprovalRejected)
}

// namesUnknownAttempt refuses a resolve of an indeterminate effect that
// names an attempt (named) other than the one it would settle: the latest
// unknown one, as blocked and probe answers' prior_attempt name it. The
// refusal names that attempt (unresolved_attempt) and the state and, when
// this key had already resolved the named attempt so (its answer lost, the
// key begun again since), the attempt and resolved_outcome, as a repeated
// resolve of a settled effect does (README).
func (s *Service) namesUnknownAttempt(ctx context.Context, tx pgx.Tx, p *auth.Principal, row *effectRow,
	outcome string, named int, now time.Time) error {
	unknown, err := s.prior(ctx, tx, row)
	if err != nil {
		return err
	}
	if named == unknown.Attempt {
		return nil
	}
	refused := apierr.InvalidState("This resolve names attempt %d, but the attempt whose outcome is unknown now "+
		"is attempt %d (the effect is %s), so it changed nothing: verify that attempt at the vendor before "+
		"resolving it.", named, unknown.Attempt, StateIndeterminate).
		WithDetail("state", StateIndeterminate).WithDetail("unresolved_attempt", unknown.Attempt)
	e, err := s.getEffect(ctx, tx, p.WorkspaceID, row.ID, now)
	if err != nil {
		return err
	}
	if attempt, _ := resolvedBy(e, p.KeyID, outcome, named); attempt != 0 {
		return refused.WithDetail("attempt", attempt).WithDetail("resolved_outcome", outcome)
	}
	return refused
}

// resolvedBy answers the latest of e's attempts (only attempt only, when
// not 0) that key settled with outcome, 0 for none, and when it settled
// it: by a resolve, or by a reconciliation or a probe it ran, which answer
// the resolve it is repeating as well (the first settlement and its note
// stand).
func resolvedBy(e Effect, key, outcome string, only int) (latest int, at time.Time) {
	for _, a := range e.Attempts {
		if a.ResolvedByKeyID != nil && *a.ResolvedByKeyID == key && a.Outcome != nil && *a.Outcome == outcome &&
			a.Attempt > latest && a.ResolvedAt != nil && (only == 0 || a.Attempt == only) {
			latest, at = a.Attempt, *a.ResolvedAt
		}
	}
	return latest, at
}

// begunSince reports whether e's key was begun again after its attempt
// attempt was settled at resolvedAt: a later attempt not reported by then.
// The later attempts a resolve finds are all reported (a retry reported
// failed while an earlier outcome was unknown: a later unknown one would
// be the one settled); one begun after the resolve is reported after it,
// or not yet. (Under a clock that did not move between the resolve and
// that attempt's report, as a test's may, it reads as before: answered as
// a repeat, as it was before this check.)
func begunSince(e Effect, attempt int, resolvedAt time.Time) bool {
	for _, a := range e.Attempts {
		if a.Attempt > attempt && (a.ReportedAt == nil || a.ReportedAt.After(resolvedAt)) {
			return true
		}
	}
	return false
}

// lapse makes lapsed leases durable (those of effectIDs when set, in one
// statement, else up to limit of them, oldest first) and records
// effect.indeterminate for each.
func (s *Service) lapse(ctx context.Context, q db.Querier, now time.Time, effectIDs []string, limit int) (int, error) {
	if effectIDs != nil {
		limit = len(effectIDs)
	}
	sql, args := sqlLapseDue, []any{now, limit, eventIDsAt(now, limit)}
	if effectIDs != nil {
		sql, args = sqlLapseThese, append(args, effectIDs)
	}
	var n int
	if err := q.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("lapse leases: %w", err)
	}
	return n, nil
}

// SweepLapsed is the sweeper's backstop: it makes up to limit lapsed leases
// durably indeterminate and records their events. Concurrent passes skip
// each other's rows.
func (s *Service) SweepLapsed(ctx context.Context, now time.Time, limit int) (int, error) {
	return s.lapse(ctx, s.pool, now.UTC().Truncate(time.Microsecond), nil, limit)
}

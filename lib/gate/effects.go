package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/seal"
)

// resolveNoteReconciliation is the resolve_note of the attempts a
// reconciliation settled (sqlReconcileResolve); gate_report writes "probe"
// on those a failed probe settled (migration 0026).
const resolveNoteReconciliation = "reconciliation"

// Attempt is one execute grant and what became of it.
type Attempt struct {
	Attempt         int        `json:"attempt"`
	Outcome         *string    `json:"outcome" openapi:"enum=succeeded|failed|indeterminate"`
	Probe           bool       `json:"probe"`
	StartedAt       time.Time  `json:"started_at"`
	LeaseExpiresAt  time.Time  `json:"lease_expires_at"`
	ReportedAt      *time.Time `json:"reported_at"`
	BeganByKeyID    string     `json:"began_by_key_id"`
	ReportedByKeyID *string    `json:"reported_by_key_id"`
	ResolvedByKeyID *string    `json:"resolved_by_key_id"`
	ResolvedAt      *time.Time `json:"resolved_at"`
	// ResolveNote is the operator's note on a resolve ("reconciliation"
	// when a reconciliation settled the attempt, "probe" when a probe
	// reported failed settled it); null otherwise.
	ResolveNote *string `json:"resolve_note"`
}

// Effect is the effect object (API.md §5). Result is the recorded result on
// single reads; listings carry only the redacted result_preview.
type Effect struct {
	ID                  string          `json:"id"`
	EffectType          string          `json:"effect_type"`
	IdempotencyKey      string          `json:"idempotency_key"`
	State               string          `json:"state" openapi:"enum=leased|succeeded|failed|indeterminate|awaiting_approval|denied"`
	Attempt             int             `json:"attempt"`
	Attempts            []Attempt       `json:"attempts" openapi:"notNull"` // [] before the first (view)
	Result              json.RawMessage `json:"result"`
	ResultPreview       json.RawMessage `json:"result_preview"`
	PayloadPreview      json.RawMessage `json:"payload_preview"`
	CostMicros          *int64          `json:"cost_micros"`
	RunID               *string         `json:"run_id"`
	GroupID             *string         `json:"group_id"`
	CompensatesEffectID *string         `json:"compensates_effect_id"`
	DenialCode          *string         `json:"denial_code" openapi:"enum=policy_denied|budget_exceeded|cost_ceiling_exceeded|run_budget_exceeded|key_budget_exceeded|dimension_limit_exceeded|max_attempts_exceeded|approval_rejected|circuit_open"`
	ApprovalID          *string         `json:"approval_id"`
	LeaseExpiresAt      *time.Time      `json:"lease_expires_at"`
	CreatedAt           time.Time       `json:"created_at"`
	UpdatedAt           time.Time       `json:"updated_at"`
	// ResultUnreadable says the effect has a recorded result this instance
	// cannot open (sealed with a key missing from its RESULT_ENCRYPTION_KEY
	// / RESULT_ENCRYPTION_KEYS, or damaged: it fails authentication under a
	// key it has): result reads null, and the rest of the effect reads as
	// ever (seal QA: the one value failed the effect's read, and the answer
	// to a report or resolve sent again, with 500). Lists answer it as the
	// effect's read does (resultOpens).
	ResultUnreadable bool `json:"result_unreadable" jsonschema:"true when the effect has a recorded result this server cannot decrypt (sealed with an encryption key it is not configured with, or damaged so that it fails authentication): result is then null, on single reads and in lists alike; false otherwise"`
}

// view builds the effect object as seen at now; withResult opens the sealed
// result (single reads only). A result this instance cannot open reads
// null with ResultUnreadable (logged, by effect and key id). Without
// withResult the flag is left to the caller: a list authenticates each
// result itself (resultOpens), and a report's answer carries the result
// it has just sealed.
func (s *Service) view(row *effectRow, attempts []byte, now time.Time, withResult bool) (Effect, error) {
	e := Effect{
		ID: row.ID, EffectType: row.EffectType, IdempotencyKey: row.IdempotencyKey,
		State: row.effectiveState(now), Attempt: row.Attempt, ResultPreview: row.ResultPreview,
		PayloadPreview: row.PayloadPreview, CostMicros: row.CostMicros, RunID: row.RunID, GroupID: row.GroupID,
		CompensatesEffectID: row.CompensatesEffectID, DenialCode: row.DenialCode, ApprovalID: row.ApprovalID,
		CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt, Attempts: []Attempt{},
	}
	if row.State == StateLeased {
		e.LeaseExpiresAt = row.LeaseExpiresAt
	}
	if len(attempts) > 0 {
		if err := json.Unmarshal(attempts, &e.Attempts); err != nil {
			return Effect{}, fmt.Errorf("effect attempts: %w", err)
		}
	}
	for i := range e.Attempts {
		a := &e.Attempts[i]
		if a.Outcome == nil && !a.LeaseExpiresAt.After(now) {
			ind := StateIndeterminate
			a.Outcome = &ind
		}
	}
	if withResult {
		res, err := s.openJSON(row.ID, "result", row.Result)
		if err != nil {
			e.ResultUnreadable = true
			s.logger.Warn("effect result this instance cannot open reads as result_unreadable",
				"effect_id", row.ID, "key_id", seal.KeyIDOf(row.Result), "err", err)
			return e, nil
		}
		e.Result = res
	}
	return e, nil
}

// resultOpens reports whether the effect's sealed result opens, as a single
// read would open it, without keeping it: a list answers result_unreadable
// as the effect's own read does, a result damaged under a configured key
// included (seal QA: lists checked only the key the header names, so such
// a result read false in the list and true on the effect's read). The
// result is authenticated into scratch, the buffer of the list's previous
// row (one allocation a page, the largest result's), and never answered.
// It costs one AES-GCM pass over bytes the list has already read from the
// database (about 4 GB/s a core: a page of 200 results of the 256 KiB
// maximum takes some 12 ms, of small ones some 0.1 ms).
func (s *Service) resultOpens(row *effectRow, scratch *[]byte) bool {
	pt, err := s.sealer.OpenTo((*scratch)[:0], row.Result, seal.AAD(row.ID, "result"))
	if err != nil {
		return false
	}
	*scratch = pt
	return true
}

// GetEffect reads one effect with its attempts.
func (s *Service) GetEffect(ctx context.Context, workspaceID, id string) (Effect, error) {
	return s.getEffect(ctx, s.pool, workspaceID, id, s.clock())
}

func (s *Service) getEffect(ctx context.Context, q db.Querier, workspaceID, id string, now time.Time) (Effect, error) {
	var (
		row      effectRow
		attempts []byte
	)
	err := q.QueryRow(ctx, sqlGetEffect, id, workspaceID).Scan(row.destWith(&attempts)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Effect{}, apierr.NotFound("effect")
	}
	if err != nil {
		return Effect{}, fmt.Errorf("get effect: %w", err)
	}
	return s.view(&row, attempts, now, true)
}

// ListFilter narrows ListEffects.
type ListFilter struct {
	State, EffectType, Cursor string
	Limit                     int
}

// listEffectsQuery is the statement that reads a page of ListEffects at
// now, and its arguments.
func listEffectsQuery(workspaceID string, f ListFilter, now time.Time) (string, []any) {
	if f.State == "" && f.EffectType == "" {
		return db.NewestFirst(sqlListEffects, "workspace_id", []any{workspaceID}, f.Cursor, "", "", f.Limit)
	}
	states := storedStates(f.State)
	args := []any{workspaceID, f.Limit, f.State, now}
	for _, st := range states {
		args = append(args, st)
	}
	if f.Cursor != "" {
		args = append(args, f.Cursor)
	}
	if f.EffectType != "" {
		args = append(args, f.EffectType)
	}
	return sqlListEffectsIn[effectsInKey{len(states), f.EffectType != "", f.Cursor != ""}], args
}

// storedStates are the states stored of the effects that read as state
// ("" any): a lease that lapsed reads indeterminate before the sweeper
// stores it so (effectiveState).
func storedStates(state string) []string {
	switch state {
	case "":
		return States
	case StateIndeterminate:
		return []string{StateIndeterminate, StateLeased}
	}
	return []string{state}
}

// ListStateRule and ListEffectTypeRule are what an effect list's ?state=
// and ?effect_type= must be.
var (
	ListStateRule      = "must be one of " + strings.Join(States, ", ")
	ListEffectTypeRule = "must be an effect type"
)

// ListEffects pages newest first; results appear only as redacted previews.
func (s *Service) ListEffects(ctx context.Context, workspaceID string, f ListFilter) ([]Effect, error) {
	var pr apierr.Problems
	if f.State != "" && !slices.Contains(States, f.State) {
		pr.Add("state", "%s", ListStateRule)
	}
	if f.EffectType != "" && !ValidEffectType(f.EffectType) {
		pr.Add("effect_type", "%s", ListEffectTypeRule)
	}
	if err := pr.Err(); err != nil {
		return nil, err
	}
	now := s.clock()
	sql, args := listEffectsQuery(workspaceID, f, now)
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list effects: %w", err)
	}
	defer rows.Close()
	var (
		out                 []Effect
		unreadable          int
		firstID, firstKeyID string // the first unreadable result's, for the log
		scratch             []byte // resultOpens' buffer
	)
	defer func() { clear(scratch[:cap(scratch)]) }() // no plaintext left behind
	for rows.Next() {
		var (
			row      effectRow
			attempts []byte
		)
		if err := rows.Scan(row.destWith(&attempts)...); err != nil {
			return nil, fmt.Errorf("list effects: %w", err)
		}
		e, err := s.view(&row, attempts, now, false)
		if err != nil {
			return nil, err
		}
		if e.ResultUnreadable = !s.resultOpens(&row, &scratch); e.ResultUnreadable {
			if unreadable == 0 {
				firstID, firstKeyID = row.ID, seal.KeyIDOf(row.Result)
			}
			unreadable++
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list effects: %w", err)
	}
	if unreadable > 0 {
		// One line a page, as the attempts' reads log theirs: the first
		// effect and its key id tell the operator which key to configure.
		s.logger.Warn("effect results this instance cannot open read as result_unreadable",
			"count", unreadable, "effect_id", firstID, "key_id", firstKeyID)
	}
	return out, nil
}

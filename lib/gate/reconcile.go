package gate

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/ids"
)

// Reconciliation (API.md §2.7): the caller posts the vendor's own records
// for one effect type and a time window; Ratchet compares them with its
// effects, settles the indeterminate ones the records prove, and restarts
// the type's reconcile_every_hours calendar.

// Vendor record statuses.
const (
	VendorSucceeded = "succeeded" // the vendor performed it
	VendorRefunded  = "refunded"  // the vendor performed it and later reversed it: it happened
	VendorFailed    = "failed"    // the vendor refused or failed it: it did not happen
	VendorPending   = "pending"   // the vendor has not decided: proves nothing yet
)

// VendorStatuses lists the accepted record statuses.
var VendorStatuses = []string{VendorSucceeded, VendorRefunded, VendorFailed, VendorPending}

// Limits of one reconciliation.
const (
	MaxReconcileRecords = 10_000
	// MaxReconcileEffects bounds the Ratchet side: a window holding more
	// effects of the type is refused (narrow it).
	MaxReconcileEffects = 50_000
)

// ReconcileRecord is one of the vendor's records.
type ReconcileRecord struct {
	IdempotencyKey string `json:"idempotency_key"`
	Status         string `json:"status"`
	// The amount the vendor recorded, in micros; null when it has none.
	AmountMicros *int64 `json:"amount_micros"`
}

// ReconcileRequest is the body of POST /api/v1/reconcile.
type ReconcileRequest struct {
	EffectType string            `json:"effect_type"`
	From       string            `json:"from"`
	To         string            `json:"to"`
	Records    []ReconcileRecord `json:"records"`
}

// ReconcileItem is one classified record or effect. Fields that do not
// apply are null.
type ReconcileItem struct {
	IdempotencyKey      string  `json:"idempotency_key"`
	EffectID            *string `json:"effect_id"`
	RatchetState        *string `json:"ratchet_state"`
	VendorStatus        *string `json:"vendor_status"`
	RatchetAmountMicros *int64  `json:"ratchet_amount_micros"`
	VendorAmountMicros  *int64  `json:"vendor_amount_micros"`
	// For resolved items: the outcome recorded from the vendor's record.
	Outcome *string `json:"outcome,omitempty"`
}

// ReconcileCounts has the length of each list.
type ReconcileCounts struct {
	Matched          int `json:"matched"`
	MissingAtVendor  int `json:"missing_at_vendor"`
	UnknownToRatchet int `json:"unknown_to_ratchet"`
	AmountMismatch   int `json:"amount_mismatch"`
	Resolved         int `json:"resolved"`
	StatusMismatch   int `json:"status_mismatch"`
	Unsettled        int `json:"unsettled"`
}

// Reconciliation is the answer of POST /api/v1/reconcile. Every vendor
// record lands in exactly one list except missing_at_vendor, which lists
// Ratchet's effects; see README.md "Effect groups and reconciliation".
type Reconciliation struct {
	EffectType       string          `json:"effect_type"`
	From             time.Time       `json:"from"`
	To               time.Time       `json:"to"`
	ReconciledAt     time.Time       `json:"reconciled_at"`
	Counts           ReconcileCounts `json:"counts"`
	Matched          []ReconcileItem `json:"matched"`
	MissingAtVendor  []ReconcileItem `json:"missing_at_vendor"`
	UnknownToRatchet []ReconcileItem `json:"unknown_to_ratchet"`
	AmountMismatch   []ReconcileItem `json:"amount_mismatch"`
	Resolved         []ReconcileItem `json:"resolved"`
	StatusMismatch   []ReconcileItem `json:"status_mismatch"`
	Unsettled        []ReconcileItem `json:"unsettled"`
}

func parseInstant(pr *apierr.Problems, field, v string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		pr.Add(field, "must be an RFC 3339 timestamp")
	}
	return t.UTC().Truncate(time.Microsecond)
}

func validateReconcile(req ReconcileRequest) (from, to time.Time, err error) {
	var pr apierr.Problems
	if !ValidEffectType(req.EffectType) {
		pr.Add("effect_type", effectTypeRule)
	}
	from = parseInstant(&pr, "from", req.From)
	to = parseInstant(&pr, "to", req.To)
	if len(pr) == 0 && !from.Before(to) {
		pr.Add("to", "must be after from")
	}
	switch {
	case req.Records == nil:
		pr.Add("records", "must be an array (empty when the vendor has no records in the window)")
	case len(req.Records) > MaxReconcileRecords:
		pr.Add("records", "may hold at most %d records; split the window", MaxReconcileRecords)
	}
	seen := make(map[string]bool, len(req.Records))
	for i, r := range req.Records {
		if len(pr) >= 20 {
			break // enough to fix the request by
		}
		field := "records." + strconv.Itoa(i)
		if !validIdempotencyKey(r.IdempotencyKey) {
			pr.Add(field+".idempotency_key", "must be 1-255 printable characters")
		} else if seen[r.IdempotencyKey] {
			pr.Add(field+".idempotency_key", "appears twice; send one record per idempotency key")
		}
		seen[r.IdempotencyKey] = true
		if !slices.Contains(VendorStatuses, r.Status) {
			pr.Add(field+".status", "must be one of succeeded, refunded, failed, pending")
		}
		if r.AmountMicros != nil && *r.AmountMicros < 0 {
			pr.Add(field+".amount_micros", "must be a non-negative integer (micros of USD) or null")
		}
	}
	return from, to, pr.Err()
}

// reconEffect is one of Ratchet's effects as a reconciliation sees it.
type reconEffect struct {
	id, key, state string
	leaseExpiresAt *time.Time
	cost           *int64
	inWindow       bool
	matched        bool
}

// Reconcile compares the vendor's records with Ratchet's effects of one type
// (see Reconciliation) in one short transaction: it reads the effects,
// resolves the indeterminate ones a vendor record settles (succeeded or
// refunded → succeeded, failed → failed; no record or pending → left alone,
// absence is not proof) and records the reconciliation time.
func (s *Service) Reconcile(ctx context.Context, p *auth.Principal, req ReconcileRequest) (Reconciliation, error) {
	from, to, err := validateReconcile(req)
	if err != nil {
		return Reconciliation{}, err
	}
	now := s.clock()
	keys := make([]string, len(req.Records))
	for i, r := range req.Records {
		keys[i] = r.IdempotencyKey
	}
	out := Reconciliation{EffectType: req.EffectType, From: from, To: to, ReconciledAt: now,
		Matched: []ReconcileItem{}, MissingAtVendor: []ReconcileItem{}, UnknownToRatchet: []ReconcileItem{},
		AmountMismatch: []ReconcileItem{}, Resolved: []ReconcileItem{}, StatusMismatch: []ReconcileItem{},
		Unsettled: []ReconcileItem{}}
	var groups []string
	err = db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		effects, err := reconEffects(ctx, tx, p.WorkspaceID, req.EffectType, from, to, keys)
		if err != nil {
			return err
		}
		byKey := make(map[string]*reconEffect, len(effects))
		for i := range effects {
			byKey[effects[i].key] = &effects[i]
		}
		var resolveIDs, outcomes, lapsedIDs []string
		var resolving []ReconcileItem
		for _, r := range req.Records {
			e := byKey[r.IdempotencyKey]
			status := r.Status
			item := ReconcileItem{IdempotencyKey: r.IdempotencyKey, VendorStatus: &status,
				VendorAmountMicros: r.AmountMicros}
			if e == nil {
				out.UnknownToRatchet = append(out.UnknownToRatchet, item)
				continue
			}
			e.matched = true
			state := e.state
			if state == StateLeased && lapsed(e.leaseExpiresAt, now) {
				state = StateIndeterminate
			}
			item.EffectID, item.RatchetState, item.RatchetAmountMicros = &e.id, &state, e.cost
			happened := status == VendorSucceeded || status == VendorRefunded
			switch {
			case status == VendorPending || state == StateLeased:
				out.Unsettled = append(out.Unsettled, item)
			case state == StateIndeterminate:
				outcome := StateFailed
				if happened {
					outcome = StateSucceeded
				}
				item.Outcome = &outcome
				resolveIDs, outcomes = append(resolveIDs, e.id), append(outcomes, outcome)
				if e.state == StateLeased {
					lapsedIDs = append(lapsedIDs, e.id)
				}
				resolving = append(resolving, item)
			case happened != (state == StateSucceeded):
				out.StatusMismatch = append(out.StatusMismatch, item)
			case happened && e.cost != nil && r.AmountMicros != nil && *e.cost != *r.AmountMicros:
				out.AmountMismatch = append(out.AmountMismatch, item)
			default:
				out.Matched = append(out.Matched, item)
			}
		}
		for i := range effects {
			e := &effects[i]
			if e.matched || !e.inWindow {
				continue
			}
			state := e.state
			if state == StateLeased && lapsed(e.leaseExpiresAt, now) {
				state = StateIndeterminate
			}
			item := ReconcileItem{IdempotencyKey: e.key, EffectID: &e.id, RatchetState: &state,
				RatchetAmountMicros: e.cost}
			switch state {
			case StateSucceeded:
				out.MissingAtVendor = append(out.MissingAtVendor, item)
			case StateLeased, StateIndeterminate:
				out.Unsettled = append(out.Unsettled, item)
			}
		}
		for _, id := range lapsedIDs {
			if _, err := s.lapse(ctx, tx, now, id, 1); err != nil {
				return err
			}
		}
		if len(resolveIDs) > 0 {
			rows, err := tx.Query(ctx, sqlReconcileResolve, p.WorkspaceID, resolveIDs, outcomes, now, p.KeyID)
			if err != nil {
				return fmt.Errorf("reconcile: resolve: %w", err)
			}
			done := map[string]bool{}
			for rows.Next() {
				var (
					id    string
					group *string
				)
				if err := rows.Scan(&id, &group); err != nil {
					rows.Close()
					return fmt.Errorf("reconcile: resolve: %w", err)
				}
				done[id] = true
				if group != nil && !slices.Contains(groups, *group) {
					groups = append(groups, *group)
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("reconcile: resolve: %w", err)
			}
			for _, it := range resolving {
				if done[*it.EffectID] {
					out.Resolved = append(out.Resolved, it)
				} else {
					out.Unsettled = append(out.Unsettled, it) // settled by someone else meanwhile
				}
			}
		}
		if _, err := tx.Exec(ctx, sqlReconciled, p.WorkspaceID, req.EffectType, now, from, to); err != nil {
			return fmt.Errorf("reconcile: record: %w", err)
		}
		return nil
	})
	if err != nil {
		return Reconciliation{}, err
	}
	for _, g := range groups {
		if _, err := s.settleGroup(ctx, p.WorkspaceID, g, false); err != nil {
			return Reconciliation{}, err
		}
	}
	out.Counts = ReconcileCounts{Matched: len(out.Matched), MissingAtVendor: len(out.MissingAtVendor),
		UnknownToRatchet: len(out.UnknownToRatchet), AmountMismatch: len(out.AmountMismatch),
		Resolved: len(out.Resolved), StatusMismatch: len(out.StatusMismatch), Unsettled: len(out.Unsettled)}
	return out, nil
}

func reconEffects(ctx context.Context, tx pgx.Tx, ws, effectType string, from, to time.Time, keys []string) ([]reconEffect, error) {
	rows, err := tx.Query(ctx, sqlReconcileEffects, ws, effectType, from, to, keys, MaxReconcileEffects+1)
	if err != nil {
		return nil, fmt.Errorf("reconcile: read effects: %w", err)
	}
	defer rows.Close()
	var out []reconEffect
	for rows.Next() {
		var e reconEffect
		if err := rows.Scan(&e.id, &e.key, &e.state, &e.leaseExpiresAt, &e.cost, &e.inWindow); err != nil {
			return nil, fmt.Errorf("reconcile: read effects: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reconcile: read effects: %w", err)
	}
	if len(out) > MaxReconcileEffects {
		return nil, apierr.InvalidField("to", "the window holds more than %d effects of this type; narrow it",
			MaxReconcileEffects)
	}
	return out, nil
}

// SweepReconcileDue records reconciliation.due for up to limit overdue
// (workspace, effect type) pairs, once per due period.
func (s *Service) SweepReconcileDue(ctx context.Context, now time.Time, limit int) (int, error) {
	now = now.UTC().Truncate(time.Microsecond)
	eventIDs := make([]string, limit)
	for i := range eventIDs {
		eventIDs[i] = ids.NewAt(ids.Event, now)
	}
	slices.Sort(eventIDs)
	var n int
	if err := s.pool.QueryRow(ctx, sqlReconcileDue, now, limit, eventIDs).Scan(&n); err != nil {
		return 0, fmt.Errorf("reconciliation reminders: %w", err)
	}
	return n, nil
}

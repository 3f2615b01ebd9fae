package gate

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/getratchet/ratchet/lib/answer"
	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/auth"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/idemkey"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/money"
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
	IdempotencyKey string `json:"idempotency_key" openapi:"minLength=1,maxLength=255,printable"`
	Status         string `json:"status" openapi:"enum=succeeded|refunded|failed|pending"`
	// The amount the vendor recorded, in micros; null when it has none.
	AmountMicros *int64 `json:"amount_micros" openapi:"min=0,max=1000000000000000000"`
}

// ReconcileRequest is the body of POST /api/v1/reconcile. Its records may
// be empty (the vendor has none in the window), never more than
// MaxReconcileRecords.
type ReconcileRequest struct {
	EffectType string            `json:"effect_type" openapi:"required,pattern=^[A-Za-z0-9][A-Za-z0-9._:-]*$,maxLength=100"`
	From       string            `json:"from" openapi:"required,format=date-time"`
	To         string            `json:"to" openapi:"required,format=date-time"`
	Records    []ReconcileRecord `json:"records" openapi:"required,maxItems=10000"`
}

// ReconcileItem is one classified record or effect. Fields that do not
// apply are null.
type ReconcileItem struct {
	IdempotencyKey      string  `json:"idempotency_key"`
	EffectID            *string `json:"effect_id"`
	RatchetState        *string `json:"ratchet_state" openapi:"enum=leased|succeeded|failed|indeterminate|awaiting_approval|denied"`
	VendorStatus        *string `json:"vendor_status" openapi:"enum=succeeded|refunded|failed|pending"`
	RatchetAmountMicros *int64  `json:"ratchet_amount_micros"`
	VendorAmountMicros  *int64  `json:"vendor_amount_micros"`
	// For resolved items: the outcome recorded from the vendor's record.
	Outcome *string `json:"outcome,omitempty" openapi:"enum=succeeded|failed"`
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
// record lands in one list, but one this reconciliation resolved succeeded
// whose amounts differ, which is in amount_mismatch as well (reconcileResolve);
// missing_at_vendor and unsettled also list effects no record names. See
// README.md "Effect groups and reconciliation".
type Reconciliation struct {
	EffectType       string          `json:"effect_type"`
	From             time.Time       `json:"from"`
	To               time.Time       `json:"to"`
	ReconciledAt     time.Time       `json:"reconciled_at"`
	Counts           ReconcileCounts `json:"counts"`
	Matched          []ReconcileItem `json:"matched" openapi:"notNull"`
	MissingAtVendor  []ReconcileItem `json:"missing_at_vendor" openapi:"notNull"`
	UnknownToRatchet []ReconcileItem `json:"unknown_to_ratchet" openapi:"notNull"`
	AmountMismatch   []ReconcileItem `json:"amount_mismatch" openapi:"notNull"`
	Resolved         []ReconcileItem `json:"resolved" openapi:"notNull"`
	StatusMismatch   []ReconcileItem `json:"status_mismatch" openapi:"notNull"`
	Unsettled        []ReconcileItem `json:"unsettled" openapi:"notNull"`
}

// parseInstant reads an RFC 3339 timestamp. RFC 3339 (§5.6) lets "T" and
// "Z" be lower case, which Go's layout does not; no other letter is valid,
// so upper-casing the whole value changes nothing else. Go takes an offset
// of 24 hours or more, which RFC 3339's time-hour (00-23) does not. The
// instant, in UTC, must be one the answer can write back (its four-digit
// years): 0000-01-01 at +01:00 was refused at to as an answer "that would
// hold 9223372036854775807 bytes", once every effect of the window was
// read (QA).
func parseInstant(pr *apierr.Problems, field, v string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(v))
	if _, offset := t.Zone(); err != nil || offset <= -24*60*60 || offset >= 24*60*60 {
		pr.Add(field, "must be an RFC 3339 timestamp")
		return time.Time{}
	}
	t = t.UTC().Truncate(time.Microsecond)
	if t.Year() < 0 || t.Year() > 9999 {
		pr.Add(field, "must be an RFC 3339 timestamp from 0000-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z")
	}
	return t
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
		if len(pr) >= apierr.MaxProblems {
			break // all a refusal lists (apierr.Invalid)
		}
		field := "records." + strconv.Itoa(i)
		if !idemkey.Valid(r.IdempotencyKey) {
			pr.Add(field+".idempotency_key", "%s", idemkey.Problem(r.IdempotencyKey))
		} else if seen[r.IdempotencyKey] {
			pr.Add(field+".idempotency_key", "appears twice; send one record per idempotency key")
		}
		seen[r.IdempotencyKey] = true
		if !slices.Contains(VendorStatuses, r.Status) {
			pr.Add(field+".status", "must be one of succeeded, refunded, failed, pending")
		}
		if r.AmountMicros != nil && !money.Valid(*r.AmountMicros) {
			pr.Add(field+".amount_micros", money.Rule+" or null")
		}
	}
	return from, to, pr.Err()
}

// reconEffect is one of Ratchet's effects as a reconciliation sees it.
type reconEffect struct {
	id, key, state string
	leaseExpiresAt *time.Time
	cost           *int64
	attempt        int // the effect's attempt as read, the one its record settles
	inWindow       bool
	matched        bool
}

// Reconcile compares the vendor's records with Ratchet's effects of one type
// that happened in the window (sqlReconcileEffects says when an effect
// happened) and those the records name (see Reconciliation), in one short
// transaction: it reads the effects,
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
				resolving = append(resolving, item)
			default:
				out.classifySettled(item)
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
		read := make(map[string]int, len(effects))
		for _, e := range effects {
			read[e.id] = e.attempt
		}
		resolved, err := s.reconcileResolve(ctx, tx, p, now, resolving, read, &out)
		if err != nil {
			return err
		}
		groups = resolved
		out.count()
		// An answer that would pass what one answer holds is refused
		// before anything is recorded, and what was resolved rolls back
		// with the rest: its lists cannot be cut (resolved is what the
		// caller must learn), nor could the platform deliver it, or keep
		// it under an Idempotency-Key (QA: 4 000 effects whose keys were
		// 255 four-byte characters answered 4.7 MB, which Vercel refused
		// after the resolves had committed).
		if size, budget := out.size(), answer.Of(ctx); size > budget {
			return apierr.InvalidField("to", "must close a window whose answer fits in %d bytes of JSON "+
				"(this one's would hold %d: %d items); narrow the window or send fewer records",
				budget, size, out.items())
		}
		if _, err := tx.Exec(ctx, sqlReconciled, p.WorkspaceID, req.EffectType, now, from, to); err != nil {
			return fmt.Errorf("reconcile: record: %w", err)
		}
		return nil
	})
	if err != nil {
		return Reconciliation{}, err
	}
	if len(groups) > 0 {
		// Under an Idempotency-Key the work is the request's transaction,
		// whose row locks last until it commits: the rollbacks are ended
		// after that commit, or the group would be locked after its steps'
		// rows, the reverse of a begin of a step (shareEffectGroup), and the
		// two deadlocked (review). A failure, with or without the header,
		// is left to the sweeper (SweepGroups): the reconciliation has
		// committed, and its answer (what it resolved) is what the caller
		// needs, not a 5xx for a step the sweeper takes again.
		// Each failure is logged.
		if db.InRequest(ctx) {
			db.AfterCommit(ctx, func() { s.endRollbacks(db.AfterRequest(ctx), p.WorkspaceID, groups) })
		} else {
			s.endRollbacks(db.Unchecked(ctx), p.WorkspaceID, groups) // follows the committed resolutions
		}
	}
	return out, nil
}

// count sets out.Counts from its lists.
func (out *Reconciliation) count() {
	out.Counts = ReconcileCounts{Matched: len(out.Matched), MissingAtVendor: len(out.MissingAtVendor),
		UnknownToRatchet: len(out.UnknownToRatchet), AmountMismatch: len(out.AmountMismatch),
		Resolved: len(out.Resolved), StatusMismatch: len(out.StatusMismatch), Unsettled: len(out.Unsettled)}
}

// lists are out's lists, in no particular order.
func (out *Reconciliation) lists() [][]ReconcileItem {
	return [][]ReconcileItem{out.Matched, out.MissingAtVendor, out.UnknownToRatchet, out.AmountMismatch,
		out.Resolved, out.StatusMismatch, out.Unsettled}
}

// items is how many items out's lists hold together.
func (out *Reconciliation) items() int {
	n := 0
	for _, l := range out.lists() {
		n += len(l)
	}
	return n
}

// size is the length of out (its Counts set) as the API writes it
// (jsonx.Marshal), reckoned from its items' fields without encoding them:
// a window may hold 60 000 items, and the answer is encoded once, when it
// is sent.
func (out *Reconciliation) size() int {
	shell := *out
	shell.Matched, shell.MissingAtVendor, shell.UnknownToRatchet, shell.AmountMismatch = nil, nil, nil, nil
	shell.Resolved, shell.StatusMismatch, shell.Unsettled = nil, nil, nil
	b, err := jsonx.Marshal(shell)
	if err != nil {
		return math.MaxInt // never: the shell is fixed fields
	}
	n := len(b) - 7*len("null") // each list's null is replaced by its items
	for _, l := range out.lists() {
		n += len("[]")
		for i := range l {
			if i > 0 {
				n++ // the comma before it
			}
			n += l[i].size()
		}
	}
	return n
}

// emptyItemSize is the length of a ReconcileItem whose key is empty, whose
// pointers are nil and whose outcome is left out.
var emptyItemSize = func() int {
	b, _ := jsonx.Marshal(ReconcileItem{})
	return len(b)
}()

// size is the length of it as jsonx.Marshal writes it.
func (it *ReconcileItem) size() int {
	n := emptyItemSize - len(`""`) + jsonx.StringLen(it.IdempotencyKey)
	for _, s := range []*string{it.EffectID, it.RatchetState, it.VendorStatus} {
		if s != nil {
			n += jsonx.StringLen(*s) - len("null")
		}
	}
	for _, v := range []*int64{it.RatchetAmountMicros, it.VendorAmountMicros} {
		if v != nil {
			n += len(strconv.FormatInt(*v, 10)) - len("null")
		}
	}
	if it.Outcome != nil {
		n += len(`,"outcome":`) + jsonx.StringLen(*it.Outcome)
	}
	return n
}

// reconcileResolve settles the indeterminate effects that vendor records
// decide (items with an Outcome), filing each in out. The effects are locked
// first, waiting for whoever holds them: a concurrent resolve, report or
// reconciliation may have settled one since it was read, and it is then
// filed by the outcome it now has (a lock-free look could still see its
// lease and call it unsettled). One begun again since it was read (read,
// its attempt as read) is left unsettled, whatever that attempt's state:
// the record was matched with the attempt read, and settling the effect
// settles every attempt of unknown outcome (review: a probe begun while
// the reconciliation waited for another effect's row, which lapsed, was
// settled by a record read before it began; resolved failed, its key
// executed again). It answers the groups whose steps it settled.
func (s *Service) reconcileResolve(ctx context.Context, tx pgx.Tx, p *auth.Principal, now time.Time,
	items []ReconcileItem, read map[string]int, out *Reconciliation) ([]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = *it.EffectID
	}
	rows, err := tx.Query(ctx, sqlLockEffectStates, ids, p.WorkspaceID)
	if err != nil {
		return nil, fmt.Errorf("reconcile: lock: %w", err)
	}
	type current struct {
		state   string
		exp     *time.Time
		attempt int
	}
	locked := map[string]current{}
	for rows.Next() {
		var id string
		var c current
		if err := rows.Scan(&id, &c.state, &c.exp, &c.attempt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reconcile: lock: %w", err)
		}
		locked[id] = c
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reconcile: lock: %w", err)
	}
	var resolveIDs, outcomes, lapsedIDs []string
	var resolving []ReconcileItem
	for _, it := range items {
		c := locked[*it.EffectID]
		unknown := c.state == StateIndeterminate || (c.state == StateLeased && lapsed(c.exp, now))
		switch {
		case unknown && c.attempt == read[*it.EffectID]:
			if c.state == StateLeased {
				lapsedIDs = append(lapsedIDs, *it.EffectID)
			}
			resolveIDs, outcomes = append(resolveIDs, *it.EffectID), append(outcomes, *it.Outcome)
			resolving = append(resolving, it)
		case unknown || c.state == StateLeased: // a new attempt holds it, or was begun since the read
			state := c.state
			if unknown {
				state = StateIndeterminate
			}
			it.RatchetState, it.Outcome = &state, nil
			out.Unsettled = append(out.Unsettled, it)
		default: // settled meanwhile
			state := c.state
			it.RatchetState, it.Outcome = &state, nil
			out.classifySettled(it)
		}
	}
	if len(resolveIDs) == 0 {
		return nil, nil
	}
	// The lapses the sweeper has not recorded yet, in one statement: a
	// statement each took seconds for a few thousand (QA: a fleet that died
	// holding 10 000 leases, reconciled before the sweeper's passes reached
	// them, outlived a serverless function's time limit).
	if len(lapsedIDs) > 0 {
		if _, err := s.lapse(ctx, tx, now, lapsedIDs, 0); err != nil {
			return nil, err
		}
	}
	groups, err := db.CollectIDs(tx.Query(ctx, sqlReconcileResolve, p.WorkspaceID, resolveIDs, outcomes, now, p.KeyID,
		rolledBackNote))
	if err != nil {
		return nil, fmt.Errorf("reconcile: resolve: %w", err)
	}
	if err := s.closeMootApprovals(ctx, tx, p, resolveIDs, now); err != nil {
		return nil, err
	}
	// Every one was locked and indeterminate: every one was resolved. One
	// resolved succeeded whose amounts differ is an amount mismatch too, as
	// the next reconciliation would call it (QA: the first pass answered
	// "all resolved" for a charge five times its declared cost).
	out.Resolved = append(out.Resolved, resolving...)
	for _, it := range resolving {
		if cost, amount := it.RatchetAmountMicros, it.VendorAmountMicros; *it.Outcome == StateSucceeded &&
			cost != nil && amount != nil && *cost != *amount {
			state := StateSucceeded
			it.RatchetState, it.Outcome = &state, nil
			out.AmountMismatch = append(out.AmountMismatch, it)
		}
	}
	return groups, nil
}

// classifySettled files a record whose effect has a known outcome: the
// vendor's status against it, then the amounts of what happened.
func (out *Reconciliation) classifySettled(item ReconcileItem) {
	happened := *item.VendorStatus == VendorSucceeded || *item.VendorStatus == VendorRefunded
	cost, amount := item.RatchetAmountMicros, item.VendorAmountMicros
	switch {
	case happened != (*item.RatchetState == StateSucceeded):
		out.StatusMismatch = append(out.StatusMismatch, item)
	case happened && cost != nil && amount != nil && *cost != *amount:
		out.AmountMismatch = append(out.AmountMismatch, item)
	default:
		out.Matched = append(out.Matched, item)
	}
}

func reconEffects(ctx context.Context, tx pgx.Tx, ws, effectType string, from, to time.Time, keys []string) ([]reconEffect, error) {
	if _, err := tx.Exec(ctx, sqlReconcilePlan); err != nil {
		return nil, fmt.Errorf("reconcile: plan settings: %w", err)
	}
	rows, err := tx.Query(ctx, sqlReconcileEffects, ws, effectType, from, to, keys, MaxReconcileEffects+1,
		ids.Floor(ids.Effect, from.Add(time.Millisecond)))
	if err != nil {
		return nil, fmt.Errorf("reconcile: read effects: %w", err)
	}
	defer rows.Close()
	var out []reconEffect
	for rows.Next() {
		var e reconEffect
		if err := rows.Scan(&e.id, &e.key, &e.state, &e.leaseExpiresAt, &e.cost, &e.attempt, &e.inWindow); err != nil {
			return nil, fmt.Errorf("reconcile: read effects: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reconcile: read effects: %w", err)
	}
	if len(out) > MaxReconcileEffects {
		return nil, apierr.InvalidField("to", "must close a window of at most %d effects of this type; narrow it",
			MaxReconcileEffects)
	}
	return out, nil
}

// SweepReconcileDue records reconciliation.due for up to limit overdue
// (workspace, effect type) pairs, once per due period.
func (s *Service) SweepReconcileDue(ctx context.Context, now time.Time, limit int) (int, error) {
	now = now.UTC().Truncate(time.Microsecond)
	var n int
	if err := s.pool.QueryRow(ctx, sqlReconcileDue, now, limit, eventIDsAt(now, limit)).Scan(&n); err != nil {
		return 0, fmt.Errorf("reconciliation reminders: %w", err)
	}
	return n, nil
}

// endRollbacks settles those of groups a reconciliation settled steps of
// that are being rolled back, once what it resolved is committed. Only a
// rollback can end when a step settles: the others are passed over in one
// statement, not a transaction each (QA: 3 000 charges, each a step of its
// checkout's open group, cost 9 000 round trips after the answer was
// decided). Read after the commit, as a resolve's afterStep does: an unwind
// that began since sees these outcomes itself; one still in progress holds
// its group, which is then settled too, its settle waiting for that unwind
// (sqlGroupStates; passed over, the rollback stayed unwinding with its last
// step settled, QA), while the others are read without waiting for it. A
// group whose settle fails does not stop those after it, as in SweepGroups
// (sweep.GoOn): it stopped at the first, and the rest waited for the
// sweeper. Failures are logged, not answered: the reconciliation has
// committed, and the sweeper settles what is left.
func (s *Service) endRollbacks(ctx context.Context, workspaceID string, groups []string) {
	states, err := groupStates(ctx, s.pool, sqlGroupStatesSkip, workspaceID, groups)
	if err != nil {
		s.logger.Warn("rollbacks a reconciliation settled steps of not read", "err", err)
		return
	}
	var settle []string
	for _, g := range groups {
		// One another transaction holds may be an unwind that read these
		// steps unresolved: its settle waits for it.
		if state, read := states[g]; !read || state == GroupUnwinding {
			settle = append(settle, g)
		}
	}
	s.settleEach(ctx, workspaceID, settle, "reconciliation")
}

package ratchet

import (
	"context"
	"time"
)

// Vendor record statuses for ReconcileRecord.Status.
const (
	VendorSucceeded = "succeeded"
	VendorRefunded  = "refunded"
	VendorFailed    = "failed"
	VendorPending   = "pending"
)

// ReconcileRecord is one of the vendor's records: the idempotency key the
// effect was begun with, the vendor's status and the amount it recorded
// (nil when it has none).
type ReconcileRecord struct {
	IdempotencyKey string `json:"idempotency_key"`
	Status         string `json:"status"` // VendorSucceeded, VendorRefunded, VendorFailed or VendorPending
	AmountMicros   *int64 `json:"amount_micros"`
}

// ReconcileRequest compares the vendor's records of one effect type with
// the effects of that type that happened in [From, To): by the start of
// each one's latest attempt that did not fail, as a vendor's export lists
// charges by when they were made (at most 10 000 records; none is a valid
// answer: the vendor has none in the window). Records are matched by
// idempotency key whatever the window.
type ReconcileRequest struct {
	EffectType string            `json:"effect_type"`
	From       time.Time         `json:"from"`
	To         time.Time         `json:"to"`
	Records    []ReconcileRecord `json:"records"`
	// IdempotencyKey is the Idempotency-Key the call is sent under (at most
	// 255 characters; not part of the body): the same request under the
	// same key within a day answers the first call's Reconciliation, so a
	// caller whose retries ran out can still learn what it resolved. Empty
	// sends a fresh key of its own.
	IdempotencyKey string `json:"-"`
}

// ReconcileItem is one classified record or effect; fields that do not
// apply are nil.
type ReconcileItem struct {
	IdempotencyKey      string  `json:"idempotency_key"`
	EffectID            *string `json:"effect_id"`
	RatchetState        *string `json:"ratchet_state"`
	VendorStatus        *string `json:"vendor_status"`
	RatchetAmountMicros *int64  `json:"ratchet_amount_micros"`
	VendorAmountMicros  *int64  `json:"vendor_amount_micros"`
	// Outcome is what a resolved item's indeterminate effect was resolved to.
	Outcome *string `json:"outcome,omitempty"`
}

// ReconcileCounts has the length of each of a Reconciliation's lists.
type ReconcileCounts struct {
	Matched          int `json:"matched"`
	MissingAtVendor  int `json:"missing_at_vendor"`
	UnknownToRatchet int `json:"unknown_to_ratchet"`
	AmountMismatch   int `json:"amount_mismatch"`
	Resolved         int `json:"resolved"`
	StatusMismatch   int `json:"status_mismatch"`
	Unsettled        int `json:"unsettled"`
}

// Reconciliation is Reconcile's answer. Every vendor record lands in
// exactly one list but MissingAtVendor, which lists Ratchet's effects the
// vendor did not mention (which proves nothing by itself). Resolved holds
// the indeterminate effects a record settled: they were resolved.
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

// Reconcile compares the vendor's records with Ratchet's effects (POST
// /api/v1/reconcile, scope reconcile:write), resolves the indeterminate
// effects a record settles and restarts the type's reconcile_every_hours
// calendar. It is sent under an Idempotency-Key (req.IdempotencyKey, or one
// of its own), so a retry after a lost answer is answered the first call's
// Resolved (compared again, the effects it resolved would read as Matched).
func (c *Client) Reconcile(ctx context.Context, req ReconcileRequest) (*Reconciliation, error) {
	if req.Records == nil {
		req.Records = []ReconcileRecord{} // the route requires the list, empty or not
	}
	return callKeyed[Reconciliation](ctx, c, "POST", "/reconcile", req.IdempotencyKey, req)
}

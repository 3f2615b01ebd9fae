package webhooks

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// SQLDispatchPick is the statement picking a fan-out's batch, for a test
// of its plan.
var SQLDispatchPick = sqlDispatchPick

// DispatchIn fans events out at now as Dispatch does, in tx, for a test to
// hold the fan-out in a transaction of its own.
func (s *Service) DispatchIn(ctx context.Context, tx pgx.Tx, now time.Time) (int, error) {
	return s.dispatchIn(ctx, tx, now)
}

// SetDispatchBatch bounds one fan-out.
func SetDispatchBatch(s *Service, n int) { s.dispatchBatch = n }

// DeliverRound is one round of Deliver, for tests of a round's shares: it
// claims and sends a batch and waits for every send of it.
func (s *Service) DeliverRound(ctx context.Context, now time.Time) (int, error) {
	batch, err := s.claim(ctx, now, deliverBatch, []string{})
	if err != nil {
		return 0, err
	}
	p := s.newPass()
	<-p.send(ctx, batch)
	return len(batch), p.err()
}

// SQLRetryDeliveries is Retry's statement, for a test to hold it in a
// transaction of its own.
const SQLRetryDeliveries = sqlRetryDeliveries

// SQLPurgeDelivered is PurgeDelivered's statement, for a test of its plan.
const SQLPurgeDelivered = sqlPurgeDelivered

// SQLExpireHeld is ExpireHeld's statement, for a test of its plan.
var SQLExpireHeld = sqlExpireHeld

// SQLHeldSends is the claim's count of the sends in flight, for a test of
// its plan.
const SQLHeldSends = sqlHeldSends

// SQLDeliveriesPage is Deliveries' statement, for a test of its plan.
const SQLDeliveriesPage = sqlDeliveriesPage

// DeliverSealed sends delivery id of webhook webhookID (workspace ws) to
// url, its secret the sealed one given, as a claim hands a delivery over.
func (s *Service) DeliverSealed(ctx context.Context, id, webhookID, ws, url string, sealed []byte) error {
	p := s.newPass()
	<-p.send(ctx, []claimed{{id: id, url: url, secret: sealed, webhookID: webhookID, attempts: 1,
		eventID: "evt_sealed", eventType: "run.finished", eventData: []byte(`{}`), eventCreated: s.now(),
		subjectID: "run_sealed", workspaceID: ws}})
	return p.err()
}

// SetRecordWait sets how long an ended send's outcome waits for the pass's
// other sends to record with it.
func SetRecordWait(s *Service, d time.Duration) { s.recordWait = d }

// SetSendTimeout sets how long a delivery waits for its receiver's
// answer (the send's own deadline and its client's).
func SetSendTimeout(s *Service, d time.Duration) {
	s.sendTimeout = d
	s.client.Timeout = d
}

// SQLAbandon is the delete's second statement, for a test of its plan.
var SQLAbandon = sqlAbandon

// SQLClearExpiredSecrets is ClearExpiredSecrets' statement, for a test of
// its plan.
var SQLClearExpiredSecrets = sqlClearExpiredSecrets

// BreakHeldReport makes the report of held deliveries (reportHeld) fail.
func BreakHeldReport(s *Service) { s.heldSQL = `SELECT 1/0` }

// ClaimHold is how long a claim holds its delivery (held_until).
const ClaimHold = claimHold

// SQLClaim is the claim's statement, for a test of its plan; its arguments
// are ClaimArgs' and then the webhooks passed over and the secrets' headers.
var SQLClaim = sqlClaim

// ClaimArgs are the claim's first arguments at now, a batch of limit.
func ClaimArgs(now time.Time, limit int) []any {
	return []any{now, limit, claimHold.Seconds(), perWebhook, perWorkspace}
}

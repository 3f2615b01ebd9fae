package webhooks

import (
	"context"
	"time"
)

// SQLDispatch is Dispatch's statement, for a test to hold it in a
// transaction of its own.
const SQLDispatch = sqlDispatch

// DeliverRound is one round of Deliver, for tests of a round's shares.
func (s *Service) DeliverRound(ctx context.Context, now time.Time) (int, error) {
	return s.deliverRound(ctx, now)
}

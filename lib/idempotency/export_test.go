package idempotency

// LoseClaimAnswers makes s's claim statements fail with err after they ran,
// as a request cancelled while its claim was committing does.
func LoseClaimAnswers(s *Store, err error) { s.claimed = func(error) error { return err } }

// SQLUnlinked is LinkAnswers' read, for a test of its plan.
const SQLUnlinked = sqlUnlinked

package idempotency

// LoseClaimAnswers makes s's claim statements fail with err after they ran,
// as a request cancelled while its claim was committing does.
func LoseClaimAnswers(s *Store, err error) { AfterClaims(s, func(error) error { return err }) }

// AfterClaims makes f see each of s's claim statements' errors once the
// statement ran, and answer the error Begin sees instead.
func AfterClaims(s *Store, f func(error) error) { s.claimed = f }

// SQLUnlinked is LinkAnswers' read, for a test of its plan.
const SQLUnlinked = sqlUnlinked

// SQLPurge is Purge's statement ($1 the oldest answer kept, $2 limit), for
// a test that holds a pass open in a transaction of its own.
const SQLPurge = sqlPurge

package auth

// SQLPruneCounters is PruneCounters' statement, for a test of its plan.
const SQLPruneCounters = sqlPruneCounters

// SQLRevoke and SQLEraseRevokedAnswers are RevokeKey's erasing statement
// and EraseRevokedAnswers', for a test of their plans.
var SQLRevoke, SQLEraseRevokedAnswers = sqlRevoke, sqlEraseRevokedAnswers

// ListKeysSQL is ListKeys' statement and its arguments, for a test of its plan.
var ListKeysSQL = listKeysSQL

// SQLLockRevoke is a revoke's locking statement, for a test of its plan.
var SQLLockRevoke = sqlLockRevoke

package auth

// SQLPruneCounters is PruneCounters' statement, for a test of its plan.
const SQLPruneCounters = sqlPruneCounters
